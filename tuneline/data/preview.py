"""`tuneline preview CONFIG`: a few encoded examples with their ids and trained spans made visible."""

from __future__ import annotations

from tuneline.config.run_config import RunConfig

IGNORE = -100
OPEN, CLOSE = "[[", "]]"
VIEWS = {  # stage -> (ids column, labels column) pairs shown per example
    "pt": [("input_ids", "labels")], "sft": [("input_ids", "labels")], "ppo": [("input_ids", None)],
    "grpo": [("input_ids", None)], "rloo": [("input_ids", None)],
    "rm": [("chosen_input_ids", "chosen_labels"), ("rejected_input_ids", "rejected_labels")],
    "kto": [("input_ids", "labels"), ("kl_input_ids", "kl_labels")],
}
VIEWS["dpo"] = VIEWS["rm"]


def marked_text(tokenizer, ids: list[int], labels: list[int] | None) -> str:
    """Decoded text with every trained span (labels != -100) wrapped in [[ ]]."""
    if labels is None:
        return tokenizer.decode(ids, skip_special_tokens=False)
    out, start = [], 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or (labels[i] == IGNORE) != (labels[start] == IGNORE):
            text = tokenizer.decode(ids[start:i], skip_special_tokens=False)
            out.append(text if labels[start] == IGNORE else f"{OPEN}{text}{CLOSE}")
            start = i
    return "".join(out)


def render_example(tokenizer, stage: str, row: dict, number: int) -> list[str]:
    lines = [f"--- example {number} ({stage})"]
    for ids_column, labels_column in VIEWS[stage]:
        ids, labels = row[ids_column], row.get(labels_column) if labels_column else None
        trained = sum(1 for t in labels if t != IGNORE) if labels is not None else 0
        lines.append(f"{ids_column} ({len(ids)} tokens, {trained} trained): {ids}")
        if labels is not None:
            lines.append(f"{labels_column}: {labels}")
        lines.append(f"text: {marked_text(tokenizer, ids, labels)}")
    if row.get("_problem"):
        lines.append(f"bad row (dropped with on_bad_rows: skip, else an error): {row['_problem']}")
    if "kto_tags" in row:
        lines.append(f"kto_tag: {row['kto_tags']}")
    if "position_ids" in row:
        lines.append(f"position_ids: {row['position_ids']}")
    return lines


def preview(config: RunConfig, n: int = 2) -> str:
    """The first n examples of the first dataset, encoded exactly as training will see them."""
    from tuneline.data.loader import load_examples
    from tuneline.data.mm.run_media import run_media
    from tuneline.data.processors import Encoder
    from tuneline.data.template_catalog import run_template
    from tuneline.model.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(config.model)
    data = config.data
    template = run_template(data, tokenizer)
    loaded = load_examples(config, config.dataset_names[:1])
    examples = loaded.per_dataset[0][:n] if loaded.per_dataset else []
    header = [f"template: {template.name}; stage: {config.stage}; cutoff_len: {data.cutoff_len}; "
              f"text inside {OPEN} {CLOSE} is trained on (labels), the rest is masked (-100)"]
    if loaded.bad:
        header.append(f"note: {len(loaded.bad)} bad rows in this dataset; first: {loaded.bad[0].message()}")
    if not examples:
        return "\n".join(header + ["(no usable rows)"])
    batch = {key: [ex[key] for ex in examples] for key in examples[0]}
    media = None  # rows with images or videos are expanded to the model's tokens, as the build step expands them
    if any([*batch.get("_images", []), *batch.get("_videos", [])]):
        media = run_media(config, tokenizer, template, any(batch.get("_videos", [])))
    encoder = Encoder(tokenizer, template, config.stage, data.cutoff_len, data.train_on_prompt, data.mask_history,
                      config.effective_packing, media)
    encoded = encoder(batch)
    rows = [{k: v[i] for k, v in encoded.items()} for i in range(len(next(iter(encoded.values()))))]
    lines = header
    for i, row in enumerate(rows, start=1):
        lines += render_example(tokenizer, config.stage, row, i)
    return "\n".join(lines)
