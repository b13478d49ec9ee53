"""A mistake the user can fix, found inside a task, ends the flow with its message and no traceback anywhere."""

import json
import os
import subprocess
import sys

from tests.support.flows import REPO, tiny_config


def test_a_bad_data_row_ends_the_flow_with_its_message_and_no_traceback(prefect_api, tmp_path, tiny_model_dir):
    from prefect.settings import PREFECT_API_URL

    data = tmp_path / "data"
    data.mkdir()
    (data / "broken.json").write_text(json.dumps([{"instruction": "q", "output": "a"}, {"instruction": "q"}]))
    (data / "dataset_info.json").write_text(json.dumps({"broken": {"file_name": "broken.json"}}))
    config = tiny_config(tmp_path, tiny_model_dir, dataset="broken", eval_dataset=None, dataset_dir=str(data))
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PREFECT_LOGGING_LEVEL": "INFO"}
    done = subprocess.run([sys.executable, "-m", "flows.finetune", str(config)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr[-3000:]
    output = done.stdout + done.stderr
    assert "Traceback" not in output, output[-3000:]
    assert "broken.json: row 2" in done.stderr and "build-dataset" in done.stderr, done.stderr[-3000:]
    assert output.count("broken.json: row 2") >= 2, "in the task's log, in the flow's, and the command's last line"
