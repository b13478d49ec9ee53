"""Every shipped config validates, starts with the command that runs it, and every schedule parses."""

from pathlib import Path

import pytest
import yaml

from tuneline.config import load_config

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").rglob("*.yaml"))
TRAIN_CONFIGS = [p for p in EXAMPLES if "model_name_or_path" in p.read_text()]


@pytest.mark.parametrize("path", TRAIN_CONFIGS, ids=lambda p: str(p.relative_to(REPO)))
def test_example_validates(path, tiny_model_dir, monkeypatch):
    monkeypatch.chdir(REPO)  # examples name data/ relative to the repo root, as users run them
    config = load_config(path, {"model_name_or_path": str(tiny_model_dir)})
    assert config.dataset_names, "an example must train on something"
    first = path.read_text().splitlines()[0]
    assert first.startswith("# tuneline ") and path.name in first, "first line: the command that runs it"


def test_prefect_yaml_deployments_point_at_real_flows_and_configs():
    spec = yaml.safe_load((REPO / "deployments" / "prefect.yaml").read_text())
    assert spec["deployments"]
    for deployment in spec["deployments"]:
        module, _, function = deployment["entrypoint"].partition(":")
        assert (REPO / module).is_file() and f"def {function}(" in (REPO / module).read_text()
        assert (REPO / deployment["parameters"]["config_path"]).is_file()
