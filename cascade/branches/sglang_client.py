"""Backend client for an SGLang server: its OpenAI chat route, plus native extras.

- Every request carries `rid` (SGLang's request id; the chat route accepts it as an extra field and
  echoes it as the completion id). It is the branch's `request_id`, or a fresh uuid when that is empty.
  SGLang refuses a rid already in flight (400 `Duplicate request ID detected`) and aborts every request
  whose rid *starts with* the rid it is given, so the rids of one client request must be distinct and
  prefix-free: cascade/tiers/upstream.py makes them so (a bare uuid, the fallback here, is too).
- A stream closed (or failed, unless the engine refused it) before its finish chunk is aborted upstream
  at once with `POST /abort_request {"rid": ...}`, instead of SGLang noticing the closed connection
  later (~2 s) and generating for nobody until then.
- `finish_reason: "abort"` (SGLang's answer to an abort) is passed through as is.
- SGLang extras (`reasoning_content`, `matched_stop`, `usage.reasoning_tokens`, `prompt_tokens_details`,
  ids without `chatcmpl-`) are tolerated by the lenient decoding of the OpenAI client;
  `reasoning_content` is read. A mid-stream `data: {"error": {...}}` is raised as the error it reports.
- Health uses `GET /health`, which on SGLang runs a one-token probe and answers 503 while warming up;
  it takes 1-20 s (SGLANG_HEALTH_CHECK_TIMEOUT), so its timeout is its own (`timeouts.health_s`, 30 s).
Wire format: tests/fixtures/sglang/README.md (read from SGLang's source).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing, suppress

import msgspec

from cascade.branches.backend import GenerationRequest, StreamDelta
from cascade.branches.openai_client import OpenAIBackend
from cascade.config import Timeouts
from cascade.errors import BackendUnavailable, CascadeError, InvalidRequest, Overloaded

_TIMEOUTS = Timeouts()
# Forwarded OpenAI fields (schemas.PASSTHROUGH) that SGLang's ChatCompletionRequest does not declare, so that it
# would drop them without a word: not sent (tests/contract/ checks every body against SGLang's model).
# `metadata` tags a stored completion at OpenAI; it never changes an answer.
_SGLANG_UNKNOWN = frozenset({"metadata"})
# What the OpenAI client raises for an error status or an in-band error (cascade/branches/openai_wire.py), and
# for a refused connection: SGLang has nothing in flight under the rid then. Timeouts and cut streams do abort.
_NOT_RUNNING = (InvalidRequest, Overloaded, BackendUnavailable)


class SGLangBackend(OpenAIBackend):
    def __init__(
        self, name: str, url: str, model: str, timeouts: Timeouts = _TIMEOUTS, api_key: str = ""
    ) -> None:
        super().__init__(name, url, model, timeouts, api_key, provider="sglang")
        # Aborts run as their own tasks: the code that triggers them is often being cancelled itself
        # (anyio cancel scopes re-cancel every await inside them), and the abort must still go out.
        self._pending_aborts: set[asyncio.Task[None]] = set()

    def _body(self, request: GenerationRequest) -> bytes:
        if not _SGLANG_UNKNOWN.isdisjoint(request.extra):
            extra = {k: v for k, v in request.extra.items() if k not in _SGLANG_UNKNOWN}
            request = msgspec.structs.replace(request, extra=extra)
        body = super()._body(request)
        # The OpenAI body is one compact JSON object: append `rid` as its last field.
        return body[:-1] + b',"rid":' + msgspec.json.encode(request.request_id) + b"}"

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[StreamDelta, None]:
        request = _with_rid(request)
        finished = False
        async with aclosing(super().stream(request)) as deltas:
            try:
                async for delta in deltas:
                    finished = finished or delta.finish_reason is not None
                    yield delta
            except _NOT_RUNNING:
                # The engine refused the request, ended it with an in-band error, or was not there: nothing of
                # ours runs under that rid, which may be another request's (a refused duplicate), so no abort.
                finished = True
                raise
            finally:
                # Before closing the connection, which a cancellation may interrupt.
                if not finished:
                    self._abort_soon(request.request_id)

    def _abort_soon(self, rid: str) -> None:
        task = asyncio.get_running_loop().create_task(self.abort(rid))
        self._pending_aborts.add(task)
        task.add_done_callback(self._pending_aborts.discard)

    async def abort(self, rid: str) -> None:
        """Stop generation `rid` upstream. Best effort: SGLang answers 200 even for unknown or finished
        rids, and if the abort is lost SGLang still stops a request whose client went away, later."""
        if not rid:
            return
        with suppress(CascadeError):
            await self.request("POST", "/abort_request", msgspec.json.encode({"rid": rid}), self.timeouts.connect_s)

    async def health(self) -> bool:
        """SGLang's /health runs a one-token probe (1-20 s), so it gets `timeouts.health_s` (default 30 s)."""
        try:
            status, _ = await self.request("GET", "/health", timeout_s=self.timeouts.health_s)
        except CascadeError:
            return False
        return status == 200

    async def aclose(self) -> None:
        """Let aborts already scheduled go out (bounded by the connect timeout), then close."""
        if self._pending_aborts:
            await asyncio.wait(self._pending_aborts, timeout=self.timeouts.connect_s)
        await super().aclose()


def _with_rid(request: GenerationRequest) -> GenerationRequest:
    if request.request_id:
        return request
    return msgspec.structs.replace(request, request_id=uuid.uuid4().hex)
