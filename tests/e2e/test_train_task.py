"""The train task's progress reports: an API call only when the training's whole percent advanced, and none that
can end the training when the Prefect API is gone."""

import time
from uuid import uuid4

from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

from tasks.train import progress_updater, whole_percent_steps
from tests.support.ports import free_port


def test_progress_is_updated_only_when_the_whole_percent_advances():
    sent: list[float] = []
    on_progress = whole_percent_steps(sent.append)
    for percent in (None, 0.4, 0.9, 1.2, 1.7, 2.0, 2.0, 50.3, 50.9, 49.0, 100.0, 100.4):
        on_progress({"current_steps": 1, "percentage": percent})
    assert sent == [1.2, 2.0, 50.3, 100.0]  # never backwards, never past 100


def test_an_unreachable_prefect_api_stops_the_progress_bar_not_the_training():
    warnings: list[str] = []
    closed = f"http://127.0.0.1:{free_port()}/api"  # nothing listens: refused at once
    with temporary_settings({PREFECT_API_URL: closed, PREFECT_CLIENT_MAX_RETRIES: 0}):
        update = progress_updater(uuid4(), warnings.append)
        update(10.0)  # the real client's request, refused: no exception
        start = time.monotonic()
        update(20.0)
        update(100.0)
    assert time.monotonic() - start < 0.1  # after the first failure no more requests wait on a dead server
    assert len(warnings) == 1 and "did not answer" in warnings[0] and "training goes on" in warnings[0]
