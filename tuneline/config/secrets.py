"""Which config keys hold credentials, so that their values never reach MLflow params, logs or model cards.

Judged by the key's last dotted component: keys that only name or count tokens (pad_token, max_new_tokens) are
settings."""

from __future__ import annotations

import re

MASK = "***"
_SECRET = re.compile(r"(token|secret|password|passwd|api_key|apikey|access_key|private_key)$", re.IGNORECASE)
_NOT_SECRET = re.compile(
    r"(^|_)(pad|eos|bos|unk|sep|cls|mask|special|chat|start|end|stop|image|video|audio)_token$", re.IGNORECASE
)


def is_secret(key: str) -> bool:
    last = key.rsplit(".", 1)[-1]
    return bool(_SECRET.search(last)) and not _NOT_SECRET.search(last)
