"""What a user sees: `tuneline ui` serves both UIs, a small sweep is sent to them, and a real headless Chromium
finds the sweep's child runs on the MLflow experiment page and the seven steps on the Prefect flow-run page.

Needs a Chromium on the machine (`make test` installs Debian's where it can, and runs these only when one is
there); playwright drives it, downloading no browser.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support.flows import REPO, STEPS
from tests.support.ports import free_port
from tuneline import tracking
from tuneline.runtime.contract import die_with_parent

pytestmark = pytest.mark.browser
BIN = Path(sys.executable).parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _start_ui(root: Path, prefect_port: int, mlflow_port: int) -> tuple[subprocess.Popen, list[str]]:
    """`tuneline ui` as a user starts it; returns it and what it printed once both servers answer."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "MLFLOW_TRACKING"))}
    env["PREFECT_HOME"] = str(root / "prefect-home")
    ui = subprocess.Popen([str(BIN / "tuneline"), "ui", "--prefect-port", str(prefect_port), "--mlflow-port",
                           str(mlflow_port)], cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, start_new_session=True, preexec_fn=die_with_parent)
    printed, deadline = [], time.monotonic() + 240
    for line in ui.stdout:
        printed.append(line.rstrip())
        if "Ctrl+C stops both" in line or time.monotonic() > deadline:
            break
    assert "Ctrl+C stops both" in printed[-1], "\n".join(printed)
    return ui, printed


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def test_the_uis_show_a_sweeps_child_runs_and_a_flow_runs_seven_steps(tmp_path, tiny_model_dir):
    from mlflow import MlflowClient
    from playwright.sync_api import sync_playwright

    prefect_port, mlflow_port = free_port(), free_port()
    ui, printed = _start_ui(tmp_path, prefect_port, mlflow_port)
    prefect_ui, mlflow_ui = f"http://127.0.0.1:{prefect_port}", f"http://127.0.0.1:{mlflow_port}"
    try:
        assert f"Prefect UI: {prefect_ui}" in printed
        assert f"MLflow UI:  {mlflow_ui}/#/?workflowType=machine_learning" in printed  # the model-training view
        config = tmp_path / "sweep.yaml"
        config.write_text(yaml.safe_dump({
            "model_name_or_path": str(tiny_model_dir), "stage": "sft", "finetuning_type": "lora", "lora_rank": 4,
            "dataset": "demo_sft", "eval_dataset": "demo_sft_eval", "dataset_dir": str(REPO / "data"),
            "template": "chatml", "cutoff_len": 64, "max_samples": 8, "output_dir": str(tmp_path / "out"),
            "max_steps": 1, "per_device_train_batch_size": 2, "pipeline_cache_dir": str(tmp_path / "cache"),
            "mlflow_tracking_uri": mlflow_ui, "mlflow_experiment": "browser-sweep", "eval_max_samples": 1,
            "eval_max_new_tokens": 1}))
        env = {**os.environ, "PREFECT_API_URL": f"{prefect_ui}/api", "PREFECT_HOME": str(tmp_path / "client-home")}
        subprocess.run([str(BIN / "tuneline"), "sweep", str(config), "--grid", "learning_rate=1e-4,5e-5",
                        "--max-parallel", "2"],
                       cwd=REPO, env=env, check=True, capture_output=True, timeout=600)

        client = MlflowClient(mlflow_ui)
        experiment = client.get_experiment_by_name("browser-sweep")
        runs = client.search_runs([experiment.experiment_id])
        [parent] = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
        children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
        assert len(children) == 2
        flow_run_url = children[0].data.tags["prefect.flow_run_url"]
        assert flow_run_url.startswith(prefect_ui), "the MLflow run links to its Prefect flow run"

        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(f"{mlflow_ui}/#/experiments/{experiment.experiment_id}/runs")
            parent_row = page.locator('[role=gridcell][col-id*="Run Name"]', has_text=parent.info.run_name)
            parent_row.wait_for(timeout=60_000)
            parent_row.locator("button").first.click()  # unfold the sweep's children
            for child in children:
                page.get_by_text(child.info.run_name, exact=True).first.wait_for(timeout=60_000)

            page.goto(tracking.run_url(mlflow_ui, children[0].info.run_id))  # the link tuneline writes
            page.get_by_text(children[0].info.run_id).first.wait_for(timeout=60_000)
            crumbs = page.locator("nav[aria-label=breadcrumb], [class*=breadcrumb]").first.inner_text()
            assert "Runs" in crumbs and "Evaluations" not in crumbs, f"not the model-training view: {crumbs!r}"

            page.goto(flow_run_url)
            page.locator("li#task-runs").click()  # the flow-run page's "Task Runs" tab
            for step in sorted(STEPS):
                page.locator("#task-runs-content").get_by_text(step).first.wait_for(timeout=60_000)
            page.locator("li#artifacts").click()
            page.get_by_text("run-summary", exact=True).first.click()  # the summary links to the MLflow run
            page.get_by_text(children[0].info.run_id).first.wait_for(timeout=60_000)
            browser.close()
    finally:
        ui.send_signal(signal.SIGINT)  # Ctrl+C
        code = ui.wait(timeout=60)
    assert code == 130 and _port_free(prefect_port) and _port_free(mlflow_port), "Ctrl+C stops both servers"
