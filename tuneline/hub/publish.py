"""Publishing to the Hugging Face Hub (docs/serving-and-hub.md): the part that talks to the hub.

Unlike LLaMA-Factory, training never pushes; the flow's model-card step publishes once, so a cached rerun uploads
nothing and a failed upload leaves the trained, logged model as it is."""

from __future__ import annotations

import os
from pathlib import Path

from tuneline.config import RunConfig
from tuneline.config.validate import hub_repo_id
from tuneline.errors import UserError


def hub_token(config: RunConfig) -> str | None:
    """'hub_token', else huggingface_hub's own: HF_TOKEN, or the token `hf auth login` saved."""
    from huggingface_hub import get_token

    return config.training.get("hub_token") or get_token()


def hub_token_problems(config: RunConfig) -> list[str]:
    """Checked before training: without a token, publishing would fail only once training is done."""
    if not config.training.get("push_to_hub") or hub_token(config):
        return []
    return ["'push_to_hub: true' needs a Hugging Face token with write access: set HF_TOKEN, run `hf auth login`, "
            "or set 'hub_token'"]


def hub_endpoint() -> str:
    """HF_ENDPOINT as it is now (huggingface_hub reads it once, at import), else the hub's default."""
    from huggingface_hub import constants

    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or constants.ENDPOINT


def publish_folder(config: RunConfig, folder: Path) -> dict:
    """Upload `folder` where the config's hub keys say, as one commit: repo id, URL, commit id and URL."""
    training = config.training
    return upload_folder(folder, hub_repo_id(config), private=training.get("hub_private_repo"),
                         revision=training.get("hub_revision"), token=hub_token(config),
                         commit_message=f"Upload {config.run_name} (tuneline)")


def upload_folder(folder: Path, repo_id: str, *, private: bool | None, revision: str | None, token: str | None,
                  commit_message: str) -> dict:
    """Create the repo if missing (and the branch), upload the folder in one commit; any failure is one UserError
    naming the repo and the endpoint, never the token."""
    from huggingface_hub import HfApi
    from huggingface_hub.utils import httpx

    endpoint = hub_endpoint()
    api = HfApi(endpoint=endpoint, token=token)
    try:
        repo = api.create_repo(repo_id, private=private, exist_ok=True)
        if revision:
            api.create_branch(repo.repo_id, branch=revision, exist_ok=True)
        commit = api.upload_folder(repo_id=repo.repo_id, folder_path=folder, revision=revision,
                                   commit_message=commit_message)
    except (httpx.HTTPError, OSError, ValueError) as exc:
        raise UserError(f"'hub_model_id: {repo_id}' could not be published to {endpoint}: {_why(exc, token)}. The "
                        "trained model is kept (output_dir, and the MLflow run); run again once fixed, and only the "
                        "model-card step runs", title="publishing to the Hugging Face Hub failed") from None
    return {"repo_id": repo.repo_id, "url": str(repo), "commit": commit.oid, "commit_url": commit.commit_url}


def _why(exc: Exception, token: str | None) -> str:
    """What went wrong, in the hub's words where it answered; the token masked wherever it might be quoted."""
    status = getattr(getattr(exc, "response", None), "status_code", None)
    detail = " ".join(str(exc).split())
    if token:
        detail = detail.replace(token, "***")
    if status in (401, 403):
        return (f"the hub refused the token ({status}); use a token with write access to that namespace (HF_TOKEN, "
                "`hf auth login`, or 'hub_token')")
    if status is not None:
        return f"the hub answered {status} ({detail})"
    if isinstance(exc, ValueError):  # huggingface_hub's own checks, e.g. the card's metadata
        return detail
    return f"the hub is unreachable ({type(exc).__name__}: {detail}); check the network, or HF_ENDPOINT"
