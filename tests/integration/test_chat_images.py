"""`tuneline chat` with images: a vision-language model answers with the pixels of the attached images, through its
training template and plugin; the answers are checked against the model's own processor and `generate`, without
tuneline. The tiny models' weights are random: LLaVA's answers change with the image, Gemma 3's barely do."""

from __future__ import annotations

import base64
import io

import pytest

from cli.main import run
from tests.support.vision_chat import (
    MLLM_DATA,
    QUESTION,
    image_half_answer,
    minicpm_processor_answer,
    noise_image,
    processor_answer,
    vlm_chat_config,
)
from tuneline.errors import UserError

# The templates' prompts written out by hand: the processor expands its own image token (Gemma 3: begin-of-image).


def last_line(out: str) -> str:
    """The answer: the output's last line (split on newlines only; a random model's answer may hold a \\r)."""
    return out.rstrip("\n").rsplit("\n", 1)[-1]


@pytest.mark.parametrize("preset", ["llava", "llava_next", "gemma3", "mllama", "intern_vl", "glm4v"])
def test_a_prompt_with_an_image_is_answered_from_its_pixels(preset, tiny_vlm, tmp_path, capsys):
    """InternVL's and GLM-4.1V's processors need torchvision: their answers are checked against the image processor,
    the processor class's own image-token writing and `generate`."""
    path, out = vlm_chat_config(tiny_vlm, tmp_path, preset)
    processor_answer_of = image_half_answer if preset in ("intern_vl", "glm4v") else processor_answer
    answers = {}
    for seed in (0, 1):
        image = noise_image(tmp_path, seed)
        assert run(["chat", str(path), "--prompt", QUESTION, "--image", str(image)]) == 0
        answers[seed] = last_line(capsys.readouterr().out)
        assert answers[seed] == processor_answer_of(out, preset, image)
    if preset not in ("gemma3", "intern_vl", "glm4v"):
        assert answers[0] != answers[1], "another image, another answer: the pixels reach the model"
    written = f"<image>{QUESTION}"  # the placeholder where the user puts it answers the same
    assert run(["chat", str(path), "--prompt", written, "--image", str(noise_image(tmp_path, 1))]) == 0
    assert last_line(capsys.readouterr().out) == answers[1]


def test_minicpm_answers_an_image_as_its_processors_expansion_and_generate_do(tiny_vlm, tmp_path, capsys):
    """MiniCPM-V 4.6's processor needs torchvision: tuneline chat reads the image with the image half of it, and
    answers as transformers' own expansion of the image and `generate` do, for an image it slices and one it does
    not."""
    path, out = vlm_chat_config(tiny_vlm, tmp_path, "minicpm_v_4_6")
    for image in (MLLM_DATA / "mllm_demo_data" / "1.jpg", noise_image(tmp_path, 0)):
        assert run(["chat", str(path), "--prompt", QUESTION, "--image", str(image)]) == 0
        assert capsys.readouterr().out.splitlines()[-1] == minicpm_processor_answer(out, image)


def test_images_attach_to_messages_in_a_conversation(tiny_vlm, tmp_path, capsys, monkeypatch):
    path, out = vlm_chat_config(tiny_vlm, tmp_path, "llava")
    image = noise_image(tmp_path, 0)
    script = f"/image {tmp_path / 'missing.png'}\n/image {image}\n{QUESTION}\nclear\n<image><image>{QUESTION}\nexit\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(script))
    assert run(["chat", str(path)]) == 0
    out_text = capsys.readouterr().out
    assert "'/image' PATH attaches an image" in out_text
    assert f"'{tmp_path / 'missing.png'}' is neither an existing file nor base64 image data" in out_text
    assert f"attached {image}; it goes with your next message" in out_text
    answers = [line.split("Assistant: ", 1)[1] for line in out_text.splitlines() if "Assistant: " in line]
    assert answers == [processor_answer(out, "llava", image)], "the image went with the first message only"
    assert "the messages hold 2 <image> placeholder(s) but the row has 0 image(s)" in out_text, \
        "after clear no image is attached; the conversation goes on"


def test_images_are_refused_where_they_cannot_be_read(trained_chat, tiny_vlm, tmp_path, capsys):
    text_config, _ = trained_chat
    image = noise_image(tmp_path, 0)
    assert run(["chat", str(text_config), "--prompt", "hi", "--image", str(image)]) == 2
    err = capsys.readouterr().err
    assert "images were given, but 'template: chatml' reads text only" in err and "Traceback" not in err
    assert run(["chat", str(text_config), "template=llava", "--prompt", "hi", "--image", str(image)]) == 2
    assert "is a text-only model" in capsys.readouterr().err

    path, _ = vlm_chat_config(tiny_vlm, tmp_path, "llava")
    assert run(["chat", str(path), "--prompt", f"<image> and <image>{QUESTION}", "--image", str(image)]) == 2
    err = capsys.readouterr().err
    assert "cannot answer: the messages hold 2 <image> placeholder(s) but the row has 1 image(s)" in err
    (tmp_path / "broken.png").write_bytes(image.read_bytes()[:40])
    assert run(["chat", str(path), "--prompt", QUESTION, "--image", str(tmp_path / "broken.png")]) == 2
    assert f"cannot read the image: --image {tmp_path / 'broken.png'}: " in capsys.readouterr().err


def test_an_image_is_read_from_a_path_or_base64(tmp_path):
    from tuneline.data.mm.request_images import read_image

    image = noise_image(tmp_path, 0)
    data = base64.b64encode(image.read_bytes()).decode()
    pixels = read_image(str(image)).tobytes()
    assert read_image(data).tobytes() == pixels
    assert read_image(f"data:image/png;base64,{data}").tobytes() == pixels
    cases = {"https://example.com/cat.png": "is a URL",
             "data:image/png;base64,@@@": "the data URI's base64 text does not decode",
             base64.b64encode(b"not an image at all" * 8).decode(): "the base64 data is not an image PIL can read",
             "": "expected a file path or base64 text"}
    for source, expected in cases.items():
        with pytest.raises(UserError, match="cannot read the image: where: ") as caught:
            read_image(source, "where")
        assert expected in str(caught.value), (source, caught.value)


def test_chat_pans_and_scans_images_as_the_gemma3_processor_does(tiny_vlm, tmp_path):
    """`image_do_pan_and_scan: true` reaches `tuneline chat` and a served model (both answer through
    `answer_vision`): a wide image goes in with its crops, the pixels those of Gemma 3's own processor."""
    import numpy as np
    import torch
    from PIL import Image
    from transformers import AutoProcessor

    from tuneline.config import load_config
    from tuneline.data import get_template
    from tuneline.model.tokenizer import load_tokenizer
    from tuneline.serving.chat import answer_vision

    model = tiny_vlm("gemma3")
    config = load_config(overrides={"model_name_or_path": str(model), "dataset": "mllm_demo", "template": "gemma3",
                                    "dataset_dir": str(MLLM_DATA), "image_do_pan_and_scan": True,
                                    "output_dir": str(tmp_path / "out")}, check_paths=False)
    tokenizer = load_tokenizer(config.model)
    vision, _ = answer_vision(config, tokenizer, get_template("gemma3", tokenizer))
    wide = tmp_path / "wide.png"  # 800 x 300: 3 crops of 267 x 300
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (300, 800, 3), dtype=np.uint8)).save(wide)
    text = vision.expand_safely([{"role": "user", "content": f"<image>{QUESTION}"}], [str(wide)])[0]["content"]
    assert text.startswith("Here is the original image") and text.count("<start_of_image>") == 4
    pixels = vision.pixel_inputs([1], [str(wide)])([1], 1, True)["pixel_values"]
    own = AutoProcessor.from_pretrained(model)(text="<start_of_image>", images=[Image.open(wide).convert("RGB")],
                                               do_pan_and_scan=True, return_tensors="pt")
    assert pixels.shape[0] == 4 and torch.equal(pixels, own["pixel_values"])
