"""The commit a hub id stands for now, so cache keys follow the hub: a moved `main` is new content, an unmoved one
keeps every cached step.

Where the hub cannot answer (offline, slow, failing), the key takes the commit huggingface_hub's cache holds for that
revision, so an offline rerun keys like the online run that downloaded it, else the revision's name, with one
warning. HF_ENDPOINT and the offline switch are read when asked, not when huggingface_hub was imported."""

from __future__ import annotations

import logging
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from tuneline.config.args import ModelArgs
from tuneline.errors import ConfigError, UserError

COMMIT = re.compile(r"[0-9a-f]{40}")
LOOKUP_TIMEOUT_S = 5  # a hub slower than this is taken as unreachable: the key falls back and the run goes on
log = logging.getLogger(__name__)
_resolved: dict[tuple, str | None] = {}
_resolved_lock = threading.Lock()


@dataclass(frozen=True)
class HubNaming:
    """How a refusal names a hub id: where it came from, which key picks its revision, where its token comes from,
    and the error type (a model's config, or a dataset's registry entry)."""

    named: str
    revision_key: str = "'model_revision'"
    token_hint: str = "HF_TOKEN, `hf auth login`, or 'hf_hub_token'"
    error: type[UserError] = ConfigError


def resolve_revision(repo_id: str, revision: str | None, *, repo_type: str = "model", token: str | None = None,
                     cache_dir: str | Path | None = None, naming: HubNaming | None = None) -> str | None:
    """The commit `revision` of `repo_id` is at now (None: the default branch), memoised per process.

    Raises `naming.error` when the hub answers that the repo or revision does not exist; a string that cannot be a repo
    id (a missing local path, an API URL) is returned as is."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if revision and COMMIT.fullmatch(revision):
        return revision
    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        return revision
    from tuneline.hub.publish import hub_endpoint

    memo_key = (hub_endpoint(), repo_type, repo_id, revision)
    with _resolved_lock:
        if memo_key in _resolved:
            return _resolved[memo_key]
    naming = naming or HubNaming(f"'{repo_id}'")
    commit = _ask_hub(memo_key, token, naming)
    if commit is None:
        commit = _cached_commit(repo_id, repo_type, revision or "main", cache_dir)
        if commit is None:
            log.warning("%s at revision %r: the cache key uses the revision's name, not a commit, so a change on "
                        "the hub goes unseen until it is reachable again", naming.named, revision or "main")
            commit = revision
    with _resolved_lock:
        _resolved[memo_key] = commit
    return commit


def model_commit(model_args: ModelArgs, repo_id: str, key: str, revision: str | None = None) -> str | None:
    """A model-side hub id (the base model, an adapter, a reward model) at its commit, read with the config's token
    and cache folder as loading reads it; `key` names the config key that gave it."""
    return resolve_revision(repo_id, revision, token=model_args.hf_hub_token, cache_dir=model_args.cache_dir,
                            naming=HubNaming(f"'{key}: {repo_id}'"))


def forget_resolved_revisions() -> None:
    """Ask the hub again on the next call, as a new process would."""
    with _resolved_lock:
        _resolved.clear()


def hub_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) as set now; huggingface_hub reads it once, at import."""
    from huggingface_hub import constants

    now = (os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or "").upper()
    return constants.is_offline_mode() or now in {"1", "ON", "YES", "TRUE"}


def _ask_hub(memo_key: tuple, token: str | None, naming: HubNaming) -> str | None:
    """The hub's commit for the revision; None where the hub cannot answer; `error` where it says there is none."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError
    from huggingface_hub.utils import httpx

    endpoint, repo_type, repo_id, revision = memo_key
    named, error, token_hint = naming.named, naming.error, naming.token_hint
    if hub_offline():
        log.info("%s: HF_HUB_OFFLINE is set, the key takes the cached commit of %r", named, revision or "main")
        return None
    api = HfApi(endpoint=endpoint, token=token)
    info = api.model_info if repo_type == "model" else api.dataset_info
    try:
        return info(repo_id, revision=revision, timeout=LOOKUP_TIMEOUT_S, expand=["sha"]).sha
    except GatedRepoError:
        raise error(f"{named} is a gated repo on {endpoint}: accept its conditions on its page and use a token of "
                    f"that account ({token_hint})") from None
    except RepositoryNotFoundError:
        raise error(f"{named}: {endpoint} has no {repo_type} repo '{repo_id}' that this token can read; fix the "
                    "name (or point it at a local folder), or, for a private repo, use a token that can read it "
                    f"({token_hint})") from None
    except RevisionNotFoundError:
        raise error(f"{named}: '{repo_id}' on {endpoint} has no revision '{revision}'; set {naming.revision_key} to an "
                    "existing branch, tag or commit") from None
    except HfHubHTTPError as exc:
        if exc.response.status_code in (401, 403):
            raise error(f"{named}: {endpoint} refused the token ({exc.response.status_code}); use a valid token "
                        f"({token_hint}), or none for a public repo") from None
        log.info("%s: the hub answered %s, the key falls back", named, exc.response.status_code)
    except (httpx.HTTPError, OSError) as exc:
        log.info("%s: the hub is unreachable (%s), the key falls back", named, type(exc).__name__)
    return None


def _cached_commit(repo_id: str, repo_type: str, revision: str, cache_dir: str | Path | None) -> str | None:
    """The commit huggingface_hub's cache records for `revision` (its refs), if it holds the repo."""
    from huggingface_hub import CacheNotFound, scan_cache_dir

    try:
        cache = scan_cache_dir(cache_dir)
    except CacheNotFound:
        return None
    for repo in cache.repos:
        if repo.repo_id == repo_id and repo.repo_type == repo_type:
            for cached in repo.revisions:
                if revision in cached.refs:
                    return cached.commit_hash
    return None
