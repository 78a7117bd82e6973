"""The fake SGLang's scheduler as SGLang's `/metrics` shows it (served with `--enable-metrics`).

`FakeScheduler` runs each chat request of the fake (cascade/testing/fakes/sglang.py): with `max_running` > 0
(SGLang's --max-running-requests) a request beyond that many waits in a queue before it starts, so its TTFT
grows with the queue, as on a real engine at capacity. What it counts is what it publishes, in SGLang's names,
types and labels (sglang/srt/observability/metrics_collector.py) and in the text that SGLang's multiprocess
Prometheus collector writes (help "Multiprocess metric", labels sorted, no `_created` series):

* `sglang:num_running_reqs`, `sglang:num_queue_reqs`: requests holding a batch slot, requests waiting for one;
* `sglang:token_usage`: running / max_running (the fake has no KV pool: a full batch stands for a full pool);
* `sglang:time_to_first_token_seconds{is_streaming}`: from the request's arrival to its first token (a stream's
  first chunk with text or a finish reason; the whole response for a non-streamed one), SGLang's buckets.

`enabled = False` answers `/metrics` with a 404, as SGLang without `--enable-metrics` does.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import Awaitable, Callable, Iterator

import msgspec
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from cascade.engines.asgi import Message, Receive, Send, send_bytes, send_json

# SGLang's default TTFT buckets (TokenizerMetricsCollector), seconds.
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, float("inf"))
_HELP = "Multiprocess metric"
Handler = Callable[[Receive, Send], Awaitable[None]]


class FakeScheduler:
    def __init__(self, model: Callable[[], str], max_running: int = 0) -> None:
        self.model = model  # SGLang's served model name (the `model_name` label)
        self.max_running = max_running
        self.enabled = True
        self.running = 0
        self.queued = 0
        self._slots: asyncio.Semaphore | None = None
        # is_streaming -> (count per bucket, not cumulative; sum of seconds)
        self._ttft: dict[bool, tuple[list[int], float]] = {}

    async def run(self, handler: Handler, receive: Receive, send: Send) -> None:
        """Serve one chat request with `handler` once it has a batch slot, timing its first token."""
        arrived = time.perf_counter()
        slots = self._slots_now()
        self.queued += 1
        try:
            if slots is not None:
                await slots.acquire()
        finally:
            self.queued -= 1
        self.running += 1
        try:
            await handler(receive, _FirstToken(send, lambda stream: self._observe(stream, arrived)))
        finally:
            self.running -= 1
            if slots is not None:
                slots.release()

    async def send_metrics(self, send: Send) -> None:
        if not self.enabled:
            await send_json(send, 404, {"detail": "Not Found"})
            return
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self))
        await send_bytes(send, 200, b"text/plain; version=0.0.4; charset=utf-8", generate_latest(registry))

    def gauges(self) -> list[tuple[str, float]]:
        """The scheduler gauges /metrics publishes, by SGLang name (a subclass's seam: the GPU emulator's KV pool)."""
        usage = self.running / self.max_running if self.max_running else 0.0
        return [("sglang:num_running_reqs", self.running), ("sglang:num_queue_reqs", self.queued),
                ("sglang:token_usage", usage)]

    def _slots_now(self) -> asyncio.Semaphore | None:
        if not self.max_running:
            return None
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_running)
        return self._slots

    def _observe(self, stream: bool, arrived: float) -> None:
        seconds = time.perf_counter() - arrived
        counts, total = self._ttft.get(stream) or ([0] * len(TTFT_BUCKETS), 0.0)
        counts[bisect.bisect_left(TTFT_BUCKETS, seconds)] += 1
        self._ttft[stream] = (counts, total + seconds)


class _FirstToken:
    """The ASGI `send` of one request: calls `first(stream)` once, when its first token goes out."""

    def __init__(self, send: Send, first: Callable[[bool], None]) -> None:
        self.send = send
        self.first: Callable[[bool], None] | None = first
        self.stream = False
        self.ok = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.ok = message["status"] == 200
            self.stream = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                              for k, v in message.get("headers", []))
        elif (message["type"] == "http.response.body" and self.first is not None and self.ok
              and (not self.stream or _has_token(message.get("body", b"")))):
            self.first(self.stream)
            self.first = None
        await self.send(message)


def _has_token(payload: bytes) -> bool:
    """Whether SSE bytes carry a chunk with text, reasoning or a finish reason (not the opening role chunk)."""
    for line in payload.split(b"\n"):
        if not line.startswith(b"data: {"):
            continue
        try:
            chunk = msgspec.json.decode(line[6:])
        except msgspec.DecodeError:
            continue
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content") or delta.get("reasoning_content") or choice.get("finish_reason"):
                return True
    return False


class _Collector(Collector):
    def __init__(self, scheduler: FakeScheduler) -> None:
        self.scheduler = scheduler

    def collect(self) -> Iterator[Metric]:
        s = self.scheduler
        # SchedulerMetricsCollector's labels (one scheduler: every rank 0), TokenizerMetricsCollector's.
        names = ["engine_type", "model_name", "moe_ep_rank", "pp_rank", "tp_rank"]
        values = ["unified", s.model(), "0", "0", "0"]
        for name, value in s.gauges():
            gauge = GaugeMetricFamily(name, _HELP, labels=names)
            gauge.add_metric(values, float(value))
            yield gauge
        ttft = HistogramMetricFamily("sglang:time_to_first_token_seconds", _HELP,
                                     labels=["engine_type", "is_streaming", "model_name"])
        for stream, (counts, total) in sorted(s._ttft.items()):
            cumulative, buckets = 0, []
            for bound, count in zip(TTFT_BUCKETS, counts, strict=True):
                cumulative += count
                buckets.append((floatToGoString(bound), float(cumulative)))
            ttft.add_metric(["unified", "true" if stream else "false", s.model()], buckets, total)
        if ttft.samples:  # like SGLang's: a histogram nothing was observed in has no series, nor a HELP line
            yield ttft
