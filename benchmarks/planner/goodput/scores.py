"""What a set of measured points says, per arm and rate: accuracy, SLO attainment, correct-within-SLO goodput per GPU,
requests shed, Cascadia's smallest SLO scale, with intervals by bootstrap over questions and over arrival seeds.

A request counts as good when it answered correctly with its TTFT and its end-to-end latency within their SLOs; a
failed request (refused, shed, timed out) is never good and is counted as shed. Goodput per GPU is the offered rate
times the good share, over the arm's GPUs.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any

import numpy as np

ATTAINMENT = 0.95  # the share of requests a rate must keep within SLO to be held (and Cascadia's SLO-scale level)
# What the emulated engines saw, summed over the fleet, so that a point says what its front cost them.
# `aborts_received`: /abort_request posts; `stopped_on_disconnect`: streams an engine ended because their connection
# closed (the fallback of an abort that never came); `tokens_sent`: tokens generated, a cut stream's included;
# `gpu_busy_s`: emulated busy time.
ENGINE_COUNTS = ("aborts_received", "stopped_on_disconnect", "tokens_sent", "gpu_busy_s")


def scale_needed(row: dict[str, Any], ttft_slo_s: float, e2e_slo_s: float) -> float:
    """The smallest multiple of both SLOs this request met (inf: it failed)."""
    if row["error"] is not None or row["ttft_s"] is None or row["e2e_s"] is None:
        return float("inf")
    return max(row["ttft_s"] / ttft_slo_s, row["e2e_s"] / e2e_slo_s)


def point_stats(rows: list[dict[str, Any]], rate: float, gpus: int, ttft_slo_s: float, e2e_slo_s: float
                ) -> dict[str, float]:
    n = len(rows)
    scale = np.array([scale_needed(r, ttft_slo_s, e2e_slo_s) for r in rows])
    within = scale <= 1.0
    correct = np.array([r["correct"] and r["error"] is None for r in rows])
    good = within & correct
    e2e = np.array([float("inf") if r["error"] is not None or r["e2e_s"] is None else r["e2e_s"] for r in rows])
    return {"requests": n, "accuracy": float(correct.mean()), "slo_attainment": float(within.mean()),
            "slo_attainment_e2e": float(np.mean(e2e <= e2e_slo_s)),
            "p95_e2e_s": float(np.sort(e2e)[math.ceil(0.95 * n) - 1]) if n else float("inf"),
            "good_share": float(good.mean()), "goodput_per_gpu": rate * float(good.mean()) / gpus,
            "shed": float(np.mean([r["error"] is not None for r in rows])),
            "min_slo_scale": float(np.sort(scale)[math.ceil(ATTAINMENT * n) - 1]) if n else float("inf")}


def bootstrap(points: list[dict[str, Any]], ttft_slo_s: float, e2e_slo_s: float, resamples: int = 1000,
              seed: int = 0) -> dict[str, list[float]]:
    """95 % intervals of each stat: seeds drawn with replacement, then questions with replacement (every request of
    a drawn question, in each drawn seed's run)."""
    rng = np.random.default_rng(seed)
    questions = sorted({r["q"] for p in points for r in p["requests"]})
    by_q = _by_question(points)
    rate, gpus = points[0]["rate"], points[0]["gpus"]
    draws: dict[str, list[float]] = defaultdict(list)
    for _ in range(resamples):
        seeds = rng.integers(len(points), size=len(points))
        qs = rng.integers(len(questions), size=len(questions))
        rows = [r for s in seeds for q in qs for r in by_q[s][questions[q]]]
        if rows:
            for k, v in point_stats(rows, rate, gpus, ttft_slo_s, e2e_slo_s).items():
                draws[k].append(v)
    return {k: _interval(v) for k, v in draws.items() if k not in ("requests", "min_slo_scale", "p95_e2e_s")}


def paired_difference(first: list[dict[str, Any]], second: list[dict[str, Any]], ttft_slo_s: float,
                      e2e_slo_s: float, resamples: int = 1000, seed: int = 0) -> dict[str, Any]:
    """`first` - `second`, two arms measured at one rate on the same arrival seeds (the i-th point of each: the same
    seed) and the same questions: each stat's difference and its 95 % interval, both arms resampled with the same
    draws of seeds and questions (so what the two share, the questions' difficulty and the arrivals, cancels)."""
    if len(first) != len(second) or [p["seed"] for p in first] != [p["seed"] for p in second]:
        raise ValueError("paired points need the same arrival seeds, in the same order")
    rng = np.random.default_rng(seed)
    questions = sorted({r["q"] for p in first for r in p["requests"]})
    sides = [(_by_question(points), points[0]["rate"], points[0]["gpus"]) for points in (first, second)]
    draws: dict[str, list[float]] = defaultdict(list)
    for _ in range(resamples):
        seeds = rng.integers(len(first), size=len(first))
        qs = rng.integers(len(questions), size=len(questions))
        stats = [point_stats([r for s in seeds for q in qs for r in by_q[s][questions[q]]], rate, gpus, ttft_slo_s,
                             e2e_slo_s) for by_q, rate, gpus in sides]
        for k in PAIRED_STATS:
            draws[k].append(stats[0][k] - stats[1][k])
    whole = [point_stats([r for p in points for r in p["requests"]], points[0]["rate"], points[0]["gpus"], ttft_slo_s,
                         e2e_slo_s) for points in (first, second)]
    return {k: {"first": round(whole[0][k], 4), "second": round(whole[1][k], 4),
                "difference": round(whole[0][k] - whole[1][k], 4), "ci95": _interval(draws[k])} for k in PAIRED_STATS}


PAIRED_STATS = ("goodput_per_gpu", "slo_attainment", "good_share", "accuracy", "p95_e2e_s", "min_slo_scale")


def _by_question(points: list[dict[str, Any]]) -> list[defaultdict[str, list[dict[str, Any]]]]:
    """Per point, its requests by question."""
    by_q: list[defaultdict[str, list[dict[str, Any]]]] = [defaultdict(list) for _ in points]
    for i, p in enumerate(points):
        for r in p["requests"]:
            by_q[i][r["q"]].append(r)
    return by_q


def _interval(values: list[float]) -> list[float]:
    return [round(float(np.quantile(values, 0.025)), 4), round(float(np.quantile(values, 0.975)), 4)]


def summarize(points: list[dict[str, Any]], ttft_slo_s: float, e2e_slo_s: float, resamples: int) -> dict[str, Any]:
    """One arm at one rate, its seeds pooled."""
    rows = [r for p in points for r in p["requests"]]
    stats = point_stats(rows, points[0]["rate"], points[0]["gpus"], ttft_slo_s, e2e_slo_s)
    tiers = Counter(r["tier"] or "none" for r in rows)
    errors = Counter(str(r["status"] or r["error"])[:40] for r in rows if r["error"] is not None)
    return {**{k: round(v, 4) if math.isfinite(v) else None for k, v in stats.items()}, "seeds": len(points),
            "ci95": bootstrap(points, ttft_slo_s, e2e_slo_s, resamples) if resamples else {},
            "tier_shares": {t: round(c / len(rows), 4) for t, c in tiers.most_common()},
            "shed_by": dict(errors.most_common(5)), "lag_s_max": max(p["lag_s"] for p in points),
            "engines": pooled_engines(points)}


def pooled_engines(points: list[dict[str, Any]]) -> dict[str, float]:
    """ENGINE_COUNTS of several runs (points) summed ({} when one was measured before they were recorded)."""
    if not all("engines" in p for p in points):
        return {}
    return {k: round(sum(p["engines"][k] for p in points), 4) for k in ENGINE_COUNTS}


def held_rate(by_rate: dict[float, dict[str, Any]], accuracy_target: float) -> float | None:
    """The highest rate whose attainment is >= ATTAINMENT and accuracy >= the target (None: none is)."""
    held = [r for r, s in by_rate.items() if s["slo_attainment"] >= ATTAINMENT and s["accuracy"] >= accuracy_target]
    return max(held) if held else None
