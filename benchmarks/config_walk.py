"""The walk of a run's config from the train task to the training's launch, counted at run time: every call of a
function of ours (tuneline/, tasks/, flows/, orchestration/) that receives the config or one of its groups
(model, data, finetuning, generating, pipeline, grpo, the training keys), between the task's cache key and the
launch command being ready. A measure of how far a change to the config's shape reaches.

    python benchmarks/config_walk.py [--config examples/sft_lora_demo.yaml] [--show]

The steps before `train` (tokenizer, dataset, reference) run first, untraced, on a tiny model built here; the
train task's two halves are then called as the task calls them: its cache key (Prefect's `cache_key_fn`, with the
finished-training check) and its body up to `run_streaming`, which is not run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OURS = tuple(str(REPO / name) + "/" for name in ("tuneline", "tasks", "flows", "orchestration"))


class Walk:
    """A profile hook counting calls of our functions that receive the config or one of its groups."""

    def __init__(self, config):
        self.targets = {id(config): "config", id(config.training): "training"}
        for name in ("model", "data", "finetuning", "generating", "pipeline", "grpo"):
            self.targets[id(getattr(config, name))] = name
        self.calls: Counter[tuple[str, str]] = Counter()

    def __call__(self, frame, event, arg):
        if event != "call" or not frame.f_code.co_filename.startswith(OURS):
            return
        code = frame.f_code
        count = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 4) + bool(code.co_flags & 8)
        values = [frame.f_locals.get(name) for name in code.co_varnames[:count]]
        values += [v for value in values if isinstance(value, (tuple, dict)) for v in
                   (value.values() if isinstance(value, dict) else value)]  # *args, **kwargs
        if any(id(value) in self.targets for value in values):
            module = str(Path(code.co_filename).relative_to(REPO))
            self.calls[(module, code.co_qualname)] += 1


def prepared_steps(config_path: str, work: Path):
    """The config, and the records the steps before `train` hand it (built for real, untraced)."""
    from tuneline.config import load_config
    from tuneline.content.records import BuiltDataset, ReferenceLogps
    from tuneline.data import build_dataset
    from tuneline.demo.tiny_model import build_tiny_model
    from tuneline.pipeline.records import MlflowRun
    from tuneline.reference import build_reference_logps

    model = build_tiny_model(work / "model")
    config = load_config(config_path, [f"model_name_or_path={model}", f"output_dir={work / 'out'}",
                                       f"pipeline_cache_dir={work / 'cache'}", "report_to=none",
                                       f"mlflow_tracking_uri=sqlite:///{work / 'mlflow.db'}"])
    dataset = BuiltDataset.from_stored(build_dataset(config))
    reference = ReferenceLogps.from_stored(build_reference_logps(config, dataset))
    return config, dataset, reference, MlflowRun("walk-run", f"sqlite:///{work / 'mlflow.db'}")


def walk_to_launch(config, dataset, reference, run) -> Walk:
    from tasks.train import _train_key, train
    from tuneline.pipeline.train_step import prepare_training

    walk = Walk(config)
    parameters = {"config": config, "dataset": dataset, "reference": reference, "run": run}
    sys.setprofile(walk)
    try:
        train.cache_key_fn(None, parameters)  # what Prefect calls first (no record: the key stands)
        launch = prepare_training(config, dataset, reference, _train_key(config, dataset, reference, run),
                                  run.run_id, run.tracking_uri, on_line=lambda line: None)
    finally:
        sys.setprofile(None)
    launch.release()
    assert launch.command, "the launch command was prepared"
    return walk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "examples" / "sft_lora_demo.yaml"))
    parser.add_argument("--show", action="store_true", help="list each function with its calls")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="config-walk-") as tmp:
        walk = walk_to_launch(*prepared_steps(args.config, Path(tmp)))
    for what, calls in (("", walk.calls), (" less the config's own methods", {
            (module, name): n for (module, name), n in walk.calls.items() if not name.startswith("RunConfig.")})):
        print(f"config walk, train task to launch ({Path(args.config).name}){what}: {sum(calls.values())} calls, "
              f"{len(calls)} functions, {len({module for module, _ in calls})} modules")
    if args.show:
        for (module, name), n in sorted(walk.calls.items()):
            print(f"  {n:3d}  {module}:{name}")


if __name__ == "__main__":
    main()
