"""Hub models and datasets are keyed by the commit their revision resolves to, so a nightly retrain sees that `main`
moved. No machine here (nor CI) reaches the Hugging Face Hub, so huggingface_hub's real client asks a local stand-in
for the hub's HTTP API (tests/hub_standin.py), whose branches the tests move as a push upstream would.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from tests.support.hub_standin import HubStandIn
from tests.support.ports import free_port
from tuneline.config import load_config
from tuneline.data.cache_key import dataset_fingerprint, fingerprint_inputs
from tuneline.errors import ConfigError, DataError
from tuneline.hub.revision import forget_resolved_revisions, resolve_revision
from tuneline.model import model_fingerprint, tokenizer_fingerprint

TOKEN = "hf_standin_read_token"
FIRST, SECOND, CACHED = "1" * 40, "2" * 40, "c" * 40


@pytest.fixture
def hub(monkeypatch):
    """The stand-in as HF_ENDPOINT, online, with a fresh memo (as each new process has)."""
    with HubStandIn(TOKEN) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
        forget_resolved_revisions()
        yield hub
    forget_resolved_revisions()


def config(tmp_path, **keys):
    return load_config(None, {"model_name_or_path": "org/base", "dataset": "rows", "dataset_dir": str(tmp_path),
                              "output_dir": str(tmp_path / "out"), **keys}, check_paths=False)


def keys_of(cfg) -> tuple[str, str]:
    return model_fingerprint(cfg), tokenizer_fingerprint(cfg.model)


def test_model_and_tokenizer_keys_follow_main(hub, tmp_path):
    hub.set_head("org/base", FIRST)
    first = keys_of(config(tmp_path))
    assert keys_of(config(tmp_path)) == first and len(hub.info_requests) == 1, "asked once per process"

    forget_resolved_revisions()  # the next nightly run is a new process
    assert keys_of(config(tmp_path)) == first, "main did not move: every cached step still holds"
    hub.set_head("org/base", SECOND)
    forget_resolved_revisions()
    moved = keys_of(config(tmp_path))
    assert moved[0] != first[0] and moved[1] != first[1], "main moved: new model, new tokenizer"
    assert len(hub.info_requests) == 3


def test_a_pinned_commit_needs_no_request_and_keys_like_the_branch_at_it(hub, tmp_path):
    hub.set_head("org/base", FIRST)
    pinned = config(tmp_path, model_revision=FIRST)
    assert tokenizer_fingerprint(pinned.model) == tokenizer_fingerprint(pinned.model)
    model_fingerprint(pinned)
    assert hub.info_requests == []
    assert tokenizer_fingerprint(config(tmp_path).model) == tokenizer_fingerprint(pinned.model)


def test_hub_dataset_key_follows_its_revision(hub, tmp_path):
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "dataset_info.json").write_text(json.dumps({"rows": {"hf_hub_url": "org/rows"}}))
    cfg = config(tmp_path, model_name_or_path=str(tmp_path / "tokenizer"))
    hub.set_head("org/rows", FIRST, kind="datasets")
    assert fingerprint_inputs(cfg)["datasets"]["train:rows"]["revision"] == FIRST
    first = dataset_fingerprint(cfg)
    forget_resolved_revisions()
    assert dataset_fingerprint(cfg) == first
    hub.set_head("org/rows", SECOND, kind="datasets")
    forget_resolved_revisions()
    assert dataset_fingerprint(cfg) != first
    assert hub.info_requests[-1] == "/api/datasets/org/rows?expand=sha", "the default branch, and only its sha"


def cache_with_snapshot(root, repo_id: str, commit: str):
    """huggingface_hub's cache layout, as a download leaves it: refs/main names the commit of snapshots/<commit>."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "blobs").mkdir()
    (repo / "blobs" / "abc").write_text("{}")
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").symlink_to(repo / "blobs" / "abc")
    return root


@pytest.mark.parametrize("cut_off", ["HF_HUB_OFFLINE", "unreachable"])
def test_without_the_hub_the_key_takes_the_cached_commit_else_the_name(hub, tmp_path, monkeypatch, caplog, cut_off):
    if cut_off == "HF_HUB_OFFLINE":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    cache = cache_with_snapshot(tmp_path / "hub-cache", "org/base", CACHED)
    caplog.set_level(logging.WARNING, logger="tuneline.hub.revision")
    cached = config(tmp_path, cache_dir=str(cache))
    assert resolve_revision("org/base", "main", cache_dir=cache) == CACHED and caplog.records == []
    forget_resolved_revisions()
    pinned = config(tmp_path, model_revision=CACHED)
    assert tokenizer_fingerprint(cached.model) == tokenizer_fingerprint(pinned.model), "keyed as the online run was"

    assert resolve_revision("org/not-cached", "v2", cache_dir=cache) == "v2"
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "the cache key uses the revision's name, not a commit" in warnings[0]
    resolve_revision("org/not-cached", "v2", cache_dir=cache)
    assert len(caplog.records) == 1, "one warning per repo and process"
    assert hub.info_requests == []


def test_a_repo_or_revision_the_hub_does_not_have_is_the_users_to_fix(hub, tmp_path):
    hub.set_head("org/base", FIRST)
    with pytest.raises(ConfigError, match=rf"'model_name_or_path: org/missing': {hub.url} has no model repo"):
        model_fingerprint(config(tmp_path, model_name_or_path="org/missing"))
    with pytest.raises(ConfigError, match="has no revision 'no-such-branch'; set 'model_revision' to an existing"):
        tokenizer_fingerprint(config(tmp_path, model_revision="no-such-branch").model)
    with pytest.raises(ConfigError, match="'adapter_name_or_path: org/missing-adapter'"):
        model_fingerprint(config(tmp_path, adapter_name_or_path="org/missing-adapter", finetuning_type="lora"))
    (tmp_path / "dataset_info.json").write_text(json.dumps({"rows": {"hf_hub_url": "org/gone", "revision": "v1"}}))
    with pytest.raises(DataError, match=r"dataset 'rows' \('hf_hub_url: org/gone' in dataset_info.json\)"):
        dataset_fingerprint(config(tmp_path, model_name_or_path=str(tmp_path)))
    hub.set_head("org/gone", FIRST, kind="datasets")
    with pytest.raises(DataError, match="no revision 'v1'; set its 'revision' in dataset_info.json"):
        dataset_fingerprint(config(tmp_path, model_name_or_path=str(tmp_path)))


def test_resolving_a_hub_id_imports_no_torch_transformers_or_datasets(tmp_path):
    code = ("import sys; from tuneline.config import load_config; from tuneline.model import model_fingerprint, "
            "tokenizer_fingerprint; cfg = load_config(None, {'model_name_or_path': 'org/base', 'dataset': 'x'}, "
            "check_paths=False); model_fingerprint(cfg); tokenizer_fingerprint(cfg.model); "
            "heavy = {'torch', 'transformers', 'datasets'} & set(sys.modules); assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True,
                   env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)})
