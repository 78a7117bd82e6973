"""A deterministic fake OpenAI-compatible engine, for tests, fault injection and load tests.

It is a plain ASGI app (cascade/engines/asgi.py: no framework, so that it costs little CPU next
to what it measures). Behaviour comes from its `FakeScript` (cascade/testing/fakes/script.py: the
per-request ``[fake ...]`` directives and the `fault` modes that make it misbehave on the wire the
way real upstreams do); this module serves it: the routes, the token stream and the faults' bytes.

Bytes that are not HTTP cannot come from an ASGI app: cascade/testing/fakes/garbage.py is a raw TCP
server for that (``cascade fake-server --fault garbage``). A benchmark changes the default script at
run time with ``POST /fake/script`` (a JSON object of FakeScript fields; ``GET`` returns the script),
e.g. ``{"fault": "kill_mid"}`` then ``{"fault": ""}``.

`FakeEngine.stalled = True` (settable at any time) makes it an engine hung in a step: it accepts connections and
reads requests but answers nothing, `/health` and `/v1/models` included, until the client goes away (`/fake/*`
still answers).

`prefix_cache` (``--prefix-cache-tokens N --cached-ttft-ms T``) makes it an engine with a prefix cache
(cascade/testing/fakes/prefix_cache.py): a prompt whose leading messages it has seen starts sooner, and its usage
reports `prompt_tokens_details.cached_tokens`; /fake/stats then counts prompt and cached tokens.

A script's `usage` (``[fake usage={...}]``) replaces the usage it reports, streamed or not: an engine that lies about
its counts.

`reasoning` makes it a reasoning engine: that text's words come first, as reasoning tokens, under `reasoning_field`
(vLLM's `reasoning` since 2026 by default; `reasoning_content` as older vLLM, llama.cpp and SGLang send it), streamed
or whole, within the request's max_tokens; its usage counts them among the completion tokens and reports no reasoning
count of its own (as vLLM), so that a gateway in front counts them itself.

`GET /fake/stats` reports how many streams started, finished and were cancelled by the client,
which is how tests prove that a client disconnect stops generation upstream, and how many requests
were answered with each fault (``status_N`` for a scripted error status).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

import msgspec

from cascade.engines.asgi import Receive, Scope, Send, disconnected_within, read_body, send_bytes, send_json
from cascade.testing.fakes.prefix_cache import PrefixCache
from cascade.testing.fakes.script import (
    FakeScript,
    batch_itl_ms,
    logprob_entries,
    script_for,
    token_pieces,
    tokens_before_break,
)

# FakeScript is part of this module's API: tests build an engine from one.
__all__ = ["FakeEngine", "FakeScript", "FakeStats", "serve"]

_HTML = (b"<html><head><title>502 Bad Gateway</title></head><body><center><h1>502 Bad Gateway</h1></center>"
         b"<hr><center>nginx</center></body></html>\n")


class FakeStats(msgspec.Struct):
    requests: int = 0
    streams_started: int = 0
    streams_finished: int = 0
    streams_cancelled: int = 0
    requests_cancelled: int = 0  # non-streaming requests whose client went away first
    in_flight: int = 0
    peak_in_flight: int = 0  # most requests generating at once (tests of admission limits)
    tokens_sent: int = 0
    logprobs_requests: int = 0  # requests that asked for token logprobs
    faults: dict[str, int] = msgspec.field(default_factory=dict)  # requests answered with each fault
    prompt_tokens: int = 0  # with a prefix cache: prompt tokens of the requests answered
    cached_tokens: int = 0  # ... of which the prefix cache held
    cache_hits: int = 0  # requests that found some of their prompt in the prefix cache


class _InBatch:
    """One request's place in `in_flight`. A stream leaves the batch the moment its client disconnects, as a
    real engine aborts on disconnect, not when its token loop next wakes (which lags on loaded cores and would
    count a cancelled branch beside the one its freed slot admitted)."""

    __slots__ = ("_left", "_stats")

    def __init__(self, stats: FakeStats) -> None:
        self._stats, self._left = stats, False
        stats.in_flight += 1
        stats.peak_in_flight = max(stats.peak_in_flight, stats.in_flight)

    def leave(self) -> None:
        if not self._left:
            self._left = True
            self._stats.in_flight -= 1


class _Prompt(msgspec.Struct, frozen=True):
    prompt_tokens: int
    cached_tokens: int | None = None  # None: no prefix cache (usage says nothing of one)

    def usage(self, completion_tokens: int) -> dict[str, Any]:
        usage: dict[str, Any] = {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion_tokens,
                                 "total_tokens": self.prompt_tokens + completion_tokens}
        if self.cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return usage


def _reported_usage(script: FakeScript, prompt: _Prompt, completion_tokens: int) -> dict[str, Any]:
    """The usage the engine reports: its counts, or the script's lie (`usage`: a broken or lying engine)."""
    return prompt.usage(completion_tokens) if script.usage is None else script.usage


class _Killed(Exception):
    """kill_mid: raised after the response started, so that uvicorn closes the connection mid-body."""


class _QuietKills(logging.Filter):
    """Keep uvicorn's "Exception in ASGI application" traceback out of the log for deliberate kills."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], _Killed))


_QUIET_KILLS = _QuietKills()


_chunk_encoder = msgspec.json.Encoder()


ScriptHook = Callable[[FakeScript, dict[str, Any]], FakeScript]


class FakeEngine:
    """The ASGI app. `script` is the default behaviour; `stats` is read by tests.

    `max_running` > 0 makes it an engine of that many batch slots (SGLang's --max-running-requests): a request
    beyond them waits for a free one before its first token, so its TTFT grows with the queue, as on a real
    engine at capacity. `itl_batch_slope` > 0 makes its time between tokens grow with the streams decoding at once
    (script.batch_itl_ms: `itl_ms` x (1 + slope x (batch - 1)), read at every token of a stream and at the
    start of a non-streamed answer), so that a fuller batch decodes each stream slower, as on a real engine.
    `hook` (benchmarks) may change each request's script from its body, e.g. answer a dataset question as a
    labelled outcome says that model did. `stalled`: see the module docstring."""

    def __init__(self, script: FakeScript | None = None, max_running: int = 0, hook: ScriptHook | None = None,
                 itl_batch_slope: float = 0.0, stalled: bool = False, prefix_cache: PrefixCache | None = None,
                 reasoning: str = "", reasoning_field: str = "reasoning") -> None:
        if itl_batch_slope < 0:
            raise ValueError(f"itl_batch_slope must be >= 0, got {itl_batch_slope:g}")
        self.script = script or FakeScript()
        self.stats = FakeStats()
        self.max_running = max_running
        self.hook = hook
        self.itl_batch_slope = itl_batch_slope
        self.stalled = stalled
        self.prefix_cache = prefix_cache
        self.reasoning = reasoning  # the module docstring
        self.reasoning_field = reasoning_field
        self._slots: asyncio.Semaphore | None = None
        self._ids = itertools.count()
        logging.getLogger("uvicorn.error").addFilter(_QUIET_KILLS)  # idempotent

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if self.stalled and not path.startswith("/fake/"):
            await disconnected_within(receive, 3600.0)  # never answers; returns when the client goes away
        elif method == "GET" and path == "/health":
            await send_json(send, 200, {"status": "ok"})
        elif method == "GET" and path == "/v1/models":
            await send_json(send, 200, {"object": "list", "data": [{"id": self.script.model, "object": "model"}]})
        elif method == "GET" and path == "/fake/stats":
            await send_json(send, 200, msgspec.to_builtins(self.stats))
        elif method == "GET" and path == "/fake/script":
            await send_json(send, 200, msgspec.to_builtins(self.script))
        elif method == "POST" and path == "/fake/script":
            await self._set_script(await read_body(receive), send)
        elif method == "POST" and path == "/v1/chat/completions":
            await self._chat(receive, send)
        else:
            await send_json(send, 404, {"error": {"message": f"no route {method} {path}", "type": "not_found"}})

    async def _set_script(self, raw: bytes, send: Send) -> None:
        """Replace the given fields of the default script (the rest stay); 400 on a bad field or value."""
        try:
            patch = msgspec.json.decode(raw)
            if not isinstance(patch, dict):
                raise msgspec.ValidationError("expected a JSON object of FakeScript fields")
            self.script = msgspec.convert({**msgspec.to_builtins(self.script), **patch}, FakeScript)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            await send_json(send, 400, {"error": {"message": str(exc), "type": "invalid_request_error"}})
            return
        await send_json(send, 200, msgspec.to_builtins(self.script))

    async def _chat(self, receive: Receive, send: Send) -> None:
        self.stats.requests += 1
        raw = await read_body(receive)
        try:
            body = msgspec.json.decode(raw)
            assert isinstance(body, dict)
            script = script_for(self.script, body)
            if self.hook is not None:
                script = self.hook(script, body)
        except (msgspec.DecodeError, AssertionError, ValueError) as exc:
            reason = f"bad directive: {exc}" if isinstance(exc, ValueError) else "body is not a JSON object"
            await send_json(send, 400, {"error": {"message": reason, "type": "invalid_request_error"}})
            return
        if script.status != 200:
            self._count(f"status_{script.status}")
            reason = f"scripted failure {script.status}"
            error = {"message": reason, "type": "server_error", "param": None, "code": None}
            await send_json(send, script.status, {"error": error})
            return
        if body.get("logprobs"):
            self.stats.logprobs_requests += 1
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 1 << 30)
        thoughts = token_pieces(FakeScript(answer=self.reasoning), max_tokens) if self.reasoning else []
        pieces = token_pieces(script, max_tokens - len(thoughts))
        planned = len(script.answer.split(" ")) if script.answer else script.tokens
        finish = "length" if len(pieces) < planned else "stop"
        rid = f"chatcmpl-fake-{next(self._ids)}"
        if script.fault:
            self._count(script.fault)
        prompt = self._prompt(body)
        if prompt.cached_tokens is not None and self.prefix_cache is not None:
            script = msgspec.structs.replace(script, ttft_ms=self.prefix_cache.ttft_ms(
                script.ttft_ms, prompt.prompt_tokens, prompt.cached_tokens))
        async with self._batch_slot():
            await self._answer(receive, send, script, body, pieces, finish, rid, prompt, thoughts)

    def _prompt(self, body: dict[str, Any]) -> _Prompt:
        """The request's prompt tokens (8 without a prefix cache, as ever) and those its prefix cache held."""
        if self.prefix_cache is None:
            return _Prompt(8)
        prompt, cached = self.prefix_cache.admit(body.get("messages"))
        self.stats.prompt_tokens += prompt
        self.stats.cached_tokens += cached
        self.stats.cache_hits += cached > 0
        return _Prompt(prompt, cached)

    def _batch_slot(self) -> contextlib.AbstractAsyncContextManager[Any]:
        if not self.max_running:
            return contextlib.nullcontext()
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_running)
        return self._slots

    async def _answer(self, receive: Receive, send: Send, script: FakeScript, body: dict[str, Any],
                      pieces: list[str], finish: str, rid: str, prompt: _Prompt, thoughts: list[str]) -> None:
        fault, stream = script.fault, bool(body.get("stream"))
        in_batch = _InBatch(self.stats)
        try:
            if fault == "html":
                await send_bytes(send, 200, b"text/html; charset=utf-8", _HTML)
            elif fault == "malformed_sse" and stream:
                await send_bytes(send, 200, b"text/event-stream", b"data: {oops\n\n" * 2 + b"data: [DONE]\n\n",
                                 chunked=True)
            elif fault == "malformed_sse":
                await send_bytes(send, 200, b"application/json", b'{"id": "' + rid.encode() + b'", "choices": [{oops')
            elif fault == "stall_first_byte" or (fault == "stall_mid" and not stream):
                await disconnected_within(receive, 3600.0)
            elif stream:
                await self._stream(receive, send, script, pieces, finish, rid, body, in_batch, prompt, thoughts)
            else:
                delay_s = (script.ttft_ms + self.itl_now(script) * max(0, len(pieces) - 1)) / 1000
                if script.stall_after >= 0:
                    delay_s = 3600.0
                if delay_s > 0 and await disconnected_within(receive, delay_s):
                    self.stats.requests_cancelled += 1
                    return
                if fault == "truncated":
                    pieces = pieces[:tokens_before_break(script, pieces)]
                self.stats.tokens_sent += len(pieces) + len(thoughts)
                message = {"role": "assistant", "content": "".join(pieces)}
                if thoughts:
                    message[self.reasoning_field] = "".join(thoughts)
                payload = msgspec.json.encode({
                    "id": rid, "object": "chat.completion", "created": int(time.time()), "model": script.model,
                    "choices": [{"index": 0, "finish_reason": None if fault == "truncated" else finish,
                                 "message": message,
                                 **({"logprobs": {"content": logprob_entries(script, pieces, body.get("top_logprobs"))}}
                                    if body.get("logprobs") else {})}],
                    "usage": _reported_usage(script, prompt, len(pieces) + len(thoughts)),
                })
                if fault == "kill_mid":  # announce the whole body, send half of it, drop the connection
                    await send({"type": "http.response.start", "status": 200, "headers": [
                        (b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
                    await send({"type": "http.response.body", "body": payload[:len(payload) // 2], "more_body": True})
                    raise _Killed
                await send_bytes(send, 200, b"application/json", payload)
        finally:
            in_batch.leave()

    def itl_now(self, script: FakeScript, batch: int | None = None) -> float:
        """One stream's time between tokens now (ms), at `batch` streams (None: the requests generating now)."""
        return batch_itl_ms(script.itl_ms, self.stats.in_flight if batch is None else batch, self.itl_batch_slope)

    def _count(self, fault: str) -> None:
        self.stats.faults[fault] = self.stats.faults.get(fault, 0) + 1

    async def _stream(
        self, receive: Receive, send: Send, script: FakeScript, pieces: list[str], finish: str, rid: str,
        body: dict[str, Any], in_batch: _InBatch, prompt: _Prompt, thoughts: list[str],
    ) -> None:
        self.stats.streams_started += 1
        disconnected = asyncio.Event()
        ended = False  # the last byte is on its way: a disconnect now does not cancel the stream

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            if not ended:  # counted here, with the batch's place, so both read the same at every moment
                self.stats.streams_cancelled += 1
                in_batch.leave()
            disconnected.set()

        watcher = asyncio.create_task(watch())
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        created = int(time.time())
        head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": script.model}
        start = time.perf_counter()
        ending = script.fault if script.fault in ("truncated", "stall_mid", "kill_mid") else ""
        with_logprobs = bool(body.get("logprobs"))
        offset_ms = script.ttft_ms
        try:
            for i, thought in enumerate(thoughts):  # at once, before the answer's schedule
                delta = {self.reasoning_field: thought} if i else {"role": "assistant", self.reasoning_field: thought}
                chunk = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
                await send({"type": "http.response.body", "body": b"data: " + _chunk_encoder.encode(chunk) + b"\n\n",
                            "more_body": True})
                self.stats.tokens_sent += 1
            for i, piece in enumerate(pieces[:tokens_before_break(script, pieces)] if ending else pieces):
                if i == script.stall_after:
                    await disconnected.wait()
                # Sleep to a schedule from the stream's start so that scripted TTFT/ITL do not drift with load;
                # each step's length is the ITL at the batch now.
                offset_ms += self.itl_now(script) if i else 0.0
                due = start + offset_ms / 1000
                delay = due - time.perf_counter()
                if delay > 0.1:
                    # A long scripted wait (slow first token) ends early when the client leaves.
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(disconnected.wait(), delay)
                elif delay > 0:
                    await asyncio.sleep(delay)
                elif not i % 256:
                    # Unpaced tokens never suspend this loop (uvicorn's send returns at once, even after the
                    # client left): yield now and then, as a real engine does per step, so the watcher runs.
                    await asyncio.sleep(0)
                if disconnected.is_set():
                    return
                delta = {"role": "assistant", "content": piece} if i == 0 else {"content": piece}
                choice = {"index": 0, "delta": delta, "finish_reason": None}
                if with_logprobs:
                    choice["logprobs"] = {"content": logprob_entries(script, [piece], body.get("top_logprobs"))}
                chunk = {**head, "choices": [choice]}
                await send({"type": "http.response.body", "body": b"data: " + _chunk_encoder.encode(chunk) + b"\n\n",
                            "more_body": True})
                self.stats.tokens_sent += 1
            if ending == "stall_mid":
                await disconnected.wait()
                return
            ended = True
            if ending == "truncated":  # a clean end of body (chunked terminator) without finish or [DONE]
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            if ending == "kill_mid":
                raise _Killed
            tail = [{**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}]
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = _reported_usage(script, prompt, len(pieces) + len(thoughts))
                tail.append({**head, "choices": [], "usage": usage})
            payload = b"".join(b"data: " + _chunk_encoder.encode(c) + b"\n\n" for c in tail) + b"data: [DONE]\n\n"
            await send({"type": "http.response.body", "body": payload, "more_body": False})
            self.stats.streams_finished += 1
        finally:
            watcher.cancel()


def serve(host: str, port: int, script: FakeScript, max_running: int = 0, itl_batch_slope: float = 0.0,
          prefix_cache_tokens: int = 0, cached_ttft_ms: float = 0.0) -> None:
    """Run the fake engine until interrupted (used by `cascade fake-server` and benchmarks); `prefix_cache_tokens`
    > 0: with a prefix cache of that many tokens, whose hits start after `cached_ttft_ms`."""
    import uvicorn

    cache = PrefixCache(prefix_cache_tokens, cached_ttft_ms) if prefix_cache_tokens > 0 else None
    engine = FakeEngine(script, max_running=max_running, itl_batch_slope=itl_batch_slope, prefix_cache=cache)
    uvicorn.run(engine, host=host, port=port, log_level="warning", access_log=False)
