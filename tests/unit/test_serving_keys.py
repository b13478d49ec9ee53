"""LLaMA-Factory's serving keys under `tuneline api`: `infer_backend: vllm` is refused before anything loads where
CUDA or vLLM is missing (this machine has neither), wrong values are named, and on a machine with both the vllm_*
keys become `vllm serve` flags (the command is checked here; running it needs a GPU with vLLM)."""

from __future__ import annotations

import pytest
import yaml

from cli.main import run
from tuneline.config.serving_keys import ServingArgs, split_serving_keys
from tuneline.serving.source import ServedTarget


@pytest.fixture
def lf_config(tmp_path):
    """An inference config as LLaMA-Factory's examples write one."""
    path = tmp_path / "llama3_vllm.yaml"
    path.write_text(yaml.safe_dump({"model_name_or_path": str(tmp_path / "model"), "template": "llama3",
                                    "infer_backend": "vllm", "vllm_maxlen": 2048}))
    return path


def test_vllm_is_refused_before_anything_loads_naming_what_is_missing(lf_config, capsys):
    assert run(["api", str(lf_config)]) == 2
    err = capsys.readouterr().err
    assert "'infer_backend: vllm' needs a CUDA GPU, and this machine has none" in err
    assert "'infer_backend: vllm' needs the vllm package, which is not installed" in err
    assert "Traceback" not in err


def test_wrong_serving_values_are_named_all_at_once(lf_config, capsys):
    assert run(["api", str(lf_config), "infer_backend=sglang", "vllm_gpu_util=1.5", "vllm_config=[1]"]) == 2
    err = capsys.readouterr().err
    assert "'infer_backend: sglang' is not supported" in err
    assert "'vllm_maxlen: 2048' applies only with 'infer_backend: vllm'" in err
    assert "'vllm_gpu_util' (1.5) must be between 0 and 1" in err
    assert "'vllm_config' must be a mapping of vLLM engine arguments, not list" in err


def test_a_missing_target_is_one_message(tmp_path, capsys):
    assert run(["api", str(tmp_path / "nothing.yaml")]) == 2
    assert "is neither a config file, an exported model folder, nor a registered model" in capsys.readouterr().err


@pytest.mark.parametrize(("variable", "value", "says"), [("API_PORT", "99999", "is not a port number"),
                                                        ("MAX_CONCURRENT", "0", "must be a positive whole number")])
def test_bad_server_settings_are_refused_before_the_model_loads(tiny_model_dir, monkeypatch, capsys, variable, value,
                                                                says):
    monkeypatch.setenv(variable, value)
    assert run(["api", str(tiny_model_dir), "template=chatml"]) == 2
    assert f"{variable}='{value}' {says}" in capsys.readouterr().err


def test_the_vllm_keys_become_vllm_serve_flags(monkeypatch):
    from tuneline.serving.server import vllm_command

    serving, rest, problems = split_serving_keys({"infer_backend": "vllm", "vllm_maxlen": 2048, "vllm_gpu_util": 0.9,
                                                  "vllm_enforce_eager": True,
                                                  "vllm_config": '{"max_num_seqs": 8, "enforce_eager": false}',
                                                  "template": "llama3"})
    assert problems == [] and rest == {"template": "llama3"}
    monkeypatch.setenv("API_KEY", "sk-1")
    served = ServedTarget("export", "/models/merged", serving, rest, "merged")
    assert vllm_command(served, "127.0.0.1", 8000) == [
        "vllm", "serve", "/models/merged", "--host", "127.0.0.1", "--port", "8000", "--served-model-name", "merged",
        "--max-model-len", "2048", "--gpu-memory-utilization", "0.9", "--max-num-seqs", "8", "--api-key", "sk-1"], \
        "vllm_config wins over the key it repeats (enforce_eager)"
    assert ServingArgs().infer_backend == "huggingface"
