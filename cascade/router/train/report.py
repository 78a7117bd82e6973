"""The metrics `cascade router train` records in the card and `cascade router eval` prints: evaluate.report with a
bootstrap interval for APGR, and the operating-point table."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from cascade.router import evaluate
from cascade.router.operating import Calibration, operating_table, reference_points
from cascade.router.outcomes import Outcomes


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
