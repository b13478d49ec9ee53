"""A sweep's MLflow record: a parent run whose children are the points' runs, the comparison table, the best point.

The parent is keyed by the work, so the same sweep started again reopens the same parent and, cached, its children."""

from __future__ import annotations

import csv
import io
import json
import tempfile
from pathlib import Path
from typing import Any

from tuneline import tracking
from tuneline.config import RunConfig
from tuneline.content.fingerprint import fingerprint
from tuneline.evaluation.metric_names import TRAIN_METRICS
from tuneline.identity import keys
from tuneline.pipeline import record
from tuneline.pipeline.records import MlflowRun
from tuneline.pipeline.sweep_grid import SweepPoint

SWEEP_TAG = "tuneline.sweep"  # on the parent: the points' count
BEST_TAG = "tuneline.sweep_best"  # on each child: "true" on the best point, "false" on the others
BEST_RUN_TAG = "tuneline.sweep_best_run_id"  # on the parent
COMPARISON = "sweep_comparison"  # .md, .csv, .json on the parent
TABLE_METRICS = ("train_loss", "loss")  # besides every final_* metric: the mean and the last logged train loss


def decisive_column(metric: str) -> str:
    """The table column `--metric` names: the tuned model's evaluation (`final_<metric>`) or the trainer's."""
    return metric if metric in TRAIN_METRICS else f"final_{metric}"


def start_sweep_run(base: RunConfig, points: list[SweepPoint], settings: dict[str, Any], flow_run_id: str | None,
                    flow_run_url: str | None) -> MlflowRun:
    """Open (or reopen) the parent run in the config's experiment; `settings` (grid, samples, seed, metric) become
    its params."""
    uri = record.connect_tracking(base)
    point_runs = [keys.run_key(p.config, keys.dataset_key(p.config)) for p in points]
    point_works = [keys.work_key(p.config, key) for p, key in zip(points, point_runs, strict=True)]
    judged = (settings.get("metric"), settings.get("greater_is_better"))
    run_key, work_key = (fingerprint("sweep", sorted(found), *judged) for found in (point_runs, point_works))
    tags = {SWEEP_TAG: str(len(points)), **record.source_tags(record.git_commit()),
            "mlflow.source.name": "tuneline sweep flow"}
    run_id = tracking.open_run(uri, base.experiment_name, run_key, f"sweep {base.run_name}", tags,
                               reopen_finished=not base.pipeline.refresh_cache, work_key=work_key)
    if flow_run_id:
        tracking.tag_flow_run(run_id, flow_run_id, flow_run_url, tracking_uri=uri)
    tracking.log_params(run_id, {"sweep": settings, "config": base.source}, tracking_uri=uri)
    return MlflowRun(run_id=run_id, tracking_uri=uri, url=tracking.run_url(uri, run_id),
                     ui_command=tracking.ui_command(uri), run_key=run_key, work_key=work_key)


def comparison_rows(points: list[SweepPoint], outcomes: list[dict], uri: str) -> list[dict[str, Any]]:
    """One row per point: its values, its child run, every final_* metric and the train losses (from MLflow,
    the record users compare in); a failed point says why."""
    rows = []
    for point, outcome in zip(points, outcomes, strict=True):
        row: dict[str, Any] = {"point": point.label, **point.values}
        run_id = outcome.get("mlflow_run_id")
        if run_id:
            metrics = tracking.get_run_metrics(uri, run_id)
            row["run_id"] = run_id
            row.update({k: v for k, v in sorted(metrics.items()) if k.startswith("final_")})
            row.update({k: metrics[k] for k in TABLE_METRICS if k in metrics})
        else:
            row["run_id"] = None
            row["failed"] = outcome.get("error", "failed")
        rows.append(row)
    return rows


def best_row(rows: list[dict], metric: str, greater_is_better: bool) -> dict | None:
    """The row with the best value of the metric's column (the first on a tie); None when no row has one."""
    column = decisive_column(metric)
    scored = [row for row in rows if isinstance(row.get(column), (int, float))]
    if not scored:
        return None
    pick = max if greater_is_better else min
    return pick(scored, key=lambda row: row[column])


def _columns(rows: list[dict]) -> list[str]:
    columns: list[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]
    return columns


def _cell(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def markdown_table(rows: list[dict], best: dict | None = None) -> str:
    columns = _columns(rows)
    lines = ["| " + " | ".join(["", *columns]) + " |", "|" + "---|" * (len(columns) + 1)]
    for row in rows:
        mark = "best" if row is best else ""
        lines.append("| " + " | ".join([mark, *(_cell(row.get(c)).replace("|", "\\|") for c in columns)]) + " |")
    return "\n".join(lines) + "\n"


def csv_table(rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=_columns(rows))
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def record_sweep(parent: MlflowRun, children: list[str], rows: list[dict], metric: str, greater_is_better: bool) -> dict:
    """The comparison as files on the parent, the best child tagged (the others untagged, a rerun may have
    moved it) and named on the parent; the parent finished, FAILED when a point failed."""
    uri, run_id = parent.tracking_uri, parent.run_id
    best = best_row(rows, metric, greater_is_better)
    direction = "higher" if greater_is_better else "lower"
    heading = f"# Sweep: {len(rows)} points, by {decisive_column(metric)} ({direction} is better)\n\n"
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / COMPARISON
        folder.mkdir()
        (folder / f"{COMPARISON}.md").write_text(heading + markdown_table(rows, best), encoding="utf-8")
        (folder / f"{COMPARISON}.csv").write_text(csv_table(rows), encoding="utf-8")
        (folder / f"{COMPARISON}.json").write_text(json.dumps(rows, indent=2, default=str), encoding="utf-8")
        tracking.log_artifacts(run_id, folder, tracking_uri=uri)
    for child in children:
        best_child = best is not None and child == best["run_id"]
        tracking.add_tags(child, {BEST_TAG: str(best_child).lower()}, tracking_uri=uri)
    if best is not None:
        column = decisive_column(metric)
        tracking.add_tags(run_id, {BEST_RUN_TAG: best["run_id"], "tuneline.sweep_best_point": best["point"]},
                          tracking_uri=uri)
        tracking.log_metrics(run_id, {f"best_{column}": best[column]}, tracking_uri=uri)
    failed = any(row.get("failed") for row in rows)
    tracking.finish_run(run_id, "FAILED" if failed else "FINISHED", tracking_uri=uri)
    return best or {}
