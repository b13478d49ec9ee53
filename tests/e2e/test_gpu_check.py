"""The CPU side of benchmarks/gpu_check.py (no GPU here): its plan and configs, the MFU arithmetic, the figures it
reads from a trainer_log.jsonl, and the table it prints. The GPU runs themselves happen on a CUDA machine."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from tuneline.config import load_config
from tuneline.demo.tiny_model import TINY_PRESETS

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dry_run_writes_a_valid_config_per_case_and_says_what_it_skips(gpu_check, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "PEER_CLI", tmp_path / "no-peer" / "llamafactory-cli")
    assert gpu_check.main(["--dry-run", "--device", "cpu", "--steps", "2", "--work", str(tmp_path / "w"),
                           "--cases", ",".join(gpu_check.CASES)]) == 0
    printed = capsys.readouterr().out
    assert "sft-qlora (tuneline): skipped, QLoRA needs CUDA" in printed
    assert "sft-full-fp8 (tuneline): skipped, fp8 needs a CUDA card" in printed
    assert "grpo-lora (llamafactory): skipped, LLaMA-Factory 0.9.5 has no grpo stage" in printed
    assert "sft-lora (llamafactory): skipped, LLaMA-Factory is not installed" in printed
    # no torchvision here: videos are skipped saying why; images run on the processor's image half
    assert re.search(r"sft-qwen3vl-videos \(tuneline\): skipped, .*(torchvision|PyAV)", printed)
    for name in ("sft-qwen3vl-images", "dpo-qwen3vl"):
        config = load_config(None, gpu_check.case_config(tmp_path / "w", name, 2, "cuda"), check_paths=False)
        assert config.model.model_name_or_path.endswith("vlm/qwen3_vl") and config.data.template == "qwen3_vl_nothink"
    written = sorted((tmp_path / "w" / "configs" / "tuneline").glob("*.yaml"))
    for path in written:
        config = load_config(path, check_paths=False)
        assert config.training["max_steps"] == 2, path
        assert f"tuneline train {path}" in printed
    assert {"sft-lora", "sft-full", "sft-full-zero3", "dpo-lora", "grpo-lora", "sft-qwen3vl-images"} <= {
        p.stem for p in written}
    zero3 = load_config(tmp_path / "w" / "configs" / "tuneline" / "sft-full-zero3.yaml", check_paths=False)
    assert zero3.training["deepspeed"].endswith("ds_z3_config.json") and zero3.finetuning.finetuning_type == "full"
    assert load_config(written[0], check_paths=False).pipeline.mlflow_tracking_uri.startswith("sqlite:///")


def test_a_key_tuneline_refuses_skips_its_case_with_the_message(gpu_check, tmp_path, monkeypatch, capsys):
    """The Liger and fp8 cases carry LLaMA-Factory's keys; where tuneline refuses one, the check says so and goes
    on (a key unknown here stands in for one not honoured yet)."""
    monkeypatch.setitem(gpu_check.CASES, "sft-lora-liger", {**gpu_check.CASES["sft-lora"], "no_such_key": True})
    assert gpu_check.main(["--dry-run", "--cases", "sft-lora,sft-lora-liger", "--systems", "tuneline",
                           "--work", str(tmp_path / "w")]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"sft-lora-liger \(tuneline\): skipped, tuneline refuses the config: .*no_such_key", printed)
    assert [p.stem for p in (tmp_path / "w" / "configs" / "tuneline").glob("*.yaml")] == ["sft-lora"]


def test_llamafactory_gets_the_same_yaml_without_tunelines_own_keys(gpu_check, tmp_path, monkeypatch, capsys):
    peer = tmp_path / "peer" / "llamafactory-cli"
    peer.parent.mkdir()
    peer.write_text("")  # present: the plan includes its runs (nothing runs in a dry run)
    monkeypatch.setattr(gpu_check, "PEER_CLI", peer)
    gpu_check.main(["--dry-run", "--cases", "dpo-lora,sft-qlora", "--work", str(tmp_path / "w")])
    ours = yaml.safe_load((tmp_path / "w" / "configs" / "tuneline" / "dpo-lora.yaml").read_text())
    theirs = yaml.safe_load((tmp_path / "w" / "configs" / "llamafactory" / "dpo-lora.yaml").read_text())
    assert {k: v for k, v in ours.items() if k not in (*gpu_check.TUNELINE_ONLY, "output_dir")} == {
        k: v for k, v in theirs.items() if k not in ("do_train", "report_to", "include_num_input_tokens_seen",
                                                     "output_dir")}
    assert theirs["bf16"] is True and theirs["output_dir"].endswith("llamafactory/dpo-lora")
    assert "llamafactory-cli train" in capsys.readouterr().out


def test_llamafactorys_side_needs_its_packages_in_its_own_folder(gpu_check, tmp_path, capsys):
    """The second call's LLaMA-Factory load holds its DeepSpeed; this process's does not count for that side."""
    (tmp_path / "site" / "llamafactory").mkdir(parents=True)
    gpu_check.main(["--dry-run", "--cases", "sft-full-zero3,sft-lora", "--systems", "llamafactory",
                    "--llamafactory-site", str(tmp_path / "site"), "--work", str(tmp_path / "w")])
    printed = capsys.readouterr().out
    assert "sft-full-zero3 (llamafactory): skipped, deepspeed is not installed" in printed
    assert "sft-lora (llamafactory): llamafactory-cli train" in printed and "(tuneline)" not in printed
    (tmp_path / "site" / "deepspeed").mkdir()
    gpu_check.main(["--dry-run", "--cases", "sft-full-zero3", "--systems", "llamafactory",
                    "--llamafactory-site", str(tmp_path / "site"), "--work", str(tmp_path / "w")])
    assert "sft-full-zero3 (llamafactory): llamafactory-cli train" in capsys.readouterr().out


def test_llamafactory_from_a_wheelhouse_target_runs_in_this_python_with_only_that_folder(gpu_check, tmp_path):
    assert gpu_check.llamafactory_command(tmp_path) is None  # nothing installed there
    (tmp_path / "llamafactory").mkdir()
    command = gpu_check.llamafactory_command(tmp_path)
    assert command[:2] == [sys.executable, "-c"] and "from llamafactory.cli import main" in command[2]


def test_the_cpu_run_trains_through_tuneline_train_and_prints_the_table(gpu_check, tmp_path, capsys):
    """The whole path a GPU run takes, on the CPU with the test preset: a real `tuneline train` subprocess (Prefect's
    temporary server, MLflow on SQLite), its trainer_log read into the table."""
    assert gpu_check.main(["--device", "cpu", "--preset", "test", "--steps", "2", "--cases", "sft-lora,grpo-lora",
                           "--systems", "tuneline", "--work", str(tmp_path / "w")]) == 0
    rows = {r["case"]: r for r in json.loads((tmp_path / "w" / "gpu_check.json").read_text())["rows"]}
    assert rows["sft-lora"]["steps"] == 2 and rows["sft-lora"]["tokens_per_s"] > 0 and rows["sft-lora"]["loss"] > 0
    assert rows["grpo-lora"]["steps"] == 2 and "error" not in rows["grpo-lora"]
    assert "| sft-lora | tuneline | 2 |" in capsys.readouterr().out


@pytest.mark.parametrize("name, peak", [("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0),
                                        ("NVIDIA H200", 989.0), ("NVIDIA A100-SXM4-80GB", 312.0),
                                        ("NVIDIA L40S", 362.0), ("NVIDIA GeForce RTX 4090", None)])
def test_peak_by_card_name_or_as_given(gpu_check, name, peak):
    assert gpu_check.peak_tflops(name, None) == peak
    assert gpu_check.peak_tflops(name, 123.0) == 123.0


def test_mfu_is_6n_for_full_and_4n_for_frozen_bases_over_the_peak(gpu_check):
    n = 500_000_000
    assert gpu_check.flops_per_token(n, gpu_check.CASES["sft-full-zero3"]) == 6 * n
    assert gpu_check.flops_per_token(n, gpu_check.CASES["dpo-lora"]) == 4 * n
    assert gpu_check.mfu(1000.0, gpu_check.flops_per_token(n, gpu_check.CASES["sft-qwen3vl-images"]), 989.0) is None
    # 10,000 tokens/s x 6 x 0.5e9 = 3e13 FLOP/s, against 989 TFLOPS
    assert gpu_check.mfu(10_000, 6 * n, 989.0) == pytest.approx(3e13 / 989e12)
    assert gpu_check.mfu(10_000, 6 * n, None) is None and gpu_check.mfu(None, 6 * n, 989.0) is None


def test_the_half_b_preset_is_about_half_a_billion_parameters():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(vocab_size=512, tie_word_embeddings=False, **TINY_PRESETS["half-b"]))
    assert 0.45e9 < sum(p.numel() for p in model.parameters()) < 0.55e9


def test_linear_weights_count_the_matmul_weights_of_the_built_model(gpu_check, tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    expected = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert gpu_check.linear_weights(tiny_model_dir) == expected
    assert expected < sum(p.numel() for p in model.parameters()), "embeddings are not counted"


def test_figures_read_from_the_trainer_log_and_the_table(gpu_check, tmp_path):
    memory = "peak_gpu_memory_mb"
    log = [{"current_steps": 10, "total_tokens": 80_000, "elapsed_time": 12.0, "loss": 2.0, memory: 900},
           {"current_steps": 20, "total_tokens": 160_000, "elapsed_time": 20.0, "loss": 1.5, memory: 2048},
           {"current_steps": 30, "total_tokens": 240_000, "elapsed_time": 28.0, "loss": 1.2, memory: 2000},
           {"current_steps": 30, "total_tokens": 240_000, "elapsed_time": 28.5, "train_loss": 1.6}]
    (tmp_path / "trainer_log.jsonl").write_text("\n".join(json.dumps(e) for e in log) + "\n")
    figures = gpu_check.read_training(tmp_path)
    # from the first log line to the last: 160,000 tokens in 16.5 s (the steps before the first line are warm-up)
    assert figures == {"steps": 30, "tokens_per_s": pytest.approx(160_000 / 16.5), "train_s": 28.5,
                       "step_s": pytest.approx(16.5 / 20), "peak_gpu_mb": 2048, "loss": 1.6}

    rows = [{"case": "sft-full", "system": "tuneline", "wall_s": 40.2, **figures},
            {"case": "sft-full", "system": "llamafactory", "wall_s": 50.0, "error": ["CUDA out of memory"]},
            {"case": "sft-qlora", "system": "tuneline", "skipped": "bitsandbytes is not installed"}]
    table = gpu_check.results_table(rows, {"sft-full": 6_000_000_000}, 989.0).splitlines()
    mfu = 100 * 6e9 * 160_000 / 16.5 / 989e12
    assert table[2] == f"| sft-full | tuneline | 30 | 40 | 28 | 0.825 | 9697 | {mfu:.1f} | 2.00 | 1.6000 |  |"
    assert table[3].endswith("| CUDA out of memory |") and "| - | - |" in table[3]
    assert table[4].startswith("| sft-qlora | tuneline | - |") and "bitsandbytes is not installed" in table[4]


def test_llamafactorys_log_reads_too_its_runtime_from_train_results(gpu_check, tmp_path):
    """LLaMA-Factory writes elapsed_time as "H:MM:SS"; its train_results.json holds the exact runtime."""
    log = [{"current_steps": 10, "total_tokens": 80_000, "elapsed_time": "0:00:12", "loss": 2.0},
           {"current_steps": 30, "total_tokens": 240_000, "elapsed_time": "0:01:02", "loss": 1.2}]
    (tmp_path / "trainer_log.jsonl").write_text("\n".join(json.dumps(e) for e in log) + "\n")
    (tmp_path / "train_results.json").write_text(json.dumps({"train_runtime": 63.25}))
    figures = gpu_check.read_training(tmp_path)
    assert figures["tokens_per_s"] == pytest.approx(160_000 / 50) and figures["step_s"] == pytest.approx(50 / 20)
    assert figures["train_s"] == 63.25 and figures["loss"] == 1.2


def test_a_failed_run_is_told_by_its_error_line_not_the_noise_after_it(gpu_check):
    output = ("Traceback (most recent call last):\nRuntimeError: Timed out while attempting to connect\n"
              "05:42:41 | ERROR | uvicorn.error - Traceback (most recent call last):\n"
              "AssertionError: Reactive triggers not started\n05:42:41 | ERROR | uvicorn.error - shutdown failed.\n")
    assert gpu_check.error_line(output) == "RuntimeError: Timed out while attempting to connect"
    assert gpu_check.error_line("x\nerror: dataset 'a' is not in data/dataset_info.json\nbye\n").startswith("error:")
    assert gpu_check.error_line("just a line\n") == "just a line" and gpu_check.error_line("") == "no output"


def test_the_training_log_carries_peak_gpu_memory_only_where_cuda_runs(tmp_path, monkeypatch):
    """No GPU here: torch.cuda's answers are stood in for, to check what the log line holds with one."""
    import torch

    from tuneline.train.callbacks import TrainerLogCallback
    from tuneline.train.trainer_log import log_record, logged_metrics

    class State:
        global_step, max_steps, epoch, num_input_tokens_seen = 3, 10, 0.3, 300

    assert "peak_gpu_memory_mb" not in TrainerLogCallback(tmp_path).progress(State())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *args: 3 * 2**30)
    progress = TrainerLogCallback(tmp_path).progress(State())
    assert progress["peak_gpu_memory_mb"] == 3072.0
    assert "peak_gpu_memory_mb" not in logged_metrics(log_record(progress, {"loss": 1.0})), "progress, not a metric"
