"""LLaMA-Factory 0.9.5's own example configs and demo data, run unchanged as its users run them.

tests/fixtures/llamafactory/0.9.5 holds its files as released (Apache-2.0, its LICENSE beside them): the
example YAMLs, the DeepSpeed configs they name, data/dataset_info.json whole and the demo data the examples use
(and the glaive tool-call demo files, with tool_parity.json.xz: LLaMA-Factory's encoding of them, for
tests/unit/data/test_tool_parity.py).
Each example runs through `tuneline train`'s own entry point from the folder that holds examples/ and data/, with
only the model path, the output dir and the run length given on the command line; data/ is found as LLaMA-Factory
finds it, through its default `dataset_dir`. MLflow and the step caches are the embedded defaults in that folder.
"""

import json
import shutil
from pathlib import Path

import pytest

LLAMAFACTORY = Path(__file__).resolve().parents[1] / "fixtures" / "llamafactory" / "0.9.5"
TRAINED = {  # example -> the file a finished training leaves in output_dir
    "examples/train_lora/qwen3_lora_sft.yaml": "adapter_model.safetensors",
    "examples/train_lora/qwen3_lora_pretrain.yaml": "adapter_model.safetensors",
    "examples/train_lora/qwen3_lora_reward.yaml": "adapter_model.safetensors",
    "examples/train_lora/qwen3_lora_dpo.yaml": "adapter_model.safetensors",
    "examples/train_lora/qwen3_lora_kto.yaml": "adapter_model.safetensors",
    "examples/train_full/qwen3_full_sft.yaml": "model.safetensors",
    "examples/extras/loraplus/llama3_lora_sft.yaml": "adapter_model.safetensors",
    "examples/extras/pissa/llama3_lora_sft.yaml": "adapter_model.safetensors",
    # optimizers, precision and methods beside AdamW and LoRA (the GaLore one is the revision of LLaMA-Factory's
    # repository stored for that path, which sets the same keys as 0.9.5's with older spellings beside them)
    "examples/extras/galore/llama3_full_sft.yaml": "model.safetensors",
    "examples/extras/apollo/llama3_full_sft.yaml": "model.safetensors",
    "examples/extras/adam_mini/qwen2_full_sft.yaml": "model.safetensors",
    "examples/extras/muon/qwen2_full_sft.yaml": "model.safetensors",
    "examples/extras/oft/llama3_oft_sft.yaml": "adapter_model.safetensors",
    "examples/extras/dft/qwen2_full_sft.yaml": "model.safetensors",
}
# Examples that hold out a validation split (val_size): the flow evaluates the model before and after on it.
VALIDATED = {"examples/extras/galore/llama3_full_sft.yaml", "examples/extras/apollo/llama3_full_sft.yaml",
             "examples/extras/adam_mini/qwen2_full_sft.yaml"}
STEPS = 2
RAY_EXAMPLE = "examples/train_lora/qwen3_lora_sft_ray.yaml"
# The tiny model's tokenizer is ChatML's: llama3's stop words are not tokens of it, so the llama3 examples add them,
# as the refusal of a template whose stop words a tokenizer lacks says to.
LLAMA3_TOKENS = "add_special_tokens=<|eot_id|>,<|eom_id|>"


def tiny_model_overrides(example: str, tiny_model_dir) -> list[str]:
    return [f"model_name_or_path={tiny_model_dir}", *([LLAMA3_TOKENS] if "/llama3_" in example else [])]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """A copy of the LLaMA-Factory files, so runs write their outputs, caches and MLflow store there."""
    root = tmp_path_factory.mktemp("llamafactory")
    shutil.copytree(LLAMAFACTORY, root, dirs_exist_ok=True)
    return root


def train(checkout, example, *overrides):
    """`tuneline train EXAMPLE key=value ...` in the checkout; the flow's result."""
    import contextlib
    import io

    from flows.cli import run

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert run(["train", example, *overrides]) == 0
    return json.loads(printed.getvalue()[printed.getvalue().index("{"):])


def test_every_example_config_passes_the_checks_made_before_a_run(checkout, tiny_model_dir, monkeypatch):
    """What `tuneline validate` checks (keys, ranges, template, paths, packages), for every example: in `make test`,
    while the trainings themselves run in `make acceptance`."""
    from tuneline.preflight import checked_config

    monkeypatch.chdir(checkout)
    for example in TRAINED:
        config = checked_config(example, [*tiny_model_overrides(example, tiny_model_dir), "output_dir=saves/check"])
        assert config.data.dataset and config.has_validation == (example in VALIDATED), example


@pytest.mark.acceptance
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


def test_a_method_tuneline_has_not_built_is_refused_before_anything_starts(checkout, tiny_model_dir, monkeypatch,
                                                                          capsys):
    from flows.cli import run

    monkeypatch.chdir(checkout)
    out = checkout / "saves" / "llama_pro"
    assert run(["train", "examples/extras/llama_pro/llama3_freeze_sft.yaml", f"model_name_or_path={tiny_model_dir}",
                f"output_dir={out}", f"max_steps={STEPS}"]) == 2
    refused = capsys.readouterr().err
    assert "use_llama_pro" in refused and "does not support" in refused and "Traceback" not in refused
    assert not out.exists()


# LLaMA-Factory's Qwen3-VL examples (its data: mllm_demo, identity, alpaca_en_demo; rlhf_v from its local copy), on a
# tiny Qwen3-VL with the examples' own template, and on tiny gemma3 and llava with theirs. Without torchvision (here)
# the Qwen3-VL run gets its processor's image half (tuneline.model.image_only_processor).
VISION_TRAINED = {
    "examples/train_lora/qwen3vl_lora_sft.yaml": "adapter_model.safetensors",
    "examples/train_full/qwen3vl_full_sft.yaml": "model.safetensors",
    "examples/train_lora/qwen3vl_lora_dpo.yaml": "adapter_model.safetensors",
}
RLHF_V_PAIRS = Path(__file__).resolve().parents[1] / "fixtures" / "llamafactory-mm" / "rlhf_v_demo.json"


def local_rlhf_v(checkout: Path) -> Path:
    """A data dir as a LLaMA-Factory user with the hub dataset `llamafactory/RLHF-V` on disk has it: LLaMA-Factory's
    dataset_info.json unchanged (its `rlhf_v` entry names the hub id), the rows under data/llamafactory/RLHF-V/, the
    images they name beside them."""
    data = checkout / "data-rlhf-v"
    if not data.exists():
        shutil.copytree(checkout / "data" / "mllm_demo_data", data / "mllm_demo_data")
        shutil.copy(checkout / "data" / "dataset_info.json", data)
        (data / "llamafactory" / "RLHF-V").mkdir(parents=True)
        shutil.copy(RLHF_V_PAIRS, data / "llamafactory" / "RLHF-V")
    return data


@pytest.mark.acceptance
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


def test_the_dpo_vision_example_is_refused_up_front_without_its_hub_dataset(checkout, tiny_vlm, monkeypatch, capsys):
    """Its `rlhf_v` is a hub dataset with images, read only from a local copy (see local_rlhf_v), which
    LLaMA-Factory's data folder does not hold."""
    from flows.cli import run

    monkeypatch.chdir(checkout)
    out = checkout / "saves" / "refused"
    assert run(["train", "examples/train_lora/qwen3vl_lora_dpo.yaml", f"model_name_or_path={tiny_vlm('qwen3_vl')}",
                f"output_dir={out}", f"max_steps={STEPS}"]) == 2
    refused = capsys.readouterr().err
    assert "dataset 'rlhf_v'" in refused and "llamafactory/RLHF-V" in refused and "Traceback" not in refused
    assert not out.exists()


def test_bad_images_end_the_run_before_training_naming_their_rows(prefect_api, tiny_vlm, tmp_path, monkeypatch,
                                                                   capsys):
    from flows.cli import run

    shutil.copytree(LLAMAFACTORY, tmp_path, dirs_exist_ok=True)
    images = tmp_path / "data" / "mllm_demo_data"
    (images / "2.jpg").write_bytes((images / "2.jpg").read_bytes()[:2000])  # a truncated JPEG
    (images / "3.jpg").unlink()
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "saves" / "bad"
    assert run(["train", "examples/train_lora/qwen3vl_lora_sft.yaml", f"model_name_or_path={tiny_vlm('gemma3')}",
                "template=gemma3", f"output_dir={out}", f"max_steps={STEPS}"]) == 2
    refused = capsys.readouterr().err
    assert "mllm_demo.json" in refused and "Traceback" not in refused
    assert "bad image" in refused and "2.jpg" in refused and "media file missing" in refused
    assert not (out / "trainer_log.jsonl").exists()


@pytest.mark.acceptance
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


@pytest.mark.acceptance
def test_the_ray_example_trains_on_ray_as_it_does_on_accelerate(prefect_api, checkout, tiny_model_dir, monkeypatch):
    """LLaMA-Factory's Ray example on a local Ray (2 CPU workers over gloo: its GPU per worker left out on a machine
    without one), against the same config without its Ray keys on `accelerate launch` with 2 processes: the same
    losses at every logged step, each run one finished MLflow run. Only model, data, output and length overridden
    (its own logging_steps: 10, hence 20 steps)."""
    import yaml
    from mlflow import MlflowClient

    from tuneline.config.ray_keys import RAY_KEYS

    monkeypatch.chdir(checkout)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    common = [f"model_name_or_path={tiny_model_dir}", "dataset_dir=data", "max_steps=20"]
    on_ray = train(checkout, RAY_EXAMPLE, *common, "ray_num_workers=2", f"output_dir={checkout / 'saves' / 'ray'}")
    plain = {k: v for k, v in yaml.safe_load((checkout / RAY_EXAMPLE).read_text()).items() if k not in RAY_KEYS}
    (checkout / "no_ray.yaml").write_text(yaml.safe_dump(plain))
    on_accelerate = train(checkout, "no_ray.yaml", *common, "num_processes=2",
                          f"output_dir={checkout / 'saves' / 'accelerate'}")

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
