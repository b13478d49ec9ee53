"""LLaMA-Factory 0.9.5's own example configs and demo data, run unchanged as its users run them.

tests/fixtures/llamafactory/0.9.5 holds its files as released (Apache-2.0, its LICENSE beside them): the
example YAMLs, the DeepSpeed configs they name, data/dataset_info.json whole and the demo data the examples use
(and the glaive tool-call demo files, with tool_parity.json.xz: LLaMA-Factory's encoding of them, for
tests/integration/data/test_tool_parity.py).
Each example runs through `tuneline train`'s own entry point from the folder that holds examples/ and data/, with
only the model path, the output dir and the run length given on the command line; data/ is found as LLaMA-Factory
finds it, through its default `dataset_dir`. MLflow and the step caches are the embedded defaults in that folder.
"""

import json

import pytest

from tests.support.llamafactory_examples import (
    RAY_EXAMPLE,
    STEPS,
    TRAINED,
    VALIDATED,
    VISION_TRAINED,
    local_rlhf_v,
    tiny_model_overrides,
    train,
)


@pytest.mark.parametrize("example", sorted(TRAINED))
def test_an_example_config_trains_unchanged(prefect_api, checkout, tiny_model_dir, monkeypatch, example):
    from mlflow import MlflowClient

    monkeypatch.chdir(checkout)
    out = checkout / "saves" / example.replace("/", "_")
    result = train(checkout, example, *tiny_model_overrides(example, tiny_model_dir), f"output_dir={out}",
                   f"max_steps={STEPS}")

    assert (out / TRAINED[example]).is_file()
    logged = [json.loads(line) for line in (out / "trainer_log.jsonl").read_text().splitlines()]
    assert logged[-1]["current_steps"] == STEPS
    run = MlflowClient(f"sqlite:///{checkout / 'mlflow.db'}").get_run(result["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    if example in VALIDATED:
        assert run.data.tags["tuneline.evaluation"] == "done"  # before and after, on the held-out split
        assert any(key.startswith("base_") for key in run.data.metrics)
        assert any(key.startswith("final_") for key in run.data.metrics)
    else:
        assert run.data.tags["tuneline.evaluation"].startswith("skipped: "), "the example names no eval set"




@pytest.mark.parametrize("preset", ["qwen3_vl", "gemma3", "llava"])
@pytest.mark.parametrize("example", sorted(VISION_TRAINED))
def test_a_vision_example_config_trains_unchanged_on_a_tiny_vision_model(prefect_api, checkout, tiny_vlm, monkeypatch,
                                                                         example, preset):
    monkeypatch.chdir(checkout)
    out = checkout / "saves" / f"{preset}_{example.replace('/', '_')}"
    data = [f"dataset_dir={local_rlhf_v(checkout)}"] if "dpo" in example else []
    template = [] if preset == "qwen3_vl" else [f"template={preset}"]  # the examples' own: qwen3_vl_nothink
    train(checkout, example, f"model_name_or_path={tiny_vlm(preset)}", *template, f"output_dir={out}",
          f"max_steps={STEPS}", *data)

    assert (out / VISION_TRAINED[example]).is_file() and (out / "processor_config.json").is_file()
    logged = [json.loads(line) for line in (out / "trainer_log.jsonl").read_text().splitlines()]
    assert logged[-1]["current_steps"] == STEPS


def test_the_nlg_eval_predict_config_runs_unchanged_with_a_trained_adapter(prefect_api, checkout, tiny_model_dir,
                                                                          monkeypatch):
    """examples/extras/nlg_eval: do_predict with LLaMA-Factory's adapter of a finished training, no training itself.
    Given on the command line: the model, the adapter (trained here first, by its own sft example), the output dir,
    and, as max_steps for the trainings, the answers' length (max_new_tokens; its default is 1024 per answer)."""
    from mlflow import MlflowClient

    monkeypatch.chdir(checkout)
    adapter = checkout / "saves" / "nlg_eval_adapter"
    train(checkout, "examples/train_lora/qwen3_lora_sft.yaml", f"model_name_or_path={tiny_model_dir}",
          f"output_dir={adapter}", f"max_steps={STEPS}")
    out = checkout / "saves" / "nlg_eval_predict"
    result = train(checkout, "examples/extras/nlg_eval/llama3_lora_predict.yaml",
                   *tiny_model_overrides("examples/extras/nlg_eval/llama3_lora_predict.yaml", tiny_model_dir),
                   f"adapter_name_or_path={adapter}", f"output_dir={out}", "max_new_tokens=16")

    lines = [json.loads(line) for line in (out / "generated_predictions.jsonl").read_text().splitlines()]
    assert len(lines) == result["num_samples"] == 100, "max_samples: 50 of identity and 50 of alpaca_en_demo"
    assert all(list(row) == ["prompt", "predict", "label"] and row["label"] for row in lines)
    scores = json.loads((out / "predict_results.json").read_text())
    assert set(scores) == {"predict_rouge-1", "predict_rouge-2", "predict_rouge-l", "predict_bleu-4"}
    assert not (out / "adapter_model.safetensors").exists(), "nothing was trained"
    run = MlflowClient(f"sqlite:///{checkout / 'mlflow.db'}").get_run(result["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.params["adapter_name_or_path"] == str(adapter)
    assert {k: run.data.metrics[k] for k in scores} == pytest.approx(scores)


@pytest.mark.parametrize("sharded", [[], ["deepspeed=examples/deepspeed/ds_z3_config.json"]], ids=["ddp", "zero3"])
def test_the_ray_example_trains_on_ray_as_it_does_on_accelerate(prefect_api, checkout, tiny_model_dir, monkeypatch,
                                                                 sharded):
    """LLaMA-Factory's Ray example on a local Ray (2 CPU workers over gloo: its GPU per worker left out on a machine
    without one), against the same config without its Ray keys on `accelerate launch` with 2 processes: the same
    losses at every logged step, each run one finished MLflow run. Only model, data, output and length overridden
    (its own logging_steps: 10, hence 20 steps); then the same with LLaMA-Factory's ZeRO-3 config on both, which
    DeepSpeed runs on Ray's workers as under accelerate (its checkpoint: one optimizer shard per worker)."""
    from pathlib import Path

    import yaml
    from mlflow import MlflowClient

    from tuneline.config.ray_keys import RAY_KEYS

    monkeypatch.chdir(checkout)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    common = [f"model_name_or_path={tiny_model_dir}", "dataset_dir=data", "max_steps=20", *sharded]
    kind = "zero3" if sharded else "ddp"
    on_ray = train(checkout, RAY_EXAMPLE, *common, "ray_num_workers=2", f"output_dir={checkout / 'saves' / kind}-ray")
    plain = {k: v for k, v in yaml.safe_load((checkout / RAY_EXAMPLE).read_text()).items() if k not in RAY_KEYS}
    (checkout / "no_ray.yaml").write_text(yaml.safe_dump(plain))
    on_accelerate = train(checkout, "no_ray.yaml", *common, "num_processes=2",
                          f"output_dir={checkout / 'saves' / kind}-accelerate")

    def losses(result):
        logged = [json.loads(line) for line in Path(result["output_dir"], "trainer_log.jsonl").read_text().splitlines()]
        return {entry["current_steps"]: entry["loss"] for entry in logged if "loss" in entry}

    assert sorted(losses(on_ray)) == [10, 20]
    assert losses(on_ray) == pytest.approx(losses(on_accelerate), rel=1e-4)
    state = json.loads(Path(on_ray["output_dir"], "trainer_state.json").read_text())
    assert state["train_batch_size"] == 1  # per worker: the example's batch, on each of the 2
    client = MlflowClient(f"sqlite:///{checkout / 'mlflow.db'}")
    run = client.get_run(on_ray["mlflow_run_id"])
    assert run.info.status == "FINISHED" and on_ray["mlflow_run_id"] != on_accelerate["mlflow_run_id"]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [10, 20]
    shards = list(Path(on_ray["output_dir"], "checkpoint-20", "global_step20").glob("*optim_states.pt"))
    assert len(shards) == (2 if sharded else 0)
