"""FSDP under Ray, from LLaMA-Factory's own accelerate configs (examples/accelerate/fsdp_config*.yaml).

FSDP trains on GPUs only (tuneline.runtime.fsdp_setup says why), and this machine has none: on CPU an FSDP config is
refused before start, on Ray as under accelerate. The GPU path is checked as far as it goes without a GPU: the
launch each Ray worker runs gives its training process the environment `accelerate launch` gives it without Ray,
FSDP plugin settings and all. accelerate prepares that environment without touching a GPU, so both launches run
here as a GPU worker would run them, with a probe (tests/support/env_probe.py) in place of the training child: the
two workers' launches (machines 0 and 1 of 2 meeting on a local port, as a local Ray's workers do) against
`accelerate launch --config_file F --num_processes 2` on one machine. No Ray starts here: which launch a worker runs
is what is under test, and tests/e2e/test_ray_train.py runs it on Ray.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.ports import free_port
from tests.support.training import REPO_ROOT, make_config, write_config

EXAMPLES = REPO_ROOT / "tests" / "fixtures" / "llamafactory" / "0.9.5" / "examples" / "accelerate"
FSDP_CONFIG, MULTIPLE_NODES = EXAMPLES / "fsdp_config.yaml", EXAMPLES / "fsdp_config_multiple_nodes.yaml"
# What differs between one launch of 2 processes and 2 launches of one: torch's elastic agent's own bookkeeping
RENDEZVOUS = {"GROUP_RANK", "GROUP_WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT",
              "TORCHELASTIC_ERROR_FILE"}
PROBE = ["-m", "tests.support.env_probe"]


def environments(folder: Path) -> dict[str, dict[str, str]]:
    return {path.stem: json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))}


def test_a_gpu_workers_launch_gives_the_child_accelerates_fsdp_environment(tiny_model_dir, tmp_path):
    from tuneline.pipeline.launch import launcher
    from tuneline.pipeline.ray_launch import worker_launcher

    alone = make_config(tiny_model_dir, tmp_path / "out", accelerate_config=str(FSDP_CONFIG), num_processes=2)
    own_port = ["--main_process_port", str(free_port())]  # not accelerate's 29500, which another test may hold
    launches = {"accelerate": [[*launcher(alone, use_cpu=False), *own_port, *PROBE, str(tmp_path / "accelerate")]]}
    for example in (FSDP_CONFIG, MULTIPLE_NODES):  # the second names 2 machines at 192.168.0.1: the workers replace it
        on_ray = make_config(tiny_model_dir, tmp_path / "out", accelerate_config=str(example), ray_num_workers=2)
        port = free_port()
        launches[example.stem] = [[*worker_launcher(on_ray, False, rank, 2, "127.0.0.1", port), *PROBE,
                                   str(tmp_path / example.stem)] for rank in (0, 1)]
    for name in launches:
        (tmp_path / name).mkdir()
    started = [subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for cmds in launches.values() for cmd in cmds]
    for proc in started:
        output, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, output[-3000:]

    expected, got = environments(tmp_path / "accelerate"), environments(tmp_path / FSDP_CONFIG.stem)
    assert sorted(expected) == sorted(got) == ["0", "1"]
    for rank in expected:
        keys = set(expected[rank]) | set(got[rank])
        assert {k for k in keys if expected[rank].get(k) != got[rank].get(k)} <= RENDEZVOUS, rank
        assert got[rank]["RANK"] == rank and got[rank]["WORLD_SIZE"] == "2"
    fsdp = got["0"]  # the example's settings reached the child, as accelerate's FSDP plugin reads them
    assert (fsdp["ACCELERATE_USE_FSDP"], fsdp["FSDP_OFFLOAD_PARAMS"], fsdp["FSDP_SHARDING_STRATEGY"]) == \
        ("true", "true", "FULL_SHARD")
    assert fsdp["ACCELERATE_MIXED_PRECISION"] == "bf16" and "ACCELERATE_USE_CPU" not in fsdp
    nodes = environments(tmp_path / MULTIPLE_NODES.stem)  # met on this machine, not at the example's address
    assert sorted(nodes) == ["0", "1"] and nodes["1"]["WORLD_SIZE"] == "2" and nodes["0"]["MASTER_ADDR"] == "127.0.0.1"
    assert (nodes["0"]["ACCELERATE_USE_FSDP"], nodes["0"]["FSDP_OFFLOAD_PARAMS"]) == ("true", "false")


def test_fsdp_on_cpu_is_refused_before_start_on_ray_and_under_accelerate(tiny_model_dir, tmp_path):
    """`tuneline train` on this machine (no GPU): exit 2 and one message naming the key, before anything starts."""
    env = {**{k: v for k, v in os.environ.items() if k not in ("USE_RAY", "RAY_ADDRESS")}, "CUDA_VISIBLE_DEVICES": ""}
    for name, keys in (("ray", {"ray_num_workers": 2}), ("accelerate", {"num_processes": 2}),
                       ("fsdp-key", {"ray_num_workers": 2, "fsdp": "full_shard"})):
        accelerate_config = {} if "fsdp" in keys else {"accelerate_config": str(FSDP_CONFIG)}
        config = write_config(tmp_path / f"{name}.yaml", tiny_model_dir, tmp_path / name, **keys, **accelerate_config)
        out = subprocess.run([sys.executable, "-m", "cli.main", "train", str(config)], capture_output=True, text=True,
                             env=env, timeout=120, cwd=REPO_ROOT)
        said = out.stderr
        assert out.returncode == 2 and "Traceback" not in said, said
        source = "'fsdp: full_shard'" if "fsdp" in keys else f"'accelerate_config: {FSDP_CONFIG}' (distributed_type: FSDP)"
        assert f"{source} shards the model with FSDP, which accelerate sets up across GPUs only" in said, said
        assert "ds_z3_config.json" in said and not (tmp_path / name).exists()


def test_on_a_cluster_whose_workers_get_gpus_fsdp_is_not_refused():
    from tuneline.pipeline.ray_launch import workers_use_gpus
    from tuneline.runtime.requirements import missing_requirements

    hub, shared = Path("org/model"), Path("/shared/out")  # what every machine of the cluster reaches
    keys = {"accelerate_config": str(FSDP_CONFIG), "ray_address": "10.0.0.5:6379", "pipeline_cache_dir": "/shared/cache"}
    on_gpus = make_config(hub, shared, **keys, resources_per_worker={"GPU": 1})
    assert workers_use_gpus(on_gpus) and not any("FSDP" in p for p in missing_requirements(on_gpus, cuda=True))
    on_cpus = make_config(hub, shared, **keys)  # Ray's default: a CPU a worker
    assert not workers_use_gpus(on_cpus)
    assert any("FSDP" in p for p in missing_requirements(on_cpus, cuda=workers_use_gpus(on_cpus)))

