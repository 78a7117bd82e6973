"""Arrival schedules: when each request is sent, as offsets in seconds from the run start.

All schedules start at 0 and come from a seeded `numpy.random.Generator`:

* `poisson`: exponential gaps with mean 1/rate.
* `gamma`: gaps ~ Gamma(shape=burstiness, scale=1/(rate*burstiness)) as in vLLM's benchmark: the mean
  gap stays 1/rate while the coefficient of variation is 1/sqrt(burstiness) (burstiness 1 is Poisson,
  < 1 burstier, > 1 smoother).
* `constant`: exactly 1/rate apart.
* trace replay: the timestamps of a BurstGPT-format CSV, optionally rescaled to a target rate.

With a request count, random schedules can be normalized (as recent vLLM does) so that the n-th
request falls exactly at (n-1)/rate: the realized rate then equals the target instead of wandering
by ~1/sqrt(n), which separates the client's timing error from sampling noise.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import msgspec
import numpy as np

ARRIVALS = ("poisson", "gamma", "constant", "trace")


class Trace(msgspec.Struct, frozen=True):
    """A replayable trace: arrival offsets (s, from 0) and per-request token counts."""

    times_s: list[float]
    request_tokens: list[int]
    response_tokens: list[int]


def _check_rate(rate: float) -> None:
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"rate must be a positive number of requests per second, got {rate}")


def gaps(kind: str, rate: float, n: int, rng: np.random.Generator, burstiness: float = 1.0) -> np.ndarray:
    """`n` inter-arrival gaps (seconds) for `kind` at `rate` requests per second."""
    _check_rate(rate)
    if kind == "poisson":
        return rng.exponential(1.0 / rate, size=n)
    if kind == "gamma":
        if burstiness <= 0:
            raise ValueError(f"burstiness must be > 0, got {burstiness}")
        return rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    if kind == "constant":
        return np.full(n, 1.0 / rate)
    raise ValueError(f"unknown arrival process {kind!r}; choose one of {', '.join(ARRIVALS[:3])}")


def schedule(
    kind: str, rate: float, rng: np.random.Generator, *, n: int | None = None, duration_s: float | None = None,
    burstiness: float = 1.0, normalize: bool = True,
) -> np.ndarray:
    """Send offsets for at most `n` requests and within `duration_s` seconds (at least one bound)."""
    if n is None and duration_s is None:
        raise ValueError("bound the run with a request count, a duration, or both")
    if kind == "constant":  # exact multiples, no accumulated rounding
        _check_rate(rate)
        count = n if n is not None else math.ceil(rate * (duration_s or 0.0)) + 1
        offsets = np.arange(count) / rate
    elif n is not None:
        offsets = _offsets(gaps(kind, rate, n, rng, burstiness))
        if normalize and n > 1 and offsets[-1] > 0:
            offsets *= ((n - 1) / rate) / offsets[-1]
    else:
        assert duration_s is not None
        chunks: list[np.ndarray] = []
        end = 0.0
        while end < duration_s:  # draw in blocks until the window is covered
            block = gaps(kind, rate, max(16, int(rate * duration_s * 1.2)), rng, burstiness)
            chunks.append(block)
            end = float(sum(c.sum() for c in chunks))
        offsets = _offsets(np.concatenate(chunks))
    if duration_s is not None:
        offsets = offsets[offsets < duration_s]
    return offsets


def _offsets(gap: np.ndarray) -> np.ndarray:
    """Cumulative send times with the first request at 0."""
    out = np.empty(len(gap))
    if len(gap):
        out[0] = 0.0
        np.cumsum(gap[:-1], out=out[1:])
    return out


def load_trace(path: str | Path) -> Trace:
    """Read a BurstGPT-style CSV: `Timestamp` (seconds), `Request tokens`, `Response tokens` columns
    (header names matched case-insensitively; other columns such as Model or Log Type are ignored)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise ValueError(f"cannot read trace {path}: {exc.strerror or exc}") from None
    reader = csv.DictReader(text.splitlines())
    columns = {c.strip().lower(): c for c in reader.fieldnames or []}
    want: dict[str, str | None] = {"timestamp": None, "request tokens": None, "response tokens": None}
    for key in want:
        want[key] = columns.get(key) or next((c for k, c in columns.items() if key.replace(" ", "_") == k), None)
    missing = [k for k, v in want.items() if v is None]
    if missing:
        raise ValueError(f"trace {path} lacks column(s) {', '.join(missing)}; it has: {', '.join(columns)}")
    times, req, resp = [], [], []
    for line, row in enumerate(reader, start=2):
        try:
            times.append(float(row[want["timestamp"] or ""]))
            req.append(int(float(row[want["request tokens"] or ""])))
            resp.append(int(float(row[want["response tokens"] or ""])))
        except (TypeError, ValueError):
            raise ValueError(f"trace {path} line {line}: timestamp and token counts must be numbers") from None
    if not times:
        raise ValueError(f"trace {path} has no rows")
    order = np.argsort(np.asarray(times), kind="stable")
    t = np.asarray(times)[order]
    return Trace(times_s=(t - t[0]).tolist(), request_tokens=[req[i] for i in order],
                 response_tokens=[resp[i] for i in order])


def trace_schedule(trace: Trace, rate: float | None = None, n: int | None = None,
                   duration_s: float | None = None) -> np.ndarray:
    """The trace's offsets, time-scaled so that its mean rate is `rate` (if given), then bounded."""
    offsets = np.asarray(trace.times_s, dtype=float)
    if n is not None:
        offsets = offsets[:n]
    if rate is not None and len(offsets) > 1 and offsets[-1] > 0:
        offsets = offsets * (((len(offsets) - 1) / rate) / offsets[-1])
    if duration_s is not None:
        offsets = offsets[offsets < duration_s]
    return offsets
