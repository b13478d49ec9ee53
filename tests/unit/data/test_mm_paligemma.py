"""PaliGemma's images at the token level, on the parity benchmark's tiny PaliGemmaProcessor (built offline): the
encoder puts `image_seq_length` image tokens per image before the beginning-of-sequence token, as the processor's own
expansion does, never trains on them and counts them against cutoff_len first; a batch marks them for PaliGemma's
two-way attention."""

from __future__ import annotations

import dataclasses

import pytest
from PIL import Image

from tests.support.mm_parity import DEMO_IMAGES, load_parity_benchmark
from tuneline.data.collators import build_collator
from tuneline.data.mm import MediaSettings, get_mm_plugin
from tuneline.data.mm.pixels import regularize_image
from tuneline.data.mm.run_media import RunMedia
from tuneline.data.processors import IGNORE, Encoder
from tuneline.data.template_catalog import TEMPLATES, VISION

BENCH = load_parity_benchmark()
WIDE, TALL = str(DEMO_IMAGES / "1.jpg"), str(DEMO_IMAGES / "2.jpg")


@pytest.fixture(scope="module")
def processor(tmp_path_factory):
    folder = BENCH.build_processor("paligemma", tmp_path_factory.mktemp("paligemma"))
    return BENCH.load_processor("paligemma", folder, {})


def encoder(processor, stage: str = "sft", template: str = "paligemma", cutoff_len: int = 1024,
            mask_history: bool = False, **limits) -> Encoder:
    media = RunMedia(get_mm_plugin("paligemma"), processor, MediaSettings(**limits))
    return Encoder(processor.tokenizer, TEMPLATES[template], stage, cutoff_len, mask_history=mask_history,
                   media=media)


def batch(prompt: str, images: list, *answers: str) -> dict[str, list]:
    return {"_prompt": [[{"role": "user", "content": prompt}]],
            "_response": [[{"role": "assistant", "content": answer} for answer in answers]],
            "_system": [""], "_tools": [""], "_images": [images], "_videos": [[]], "_kto_tag": [True]}


@pytest.mark.parametrize("images", [[WIDE], [TALL, WIDE], []])
@pytest.mark.parametrize("limits", [{}, {"image_max_pixels": 80 * 80}, {"image_min_pixels": 400 * 400}])
def test_images_go_before_everything_as_the_processor_writes_them(processor, images, limits):
    """The prompt's ids are PaliGemmaProcessor's own for the same text and images, whatever the images' sizes."""
    settings = MediaSettings(**limits)
    prompt = "<image>" * len(images) + "caption en"
    out = encoder(processor, **limits)(batch(prompt, images, "Two men."))
    ids, labels = out["input_ids"][0], out["labels"][0]
    resized = [regularize_image(image, settings.image_max_pixels, settings.image_min_pixels) for image in images]
    own = processor(text=prompt, images=resized or [Image.new("RGB", (56, 56))])["input_ids"][0] if images else (
        [processor.tokenizer.bos_token_id] + processor.tokenizer("caption en\n", add_special_tokens=False)["input_ids"])
    assert ids[:len(own)] == own and ids.count(processor.image_token_id) == 16 * len(images)
    assert labels[:len(own)] == [IGNORE] * len(own) and labels[len(own):] == ids[len(own):]


def test_image_tokens_count_against_cutoff_len_first(processor):
    """With 16 image tokens and cutoff_len 24, the turn gets the 8 left, split as LLaMA-Factory splits a budget."""
    out = encoder(processor, cutoff_len=24)(batch("<image>" + "describe this picture " * 4, [WIDE],
                                                  "A long answer " * 4))
    ids = out["input_ids"][0]
    assert len(ids) == 24 and ids[:16] == [processor.image_token_id] * 16 and out["_truncated"] == [1]


@pytest.mark.parametrize("stage", ["rm", "kto"])
def test_preference_prompts_start_with_the_images(processor, stage):
    """Each side's prompt (KTO's mismatched one too) starts with the row's image tokens, masked."""
    out = encoder(processor, stage, template="paligemma_chat")(batch("<image>Who?", [WIDE], "Him.", "Her."))
    sides = ("chosen_", "rejected_") if stage == "rm" else ("", "kl_")
    for side in sides:
        ids, labels = out[f"{side}input_ids"][0], out[f"{side}labels"][0]
        assert ids[:17] == [processor.image_token_id] * 16 + [processor.tokenizer.bos_token_id]
        assert labels[:17] == [IGNORE] * 17 and any(label != IGNORE for label in labels)


def test_a_batch_marks_each_rows_image_tokens(processor):
    """token_type_ids 0 on each row's leading image tokens (none on a row without images), 1 on its text, 0 on
    padding; the pixels of every image of the batch, in row order."""
    enc = encoder(processor)
    rows = [enc(batch(prompt, images, "Yes."))
            for prompt, images in (("<image><image>Two?", [WIDE, TALL]), ("No image?", []), ("<image>One?", [TALL]))]
    features = [{"input_ids": r["input_ids"][0], "attention_mask": r["attention_mask"][0], "labels": r["labels"][0],
                 "images": r["images"][0], "videos": []} for r in rows]
    out = build_collator("sft", processor.tokenizer, media=enc.media)(features)
    assert out["pixel_values"].shape == (3, 3, 56, 56)
    types, ids = out["token_type_ids"].tolist(), out["input_ids"].tolist()
    for row, images in zip(range(3), (2, 0, 1), strict=True):
        length = len(features[row]["input_ids"])
        assert types[row] == [0] * 16 * images + [1] * (length - 16 * images) + [0] * (len(ids[row]) - length)


def test_paligemma_templates_are_llamafactorys():
    """`paligemma`: the prompt on its own line after the beginning of sequence; `paligemma_chat`: Gemma's turns without
    its system slot; both slot for slot as LLaMA-Factory's registry has them (the template-parity snapshot)."""
    turns = load_parity_benchmark("template_parity").read_snapshot()["text_turns"]
    system = 2  # the system slot's place in a snapshot's text turns
    assert turns["paligemma_chat"][:system] + turns["paligemma_chat"][system + 1:] == (
        turns["gemma"][:system] + turns["gemma"][system + 1:])
    assert turns["paligemma_chat"][system] == turns["paligemma"][system] == "['{{content}}']"
    chat = TEMPLATES["paligemma_chat"]
    assert dataclasses.replace(chat, name="gemma", mm_plugin=None, system=TEMPLATES["gemma"].system) == TEMPLATES["gemma"]
    assert {TEMPLATES[name].mm_plugin for name in ("paligemma", "paligemma_chat")} == {"paligemma"}
    assert {"paligemma", "paligemma_chat"} <= set(VISION) and chat.system is None


def test_mask_history_keeps_the_images_in_front(processor):
    """With mask_history the last turn gets the budget first and only it is trained on; the images stay before
    everything (LLaMA-Factory 0.9.5 builds the turns in front of them, leaving them behind the text)."""
    rows = batch("<image>Who?", [WIDE], "Him.")
    rows["_prompt"] = [[{"role": "user", "content": "<image>Who?"}, {"role": "assistant", "content": "Him."},
                        {"role": "user", "content": "And now?"}]]
    rows["_response"] = [[{"role": "assistant", "content": "Still him."}]]
    plain, masked = (encoder(processor, mask_history=flag) for flag in (False, True))
    ids, labels = (masked(rows)[key][0] for key in ("input_ids", "labels"))
    assert ids == plain(rows)["input_ids"][0] and ids[:17] == [processor.image_token_id] * 16 + [
        processor.tokenizer.bos_token_id]
    answer = processor.tokenizer("Still him.", add_special_tokens=False)["input_ids"]
    trained = [label for label in labels if label != IGNORE]
    assert trained[:len(answer)] == answer and len(trained) < len([x for x in plain(rows)["labels"][0] if x != IGNORE])
