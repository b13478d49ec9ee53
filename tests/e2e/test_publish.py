"""Publishing to the Hugging Face Hub, through huggingface_hub's real client against a local stand-in for the hub's
HTTP API (tests/hub_standin.py): no hub is reachable from this machine or from CI, so the stand-in answers the
requests create_repo, create_branch and upload_folder send, and keeps what it received.

The flow's side (a run publishes once, after its model card, and records where) is in
tests/e2e/test_publish_flow.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.hub_standin import HubStandIn
from tests.support.ports import free_port
from tuneline.config import load_config
from tuneline.errors import ConfigError, UserError
from tuneline.pipeline.publishing import publish_model

REPO = Path(__file__).resolve().parents[2]
TOKEN = "hf_standin_write_token"
CARD = "---\nlibrary_name: peft\n---\n# the model card\n"


@pytest.fixture
def hub(monkeypatch):
    with HubStandIn(TOKEN) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield hub


def config(out: Path, **keys):
    return load_config(None, {"model_name_or_path": "org/base-model", "dataset": "demo_sft",
                              "dataset_dir": str(REPO / "data"), "output_dir": str(out), **keys})


def trained_output(root: Path) -> tuple[Path, Path]:
    """An output_dir as training leaves it (adapter, peft's own README, bookkeeping, a checkpoint), and a card."""
    out = root / "out"
    (out / "checkpoint-2").mkdir(parents=True)
    (out / "checkpoint-2" / "optimizer.pt").write_bytes(b"state")
    files = {"adapter_model.safetensors": b"\x00weights", "adapter_config.json": b"{}",
             "README.md": b"peft's template card", "run.json": b"{}", "trainer_log.jsonl": b"{}\n",
             "tuneline_config.yaml": b"stage: sft\n"}
    for name, data in files.items():
        (out / name).write_bytes(data)
    card = root / "card.md"
    card.write_text(CARD)
    return out, card


def test_the_final_model_and_the_card_are_uploaded_to_a_private_repo(hub, tmp_path):
    out, card = trained_output(tmp_path)
    cfg = config(out, push_to_hub=True, hub_model_id="org/tiny-lora", hub_private_repo=True, hub_token=TOKEN)
    published = publish_model(cfg, out, card, run=None)

    assert published["repo_id"] == "org/tiny-lora" and published["url"] == f"{hub.url}/org/tiny-lora"
    assert published["commit_url"] == f"{hub.url}/org/tiny-lora/commit/{published['commit']}"
    files = hub.files("org/tiny-lora")
    assert set(files) == {"adapter_model.safetensors", "adapter_config.json", "README.md"}, "no bookkeeping"
    assert files["README.md"].decode() == CARD and files["adapter_model.safetensors"] == b"\x00weights"
    assert hub.repos["org/tiny-lora"]["private"] is True
    assert set(hub.authorizations) == {f"Bearer {TOKEN}"}, "every request carries hub_token"


def test_without_hub_model_id_the_repo_is_named_after_output_dir_under_the_tokens_user(hub, tmp_path, monkeypatch):
    """transformers' default, as LLaMA-Factory gets it; the token comes from HF_TOKEN, and hub_revision is a branch
    made when missing, main left as it was."""
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    out, card = trained_output(tmp_path)
    published = publish_model(config(out, push_to_hub=True, hub_revision="v2"), out, card, run=None)

    assert published["repo_id"] == f"{hub.user}/out"
    assert hub.files(f"{hub.user}/out", "v2")["README.md"].decode() == CARD
    assert hub.files(f"{hub.user}/out", "main") == {}
    assert hub.repos[f"{hub.user}/out"]["private"] is False, "public unless hub_private_repo"


def test_without_push_to_hub_nothing_is_sent(hub, tmp_path):
    out, card = trained_output(tmp_path)
    assert publish_model(config(out), out, card, run=None) is None
    assert hub.authorizations == []


def test_a_refused_token_or_an_unreachable_hub_is_one_user_error_naming_the_repo_and_the_endpoint(hub, tmp_path,
                                                                                                  monkeypatch):
    out, card = trained_output(tmp_path)
    wrong = "hf_wrong_token_value"
    cfg = config(out, push_to_hub=True, hub_model_id="org/tiny-lora", hub_token=wrong)
    with pytest.raises(UserError) as refused:
        publish_model(cfg, out, card, run=None)
    message = str(refused.value)
    assert "'hub_model_id: org/tiny-lora'" in message and hub.url in message and "(401)" in message
    assert wrong not in message and refused.value.__cause__ is None and refused.value.__suppress_context__

    unreachable = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("HF_ENDPOINT", unreachable)
    with pytest.raises(UserError, match=f"'hub_model_id: org/tiny-lora' could not be published to {unreachable}: "
                                        "the hub is unreachable"):
        publish_model(cfg, out, card, run=None)


@pytest.mark.parametrize(("keys", "refused"), [
    ({"hub_model_id": "org/team/model"}, "'hub_model_id: org/team/model' is not a Hugging Face repo id"),
    ({"output_dir": "<tmp>/my model"}, "output_dir's name 'my model' (the repo 'push_to_hub: true' uploads to"),
    ({"hub_strategy": "every_save"}, "'hub_strategy: every_save' has no effect: tuneline publishes"),
    ({"hub_always_push": True}, "'hub_always_push: True' has no effect"),
    ({"push_to_hub": False, "hub_token": "hf_secret_value"}, "'hub_token: ***' has no effect in this run"),
])
def test_hub_keys_that_would_fail_or_change_nothing_are_refused_before_training(tmp_path, keys, refused):
    values = {"push_to_hub": True, **{k: v.replace("<tmp>", str(tmp_path)) if isinstance(v, str) else v
                                      for k, v in keys.items()}}
    with pytest.raises(ConfigError, match=re.escape(refused)) as error:
        config(tmp_path / "out", **values)
    assert "hf_secret_value" not in str(error.value)


def test_hub_strategy_end_and_pissa_convert_are_what_publishing_does(tmp_path):
    """'end' is tuneline's way; pissa_convert's plain LoRA adapter is the final file that gets published."""
    cfg = config(tmp_path / "out", push_to_hub=True, hub_strategy="end", finetuning_type="lora", pissa_init=True,
                 pissa_convert=True)
    assert cfg.training["hub_strategy"] == "end"


def test_push_to_hub_without_any_token_is_refused_before_training(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from tuneline.pipeline.preflight import checked_config

    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-login"))  # whatever this machine has saved
    values = {"model_name_or_path": "org/base-model", "dataset": "demo_sft", "dataset_dir": str(REPO / "data"),
              "output_dir": str(tmp_path / "out"), "push_to_hub": True}
    with pytest.raises(ConfigError, match="'push_to_hub: true' needs a Hugging Face token with write access"):
        checked_config(None, values)
    assert checked_config(None, {**values, "hub_token": TOKEN}).training["push_to_hub"] is True


def test_the_training_child_never_pushes(tmp_path):
    """The Trainer gets no hub key: given push_to_hub it would create the repo when built and push at every save."""
    from tuneline.config.training_keys import PUBLISH_KEYS
    from tuneline.train.training_args import translate_training_keys

    cfg = config(tmp_path / "out", push_to_hub=True, hub_model_id="org/m", hub_token=TOKEN, hub_private_repo=True,
                 hub_revision="v2", hub_strategy="end", hub_always_push=False)
    assert PUBLISH_KEYS <= set(cfg.training)
    assert not PUBLISH_KEYS & set(translate_training_keys(cfg.training))
