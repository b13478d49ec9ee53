"""The torch profiler keys through a real training on the tiny model: traces on the schedule the keys give (one file
per cycle, the active steps in it), under output_dir or `profiler_output_dir`, holding what the record_* keys ask
for, and logged to the training's MLflow run (passed as the launcher passes it)."""

from __future__ import annotations

import re
import shutil

from tests.support.sft_runs import sft_run
from tuneline import tracking


def _recorded_steps(trace) -> set[int]:
    return {int(n) for n in re.findall(r'"ProfilerStep#(\d+)"', trace.read_text())}


def test_traces_follow_the_profiler_keys_and_reach_mlflow(tiny_model_dir, tmp_path, empty_mlflow_store, monkeypatch):
    from mlflow import MlflowClient

    shutil.copy(empty_mlflow_store, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = tracking.open_run(uri, "profiler", "work-key", "profiler test", {})
    monkeypatch.setenv("MLFLOW_RUN_ID", run_id)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    # LLaMA-Factory's defaults (wait 1, warmup 1, active 1) in 2 cycles over 6 steps: the 3rd and 6th recorded
    sft_run(tmp_path, tiny_model_dir, tmp_path / "on", max_steps=6, enable_torch_profiler=True, profiler_repeat=2)
    traces = sorted((tmp_path / "on" / "profiler").glob("rank0.*.pt.trace.json"), key=lambda p: p.stat().st_mtime)
    assert [_recorded_steps(trace) for trace in traces] == [{2}, {5}]
    assert all('"Input Dims"' in t.read_text() and '"[memory]"' in t.read_text() for t in traces)
    logged = MlflowClient(tracking_uri=uri).list_artifacts(run_id, "profiler")
    assert sorted(item.path for item in logged) == sorted(f"profiler/{trace.name}" for trace in traces)

    monkeypatch.delenv("MLFLOW_RUN_ID")
    elsewhere = tmp_path / "traces"
    sft_run(tmp_path, tiny_model_dir, tmp_path / "off", max_steps=4, enable_torch_profiler=True,
         profiler_output_dir=str(elsewhere), profiler_wait_steps=0, profiler_warmup_steps=1,
         profiler_active_steps=2, profiler_repeat=1, profiler_record_shapes=False, profiler_profile_memory=False,
         profiler_with_stack=False)
    [trace] = elsewhere.glob("rank0.*.pt.trace.json")
    assert _recorded_steps(trace) == {1, 2} and not (tmp_path / "off" / "profiler").exists()
    text = trace.read_text()
    assert '"Input Dims"' not in text and '"[memory]"' not in text and '"python_function"' not in text
