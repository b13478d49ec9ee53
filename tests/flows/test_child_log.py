"""The training child's lines reach the console one by one and Prefect's API gathered, in a real Prefect API."""

import logging
import time

from prefect import flow, get_run_logger, task
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterTaskRunId
from prefect.logging.handlers import APILogHandler
from prefect.runtime import task_run

from tasks.child_log import ChildLog


@task
def forward(lines: list[str], pause_after: int) -> str:
    with ChildLog(get_run_logger(), interval_s=0.5) as child_log:
        for n, text in enumerate(lines):
            child_log.line(text)
            if n == pause_after:
                time.sleep(1.2)  # a quiet child: what came before is sent without waiting for more lines
    return task_run.id


@flow
def forwarding(lines: list[str], pause_after: int) -> str:
    return forward(lines, pause_after)


def test_child_lines_reach_console_each_and_api_gathered(prefect_api, caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("prefect"), "level", logging.INFO)  # the flow tests run at WARNING
    lines = [f"{{'loss': {n / 10}, 'step': {n}}}" for n in range(12)]
    with caplog.at_level(logging.INFO):
        task_run_id = forwarding(lines, pause_after=3)
    console = [r for r in caplog.records if r.name == "prefect.task_runs" and r.getMessage() in lines]
    assert [r.getMessage() for r in console] == lines, "every line to the console, in order"
    assert all(getattr(r, "send_to_api", True) is False for r in console), "the console's records skip the API"

    APILogHandler().flush()  # Prefect's log worker sends its batch now

    async def api_records():
        async with get_client() as client:
            return await client.read_logs(LogFilter(task_run_id=LogFilterTaskRunId(any_=[task_run_id])))

    from prefect.utilities.asyncutils import run_coro_as_sync

    deadline = time.monotonic() + 30
    while True:
        records = [r for r in run_coro_as_sync(api_records()) if r.name == "training"]
        sent = [text for record in sorted(records, key=lambda r: r.timestamp) for text in record.message.split("\n")]
        if sent == lines or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert sent == lines, "every line reaches the API once, in order"
    assert 2 <= len(records) < len(lines), "gathered into records, the lines before the quiet spell in their own"
    assert any(record.message.split("\n")[-1] == lines[3] for record in records), "sent before the quiet spell ended"
