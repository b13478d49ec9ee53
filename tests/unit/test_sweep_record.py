"""The sweep's comparison: which row is best in either direction, and the table as markdown and CSV."""

import csv
import io

from tuneline.pipeline.sweep_record import best_row, csv_table, decisive_column, markdown_table

ROWS = [
    {"point": "learning_rate=0.001", "learning_rate": 0.001, "run_id": "a", "final_eval_loss": 0.7,
     "final_reward_accuracy": 0.5, "train_loss": 0.69},
    {"point": "learning_rate=0.003", "learning_rate": 0.003, "run_id": "b", "final_eval_loss": 0.6,
     "final_reward_accuracy": 0.4, "train_loss": 0.71},
    {"point": "learning_rate=0.01", "learning_rate": 0.01, "run_id": None, "failed": "training failed | oom"},
]


def test_the_best_row_follows_the_metric_and_its_direction_and_skips_failed_points():
    assert decisive_column("eval_loss") == "final_eval_loss" and decisive_column("train_loss") == "train_loss"
    assert best_row(ROWS, "eval_loss", greater_is_better=False)["run_id"] == "b"
    assert best_row(ROWS, "reward_accuracy", greater_is_better=True)["run_id"] == "a"
    assert best_row(ROWS, "train_loss", greater_is_better=False)["run_id"] == "a"
    assert best_row(ROWS, "bleu4", greater_is_better=True) is None


def test_the_table_has_every_column_once_and_marks_the_best():
    best = best_row(ROWS, "eval_loss", greater_is_better=False)
    lines = markdown_table(ROWS, best).splitlines()
    assert lines[0] == ("|  | point | learning_rate | run_id | final_eval_loss | final_reward_accuracy | train_loss "
                        "| failed |")
    assert lines[3].startswith("| best | learning_rate=0.003 | 0.003 | b | 0.6 |")
    assert "training failed \\| oom" in lines[4], "a pipe inside a cell does not break the table"
    parsed = list(csv.DictReader(io.StringIO(csv_table(ROWS))))
    assert [row["run_id"] for row in parsed] == ["a", "b", ""] and parsed[2]["failed"] == "training failed | oom"
