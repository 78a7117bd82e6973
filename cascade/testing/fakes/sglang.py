"""A fake SGLang server for tests: SGLang's OpenAI chat route in SGLang's own shapes, plus its native
`POST /abort_request`, `GET /health` and `GET /get_model_info` (wire format: tests/fixtures/sglang/README.md).

Scripting is `FakeEngine`'s (a `FakeScript`, overridable per request by a ``[fake ...]`` directive);
`reasoning` adds reasoning tokens, streamed as `reasoning_content` before the answer. A request with `tools`
gets a tool call, and one with `logprobs` token logprobs (`top_logprobs` alternatives each), in SGLang's shapes
(cascade/testing/fakes/sglang_shapes.py; tests/contract/ checks them against SGLang's own models).
Like SGLang, it keeps generating for a client that went away and stops only `disconnect_abort_s`
later (SGLang aborts those from a background task), so that a generation stops at once only when
someone posts its rid to `/abort_request`. `GET /fake/stats` lists the rids aborted, with the number
of tokens each had generated when it stopped, which is how tests prove that an abort stopped it.
`max_running` batch slots queue the requests beyond them, and `GET /metrics` publishes the queue, the running
requests and TTFTs in SGLang's own metric names (cascade/testing/fakes/sglang_metrics.py).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from cascade.engines.asgi import Receive, Scope, Send, read_body, send_json
from cascade.testing.fakes import sglang_shapes as shapes
from cascade.testing.fakes.answers import max_new_tokens
from cascade.testing.fakes.engine import FakeEngine, FakeStats
from cascade.testing.fakes.script import FakeScript, script_for, token_pieces
from cascade.testing.fakes.sglang_metrics import FakeScheduler

EOS_TOKEN_ID = shapes.EOS_TOKEN_ID  # reported as `matched_stop` when a generation ends on its own
_encode = msgspec.json.Encoder().encode


class FakeSGLangStats(FakeStats):
    # rids posted to /abort_request, in order
    abort_requests: list[str] = msgspec.field(default_factory=list)
    # rid -> tokens it had generated when an abort stopped it
    aborted: dict[str, int] = msgspec.field(default_factory=dict)


class Generation:
    """One request in flight. `stop` ends it early: "abort" (/abort_request) or "disconnect"."""

    def __init__(self, rid: str, prompt_tokens: int = shapes.PROMPT_TOKENS, max_new_tokens: int = 0) -> None:
        self.rid = rid
        self.prompt_tokens = prompt_tokens
        self.max_new_tokens = max_new_tokens  # the request's limit (0: it named none)
        self.tokens = 0
        self.reason = ""
        self.stopped = asyncio.Event()

    def stop(self, reason: str) -> None:
        if not self.stopped.is_set():
            self.reason = reason
            self.stopped.set()


class FakeSGLang(FakeEngine):
    stats: FakeSGLangStats

    def __init__(
        self, script: FakeScript | None = None, reasoning: str = "", disconnect_abort_s: float = 2.0,
        max_running: int = 0, itl_batch_slope: float = 0.0,
    ) -> None:
        # itl_batch_slope: each token's wait grows with the requests running (FakeEngine's; the batch here is the
        # scheduler's running requests).
        super().__init__(script, max_running=max_running, itl_batch_slope=itl_batch_slope)
        # Batch slots (max_running > 0: the rest queue) and /metrics in SGLang's names: sglang_metrics.py.
        self.scheduler = FakeScheduler(lambda: self.script.model, max_running)
        self.stats = FakeSGLangStats()
        self.reasoning = reasoning
        self.disconnect_abort_s = disconnect_abort_s
        self.warming = False  # True: /health answers 503, as SGLang does until its warm-up request ran
        self.max_total_num_tokens = 65536  # the KV cache size /server_info reports
        self._running: dict[str, Generation] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = (scope.get("method"), scope.get("path")) if scope["type"] == "http" else None
        if route in (("GET", "/health"), ("GET", "/health_generate")):
            await _empty(send, 503 if self.warming else 200)
        elif route == ("GET", "/get_model_info"):
            await send_json(send, 200, {"model_path": self.script.model, "tokenizer_path": self.script.model,
                                    "is_generation": True, "preferred_sampling_params": None,
                                    "weight_version": "default"})
        elif route == ("POST", "/abort_request"):
            await self._abort(receive, send)
        elif route == ("GET", "/server_info"):  # not the deprecated /get_server_info (404 here, as on a future SGLang)
            await send_json(send, 200, {"max_total_num_tokens": self.max_total_num_tokens, "version": "fake"})
        elif route == ("GET", "/metrics"):
            await self.scheduler.send_metrics(send)
        elif route == ("POST", "/v1/chat/completions"):
            await self.scheduler.run(self._chat, receive, send)
        else:
            await super().__call__(scope, receive, send)

    async def _abort(self, receive: Receive, send: Send) -> None:
        body = _object(await read_body(receive)) or {}
        rid = str(body.get("rid") or "")
        self.stats.abort_requests.append(rid)
        # SGLang (TokenizerManager.abort_request, Scheduler.abort_request): an empty rid is ignored; else the
        # abort goes on only when that exact rid is in flight and not aborted yet, and then stops every request
        # whose rid *starts with* it. Always 200.
        target = self._running.get(rid)
        if body.get("abort_all") or (target is not None and not target.stopped.is_set()):
            for generation in list(self._running.values()):
                if body.get("abort_all") or generation.rid.startswith(rid):
                    generation.stop("abort")
        await _empty(send, 200)

    async def _chat(self, receive: Receive, send: Send) -> None:
        self.stats.requests += 1
        body = _object(await read_body(receive))
        if body is None or not body.get("messages"):
            await _error(send, 400, "Messages cannot be empty.", "BadRequestError")
            return
        script = script_for(self.script, body)
        if script.status != 200:
            await _error(send, script.status, f"scripted failure {script.status}", "InternalServerError")
            return
        try:
            tokens, finish = self.plan(body, script)
        except ValueError as exc:  # a request the engine refuses (the GPU emulator: a prompt longer than its KV cache)
            await _error(send, 400, str(exc), "BadRequestError")
            return
        generation = Generation(str(body.get("rid") or uuid.uuid4().hex), self.prompt_tokens(body),
                                 max_new_tokens(body, 0))
        if generation.rid in self._running:
            # SGLang's TokenizerManager raises ValueError for a rid already in flight, and its OpenAI chat route
            # answers any ValueError raised before the first chunk with a 400 in this shape (stream or not).
            await _error(send, 400, f"Duplicate request ID detected: {generation.rid}", "BadRequestError")
            return
        head = {"id": generation.rid, "object": "chat.completion.chunk", "created": int(time.time()),
                "model": body.get("model") or script.model}
        self._running[generation.rid] = generation
        self.stats.in_flight += 1
        watcher = asyncio.create_task(self._watch(receive, generation))
        try:
            if body.get("stream"):
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                await self._send_stream(send, generation, script, tokens, finish, head, include_usage, body)
            else:
                await self._send_completion(send, generation, script, tokens, finish, head, body)
        finally:
            watcher.cancel()
            self.stats.in_flight -= 1
            self._running.pop(generation.rid, None)
            if generation.reason == "abort":
                self.stats.aborted[generation.rid] = generation.tokens

    def plan(self, body: dict[str, Any], script: FakeScript) -> tuple[list[shapes.Step], str]:
        """The tokens this request generates and its finish reason if nothing stops it (a subclass's seam: the GPU
        emulator plans from its answer source)."""
        thoughts = token_pieces(FakeScript(answer=self.reasoning), 1 << 30) if self.reasoning else []
        answer = token_pieces(script, 1 << 30)
        tool = shapes.tool_to_call(body)  # a request with tools gets a call of one (sglang_shapes.py)
        planned = [("reasoning_content", t) for t in thoughts] + (
            shapes.tool_steps(tool, "".join(answer)) if tool is not None else [("content", p) for p in answer])
        max_tokens = max_new_tokens(body, 1 << 30)
        return planned[:max_tokens], "length" if len(planned) > max_tokens else "stop"

    def prompt_tokens(self, body: dict[str, Any]) -> int:
        """The prompt tokens usage reports (a subclass's seam; here always shapes.PROMPT_TOKENS)."""
        return shapes.PROMPT_TOKENS

    async def _watch(self, receive: Receive, generation: Generation) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        await asyncio.sleep(self.disconnect_abort_s)
        generation.stop("disconnect")

    async def produce(
        self, generation: Generation, script: FakeScript, tokens: list[tuple[str, str]],
        emit: Callable[[str, str], Awaitable[None]] | None = None,
    ) -> None:
        """Generate tokens on the scripted schedule until all are out or the generation is stopped;
        `emit(field, text)` sends each one (streams only). A subclass's seam: the GPU emulator times them."""
        start, offset_ms = time.perf_counter(), script.ttft_ms
        for i, (field, text) in enumerate(tokens):
            offset_ms += self.itl_now(script, self.scheduler.running) if i else 0.0
            due = start + offset_ms / 1000
            delay = None if i == script.stall_after else due - time.perf_counter()  # None: stall
            if delay is None or delay > 0:
                try:
                    async with asyncio.timeout(delay):
                        await generation.stopped.wait()
                except TimeoutError:
                    pass
            if generation.stopped.is_set():
                return
            generation.tokens += 1
            self.stats.tokens_sent += 1
            if emit is not None:
                await emit(field, text)

    async def _send_stream(
        self, send: Send, generation: Generation, script: FakeScript, tokens: list[tuple[str, str]],
        finish: str, head: dict[str, Any], include_usage: bool, body: dict[str, Any],
    ) -> None:
        self.stats.streams_started += 1
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        top, call_id = shapes.top_logprobs(body), shapes.new_call_id()

        async def emit(kind: str, text: str) -> None:
            logprobs = None if top is None else {"content": [shapes.logprob_entry(text, script.logprob, top)]}
            await _sse(send, shapes.step_chunks(head, kind, text, call_id, logprobs))

        await _sse(send, [shapes.chunk(head, {"reasoning_content": None, "role": "assistant", "content": ""})])
        await self.produce(generation, script, tokens, emit)
        if generation.reason == "disconnect":
            self.stats.streams_cancelled += 1
            return
        out = tokens[: generation.tokens]
        finish = "abort" if generation.reason == "abort" else finish
        # The stream's finish chunk keeps the matched stop token even when it reports "tool_calls".
        tail = [shapes.chunk(head, {"reasoning_content": None}, shapes.finish_reason(out, finish),
                             matched_stop=EOS_TOKEN_ID if finish == "stop" else None)]
        if include_usage:
            tail.append(shapes.usage_chunk(head, out, generation.prompt_tokens))
        await _sse(send, tail, done=True)
        self.stats.streams_finished += 1

    async def _send_completion(
        self, send: Send, generation: Generation, script: FakeScript, tokens: list[tuple[str, str]],
        finish: str, head: dict[str, Any], body: dict[str, Any],
    ) -> None:
        await self.produce(generation, script, tokens)
        if generation.reason == "disconnect":
            return
        finish = "abort" if generation.reason == "abort" else finish
        completion = shapes.completion(head, tokens[: generation.tokens], finish, shapes.new_call_id(),
                                       script.logprob, shapes.top_logprobs(body), generation.prompt_tokens)
        await send_json(send, 200, completion)


async def _sse(send: Send, chunks: list[dict[str, Any]], done: bool = False) -> None:
    payload = b"".join(b"data: " + _encode(c) + b"\n\n" for c in chunks)
    if done:
        payload += b"data: [DONE]\n\n"
    await send({"type": "http.response.body", "body": payload, "more_body": not done})


async def _error(send: Send, status: int, message: str, kind: str) -> None:
    error = {"object": "error", "message": message, "type": kind, "param": None, "code": status}
    await send_json(send, status, error)


async def _empty(send: Send, status: int) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})


def _object(raw: bytes) -> dict[str, Any] | None:
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None
    return body if isinstance(body, dict) else None
