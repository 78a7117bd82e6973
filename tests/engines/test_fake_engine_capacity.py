"""The fake engine as an engine at capacity (`max_running` batch slots) and with a per-request script hook."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import msgspec

from cascade.engines.fake_server import FakeEngine, FakeScript
from cascade.testing import serve_asgi


def ask(url: str, text: str = "hi", model: str = "m") -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", timeout=10,
                      json={"model": model, "messages": [{"role": "user", "content": text}]})


def test_requests_beyond_the_batch_slots_wait_for_one() -> None:
    engine = FakeEngine(FakeScript(tokens=4, ttft_ms=150), max_running=2)
    with serve_asgi(engine) as url, ThreadPoolExecutor(6) as pool:
        statuses = [r.status_code for r in pool.map(lambda _: ask(url), range(6))]
    assert statuses == [200] * 6 and engine.stats.peak_in_flight == 2


def test_without_a_limit_every_request_runs_at_once() -> None:
    engine = FakeEngine(FakeScript(tokens=4, ttft_ms=300))
    with serve_asgi(engine) as url, ThreadPoolExecutor(6) as pool:
        list(pool.map(lambda _: ask(url), range(6)))
    assert engine.stats.peak_in_flight > 2


def test_a_hook_scripts_each_request_from_its_body() -> None:
    def by_model(script: FakeScript, body: dict) -> FakeScript:
        return msgspec.structs.replace(script, answer=f"answer from {body['model']}")

    with serve_asgi(FakeEngine(FakeScript(), hook=by_model)) as url:
        reply = ask(url, model="big").json()
    assert reply["choices"][0]["message"]["content"] == "answer from big"
