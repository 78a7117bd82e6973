"""Reading an engine's own load from its /metrics (cascade/branches/engine_load.py, engine_poller.py): SGLang's
text, the fake SGLang over real HTTP, and what happens when there is nothing to read."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import aiohttp
import pytest

from cascade.branches.engine_load import MAX_WANTED_LINES, METRICS_BODY_BYTES, Histogram, parse_sglang_metrics
from cascade.branches.engine_poller import EngineMonitor, EnginePoller
from cascade.config import EngineLoadConfig
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.script import FakeScript
from cascade.testing.fakes.sglang import FakeSGLang
from cascade.testing.waiting import eventually

# What SGLang's multiprocess collector writes, cut down: two data-parallel ranks with priority scheduling (each
from tests.servers import Replay, Reply, dead_url, open_streams

# What SGLang's multiprocess collector writes, cut down: two data-parallel ranks with priority scheduling (each
# total under priority="", each priority beside it), other series with similar names, TTFT streamed and not.
SGLANG_TEXT = """\
# HELP sglang:num_running_reqs Multiprocess metric
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0",engine_type="unified",model_name="Qwen/Qwen3-8B",moe_ep_rank="0",pp_rank="0",priority="",tp_rank="0"} 7.0
sglang:num_running_reqs{dp_rank="0",engine_type="unified",model_name="Qwen/Qwen3-8B",moe_ep_rank="0",pp_rank="0",priority="1",tp_rank="0"} 7.0
sglang:num_running_reqs{dp_rank="1",engine_type="unified",model_name="Qwen/Qwen3-8B",moe_ep_rank="0",pp_rank="0",priority="",tp_rank="0"} 5.0
# HELP sglang:num_queue_reqs Multiprocess metric
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{dp_rank="0",engine_type="unified",model_name="Qwen/Qwen3-8B",moe_ep_rank="0",pp_rank="0",priority="",tp_rank="0"} 3.0
sglang:num_queue_reqs{dp_rank="1",engine_type="unified",model_name="Qwen/Qwen3-8B",moe_ep_rank="0",pp_rank="0",priority="",tp_rank="0"} 1.0
# HELP sglang:num_grammar_queue_reqs Multiprocess metric
# TYPE sglang:num_grammar_queue_reqs gauge
sglang:num_grammar_queue_reqs{dp_rank="0",engine_type="unified",model_name="Qwen/Qwen3-8B",moe_ep_rank="0",pp_rank="0",priority="",tp_rank="0"} 9.0
# HELP sglang:token_usage Multiprocess metric
# TYPE sglang:token_usage gauge
sglang:token_usage{dp_rank="0",engine_type="unified",model_name="Qwen/Qwen3-8B",moe_ep_rank="0",pp_rank="0",priority="",tp_rank="0"} 0.25
sglang:token_usage{dp_rank="1",engine_type="unified",model_name="Qwen/Qwen3-8B",moe_ep_rank="0",pp_rank="0",priority="",tp_rank="0"} 0.75
# HELP sglang:full_token_usage Multiprocess metric
# TYPE sglang:full_token_usage gauge
sglang:full_token_usage{dp_rank="0",engine_type="unified",model_name="Qwen/Qwen3-8B",moe_ep_rank="0",pp_rank="0",priority="",tp_rank="0"} 0.99
# HELP sglang:time_to_first_token_seconds Multiprocess metric
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_sum{engine_type="unified",is_streaming="true",model_name="Qwen/Qwen3-8B",priority="1"} 3.0
sglang:time_to_first_token_seconds_bucket{engine_type="unified",is_streaming="true",le="0.1",model_name="Qwen/Qwen3-8B",priority="1"} 2.0
sglang:time_to_first_token_seconds_bucket{engine_type="unified",is_streaming="true",le="1.0",model_name="Qwen/Qwen3-8B",priority="1"} 6.0
sglang:time_to_first_token_seconds_bucket{engine_type="unified",is_streaming="true",le="+Inf",model_name="Qwen/Qwen3-8B",priority="1"} 8.0
sglang:time_to_first_token_seconds_count{engine_type="unified",is_streaming="true",model_name="Qwen/Qwen3-8B",priority="1"} 8.0
sglang:time_to_first_token_seconds_sum{engine_type="unified",is_streaming="false",model_name="Qwen/Qwen3-8B",priority="1"} 1.0
sglang:time_to_first_token_seconds_bucket{engine_type="unified",is_streaming="false",le="0.1",model_name="Qwen/Qwen3-8B",priority="1"} 0.0
sglang:time_to_first_token_seconds_bucket{engine_type="unified",is_streaming="false",le="1.0",model_name="Qwen/Qwen3-8B",priority="1"} 2.0
sglang:time_to_first_token_seconds_bucket{engine_type="unified",is_streaming="false",le="+Inf",model_name="Qwen/Qwen3-8B",priority="1"} 2.0
sglang:time_to_first_token_seconds_count{engine_type="unified",is_streaming="false",model_name="Qwen/Qwen3-8B",priority="1"} 2.0
# HELP sglang:e2e_request_latency_seconds Multiprocess metric
# TYPE sglang:e2e_request_latency_seconds histogram
sglang:e2e_request_latency_seconds_bucket{engine_type="unified",le="+Inf",model_name="Qwen/Qwen3-8B"} 10.0
"""
FAST = EngineLoadConfig(poll_s=0.05, timeout_s=0.5, stale_after=3)


def test_sglang_text_reads_as_totals_over_data_parallel_ranks_without_per_priority_parts() -> None:
    load = parse_sglang_metrics(SGLANG_TEXT)
    assert (load.running, load.queued) == (12, 4)  # 7 + 5 and 3 + 1; priority="1" is part of rank 0's total
    assert load.token_usage == 0.75  # the fullest rank
    assert load.ttft is not None and load.ttft.bounds == (0.1, 1.0, math.inf)
    assert load.ttft.cumulative == (2.0, 8.0, 10.0) and load.ttft.total == 4.0  # streamed and not, together


def test_series_a_rank_publishes_twice_are_read_once() -> None:
    # --enable-metrics-for-all-schedulers: every tensor-parallel rank of one scheduler publishes the same queue.
    text = "".join(f'sglang:num_queue_reqs{{engine_type="unified",model_name="m",tp_rank="{r}"}} 4\n'
                   f'sglang:num_running_reqs{{engine_type="unified",model_name="m",tp_rank="{r}"}} 2\n' for r in range(4))
    load = parse_sglang_metrics(text)
    assert (load.running, load.queued, load.token_usage, load.ttft) == (2, 4, None, None)


@pytest.mark.parametrize("text", [
    "",  # metrics on, nothing published yet
    "<html><body>502 Bad Gateway</body></html>",
    "# HELP sglang:num_running_reqs x\nsglang:num_running_reqs{a=\"b\"} 1\n",  # no queue
    'sglang:num_running_reqs 1\nsglang:num_queue_reqs{model_name="m"} many\n',  # not a number
    'vllm:num_requests_running{model_name="m"} 1\nvllm:num_requests_waiting{model_name="m"} 0\n',  # not SGLang
])
def test_text_that_is_not_sglangs_load_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_sglang_metrics(text)


def test_a_histogram_quantile_interpolates_within_its_bucket_like_prometheus() -> None:
    h = Histogram((0.1, 0.2, 0.4, math.inf), (0.0, 10.0, 20.0, 20.0), 5.0)
    assert h.quantile(0.5) == pytest.approx(0.2)
    assert h.quantile(0.25) == pytest.approx(0.15)
    assert h.quantile(0.9) == pytest.approx(0.36)
    assert Histogram((0.1, math.inf), (0.0, 4.0), 9.0).quantile(0.9) == 0.1  # in +Inf: the largest finite bound
    assert Histogram((0.1, math.inf), (0.0, 0.0), 0.0).quantile(0.9) is None


def test_a_window_is_the_difference_of_two_readings_and_a_restart_starts_it_again() -> None:
    early = Histogram((1.0, math.inf), (3.0, 4.0), 6.0)
    late = Histogram((1.0, math.inf), (5.0, 9.0), 20.0)
    assert late.since(early) == Histogram((1.0, math.inf), (2.0, 5.0), 14.0)
    assert early.since(late) is None  # counts went down: the engine restarted
    assert late.since(Histogram((2.0, math.inf), (3.0, 4.0), 6.0)) is None  # other buckets


def test_the_poller_keeps_the_ttft_of_the_last_window_only() -> None:
    now = [100.0]
    poller = EnginePoller("http://x", {}, FAST, window_s=1.0, clock=lambda: now[0])

    def read(fast: float, slow: float) -> None:
        text = (f"sglang:num_running_reqs 0\nsglang:num_queue_reqs 0\n"
                f'sglang:time_to_first_token_seconds_bucket{{le="0.1"}} {fast}\n'
                f'sglang:time_to_first_token_seconds_bucket{{le="+Inf"}} {fast + slow}\n')
        poller._accept(parse_sglang_metrics(text), now[0])
        now[0] += 0.5

    read(0, 0)
    assert poller.ttft_window is None  # one reading: no window yet
    read(0, 4)  # four slow answers
    assert poller.ttft_window is not None and poller.ttft_window.cumulative == (0, 4)
    read(10, 4)
    read(20, 4)
    read(30, 4)  # the slow answers are older than the window now
    assert poller.ttft_window is not None and poller.ttft_window.cumulative == (20, 20)
    read(1, 0)  # the engine restarted
    assert poller.ttft_window is None


@contextmanager
def polling(urls: list[str], config: EngineLoadConfig = FAST) -> Iterator[list[EnginePoller]]:
    """An EngineMonitor polling `urls` in an event loop of its own, for the block's duration."""
    monitor = EngineMonitor(config, window_s=5.0)
    pollers = [monitor.watch(url) for url in urls]
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def main() -> None:
        await monitor.start()
        try:
            await stop.wait()
        finally:
            await monitor.aclose()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    try:
        yield pollers
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=5)
        loop.close()


def test_the_poller_reads_the_fake_sglangs_queue_and_running_requests() -> None:
    engine = FakeSGLang(FakeScript(tokens=400, itl_ms=20), max_running=2, disconnect_abort_s=0.1)
    with serve_asgi(engine) as url, polling([url]) as (poller,):
        with open_streams(url, 5, timeout_s=10):
            assert eventually(lambda: (load := poller.load()) is not None and (load.running, load.queued) == (2, 3))
            assert poller.queued_since is not None and poller.latest is not None and poller.latest.token_usage == 1.0
        assert eventually(lambda: (load := poller.load()) is not None and load.queued == 0, within_s=5)
        assert poller.queued_since is None and poller.failures == 0


def test_one_poller_per_engine_url_however_many_replicas_read_it() -> None:
    monitor = EngineMonitor(FAST, window_s=5.0)
    first = monitor.watch("http://127.0.0.1:30000/")
    assert monitor.watch("http://127.0.0.1:30000") is first
    assert monitor.watch("http://127.0.0.1:30001") is not first and len(monitor.pollers) == 2


@pytest.mark.parametrize("reply", [
    Reply(status=404, body=b'{"detail":"Not Found"}'),  # SGLang without --enable-metrics
    Reply(body=b"<html>oops</html>", content_type="text/html"),
    Reply(body=b"\xff\xfe garbage"),
])
def test_an_engine_without_readable_metrics_has_no_load_and_counts_failures(reply: Reply) -> None:
    with serve_asgi(Replay({("GET", "/metrics"): reply})) as url, polling([url]) as (poller,):
        assert eventually(lambda: poller.failures >= 2)
        assert poller.load() is None and not poller.fresh() and poller.error


# A running-requests line of a data-parallel rank, as SGLang writes it, many times: a reading too large to parse.
RANK_LINE = 'sglang:num_running_reqs{{dp_rank="{}",model_name="m",priority=""}} 1.0\n'
MANY_LINES = "# TYPE sglang:num_running_reqs gauge\n" + "".join(RANK_LINE.format(i) for i in range(MAX_WANTED_LINES + 1))


def test_a_reading_with_more_load_lines_than_the_limit_is_refused_before_parsing() -> None:
    with pytest.raises(ValueError, match=f"over {MAX_WANTED_LINES}"):
        parse_sglang_metrics(MANY_LINES + "sglang:num_queue_reqs 0\n")
    just_under = "".join(RANK_LINE.format(i) for i in range(MAX_WANTED_LINES - 1)) + "sglang:num_queue_reqs 0\n"
    assert parse_sglang_metrics(just_under).running == MAX_WANTED_LINES - 1


@pytest.mark.parametrize(("reply", "error"), [
    (Reply(body=b"# " + b"x" * METRICS_BODY_BYTES), f"over the {METRICS_BODY_BYTES}-byte limit"),
    (Reply(body=MANY_LINES.encode()), f"over {MAX_WANTED_LINES}"),
])
def test_an_engine_answering_megabytes_of_metrics_is_a_failure_not_a_reading(reply: Reply, error: str) -> None:
    with serve_asgi(Replay({("GET", "/metrics"): reply})) as url, polling([url]) as (poller,):
        assert eventually(lambda: poller.failures >= 1)
        assert poller.load() is None and error in poller.error


def test_a_reading_goes_stale_once_the_engine_stops_answering() -> None:
    engine = FakeSGLang(FakeScript(tokens=4))
    config = EngineLoadConfig(poll_s=0.1, timeout_s=0.5, stale_after=10)  # stale 1 s after the last reading
    with serve_asgi(engine) as url, polling([url], config) as (poller,):
        assert eventually(lambda: poller.load() is not None)
        engine.scheduler.enabled = False  # /metrics answers 404 from now on
        failures = poller.failures
        assert eventually(lambda: poller.failures > failures)
        assert poller.load() is not None  # not stale yet: one failed poll is not enough
        assert eventually(lambda: poller.load() is None, within_s=3.0)
        assert time.monotonic() - poller.read_at > config.stale_after * config.poll_s
        engine.scheduler.enabled = True
        assert eventually(lambda: poller.load() is not None) and poller.error == ""


def test_a_refused_connection_is_a_failure_not_an_error() -> None:
    async def main() -> tuple[bool, str]:
        poller = EnginePoller(dead_url(), {}, FAST, window_s=5.0)
        async with aiohttp.ClientSession() as session:
            return await poller.poll(session), poller.error

    ok, error = asyncio.run(main())
    assert not ok and error.startswith("ClientConnectorError")
