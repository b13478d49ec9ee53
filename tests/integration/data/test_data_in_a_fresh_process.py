"""What the data step does in a fresh Python process: the dataset's fingerprint (what the flow keys its cache on)
imports no heavy library, and LLaMA-Factory's placeholder environment variables are read at import."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.data import write_dataset

ALPACA_IMAGES = {"columns": {"prompt": "instruction", "response": "output", "images": "images"}}


def test_fingerprint_imports_no_heavy_library(tmp_path, char_tokenizer_dir):
    data_dir = tmp_path / "data"
    write_dataset(data_dir, "a", [{"instruction": f"q {i}", "output": f"a {i}"} for i in range(10)])
    code = (
        "import sys, time\n"
        "from tuneline.config import load_config\n"
        "from tuneline.data import dataset_fingerprint\n"
        f"c = load_config(overrides={{'model_name_or_path': {str(char_tokenizer_dir)!r}, 'dataset': 'a',"
        f" 'dataset_dir': {str(data_dir)!r}, 'pipeline_cache_dir': {str(tmp_path / 'cache')!r},"
        f" 'output_dir': {str(tmp_path / 'o')!r}}}, check_paths=False)\n"
        "dataset_fingerprint(c)\n"
        "bad = [m for m in ('torch', 'transformers', 'datasets') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_placeholders_follow_llamafactorys_environment_variables(media_data_dir, tmp_path, char_tokenizer_dir):
    write_dataset(media_data_dir, "own_tag", [{"instruction": "[IMG] Who?", "output": "A player.",
                                         "images": ["mllm_demo_data/1.jpg"]}], ALPACA_IMAGES)
    code = (
        "from tuneline.config import load_config\n"
        "from tuneline.data.loader import load_examples\n"
        f"c = load_config(overrides={{'model_name_or_path': {str(char_tokenizer_dir)!r}, 'dataset': 'own_tag',"
        f" 'dataset_dir': {str(media_data_dir)!r}, 'output_dir': {str(tmp_path / 'o')!r}}}, check_paths=False)\n"
        "loaded = load_examples(c, c.dataset_names)\n"
        "print([b.message() for b in loaded.bad], loaded.per_dataset[0][0]['_images'])\n"
    )
    env = {**os.environ, "IMAGE_PLACEHOLDER": "[IMG]"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"[] {[str(media_data_dir / 'mllm_demo_data' / '1.jpg')]}"


def test_editing_a_module_the_build_imports_changes_the_fingerprint(tmp_path, char_tokenizer_dir):
    """No version constant to bump, no folder hashed whole: the key holds every module the build imports (here in a
    copy of the package, edited), and an edit of a module it does not import keeps the key."""
    import shutil
    from pathlib import Path

    import tuneline

    data_dir = tmp_path / "data"
    write_dataset(data_dir, "a", [{"instruction": f"q {i}", "output": f"a {i}"} for i in range(10)])

    package = tmp_path / "code" / "tuneline"
    shutil.copytree(Path(tuneline.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__"))
    code = (
        "from tuneline.config import load_config\n"
        "from tuneline.data import dataset_fingerprint\n"
        f"c = load_config(overrides={{'model_name_or_path': {str(char_tokenizer_dir)!r}, 'dataset': 'a',"
        f" 'dataset_dir': {str(data_dir)!r}, 'pipeline_cache_dir': {str(tmp_path / 'cache')!r},"
        f" 'output_dir': {str(tmp_path / 'o')!r}}}, check_paths=False)\n"
        "print(dataset_fingerprint(c))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(package.parent)}

    def key() -> str:
        return subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, check=True, capture_output=True,
                              text=True).stdout.strip()

    before = key()
    unrelated = package / "evaluation" / "run.py"  # the evaluation's code: the dataset does not import it
    unrelated.write_text(unrelated.read_text() + "\n# an edit of the evaluation\n")
    assert key() == before
    encoder = package / "data" / "templates.py"
    encoder.write_text(encoder.read_text() + "\n# a change to how rows are encoded\n")
    assert key() != before
