"""The fake engine as an engine at capacity (`max_running` batch slots, a time between tokens that grows with its
batch) and with a per-request script hook."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import msgspec

from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.testing.fakes.sglang import FakeSGLang


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


def test_time_between_tokens_is_flat_by_default_and_grows_with_the_batch_when_asked() -> None:
    script = FakeScript(itl_ms=10.0)
    assert [FakeEngine(script).itl_now(script, batch) for batch in (1, 8)] == [10.0, 10.0]
    growing = FakeEngine(script, itl_batch_slope=0.5)
    assert [growing.itl_now(script, batch) for batch in (0, 1, 2, 5)] == [10.0, 10.0, 15.0, 30.0]


def stream_seconds(url: str) -> float:
    started = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=10, json={
            "model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}) as reply:
        assert reply.status_code == 200
        for _ in reply.iter_bytes():
            pass
    return time.perf_counter() - started


def test_a_full_batch_streams_each_answer_slower_than_a_lone_stream() -> None:
    # 10 gaps of 20 ms alone (>= 0.2 s); four at once with slope 1: up to 80 ms a gap. Lower bounds only.
    engine = FakeEngine(FakeScript(tokens=11, itl_ms=20.0), itl_batch_slope=1.0)
    with serve_asgi(engine) as url, ThreadPoolExecutor(4) as pool:
        alone = stream_seconds(url)
        together = list(pool.map(lambda _: stream_seconds(url), range(4)))
    assert alone >= 0.2 and engine.stats.peak_in_flight == 4
    assert max(together) >= 0.45  # at least 2.25x the lone stream's 0.2 s


def test_the_fake_sglang_reads_its_batch_from_its_scheduler() -> None:
    engine = FakeSGLang(FakeScript(itl_ms=4.0), itl_batch_slope=0.25)
    engine.scheduler.running = 5
    assert engine.itl_now(engine.script, engine.scheduler.running) == 8.0
