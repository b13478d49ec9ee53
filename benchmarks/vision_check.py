"""Vision-language families end to end where torchvision loads: `python benchmarks/vision_check.py [--device cuda]
[--presets qwen2_vl,qwen3_vl,gemma3,llava] [--steps 10]` (`make gpu-check` runs it when torchvision imports).

For each tiny preset (`tuneline tiny-model --preset NAME`): the processor loads through `tuneline.model.processor`
(the whole Qwen-VL processor, which the comparison calls, needs torchvision), tuneline's plugin expands LLaMA-Factory's
mllm_demo rows and is compared with the processor's own expansion of the same text and images (the count of image tokens per image), then the collator's
pixels go through the model for --steps AdamW steps on the same batch (loss first and last). Needs torch,
transformers, tokenizers and PIL beside tuneline's own modules (no Prefect, MLflow or datasets), and PyAV for the Qwen
families' video case (mllm_video_demo: the pads counted at build time against the video processor's grid). Figures only.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tuneline from this checkout, installed or not
DATA = REPO / "tests" / "fixtures" / "llamafactory" / "0.9.5" / "data"
VIDEO_DATA = REPO / "tests" / "fixtures" / "llamafactory-mm"  # mllm_video_demo.json and its three videos


def demo_rows(count: int) -> list[dict]:
    rows = json.loads((DATA / "mllm_demo.json").read_text())[:count]
    return [{"messages": row["messages"], "images": [str(DATA / image) for image in row["images"]]} for row in rows]


def check(preset: str, device: str, steps: int, work: Path) -> dict:
    from transformers import AutoModelForImageTextToText

    from tuneline.config import load_config
    from tuneline.data.collators import build_collator
    from tuneline.data.mm import get_mm_plugin
    from tuneline.data.mm.run_media import RunMedia, media_settings
    from tuneline.data.template_catalog import get_template
    from tuneline.demo.tiny_vlm import build_tiny_vlm
    from tuneline.model.processor import load_processor

    template_name = {"qwen3_vl": "qwen3_vl_nothink"}.get(preset, preset)
    folder = build_tiny_vlm(work / preset, preset)
    config = load_config(None, {"model_name_or_path": str(folder), "dataset": "unused", "template": template_name},
                         check_paths=False)
    processor = load_processor(config)
    template = get_template(template_name, processor.tokenizer)
    plugin = get_mm_plugin(template.mm_plugin)
    media = RunMedia(plugin, processor, media_settings(config))
    tokenizer = processor.tokenizer
    image_id = tokenizer.convert_tokens_to_ids(plugin.image_token)

    rows, features, agree = demo_rows(4), [], 0
    for row in rows:
        expanded = media.expand(row["messages"], row["images"], [])
        ids = [t for part in template.encode_many(tokenizer, [(expanded, None, None)], False)[0] for t in part]
        ours = ids.count(image_id)
        features.append({"input_ids": ids, "attention_mask": [1] * len(ids), "labels": ids, "images": row["images"],
                         "videos": []})
        theirs = _processor_count(processor, row, image_id)
        agree += int(ours == theirs)
    collator = build_collator("sft", tokenizer, media=media)
    batch = {k: v.to(device) if hasattr(v, "to") else v for k, v in collator(features).items()}
    model = AutoModelForImageTextToText.from_pretrained(folder).to(device)
    losses = adamw_losses(model, lambda: model(**batch).loss, steps)
    return {"preset": preset, "rows": len(rows), "image_tokens_agree": agree,
            "pixel_values": list(batch["pixel_values"].shape), "loss_first": losses[0], "loss_last": losses[-1],
            **dpo_check(rows, media, template, model, device, steps), **rm_check(rows, media, template, folder, device, steps),
            **video_check(media, template, model, device, steps)}


def video_check(media, template, model, device: str, steps: int) -> dict:
    """sft on mllm_video_demo's three videos (Qwen-VL only; needs PyAV): the video pads our plugin counts when the
    dataset builds, from the frame count and sizes alone, against the grid the video processor makes of the frames
    the collator decodes, and --steps AdamW steps on that batch."""
    import importlib.util

    from tuneline.data.collators import build_collator

    if media.plugin.video_token is None:
        return {}
    if importlib.util.find_spec("av") is None:
        return {"video": "skipped: PyAV is not installed (pip install 'tuneline[video]')"}
    tokenizer = media.processor.tokenizer
    rows = json.loads((VIDEO_DATA / "mllm_video_demo.json").read_text())
    batch = {"_prompt": [row["messages"][:1] for row in rows], "_response": [row["messages"][1:2] for row in rows],
             "_system": [None] * len(rows), "_tools": [None] * len(rows), "_images": [[] for _ in rows],
             "_videos": [[str(VIDEO_DATA / video) for video in row["videos"]] for row in rows]}
    features = encoded_rows(batch, media, template, "sft", 8192)
    inputs = _on_device(build_collator("sft", tokenizer, media=media)(features), device)
    pads = int((inputs["input_ids"] == tokenizer.convert_tokens_to_ids(media.plugin.video_token)).sum())
    merge = getattr(media.processor.video_processor, "merge_size", 2) ** 2
    grid = int(inputs["video_grid_thw"].prod(-1).sum()) // merge
    losses = adamw_losses(model, lambda: model(**inputs).loss, steps)
    return {"video": f"{len(rows)} videos, pads {pads} = grid {grid}: {pads == grid}, pixel_values_videos "
                     f"{list(inputs['pixel_values_videos'].shape)}, loss {losses[0]:.3f} -> {losses[-1]:.3f}"}


def dpo_check(rows: list[dict], media, template, model, device: str, steps: int) -> dict:
    """dpo on image pairs (each row's first question, its answer chosen, the next row's rejected): the pair collator's
    one forward over [chosen; rejected] with both halves' pixels (Qwen-VL: their grids and mm_token_type_ids),
    trained on the sigmoid loss without a reference; the pair loss first and last."""
    import torch

    from tuneline.data.collators import build_collator
    from tuneline.objectives.logps import MEDIA_INPUTS, pair_logps

    tokenizer = media.processor.tokenizer
    features = pair_features(rows, media, template, "dpo")
    pairs = _on_device(build_collator("dpo", tokenizer, media=media)(features), device)
    def dpo_loss():
        chosen, rejected, _, _ = pair_logps(model, pairs, tokenizer.pad_token_id or 0)
        return -torch.nn.functional.logsigmoid(0.1 * (chosen - rejected)).mean()

    losses = adamw_losses(model, dpo_loss, steps)
    return {"dpo_pixel_values": list(pairs[MEDIA_INPUTS]["pixel_values"].shape), "dpo_loss_first": losses[0],
            "dpo_loss_last": losses[-1]}


def pair_features(rows: list[dict], media, template, stage: str) -> list[dict]:
    """Image pairs from mllm_demo: each row's first question, its answer chosen, the next row's answer rejected."""

    first_turns = [row["messages"][:2] for row in rows]
    batch = {"_prompt": [turns[:1] for turns in first_turns],
             "_response": [[turns[1], first_turns[(i + 1) % len(rows)][1]] for i, turns in enumerate(first_turns)],
             "_system": [None] * len(rows), "_tools": [None] * len(rows),
             "_images": [row["images"][:turns[0]["content"].count("<image>")] for row, turns in zip(rows, first_turns, strict=True)],
             "_videos": [[] for _ in rows]}
    return encoded_rows(batch, media, template, stage, 4096)


def rm_check(rows: list[dict], media, template, folder: Path, device: str, steps: int) -> dict:
    """rm on the same image pairs: the family's one-label sequence classifier (tuneline.model.vision_scorer), scored
    over [chosen; rejected] with both halves' pixels, trained on the pairwise loss; the loss first and last."""

    from transformers import AutoConfig

    from tuneline.data.collators import build_collator
    from tuneline.model.vision_scorer import scorer_class, scorer_config
    from tuneline.objectives.logps import MEDIA_INPUTS
    from tuneline.train.rm import pair_scores, pairwise_loss

    tokenizer = media.processor.tokenizer
    model_config = scorer_config(AutoConfig.from_pretrained(folder), tokenizer.pad_token_id)
    model = scorer_class(model_config).from_pretrained(folder, config=model_config).to(device)
    pairs = _on_device(build_collator("rm", tokenizer, media=media)(pair_features(rows, media, template, "rm")), device)
    losses = adamw_losses(model, lambda: pairwise_loss(*pair_scores(model, pairs)), steps)
    return {"rm_model": type(model).__name__, "rm_pixel_values": list(pairs[MEDIA_INPUTS]["pixel_values"].shape),
            "rm_loss_first": losses[0], "rm_loss_last": losses[-1]}


def adamw_losses(model, loss_of, steps: int) -> list[float]:
    """`steps` AdamW steps (lr 1e-3) on the loss `loss_of()` computes; the loss of each."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(steps):
        loss = loss_of()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def encoded_rows(columns: dict, media, template, stage: str, cutoff_len: int) -> list[dict]:
    """The stage's encoding of converted columns (`_prompt`, `_response`, ...), one feature dict per row."""
    from tuneline.data.processors import Encoder

    encoded = Encoder(media.processor.tokenizer, template, stage, cutoff_len, media=media)(columns)
    return [dict(zip(encoded, row, strict=True)) for row in zip(*encoded.values(), strict=True)]


def _on_device(batch: dict, device: str) -> dict:
    return {k: _on_device(v, device) if isinstance(v, dict) else v.to(device) if hasattr(v, "to") else v
            for k, v in batch.items()}


def _processor_count(processor, row: dict, image_id: int) -> int | None:
    """Image tokens the processor itself writes for the row's text and images (None where it cannot say)."""
    from PIL import Image

    from tuneline.data.media import IMAGE_PLACEHOLDER

    token = getattr(processor, "image_token", None)
    if token is None:
        return None
    text = "".join(m["content"] for m in row["messages"]).replace(IMAGE_PLACEHOLDER, token)
    images = [Image.open(path).convert("RGB") for path in row["images"]]
    try:
        out = processor(text=[text], images=images, return_tensors="pt")
    except Exception:  # noqa: BLE001 - a processor that refuses this layout: no comparison, said in the table
        return None
    return int((out["input_ids"] == image_id).sum())


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--presets", default="qwen2_vl,qwen3_vl,gemma3,llava")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as work:
        for preset in args.presets.split(","):
            try:
                results.append(check(preset, args.device, args.steps, Path(work)))
            except Exception as exc:  # noqa: BLE001 - one family failing must not hide the others
                results.append({"preset": preset, "failed": f"{type(exc).__name__}: {str(exc)[:300]}"})
            print(json.dumps(results[-1]), flush=True)
    print("\n| preset | rows | image tokens = processor's | pixel_values | loss first -> last | dpo pair pixel_values "
          "| dpo loss first -> last | rm scorer | rm loss first -> last | videos |\n|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        if "failed" in r:
            print(f"| {r['preset']} | failed: {r['failed']} | | | | | | | | |")
        else:
            print(f"| {r['preset']} | {r['rows']} | {r['image_tokens_agree']}/{r['rows']} | {r['pixel_values']} | "
                  f"{r['loss_first']:.3f} -> {r['loss_last']:.3f} | {r['dpo_pixel_values']} | "
                  f"{r['dpo_loss_first']:.3f} -> {r['dpo_loss_last']:.3f} | {r['rm_model']} | "
                  f"{r['rm_loss_first']:.3f} -> {r['rm_loss_last']:.3f} | {r.get('video', '-')} |")


if __name__ == "__main__":
    main()
