"""`tuneline api EXPORT_DIR` on a tiny vision-language model (LLaVA), called with the real `openai` client: an image
part, as base64 or as a path inside SAFE_MEDIA_PATH, is answered from its pixels as the model's own processor and
`generate` answer it; a path outside that folder and an unreadable image are refused, and the server goes on."""

from __future__ import annotations

import base64

import pytest

from tests.support.api_server import api_server, client
from tests.support.vision_chat import QUESTION, noise_image, processor_answer

PRESET = "llava"


@pytest.fixture(scope="module")
def served(tiny_vlm, tmp_path_factory):
    """(base URL, the folder requests may name images in): the tiny LLaVA's folder served as an export."""
    root = tmp_path_factory.mktemp("api-vlm")
    media = root / "media"
    media.mkdir()
    with api_server([str(tiny_vlm(PRESET)), f"template={PRESET}"], root / "api.log",
                    SAFE_MEDIA_PATH=str(media), API_MODEL_NAME="model") as url:
        yield url, media


def ask(url: str, image_url: str, **options):
    parts = [{"type": "image_url", "image_url": {"url": image_url}}, {"type": "text", "text": QUESTION}]
    return client(url).chat.completions.create(model="model", messages=[{"role": "user", "content": parts}],
                                               temperature=0, max_tokens=6, **options)


def test_an_image_part_is_answered_from_its_pixels(served, tiny_vlm):
    url, media = served
    image = noise_image(media, 0)
    expected = processor_answer(tiny_vlm(PRESET), PRESET, image)
    as_uri = "data:image/png;base64," + base64.b64encode(image.read_bytes()).decode()
    assert ask(url, as_uri).choices[0].message.content == expected, "base64"
    assert ask(url, str(image)).choices[0].message.content == expected, "a path inside SAFE_MEDIA_PATH"
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in ask(url, as_uri, stream=True))
    assert streamed.strip() == expected


def test_a_bad_image_is_refused_and_the_server_goes_on(served, tmp_path):
    import openai

    url, media = served
    outside = noise_image(tmp_path, 1)
    (media / "broken.png").write_bytes(b"not a png")
    for image, says in [(str(outside), "SAFE_MEDIA_PATH"), (str(media / "broken.png"), "not an image"),
                        ("https://example.com/cat.png", "is a URL")]:
        with pytest.raises(openai.BadRequestError) as refused:
            ask(url, image)
        assert says in refused.value.body["message"] and refused.value.body["param"] == "messages[0].content[0]"
    assert ask(url, str(noise_image(media, 2))).choices[0].message.content is not None
