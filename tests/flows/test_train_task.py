"""The train task's progress reports: an API call only when the training's whole percent advanced."""

from tasks.train import whole_percent_steps


def test_progress_is_updated_only_when_the_whole_percent_advances():
    sent: list[float] = []
    on_progress = whole_percent_steps(sent.append)
    for percent in (None, 0.4, 0.9, 1.2, 1.7, 2.0, 2.0, 50.3, 50.9, 49.0, 100.0, 100.4):
        on_progress({"current_steps": 1, "percentage": percent})
    assert sent == [1.2, 2.0, 50.3, 100.0]  # never backwards, never past 100
