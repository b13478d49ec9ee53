"""GPU wheelhouse: `python benchmarks/gpu_wheelhouse.py [--out .whl] [--llamafactory same|second|none]`.

A GPU machine of this workplace reaches no package index and takes at most 64 MiB with it, the tracked tree
included; its image (Python 3.12, manylinux x86_64) holds torch, transformers, accelerate, peft and many more, but no
Prefect, MLflow, datasets, trl or DeepSpeed. This script downloads, for that Python and platform, the wheels the
image lacks for `tuneline train` (`make gpu-check` installs them offline into a target folder), and with
`--llamafactory` those LLaMA-Factory 0.9.5's `llamafactory-cli train` needs, in the same folder or a second one.

What is fetched is a walk of the wheels' own requirements (markers read for Python 3.12 on Linux), from the roots
below: a requirement the image meets is not fetched (the image's version, where known, must satisfy it), and the
packages in DROPPED, which `tuneline train` never imports, are left out with the reason printed. Versions are the
ones installed in .venv (and .venv-peer for LLaMA-Factory) where they satisfy, so the GPU runs the set tested here.
DeepSpeed is an sdist: it travels as one and is built on the GPU machine, against the image's torch.

It prints each package and its size, the tracked tree's size, their sum, and exits non-zero when that sum is over
64 MiB (`--limit-mib`). With `second`, each load is checked against the limit on its own: two calls.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from email.parser import Parser
from pathlib import Path

import tomllib
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
MIB = 2**20
# The GPU image's Python packages (the device notes, KINDS.md), with the versions seen there where known.
IMAGE_VERSIONS = {"accelerate": "1.15.0", "huggingface-hub": "1.33.0", "numpy": "2.5.2", "safetensors": "0.8.0",
                  "sentencepiece": "0.2.2", "tiktoken": "0.14.0", "tokenizers": "0.23.2", "torch": "2.11.0",
                  "torchaudio": "2.11.0", "torchvision": "0.26.0", "transformers": "5.17.0", "triton": "3.6.0"}
IMAGE = set(IMAGE_VERSIONS) | set((REPO / "benchmarks" / "gpu_image_packages.txt").read_text().split())
DROPPED = {  # name -> why `tuneline train` (or `llamafactory-cli train`) runs without it
    "jieba": "do_predict's BLEU/ROUGE on Chinese text only (and a 19 MB source archive)",
    "rouge-chinese": "do_predict's ROUGE only", "nltk": "do_predict's BLEU only",
    "mlflow": "the tracking server and its web UI; mlflow-skinny holds the client and the SQLite store",
    "docker": "Prefect's Docker workers only", "apprise": "Prefect's notification blocks only",
    "amplitude-analytics": "Prefect's analytics, off (PREFECT_SERVER_ANALYTICS_ENABLED=false)",
    "bitsandbytes": "QLoRA only (a 60 MB wheel): the check's QLoRA case says it is skipped",
    "av": "videos only, and 39 MiB: with the rest over 64 MiB (the video case says it is skipped)",
}
# tuneline: its declared dependencies, with mlflow's client instead of the server; the check's cases add
# liger-kernel (enable_liger_kernel) and torchao (fp8); hjson is DeepSpeed's (an sdist: not walked).
CHECK_EXTRAS = ["mlflow-skinny", "sqlalchemy", "alembic", "liger-kernel", "torchao", "hjson"]
# `llamafactory-cli train`: the distributions its sft/dpo training path imports, measured by importing
# llamafactory.cli, launcher, train.tuner, the sft and dpo workflows and data.loader in .venv-peer. LLaMA-Factory's
# own requirements are not walked: its web UI (gradio), API server, ModelScope hub and v1 launcher stay behind.
# Each is taken at LLaMA-Factory's own bounds (transformers<=5.6.0 among them: the image's 5.17 does not do).
LLAMAFACTORY = "llamafactory==0.9.5"
# PyAV (39 MiB) fits in neither load: the video cases say they are skipped. liger-kernel and torchao are for the
# enable_liger_kernel and fp8 cases; DeepSpeed (an sdist, not walked) with its hjson and pydantic for ZeRO-3.
LLAMAFACTORY_NEEDS = {"accelerate", "datasets", "omegaconf", "peft", "trl", "transformers"}
LLAMAFACTORY_EXTRAS = ["liger-kernel", "torchao", "deepspeed>=0.17,<0.20", "hjson", "pydantic"]
PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312",
            *[f"--platform={p}" for p in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                                         "manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64", "any")]]
TARGET_ENV = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3",
              "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
              "implementation_name": "cpython", "platform_python_implementation": "CPython", "os_name": "posix"}


def installed_versions(venv: Path) -> dict[str, str]:
    """name -> version of the distributions in a venv, read from its dist-info folder names."""
    found = {}
    for info in venv.glob("lib/python3*/site-packages/*.dist-info"):
        name, _, version = info.name[: -len(".dist-info")].partition("-")
        found[canonicalize_name(name)] = version
    return found


def tuneline_roots() -> list[str]:
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return declared + CHECK_EXTRAS


def llamafactory_roots(out: Path, local: dict[str, str]) -> list[str]:
    """LLaMA-Factory itself and, at its own bounds, the requirements its training path imports."""
    download([LLAMAFACTORY], out)
    own = requirements_of(archive_of(out, "llamafactory"))
    return [LLAMAFACTORY, *(str(r) for r in own if canonicalize_name(r.name) in LLAMAFACTORY_NEEDS),
            *LLAMAFACTORY_EXTRAS]


def image_meets(req: Requirement, root: bool) -> bool:
    """The image's version, where known, satisfies `req`. Where unknown: a transitive requirement is taken as met, a
    root (a package the training imports itself) only when it has no upper bound (peft<=0.18.1 travels)."""
    name = canonicalize_name(req.name)
    if name not in IMAGE:
        return False
    if version := IMAGE_VERSIONS.get(name):
        return req.specifier.contains(Version(version), prereleases=True)
    return not root or not any(spec.operator in ("<", "<=", "==", "~=", "===") for spec in req.specifier)


def requirements_of(archive: Path, extras: frozenset[str] = frozenset()) -> list[Requirement]:
    """A wheel's Requires-Dist for Python 3.12 on Linux, with those of the `extras` asked for (`httpx[http2]` needs
    h2); an sdist's none (it builds there)."""
    if archive.suffix != ".whl":
        return []
    with zipfile.ZipFile(archive) as wheel:
        metadata = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        message = Parser().parsestr(wheel.read(metadata).decode())
    reqs = [Requirement(line) for line in message.get_all("Requires-Dist") or []]
    envs = [{**TARGET_ENV, "extra": extra} for extra in ("", *sorted(extras))]
    return [r for r in reqs if r.marker is None or any(r.marker.evaluate(env) for env in envs)]


def download(specs: list[str], out: Path) -> None:
    """`pip download --no-deps` for the GPU's Python and platform; DeepSpeed (an sdist) without the platform keys."""
    wheels = [s for s in specs if not s.startswith("deepspeed")]
    sdists = [s for s in specs if s.startswith("deepspeed")]
    base = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-build-isolation", "-d", str(out)]
    if wheels:
        subprocess.run([*base, *PLATFORM, *wheels], check=True)
    if sdists:
        subprocess.run([*base, "--no-binary=:all:", *sdists], check=True)


def pinned(req: Requirement, local: dict[str, str]) -> str:
    """The version installed here where it satisfies `req` (the set the tests ran), else pip's choice."""
    version = local.get(canonicalize_name(req.name))
    if version and req.specifier.contains(Version(version), prereleases=True):
        return f"{req.name}=={version}"
    return f"{req.name}{req.specifier}"


def archive_of(out: Path, name: str) -> Path:
    stem = re.sub(r"[-_.]+", "_", name)
    return next(p for p in out.iterdir() if re.sub(r"[-_.]+", "_", p.name.lower()).startswith(stem + "_"))


def extras_of_image_package(req: Requirement, scratch: Path, local: dict[str, str]) -> list[Requirement]:
    """What an extra of a package the image has needs beyond the package (`httpx[http2]`: h2): read from its wheel,
    downloaded aside, never carried."""
    download([pinned(req, local)], scratch)
    archive = archive_of(scratch, canonicalize_name(req.name))
    base = {str(r) for r in requirements_of(archive)}
    return [r for r in requirements_of(archive, frozenset(req.extras)) if str(r) not in base]


def build_load(roots: list[str], out: Path, local: dict[str, str], dropped: dict[str, str]) -> dict[str, Path]:
    """Download the closure of `roots` that the image lacks into `out`, extras included (LLaMA-Factory's own
    requirements are not walked: see LLAMAFACTORY_NEEDS); name -> its archive."""
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="gpu-wheelhouse-metadata-"))  # image packages' wheels, read, not carried
    chosen: dict[str, Path] = {}
    walked: dict[str, frozenset[str]] = {}  # name -> the extras whose requirements are in the walk
    level = [(req, canonicalize_name(req.name) != "llamafactory") for req in map(Requirement, roots)]
    root = True
    while level:
        todo: dict[str, tuple[Requirement, bool]] = {}
        more: list[Requirement] = []
        for req, walk in level:
            name, extras = canonicalize_name(req.name), frozenset(req.extras)
            if name in dropped or (walk and extras <= walked.get(name, frozenset()) and name in chosen):
                continue
            if name in chosen:  # carried already: the requirements of extras newly asked for
                more += requirements_of(chosen[name], extras)
            elif image_meets(req, root):
                if extras - walked.get(name, frozenset()):
                    more += extras_of_image_package(req, scratch, local)
            elif name in todo:
                todo[name][0].extras.update(extras)
                continue
            else:
                todo[name] = (req, walk)
                continue
            walked[name] = walked.get(name, frozenset()) | extras
        if todo:
            download([pinned(req, local) for req, _ in todo.values()], out)
        level, root = [(r, True) for r in more], False
        for name, (req, walk) in todo.items():
            chosen[name] = archive_of(out, name)
            walked[name] = frozenset(req.extras)
            if walk:
                level += [(r, True) for r in requirements_of(chosen[name], walked[name])]
    shutil.rmtree(scratch)
    return chosen


def tracked_size() -> int:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    return sum((REPO / f.decode()).stat().st_size for f in files if f and (REPO / f.decode()).is_file())


def report(title: str, chosen: dict[str, Path], tree: int, limit: int) -> bool:
    size = sum(p.stat().st_size for p in chosen.values())
    print(f"\n{title}: {len(chosen)} archives, {size / MIB:.1f} MiB")
    for path in sorted(chosen.values(), key=lambda p: -p.stat().st_size):
        print(f"  {path.stat().st_size / MIB:6.2f} MiB  {path.name}")
    total = size + tree
    fits = total <= limit
    print(f"{title} + tracked tree ({tree / MIB:.1f} MiB) = {total / MIB:.1f} MiB of {limit / MIB:.0f} MiB: "
          f"{'fits' if fits else 'DOES NOT FIT'}")
    return fits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / ".whl"), help="wheelhouse folder (emptied first)")
    parser.add_argument("--llamafactory", choices=("same", "second", "none"), default="second",
                        help="LLaMA-Factory's wheels: in the same folder, a second one (OUT-llamafactory), or none")
    parser.add_argument("--limit-mib", type=float, default=64.0)
    parser.add_argument("--venv", default=str(REPO / ".venv"), help="versions pinned from here where they fit")
    parser.add_argument("--peer-venv", default=str(REPO / ".venv-peer"), help="LLaMA-Factory's versions")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    peer_out = out if args.llamafactory == "same" else out.with_name(out.name + "-llamafactory")
    for folder in {out, peer_out}:
        shutil.rmtree(folder, ignore_errors=True)
    print("left out:\n" + "\n".join(f"  {name}: {why}" for name, why in DROPPED.items()))
    ours = build_load(tuneline_roots(), out / "tuneline", installed_versions(Path(args.venv)), DROPPED)
    tree, limit = tracked_size(), int(args.limit_mib * MIB)
    fits = report("tuneline's wheels", ours, tree, limit)
    if args.llamafactory != "none":
        peer_local = installed_versions(Path(args.peer_venv))
        roots = llamafactory_roots(peer_out / "llamafactory", peer_local)
        theirs = build_load(roots, peer_out / "llamafactory", peer_local, {})
        if args.llamafactory == "same":
            fits = report("both loads", {**{f"t:{k}": v for k, v in ours.items()},
                                         **{f"l:{k}": v for k, v in theirs.items()}}, tree, limit)
        else:
            fits = report("LLaMA-Factory's wheels (a second call)", theirs, tree, limit) and fits
    return 0 if fits else 1


if __name__ == "__main__":
    sys.exit(main())
