"""LLaMA-Factory's media columns (`images`, `videos`): which files a row names, and whether they are usable.

A row's media are file paths, relative to `media_dir` (default: `dataset_dir`) or absolute; a single string is a
one-item list, as in LLaMA-Factory. Problems are found while the dataset is built, so a broken image stops the
build with its file and row named instead of failing a training step hours later. Free of heavy imports: the
cache key reads the same paths on every run (PIL loads only when an image is checked, PyAV when a video is)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from tuneline.errors import UserError

# LLaMA-Factory reads its placeholders from these environment variables too, so data written for a changed
# placeholder works unchanged.
IMAGE_PLACEHOLDER = os.environ.get("IMAGE_PLACEHOLDER", "<image>")
VIDEO_PLACEHOLDER = os.environ.get("VIDEO_PLACEHOLDER", "<video>")
PLACEHOLDERS = {"images": IMAGE_PLACEHOLDER, "videos": VIDEO_PLACEHOLDER}
MEDIA_KINDS = ("images", "videos")  # the column keys of dataset_info.json, and `_images`/`_videos` of an example
_WHERE = " (a relative path starts at media_dir, which defaults to dataset_dir)"
_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://|^data:")


class MediaProblem(Exception):
    """Why a row's media are unusable: a short countable reason and the detail that names the file."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


def media_root(data_args) -> Path:
    """Where relative media paths start: `media_dir`, else `dataset_dir` (LLaMA-Factory's default)."""
    return Path(data_args.media_dir or data_args.dataset_dir)


def media_names(value: Any, kind: str) -> list[str]:
    """The paths a row's media cell names, as written: null or "" -> none, one string -> a one-item list."""
    if value is None or value == "":
        return []
    names = value if isinstance(value, list) else [value]
    for name in names:
        if isinstance(name, list) and kind == "videos":
            raise MediaProblem("wrong type", "a video given as a list of frame images is not supported; give the "
                                             "video file's path")
        if not isinstance(name, str):
            what = "image data stored in the dataset (e.g. a hub Image column)" if isinstance(name, dict) else (
                type(name).__name__)
            raise MediaProblem("wrong type", f"each of {kind} must be a file path, got {what}")
        if _URL.match(name):
            raise MediaProblem("remote media", f"'{name[:80]}' is a URL; download it and give the local path "
                                               "(relative to media_dir, or absolute)")
    return list(names)


def resolve_media(name: str, root: Path) -> Path:
    """The absolute path of one media file: `root/name`; as LLaMA-Factory does, a relative path missing there but
    present from the working directory is taken from there. A path found nowhere resolves under `root`."""
    path = Path(name).expanduser()
    if not path.is_absolute():
        under_root = root / path
        path = under_root if under_root.is_file() or not path.is_file() else path
    return Path(os.path.abspath(path))


def row_media(value: Any, kind: str, root: Path) -> list[str]:
    """A row's media of one kind as absolute paths (strings, so examples stay plain JSON-like rows)."""
    return [str(resolve_media(name, root)) for name in media_names(value, kind)]


def count_placeholders(messages: list[dict], kind: str) -> int:
    placeholder = PLACEHOLDERS[kind]
    return sum(message["content"].count(placeholder) for message in messages)


def check_count(sequences: list[list[dict]], media: list[str], kind: str) -> None:
    """Every message sequence a row is encoded as holds one placeholder per medium, as LLaMA-Factory's VLM plugins
    demand (pairwise rows: prompt + chosen and prompt + rejected, each)."""
    for messages in sequences:
        found = count_placeholders(messages, kind)
        if found != len(media):
            given = f"{len(media)} {kind if len(media) != 1 else kind[:-1]}"
            raise MediaProblem("placeholder count", f"{found} {PLACEHOLDERS[kind]} in the messages but {given}; "
                                                    f"write one {PLACEHOLDERS[kind]} where each goes")


class MediaChecker:
    """Checks each distinct media file once per build: a dataset naming one image in many rows reads it once."""

    def __init__(self):
        self._problems: dict[tuple[str, str], tuple[str, str] | None] = {}

    def check(self, paths: list[str], kind: str) -> None:
        for path in paths:
            key = (path, kind)
            if key not in self._problems:
                self._problems[key] = CHECKS[kind](Path(path))
            if self._problems[key]:
                raise MediaProblem(*self._problems[key])


def image_problem(path: Path) -> tuple[str, str] | None:
    """Why `path` is not a usable image, or None. Decodes the pixels: `verify()` alone passes a truncated JPEG."""
    if not path.is_file():
        return "media file missing", f"image '{path}' does not exist{_WHERE}"
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            image.load()
    except UnidentifiedImageError:
        return "bad image", f"'{path}' is not an image PIL can read"
    except (OSError, SyntaxError, ValueError) as exc:  # truncated or corrupt data
        return "bad image", f"'{path}' does not decode ({exc})"
    return None


def pyav_problem() -> str | None:
    """Why videos cannot be read here (PyAV missing), or None: like LLaMA-Factory, tuneline decodes them with PyAV."""
    try:
        import av  # noqa: F401
    except ImportError:
        return ("reading videos needs PyAV, which is not installed: `pip install 'tuneline[video]'` (or `pip "
                "install av`), or leave the videos out")
    return None


def video_problem(path: Path) -> tuple[str, str] | None:
    """Why `path` is not a usable video, or None. Every frame is decoded, as the collator will: a file cut short can
    open and then stop decoding, or end before the frame count its header gives, and the frames sampled from that
    count would then not exist."""
    if not path.is_file():
        return "media file missing", f"video '{path}' does not exist{_WHERE}"
    if path.stat().st_size == 0:
        return "bad video", f"'{path}' is empty"
    if problem := pyav_problem():
        raise UserError(problem)
    import av

    try:
        with av.open(str(path), "r") as container:
            stream = next((s for s in container.streams if s.type == "video"), None)
            if stream is None:
                return "bad video", f"'{path}' holds no video stream (only {_stream_kinds(container)})"
            decoded, header = 0, stream.frames
            try:
                for _ in container.decode(stream):
                    decoded += 1
            except av.FFmpegError as exc:
                return "bad video", f"'{path}' stops decoding after {decoded} of {header or '?'} frames ({exc.strerror})"
    except av.FFmpegError as exc:
        return "bad video", f"'{path}' does not open as a video ({exc.strerror}); is it cut short, or not a video?"
    except OSError as exc:
        return "bad video", f"'{path}' cannot be read ({exc.strerror})"
    if decoded == 0:
        return "bad video", f"'{path}' has no frames"
    if decoded < header:
        return "bad video", f"'{path}' decodes {decoded} frames but its header says {header} (is it cut short?)"
    return None


def _stream_kinds(container) -> str:
    return ", ".join(stream.type for stream in container.streams) or "no streams"


CHECKS = {"images": image_problem, "videos": video_problem}
