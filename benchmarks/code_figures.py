"""Figures about the code itself (read from the sources, nothing runs), at the working tree or at a git revision:

- step-result lookups on the flow's side: string-keyed reads (`x["output_dir"]`, `x.get("metrics")`) in tasks/,
  flows/, orchestration/ and tuneline/pipeline/ whose key names a field of a step's result, each a field a user
  would meet missing at run time rather than a test;
- lines of the code that decides the identity of a piece of work and what the flow and the training child agree on.

    python benchmarks/code_figures.py [--at REV ...]   (several revisions: one column each)
"""

from __future__ import annotations

import argparse
import ast
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FLOW_SIDE = ("tasks", "flows", "orchestration", "tuneline/pipeline")
# Every field a step's result has held (tokenizer, dataset, reference, train, evaluate, predict, the MLflow run).
RESULT_FIELDS = {
    "path", "fingerprint", "vocab_size", "has_chat_template", "eos_token", "pad_token", "stage", "train_rows",
    "eval_rows", "bad_rows", "truncated_rows", "cache_hit", "tokens", "needed", "reason", "rows", "visited_rows",
    "computed_rows", "columns", "plan", "dataset_fingerprint", "source", "seconds", "metrics", "num_samples",
    "skipped", "num_generated", "model_key", "adapter_dir", "output_dir", "train_key", "mlflow_run_id", "run_id",
    "tracking_uri", "url", "ui_command", "run_key", "work_key",
}
IDENTITY_CODE = ("tuneline/identity", "tuneline/content/code.py", "tuneline/runtime/contract.py", "tuneline/pipeline/train_step.py",
                 "tuneline/train/output_dir.py", "tuneline/pipeline/records.py", "tuneline/content/records.py",
                 "tuneline/pipeline/keys.py")


def _files(rev: str | None, roots: tuple[str, ...]) -> dict[str, str]:
    """{path: source} of the Python files under `roots`, in the working tree or at git revision `rev`."""
    if rev is None:
        paths = [p for root in roots for p in ([REPO / root] if root.endswith(".py") else (REPO / root).rglob("*.py"))
                 if p.is_file()]
        return {str(p.relative_to(REPO)): p.read_text() for p in paths}
    listed = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, "--", *roots], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout.split()
    return {path: subprocess.run(["git", "show", f"{rev}:{path}"], cwd=REPO, check=True, capture_output=True,
                                 text=True).stdout for path in listed if path.endswith(".py")}


def _key_read(node: ast.AST) -> str | None:
    """The string key of `x["key"]` (a read) or `x.get("key", ...)`, else None."""
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
        key = node.slice
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
        key = node.args[0]
    else:
        return None
    return key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None


def result_lookups(rev: str | None) -> int:
    return sum(_key_read(node) in RESULT_FIELDS for source in _files(rev, FLOW_SIDE).values()
               for node in ast.walk(ast.parse(source)))


def identity_lines(rev: str | None) -> dict[str, int]:
    return {path: source.count("\n") for path, source in sorted(_files(rev, IDENTITY_CODE).items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--at", action="append", default=[], help="a git revision to count at (repeatable)")
    revs = [*parser.parse_args().at, None]
    names = [rev or "working tree" for rev in revs]
    print("| figure | " + " | ".join(names) + " |\n|---|" + "---|" * len(revs))
    print("| step-result lookups by string key, flow's side | "
          + " | ".join(str(result_lookups(rev)) for rev in revs) + " |")
    lines = [identity_lines(rev) for rev in revs]
    print("| lines of identity and contract code | " + " | ".join(str(sum(n.values())) for n in lines) + " |")
    for path in sorted(set().union(*lines)):
        print(f"| {path} | " + " | ".join(str(n.get(path, "-")) for n in lines) + " |")


if __name__ == "__main__":
    main()
