"""The profiler reads SGLang's KV cache size from GET /server_info, falling back to the deprecated
/get_server_info (which SGLang 0.5 logs a warning for on every call) only on a 404: real servers on
127.0.0.1 that serve one route or the other."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import msgspec
import pytest

from cascade.profiler.probe import Profiler, Settings
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine
from cascade.testing.fakes.sglang import FakeSGLang
from tests.servers import Replay, Reply

INFO = msgspec.json.encode({"max_total_num_tokens": 520000, "version": "0.5.23", "internal_states": [{}]})


def kv_capacity(url: str) -> int | None:
    async def main() -> int | None:
        async with httpx.AsyncClient(trust_env=False) as client:
            return await Profiler(Settings(url=url), client, lambda: None).kv_capacity()

    return asyncio.run(main())


def paths(app: Replay) -> list[str]:
    return [r.path for r in app.requests]


def test_a_current_sglang_is_asked_at_server_info_only() -> None:
    app = Replay({("GET", "/server_info"): Reply(body=INFO)})
    with serve_asgi(app) as url:
        assert kv_capacity(url) == 520000
    assert paths(app) == ["/server_info"]  # never the deprecated route, which would log a warning


def test_an_older_sglang_without_server_info_is_asked_at_get_server_info() -> None:
    app = Replay({("GET", "/get_server_info"): Reply(body=INFO)})
    with serve_asgi(app) as url:
        assert kv_capacity(url) == 520000
    assert paths(app) == ["/server_info", "/get_server_info"]


@pytest.mark.parametrize(("routes", "asked"), [
    ({}, ["/server_info", "/get_server_info"]),  # not SGLang: neither route
    ({("GET", "/server_info"): Reply(status=500, body=b"{}")}, ["/server_info"]),  # a failure is not a missing route
    ({("GET", "/server_info"): Reply(body=b'{"max_total_num_tokens": null}')}, ["/server_info"]),
])
def test_no_usable_answer_leaves_the_kv_capacity_unknown(routes: dict[Any, Reply], asked: list[str]) -> None:
    app = Replay(routes)
    with serve_asgi(app) as url:
        assert kv_capacity(url) is None
    assert paths(app) == asked


def test_the_fake_sglang_server_reports_its_kv_cache_at_server_info() -> None:
    with serve_asgi(FakeSGLang()) as url:
        assert kv_capacity(url) == 65536
        assert httpx.get(f"{url}/get_server_info", timeout=5, trust_env=False).status_code == 404


def test_an_openai_server_reports_no_kv_cache() -> None:
    with serve_asgi(FakeEngine()) as url:
        assert kv_capacity(url) is None
