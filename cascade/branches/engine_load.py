"""An SGLang engine's own load, read from its Prometheus `/metrics` (served with `--enable-metrics`).

Names, types and labels are SGLang's (sglang/srt/observability/metrics_collector.py, 0.5.x):

* `sglang:num_running_reqs`, `sglang:num_queue_reqs` (gauges, one series per scheduler, labels `model_name`,
  `engine_type`, `tp_rank`, `pp_rank`, `moe_ep_rank`, and `dp_rank` with data parallelism; with priority
  scheduling the total is the series with `priority=""` and each priority has its own series beside it);
* `sglang:token_usage` (gauge, the KV pool in use, 0..1: the fullest of its pools);
* `sglang:time_to_first_token_seconds` (histogram, labels `model_name`, `engine_type`, `is_streaming`).

A scheduler sets the gauges when it logs stats (each prefill batch, every `--decode-log-interval` decode steps,
and when it turns idle), so a reading is as recent as the engine's last step. Only ranks that log stats publish
(tensor-parallel rank 0 unless `--enable-metrics-for-all-schedulers`): series of one data-parallel rank are read
once (their largest), and data-parallel ranks are added up. Plain functions over text, no I/O:
cascade/branches/engine_poller.py fetches it.
"""

from __future__ import annotations

import math
from collections import defaultdict

import msgspec
from prometheus_client.parser import text_string_to_metric_families

RUNNING = "sglang:num_running_reqs"
QUEUED = "sglang:num_queue_reqs"
TOKEN_USAGE = "sglang:token_usage"
TTFT = "sglang:time_to_first_token_seconds"
_WANTED = frozenset((RUNNING, QUEUED, TOKEN_USAGE, TTFT, f"{TTFT}_bucket", f"{TTFT}_sum", f"{TTFT}_count"))
# What one reading may hold. SGLang's /metrics is tens of KB per scheduler; the lines read here are a few per
# data-parallel rank plus the TTFT histogram's buckets (about 40 per label set). Past these, the text is refused
# before the Prometheus parser (about 270 ms of CPU per MiB of wanted lines) sees it: an engine that answers with
# megabytes must not cost the gateway seconds of CPU every poll.
METRICS_BODY_BYTES = 4 << 20
MAX_WANTED_LINES = 20_000


class Histogram(msgspec.Struct, frozen=True):
    """A cumulative Prometheus histogram: `cumulative[i]` observations were <= `bounds[i]` (the last bound +inf)."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    total: float  # seconds, summed over observations

    @property
    def count(self) -> float:
        return self.cumulative[-1] if self.cumulative else 0.0

    def since(self, earlier: Histogram) -> Histogram | None:
        """The observations made after `earlier`; None when the engine restarted in between (counts went down)
        or its buckets changed."""
        if earlier.bounds != self.bounds or any(b < a for a, b in zip(earlier.cumulative, self.cumulative,
                                                                        strict=True)):
            return None
        return Histogram(self.bounds, tuple(b - a for a, b in zip(earlier.cumulative, self.cumulative, strict=True)),
                         max(0.0, self.total - earlier.total))

    def plus(self, other: Histogram) -> Histogram | None:
        """Both histograms' observations together (None when their buckets differ)."""
        if other.bounds != self.bounds:
            return None
        return Histogram(self.bounds, tuple(a + b for a, b in zip(self.cumulative, other.cumulative, strict=True)),
                         self.total + other.total)

    def quantile(self, q: float) -> float | None:
        """The `q` quantile (0..1), interpolated within its bucket as Prometheus' histogram_quantile does; the
        largest finite bound when it falls in the +inf bucket; None without observations."""
        count = self.count
        if count <= 0:
            return None
        rank = q * count
        lower, below = 0.0, 0.0
        for bound, cumulative in zip(self.bounds, self.cumulative, strict=True):
            if cumulative >= rank and cumulative > below:
                if math.isinf(bound):
                    return lower
                return lower + (bound - lower) * (rank - below) / (cumulative - below)
            lower, below = (bound if not math.isinf(bound) else lower), cumulative
        return lower


class EngineLoad(msgspec.Struct, frozen=True, kw_only=True):
    """One reading of an engine's `/metrics`."""

    running: int  # requests in its running batch
    queued: int  # requests waiting for a place in it
    token_usage: float | None = None  # share of its KV pool in use (None: not published)
    ttft: Histogram | None = None  # every TTFT it observed since it started (streamed or not, every priority)


def parse_sglang_metrics(text: str) -> EngineLoad:
    """An EngineLoad from SGLang's Prometheus text; ValueError when the text is not that (an error page, garbage,
    or an engine that has not published its queue yet)."""
    lines = [line for line in text.splitlines() if _name(line) in _WANTED]
    if len(lines) > MAX_WANTED_LINES:
        raise ValueError(f"{len(lines)} lines of the load metrics, over {MAX_WANTED_LINES}: not a reading to parse")
    wanted = "\n".join(lines)
    samples: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for family in text_string_to_metric_families(wanted):
        for sample in family.samples:
            samples[sample.name].append((sample.labels, float(sample.value)))
    running, queued = _requests(samples[RUNNING], RUNNING), _requests(samples[QUEUED], QUEUED)
    usage = [value for _, value in samples[TOKEN_USAGE] if math.isfinite(value)]
    return EngineLoad(running=running, queued=queued, token_usage=max(usage) if usage else None,
                      ttft=_histogram(samples))


def _name(line: str) -> str:
    """The metric a line is about (`# HELP name ...`, `# TYPE name ...` or a sample), else ''."""
    if line.startswith("# HELP ") or line.startswith("# TYPE "):
        return line[7:].split(" ", 1)[0]
    if line.startswith("#"):
        return ""
    end = len(line)
    for stop in ("{", " "):
        at = line.find(stop)
        if at >= 0:
            end = min(end, at)
    return line[:end]


def _requests(samples: list[tuple[dict[str, str], float]], name: str) -> int:
    """A request gauge's total: the series of one data-parallel rank read once (their largest: ranks that log the
    same scheduler), the ranks added up. Per-priority series (`priority` set) are parts of a total: skipped."""
    by_rank: dict[str, float] = {}
    for labels, value in samples:
        if labels.get("priority", "") or not math.isfinite(value) or value < 0:
            continue
        rank = labels.get("dp_rank", "")
        by_rank[rank] = max(by_rank.get(rank, 0.0), value)
    if not by_rank:
        raise ValueError(f"no `{name}` sample: not SGLang's /metrics, or the engine has not published its load yet")
    return round(sum(by_rank.values()))


def _histogram(samples: dict[str, list[tuple[dict[str, str], float]]]) -> Histogram | None:
    """The TTFT histogram over every series (each request is observed in exactly one)."""
    buckets: dict[float, float] = defaultdict(float)
    for labels, value in samples[f"{TTFT}_bucket"]:
        if "le" not in labels:
            raise ValueError(f"a `{TTFT}_bucket` sample without `le`")
        buckets[float(labels["le"])] += value
    if not buckets or not math.isinf(max(buckets)):
        return None
    bounds = tuple(sorted(buckets))
    return Histogram(bounds, tuple(buckets[b] for b in bounds), sum(v for _, v in samples[f"{TTFT}_sum"]))
