"""A gateway over real HTTP in front of the fake engine, for the gateway tests (its three-tier config,
`ladder_toml` and `TIERS`, is cascade/testing/servers.py's, shared with the benchmarks)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import TypeVar

import httpx
import msgspec

from cascade.config import CascadeConfig, decode_config
from cascade.gateway.server import Gateway
from cascade.service.chat import ChatService, ServiceConfig
from cascade.service.metrics import GatewayMetrics
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.testing.servers import ladder_toml
from cascade.tiers.build import build_tiers

T = TypeVar("T")


def on_service(config: CascadeConfig, mode: str, work: Callable[[ChatService], Awaitable[T]]) -> T:
    """`work` on a ChatService (no HTTP in front) built from `config` in `mode` ("route" or "cascade"); its tiers'
    backends closed after."""

    async def run() -> T:
        tiers = build_tiers(config, {})
        routed = msgspec.structs.replace(config, routing=msgspec.structs.replace(config.routing, mode=mode))
        service = ChatService(tiers, ServiceConfig.of(routed), GatewayMetrics())
        try:
            return await work(service)
        finally:
            for tier in tiers:
                await tier.backend.aclose()

    return asyncio.run(run())


@contextmanager
def running_gateway(
    script: FakeScript | None = None, extra: str = "", read_s: float = 5.0, dead_url: str | None = None,
    engine: FakeEngine | None = None,
) -> Iterator[tuple[str, str, FakeEngine]]:
    """Yield (gateway_url, engine_url, engine); `engine`: the fake to serve every tier (None: one on `script`)."""
    engine = engine or FakeEngine(script or FakeScript(tokens=8))
    with ExitStack() as stack:
        engine_url = stack.enter_context(serve_asgi(engine))
        gateway = Gateway(decode_config(ladder_toml(engine_url, extra, read_s, dead_url)))
        gateway_url = stack.enter_context(serve_asgi(gateway.app, lifespan="on"))
        yield gateway_url, engine_url, engine


def post_chat(base: str, body: dict | bytes, headers: dict | None = None, timeout: float = 10) -> httpx.Response:
    if isinstance(body, bytes):
        return httpx.post(f"{base}/v1/chat/completions", content=body,
                          headers={"content-type": "application/json", **(headers or {})}, timeout=timeout)
    return httpx.post(f"{base}/v1/chat/completions", json=body, headers=headers, timeout=timeout)


def user(text: str = "hello") -> list[dict]:
    return [{"role": "user", "content": text}]


def small_and_thinker_toml(url: str, m: int = 2) -> str:
    """Two tiers on one fake engine: `small` (model fake-small, one branch) and `thinker` (fake-big, 3 branches)."""
    return f"""
[[tiers]]
name = "small"
default_max_tokens = 64
backends = [{{ kind = "openai", url = "{url}", model = "fake-small" }}]

[[tiers]]
name = "thinker"
default_max_tokens = 64
branches = {{ n = 3, m = {m} }}
backends = [{{ kind = "openai", url = "{url}", model = "fake-big" }}]
"""
