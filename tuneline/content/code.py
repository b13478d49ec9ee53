"""The version of the code a step runs (the content of its code), from the modules it imports: a step's cached result is answered only while
every tuneline module its code can reach is unchanged, and an edit elsewhere leaves it standing.

The modules are found by reading the sources (ast), not by importing them: every `import tuneline...` and
`from tuneline... import ...` (relative ones too), inside functions as well, and every string naming a tuneline
module (what importlib loads by name, such as one module per training stage), followed transitively."""

from __future__ import annotations

import ast
import functools
import hashlib
import re
from pathlib import Path

from tuneline import __version__
from tuneline.content.fingerprint import fingerprint

PACKAGE = "tuneline"
PACKAGE_ROOT = Path(__file__).resolve().parents[1]
MODULE_NAME = re.compile(r"^tuneline(\.[A-Za-z_]\w*)*$")

# The module each cached step's work starts from (what its task calls into, or what the training child runs).
STEP_ENTRIES = {
    "load-tokenizer": ("tuneline.pipeline.tokenizer_check",),
    "build-dataset": ("tuneline.data.build",),
    "build-reference-model": ("tuneline.reference",),
    "train": ("tuneline.train.__main__",),
    "evaluate": ("tuneline.evaluation.run",),
    "predict": ("tuneline.evaluation.predict_step",),
    "plot": ("tuneline.pipeline.report_steps",),
    "model-card": ("tuneline.pipeline.report_steps", "tuneline.pipeline.record"),
}


def module_file(name: str, root: Path = PACKAGE_ROOT) -> Path | None:
    """The source of tuneline module `name` under `root` (the package folder), or None when there is none."""
    if not (name == PACKAGE or name.startswith(PACKAGE + ".")):
        return None
    base = root.joinpath(*name.split(".")[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _named_modules(name: str, path: Path, root: Path) -> set[str]:
    """The tuneline modules a source file names: its imports and module-name strings, each with its packages."""
    stat = path.stat()
    return _read_names(name, path, root, stat.st_mtime_ns, stat.st_size)


@functools.cache
def _read_names(name: str, path: Path, root: Path, mtime_ns: int, size: int) -> set[str]:
    """Each file is parsed once per process (steps share most of their modules), again only once it changed."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
            base = ".".join([*parts, node.module] if node.level and node.module else
                            parts if node.level else [node.module or ""])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_NAME.match(node.value) and (
                not name.startswith(__name__.rsplit(".", 1)[0])):  # this package's names are entries, not imports
            found.add(node.value)
    with_packages = {".".join(m.split(".")[:i]) for m in found for i in range(1, m.count(".") + 2)}
    return {m for m in with_packages if module_file(m, root) is not None}


@functools.cache
def imported_modules(*entries: str, root: Path = PACKAGE_ROOT) -> dict[str, Path]:
    """Every tuneline module the entries reach, by name, with its source file."""
    seen: dict[str, Path] = {}
    todo = [m for m in entries if module_file(m, root) is not None]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen[name] = path = module_file(name, root)
        todo.extend(_named_modules(name, path, root) - seen.keys())
    return dict(sorted(seen.items()))


def code_version(*entries: str, root: Path = PACKAGE_ROOT) -> str:
    """One hash of the sources of every module the entries reach (and tuneline's version)."""
    files = imported_modules(*entries, root=root)
    return fingerprint(__version__, {name: hashlib.sha256(path.read_bytes()).hexdigest()
                                     for name, path in files.items()})


@functools.cache
def step_code_version(step: str) -> str:
    """The code version in `step`'s key (one of STEP_ENTRIES), computed once per process."""
    return code_version(*STEP_ENTRIES[step])
