"""Backend client for an SGLang server: its OpenAI chat route, plus native extras.

- Every request carries `rid` (SGLang's request id; the chat route accepts it as an extra field),
  so that a branch we stop early is aborted upstream with `POST /abort_request {"rid": ...}` at
  once, instead of SGLang noticing the closed connection later.
- `finish_reason: "abort"` (SGLang's answer to an abort) is passed through as is.
- Health uses `GET /health`, which on SGLang runs a one-token probe and answers 503 while warming up.
Wire format: tests/fixtures/sglang/README.md (read from SGLang's source).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing

import httpx
import msgspec

from cascade.branches.backend import GenerationRequest, GenerationResult, StreamDelta
from cascade.branches.openai_client import OpenAIBackend


class SGLangModelInfo(msgspec.Struct):
    model_path: str = ""
    tokenizer_path: str | None = None
    is_generation: bool = True


class SGLangBackend(OpenAIBackend):
    # Aborts run as their own tasks: the code that triggers them is often being cancelled itself
    # (anyio cancel scopes re-cancel every await inside them), and the abort must still go out.
    _pending_aborts: set[asyncio.Task[None]] = set()

    def _body(self, request: GenerationRequest, stream: bool) -> bytes:
        body = msgspec.json.decode(super()._body(request, stream))
        if request.request_id:
            body["rid"] = request.request_id
        return msgspec.json.encode(body)

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        try:
            return await super().generate(request)
        except BaseException:
            # Cancelled (client gone) or failed mid-way: make sure the engine stops too.
            self._abort_soon(request.request_id)
            raise

    async def stream(self, request: GenerationRequest) -> AsyncIterator[StreamDelta]:
        finished = False
        try:
            async with aclosing(super().stream(request)) as deltas:
                async for delta in deltas:
                    if delta.finish_reason is not None:
                        finished = True
                    yield delta
        finally:
            if not finished:
                self._abort_soon(request.request_id)

    def _abort_soon(self, rid: str) -> None:
        task = asyncio.get_running_loop().create_task(self.abort(rid))
        self._pending_aborts.add(task)
        task.add_done_callback(self._pending_aborts.discard)

    async def abort(self, rid: str) -> None:
        """Best effort: SGLang answers 200 even for unknown rids, so failures here are only logged."""
        if not rid:
            return
        try:
            await self._client.post(f"{self.url}/abort_request", json={"rid": rid}, timeout=self.timeouts.connect_s)
        except httpx.HTTPError:
            pass

    async def model_info(self) -> SGLangModelInfo:
        response = await self._client.get(f"{self.url}/get_model_info", timeout=self.timeouts.connect_s)
        response.raise_for_status()
        return msgspec.json.decode(response.content, type=SGLangModelInfo)

    async def health(self) -> bool:
        try:
            response = await self._client.get(f"{self.url}/health", timeout=self.timeouts.read_s)
        except httpx.HTTPError:
            return False
        return response.status_code == 200
