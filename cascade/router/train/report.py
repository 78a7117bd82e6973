"""The metrics `cascade router train` records in the card and `cascade router eval` prints: evaluate.report with a
bootstrap interval for APGR, the operating-point table, and the named points beside the random-route null in sample
and out of fold (cascade/router/train/null.py)."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from cascade.router import evaluate
from cascade.router.operating import Calibration, operating_table, reference_points, route_score
from cascade.router.outcomes import Outcomes
from cascade.router.train.null import random_null


def metrics_report(p_fail: np.ndarray, correct: np.ndarray, costs: np.ndarray | None) -> dict[str, Any]:
    """evaluate.report plus `apgr_ci95`: how far APGR would move on another sample of as many prompts (seeded
    percentile bootstrap over the prompts)."""
    result = evaluate.report(p_fail, correct, costs)
    result["apgr_ci95"] = [evaluate.finite(v) for v in evaluate.apgr_interval(p_fail, correct, costs)]
    return result


def operating_points(p_fail: np.ndarray, outcomes: Outcomes, calibration: Calibration | None,
                     costs: np.ndarray | None) -> list[dict[str, Any]]:
    """Each tier alone, each named hint's calibrated thresholds, and the oracle, measured on ``outcomes``."""
    points = reference_points(calibration, len(outcomes.tiers), outcomes.tiers)
    table = operating_table(p_fail, outcomes.correct, points, costs, outcomes.tokens, outcomes.latency)
    return [msgspec.to_builtins(row) for row in table]


def null_report(p_fail: np.ndarray, outcomes: Outcomes, costs: np.ndarray | None, *, draws: int, folds: int,
                seed: int) -> dict[str, Any]:
    """The named operating points of ``p_fail``'s route score beside the random-route null, in sample and nested
    out of fold (cascade/router/train/null.py), as the card and `cascade router eval --json` carry them."""
    report = random_null(route_score(p_fail), outcomes.correct, costs=costs, tokens=outcomes.tokens,
                         tiers=outcomes.tiers, draws=draws, folds=folds, seed=seed)
    return msgspec.to_builtins(report)
