"""Scores of a router family over repeated fold assignments, pooled (issue 63 item 2: one fold assignment, one
seed, and a lead of +0.024 APGR could be split luck).

Each repeat r is a complete out-of-fold run with seed r (its own outer folds and inner-CV seeds); what varies is
said by the caller. For each quantity the report gives the mean over repeats, min..max over repeats, and a 95%
interval from the **pooled bootstrap**: per repeat, a percentile bootstrap over questions (its own seeded
resamples), the samples of all repeats concatenated and their 2.5-97.5 percentiles taken. The pooled samples are a
mixture of the repeats' sampling distributions, so the interval's width is the question-to-question variation plus
the spread of the estimate between splits (conservative for the repeat mean, whose split noise is smaller).

* APGR difference to a baseline (`repeated_difference`): `evaluate.apgr_difference`, paired (both routers on the
  same resampled questions), 1,000 resamples per repeat; also how many repeats' own intervals exclude zero.
* A named operating point beside the random-route null (`repeated_versus_null`): cascade/router/train/null.py's
  nested calibration (thresholds set on the other folds, `seed` r for its folds, draws and resamples), the
  router - null differences of accuracy, cost and token share pooled the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cascade.router import evaluate as ev
from cascade.router.operating import route_score
from cascade.router.train.calibration import HINT_GAP_RECOVERED
from cascade.router.train.null import DEFAULT_FOLDS, RESAMPLES, null_samples

MAX_REPEATS = 20  # each repeat refits every family on every fold: 20 is already ~an hour on this CPU
RESAMPLES_PER_REPEAT = 1000
METRICS = ("accuracy", "cost", "token_share")


def check_repeats(repeats: int) -> None:
    if not 1 <= repeats <= MAX_REPEATS:
        raise ValueError(f"repeats must be 1 to {MAX_REPEATS}, got {repeats}")


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Mean, min and max over repeats, and each repeat's value (rounded to 4 decimals)."""
    array = np.asarray(values, dtype=float)
    if array.ndim != 1 or not len(array):
        raise ValueError(f"one value per repeat, at least one, got shape {array.shape}")
    return {"mean": _round(array.mean()), "min": _round(array.min()), "max": _round(array.max()),
            "per_repeat": [_round(v) for v in array]}


def pooled(points: Sequence[float], samples: Sequence[np.ndarray]) -> dict[str, Any]:
    """`spread` of the per-repeat point estimates and the pooled 95% interval of their bootstrap samples."""
    if len(points) != len(samples):
        raise ValueError(f"{len(points)} point estimates but {len(samples)} sample sets")
    finite = np.concatenate([np.asarray(s, dtype=float).ravel() for s in samples])
    finite = finite[np.isfinite(finite)]
    if not len(finite):
        raise ValueError("no finite bootstrap sample to pool")
    low, high = np.percentile(finite, [2.5, 97.5])
    return spread(points) | {"ci95": [_round(low), _round(high)]}


def repeated_apgr(p_fail: Sequence[np.ndarray], correct: np.ndarray, costs: np.ndarray | None) -> dict[str, Any]:
    return spread([ev.apgr(ev.routing_curve(p, correct, costs)) for p in p_fail])


def repeated_difference(first: Sequence[np.ndarray], second: Sequence[np.ndarray], correct: np.ndarray,
                        resamples: int = RESAMPLES_PER_REPEAT) -> dict[str, Any]:
    """APGR(first[r]) - APGR(second[r]) pooled over repeats r (module docstring); repeat r's resamples follow seed r."""
    _check_lengths(first, second)
    points, samples, excluding = [], [], 0
    for seed, (a, b) in enumerate(zip(first, second, strict=True)):
        point, values = ev.apgr_difference(a, b, correct, resamples, seed=seed)
        points.append(point)
        samples.append(values)
        low, high = np.percentile(values, [2.5, 97.5]) if len(values) else (np.nan, np.nan)
        excluding += bool(low > 0 or high < 0)
    return pooled(points, samples) | {"repeats_whose_interval_excludes_0": excluding}


def repeated_versus_null(p_fail: Sequence[np.ndarray], correct: np.ndarray, *, costs: np.ndarray | None,
                         tokens: np.ndarray | None, draws: int, folds: int = DEFAULT_FOLDS, hint: str = "best",
                         resamples: int = RESAMPLES) -> dict[str, Any]:
    """``hint``'s operating point out of fold (nested) beside the random-route null, over repeats r (null seed r):
    the router's accuracy, cost and token share (spread over repeats), the null's mean, and router - null pooled."""
    check_repeats(len(p_fail))
    if hint not in HINT_GAP_RECOVERED:
        raise ValueError(f"no operating point named {hint!r}; the null reports {', '.join(HINT_GAP_RECOVERED)}")
    router, null, points, samples = [], [], [], []
    for seed, values in enumerate(p_fail):
        by_hint = null_samples(route_score(values), correct, costs=costs, tokens=tokens, draws=draws, folds=folds,
                               seed=seed, resamples=resamples)
        s = by_hint[hint]["out_of_fold"]
        router.append(s.router)
        null.append(s.null.mean(axis=0))
        points.append(s.router - s.null.mean(axis=0))
        samples.append(s.differences)
    report: dict[str, Any] = {"hint": hint, "draws": draws, "folds": folds}
    for m, metric in enumerate(METRICS):
        if not np.isfinite([r[m] for r in router]).all():
            report[metric] = None  # token counts unknown
            continue
        report[metric] = {"router": spread([r[m] for r in router]), "null_mean": _round(np.mean([n[m] for n in null])),
                          "router_minus_null": pooled([p[m] for p in points], [s[:, m] for s in samples])}
    return report


def _check_lengths(first: Sequence[np.ndarray], second: Sequence[np.ndarray]) -> None:
    check_repeats(len(first))
    if len(first) != len(second):
        raise ValueError(f"{len(first)} repeats against {len(second)} of the baseline")


def _round(value: float) -> float:
    return round(float(value), 4)
