"""Backend client for any OpenAI-compatible chat-completions server.

What arrives is read by cascade/branches/openai_wire.py (leniently: engines add fields). Both
`max_tokens` and `max_completion_tokens` are sent because some servers honour only one of them.

Completions are always streamed (a whole answer is its collected stream, `backend.collect`), so that
the read timeout bounds the silence between tokens rather than the whole answer.
Transport: streamed completions (the gateway's hot path) go through cascade/branches/http_stream.py, a
lean keep-alive HTTP/1.1 client; control-plane calls (health, abort) through aiohttp, one
session per backend, created lazily inside the running event loop.
Tracing (cascade/tracing/): when it is on, each call is a CLIENT span and sends its traceparent to the engine (SGLang
and vLLM read it); when off, it costs a check per call and per delta.
Measured against httpx 0.28 in benchmarks/frontdoor/gateway_overhead.py: httpx cost ~14x the client CPU per
streamed request, and httpcore's pool bookkeeping grows with the number of kept-alive connections,
which at 200 concurrent streams made keep-alive slower than reconnecting. Streams are read to the
end of the body even after `[DONE]`, so that their connection goes back to the pool.
"""

from __future__ import annotations

import logging
import time
from base64 import b64encode
from collections.abc import AsyncGenerator, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import aiohttp
import msgspec

from cascade import tracing
from cascade.branches.backend import GenerationRequest, StreamDelta
from cascade.branches.http_connection import ConnectFailed, ConnectionClosed, StreamError, StreamTimeout
from cascade.branches.http_stream import StreamPool
from cascade.branches.openai_wire import (
    ERROR_BODY_BYTES,
    EventData,
    UsageBounds,
    check_usage,
    excerpt,
    parse_chunk,
    status_error,
)
from cascade.config import Timeouts
from cascade.errors import BackendFailed, BackendTimeout, BackendUnavailable, CascadeError

DEFAULT_TIMEOUTS = Timeouts()
_encode = msgspec.json.Encoder().encode
log = logging.getLogger("cascade.backend")


# A control-plane answer (health, abort, a PRM's rewards; /metrics has its own, engine_load.METRICS_BODY_BYTES) is
# read this far at most: an engine that answers with an endless body is refused, not held in memory.
CONTROL_BODY_BYTES = 16 << 20


async def read_capped(response: aiohttp.ClientResponse, limit: int | None = None) -> bytes:
    """An aiohttp response's body, or ValueError once it passes `limit` bytes (default CONTROL_BODY_BYTES; read no
    further)."""
    limit = CONTROL_BODY_BYTES if limit is None else limit
    if response.content_length is not None and response.content_length > limit:
        raise ValueError(f"a body of {response.content_length} bytes, over the {limit}-byte limit")
    parts, size = [], 0
    async for piece in response.content.iter_chunked(1 << 16):
        size += len(piece)
        if size > limit:
            raise ValueError(f"a body over the {limit}-byte limit")
        parts.append(piece)
    return b"".join(parts)


def make_session(timeouts: Timeouts, max_connections: int = 4096) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=max_connections, limit_per_host=max_connections),
        # sock_read bounds the silence between two reads: a stalled stream is a timeout, a slow one is not.
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect_s, sock_read=timeouts.read_s),
        auto_decompress=False,
        # Engines are on our own network; never route them through a proxy from the environment.
        trust_env=False,
    )


class OpenAIBackend:
    """One OpenAI-compatible endpoint (`url` is the server root, without /v1). `provider`: what traces call the
    engine (gen_ai.provider.name)."""

    def __init__(
        self, name: str, url: str, model: str, timeouts: Timeouts = DEFAULT_TIMEOUTS, api_key: str = "",
        fixed_fields: Mapping[str, Any] | None = None, provider: str = "openai",
    ) -> None:
        self.name = name
        self.provider = provider
        # Sent with every generation, over the request's own (an embedded sampling worker's: see make_backend).
        self.fixed_fields = dict(fixed_fields or {})
        # Credentials in the URL (`http://user:pass@host`) become a Basic Authorization header, and
        # `self.url`, which error messages and logs show, never carries them.
        self.url, basic = split_credentials(url.rstrip("/"))
        self.model = model
        self.timeouts = timeouts
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        elif basic:
            self._headers["Authorization"] = f"Basic {basic}"
        self._session: aiohttp.ClientSession | None = None
        self._streams: StreamPool | None = None
        parts = urlsplit(self.url)
        self._path = parts.path  # an engine mounted under a path prefix
        self._peer = (parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80))  # for traces
        self._stream_headers = {**self._headers, "Accept": "text/event-stream"}

    @property
    def session(self) -> aiohttp.ClientSession:
        # Created on first use: an aiohttp session belongs to the loop that runs it.
        if self._session is None or self._session.closed:
            self._session = make_session(self.timeouts)
        return self._session

    @property
    def streams(self) -> StreamPool:
        # Streamed completions (the gateway's hot path) use their own lean client: cascade/branches/http_stream.py.
        if self._streams is None:
            self._streams = StreamPool(self.url, self.timeouts.connect_s, self.timeouts.read_s)
        return self._streams

    async def request(self, method: str, path: str, body: bytes | None = None, timeout_s: float | None = None
                      ) -> tuple[int, bytes]:
        """A small control-plane call (health, abort, model info): status and body, or a CascadeError."""
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeouts.read_s)
        try:
            async with self.session.request(method, f"{self.url}{path}", data=body, headers=self._headers,
                                            timeout=timeout) as response:
                return response.status, await read_capped(response)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise self._translate(exc) from None
        except ValueError as exc:
            raise BackendFailed(f"backend `{self.name}` answered {method} {path} with {exc}", self.name) from None

    def _body(self, request: GenerationRequest) -> bytes:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": request.messages,
            "max_tokens": request.max_tokens,
            "max_completion_tokens": request.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.top_p is not None:
            body["top_p"] = request.top_p
        if request.stop:
            body["stop"] = request.stop
        if request.seed is not None:
            body["seed"] = request.seed
        body.update(request.extra)  # only schemas.PASSTHROUGH fields: never one of the keys set above
        body.update(self.fixed_fields)
        return _encode(body)

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[StreamDelta, None]:
        body = self._body(request)
        choices = request.extra.get("n")
        bounds = UsageBounds.of(len(body), request.max_tokens, choices if isinstance(choices, int) else 1)
        # A deadline, not asyncio.timeout: the stream may be iterated from several tasks (fan-out),
        # and asyncio.timeout would cancel whichever task entered it. Stalls are caught by sock_read.
        deadline = time.monotonic() + self.timeouts.total_s
        # Tracing on: the call's CLIENT span, which sees every delta and ends with the call, and its traceparent.
        call = None if (tracer := tracing.active) is None else tracer.upstream(
            self.provider, self.model, *self._peer, self.name, request, self._stream_headers)
        headers = self._stream_headers if call is None else call.headers
        try:
            response = await self.streams.post(self._path + "/v1/chat/completions", body, headers)
            try:
                if response.status != 200:
                    raise status_error(self.name, response.status, await response.read_all(ERROR_BODY_BYTES))
                if not response.content_type.startswith("text/event-stream"):
                    # A 200 that is not an event stream (a proxy's HTML page, a JSON error) holds no answer.
                    raise BackendFailed(
                        f"backend `{self.name}` answered a stream with content type "
                        f"{response.content_type or '(none)'}, not text/event-stream: "
                        f"{excerpt(await response.read())}", self.name)
                finished = False
                events = EventData(self.name)
                while chunk := await response.read():
                    merged: StreamDelta | None = None
                    for data in events.feed(chunk):
                        delta = parse_chunk(data, self.name)
                        if delta is None:
                            continue
                        if merged is None:
                            merged = delta
                        else:
                            merged.absorb(delta)
                    if merged is not None:
                        check_usage(merged, bounds, self.name)
                        finished = finished or merged.finish_reason is not None
                        if call is not None:
                            call.saw(merged)
                        yield merged
                    if time.monotonic() > deadline:
                        raise BackendTimeout(
                            f"backend `{self.name}` exceeded the total time limit of {self.timeouts.total_s:g} s",
                            self.name,
                        )
                if (tail := events.tail()) and (last := parse_chunk(tail, self.name)) is not None:
                    check_usage(last, bounds, self.name)
                    finished = finished or last.finish_reason is not None
                    if call is not None:
                        call.saw(last)
                    yield last
                if not finished:
                    # The body ended cleanly but the answer did not: what was sent may be cut anywhere.
                    # ([DONE] is not required: transformers serve never sends it.)
                    raise BackendFailed(f"backend `{self.name}` ended the stream without a finish reason "
                                        "(the answer is incomplete)", self.name)
            finally:
                response.release()
        except StreamError as exc:
            error = self._translate(exc)
            if call is not None:
                call.end(error)
            raise error from None
        except BaseException as exc:  # a fault, a cancellation, or the consumer closing the stream early
            if call is not None:
                call.end(exc)
            raise
        if call is not None:
            call.end()

    async def health(self) -> bool:
        for path in ("/health", "/v1/models"):
            try:
                status, _ = await self.request("GET", path, timeout_s=self.timeouts.connect_s)
            except CascadeError:
                return False
            if status == 200:
                return True
            if status != 404:
                return False
        return False

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._streams is not None:
            self._streams.close()

    def _translate(self, exc: BaseException) -> CascadeError:
        """The error for a client names the backend (`tier/replica`), never its URL or address: its message ends up
        in OpenAI error bodies. Where the transport's own text may hold them, it goes to the log, with the URL."""
        kind = type(exc).__name__
        if isinstance(exc, ConnectFailed):  # its text names no address (cascade/branches/http_stream.py)
            log.warning("backend %s at %s is unreachable: %s", self.name, self.url, exc)
            return BackendUnavailable(f"backend `{self.name}` is unreachable ({exc})", self.name)
        if isinstance(exc, StreamTimeout):
            return BackendTimeout(f"backend `{self.name}` timed out ({exc})", self.name)
        if isinstance(exc, ConnectionClosed):
            return BackendFailed(f"backend `{self.name}` closed the connection mid-response ({exc})", self.name)
        if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError):
            log.warning("backend %s at %s is unreachable: %s", self.name, self.url, exc)
            return BackendUnavailable(f"backend `{self.name}` is unreachable ({kind})", self.name)
        if isinstance(exc, TimeoutError):
            return BackendTimeout(f"backend `{self.name}` timed out ({kind})", self.name)
        if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
            return BackendFailed(f"backend `{self.name}` closed the connection mid-response", self.name)
        log.warning("backend %s at %s failed: %s: %s", self.name, self.url, kind, exc)  # aiohttp's text names the URL
        return BackendFailed(f"backend `{self.name}` failed ({kind})", self.name)

def split_credentials(url: str) -> tuple[str, str]:
    """(the URL without `user:pass@`, base64 of `user:pass` or "")."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, ""
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    basic = b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
    return urlunsplit(parts._replace(netloc=host)), basic
