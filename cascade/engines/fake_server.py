"""A deterministic fake OpenAI-compatible engine, for tests, fault injection and load tests.

It is a plain ASGI app (no framework, so that it costs little CPU next to what it measures).
Behaviour comes from its `FakeScript` and can be overridden per request by a directive in the
last user message, e.g. ``[fake status=500]`` or ``[fake ttft_ms=50 itl_ms=5 tokens=20 stall_after=3]``,
so that tests can inject faults through the gateway without any side channel. ``[fake@MODEL ...]``
applies only to requests for that model (one engine can play every tier of a ladder), and
``[fake@seed=N ...]`` only to requests with that seed (one engine can play distinct branches).
In ``answer=``, ``_`` is a space and ``|`` a paragraph break (a reasoning step).

`GET /fake/stats` reports how many streams started, finished and were cancelled by the client,
which is how tests prove that a client disconnect stops generation upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import msgspec

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_DIRECTIVE = re.compile(r"\[fake(?:@([^\s\]]+))? ([^\]]*)\]")


class FakeScript(msgspec.Struct, kw_only=True):
    ttft_ms: float = 0.0
    itl_ms: float = 0.0
    tokens: int = 16
    status: int = 200  # non-200: reply with an OpenAI error object and this status
    stall_after: int = -1  # >= 0: send this many tokens, then hang (slow/stuck stream)
    answer: str = ""  # text to produce instead of numbered tokens
    model: str = "fake-model"


class FakeStats(msgspec.Struct):
    requests: int = 0
    streams_started: int = 0
    streams_finished: int = 0
    streams_cancelled: int = 0
    requests_cancelled: int = 0  # non-streaming requests whose client went away first
    in_flight: int = 0
    peak_in_flight: int = 0  # most requests generating at once (tests of admission limits)
    tokens_sent: int = 0


_chunk_encoder = msgspec.json.Encoder()


def script_for(base: FakeScript, body: dict[str, Any]) -> FakeScript:
    messages = body.get("messages") or []
    text = ""
    if messages and isinstance(messages[-1], dict):
        content = messages[-1].get("content")
        text = content if isinstance(content, str) else ""
    overrides: dict[str, Any] = {}
    # Unscoped directives first, so that a model-scoped one overrides them for its model.
    for model, items in sorted(_DIRECTIVE.findall(text), key=lambda d: bool(d[0])):
        if model and model != body.get("model") and model != f"seed={body.get('seed')}":
            continue
        for item in items.split():
            key, _, value = item.partition("=")
            if key in ("ttft_ms", "itl_ms"):
                overrides[key] = float(value)
            elif key in ("tokens", "status", "stall_after"):
                overrides[key] = int(value)
            elif key == "answer":
                overrides[key] = value.replace("_", " ").replace("|", "\n\n")
    return msgspec.structs.replace(base, **overrides)


def token_pieces(script: FakeScript, max_tokens: int) -> list[str]:
    if script.answer:
        words = script.answer.split(" ")
        return [w if i == 0 else " " + w for i, w in enumerate(words)][:max_tokens]
    return [f"t{i} " for i in range(min(script.tokens, max_tokens))]


class FakeEngine:
    """The ASGI app. `script` is the default behaviour; `stats` is read by tests."""

    def __init__(self, script: FakeScript | None = None) -> None:
        self.script = script or FakeScript()
        self.stats = FakeStats()
        self._ids = itertools.count()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if method == "GET" and path == "/health":
            await send_json(send, 200, {"status": "ok"})
        elif method == "GET" and path == "/v1/models":
            await send_json(send, 200, {"object": "list", "data": [{"id": self.script.model, "object": "model"}]})
        elif method == "GET" and path == "/fake/stats":
            await send_json(send, 200, msgspec.to_builtins(self.stats))
        elif method == "POST" and path == "/v1/chat/completions":
            await self._chat(receive, send)
        else:
            await send_json(send, 404, {"error": {"message": f"no route {method} {path}", "type": "not_found"}})

    async def _chat(self, receive: Receive, send: Send) -> None:
        self.stats.requests += 1
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            body = msgspec.json.decode(raw)
            assert isinstance(body, dict)
        except (msgspec.DecodeError, AssertionError):
            error: dict[str, Any] = {"message": "body is not a JSON object", "type": "invalid_request_error"}
            await send_json(send, 400, {"error": error})
            return
        script = script_for(self.script, body)
        if script.status != 200:
            reason = f"scripted failure {script.status}"
            error = {"message": reason, "type": "server_error", "param": None, "code": None}
            await send_json(send, script.status, {"error": error})
            return
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 1 << 30)
        pieces = token_pieces(script, max_tokens)
        planned = len(script.answer.split(" ")) if script.answer else script.tokens
        finish = "length" if len(pieces) < planned else "stop"
        rid = f"chatcmpl-fake-{next(self._ids)}"
        self.stats.in_flight += 1
        self.stats.peak_in_flight = max(self.stats.peak_in_flight, self.stats.in_flight)
        try:
            if body.get("stream"):
                await self._stream(receive, send, script, pieces, finish, rid, body)
            else:
                delay_s = (script.ttft_ms + script.itl_ms * max(0, len(pieces) - 1)) / 1000
                if script.stall_after >= 0:
                    delay_s = 3600.0
                if delay_s > 0 and await _disconnected_within(receive, delay_s):
                    self.stats.requests_cancelled += 1
                    return
                self.stats.tokens_sent += len(pieces)
                await send_json(send, 200, {
                    "id": rid, "object": "chat.completion", "created": int(time.time()), "model": script.model,
                    "choices": [{"index": 0, "finish_reason": finish,
                                 "message": {"role": "assistant", "content": "".join(pieces)}}],
                    "usage": {"prompt_tokens": 8, "completion_tokens": len(pieces),
                              "total_tokens": 8 + len(pieces)},
                })
        finally:
            self.stats.in_flight -= 1

    async def _stream(
        self, receive: Receive, send: Send, script: FakeScript, pieces: list[str], finish: str, rid: str,
        body: dict[str, Any],
    ) -> None:
        self.stats.streams_started += 1
        disconnected = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            disconnected.set()

        watcher = asyncio.create_task(watch())
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        created = int(time.time())
        head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": script.model}
        start = time.perf_counter()
        try:
            for i, piece in enumerate(pieces):
                if i == script.stall_after:
                    await disconnected.wait()
                # Sleep to an absolute schedule so that scripted TTFT/ITL do not drift with load.
                due = start + (script.ttft_ms + script.itl_ms * i) / 1000
                delay = due - time.perf_counter()
                if delay > 0.1:
                    # A long scripted wait (slow first token) ends early when the client leaves.
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(disconnected.wait(), delay)
                elif delay > 0:
                    await asyncio.sleep(delay)
                if disconnected.is_set():
                    self.stats.streams_cancelled += 1
                    return
                delta = {"role": "assistant", "content": piece} if i == 0 else {"content": piece}
                chunk = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
                await send({"type": "http.response.body", "body": b"data: " + _chunk_encoder.encode(chunk) + b"\n\n",
                            "more_body": True})
                self.stats.tokens_sent += 1
            tail = [{**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}]
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {"prompt_tokens": 8, "completion_tokens": len(pieces), "total_tokens": 8 + len(pieces)}
                tail.append({**head, "choices": [], "usage": usage})
            payload = b"".join(b"data: " + _chunk_encoder.encode(c) + b"\n\n" for c in tail) + b"data: [DONE]\n\n"
            await send({"type": "http.response.body", "body": payload, "more_body": False})
            self.stats.streams_finished += 1
        finally:
            watcher.cancel()


async def _disconnected_within(receive: Receive, seconds: float) -> bool:
    """Wait `seconds` (simulated generation); True if the client disconnected meanwhile."""

    async def wait_disconnect() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    try:
        await asyncio.wait_for(wait_disconnect(), timeout=seconds)
    except TimeoutError:
        return False
    return True


async def send_json(send: Send, status: int, payload: Any) -> None:
    body = msgspec.json.encode(payload)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def serve(host: str, port: int, script: FakeScript) -> None:
    """Run the fake engine until interrupted (used by `cascade fake-server` and benchmarks)."""
    import uvicorn

    uvicorn.run(FakeEngine(script), host=host, port=port, log_level="warning", access_log=False)
