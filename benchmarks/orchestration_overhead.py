"""What the flow costs on top of training, and how fast a fully cached re-run is.

    .venv/bin/python benchmarks/orchestration_overhead.py [--steps 200]

Runs the same SFT LoRA training (a) through the bare entry point `python -m tuneline.train` and (b) through
`tuneline train` (the Prefect flow on the ephemeral API, with evaluation, plots and model card), then (c) the
same flow command again, which must be a full cache hit. Prints the three wall times and the flow's extra
share. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def timed(cmd: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tuneline-bench-"))
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_HOME": str(root / "prefect")}
    model = root / "tiny"
    subprocess.run([BIN / "tuneline", "tiny-model", str(model), "--preset", "demo"], check=True, env=env)
    config = yaml.safe_load((REPO / "examples" / "sft_lora_demo.yaml").read_text())
    config.update(model_name_or_path=str(model), max_steps=args.steps, pipeline_cache_dir=str(root / "cache"),
                  mlflow_tracking_uri=f"sqlite:///{root / 'mlflow.db'}", mlflow_registered_model=None)

    bare = dict(config, output_dir=str(root / "bare"))
    (root / "bare.yaml").write_text(yaml.safe_dump(bare))
    subprocess.run([BIN / "python", "-c", "from tuneline.config import load_config; from tuneline.data import "
                    f"build_dataset; build_dataset(load_config('{root / 'bare.yaml'}'))"], check=True, env=env,
                   cwd=REPO)  # tokenize once so both timings start from a warm dataset cache
    t_bare = timed([str(BIN / "python"), "-m", "tuneline.train", str(root / "bare.yaml")], env)

    flow = dict(config, output_dir=str(root / "flow"))
    (root / "flow.yaml").write_text(yaml.safe_dump(flow))
    t_flow = timed([str(BIN / "tuneline"), "train", str(root / "flow.yaml")], env)
    t_cached = timed([str(BIN / "tuneline"), "train", str(root / "flow.yaml")], env)

    print(f"training steps:                 {args.steps}")
    print(f"bare entry point:               {t_bare:8.1f} s")
    print(f"flow (7 steps, ephemeral API):  {t_flow:8.1f} s   extra {t_flow - t_bare:+.1f} s "
          f"({100 * (t_flow - t_bare) / t_bare:+.1f}%; includes base+tuned evaluation, plots, card)")
    print(f"flow again, fully cached:       {t_cached:8.1f} s")


if __name__ == "__main__":
    main()
