"""DeepSpeed on CPU: LLaMA-Factory's own ds_z2/ds_z3 configs train the tiny model through the command users get
(`accelerate launch --use_deepspeed ... -m tuneline.train`), on one and two processes, along the loss curve of a
plain run of the same config; and a DeepSpeed that cannot run is refused before anything starts.

The DeepSpeed runs compare with the plain one within LOSS_TOLERANCE and WEIGHT_TOLERANCE. Both are fp32 and see the
same global batches (2 processes x 2 rows against 1 x 4), so they differ only by the order floating-point sums are
taken in (gradients reduced across processes, flattened into ZeRO's partitions): measured up to 2e-6 relative on
the losses and 3e-5 on the weights after four steps. Half or twice the global batch, or twice the learning rate,
moves the step-2 loss by about 7% (measured), and a parameter that ZeRO failed to update, or to gather back on
save, is off by about the learning rate (5e-3) after Adam's first step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.training import REPO_ROOT, config_values, make_config, step_losses, write_config

LOSS_TOLERANCE = 1e-4  # relative
WEIGHT_TOLERANCE = 1e-3  # absolute, a fifth of the learning rate
SETTINGS = {"finetuning_type": "full", "max_steps": 4, "save_steps": 4, "per_device_train_batch_size": 4,
            "max_samples": 16, "cutoff_len": 64, "learning_rate": 5e-3, "lr_scheduler_type": "constant"}
DS_CONFIGS = REPO_ROOT / "examples" / "deepspeed"
RUNS = [("ds_z2_config.json", 1), ("ds_z2_config.json", 2), ("ds_z3_config.json", 1), ("ds_z3_config.json", 2)]


def launch(root: Path, model_dir: Path, dataset: str, name: str, **overrides) -> Path | Exception:
    """Train through the launcher's own command; the output_dir, or the TrainingFailed it raised."""
    from tuneline.config import load_config
    from tuneline.pipeline.launch import TrainingFailed, launch_command, run_streaming

    out = root / name
    config = write_config(root / f"{name}.yaml", model_dir, out, **{**SETTINGS, **overrides})
    try:
        run_streaming(launch_command(load_config(config, check_paths=False), config, dataset), None, lambda _: None)
    except TrainingFailed as failed:
        return failed
    return out


@pytest.fixture(scope="module")
def trained(tiny_model_dir, tmp_path_factory) -> dict:
    """The plain run and the four DeepSpeed runs, started side by side (each launch is mostly one process
    importing its libraries; two cores finish them together sooner): name -> output_dir or TrainingFailed."""
    from concurrent.futures import ThreadPoolExecutor

    from tuneline.data import build_dataset

    root = tmp_path_factory.mktemp("deepspeed")
    dataset = root / "dataset.json"
    dataset.write_text(json.dumps(build_dataset(make_config(tiny_model_dir, root / "unused", **SETTINGS))))
    runs = {"plain": {}}
    for ds_config, processes in RUNS:
        runs[f"{ds_config}-{processes}"] = {"deepspeed": str(DS_CONFIGS / ds_config), "num_processes": processes,
                                            "per_device_train_batch_size": 4 // processes}
    with ThreadPoolExecutor(len(runs)) as pool:
        started = {name: pool.submit(launch, root, tiny_model_dir, str(dataset), name.replace(".json", ""), **keys)
                   for name, keys in runs.items()}
    return {name: future.result() for name, future in started.items()}


@pytest.mark.parametrize(("ds_config", "processes"), RUNS)
def test_zero_follows_the_plain_loss_curve(ds_config, processes, trained):
    from safetensors.torch import load_file

    from tuneline.runtime.contract import read_run_file

    plain_run, out = trained["plain"], trained[f"{ds_config}-{processes}"]
    for run in (plain_run, out):
        assert isinstance(run, Path), str(run)
    # DeepSpeed's engine saved the checkpoint: its own layout, one optimizer shard per process
    shards = sorted(p.name for p in (out / "checkpoint-4" / "global_step4").glob("*optim_states.pt"))
    assert len(shards) == processes, shards
    plain, ds = step_losses(plain_run), step_losses(out)
    assert sorted(ds) == sorted(plain) == [1, 2, 3, 4]
    for step in plain:
        assert ds[step] == pytest.approx(plain[step], rel=LOSS_TOLERANCE), step
    assert len(set(plain.values())) == 4  # the weights moved between steps, so later steps compare training
    expected, got = load_file(str(plain_run / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert expected.keys() == got.keys()  # ZeRO-3 gathered its partitions back into whole tensors
    for name, tensor in expected.items():
        assert got[name].shape == tensor.shape and (got[name] - tensor).abs().max().item() <= WEIGHT_TOLERANCE, name
    assert read_run_file(out)["status"] == "complete"


def test_the_launch_command_starts_deepspeed_for_cpu_and_gpus(tiny_model_dir, tmp_path, monkeypatch):
    """accelerate's DeepSpeed launcher, also for one process (it sets the rank variables DeepSpeed reads); on CPU
    without ACCELERATE_USE_CPU, which makes accelerate drop DeepSpeed. The GPUs are counted from
    CUDA_VISIBLE_DEVICES: no GPU exists here, so the GPU command is checked, not run."""
    from tuneline.pipeline.launch import launch_command

    ds = str(DS_CONFIGS / "ds_z3_config.json")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    for processes in (1, 2):
        cmd = launch_command(make_config(tiny_model_dir, tmp_path, deepspeed=ds, num_processes=processes), "c.yaml")
        assert cmd[:4] == ["env", "-u", "ACCELERATE_USE_CPU", "DS_ACCELERATOR=cpu"]
        assert "--use_deepspeed" in cmd and "--multi_gpu" not in cmd
        assert cmd[cmd.index("--num_processes") + 1] == str(processes)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    cmd = launch_command(make_config(tiny_model_dir, tmp_path, deepspeed=ds), "c.yaml")
    assert cmd[0] != "env" and "--use_deepspeed" in cmd and "--multi_gpu" not in cmd
    assert cmd[cmd.index("--num_processes") + 1] == "2"


@pytest.mark.parametrize("name", ["ds_z0_config.json", "ds_z2_config.json", "ds_z2_offload_config.json",
                                  "ds_z3_config.json", "ds_z3_offload_config.json"])
def test_llamafactorys_deepspeed_configs_pass_the_checks(name):
    from tuneline.runtime.deepspeed_setup import deepspeed_problems

    assert deepspeed_problems(str(DS_CONFIGS / name)) == []


@pytest.mark.parametrize(("content", "expected"), [
    (None, "names a file that does not exist"),
    ("{'stage': 2}", "is not a readable JSON file"),
    ("[2]", "must hold a JSON object of DeepSpeed settings, not list"),
    ('{"zero_optimization": {"stage": 4}}', "has ZeRO 'stage: 4'; DeepSpeed runs stage 0, 1, 2 or 3"),
    ('{"zero_optimization": {"stage": 3, "offload_param": {"device": "gpu"}}}',
     "has 'offload_param: {'device': 'gpu'}'; it must be an object whose 'device' is one of none, cpu, nvme"),
])
def test_a_ds_config_that_cannot_run_is_a_config_error(tiny_model_dir, tmp_path, content, expected):
    from tuneline.errors import ConfigError
    from tuneline.pipeline.preflight import checked_config

    path = tmp_path / "ds.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as err:
        checked_config(None, {**config_values(tiny_model_dir, tmp_path / "out"), "deepspeed": str(path)})
    assert f"'deepspeed: {path}' {expected}" in str(err.value)


def test_deepspeed_missing_is_a_config_error(tiny_model_dir, tmp_path, monkeypatch):
    """A None in sys.modules is Python's own way of making a package unimportable (find_spec answers None)."""
    from tuneline.errors import ConfigError
    from tuneline.pipeline.preflight import checked_config

    ds = str(DS_CONFIGS / "ds_z2_config.json")
    monkeypatch.setitem(sys.modules, "deepspeed", None)
    with pytest.raises(ConfigError) as err:
        checked_config(None, {**config_values(tiny_model_dir, tmp_path / "out"), "deepspeed": ds})
    assert f"'deepspeed: {ds}' needs the deepspeed package, which is not installed" in str(err.value)


def test_a_deepspeed_that_cannot_start_ends_the_command_with_one_message(tiny_model_dir, tmp_path):
    """An accelerator DeepSpeed cannot set up here (it asks for torch_npu, not installed): `tuneline train` stops
    with exit code 2 and one message naming the key and file, before Prefect or any process starts."""
    config = write_config(tmp_path / "c.yaml", tiny_model_dir, tmp_path / "out",
                          deepspeed=str(DS_CONFIGS / "ds_z2_config.json"))
    env = {**os.environ, "DS_ACCELERATOR": "npu", "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-m", "cli.main", "train", str(config)], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert f"'deepspeed: {DS_CONFIGS / 'ds_z2_config.json'}' needs DeepSpeed to set up its accelerator, and it " \
           "cannot here: ValueError:" in out.stderr, out.stderr
    assert "prefect" not in out.stderr.lower() and not (tmp_path / "out").exists()
