"""Held-out images beside the base and tuned models' answers: what a vision-language fine-tuning changed, seen at a
glance in the model card and the MLflow run. Thumbnails are written beside the card (`held_out_images/`), with the
rows as JSON, so the card's relative links work wherever the folder goes with it (output_dir, MLflow, the hub)."""

from __future__ import annotations

import html
import json
import os
from pathlib import Path

GALLERY_DIR = "held_out_images"
ROWS_FILE = "answers.json"
MAX_IMAGES = 4  # a glance, not a benchmark: the answers files hold them all
THUMBNAIL_SIDE = 256


def image_answer_rows(base: list[dict], tuned: list[dict], limit: int = MAX_IMAGES) -> list[dict]:
    """Up to `limit` held-out rows with images, each {"images", "prompt", "label", "base", "tuned"}: the tuned
    model's answers matched with the base's by the row's prompt, label and images (both answered the same rows)."""
    def key(row: dict) -> tuple:
        return row.get("prompt"), row.get("label"), tuple(row.get("images") or ())

    base_answers = {key(row): row.get("predict") for row in base}
    rows = []
    for row in tuned:
        if not row.get("images"):
            continue
        rows.append({"images": list(row["images"]), "prompt": row.get("prompt", ""), "label": row.get("label", ""),
                     "base": base_answers.get(key(row)), "tuned": row.get("predict")})
        if len(rows) == limit:
            break
    return rows


def write_image_answers(rows: list[dict], out_dir: str | os.PathLike) -> Path | None:
    """Thumbnails of the rows' images and `answers.json` in `<out_dir>/held_out_images/` (replaced whole); None
    when there are no rows. An image gone since the evaluation is named in its row instead of drawn."""
    if not rows:
        return None
    folder = Path(out_dir) / GALLERY_DIR
    tmp = Path(out_dir) / f".{GALLERY_DIR}.{os.getpid()}.tmp"
    _remove(tmp)
    tmp.mkdir(parents=True)
    written = []
    for i, row in enumerate(rows, 1):
        thumbnails = [_thumbnail(Path(image), tmp / f"{i}-{k}.png") for k, image in enumerate(row["images"], 1)]
        written.append({**row, "thumbnails": thumbnails})
    (tmp / ROWS_FILE).write_text(json.dumps(written, indent=2, ensure_ascii=False), encoding="utf-8")
    _remove(folder)
    os.replace(tmp, folder)
    return folder


def image_answers_section(folder: Path | None) -> str | None:
    """The card's Markdown table of the gallery in `folder` (None without one): image, prompt, reference, base and
    tuned answers side by side."""
    if folder is None or not (folder / ROWS_FILE).is_file():
        return None
    rows = json.loads((folder / ROWS_FILE).read_text(encoding="utf-8"))
    lines = ["| image | prompt | reference | base | tuned |", "|---|---|---|---|---|"]
    for row in rows:
        shown = " ".join(f"![{_text(Path(image).name)}]({GALLERY_DIR}/{name})" if name else
                         f"({_text(Path(image).name)}: missing)"
                         for image, name in zip(row["images"], row["thumbnails"], strict=True))
        cells = [shown] + [_text(row.get(column)) for column in ("prompt", "label", "base", "tuned")]
        lines.append("| " + " | ".join(cells) + " |")
    return ("Held-out rows with images, answered greedily by the base model and by the tuned one (the "
            "evaluation's `predictions.jsonl` holds every row).\n\n" + "\n".join(lines))


def _text(value) -> str:
    """A table cell: HTML-escaped (templates' `<start_of_turn>` would vanish as tags), one line, pipes escaped."""
    if value is None:
        return "–"
    return html.escape(str(value)).replace("|", "\\|").replace("\n", " ").strip() or "(empty)"


def _thumbnail(source: Path, dest: Path) -> str | None:
    """A PNG no larger than THUMBNAIL_SIDE on either side, or None when the image cannot be read now."""
    from PIL import Image

    try:
        with Image.open(source) as image:
            image = image.convert("RGB")
            image.thumbnail((THUMBNAIL_SIDE, THUMBNAIL_SIDE))
            image.save(dest, format="PNG")
    except (OSError, ValueError):
        return None
    return dest.name


def _remove(path: Path) -> None:
    import shutil

    if path.is_dir():
        shutil.rmtree(path)
