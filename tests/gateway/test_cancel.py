"""A client that goes away cancels the upstream generation, streaming or not."""

from __future__ import annotations

import contextlib
import time

import httpx

from cascade.testing.fakes.engine import FakeEngine, FakeScript
from tests.gateway.gateway_setup import running_gateway, user


def _wait_for(predicate, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _disconnects(base: str) -> float:
    text = httpx.get(f"{base}/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("cascade_client_disconnects_total{"))


def test_stream_disconnect_cancels_upstream_generation() -> None:
    with running_gateway(FakeScript(tokens=10_000, itl_ms=5)) as (base, _, engine):
        body = {"model": "cascade", "messages": user(), "stream": True, "max_tokens": 10_000}
        with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=10) as response:
            lines = response.iter_lines()
            for _ in range(6):
                next(lines)
        assert _wait_for(lambda: engine.stats.streams_cancelled == 1), engine.stats
        sent = engine.stats.tokens_sent
        time.sleep(0.3)
        assert engine.stats.tokens_sent == sent, "engine kept generating after the client left"
        assert engine.stats.in_flight == 0
        assert _wait_for(lambda: 'cascade_in_flight_requests 0.0' in httpx.get(f"{base}/metrics").text)
        assert _disconnects(base) == 1  # once, though both the stream and the request were cancelled


def test_non_streaming_disconnect_cancels_upstream_generation() -> None:
    with running_gateway(FakeScript(tokens=8, ttft_ms=30_000)) as (base, _, engine):
        with contextlib.suppress(httpx.ReadTimeout):
            httpx.post(f"{base}/v1/chat/completions", json={"model": "cascade", "messages": user()}, timeout=0.5)
        # The gateway streams upstream even for non-streaming clients (see ChatService.complete).
        assert _wait_for(lambda: engine.stats.streams_cancelled == 1), engine.stats
        assert engine.stats.in_flight == 0
        assert _disconnects(base) == 1


def test_finished_streams_are_not_counted_as_cancelled() -> None:
    engine_script = FakeScript(tokens=3)
    with running_gateway(engine_script) as (base, _, engine):
        for _ in range(3):
            with httpx.stream("POST", f"{base}/v1/chat/completions", timeout=10,
                              json={"model": "cascade", "messages": user(), "stream": True}) as response:
                response.read()
        assert isinstance(engine, FakeEngine)
        assert engine.stats.streams_finished == 3 and engine.stats.streams_cancelled == 0
