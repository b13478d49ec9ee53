"""Issue 25's security rules: weights never unpickled as code, trust_remote_code off unless asked and then recorded,
no credential in the MLflow URI, and no experiment name that writes outside the store's artifact folder."""

from __future__ import annotations

import pathlib
import re
import shutil
from pathlib import Path

import pytest
import torch

from tuneline.config import load_config
from tuneline.errors import ConfigError, UserError

REPO = Path(__file__).resolve().parents[2]


class TouchOnUnpickle:
    """Unpickling this calls Path.touch on the marker: a checkpoint that carries code, not only tensors."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (self.marker,)


def config(**keys):
    return load_config(None, {"model_name_or_path": "tiny", "stage": "sft", "dataset": "demo_sft",
                              "output_dir": "unused", **keys}, check_paths=False)


def test_a_pickled_payload_in_a_bin_checkpoint_is_refused_and_never_runs(tiny_model_dir, tmp_path):
    """transformers 5 loads .bin weights with weights_only=True, so a .bin-only model is allowed: it can only hold
    tensors. The same file unpickled the unsafe way would run the payload (the control below)."""
    from tuneline.model.loader import load_base_model
    from tuneline.model.tokenizer import load_tokenizer

    model_dir = tmp_path / "bin-only"
    shutil.copytree(tiny_model_dir, model_dir)
    for weights in model_dir.glob("*.safetensors"):
        weights.unlink()
    marker = tmp_path / "payload-ran"
    torch.save({"model.embed_tokens.weight": TouchOnUnpickle(marker)}, model_dir / "pytorch_model.bin")

    run_config = load_config(None, {"model_name_or_path": str(model_dir), "stage": "sft", "dataset": "demo_sft",
                                    "template": "chatml", "output_dir": str(tmp_path / "out")}, check_paths=False)
    tokenizer = load_tokenizer(run_config.model)
    with pytest.raises(UserError, match="cannot load 'model_name_or_path'"):
        load_base_model(run_config, tokenizer, is_trainable=True, add_valuehead=False)
    assert not marker.exists(), "the pickled payload ran while loading the model"
    with pytest.raises(Exception):  # noqa: B017  (torch's own refusal, whatever its class)
        torch.load(model_dir / "pytorch_model.bin", weights_only=True)

    torch.load(model_dir / "pytorch_model.bin", weights_only=False)  # the control: unsafe loading runs it
    assert marker.exists()


def test_every_torch_load_in_tuneline_is_weights_only_and_nothing_unpickles():
    """tuneline's own loads (PPO checkpoints, value heads) read tensors, numbers and dicts only."""
    sources = {path: path.read_text(encoding="utf-8") for path in (REPO / "tuneline").rglob("*.py")}
    loads = [(path, call) for path, text in sources.items() for call in re.findall(r"torch\.load\([^\n]*", text)]
    assert loads, "the scan found no torch.load at all: its pattern no longer matches the code"
    assert [str(path) for path, call in loads if "weights_only=True" not in call] == []
    assert [str(path) for path, text in sources.items()
            if re.search(r"\bpickle\.loads?\(|allow_pickle=True|\bdill\b|cloudpickle", text)] == []


def test_trust_remote_code_is_off_unless_asked_then_tagged_and_in_the_card(tiny_model_dir, tmp_path,
                                                                           empty_mlflow_store):
    from mlflow import MlflowClient

    from tuneline.pipeline.record import TRUST_REMOTE_CODE_TAG, start_run
    from tuneline.report.model_card import REMOTE_CODE_NOTE, write_model_card

    assert config().model.trust_remote_code is False
    db = tmp_path / "mlflow.db"
    shutil.copy(empty_mlflow_store, db)
    uri = f"sqlite:///{db}"
    cards = {}
    for trusted in (False, True):
        run_config = config(trust_remote_code=trusted, mlflow_tracking_uri=uri, run_name=f"trusted={trusted}",
                            output_dir=str(tmp_path / str(trusted)))
        run = start_run(run_config, f"dataset-fp-{trusted}", None, None)
        tags = MlflowClient(uri).get_run(run.run_id).data.tags
        assert tags.get(TRUST_REMOTE_CODE_TAG) == ("true" if trusted else None)
        card = write_model_card(run_config, tmp_path / str(trusted), base_metrics={}, tuned_metrics={},
                                dataset_fingerprints={}, plots=[], mlflow_run=None, framework_versions={})
        cards[trusted] = Path(card).read_text(encoding="utf-8")
    assert REMOTE_CODE_NOTE.strip() in cards[True] and "| trust_remote_code | True |" in cards[True]
    assert REMOTE_CODE_NOTE.strip() not in cards[False] and "| trust_remote_code |" not in cards[False]


def test_an_mlflow_uri_with_a_password_is_refused_from_the_config_or_the_environment(monkeypatch):
    with pytest.raises(ConfigError) as err:
        config(mlflow_tracking_uri="https://alice:s3cret-pw@mlflow.example:5000")
    assert "'mlflow_tracking_uri'" in str(err.value) and "MLFLOW_TRACKING_PASSWORD" in str(err.value)
    assert "s3cret-pw" not in str(err.value)

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://token-only@127.0.0.1:5000")
    with pytest.raises(ConfigError, match="'mlflow_tracking_uri'"):
        config()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert config().pipeline.mlflow_tracking_uri == "http://127.0.0.1:5000"


@pytest.mark.parametrize("name", ["..", "."])
def test_an_experiment_name_cannot_climb_out_of_the_artifact_folder(name, tmp_path):
    from tuneline.tracking.store import default_artifact_location

    with pytest.raises(ConfigError, match="'mlflow_experiment'"):
        config(mlflow_experiment=name)
    location = default_artifact_location(f"sqlite:///{tmp_path / 'mlflow.db'}", name)
    assert Path(location.removeprefix("file://")).parent == (tmp_path / "mlartifacts").resolve()
    assert config(mlflow_experiment="..v2").pipeline.mlflow_experiment == "..v2", "dots inside a name are fine"


def test_a_credential_on_the_command_line_is_refused_before_prefect_stores_it(tiny_model_dir, tmp_path):
    """The CLI's overrides become the flow run's parameters, which Prefect keeps and shows."""
    from tuneline.pipeline.preflight import checked_config

    keys = {"model_name_or_path": str(tiny_model_dir), "stage": "sft", "dataset": "demo_sft", "template": "chatml",
            "dataset_dir": str(REPO / "data"), "output_dir": str(tmp_path / "out")}
    path = tmp_path / "sft.yaml"
    path.write_text("\n".join(f"{key}: {value}" for key, value in {**keys, "hf_hub_token": "hf_in_file"}.items()))
    assert checked_config(path, ["learning_rate=1e-4"]).model.hf_hub_token == "hf_in_file"
    with pytest.raises(ConfigError) as err:
        checked_config(path, ["hf_hub_token=hf_typed_secret", "learning_rate=1e-4"])
    assert "'hf_hub_token' is a credential given on the command line" in str(err.value)
    assert "hf_typed_secret" not in str(err.value)
