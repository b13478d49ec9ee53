"""Generation for the API server: `Chat`'s model, prompt and settings, run with a streamer and a stop switch.

The prompt and generation settings are `Chat.prepare`'s and the config's, and one prompt is generated alone (no
padding), so a greedy answer is token for token `tuneline chat`'s. Streaming uses transformers' public streamer
hook (`generate(streamer=...)`) and stopping-criteria hook: a client that goes away sets the switch and generation
ends at the next token. Requests take turns through a semaphore of MAX_CONCURRENT (LLaMA-Factory's variable,
default 1): a CPU or a single GPU gains little from interleaving `generate` calls."""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

from tuneline.serving.openai_request import ChatRequest, bad_request

CONCURRENCY_ENV = "MAX_CONCURRENT"
FAILED = "error"  # the finish reason of an answer whose generation raised
logger = logging.getLogger("tuneline")


def concurrency() -> int:
    """MAX_CONCURRENT, checked (the server reads it before the model loads)."""
    from tuneline.errors import UserError

    given = os.environ.get(CONCURRENCY_ENV, "1")
    if not given.isdigit() or int(given) < 1:
        raise UserError(f"{CONCURRENCY_ENV}='{given}' must be a positive whole number (answers generated at once)",
                        title="cannot serve")
    return int(given)


@dataclass
class Piece:
    """A step of an answer: new text, or the end: the whole answer's text (cut at a stop string) and ids, and why it
    ended."""

    text: str = ""
    ids: list | None = None
    finish_reason: str | None = None


class Engine:
    def __init__(self, chat):
        self.chat = chat
        self.limit = _context_length(chat)
        self.turns = asyncio.Semaphore(concurrency())

    def prepared(self, request: ChatRequest):
        """(prompt, pixels, tool text, settings), or ApiError: a message, tool list or image the model cannot take."""
        from tuneline.errors import UserError

        try:
            prompt, pixels, tools = self.chat.prepare(request.messages, request.system, request.tools,
                                                      "the request's 'tools'", request.images)
        except UserError as exc:
            raise bad_request("; ".join(exc.problems)) from None
        if unknown := [token for token in request.logit_bias if not 0 <= token < len(self.chat.tokenizer)]:
            raise bad_request(f"'logit_bias' names token ids this model does not have: {unknown[:5]}; its "
                              f"vocabulary holds 0 to {len(self.chat.tokenizer) - 1}", param="logit_bias")
        if len(prompt) >= self.limit:
            raise bad_request(f"the prompt is {len(prompt)} tokens, and this model takes {self.limit} in all "
                              "(prompt and answer); shorten the messages", param="messages",
                              code="context_length_exceeded")
        return prompt, pixels, tools, self._settings(request, self.limit - len(prompt))

    def _settings(self, request: ChatRequest, room: int):
        settings = copy.deepcopy(self.chat.settings)
        if request.max_tokens is not None:
            settings.max_new_tokens = request.max_tokens
        settings.max_new_tokens = min(settings.max_new_tokens or room, room)
        if request.temperature is not None:
            settings.do_sample = request.temperature > 0
            if settings.do_sample:
                settings.temperature = request.temperature
        if request.top_p is not None and settings.do_sample:
            settings.top_p = request.top_p
        if request.logit_bias:
            settings.sequence_bias = {(token,): bias for token, bias in request.logit_bias.items()}
        return settings

    async def pieces(self, prompt, pixels, settings, stop: list[str]) -> AsyncIterator[Piece]:
        """The answer as it is generated; closing the iterator (a client gone) stops the generation."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        cancel = threading.Event()
        streamer = _TextSteps(self.chat, stop, cancel, lambda piece: loop.call_soon_threadsafe(queue.put_nowait, piece))
        async with self.turns:
            worker = loop.run_in_executor(None, self._generate, prompt, pixels, settings, streamer, cancel)
            finished = False
            try:
                while (piece := await queue.get()).finish_reason is None:
                    yield piece
                finished = True
                yield piece
            finally:
                cancel.set()
                if not finished:  # said once the generation has stopped, even if this task is being cancelled
                    worker.add_done_callback(lambda _: logger.info(
                        "the client left: generation stopped after %d of at most %d tokens", len(streamer.ids),
                        settings.max_new_tokens))
                await asyncio.wait([worker])

    def _generate(self, prompt, pixels, settings, streamer, cancel) -> None:
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        from tuneline.evaluation.scoring import to_device

        class Cancelled(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                return torch.full((input_ids.shape[0],), cancel.is_set(), dtype=torch.bool, device=input_ids.device)

        model = self.chat.model
        device = next(model.parameters()).device
        ids = torch.tensor([prompt], device=device)
        extra = to_device(pixels([0], len(prompt), True), device) if pixels else {}
        try:
            with torch.no_grad():
                model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=settings,
                               streamer=streamer, stopping_criteria=StoppingCriteriaList([Cancelled()]), **extra)
        except Exception as exc:  # ends this answer as an error; the server goes on
            logger.exception("generation failed")
            streamer.failure = f"generation failed: {exc!r}"
        finally:
            streamer.finish(settings.max_new_tokens)


class _TextSteps:
    """A transformers streamer: new token ids in, new text out, cut at the first eos or stop string. The text so far
    is decoded whole each step, so a character split over tokens comes out once complete."""

    def __init__(self, chat, stop: list[str], cancel: threading.Event, emit):
        self.chat, self.stop, self.cancel, self.emit = chat, stop, cancel, emit
        self.ids: list[int] = []
        self.sent, self.text, self.prompt_seen, self.ended = "", "", False, None
        self.failure: str | None = None

    def put(self, value) -> None:
        if not self.prompt_seen:  # generate hands over the prompt first
            self.prompt_seen = True
            return
        if self.ended:
            return
        for token in value.reshape(-1).tolist():
            if token in self.chat.eos_ids:
                self.ended = "stop"
                break
            self.ids.append(token)
        text = self.chat.tokenizer.decode(self.ids, skip_special_tokens=self.chat.skip_special_tokens).lstrip()
        if cut := [text.index(s) for s in self.stop if s in text]:
            text, self.ended = text[:min(cut)], "stop"
        if self.ended:
            self.cancel.set()
        new = text[len(self.sent):] if text.startswith(self.sent) else ""
        if new and not new.endswith("\ufffd"):
            self.sent = text
            self.emit(Piece(new))
        self.text = text

    def end(self) -> None:
        """transformers calls this when generation ends; `finish` reports the end with the reason."""

    def finish(self, max_new_tokens: int) -> None:
        if self.text.startswith(self.sent) and len(self.text) > len(self.sent):  # a last, incomplete character
            self.emit(Piece(self.text[len(self.sent):]))
        if self.failure:
            self.emit(Piece(text=self.failure, ids=list(self.ids), finish_reason=FAILED))
            return
        reason = self.ended or ("length" if len(self.ids) >= max_new_tokens else "stop")
        self.emit(Piece(text=self.text.strip(), ids=list(self.ids), finish_reason=reason))


def _context_length(chat) -> int:
    """The most tokens the model takes (its position embeddings), else the tokenizer's limit."""
    config = getattr(chat.model, "config", None)
    config = getattr(config, "get_text_config", lambda: config)()
    limit = getattr(config, "max_position_embeddings", None)
    return int(limit or getattr(chat.tokenizer, "model_max_length", 0) or 1 << 30)
