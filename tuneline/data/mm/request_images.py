"""Images handed over at answer time (`tuneline chat --image`, a served model's `images` column): a local path or
base64 text (bare, or a `data:image/...;base64,` URI as OpenAI's API sends), decoded and checked at once, so a bad
one is named before anything is generated. URLs are refused: a served model fetching what a request names is a
door into the server's network; for the same reason a served model reads files only inside one folder
(`LocalPaths`), as LLaMA-Factory's API does with its SAFE_MEDIA_PATH."""

from __future__ import annotations

import base64
import binascii
import os
import re
from io import BytesIO
from pathlib import Path

from tuneline.errors import UserError

TITLE = "cannot read the image"
_DATA_URI = re.compile(r"^data:image/[\w.+-]+;base64,", re.IGNORECASE)
_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
_BASE64 = re.compile(r"^[A-Za-z0-9+/=\s_-]+$")
MIN_BASE64 = 64  # shorter text is a path that does not exist rather than an image's bytes


class LocalPaths:
    """Which local paths an image may be read from: any (the user's own `tuneline chat`), or only those inside
    `root` (a served model: a request must not read the server's files); `root` None with `any_path` False: none."""

    def __init__(self, any_path: bool = True, root: Path | None = None, setting: str = ""):
        self.any_path, self.root, self.setting = any_path, root, setting

    def problem(self, path: Path) -> str | None:
        if self.any_path:
            return None
        if self.root is None:
            return (f"reading image files is off here; send the image as base64 text, or set {self.setting} to the "
                    "folder whose images requests may name")
        real, root = Path(os.path.realpath(path)), Path(os.path.realpath(self.root))
        if real != root and root not in real.parents:
            return f"'{path}' is outside {self.setting} ({self.root}), the only folder requests may read images from"
        return None


ANY_PATH = LocalPaths()


def read_image(source: str, where: str = "image", paths: LocalPaths = ANY_PATH):
    """The RGB PIL image `source` names or holds; UserError naming `where` and the problem otherwise. A path is read
    only where `paths` allows it (checked before the file is looked at, so a refusal says nothing about it)."""
    if not isinstance(source, str) or not source.strip():
        raise UserError(f"{where}: expected a file path or base64 text, got {source!r}", title=TITLE)
    source = source.strip()
    if _URL.match(source):
        raise UserError(f"{where}: '{source[:80]}' is a URL; send the image as base64 text or a path on the "
                        "serving machine", title=TITLE)
    data = _base64_bytes(source, where)
    if data is None:
        path = Path(source).expanduser()
        if problem := paths.problem(path):
            raise UserError(f"{where}: {problem}", title=TITLE)
        if not _is_file(path):
            raise UserError(f"{where}: '{source[:200]}' is neither an existing file nor base64 image data",
                            title=TITLE)
        data = path.read_bytes()
    return _decoded(data, where, source if len(source) < 200 else "the base64 data")


def _base64_bytes(source: str, where: str) -> bytes | None:
    """The bytes of base64 text (None when `source` does not read as base64, so it is taken as a path)."""
    uri = _DATA_URI.match(source)
    text = source[uri.end():] if uri else source
    if not uri and (len(text) < MIN_BASE64 or not _BASE64.match(text) or _is_file(text)):
        return None
    try:
        return base64.b64decode(re.sub(r"\s", "", text).replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        if uri:
            raise UserError(f"{where}: the data URI's base64 text does not decode", title=TITLE) from None
        return None


def _is_file(path) -> bool:
    try:
        return Path(path).is_file()
    except OSError:  # a name too long for a path is base64 text, not a file
        return False


def _decoded(data: bytes, where: str, name: str):
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(BytesIO(data)) as image:
            image.load()
            return image.convert("RGB")
    except UnidentifiedImageError:
        raise UserError(f"{where}: {name} is not an image PIL can read", title=TITLE) from None
    except (OSError, SyntaxError, ValueError) as exc:  # truncated or corrupt data
        raise UserError(f"{where}: {name} does not decode ({exc})", title=TITLE) from None
