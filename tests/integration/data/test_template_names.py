"""Every template name a LLaMA-Factory 0.9.5 YAML can hold is built or refused by name with what to use instead, and a
template whose stop words the tokenizer lacks is refused before a run starts.

LLaMA-Factory's template names (text and multimodal, by its plugin) come from the template-parity snapshot, which
`benchmarks/data_throughput.py --template-parity --snapshot` writes from its installed registry."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.mm_parity import load_parity_benchmark
from tuneline.data.template_catalog import LLAVA_NEXT_TEXT, TEMPLATES, VISION, get_template
from tuneline.data.unbuilt_templates import UNBUILT
from tuneline.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]

BENCH = load_parity_benchmark("template_parity")


@pytest.fixture(scope="module")
def llamafactory_names() -> dict[str, list[str]]:
    snapshot = BENCH.read_snapshot()
    return {"text": snapshot["text_templates"], "multimodal": snapshot["multimodal_templates"]}


def test_every_text_template_of_llamafactory_is_built(llamafactory_names):
    assert len(llamafactory_names["text"]) == 73
    assert sorted(set(llamafactory_names["text"]) - set(TEMPLATES)) == []


def test_every_multimodal_template_is_built_or_refused_by_name(llamafactory_names):
    """Built ones encode their media (VISION) or their text turns; the others are refused naming the model family,
    what it encodes, and the templates to use instead, never "not known"."""
    multimodal = set(llamafactory_names["multimodal"])
    assert multimodal == (multimodal & set(TEMPLATES)) | set(UNBUILT) and not set(UNBUILT) & set(TEMPLATES)
    for name in sorted(UNBUILT):
        with pytest.raises(ConfigError) as refused:
            get_template(name, None)
        message = str(refused.value)
        assert f"template '{name}' is LLaMA-Factory's template for {UNBUILT[name].family}" in message
        assert "not known" not in message and ", ".join(VISION) in message
        if UNBUILT[name].text:
            assert f"its text turns are template '{UNBUILT[name].text}'" in message


def test_a_refusal_offers_a_template_with_the_same_text_turns():
    """The text template a refusal offers is, in LLaMA-Factory's own registry, slot for slot the multimodal one's
    (user, answer, system, tool result, prefix, default system prompt, stop and thought words, tool format)."""
    turns = BENCH.read_snapshot()["text_turns"]
    offered = {name: unbuilt.text for name, unbuilt in UNBUILT.items() if unbuilt.text}
    assert len(offered) >= 13
    assert {name: turns[name] for name in offered} == {name: turns[text] for name, text in offered.items()}


def test_llava_next_on_other_language_models_writes_their_text_turns_as_llamafactory_does():
    """LLaVA-NeXT's templates for Llama 3, Mistral, Qwen and Yi: in LLaMA-Factory's registry, each is that model's
    text template slot for slot (Qwen's with a plainer default system prompt); here each is the same built text
    template with the any-resolution plugin."""
    import dataclasses

    turns = BENCH.read_snapshot()["text_turns"]
    system = 5  # the default system prompt's place in a snapshot's text turns
    for name, text in LLAVA_NEXT_TEXT.items():
        ours, theirs = TEMPLATES[name], turns[name]
        assert ours.mm_plugin == "llava_next" and name in VISION
        assert theirs[:system] + theirs[system + 1:] == turns[text][:system] + turns[text][system + 1:]
        assert repr(ours.default_system) == theirs[system]
        assert dataclasses.replace(ours, name=text, mm_plugin=None, default_system=TEMPLATES[text].default_system) \
            == TEMPLATES[text]


def test_mllama_writes_llama3_turns_as_llamafactory_does():
    """Llama 3.2 Vision's template is, in LLaMA-Factory's registry, Llama 3's slot for slot; here it is the built
    llama3 with the cross-attention image plugin."""
    import dataclasses

    turns = BENCH.read_snapshot()["text_turns"]
    assert turns["mllama"] == turns["llama3"] and "mllama" in VISION
    assert dataclasses.replace(TEMPLATES["mllama"], name="llama3", mm_plugin=None) == TEMPLATES["llama3"]


def test_unknown_names_still_say_not_known():
    with pytest.raises(ConfigError, match="template 'chatm' is not known; did you mean 'chatml'"):
        get_template("chatm", None)


def _validate(tmp_path, model, template, *extra: str, command: str = "validate") -> subprocess.CompletedProcess:
    config = tmp_path / "c.yaml"
    config.write_text(f"model_name_or_path: {model}\ndataset: demo_sft\ndataset_dir: {REPO / 'data'}\n"
                      f"template: {template}\noutput_dir: {tmp_path / 'out'}\n" + "".join(f"{e}\n" for e in extra))
    return subprocess.run([sys.executable, "-m", "cli.main", command, str(config)], capture_output=True,
                          text=True, timeout=120)


def test_stop_words_the_tokenizer_lacks_are_refused_before_a_run(tmp_path, tiny_model_dir):
    """The tiny model's tokenizer is ChatML's: llama3's `<|eot_id|>` and `<|eom_id|>` are not tokens of it. Refused by
    `tuneline validate` (and so `tuneline train`, which runs the same checks first): exit 2, one message naming the
    words and both ways out; accepted once `add_special_tokens` adds them, or with a template the tokenizer fits."""
    for command in ("validate", "train"):
        out = _validate(tmp_path, tiny_model_dir, "llama3", command=command)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert ("'template: llama3' stops on '<|eot_id|>', '<|eom_id|>', which are not tokens of the tokenizer"
                in out.stderr), out.stderr
        assert "'add_special_tokens: <|eot_id|>,<|eom_id|>'" in out.stderr and "'template: auto'" in out.stderr
        assert not (tmp_path / "out").exists()
    assert _validate(tmp_path, tiny_model_dir, "llama3", "add_special_tokens: <|eot_id|>,<|eom_id|>").returncode == 0
    assert _validate(tmp_path, tiny_model_dir, "qwen3_nothink").returncode == 0  # <|im_end|> is one of its tokens


def test_a_multimodal_template_not_built_is_refused_by_validate(tmp_path, tiny_model_dir):
    out = _validate(tmp_path, tiny_model_dir, "qwen2_audio")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "template 'qwen2_audio' is LLaMA-Factory's template for Qwen2-Audio (audio)" in out.stderr


def test_intern_vl_and_intern_s1_write_internlm_turns_as_llamafactory_does():
    """In LLaMA-Factory's registry both are intern2's turns slot for slot, InternVL with its own default system
    prompt and Intern-S1 with none; here both are intern2 with the InternVL plugin."""
    turns = BENCH.read_snapshot()["text_turns"]
    system = 5  # the default system prompt's place in a snapshot's text turns
    for name in ("intern_vl", "intern_s1"):
        assert turns[name][:system] + turns[name][system + 1:] == turns["intern2"][:system] + turns["intern2"][
            system + 1:]
        assert repr(TEMPLATES[name].default_system) == turns[name][system] and TEMPLATES[name].mm_plugin == "intern_vl"
        assert name in VISION


def test_glm4v_and_glm4_5v_write_glm_reasoning_turns_as_llamafactory_does():
    """In LLaMA-Factory's registry GLM-4.1V's template is GLM-Z1's turns and GLM-4.5V's is GLM-4.5's, slot for slot,
    each with `</answer>` as one more stop word; here the same built text templates with the GLM-4.1V plugin."""
    turns = BENCH.read_snapshot()["text_turns"]
    stop = 6  # the stop words' place in a snapshot's text turns
    for name, text in (("glm4v", "glmz1"), ("glm4_5v", "glm4_moe")):
        assert turns[name][:stop] + turns[name][stop + 1:] == turns[text][:stop] + turns[text][stop + 1:]
        assert turns[name][stop] == repr(list(TEMPLATES[name].stop_words)) and name in VISION
        assert TEMPLATES[name].replace(name=text, mm_plugin=None, stop_words=TEMPLATES[text].stop_words) == \
            TEMPLATES[text]
