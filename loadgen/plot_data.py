"""What the loadgen plots draw, as plain numbers and text (no matplotlib here, so it is tested without a figure).

* An empirical CDF is a staircase: it jumps by 1/n at each sample and is flat between them. Joining the
  samples with sloped lines invents values nobody measured (worst with few requests), so `ecdf_steps` gives
  the vertices of the staircase, drawn with `drawstyle="steps-post"`.
* The attainment-vs-SLO-scale axis must show the scale the report states ("smallest scale met at 95 %"),
  with room on both sides, and the SLO as given (scale 1): `slo_scale_axis`.
* A bar of height 0 draws nothing, which reads as "no data". `visible_bars` lifts bars below a small fraction
  of the axis to that height and labels every bar with its value ("n/a" where the value is undefined).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

# The reported scale sits at most at 1 / 1.25 = 80 % of the axis: its marker and label have room on the right.
SLO_SCALE_AXIS_HEADROOM = 1.25
# Left of 0 by 3 % of the axis, so a reported scale of 0 (every bound met at once) is not hidden by the frame.
SLO_SCALE_AXIS_LEFT_PAD = 0.03
# Axes stop here: matplotlib cannot lay out limits near the float maximum, and no real SLO is missed by 1e12x.
SLO_SCALE_AXIS_MAX = 1e12
# A bar shorter than 1.5 % of its axis is drawn at that height (its label says the true value).
MIN_BAR_FRACTION = 0.015
UNDEFINED = "n/a"


def ecdf_steps(values: Sequence[float], total: int | None = None,
               right: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Vertices of the empirical CDF of the finite `values`, for `drawstyle="steps-post"`.

    The staircase starts at (min, 0) and rises by 1/`total` at each sample; `total` defaults to the number of
    finite values (pass the count of all requests when some never finished: the curve then tops out below 1).
    `right` extends the last step flat to that x (the axis' right edge). Empty input gives empty arrays."""
    xs = np.sort(np.asarray([v for v in values if math.isfinite(v)], dtype=float))
    if xs.size == 0:
        return xs, xs
    n = xs.size if total is None else max(total, xs.size)
    ys = np.arange(0, xs.size + 1) / n
    xs = np.concatenate(([xs[0]], xs))
    if right is not None and right > xs[-1]:
        xs, ys = np.append(xs, right), np.append(ys, ys[-1])
    return xs, ys


def slo_scale_axis(reported: float | None, needed: Sequence[float]) -> tuple[float, float]:
    """The x range of the attainment-vs-SLO-scale plot: from just left of 0 to past the larger of 1 (the SLO
    as given) and the reported minimum scale; with no reported scale (never met), past the largest scale any
    request needed. Both ends finite, the reported scale strictly inside."""
    finite = [s for s in needed if math.isfinite(s)]
    anchor = reported if reported is not None and math.isfinite(reported) else max(finite, default=1.0)
    top = min(max(1.0, anchor) * SLO_SCALE_AXIS_HEADROOM, SLO_SCALE_AXIS_MAX)
    return -SLO_SCALE_AXIS_LEFT_PAD * top, top


def visible_bars(values: Sequence[float | None], span: float | None = None,
                 digits: int = 1) -> tuple[list[float], list[str]]:
    """Heights and labels for bars of `values` on an axis `span` tall (default: the largest value, or 1).

    A value below MIN_BAR_FRACTION of the span (0 included) gets that height, so it shows; an undefined value
    (None, NaN) gets no bar and the label "n/a". Labels print the true value."""
    defined = [v for v in values if v is not None and math.isfinite(v)]
    top = span if span is not None else max(defined, default=0.0) or 1.0
    floor = MIN_BAR_FRACTION * top
    heights: list[float] = []
    labels: list[str] = []
    for v in values:
        if v is None or not math.isfinite(v):
            heights.append(0.0)
            labels.append(UNDEFINED)
        else:
            heights.append(max(v, floor))
            labels.append(f"{v:.{digits}f}")
    return heights, labels


def latency_cell(value: float | None) -> str:
    """A latency percentile in a table: undefined (no request measured one, e.g. TPOT without streaming) is
    "n/a", not 0 and not a dash that could read as "not run"."""
    return UNDEFINED if value is None else f"{value:.1f}"
