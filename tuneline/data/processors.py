"""Per-stage encoding of standard examples into model inputs, one batch at a time.

Truncation follows LLaMA-Factory (`split_budget`). Preference stages, and every stage on rows with images or videos,
also emit `CHECK_COLUMNS`, so a row that truncation leaves untrainable (no response token left; image tokens cut,
which no forward can pair with the image's features) is reported and dropped by the build step like any other bad
row."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuneline.data.packing import pack_examples
from tuneline.data.readers import BadRow
from tuneline.data.templates import Template, batch_ids
from tuneline.data.tools import ToolDataError
from tuneline.errors import DataError

IGNORE = -100

STAGE_COLUMNS = {
    "pt": ("input_ids", "attention_mask", "labels"),
    "sft": ("input_ids", "attention_mask", "labels"),
    "rm": tuple(f"{s}_{c}" for s in ("chosen", "rejected") for c in ("input_ids", "attention_mask", "labels")),
    "kto": ("input_ids", "attention_mask", "labels", "kto_tags", "kl_input_ids", "kl_attention_mask", "kl_labels"),
    "ppo": ("input_ids", "attention_mask"),
    "grpo": ("input_ids", "attention_mask", "prompt", "solution"),
}
STAGE_COLUMNS["rloo"] = STAGE_COLUMNS["grpo"]
STAGE_COLUMNS["dpo"] = STAGE_COLUMNS["rm"]
CHECK_COLUMNS = ("_problem", "_file", "_row")
TRUNCATED = "_truncated"
NO_ROOM = "no room for a response"
MEDIA_CUT = "image tokens cut by cutoff_len"


def split_budget(prompt_len: int, answer_len: int, budget: int) -> tuple[int, int]:
    """(kept prompt tokens, kept answer tokens) within `budget`, as LLaMA-Factory's infer_seqlen decides."""
    if 2 * answer_len < budget:
        answer_cap = budget  # a short answer is kept whole; the prompt is cut
    elif 2 * prompt_len < budget:
        answer_cap = budget - prompt_len  # a short prompt is kept whole; the answer is cut
    else:
        answer_cap = int(budget * answer_len / (prompt_len + answer_len))  # both cut in proportion
    answer_keep = min(answer_cap, answer_len)
    prompt_keep = min(max(budget - answer_keep, 0), prompt_len)
    return prompt_keep, answer_keep


@dataclass
class Encoder:
    tokenizer: Any
    template: Template
    stage: str
    cutoff_len: int
    train_on_prompt: bool = False
    mask_history: bool = False
    packing: bool = False
    media: Any = None  # tuneline.data.mm.run_media.RunMedia when the rows hold images or videos

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        try:
            out = STAGE_ENCODERS[self.stage](self, batch)
        except ToolDataError:  # a call this template's tool format cannot write: name the row
            raise DataError(self.tool_problem(batch)) from None
        if self.media is not None:  # one encoded row per row: the collator makes the pixels of these files
            out.update(images=batch["_images"], videos=batch["_videos"])
        return out

    def tool_problem(self, batch: dict[str, list]) -> str:
        for i, (messages, system, tools) in enumerate(self.conversations(batch)):
            try:
                self.template.pieces(messages, system, tools)
            except ToolDataError as exc:
                file, row = (batch[c][i] if c in batch else default for c, default in (("_file", "?"), ("_row", 0)))
                detail = f"{exc} (template '{self.template.name}', tool format '{self.template.tool_format}')"
                return BadRow(file, row, "bad function call", detail=detail).message()
        return "a function call this template's tool format cannot write"

    # --- shared pieces
    def conversations(self, batch: dict[str, list], responses: list[list[dict]] | None = None) -> list:
        responses = batch["_response"] if responses is None else responses
        columns = (batch["_prompt"], responses, batch["_system"], batch["_tools"])
        found = [(p + r, s, t) for p, r, s, t in zip(*columns, strict=True)]
        if self.media is None:
            return found
        media = zip(batch["_images"], batch["_videos"], strict=True)
        return [(self.media.expand(messages, images, videos), s, t)
                for (messages, s, t), (images, videos) in zip(found, media, strict=True)]

    def media_ids(self, batch: dict[str, list], row: int, ids: list[int],
                  labels: list[int] | None = None) -> tuple[list[int], list[int] | None]:
        """A row's `ids` (and `labels`) with the media tokens its model takes at the token level, from the plugin
        (PaliGemma's images, before everything); as they are for text rows and for models whose tokens are in the
        text."""
        if self.media is None:
            return ids, labels
        return self.media.add_media_ids(ids, labels, batch["_images"][row], batch["_videos"][row])

    def eos(self) -> list[int]:
        return [self.tokenizer.eos_token_id] if self.template.efficient_eos else []

    def prompt_answer(self, message_ids: list[list[int]], start: list[int] = ()) -> tuple[list[int], list[int]]:
        """Truncated (prompt ids, answer ids) of a conversation whose last message is the answer; `start`: ids before
        the prompt's (`media_ids`), truncated with it."""
        prompt = [*start, *(t for ids in message_ids[:-1] for t in ids)]
        answer = message_ids[-1] + self.eos()
        keep_p, keep_a = split_budget(len(prompt), len(answer), self.cutoff_len)
        return prompt[:keep_p], answer[:keep_a]

    def room_problem(self, prompt_len: int, answer_keep: int) -> str:
        """Why a preference row keeps no response token within cutoff_len ("" when it keeps one)."""
        if answer_keep > 0:
            return ""
        return (f"{NO_ROOM}: the prompt is {prompt_len} tokens; cut to cutoff_len {self.cutoff_len} as LLaMA-Factory "
                "cuts it, no response token is left")

    def media_cut_problem(self, batch: dict[str, list], row: int, whole: list[int], kept: list[int]) -> str:
        """Why a row whose image (or video) tokens cutoff_len cuts cannot train ("" when they are all kept, or the row
        has no media): the model pairs each of those tokens with one feature of its image, and LLaMA-Factory, which
        cuts such a row all the same, fails inside the forward."""
        if self.media is None:
            return ""
        plugin = self.media.plugin
        ids = {self.tokenizer.convert_tokens_to_ids(t) for t in (plugin.image_token, plugin.video_token) if t}
        needed, left = sum(t in ids for t in whole), sum(t in ids for t in kept)
        if left == needed:
            return ""
        counts = {"image": len(batch["_images"][row] or ()), "video": len(batch["_videos"][row] or ())}
        media = " and ".join(f"{n} {kind}{'s' if n != 1 else ''}" for kind, n in counts.items() if n)
        kinds = " and ".join(kind for kind, n in counts.items() if n)
        return (f"{MEDIA_CUT}: its {media} need{'s' if sum(counts.values()) == 1 else ''} {needed} {kinds} tokens, "
                f"and cutoff_len {self.cutoff_len} keeps {left} of them; set cutoff_len to {len(whole)} or more "
                "(the row's length)")

    def supervised(self, message_ids: list[list[int]], start: tuple[list[int], list[int]] = ((), ())
                   ) -> tuple[list[int], list[int]]:
        """ids and labels of a multi-turn conversation, truncated turn by turn within cutoff_len; `start`: ids and
        labels before the first turn's (`media_ids`), kept whole and counted against cutoff_len first."""
        turns = [(message_ids[i], message_ids[i + 1]) for i in range(0, len(message_ids), 2)]
        if self.mask_history:
            turns = turns[::-1]  # the last turn gets the budget first
        eos = self.eos()
        used, input_ids, labels = len(eos) + len(start[0]), [], []
        for k, (source, target) in enumerate(turns):
            if used >= self.cutoff_len:
                break
            keep_s, keep_t = split_budget(len(source), len(target), self.cutoff_len - used)
            source, target = source[:keep_s], target[:keep_t]
            used += keep_s + keep_t
            if self.train_on_prompt:
                source_labels = source
            elif eos and k != 0 and keep_s:
                source_labels = eos + [IGNORE] * (keep_s - 1)
            else:
                source_labels = [IGNORE] * keep_s
            target_labels = [IGNORE] * keep_t if self.mask_history and k != 0 else target
            if self.mask_history:
                input_ids, labels = source + target + input_ids, source_labels + target_labels + labels
            else:
                input_ids, labels = input_ids + source + target, labels + source_labels + target_labels
        return [*start[0], *input_ids, *eos], [*start[1], *labels, *eos]


def encode_sft(enc: Encoder, batch: dict[str, list]) -> dict[str, list]:
    # earlier answers keep their thoughts unless they are masked (mask_history) and not preserved, as LLaMA-Factory
    # encodes them
    last_turn_only = enc.mask_history and not enc.template.preserve_thinking
    encoded = enc.template.encode_many(enc.tokenizer, enc.conversations(batch), last_turn_only)
    starts = [enc.media_ids(batch, row, [], []) for row in range(len(encoded))]
    pairs = [enc.supervised(ids, start) for ids, start in zip(encoded, starts, strict=True)]
    whole = [sum(map(len, messages)) + len(enc.eos()) + len(start[0]) for messages, start in
             zip(encoded, starts, strict=True)]
    truncated = [len(ids) < length for (ids, _), length in zip(pairs, whole, strict=True)]
    if enc.packing:  # rows are packs of examples: the batch's count goes on its first row (never with media)
        out = pack_examples(pairs, enc.cutoff_len)
        out[TRUNCATED] = [sum(truncated)] + [0] * (len(out["input_ids"]) - 1) if out["input_ids"] else []
        return out
    out = {"input_ids": [p[0] for p in pairs], "attention_mask": [[1] * len(p[0]) for p in pairs],
           "labels": [p[1] for p in pairs], TRUNCATED: [int(t) for t in truncated]}
    if enc.media is None:
        return out
    problems = [enc.media_cut_problem(batch, i, [*start, *(t for ids in messages for t in ids), *enc.eos()], ids)
                for i, (messages, (start, _), (ids, _)) in enumerate(zip(encoded, starts, pairs, strict=True))]
    return _with_checks(out, batch, problems)


def _with_checks(out: dict[str, list], batch: dict[str, list], problems: list[str]) -> dict[str, list]:
    count = len(problems)
    out.update(_problem=problems, _file=batch.get("_file", [""] * count), _row=batch.get("_row", [0] * count))
    return out


def encode_pairwise(enc: Encoder, batch: dict[str, list]) -> dict[str, list]:
    # prompt-and-answer stages see earlier answers without their thoughts, as LLaMA-Factory's one-turn encoding
    chosen = enc.template.encode_many(enc.tokenizer, enc.conversations(batch, [r[:1] for r in batch["_response"]]), True)
    rejected = enc.template.encode_many(enc.tokenizer, enc.conversations(batch, [r[1:2] for r in batch["_response"]]),
                                        True)
    out: dict[str, list] = {c: [] for c in (*STAGE_COLUMNS["rm"], TRUNCATED)}
    problems = []
    for row, (c_ids, r_ids) in enumerate(zip(chosen, rejected, strict=True)):
        prompt, _ = enc.media_ids(batch, row, [t for ids in c_ids[:-1] for t in ids])
        answers = {"chosen": c_ids[-1] + enc.eos(), "rejected": r_ids[-1] + enc.eos()}
        longest = max(map(len, answers.values()))
        keep_p, keep_a = split_budget(len(prompt), longest, enc.cutoff_len)  # one cut for both sides
        cut = [enc.media_cut_problem(batch, row, prompt + answer, prompt[:keep_p] + answer[:keep_a])
               for answer in answers.values()]
        problems.append(enc.room_problem(len(prompt), keep_a) or cut[0] or cut[1])
        out[TRUNCATED].append(int(keep_p < len(prompt) or keep_a < longest))
        for side, answer in answers.items():
            ids = prompt[:keep_p] + answer[:keep_a]
            out[f"{side}_input_ids"].append(ids)
            out[f"{side}_attention_mask"].append([1] * len(ids))
            out[f"{side}_labels"].append([IGNORE] * keep_p + answer[:keep_a])
    return _with_checks(out, batch, problems)


def encode_kto(enc: Encoder, batch: dict[str, list]) -> dict[str, list]:
    """Each prompt with its own answer, and with the previous row's answer for KTO's KL term."""
    responses = batch["_response"]
    mismatched = responses[-1:] + responses[:-1]
    own = enc.template.encode_many(enc.tokenizer, enc.conversations(batch), True)
    other = enc.template.encode_many(enc.tokenizer, enc.conversations(batch, mismatched), True)
    out: dict[str, list] = {c: [] for c in (*STAGE_COLUMNS["kto"], TRUNCATED)}
    problems = []
    for row, (ids, kl_ids, tag) in enumerate(zip(own, other, batch["_kto_tag"], strict=True)):
        start, _ = enc.media_ids(batch, row, [])
        prompt_len = len(start) + sum(len(m) for m in ids[:-1])
        for prefix, message_ids in (("", ids), ("kl_", kl_ids)):
            prompt, answer = enc.prompt_answer(message_ids, start)
            whole = [*start, *(t for m in message_ids for t in m), *enc.eos()]
            cut = enc.media_cut_problem(batch, row, whole, prompt + answer)
            if not prefix:
                problems.append(enc.room_problem(prompt_len, len(answer)) or cut)
                full = prompt_len + len(message_ids[-1]) + len(enc.eos())
                out[TRUNCATED].append(int(len(prompt) + len(answer) < full))
            elif cut and not problems[-1]:  # the mismatched answer cut the prompt further
                problems[-1] = cut
            out[f"{prefix}input_ids"].append(prompt + answer)
            out[f"{prefix}attention_mask"].append([1] * (len(prompt) + len(answer)))
            out[f"{prefix}labels"].append([IGNORE] * len(prompt) + answer)
        out["kto_tags"].append(bool(tag))
    return _with_checks(out, batch, problems)


EMPTY_ANSWER = [{"role": "assistant", "content": ""}]


def encode_ppo(enc: Encoder, batch: dict[str, list], answers: bool = True) -> dict[str, list]:
    """Prompts ending in the generation prompt (the answer slot's opening), truncated as LLaMA-Factory does (the
    row's answer, when `answers` and the row has one, takes its share of cutoff_len)."""
    responses = [r[:1] if answers and len(r) == 1 else EMPTY_ANSWER for r in batch["_response"]]
    encoded = enc.template.encode_many(enc.tokenizer, enc.conversations(batch, responses), True)
    prompts = [enc.prompt_answer(ids)[0] for ids in encoded]
    truncated = [int(len(p) < sum(map(len, ids[:-1]))) for p, ids in zip(prompts, encoded, strict=True)]
    return {"input_ids": prompts, "attention_mask": [[1] * len(p) for p in prompts], TRUNCATED: truncated}


def encode_pt(enc: Encoder, batch: dict[str, list]) -> dict[str, list]:
    """Documents joined by eos; with packing (pt's default) cut into cutoff_len blocks, else truncated each."""
    tok = enc.tokenizer
    eos_text = enc.template.pt_eos if enc.template.pt_eos in tok.get_vocab() else tok.eos_token
    texts = [prompt[0]["content"] + (eos_text or "") for prompt in batch["_prompt"]]
    docs = batch_ids(tok, texts)
    bos = [tok.bos_token_id] if getattr(tok, "add_bos_token", False) and tok.bos_token_id is not None else []
    if enc.packing:  # documents run on across blocks: nothing is lost
        stream = [t for doc in docs for t in doc]
        blocks = [stream[i:i + enc.cutoff_len] for i in range(0, len(stream), enc.cutoff_len)]
        if bos:
            blocks = [bos + b[1:] for b in blocks]
        truncated = [0] * len(blocks)
    else:
        blocks = [(bos + doc)[:enc.cutoff_len] for doc in docs]
        truncated = [int(len(bos) + len(doc) > enc.cutoff_len) for doc in docs]
    return {"input_ids": blocks, "attention_mask": [[1] * len(b) for b in blocks], "labels": [list(b) for b in blocks],
            TRUNCATED: truncated}


def encode_grpo(enc: Encoder, batch: dict[str, list]) -> dict[str, list]:
    """ppo's prompts, also as the text trl's GRPOTrainer tokenizes (the template's rendering, special tokens
    written out), and the last answer, when the row has one, as the `solution` reward functions receive."""
    out = encode_ppo(enc, batch, answers=False)  # never trained on, the solution leaves cutoff_len to the prompt
    out["prompt"] = [enc.tokenizer.decode(ids, skip_special_tokens=False) for ids in out["input_ids"]]
    out["solution"] = [r[0]["content"] if len(r) == 1 else "" for r in batch["_response"]]
    return out


STAGE_ENCODERS = {"pt": encode_pt, "sft": encode_sft, "rm": encode_pairwise, "dpo": encode_pairwise,
                  "kto": encode_kto, "ppo": encode_ppo, "grpo": encode_grpo,
                  "rloo": encode_grpo}
