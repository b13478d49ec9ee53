"""tuneline.tracking against real MLflow, a SQLite store per test (HTTP server: tests/e2e/test_tracking_server.py)"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from tests.support.ports import free_port
from tuneline import tracking
from tuneline.errors import UserError
from tuneline.tracking.step_logger import SPOOL_NAME


@pytest.fixture
def uri(tmp_path: Path, empty_mlflow_store: Path) -> str:
    shutil.copy(empty_mlflow_store, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def client(uri: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


# --- where the store is ------------------------------------------------------------------------------------


def test_resolve_tracking_uri_makes_sqlite_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking.resolve_tracking_uri(None) == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert tracking.resolve_tracking_uri("sqlite:///sub/x.db") == f"sqlite:///{tmp_path / 'sub/x.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert tracking.resolve_tracking_uri(None) == "http://127.0.0.1:5000"
    assert tracking.resolve_tracking_uri("sqlite:////abs/m.db") == "sqlite:////abs/m.db"


def test_check_tracking_available_closed_port_fails_fast():
    uri = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(UserError) as err:
        tracking.check_tracking_available(uri, timeout_s=2)
    assert time.monotonic() - start < 3
    assert uri in str(err.value) and "mlflow server --host 127.0.0.1" in str(err.value)


@pytest.fixture
def http_answering():
    """A real local HTTP server answering each path with a chosen status (stands in for a gateway or proxy)."""
    import http.server
    import threading

    routes: dict[str, int] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(routes.get(self.path.split("?", 1)[0], 404))
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", routes
    server.shutdown()
    server.server_close()


def test_check_tracking_available_tells_a_non_mlflow_server_from_a_guarded_one(http_answering):
    uri, routes = http_answering
    with pytest.raises(UserError, match="404 on /health and on the tracking API: no MLflow server"):
        tracking.check_tracking_available(uri)  # something answers, but it is not MLflow
    routes["/api/2.0/mlflow/experiments/search"] = 200  # a gateway that does not route /health
    tracking.check_tracking_available(uri)
    routes["/health"] = 401  # MLflow behind authentication: reachable
    tracking.check_tracking_available(uri)
    routes["/health"] = 503
    with pytest.raises(UserError, match="HTTP 503"):
        tracking.check_tracking_available(uri)


def test_check_tracking_available_sqlite_folder(tmp_path):
    tracking.check_tracking_available(f"sqlite:///{tmp_path / 'new/deeper/mlflow.db'}")
    assert (tmp_path / "new/deeper").is_dir()
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with pytest.raises(UserError, match="a_file"):
        tracking.check_tracking_available(f"sqlite:///{blocker / 'mlflow.db'}")


# --- one run per piece of work -----------------------------------------------------------------------------


def test_open_run_creates_reopens_and_renews_after_finish(uri, tmp_path):
    import mlflow

    first = tracking.open_run(uri, "sft-tiny", "key-a", "sft-lora tiny", {"stage": "sft"})
    run = client(uri).get_run(first)
    assert run.info.status == "RUNNING" and run.data.tags["tuneline.run_key"] == "key-a"
    assert run.info.run_name == "sft-lora tiny"
    experiment = client(uri).get_experiment(run.info.experiment_id)
    assert experiment.artifact_location == (tmp_path / "mlartifacts" / "sft-tiny").as_uri()
    assert mlflow.active_run() is None

    tracking.finish_run(first, "FAILED")
    again = tracking.open_run(uri, "sft-tiny", "key-a", "sft-lora tiny", {"stage": "sft", "extra": 1})
    assert again == first
    assert client(uri).get_run(first).info.status == "RUNNING"
    assert client(uri).get_run(first).data.tags["extra"] == "1"

    other_key = tracking.open_run(uri, "sft-tiny", "key-b", "other", {})
    assert other_key != first

    tracking.finish_run(first)
    renewed = tracking.open_run(uri, "sft-tiny", "key-a", "sft-lora tiny", {})
    assert renewed not in (first, other_key)
    assert mlflow.active_run() is None


def test_open_run_continues_a_training_across_work_keys_but_reuses_only_the_same_finished_work(uri):
    """The run key names the training (what resumes), the work key the exact settings: an unfinished run continues
    under another work key; a finished one is reopened (a cached rerun) or looked up only for its own work key."""
    first = tracking.open_run(uri, "e", "training-1", "r", {}, work_key="logging-every-2")
    resumed = tracking.open_run(uri, "e", "training-1", "r", {}, work_key="logging-every-5")
    assert resumed == first  # killed, then rerun with other logging: the same run
    assert client(uri).get_run(first).data.tags["tuneline.work_key"] == "logging-every-5"
    assert tracking.finished_run_with_key(uri, "e", "logging-every-5") is None  # not finished yet

    tracking.finish_run(first)
    assert tracking.finished_run_with_key(uri, "e", "logging-every-5") == first
    assert tracking.finished_run_with_key(uri, "e", "logging-every-2") is None  # not what the run finished as
    cached_rerun = tracking.open_run(uri, "e", "training-1", "r", {}, reopen_finished=True, work_key="logging-every-5")
    assert cached_rerun == first
    tracking.finish_run(first)
    other_work = tracking.open_run(uri, "e", "training-1", "r", {}, reopen_finished=True, work_key="logging-every-2")
    assert other_work != first  # a finished run never stands for other work
    assert client(uri).get_run(first).info.status == "FINISHED"
    fresh = tracking.open_run(uri, "e", "training-1", "r", {}, reopen_finished=True, work_key="logging-every-2",
                              fresh=True)  # --no-cache trains from step 0: never into a run holding steps
    assert fresh not in (first, other_work)


def test_tag_flow_run_appends_ids(uri):
    run_id = tracking.open_run(uri, "e", "k", "r", {})
    tracking.tag_flow_run(run_id, "flow-1", None)
    tracking.tag_flow_run(run_id, "flow-2", "http://prefect/runs/flow-2")
    tracking.tag_flow_run(run_id, "flow-2", "http://prefect/runs/flow-2")
    tags = client(uri).get_run(run_id).data.tags
    assert tags["tuneline.flow_run_ids"] == "flow-1,flow-2"
    assert tags["prefect.flow_run_id"] == "flow-2"
    assert tags["prefect.flow_run_url"] == "http://prefect/runs/flow-2"
    tracking.add_tags(run_id, {"git_commit": "abc"})
    assert client(uri).get_run(run_id).data.tags["git_commit"] == "abc"


def test_log_params_masks_secrets_and_tolerates_relogging(uri):
    run_id = tracking.open_run(uri, "e", "k", "r", {})
    config = {
        "model": {"model_name_or_path": "tiny", "hf_hub_token": "hf_secret", "pad_token": "<pad>"},
        "training": {"learning_rate": 1e-4, "hub_token": None, "max_new_tokens": 8},
        "pipeline": {"wandb_api_key": "k", "notes": "x" * 7000},
        "many": {f"p{i}": i for i in range(150)},  # more than one batch of 100
    }
    assert tracking.log_params(run_id, config) == {}
    params = client(uri).get_run(run_id).data.params
    assert params["model.hf_hub_token"] == "***" and params["pipeline.wandb_api_key"] == "***"
    assert params["model.pad_token"] == "<pad>" and params["training.max_new_tokens"] == "8"
    assert params["training.hub_token"] == "None"
    assert len(params["pipeline.notes"]) == 6000
    assert params["many.p149"] == "149" and params["training.learning_rate"] == "0.0001"

    config["training"]["learning_rate"] = 2e-4
    changed = tracking.log_params(run_id, config)  # same run reopened with one changed value: no error
    assert changed == {"training.learning_rate": "0.0002"}
    run = client(uri).get_run(run_id)
    assert run.data.params["training.learning_rate"] == "0.0001"
    assert run.data.tags["tuneline.resumed_with.training.learning_rate"] == "0.0002"
    assert run.data.tags["tuneline.resume_changes"] == "training.learning_rate"

    config["training"]["learning_rate"] = 1e-4  # back to the first value, another key changed
    config["training"]["max_new_tokens"] = 16
    assert tracking.log_params(run_id, config) == {"training.max_new_tokens": "16"}
    tags = client(uri).get_run(run_id).data.tags
    assert tags["tuneline.resume_changes"] == "training.learning_rate,training.max_new_tokens"  # every change
    assert tags["tuneline.resumed_with.training.learning_rate"] == "0.0001"  # what the newest start ran with
    assert tags["tuneline.resumed_with.training.max_new_tokens"] == "16"


# --- metrics -----------------------------------------------------------------------------------------------


def test_step_logger_skips_steps_already_logged_after_resume(uri, tmp_path):
    run_id = tracking.open_run(uri, "e", "k", "r", {})
    first = tracking.StepMetricLogger(run_id, uri, tmp_path / "out")
    for step in range(1, 6):
        first.log({"loss": 10.0 - step, "learning_rate": 0.1}, step)
    assert first.close() == 0
    # the training process died after step 5; the resumed one replays from an earlier checkpoint
    second = tracking.StepMetricLogger(run_id, uri, tmp_path / "out")
    for step in range(1, 11):
        second.log({"loss": 100.0 + step, "learning_rate": 0.2}, step)
    second.log({"eval_loss": 1.5}, 10)
    assert second.close() == 0
    loss = tracking.metric_history(uri, run_id, "loss")
    assert [s for s, _ in loss] == list(range(1, 11))
    assert dict(loss)[5] == 5.0 and dict(loss)[6] == 106.0
    assert [s for s, _ in tracking.metric_history(uri, run_id, "learning_rate")] == list(range(1, 11))
    assert tracking.get_run_metrics(uri, run_id)["eval_loss"] == 1.5
    assert not (tmp_path / "out" / SPOOL_NAME).exists()


def test_spool_when_server_down_at_start_then_flush_without_duplicates(uri, tmp_path):
    """A logger that cannot reach MLflow spools; flushing into the real store drops steps MLflow has."""
    run_id = tracking.open_run(uri, "e", "k", "r", {})
    tracking.log_metrics(run_id, {"loss": 1.0}, step=1)
    tracking.log_metrics(run_id, {"loss": 2.0}, step=2)
    down = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    logger = tracking.StepMetricLogger(run_id, down, tmp_path, retry_interval_s=0.2)
    for step in range(2, 7):
        logger.log({"loss": float(step * 10)}, step)
    logger.log({"loss": 999.0}, 6)  # the same step twice in one process is logged once
    assert time.monotonic() - start < 10
    spooled = (tmp_path / SPOOL_NAME).read_text().splitlines()
    assert [json.loads(line)["step"] for line in spooled] == [2, 3, 4, 5, 6]
    assert logger.close() == 5  # still down: everything stays

    assert tracking.flush_spool(run_id, uri, tmp_path) == 0
    assert tracking.metric_history(uri, run_id, "loss") == [
        (1, 1.0),
        (2, 2.0),
        (3, 30.0),
        (4, 40.0),
        (5, 50.0),
        (6, 60.0),
    ]
    assert not (tmp_path / SPOOL_NAME).exists()
    assert tracking.flush_spool(run_id, uri, tmp_path) == 0


def test_background_logger_keeps_order_and_surfaces_hard_errors(uri, tmp_path):
    run_id = tracking.open_run(uri, "e", "k", "r", {})
    logger = tracking.BackgroundStepLogger(lambda: tracking.StepMetricLogger(run_id, uri, tmp_path))
    waits, logged_at = [], {}
    for step in range(1, 21):
        start = time.perf_counter()
        logged_at[step] = (int(time.time() * 1000), step)
        logger.log({"loss": float(step), "learning_rate": 0.1}, step)
        waits.append(time.perf_counter() - start)
        logged_at[step] = (logged_at[step][0], int(time.time() * 1000) + 1)
    assert sorted(waits)[10] < 0.005  # the training thread only enqueues (a SQLite send takes ~30 ms)
    assert logger.close() == 0
    assert tracking.metric_history(uri, run_id, "loss") == [(s, float(s)) for s in range(1, 21)]
    for metric in client(uri).get_metric_history(run_id, "loss"):  # stamped when logged, not when sent
        low, high = logged_at[metric.step]
        assert low <= metric.timestamp <= high, metric

    other = tracking.open_run(uri, "e", "k2", "r", {})
    failing = tracking.BackgroundStepLogger(lambda: tracking.StepMetricLogger(other, uri, tmp_path))
    client(uri).delete_run(other)  # not an outage: MLflow refuses, and training must hear about it
    failing.log({"loss": 1.0}, 1)
    from mlflow.exceptions import MlflowException

    with pytest.raises(MlflowException):
        failing.flush()
    assert failing.close() == 0
    assert not (tmp_path / SPOOL_NAME).exists()  # nothing spooled for a refusal


def test_background_logger_sends_an_interval_in_one_request_and_flush_sends_at_once(uri, tmp_path):
    """Each request costs CPU that training pays for: what is logged within the interval goes together. The
    MLflow client is built by the worker too (importing MLflow and opening a store take ~1.5 s): logging
    never waits for it."""
    run_id = tracking.open_run(uri, "e", "k", "r", {})
    inner = tracking.StepMetricLogger(run_id, uri, tmp_path)
    requests, send = [], inner.log_steps
    inner.log_steps = lambda items: (requests.append([step for _, step, _ in items]), send(items))
    logger = tracking.BackgroundStepLogger(lambda: (time.sleep(2), inner)[1], interval_s=60)
    start = time.monotonic()
    for step in range(1, 11):
        logger.log({"loss": float(step)}, step)
    assert time.monotonic() - start < 1.0  # the logger is still being built: the steps only queue
    start = time.monotonic()
    logger.flush()
    assert time.monotonic() - start < 10  # flush sends now, not after the interval
    assert requests == [list(range(1, 11))]
    assert tracking.metric_history(uri, run_id, "loss") == [(s, float(s)) for s in range(1, 11)]
    logger.log({"loss": 11.0}, 11)
    assert logger.close() == 0 and requests[-1] == [11]
    assert tracking.metric_history(uri, run_id, "loss")[-1] == (11, 11.0)


def test_short_http_settings_of_a_worker_never_reach_another_threads_upload(monkeypatch):
    import threading

    from tuneline.tracking.step_logger import default_http_retries, short_http_retries

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "7")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    inside, release, seen = threading.Event(), threading.Event(), []

    def worker():
        with short_http_retries(0, 5):
            inside.set()
            release.wait(5)

    thread = threading.Thread(target=worker)
    thread.start()
    inside.wait(5)
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "0"

    def upload():
        with default_http_retries():
            seen.append(os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"])

    uploader = threading.Thread(target=upload)
    uploader.start()
    uploader.join(0.3)
    assert seen == []  # waits while the worker's send is in flight
    release.set()
    thread.join()
    uploader.join(5)
    assert seen == ["7"] and os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "7"
    assert "MLFLOW_HTTP_REQUEST_TIMEOUT" not in os.environ  # restored as it was


def test_step_logger_raises_for_errors_a_retry_cannot_fix(uri, tmp_path):
    from mlflow.exceptions import MlflowException

    tracking.open_run(uri, "e", "k", "r", {})
    with pytest.raises(MlflowException):
        tracking.StepMetricLogger("0" * 32, uri, tmp_path)  # no such run: not an outage, nothing spooled
    assert not (tmp_path / SPOOL_NAME).exists()


# --- artifacts, checkpoints, model -------------------------------------------------------------------------


def test_checkpoint_log_and_download_into_empty_dir(uri, tmp_path, fake_checkpoint):
    run_id = tracking.open_run(uri, "e", "k", "r", {})
    assert tracking.download_latest_checkpoint(run_id, uri, tmp_path / "none") is None
    out = tmp_path / "out"
    for step in (2, 10, 4):
        assert tracking.log_checkpoint(run_id, fake_checkpoint(out, step)) == f"checkpoints/checkpoint-{step}"
    # a checkpoint whose upload never finished (no completion marker) is not trusted
    partial = fake_checkpoint(tmp_path / "partial", 12)
    client(uri).log_artifacts(run_id, str(partial), "checkpoints/checkpoint-12")

    dest = tmp_path / "fresh_output"
    got = tracking.download_latest_checkpoint(run_id, uri, dest)
    assert got == dest / "checkpoint-10"
    assert sorted(p.name for p in got.iterdir()) == ["adapter_model.safetensors", "trainer_state.json"]
    assert (got / "adapter_model.safetensors").read_bytes() == (
        out / "checkpoint-10/adapter_model.safetensors"
    ).read_bytes()
    assert [p.name for p in dest.iterdir()] == ["checkpoint-10"]  # no temporary folder left

    # with a train key, checkpoints logged for another key are passed over
    tracking.log_checkpoint(run_id, fake_checkpoint(out, 16), train_key="other-config")
    keyed = tracking.download_latest_checkpoint(run_id, uri, tmp_path / "keyed", train_key="this-config")
    assert keyed == tmp_path / "keyed/checkpoint-10"  # checkpoint-10's marker names no key: accepted
    assert tracking.download_latest_checkpoint(run_id, uri, tmp_path / "any") == tmp_path / "any/checkpoint-16"
    # a run resumed with other logging: another train key, the same resume key
    tracking.log_checkpoint(run_id, fake_checkpoint(out, 18), train_key="logging-changed", resume_key="same-maths")
    compatible = tracking.download_latest_checkpoint(run_id, uri, tmp_path / "compatible", train_key="this-config",
                                                     resume_key="same-maths")
    assert compatible == tmp_path / "compatible/checkpoint-18"
    other_maths = tracking.download_latest_checkpoint(run_id, uri, tmp_path / "maths", train_key="this-config",
                                                      resume_key="other-maths")
    assert other_maths == tmp_path / "maths/checkpoint-10"

    start = time.monotonic()  # server gone during training: the checkpoint is skipped, training goes on
    down = f"http://127.0.0.1:{free_port()}"
    assert tracking.log_checkpoint(run_id, fake_checkpoint(out, 14), tracking_uri=down) is None
    assert time.monotonic() - start < 5


def test_artifacts_and_model_registration(uri, tmp_path):
    run_id = tracking.open_run(uri, "e", "k", "r", {})
    (tmp_path / "trainer_log.jsonl").write_text('{"loss": 1}\n')
    plots = tmp_path / "plots"
    plots.mkdir()
    (plots / "loss.png").write_bytes(b"png")
    tracking.log_artifacts(run_id, tmp_path / "trainer_log.jsonl")
    tracking.log_artifacts(run_id, plots, "plots")
    tracking.log_metrics(run_id, {"eval_loss": 0.5})
    model = tmp_path / "adapter"
    model.mkdir()
    (model / "adapter_config.json").write_text("{}")
    recipe = "from peft import AutoPeftModelForCausalLM\nmodel = AutoPeftModelForCausalLM.from_pretrained(path)"

    serving = {"model_name_or_path": "base/model", "template": "chatml"}  # the run's config, as model_config

    version = tracking.log_and_register_model(run_id, model, "tiny-sft", {"dataset_fingerprint": "abc"}, recipe,
                                              serving, ["peft"])
    assert version == "1"
    assert tracking.log_and_register_model(run_id, model, None, {}, recipe, serving, ["peft"]) is None
    assert tracking.log_and_register_model(run_id, model, "tiny-sft", {}, recipe, serving, ["peft"]) == "2"

    c = client(uri)
    names = {a.path for a in c.list_artifacts(run_id)} | {a.path for a in c.list_artifacts(run_id, "model")}
    assert {"trainer_log.jsonl", "plots", "model/MLmodel", "model/TUNELINE_LOADING.md"} <= names
    files = tracking.download_logged_model(run_id, tmp_path / "logged")
    assert files.name == "adapter" and (files / "adapter_config.json").read_text() == "{}"
    from mlflow.models import Model

    mlmodel = Model.load(str(files.parent.parent / "MLmodel"))
    assert mlmodel.flavors["python_function"]["config"] == serving, "the config loads and answers the model"
    assert mlmodel.signature.inputs.input_names() == ["messages", "prompt", "system", "tools", "images"]
    mv = c.get_model_version("tiny-sft", "1")
    assert mv.run_id == run_id and mv.source.endswith("/artifacts/model")
    assert mv.tags["dataset_fingerprint"] == "abc" and mv.tags["metric.eval_loss"] == "0.5"
    readme = Path(c.download_artifacts(run_id, "model/TUNELINE_LOADING.md", str(tmp_path / "dl"))).read_text()
    assert "AutoPeftModelForCausalLM" in readme


def test_a_local_stores_link_is_a_url_and_its_ui_command_comes_with_it(uri):
    """A SQLite store's run links to where `mlflow ui` serves it; the command to start that UI is given apart, so
    the model card's and Prefect summary's Markdown link has a real URL for its target."""
    from tuneline.pipeline.record import run_link
    from tuneline.pipeline.records import MlflowRun

    run_id = tracking.open_run(uri, "e", "k", "r", {})
    experiment_id = client(uri).get_run(run_id).info.experiment_id
    url = tracking.run_url(uri, run_id)
    assert url == f"http://127.0.0.1:5000/#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning"
    command = tracking.ui_command(uri)
    assert command == f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1"
    assert run_link(MlflowRun(run_id, uri, url=url, ui_command=command)) == (
        f"[{run_id}]({url}) (a local store: serve its UI with `{command}`)")
    assert tracking.ui_command("http://127.0.0.1:5000") is None
    assert run_link(MlflowRun(run_id, uri)) is None
