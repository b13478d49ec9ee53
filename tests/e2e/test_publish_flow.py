"""`push_to_hub` through the flow the user runs, against a real Prefect API and MLflow store, and a local stand-in
for the Hugging Face Hub's HTTP API (tests/hub_standin.py): no hub is reachable from this machine or from CI, so
huggingface_hub's real client talks to the stand-in, which keeps what it received."""

from __future__ import annotations

import shutil

import yaml

from tests.support.flows import REPO, run_flow, task_states
from tests.support.hub_standin import HubStandIn

TOKEN = "hf_flow_test_secret_token"
GATED_MODEL_TOKEN = "hf_planted_gated_model_token"  # hf_hub_token: reaches the training child, never a file


def test_the_flow_publishes_the_model_and_its_card_once_and_records_where(prefect_api, tmp_path, tiny_model_dir,
                                                                          monkeypatch):
    """A hub that refuses the token fails the model-card step with one message, the training kept. Run again, the
    adapter and the card go to a private repo in one commit, and the MLflow run is tagged with the repo and the
    commit; the token is nowhere in the run. A third run is all cached and uploads nothing; another hub_model_id
    publishes again without training again, in the same MLflow run."""
    from mlflow import MlflowClient

    from flows.finetune import finetune
    from tuneline.errors import UserError
    from tuneline.pipeline.publishing import COMMIT_TAG, REPO_TAG

    shutil.copytree(REPO / "data", tmp_path / "data")
    config = tmp_path / "sft.yaml"
    config.write_text(yaml.safe_dump({
        "model_name_or_path": str(tiny_model_dir), "stage": "sft", "finetuning_type": "lora", "lora_rank": 4,
        "dataset": "demo_sft", "dataset_dir": str(tmp_path / "data"), "template": "chatml", "cutoff_len": 64,
        "max_samples": 32, "output_dir": str(tmp_path / "out"), "max_steps": 2, "logging_steps": 1,
        "per_device_train_batch_size": 8, "pipeline_cache_dir": str(tmp_path / "cache"),
        "mlflow_tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "mlflow_experiment": "publish",
        "push_to_hub": True, "hub_model_id": "org/tiny-sft", "hub_private_repo": True, "hub_token": TOKEN,
        "hf_hub_token": GATED_MODEL_TOKEN,
    }))
    with HubStandIn("hf_someone_elses_token") as refusing:
        monkeypatch.setenv("HF_ENDPOINT", refusing.url)
        state = finetune(str(config), overrides=[], return_state=True)
    error = state.result(raise_on_failure=False)
    assert state.is_failed() and isinstance(error, UserError), state
    assert f"'hub_model_id: org/tiny-sft' could not be published to {refusing.url}" in str(error)
    states = task_states(state.state_details.flow_run_id)
    assert states["train"] == ["Completed"] and states["model-card"] == ["Failed"], states

    with HubStandIn(TOKEN) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        result, states = run_flow(config)
        assert states["train"] == ["Cached"] and states["model-card"] == ["Completed"], "the training was kept"

        files, card = hub.files("org/tiny-sft"), (tmp_path / "out" / "README.md").read_bytes()
        assert {"adapter_model.safetensors", "adapter_config.json", "README.md"} <= set(files)
        assert not {"run.json", "trainer_log.jsonl", "tuneline_config.yaml"} & set(files), "bookkeeping stays home"
        assert files["README.md"] == card and b"fine-tuned by tuneline" in card, "the flow's model card"
        assert files["adapter_model.safetensors"] == (tmp_path / "out" / "adapter_model.safetensors").read_bytes()
        assert hub.repos["org/tiny-sft"]["private"] is True and len(hub.commits) == 1

        run = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(result["mlflow_run_id"])
        assert run.data.tags[REPO_TAG] == f"{hub.url}/org/tiny-sft"
        assert run.data.tags[COMMIT_TAG].startswith(f"{hub.url}/org/tiny-sft/commit/")
        assert run.data.params["hub_token"] == "***"
        kept = [p for p in tmp_path.rglob("*") if p.is_file() and p != config]  # MLflow's store, artifacts, caches
        for secret in (TOKEN, GATED_MODEL_TOKEN):
            assert not [p for p in kept if secret.encode() in p.read_bytes()], f"{secret} is in the run's record"

        _, states = run_flow(config)
        assert set(states["model-card"]) == {"Cached"} and len(hub.commits) == 1, "a cached rerun uploads nothing"

        moved, states = run_flow(config, ["hub_model_id=org/tiny-sft-2"])
        assert states["train"] == ["Cached"] and states["model-card"] == ["Completed"], states
        assert moved["mlflow_run_id"] == result["mlflow_run_id"] and set(hub.files("org/tiny-sft-2")) == set(files)
