"""Chat templates: declarative slot lists that turn messages into token ids, turn by turn.

Each message is encoded on its own, so the prompt/response boundary of every turn is exact (label masking needs it).

The tokenizer is used as loaded: unlike LLaMA-Factory, a `replace_eos` template does not change the tokenizer's eos
or add stop words, because the build, train and evaluate steps each load the tokenizer from the same files and
must agree on its ids. List missing stop words in `add_special_tokens` to match LLaMA-Factory."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from tuneline.data.native_tools import NativeTools, probe, uses_tools
from tuneline.data.tools import TOOL_FORMATS, FunctionCall, between_words, parse_calls, tool_date


@dataclass(frozen=True)
class Special:
    """A token taken from the tokenizer: 'bos'/'eos' by role, or a literal token name."""

    name: str


BOS, EOS = Special("bos"), Special("eos")
Slots = tuple[Any, ...]  # str with {{content}}, or Special
THOUGHT_WORDS = ("<think>\n", "\n</think>\n\n")
TOOL_CALL_WORDS = ("<tool_call>", "</tool_call>")


@dataclass(frozen=True)
class Template:
    name: str
    user: Slots = ("{{content}}",)
    assistant: Slots | None = None  # default: content then eos (content only with efficient_eos)
    system: Slots | None = None  # default: the system text alone
    function: Slots | None = None  # default: the assistant slots
    observation: Slots | None = None  # default: the user slots
    prefix: Slots = ()
    default_system: str = ""
    stop_words: tuple[str, ...] = ()
    efficient_eos: bool = False  # eos added once after the last turn instead of after each answer
    fuse_system: bool = False  # system text is put inside the first user turn (mistral, llama2)
    replace_eos: bool = False  # LLaMA-Factory makes stop_words[0] the eos; see the module docstring
    reasoning: bool = False  # answers without a thought get an empty one, trained on (qwen3, deepseekr1)
    empty_thought: str | None = None  # what an answer without a thought gets; None: the two thought words
    enable_thinking: bool | None = True  # False: thoughts dropped, the empty one closes the prompt (not trained on)
    preserve_thinking: bool = False  # earlier answers keep their thoughts in prompt-and-answer encodings
    tool_format: str = "default"  # with `native`: the format that reads the chat template's calls back
    thought_words: tuple[str, str] = THOUGHT_WORDS
    tool_call_words: tuple[str, str] = TOOL_CALL_WORDS  # a function message's calls may sit between these
    tools_slot: str | None = None  # the row's tool list written as it is into this slot (phi4_mini), not formatted
    today: str | None = None  # the date llama3's tool prompt writes; None: today's
    pt_eos: str | None = None  # document separator for pt when not the tokenizer's eos
    mm_plugin: str | None = None  # how images/videos become the model's tokens (tuneline.data.mm); None: text only
    slots: dict[str, Slots] = field(default_factory=dict, compare=False)
    # the tokenizer's chat template, which writes conversations with tools (auto templates); None: the slots do
    native: NativeTools | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        assistant = self.assistant or (("{{content}}",) if self.efficient_eos else ("{{content}}", EOS))
        self.slots.update(
            user=self.user, assistant=assistant, system=self.system or ("{{content}}",),
            function=self.function or assistant, observation=self.observation or self.user,
        )

    def replace(self, **changes) -> Template:
        """A changed copy; a `tool_format` given here (the config's key) writes tools with that format's slots, not
        with the tokenizer's chat template."""
        if "tool_format" in changes:
            changes.setdefault("native", None)
        return dataclasses.replace(self, slots={}, **changes)

    # --- messages -> pieces (text or token ids), one list per message
    def pieces(self, messages: list[dict], system: str | None, tools: str | None,
               last_turn_only: bool = False) -> list[list]:
        """`last_turn_only`: only the last answer gets an empty thought, and earlier ones lose theirs unless
        `preserve_thinking`, as LLaMA-Factory's one-turn (and masked-history) encoding does; a tool conversation under
        a `native` template is the chat template's render, cut up."""
        system = system or self.default_system
        if self.native is not None and uses_tools(messages, tools):
            return self.native.pieces(messages, system, tools, (self.thought_words, self.tool_call_words))
        out: list[list] = []
        for i, message in enumerate(messages):
            elements: list = []
            content = message["content"]
            if i == 0:
                elements += list(self.prefix)
                if system or tools:
                    sys_slots = _fill(self.slots["system"], system + (self.tool_text(tools) if tools else ""))
                    if self.fuse_system:
                        content = "".join(s for s in sys_slots if isinstance(s, str)) + content
                    else:
                        elements += sys_slots
            if self.reasoning and i % 2:
                content = self._thought(content, out[-1], elements, i == len(messages) - 1, last_turn_only)
            role = message["role"]
            if role == "function":
                content = self.function_text(content)
            elements += _fill(self.slots[role], content, idx=str(i // 2))
            out.append(elements)
        return out

    def _thought(self, content: str, prompt: list, elements: list, last: bool, last_turn_only: bool) -> str:
        """An answer's content with its thought kept or dropped; an empty thought, where it gets one, goes on the
        answer (`elements`) when thinking is on, else at the end of the prompt before it."""
        keep_history = self.preserve_thinking and last_turn_only
        if (self.enable_thinking is False and (last or not keep_history)) or (
                last_turn_only and not last and not self.preserve_thinking):
            content = between_words(self.thought_words).sub("", content).lstrip("\n")
        opening, closing = self.thought_words
        if (last or not last_turn_only) and opening.strip() not in content and closing.strip() not in content:
            (elements if self.enable_thinking else prompt).append(self.empty_thought or opening + closing)
        return content

    def tool_text(self, tools: str) -> str:
        """The tool list as this template's tool format writes it into the system turn."""
        if self.tools_slot is not None:
            return self.tools_slot.replace("{{content}}", tools if isinstance(tools, str) else json.dumps(tools))
        return TOOL_FORMATS[self.tool_format].tool_text(tools, self.today or tool_date())

    def function_text(self, content: str) -> str:
        """A function message in the model's words; templates that put the system text in the first user turn read the
        call JSON alone, as LLaMA-Factory's Llama2Template does."""
        words = (None, None) if self.fuse_system else (self.thought_words, self.tool_call_words)
        before, calls = parse_calls(content, *words)
        return before + TOOL_FORMATS[self.tool_format].calls(calls)

    def extract_calls(self, answer: str) -> str | list[FunctionCall]:
        """The tool calls in a generated answer (LLaMA-Factory's `extract_tool`), or the answer when it makes none."""
        return TOOL_FORMATS[self.tool_format].extract(answer)

    # --- pieces -> ids, tokenizing every text piece of a batch in one call
    def encode_many(self, tokenizer, conversations: list[tuple[list[dict], str | None, str | None]],
                    last_turn_only: bool = False) -> list:
        """[[ids of message 0, ids of message 1, ...] per conversation]."""
        all_pieces = [self.pieces(m, s, t, last_turn_only) for m, s, t in conversations]
        texts = [p for conv in all_pieces for msg in conv for p in msg if isinstance(p, str)]
        encoded = iter(batch_ids(tokenizer, texts)) if texts else iter(())
        out = []
        for conv in all_pieces:
            conv_ids = []
            for msg in conv:
                ids: list[int] = []
                for piece in msg:
                    ids += next(encoded) if isinstance(piece, str) else _special_ids(tokenizer, piece)
                conv_ids.append(ids)
            out.append(conv_ids)
        return out

    def encode_multiturn(self, tokenizer, messages, system=None, tools=None,
                         last_turn_only=False) -> list[tuple[list[int], list[int]]]:
        """(prompt ids, response ids) per turn."""
        ids = self.encode_many(tokenizer, [(messages, system, tools)], last_turn_only)[0]
        return [(ids[i], ids[i + 1]) for i in range(0, len(ids), 2)]

    def encode_oneturn(self, tokenizer, messages, system=None, tools=None) -> tuple[list[int], list[int]]:
        """(ids of every message but the last, ids of the last message); earlier answers lose their thoughts."""
        ids = self.encode_many(tokenizer, [(messages, system, tools)], last_turn_only=True)[0]
        return [t for msg in ids[:-1] for t in msg], ids[-1]


def batch_ids(tokenizer, texts: list[str]) -> list[list[int]]:
    """Ids of many texts, no special tokens added. A fast tokenizer's Rust backend is called directly when it is in
    its plain state: the transformers wrapper's per-text conversion costs about as much as the tokenization itself."""
    backend = getattr(tokenizer, "_tokenizer", None)
    plain = (backend is not None and hasattr(backend, "encode_batch") and backend.truncation is None
             and backend.padding is None
             and backend.encode_special_tokens == bool(getattr(tokenizer, "split_special_tokens", False)))
    if plain:
        return [encoding.ids for encoding in backend.encode_batch(texts, add_special_tokens=False)]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def _fill(slots: Slots, content: str, **extra: str) -> list:
    out = []
    for slot in slots:
        if isinstance(slot, str):
            slot = slot.replace("{{content}}", content)
            for key, value in extra.items():
                slot = slot.replace("{{" + key + "}}", value)
            if slot:
                out.append(slot)
        else:
            out.append(slot)
    return out


def _special_ids(tokenizer, special: Special) -> list[int]:
    if special.name in ("bos", "eos"):
        token_id = tokenizer.bos_token_id if special.name == "bos" else tokenizer.eos_token_id
        return [] if token_id is None else [token_id]
    return [tokenizer.convert_tokens_to_ids(special.name)]


def template_from_tokenizer(tokenizer) -> Template | None:
    """Slots read off the tokenizer's jinja chat template by rendering placeholder conversations (None without one);
    conversations with tools are left to the chat template itself where it writes tools (`native_tools.probe`). A
    template whose answer holds `<think>` reads as a reasoning template, so `enable_thinking` and
    `preserve_thinking` apply to it as to the named ones."""
    if not isinstance(getattr(tokenizer, "chat_template", None), str):
        return None

    def render(messages, generation_prompt):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    mark = "{{content}}"
    user_full = render([{"role": "user", "content": mark}], True)
    prefix = tokenizer.decode(tokenizer.encode(""))
    if not prefix and tokenizer.bos_token and user_full.startswith(tokenizer.bos_token):
        prefix = tokenizer.bos_token
    user = user_full[len(prefix):]
    with_answer = render([{"role": "user", "content": mark}, {"role": "assistant", "content": mark}], False)
    assistant = with_answer[len(prefix) + len(user):]
    # a chat template that writes a thought into answers (Qwen3's empty one) is a reasoning one: the thought words come
    # off the slot and are added per answer as the catalogue's reasoning templates add them (LLaMA-Factory's reading)
    reasoning = THOUGHT_WORDS[0].strip() in assistant
    if reasoning:
        assistant = assistant.replace(THOUGHT_WORDS[0].strip(), "").replace(THOUGHT_WORDS[1].strip(), "").lstrip("\n")
    try:
        system = render([{"role": "system", "content": mark}], False)[len(prefix):]
        user_empty_sys = render([{"role": "system", "content": ""}, {"role": "user", "content": mark}], True)
        user_empty_sys = user_empty_sys[len(prefix):]
    except Exception:  # templates that reject a system-only conversation
        system, user_empty_sys = None, user
    default_system = ""
    if system and len(user) > len(user_empty_sys):  # the template inserts its own system prompt
        default_system = _inserted_text(user_empty_sys, user)
        user = user[len(system.replace(mark, default_system, 1)):]
    native, tool_format = probe(tokenizer)
    return Template(
        name="auto", user=(user,), assistant=(assistant,), system=(system,) if system else None,
        function=(assistant,), observation=(user,), prefix=(prefix,) if prefix else (),
        default_system=default_system, reasoning=reasoning, tool_format=tool_format, native=native,
    )


def _inserted_text(short: str, long: str) -> str:
    """The characters of `long` that `short` lacks, in order (the default system prompt)."""
    i, out = 0, []
    for ch in long:
        if i < len(short) and short[i] == ch:
            i += 1
        else:
            out.append(ch)
    return "".join(out)
