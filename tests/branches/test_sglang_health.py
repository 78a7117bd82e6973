"""SGLangBackend.health against a real server on 127.0.0.1 whose /health takes as long as SGLang's one-token
probe (1-20 s): its own timeout (`Timeouts.health_s`), not the read timeout of generations."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from cascade.branches.sglang_client import SGLangBackend
from cascade.config import Timeouts
from cascade.testing.asgi import serve_asgi


class SlowHealth:
    """GET /health answers 200 after `delay_s`, as SGLang's does once its probe token comes back."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        status = 404
        if (scope["method"], scope["path"]) == ("GET", "/health"):
            await asyncio.sleep(self.delay_s)
            status = 200
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})


def healthy(url: str, timeouts: Timeouts) -> tuple[bool, float]:
    async def main() -> tuple[bool, float]:
        backend = SGLangBackend("sglang", url, "m", timeouts)
        started = time.monotonic()
        try:
            return await backend.health(), time.monotonic() - started
        finally:
            await backend.aclose()

    return asyncio.run(main())


def test_the_default_health_timeout_outlasts_sglangs_longest_probe() -> None:
    assert Timeouts().health_s > 20  # SGLANG_HEALTH_CHECK_TIMEOUT's default
    assert Timeouts(health_s=45).health_s == 45


def test_a_probe_slower_than_the_read_timeout_passes_within_the_health_timeout() -> None:
    with serve_asgi(SlowHealth(delay_s=1.2)) as url:
        ok, _ = healthy(url, Timeouts(connect_s=1.0, read_s=0.5, total_s=5.0, health_s=5.0))
    assert ok


def test_a_probe_past_the_health_timeout_is_unhealthy_without_waiting_for_the_read_timeout() -> None:
    with serve_asgi(SlowHealth(delay_s=3.0)) as url:
        ok, took = healthy(url, Timeouts(connect_s=1.0, read_s=30.0, total_s=60.0, health_s=0.5))
    assert not ok and took < 2.0
