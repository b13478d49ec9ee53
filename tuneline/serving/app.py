"""The OpenAI-compatible app: `/v1/models` and `/v1/chat/completions` (plain and server-sent events), with a bearer
key when API_KEY is set (LLaMA-Factory's variable). Every refusal is OpenAI's error body with a 4xx status, and the
server goes on serving. (FastAPI is imported at the top: it reads the handlers' annotations from this module.)"""

from __future__ import annotations

import hmac
import json
import os
import time
import uuid

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from tuneline.serving.engine import FAILED, Engine, Piece
from tuneline.serving.openai_request import ApiError, ChatRequest, bad_request, read_request

KEY_ENV = "API_KEY"


def create_app(chat, model_id: str, api_key: str | None = None):
    """The FastAPI app serving `chat` as `model_id`; `api_key` defaults to API_KEY (none: no key asked)."""
    engine = Engine(chat)
    api_key = api_key if api_key is not None else os.environ.get(KEY_ENV) or None
    app = FastAPI(title="tuneline api")

    @app.exception_handler(ApiError)
    async def refused(request: Request, exc: ApiError):
        return JSONResponse(exc.body(), status_code=exc.status)

    async def check_key(request: Request):
        """A dependency, not a middleware: Starlette's HTTP middleware wraps `receive`, and a streamed answer
        would no longer see its client leave."""
        given = request.headers.get("authorization", "").encode()
        if api_key and not hmac.compare_digest(given, f"Bearer {api_key}".encode()):
            raise ApiError(401, "a missing or wrong API key: send 'Authorization: Bearer <API_KEY>'",
                           kind="authentication_error", code="invalid_api_key")

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models", dependencies=[Depends(check_key)])
    async def models():
        return {"object": "list", "data": [{"id": model_id, "object": "model", "created": int(time.time()),
                                            "owned_by": "tuneline"}]}

    @app.post("/v1/chat/completions", dependencies=[Depends(check_key)])
    async def completions(request: Request):
        try:
            body = await request.json()
        except ValueError:
            raise bad_request("the request body is not JSON") from None
        wanted = read_request(body, model_id)
        prompt, pixels, tools, settings = engine.prepared(wanted)
        pieces = engine.pieces(prompt, pixels, settings, wanted.stop)
        reply = _Reply(chat, model_id, len(prompt), tools)
        if wanted.stream:
            return StreamingResponse(_events(reply, pieces, wanted, request), media_type="text/event-stream")
        try:
            async for piece in pieces:
                if piece.finish_reason == FAILED:
                    raise ApiError(500, piece.text, kind="server_error")
                if piece.finish_reason:
                    return reply.completion(piece, wanted)
        finally:
            await pieces.aclose()  # its turn goes to the next request now, not when the generator is collected
        raise ApiError(500, "generation ended without an answer", kind="server_error")

    return app


class _Reply:
    """One answer's OpenAI objects: its id, the usage, the message with its tool calls read back."""

    def __init__(self, chat, model_id: str, prompt_tokens: int, tools: str | None):
        self.chat, self.model_id, self.prompt_tokens, self.tools = chat, model_id, prompt_tokens, tools
        self.id, self.created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

    def message(self, end: Piece, request: ChatRequest) -> tuple[dict, str]:
        """(the assistant message, finish_reason): the calls as `tool_calls` when the answer makes any."""
        answer = self.chat.read_answer(end.ids, self.tools)
        text = end.text if request.stop else answer.text
        if not answer.calls:
            return {"role": "assistant", "content": text}, end.finish_reason
        calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                  "function": {"name": call["name"], "arguments": _arguments(call["arguments"])}}
                 for call in answer.calls]
        return {"role": "assistant", "content": None, "tool_calls": calls}, "tool_calls"

    def completion(self, end: Piece, request: ChatRequest) -> dict:
        message, reason = self.message(end, request)
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model_id,
                "choices": [{"index": 0, "message": message, "finish_reason": reason}], "usage": self.usage(end)}

    def usage(self, end: Piece) -> dict:
        answer = len(end.ids or [])
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": answer,
                "total_tokens": self.prompt_tokens + answer}

    def chunk(self, delta: dict, reason: str | None = None, usage: dict | None = None) -> str:
        data = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model_id,
                "choices": [{"index": 0, "delta": delta, "finish_reason": reason}]}
        if usage is not None:
            data["usage"] = usage
        return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def _events(reply: _Reply, pieces, request: ChatRequest, connection: Request):
    """Server-sent events as OpenAI streams them. With tools offered, the answer is held until it ends, then sent as
    `tool_calls` or as text: a call's text is never streamed as content. The connection is asked at each piece
    whether the client is still there (a response left unread is not closed before garbage collection)."""
    try:
        yield reply.chunk({"role": "assistant", "content": ""})
        async for piece in pieces:
            if await connection.is_disconnected():
                return
            if piece.finish_reason is None:
                if not reply.tools:
                    yield reply.chunk({"content": piece.text})
                continue
            if piece.finish_reason == FAILED:
                yield f"data: {json.dumps(ApiError(500, piece.text, kind='server_error').body())}\n\n"
                return
            message, reason = reply.message(piece, request)
            if message.get("tool_calls"):
                calls = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
                yield reply.chunk({"tool_calls": calls})
            elif reply.tools:
                yield reply.chunk({"content": message["content"]})
            yield reply.chunk({}, reason, reply.usage(piece))
        yield "data: [DONE]\n\n"
    finally:
        await pieces.aclose()  # a client gone mid-stream: its generation stops here


def _arguments(arguments) -> str:
    """OpenAI sends a call's arguments as JSON text."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
