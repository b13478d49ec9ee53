"""`tuneline api TARGET [key=value ...]`: serve a trained model to OpenAI clients (docs/serving-and-hub.md).

TARGET is a training config, models:/NAME@ALIAS, or a `tuneline export` folder. API_HOST (default 127.0.0.1,
where LLaMA-Factory binds 0.0.0.0: opening the port to the network is the user's choice), API_PORT (8000) and
API_KEY are read as LLaMA-Factory reads them. `infer_backend: vllm` hands an export to vLLM's own OpenAI server."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tuneline.config.serving_keys import vllm_engine_args
from tuneline.errors import UserError
from tuneline.serving.source import ServedTarget, load_chat, read_target

HOST_ENV, PORT_ENV = "API_HOST", "API_PORT"
logger = logging.getLogger("tuneline")


def host_and_port() -> tuple[str, int]:
    port = os.environ.get(PORT_ENV, "8000")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"{PORT_ENV}='{port}' is not a port number (1 to 65535)", title="cannot serve")
    return os.environ.get(HOST_ENV, "127.0.0.1"), int(port)


def serve(target: str, overrides: list[str]) -> int:
    """Check everything, load the model, serve until stopped (Ctrl+C)."""
    from tuneline.serving.engine import concurrency

    served = read_target(target, overrides)
    host, port = host_and_port()
    concurrency()
    if served.serving.infer_backend == "vllm":
        return _serve_with_vllm(served, host, port)
    import uvicorn

    from tuneline.serving.app import create_app

    with tempfile.TemporaryDirectory() as scratch:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
        chat = load_chat(served, Path(scratch))
        print(f"serving '{served.model_id}' ({chat.source or target}) at http://{host}:{port}/v1", flush=True)
        uvicorn.run(create_app(chat, served.model_id), host=host, port=port, log_level="info")
    return 0


def vllm_command(served: ServedTarget, host: str, port: int) -> list[str]:
    """`vllm serve` on the export, LLaMA-Factory's vllm_* keys as its flags (vllm_config's entries as more flags)."""
    engine = vllm_engine_args(served.serving, served.target, [])
    command = ["vllm", "serve", engine.pop("model"), "--host", host, "--port", str(port),
               "--served-model-name", served.model_id]
    for key, value in engine.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            command.append(flag)
        elif value is not False and value is not None:
            command += [flag, str(value)]
    if os.environ.get("API_KEY"):
        command += ["--api-key", os.environ["API_KEY"]]
    return command


def _serve_with_vllm(served: ServedTarget, host: str, port: int) -> int:
    command = vllm_command(served, host, port)
    if shutil.which(command[0]) is None:
        raise UserError("the `vllm` command is not on PATH; install vllm in this environment", title="cannot serve")
    shown = [part if part != os.environ.get("API_KEY") else "***" for part in command]
    print("serving with vLLM: " + " ".join(shown), flush=True)
    return subprocess.call(command, stdout=sys.stdout, stderr=sys.stderr)
