"""`tuneline api CONFIG` on the demo SFT output, called with the real `openai` client: answers equal `tuneline
chat`'s, streamed or not; bad requests are OpenAI errors and the server goes on; a client that leaves mid-stream
stops its generation; four clients at once are answered. A random LoRA adapter on the tiny model stands for the
trained one (as in the chat tests); one server for the module."""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.api_server import KEY, api_server, client
from tests.support.chat import greedy_answer, trained_chat  # noqa: F401 (the trained config, a fixture)
from tests.support.serving import PNG_1X1

QUESTION = "add two and three"


@pytest.fixture(scope="module")
def served(trained_chat, tmp_path_factory):  # noqa: F811
    """(base URL, server log, trained adapter): the server on a config whose output_dir holds a finished training."""
    path, out = trained_chat
    log = tmp_path_factory.mktemp("api") / "api.log"
    with api_server([str(path)], log) as url:
        yield url, log, out


def ask(url: str, text: str = QUESTION, **options):
    return client(url).chat.completions.create(model="sft", messages=[{"role": "user", "content": text}], **options)


def test_the_model_list_and_an_answer_equal_to_tuneline_chats(served, tiny_model_dir):
    url, _, adapter = served
    expected = greedy_answer(tiny_model_dir, adapter, QUESTION)  # base + adapter + chatml by hand, greedy
    assert [model.id for model in client(url).models.list()] == ["sft"], "named after the config file"
    answer = ask(url)
    assert answer.choices[0].message.content == expected
    assert answer.choices[0].finish_reason == "length" and answer.usage.completion_tokens == 6
    chunks = list(ask(url, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks).strip() == expected, "streamed: the same text"
    assert chunks[-1].choices[0].finish_reason == "length"


def test_a_missing_or_wrong_key_is_refused(served):
    import openai

    url, _, _ = served
    with pytest.raises(openai.AuthenticationError) as refused:
        client(url, key="wrong").models.list()
    assert refused.value.status_code == 401 and refused.value.body["code"] == "invalid_api_key"
    request = urllib.request.Request(f"{url}/chat/completions", data=b"{}", method="POST")  # no key at all
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request)
    assert refused.value.code == 401 and json.load(refused.value)["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize(("options", "error", "says"), [
    ({"model": "gpt-4o"}, "NotFoundError", "the model 'gpt-4o' does not exist; this server serves 'sft'"),
    ({"messages": [{"role": "assistant", "content": "hi"}]}, "BadRequestError", "message 1 is a 'assistant'"),
    ({"messages": [{"role": "user"}]}, "BadRequestError", "needs 'content'"),
    ({"messages": [{"role": "user", "content": "word " * 2000}]}, "BadRequestError", "this model takes 1024"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,"
                                                                                   + PNG_1X1}}]}]},
     "BadRequestError", "'template: chatml' reads text only"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "/etc/passwd"}}]}]},
     "BadRequestError", "SAFE_MEDIA_PATH"),
    ({"temperature": 5}, "BadRequestError", "'temperature' must be a number from 0 to 2"),
    ({"logit_bias": {"99999999": -100}}, "BadRequestError", "names token ids this model does not have"),
    ({"n": 2}, "BadRequestError", "only one choice"),
])
def test_a_bad_request_is_an_openai_error_and_the_server_goes_on(served, options, error, says):
    import openai

    url, _, _ = served
    request = {"model": "sft", "messages": [{"role": "user", "content": QUESTION}], **options}
    with pytest.raises(getattr(openai, error)) as refused:
        client(url).chat.completions.create(**request)
    assert says in refused.value.body["message"]
    assert ask(url).choices[0].message.content, "the next request is answered"


def test_a_client_gone_mid_stream_stops_its_generation(served, tiny_model_dir):
    from transformers import AutoTokenizer

    url, log, _ = served
    end = AutoTokenizer.from_pretrained(tiny_model_dir).convert_tokens_to_ids("<|im_end|>")
    stream = ask(url, stream=True, max_tokens=1000, logit_bias={str(end): -100})  # no end before 1000 tokens
    next(iter(stream)), next(iter(stream))
    stream.close()
    deadline = time.monotonic() + 30
    while "the client left" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    [line] = [line for line in log.read_text().splitlines() if "the client left" in line]
    generated = int(line.split("stopped after ")[1].split()[0])
    assert generated < 1000 - 6, f"generation went on after the client left: {line}"


def test_four_clients_at_once_are_answered(served, tiny_model_dir):
    url, _, adapter = served
    expected = greedy_answer(tiny_model_dir, adapter, QUESTION)
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda i: ask(url, stream=bool(i % 2)), range(4)))
    texts = [a.choices[0].message.content if hasattr(a, "choices") else
             "".join(c.choices[0].delta.content or "" for c in a).strip() for a in answers]
    assert texts == [expected] * 4


def test_an_image_part_reads_as_a_placeholder_where_it_stands():
    from tuneline.serving.openai_request import read_request

    image = "data:image/png;base64," + base64.b64encode(base64.b64decode(PNG_1X1)).decode()
    request = read_request({"model": "m", "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "look: "}, {"type": "image_url",
                                                                          "image_url": {"url": image}}]}]}, "m")
    assert request.messages == [{"role": "user", "content": "look: <image>"}] and request.system == "be brief"
    assert [im.size for im in request.images] == [(1, 1)]
    assert KEY
