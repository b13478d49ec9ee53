"""Parameter sweeps: one finetune subflow per point, up to `max_parallel` at once, compared in MLflow.

    tuneline sweep examples/dpo_lora_demo.yaml --grid learning_rate=1e-4,5e-5 pref_beta=0.1,0.3 --max-parallel 2

Every point's config is checked before anything starts. The steps the points share (tokenizer, dataset, reference
log-probs, the base model's evaluation) run first, once per distinct input, so every point finds them cached and
no two points build the same folder at once. With `max_parallel` above one, trainings also wait for the `gpu` tag's
concurrency limit (created with one slot when missing, orchestration/concurrency.py): `max_parallel` bounds the points in
flight, the limit how many of them train at the same time. MLflow holds a parent run with one child per point,
the comparison table and the best child's tag.
"""

from __future__ import annotations

from prefect import flow, runtime, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.task_runners import ThreadPoolTaskRunner

from flows.finetune import _cache_options, _flow_run_url, finetune
from orchestration.concurrency import ensure_gpu_limit
from tasks import build_dataset, build_reference_model, evaluate, load_tokenizer
from tuneline.content.records import BuiltDataset, TokenizerInfo
from tuneline.pipeline import sweep_record
from tuneline.pipeline.preflight import checked_config
from tuneline.pipeline.sweep_grid import SweepPoint, plan_sweep, shared_steps_key, shares_reward_model_steps


@task(name="sweep-point", task_run_name="point {label}", cache_policy=NO_CACHE)
def run_point(config_path: str, overrides: list[str], label: str, parent_run_id: str) -> dict:
    """One point: the finetune flow as a subflow (its steps cached as ever), its MLflow run nested in the sweep's."""
    return finetune(config_path, overrides=overrides, mlflow_parent_run_id=parent_run_id)


def _prepare_shared_steps(points: list[SweepPoint]) -> None:
    seen = set()
    for point in points:
        key = shared_steps_key(point.config)
        if key in seen:
            continue
        seen.add(key)
        config, cache = point.config, _cache_options(point.config)
        tokenizer = TokenizerInfo.from_stored(load_tokenizer.with_options(**cache)(config))
        dataset = BuiltDataset.from_stored(build_dataset.with_options(**cache)(config, tokenizer))
        if shares_reward_model_steps(config):
            build_reference_model.with_options(**cache)(config, dataset)
            evaluate.with_options(task_run_name="evaluate base", **cache)(config, dataset)


def _run_points(config_path: str, points: list[SweepPoint], parent_run_id: str, max_parallel: int) -> list[dict]:
    """Each point's finetune result, or {"error": why} for a point that failed (the others still run)."""
    with ThreadPoolTaskRunner(max_workers=max_parallel) as runner:
        futures = [runner.submit(run_point, {"config_path": config_path, "overrides": p.overrides, "label": p.label,
                                             "parent_run_id": parent_run_id}) for p in points]
        for future in futures:
            future.wait()
    return [future.result() if future.state.is_completed() else {"error": future.state.message or "failed"}
            for future in futures]


@flow(name="sweep", flow_run_name="sweep {config_path}")
def sweep(config_path: str, grid: dict[str, list | str], samples: int | None = None, max_parallel: int = 1,
          metric: str = "eval_loss", greater_is_better: bool = False, seed: int = 0,
          overrides: list[str] | None = None) -> dict:
    points = plan_sweep(config_path, grid, samples, seed, overrides, metric, max_parallel)
    base = checked_config(config_path, overrides or [])
    settings = {"grid": dict(grid), "samples": samples, "seed": seed, "metric": metric,
                "greater_is_better": greater_is_better, "max_parallel": max_parallel}
    parent = sweep_record.start_sweep_run(base, points, settings, runtime.flow_run.id, _flow_run_url())

    _prepare_shared_steps(points)
    if max_parallel > 1:
        ensure_gpu_limit()
    outcomes = _run_points(config_path, points, parent.run_id, max_parallel)

    rows = sweep_record.comparison_rows(points, outcomes, parent.tracking_uri)
    children = [o["mlflow_run_id"] for o in outcomes if o.get("mlflow_run_id")]
    best = sweep_record.record_sweep(parent, children, rows, metric, greater_is_better)
    create_table_artifact(rows, key="sweep-comparison",
                          description=f"sweep points vs final metrics; best by {metric}: {best.get('point')}")
    failed = [f"{row['point']}: {row['failed']}" for row in rows if row.get("failed")]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(rows)} sweep points failed (the others are in MLflow run "
                           f"{parent.run_id}; the same sweep again retries them):\n" + "\n".join(failed))
    return {"mlflow_run_id": parent.run_id, "url": parent.url, "best_run_id": best.get("run_id"),
            "best_point": best.get("point"), "rows": rows,
            "table": sweep_record.markdown_table(rows, best or None)}
