"""Several machines: the `accelerate launch` flags the launcher builds, what accelerate makes of them, and the configs
refused before anything runs. The two-machine training itself: tests/integration/train/test_multinode.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tuneline.config import load_config
from tuneline.errors import ConfigError, UserError

REPO = Path(__file__).resolve().parents[2]
MACHINES = {"num_machines": 2, "main_process_ip": "10.0.0.5"}


def config(tmp_path: Path, **overrides):
    values = {"model_name_or_path": str(tmp_path / "model"), "dataset": "demo_sft", "dataset_dir": str(REPO / "data"),
              "output_dir": str(tmp_path / "out"), "pipeline_cache_dir": str(tmp_path / "cache"), **overrides}
    return load_config(None, values, check_paths=False)


def flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def accelerate_env(cmd: list[str]) -> dict[str, str]:
    """What accelerate's own launcher makes of the flags: the torchrun settings of one machine."""
    from accelerate.commands.launch import launch_command_parser
    from accelerate.utils import prepare_multi_gpu_env

    args = launch_command_parser().parse_args([*cmd[cmd.index("launch") + 1:], "-m", "tuneline.train", "c.yaml"])
    prepare_multi_gpu_env(args)  # sets torchrun's settings on args
    return {"nproc_per_node": args.nproc_per_node, "nnodes": args.nnodes, "node_rank": args.node_rank,
            "rdzv_endpoint": args.rdzv_endpoint}


def test_cpu_machines_each_start_their_processes_and_meet_at_the_main_one(tmp_path, monkeypatch):
    from tuneline.pipeline.launch import launcher

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    cmd = launcher(config(tmp_path, **MACHINES, num_processes=1, machine_rank=1))
    assert cmd[:2] == ["env", "ACCELERATE_USE_CPU=true"] and "--multi_gpu" in cmd  # gloo across the machines
    assert flag(cmd, "--num_machines") == "2" and flag(cmd, "--machine_rank") == "1"
    assert flag(cmd, "--main_process_ip") == "10.0.0.5" and flag(cmd, "--main_process_port") == "29500"
    assert flag(cmd, "--num_processes") == "2"  # accelerate counts every machine's processes
    assert flag(cmd, "--num_cpu_threads_per_process") == "3"
    assert accelerate_env(cmd) == {"nproc_per_node": "1", "nnodes": "2", "node_rank": 1,
                                   "rdzv_endpoint": "10.0.0.5:29500"}


def test_gpu_machines_run_num_processes_each(tmp_path, monkeypatch):
    """On 2-GPU machines (CUDA_VISIBLE_DEVICES names two; torch is not asked): one process per GPU on each."""
    from tuneline.pipeline.launch import launcher

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    cmd = launcher(config(tmp_path, **MACHINES, main_process_port=6000, machine_rank=1))
    assert "env" not in cmd and "--multi_gpu" in cmd and flag(cmd, "--num_processes") == "4"
    assert accelerate_env(cmd)["nproc_per_node"] == "2" and accelerate_env(cmd)["rdzv_endpoint"] == "10.0.0.5:6000"
    alone = launcher(config(tmp_path))
    assert flag(alone, "--num_machines") == "1" and "--machine_rank" not in alone and "--main_process_ip" not in alone


def test_accelerate_config_and_deepspeed_take_the_machines_too(tmp_path, monkeypatch):
    from tuneline.pipeline.launch import launcher

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    fsdp = str(REPO / "examples/accelerate/fsdp_config.yaml")
    cmd = launcher(config(tmp_path, **MACHINES, accelerate_config=fsdp, machine_rank=1))
    assert flag(cmd, "--config_file") == fsdp and flag(cmd, "--num_machines") == "2"
    assert flag(cmd, "--machine_rank") == "1" and flag(cmd, "--main_process_ip") == "10.0.0.5"
    assert "--num_processes" not in cmd  # the file's own count stands
    deepspeed = str(REPO / "examples/deepspeed/ds_z2_config.json")
    assert json.loads(Path(deepspeed).read_text())["zero_optimization"]["stage"] == 2
    ds = launcher(config(tmp_path, **MACHINES, deepspeed=deepspeed, machine_rank=1))
    assert "--use_deepspeed" in ds and flag(ds, "--num_processes") == "4"
    # each machine runs its own launch (torchrun), not pdsh over ssh from the main one; on the agreed port
    assert flag(ds, "--deepspeed_multinode_launcher") == "standard" and flag(ds, "--main_process_port") == "29500"
    alone = launcher(config(tmp_path, deepspeed=deepspeed))
    assert flag(alone, "--main_process_port") == "0"  # one machine: a free port, so trainings side by side coexist
    assert flag(launcher(config(tmp_path, accelerate_config=fsdp)), "--main_process_port") == "0"  # with a file too
    pinned = tmp_path / "pinned.yaml"
    pinned.write_text(Path(fsdp).read_text() + "main_process_port: 29555\n")
    assert "--main_process_port" not in launcher(config(tmp_path, accelerate_config=str(pinned)))  # the file's stands


@pytest.mark.parametrize(("overrides", "message"), [
    ({"num_machines": 2}, "'num_machines: 2' needs 'main_process_ip'"),
    ({**MACHINES, "machine_rank": 2}, "'machine_rank: 2' is not below 'num_machines: 2'"),
    ({**MACHINES, "main_process_port": 0}, "'main_process_port: 0' is not a port every machine can meet on"),
    ({"main_process_ip": "10.0.0.5"}, "'main_process_ip: 10.0.0.5' has no effect in this run: it applies only with "
                                      "'num_machines' above 1"),
    ({"machine_rank": 1}, "'machine_rank: 1' has no effect in this run"),
    ({"num_machines": 0}, "'num_machines' is 0; it must be at least 1"),
])
def test_inconsistent_machines_are_refused(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config(tmp_path, **overrides)


def test_an_accelerate_config_naming_several_machines_needs_the_keys(tmp_path):
    file = tmp_path / "multi.yaml"
    file.write_text(yaml.safe_dump({"distributed_type": "MULTI_GPU", "num_machines": 2, "machine_rank": 0,
                                    "main_process_ip": "10.0.0.5", "num_processes": 4}))
    with pytest.raises(ConfigError, match="names num_machines: 2; set 'num_machines', 'main_process_ip'"):
        config(tmp_path, accelerate_config=str(file))
    assert config(tmp_path, accelerate_config=str(file), **MACHINES).pipeline.num_machines == 2


def test_only_the_main_machine_runs_the_flow_and_train_node_only_the_others(tmp_path):
    from tuneline.pipeline.launch import launch_command
    from tuneline.pipeline.node import train_on_node

    with pytest.raises(UserError, match="runs on the main machine only .*`tuneline train-node CONFIG --machine-rank N`"):
        launch_command(config(tmp_path, **MACHINES, machine_rank=1), tmp_path / "c.yaml")
    cmd = launch_command(config(tmp_path, **MACHINES, machine_rank=1), tmp_path / "c.yaml", other_machine=True)
    assert cmd[-2:] == ["tuneline.train", str(tmp_path / "c.yaml")]
    for overrides in ({**MACHINES}, {}):  # rank 0 is the flow's; one machine has no other
        with pytest.raises(UserError, match="`train-node` starts a machine other than the main one"):
            train_on_node(config(tmp_path, **overrides), timeout_s=1)


def test_a_node_waits_for_the_main_machines_dataset_then_says_what_is_missing(tmp_path):
    from tuneline.pipeline.node import DATASET_STEP, training_inputs, wait_for_inputs

    cfg = config(tmp_path, **MACHINES, machine_rank=1)
    inputs = training_inputs(cfg)
    folder, key = inputs[DATASET_STEP]
    assert folder == tmp_path / "cache" / DATASET_STEP / key and list(inputs) == [DATASET_STEP]  # sft: no reference
    lines: list[str] = []
    with pytest.raises(UserError, match=r"waited 0s for the main machine's flow to build 'build-dataset' in .*"
                                        r"start `tuneline train CONFIG` on the main machine"):
        wait_for_inputs(inputs, 0.0, lines.append)
    folder.mkdir(parents=True)
    (folder / "COMPLETE").write_text(json.dumps({"fingerprint": "another key"}))
    with pytest.raises(UserError):  # an entry of other inputs is not this run's
        wait_for_inputs(inputs, 0.0, lines.append)
    (folder / "COMPLETE").write_text(json.dumps({"fingerprint": key}))
    wait_for_inputs(inputs, 0.0, lines.append)


def test_train_node_errors_reach_the_command_line_as_one_message(tmp_path, capsys):
    from cli.main import run

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"model_name_or_path": str(REPO / "no-such-model"), "dataset": "demo_sft"}))
    assert run(["train-node", str(cfg), "num_machines=2", "--machine-rank", "1"]) != 0
    err = capsys.readouterr().err
    assert "'num_machines: 2' needs 'main_process_ip'" in err and "Traceback" not in err


def test_every_machine_computes_the_main_ones_keys_and_joins_no_finished_training(tmp_path, tiny_model_dir):
    """Rank, address and port name no other training: a node finds the main machine's entries and its marker."""
    from tuneline.identity import keys
    from tuneline.pipeline.node import DATASET_STEP, train_on_node, training_inputs
    from tuneline.runtime.contract import RUN_FILE

    main = config(tmp_path, model_name_or_path=str(tiny_model_dir), **MACHINES)
    node = config(tmp_path, model_name_or_path=str(tiny_model_dir), **MACHINES, machine_rank=1, main_process_port=7000)
    assert keys.train_key(main, "data", "ref") == keys.train_key(node, "data", "ref")
    folder, dataset_fp = training_inputs(node)[DATASET_STEP]
    assert training_inputs(main)[DATASET_STEP] == (folder, dataset_fp)
    folder.mkdir(parents=True)
    (folder / "COMPLETE").write_text(json.dumps({"fingerprint": dataset_fp}))
    main.output_dir.mkdir()
    key = keys.train_key(main, dataset_fp, keys.reference_key(main, dataset_fp))
    (main.output_dir / RUN_FILE).write_text(json.dumps({"train_key": key, "status": "complete"}))
    lines: list[str] = []
    assert train_on_node(node, timeout_s=0, on_line=lines.append) is False
    assert lines == [f"the training of this config has finished already ({main.output_dir / RUN_FILE}); "
                     "nothing to join"]
