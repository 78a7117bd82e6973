"""Summaries of a run's request records: latency percentiles, rates, goodput, SLO attainment, accuracy.

Definitions (vLLM's benchmark where it has one):
* duration: from the run start (first scheduled send) to the last response byte.
* achieved_rate_rps: (sent - 1) / (last send - first send), the rate at which requests actually left.
* request_throughput_rps / output_throughput_tps: completed requests / output tokens per second of duration.
* tpot: (e2el - ttft) / (output tokens - 1) per request with > 1 token; itl pools every chunk gap.
* a request meets the SLO when it completed without error and each given bound (ttft_ms, tpot_ms,
  e2el_ms) holds; goodput_rps = such requests / duration; slo_attainment = such requests / all requests.
* accuracy = correct / requests with a reference (a failed request is not correct);
  correct_within_slo = correct and meeting the SLO / requests with a reference.
* correct_goodput_rps: requests both graded correct and meeting the SLO / duration (the headline for a
  quality-aware gateway: a fast wrong answer and a right late one both count 0), with a 95% bootstrap
  interval (`correct_goodput_ci95`: the count resampled over the run's requests, seeded, duration fixed).
* cost (when responses carry one: cascade's `cascade.cost`): `total` over the requests that carried it (failed and
  wrong answers included: they were paid for), `per_request` over those requests, and `per_correct_answer` = total /
  requests graded correct (null when none is): what one right answer costs.
* min_slo_scale: the smallest factor s such that `attainment_level` of all requests meet the SLO with
  every bound multiplied by s (Cascadia's metric); null when failures exceed 1 - attainment_level.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from cascade.data.records import RequestRecord

SLO_KEYS = ("ttft_ms", "tpot_ms", "e2el_ms")
BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 0
PERCENTILES = (50, 90, 99)


def parse_slo(spec: str | None) -> dict[str, float]:
    """`ttft_ms=500,tpot_ms=50,e2el_ms=10000` -> a dict; unknown keys or non-positive values are errors."""
    slo: dict[str, float] = {}
    for item in (spec or "").split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in SLO_KEYS:
            raise ValueError(f"--slo takes {'=..,'.join(SLO_KEYS)}=.. (milliseconds), got {item.strip()!r}")
        try:
            bound = float(value)
        except ValueError:
            raise ValueError(f"--slo {key} must be a number of milliseconds, got {value!r}") from None
        if not bound > 0:
            raise ValueError(f"--slo {key} must be > 0, got {bound:g}")
        slo[key] = bound
    return slo


def percentiles(values: Iterable[float]) -> dict[str, float | None]:
    arr = np.fromiter(values, dtype=float)
    if arr.size == 0:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    out: dict[str, float | None] = {f"p{p}": round(float(np.percentile(arr, p)), 3) for p in PERCENTILES}
    out["mean"] = round(float(arr.mean()), 3)
    return out


def slo_scale_needed(record: RequestRecord, slo: dict[str, float]) -> float:
    """The smallest factor on every SLO bound under which this request meets them (inf if it failed)."""
    if not record.ok:
        return math.inf
    scale = 0.0
    for key, bound in slo.items():
        value = getattr(record, key)
        if value is None:
            if key == "tpot_ms":  # single-token answers have no TPOT: nothing to meet
                continue
            return math.inf
        scale = max(scale, value / bound)
    return scale


def meets_slo(record: RequestRecord, slo: dict[str, float], scale: float = 1.0) -> bool:
    return slo_scale_needed(record, slo) <= scale


def min_slo_scale(records: Sequence[RequestRecord], slo: dict[str, float], level: float = 0.95) -> float | None:
    """Cascadia's metric: the smallest s with a fraction >= `level` of requests meeting the SLO scaled by s."""
    if not records or not slo:
        return None
    needed = sorted(slo_scale_needed(r, slo) for r in records)
    k = max(1, math.ceil(level * len(needed) - 1e-9))
    value = needed[k - 1]
    return None if math.isinf(value) else round(value, 4)


def _rate(count: int, seconds: float) -> float:
    return round(count / seconds, 4) if seconds > 0 else 0.0


def correct_goodput(on_time_correct: int, requests: int, duration_s: float,
                    seed: int = BOOTSTRAP_SEED) -> tuple[float, list[float]]:
    """Correct-within-SLO requests per second and its 95% bootstrap interval.

    Resampling the run's requests with replacement and counting those correct within the SLO is a
    Binomial(requests, on_time_correct / requests) draw, so the bootstrap is drawn as that directly (exact,
    and cheap for 100,000 requests)."""
    counts = np.random.default_rng(seed).binomial(requests, on_time_correct / requests, BOOTSTRAP_SAMPLES)
    low, high = np.percentile(counts, [2.5, 97.5]) / duration_s
    return round(on_time_correct / duration_s, 4), [round(float(low), 4), round(float(high), 4)]


def group_stats(records: Sequence[RequestRecord], slo: dict[str, float], duration_s: float) -> dict[str, Any]:
    """Counts, latency percentiles, goodput, attainment and accuracy for a set of requests."""
    done = [r for r in records if r.ok]
    good = [r for r in records if meets_slo(r, slo)]
    graded = [r for r in records if r.reference is not None]
    correct = [r for r in graded if r.correct]
    on_time_correct = sum(1 for r in correct if meets_slo(r, slo))
    correct_rps, correct_ci = (correct_goodput(on_time_correct, len(records), duration_s)
                               if graded and duration_s > 0 else (None, None))
    return {
        "requests": len(records),
        "completed": len(done),
        "failed": len(records) - len(done),
        "ttft_ms": percentiles(r.ttft_ms for r in done if r.ttft_ms is not None),
        "tpot_ms": percentiles(r.tpot_ms for r in done if r.tpot_ms is not None),
        "itl_ms": percentiles(x for r in done for x in r.itl_ms),
        "e2el_ms": percentiles(r.e2el_ms for r in done if r.e2el_ms is not None),
        "output_tokens_mean": round(float(np.mean([r.output_tokens for r in done])), 2) if done else None,
        # Answers the length limit cut (finish_reason "length"): a cut reasoning answer has no final number to grade.
        "truncated": sum(1 for r in done if r.finish_reason == "length"),
        "request_throughput_rps": _rate(len(done), duration_s),
        "output_throughput_tps": _rate(sum(r.output_tokens for r in done), duration_s),
        "goodput_rps": _rate(len(good), duration_s),
        "slo_attainment": round(len(good) / len(records), 4) if records else 0.0,
        "graded": len(graded),
        "accuracy": round(len(correct) / len(graded), 4) if graded else None,
        "correct_within_slo": round(on_time_correct / len(graded), 4) if graded else None,
        "correct_goodput_rps": correct_rps,
        "correct_goodput_ci95": correct_ci,
        "cost": cost_stats(records),
    }


def cost_stats(records: Sequence[RequestRecord]) -> dict[str, Any] | None:
    """What the requests cost, as their responses said (None when none said): total, per request that carried a
    cost, and per correct answer (null when nothing was graded correct). Costs that are not finite numbers >= 0 are
    left out: the server's, not ours."""
    costed = [r for r in records if r.cost is not None and math.isfinite(r.cost) and r.cost >= 0]
    if not costed:
        return None
    total = math.fsum(r.cost or 0.0 for r in costed)
    correct = sum(1 for r in records if r.correct)
    currencies = Counter(r.cost_currency for r in costed if r.cost_currency)
    return {"currency": currencies.most_common(1)[0][0] if currencies else None,
            "total": round(total, 12), "requests": len(costed), "per_request": round(total / len(costed), 12),
            "per_correct_answer": round(total / correct, 12) if correct and math.isfinite(total) else None}


def summarize(records: Sequence[RequestRecord], slo: dict[str, float], duration_s: float,
              attainment_level: float = 0.95) -> dict[str, Any]:
    """The run summary: DESIGN.md §4's `--json` keys first, then the extras and the breakdowns."""
    for r in records:
        r.meets_slo = meets_slo(r, slo)
    stats = group_stats(records, slo, duration_s)
    sends = sorted(r.sent_s for r in records if r.sent_s is not None)
    achieved = (len(sends) - 1) / (sends[-1] - sends[0]) if len(sends) > 1 and sends[-1] > sends[0] else 0.0
    lags = [r.dispatch_lag_ms for r in records if r.dispatch_lag_ms is not None]
    errors = Counter(_error_kind(r.error) for r in records if r.error is not None)
    summary: dict[str, Any] = {
        "requests": stats["requests"],
        "completed": stats["completed"],
        "failed": stats["failed"],
        "achieved_rate_rps": round(achieved, 4),
        "ttft_ms": stats["ttft_ms"],
        "tpot_ms": stats["tpot_ms"],
        "itl_ms": stats["itl_ms"],
        "e2el_ms": stats["e2el_ms"],
        "goodput_rps": stats["goodput_rps"],
        "slo_attainment": stats["slo_attainment"],
        "accuracy": stats["accuracy"],
        # extras
        "correct_goodput_rps": stats["correct_goodput_rps"],
        "correct_goodput_ci95": stats["correct_goodput_ci95"],
        "correct_within_slo": stats["correct_within_slo"],
        "graded": stats["graded"],
        "cost": stats["cost"],
        "duration_s": round(duration_s, 4),
        "request_throughput_rps": stats["request_throughput_rps"],
        "output_throughput_tps": stats["output_throughput_tps"],
        "output_tokens_mean": stats["output_tokens_mean"],
        "truncated": stats["truncated"],
        "dispatch_lag_ms": percentiles(lags),
        "slo": slo,
        "min_slo_scale": min_slo_scale(records, slo, attainment_level),
        "min_slo_scale_level": attainment_level,
        "errors": dict(errors.most_common(10)),
        "by_tier": _by(records, slo, duration_s, lambda r: r.tier or "unknown"),
        "by_quality": _by(records, slo, duration_s, lambda r: r.quality or "none"),
    }
    return summary


def _by(records: Sequence[RequestRecord], slo: dict[str, float], duration_s: float, key: Any) -> dict[str, Any]:
    groups: dict[str, list[RequestRecord]] = {}
    for r in records:
        groups.setdefault(str(key(r)), []).append(r)
    return {name: group_stats(rs, slo, duration_s) for name, rs in sorted(groups.items())}


def _error_kind(error: str) -> str:
    """Group error messages for the summary (numbers and ids vary; the kind does not)."""
    return error if len(error) <= 120 else error[:117] + "..."
