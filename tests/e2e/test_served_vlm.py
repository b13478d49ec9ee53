"""A registered vision-language model answers requests that carry images (base64, or paths inside SAFE_MEDIA_PATH),
through `mlflow.pyfunc.load_model` as a user loads it; the answers match the model's own processor and `generate`.

The version is recorded as the finetune flow records it (start_run, record_training, record_results on a real SQLite
store); the tiny LLaVA's, Gemma 3's and Llama 3.2 Vision's own files stand for a full fine-tuning's output."""

from __future__ import annotations

import base64
import json
import shutil

import pytest

from tests.support.serving import invoke, model_server, register_champion
from tests.support.vision_chat import MLLM_DATA, QUESTION, noise_image, processor_answer
from tuneline.errors import UserError

NAME = "tiny-vlm-chat"


@pytest.fixture(scope="module", params=["llava", "gemma3", "mllama"])
def served(request, tiny_vlm, empty_mlflow_store, tmp_path_factory, monkeypatch_module):
    """(preset, the champion of NAME-preset loaded by MLflow); the trained output_dir is deleted, so it answers from
    the store."""
    import mlflow

    from tuneline.config import load_config

    preset = request.param
    root = tmp_path_factory.mktemp(f"served-{preset}")
    shutil.copyfile(empty_mlflow_store, root / "mlflow.db")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    out = shutil.copytree(tiny_vlm(preset), root / "out")
    (out / "run.json").write_text(json.dumps({"status": "complete"}))
    config = load_config(None, {"model_name_or_path": str(tiny_vlm(preset)), "stage": "sft",
                                "finetuning_type": "full", "dataset": "mllm_demo", "dataset_dir": str(MLLM_DATA),
                                "template": preset, "output_dir": str(out), "do_sample": False, "max_new_tokens": 6,
                                "mlflow_tracking_uri": uri, "mlflow_registered_model": f"{NAME}-{preset}"},
                         check_paths=False)
    register_champion(config, out)
    monkeypatch_module.setenv("MLFLOW_TRACKING_URI", uri)
    return preset, mlflow.pyfunc.load_model(f"models:/{NAME}-{preset}@champion"), uri


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_a_request_with_an_image_is_answered_from_its_pixels(served, tiny_vlm, tmp_path, monkeypatch):
    preset, served, _ = served
    monkeypatch.setenv("SAFE_MEDIA_PATH", str(tmp_path))  # the folder requests may name images in
    image = noise_image(tmp_path, 0)
    expected = {"answer": processor_answer(tiny_vlm(preset), preset, image), "tool_calls": []}
    assert served.predict({"prompt": QUESTION, "images": [str(image)]}) == [expected], "a path on this machine"
    as_base64 = base64.b64encode(image.read_bytes()).decode()
    said = [{"role": "user", "content": f"<image>{QUESTION}"}]
    assert served.predict({"messages": said, "images": [as_base64]}) == [expected], "base64, placeholder written"
    assert served.predict({"prompt": QUESTION, "images": [f"data:image/png;base64,{as_base64}"]}) == [expected]
    other = noise_image(tmp_path, 1)
    assert served.predict({"prompt": QUESTION, "images": [str(other)]}) == [
        {"answer": processor_answer(tiny_vlm(preset), preset, other), "tool_calls": []}]
    assert "images" in served.metadata.get_input_schema().input_names()


def test_a_bad_image_request_is_one_clear_error(served, tmp_path, monkeypatch):
    _, served, _ = served
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    monkeypatch.setenv("SAFE_MEDIA_PATH", str(allowed))
    image = noise_image(allowed, 0)
    (allowed / "cut.png").write_bytes(image.read_bytes()[:50])
    outside = noise_image(tmp_path, 1)
    cases = [({"prompt": QUESTION, "images": [str(outside)]},
              f"'{outside}' is outside SAFE_MEDIA_PATH ({allowed}), the only folder requests may read images from"),
             ({"prompt": QUESTION, "images": [f"{allowed}/../{outside.name}"]}, "is outside SAFE_MEDIA_PATH"),
             ({"prompt": QUESTION, "images": [str(allowed / "cut.png")]},
              f"cannot read the image: image 1 of the request's 'images': {allowed / 'cut.png'} does not decode"),
             ({"prompt": QUESTION, "images": ["data:image/png;base64,!!"]}, "base64 text does not decode"),
             ({"prompt": QUESTION, "images": [str(allowed / "cat.png")]}, "is neither an existing file nor base64"),
             ({"prompt": f"<image><image>{QUESTION}", "images": [str(image)]},
              "cannot answer: the messages hold 2 <image> placeholder(s) but the row has 1 image(s)"),
             ({"prompt": f"<image>{QUESTION}"}, "the messages hold 1 <image> placeholder(s) but the row has 0")]
    for request, expected in cases:
        with pytest.raises(UserError) as caught:
            served.predict(request)
        assert expected in str(caught.value), (request, caught.value)
    monkeypatch.delenv("SAFE_MEDIA_PATH")
    with pytest.raises(UserError, match="reading image files is off here; send the image as base64 text, or set "
                                        "SAFE_MEDIA_PATH"):
        served.predict({"prompt": QUESTION, "images": [str(image)]})


def test_a_text_request_is_still_answered(served):
    _, served, _ = served
    [row] = served.predict({"prompt": QUESTION})
    assert isinstance(row["answer"], str) and row["tool_calls"] == []


def test_mlflow_models_serve_answers_a_request_with_an_image(served, tiny_vlm, tmp_path):
    """Over HTTP, as a client sends it: JSON with the image as base64; a bad image is a 4xx naming it."""
    import urllib.error

    preset, _, uri = served
    image = noise_image(tmp_path, 0)
    as_base64 = base64.b64encode(image.read_bytes()).decode()
    with model_server(uri, f"models:/{NAME}-{preset}@champion", tmp_path / "serve.log") as port:
        answer = invoke(port, {"inputs": {"messages": [{"role": "user", "content": f"<image>{QUESTION}"}],
                                          "images": [as_base64]}})
        with pytest.raises(urllib.error.HTTPError) as refused:
            invoke(port, {"dataframe_records": [{"prompt": QUESTION, "images": ["data:image/png;base64,!!"]}]})
        error = refused.value.read().decode()
    assert answer == {"predictions": [{"answer": processor_answer(tiny_vlm(preset), preset, image), "tool_calls": []}]}
    assert "base64 text does not decode" in error, error
