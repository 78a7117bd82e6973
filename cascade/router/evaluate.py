"""Router quality metrics: the routing curve, APGR, CPT, AUC and ECE (after RouteLLM).

Two tiers (RouteLLM's definitions). A router gives each prompt a score s and sends the top-x
fraction by score to the strong tier. With ``c`` the 0/1 correctness matrix and ``n`` prompts:

* ``quality(x)`` = mean correctness of the mixture (routed prompts answered by the strong tier);
* ``PGR(x) = (quality(x) - q_weak) / (q_strong - q_weak)`` (performance gap recovered);
* ``APGR`` = area under PGR(x) for x in [0, 1], trapezoid rule on the grid x = k/n (one step per prompt);
* ``CPT(p%)`` = the smallest x with PGR(x) >= p/100 (linear between grid points): the fraction of
  calls to the strong tier needed to recover p% of the gap.

The score of a learned router is its *expected gain* from routing up, ``p_fail[0] - p_fail[1]``
(with calibrated p_fail this is E[correct_strong - correct_weak]). Routing by difficulty alone
(``p_fail[0]``) also spends strong calls on prompts both tiers fail; a 1-d score passed here is used
as is. Ties are resolved by their expectation over a random order: the curve is evaluated at the end
of each group of tied scores and is linear in between, so a constant score gives the diagonal
(APGR 0.5), which is what a random router gives in expectation.

Any number of tiers (the cost-ordered curve). Tier t costs ``costs[t]`` (default its index: linear,
ascending). For a price ``lam`` per unit of cost a prompt goes to the tier minimising
``p_fail[t] + lam * cost[t]`` (maximum expected quality net of cost; ties go to the cheaper tier).
Sweeping lam from +inf (all on tier 0) to -inf (all on the top tier) moves each prompt up along the
lower convex hull of its (cost, p_fail) points. The x axis is the normalised mean cost
``(mean cost - cost_0) / (cost_top - cost_0)``; PGR is measured between "all on tier 0" and "all on
the top tier"; APGR and CPT are read from this curve as above. With two tiers and any costs the move
happens when ``lam < p_fail[0] - p_fail[1]``: exactly the two-tier curve ranked by expected gain.
A 1-d score with 3+ tiers chooses only between the cheapest and the top tier.

Reference curves: random is the diagonal PGR(x) = x (a random mix of the cheapest and the top
tier); the oracle runs the same rule on ``p_fail = 1 - c`` (for two tiers: RouteLLM's oracle, which
routes "weak wrong, strong right" first and "weak right, strong wrong" last).

A third reference, the **tier prior**, gives every prompt the same p_fail: each tier's failure rate on the
evaluated outcomes. It knows how good each tier is but nothing about the prompt, so it moves everyone
together along the tiers' own (cost, quality) hull. With two tiers it is the diagonal (0.5); with 3+ it
can be far above 0.5 -- e.g. a middle tier as accurate as the top at half its cost gives 0.75 -- and it is
the number a learned router must beat to show that it reads the prompt (`prior_apgr`).

AUC is the ROC AUC of ``p_fail[:, 0]`` for "tier 0 fails"; ECE is the expected calibration error of
``p_fail[:, 0]`` over 10 equal-width bins. Both need a probability matrix, not a 1-d score.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np

CPT_LEVELS = (50, 80, 95)


@dataclass(frozen=True)
class Curve:
    """A routing curve: normalised cost (fraction routed up for two tiers), quality and PGR."""

    x: np.ndarray
    quality: np.ndarray
    pgr: np.ndarray


def linear_costs(n_tiers: int) -> np.ndarray:
    return np.arange(n_tiers, dtype=float)


def routing_curve(p_fail: np.ndarray, correct: np.ndarray, costs: np.ndarray | None = None,
                  weights: np.ndarray | None = None) -> Curve:
    """The price-sweep curve (see the module docstring). ``p_fail`` and ``correct`` are (n, n_tiers);
    a 1-d ``p_fail`` is a difficulty score that chooses only between the cheapest and the top tier.
    ``weights``: how many times each prompt counts (default once; a bootstrap resample's counts, as
    `apgr_interval` draws them, give that resample's curve)."""
    events, correct, costs = _sorted_events(p_fail, correct, costs)
    return _curve(events, correct, costs, np.ones(len(correct)) if weights is None else np.asarray(weights, float))


def _sorted_events(p_fail: np.ndarray, correct: np.ndarray, costs: np.ndarray | None
                   ) -> tuple[tuple[np.ndarray, ...], np.ndarray, np.ndarray]:
    """The upgrade events in price order, with ``correct`` as floats and the checked costs."""
    correct = np.asarray(correct, dtype=float)
    n_tiers = correct.shape[1]
    costs = linear_costs(n_tiers) if costs is None else np.asarray(costs, dtype=float)
    if costs.shape != (n_tiers,) or np.any(np.diff(costs) <= 0):
        raise ValueError(f"costs must be {n_tiers} strictly ascending numbers, got {costs.tolist()}")
    scores = np.asarray(p_fail, dtype=float)
    if scores.ndim == 1:
        scores = np.outer(scores, (costs[-1] - costs) / (costs[-1] - costs[0]))
    price, prompt, low, high = _upgrade_events(scores, costs)
    order = np.lexsort((low, -price))
    return (price[order], prompt[order], low[order], high[order]), correct, costs


def _curve(events: tuple[np.ndarray, ...], correct: np.ndarray, costs: np.ndarray, weights: np.ndarray) -> Curve:
    """The curve from sorted upgrade events, each prompt counted ``weights[i]`` times (1: the plain curve;
    bootstrap counts: a resample's curve without recomputing the events)."""
    price, prompt, low, high = events
    n = weights.sum()
    gain = (correct[prompt, high] - correct[prompt, low]) * weights[prompt]
    spend = (costs[high] - costs[low]) * weights[prompt]
    ends = np.flatnonzero(np.r_[price[1:] != price[:-1], True]) if price.size else np.zeros(0, int)
    cum_gain = np.r_[0.0, np.cumsum(gain)[ends]]
    cum_cost = np.r_[0.0, np.cumsum(spend)[ends]]
    q_low, q_high = weights @ correct[:, 0] / n, weights @ correct[:, -1] / n
    quality = q_low + cum_gain / n
    x = cum_cost / (n * (costs[-1] - costs[0]))
    gap = q_high - q_low
    pgr = (quality - q_low) / gap if gap != 0 else np.full_like(quality, np.nan)
    return Curve(x=x, quality=quality, pgr=pgr)


def apgr_interval(p_fail: np.ndarray, correct: np.ndarray, costs: np.ndarray | None = None, level: float = 0.95,
                  n_resamples: int = 1000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of APGR over the evaluated prompts (the router's scores held fixed):
    how much the number would move on another sample of the same size. On 660 GSM8K prompts it is about
    +-0.07 wide, so two routers 0.02 apart on one split are not told apart by it."""
    events, correct, costs = _sorted_events(p_fail, correct, costs)
    values = np.array([apgr(_curve(events, correct, costs, w)) for w in _resamples(len(correct), n_resamples, seed)])
    values = values[np.isfinite(values)]  # a resample where both tiers score the same has no gap
    if values.size == 0:
        return float("nan"), float("nan")
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def _resamples(n: int, n_resamples: int, seed: int) -> Iterator[np.ndarray]:
    """Seeded bootstrap resamples of n prompts, as how many times each prompt is drawn."""
    rng = np.random.default_rng(seed)
    for _ in range(n_resamples):
        yield np.bincount(rng.integers(0, n, n), minlength=n).astype(float)


def apgr_difference(first: np.ndarray, second: np.ndarray, correct: np.ndarray, n_resamples: int = 1000,
                    seed: int = 0) -> tuple[float, np.ndarray]:
    """APGR(first) - APGR(second) and its paired bootstrap samples (both routers scored on the same resampled
    prompts; NaN-free): two routers' separate intervals overlap long before their difference is in doubt."""
    a, correct, costs = _sorted_events(first, correct, None)
    b, _, _ = _sorted_events(second, correct, None)
    ones = np.ones(len(correct))
    point = apgr(_curve(a, correct, costs, ones)) - apgr(_curve(b, correct, costs, ones))
    values = np.array([apgr(_curve(a, correct, costs, w)) - apgr(_curve(b, correct, costs, w))
                       for w in _resamples(len(correct), n_resamples, seed)])
    return point, values[np.isfinite(values)]


def _upgrade_events(p_fail: np.ndarray, costs: np.ndarray) -> tuple[np.ndarray, ...]:
    """Every move of a prompt between consecutive vertices of the lower convex hull of its
    (cost, p_fail) points, with the price below which the move happens."""
    n, n_tiers = p_fail.shape
    if n_tiers == 2:
        zeros = np.zeros(n, dtype=int)
        return p_fail[:, 0] - p_fail[:, 1], np.arange(n), zeros, zeros + 1
    prices, prompts, lows, highs = [], [], [], []
    for i, row in enumerate(p_fail):
        hull: list[int] = []
        for t in range(n_tiers):  # monotone chain: keep only strictly convex lower-hull vertices
            while len(hull) >= 2:
                a, b = hull[-2], hull[-1]
                cross = (costs[b] - costs[a]) * (row[t] - row[a]) - (row[b] - row[a]) * (costs[t] - costs[a])
                if cross > 0:
                    break
                hull.pop()
            hull.append(t)
        for a, b in pairwise(hull):
            prices.append((row[a] - row[b]) / (costs[b] - costs[a]))
            prompts.append(i)
            lows.append(a)
            highs.append(b)
    return np.array(prices, float), np.array(prompts, int), np.array(lows, int), np.array(highs, int)


def apgr(curve: Curve) -> float:
    return float(np.trapezoid(curve.pgr, curve.x))


def cpt(curve: Curve, level: float) -> float:
    """Smallest x at which PGR reaches ``level`` (a fraction, e.g. 0.8); 1.0 if never reached."""
    above = np.flatnonzero(curve.pgr >= level)
    if above.size == 0:
        return 1.0
    k = int(above[0])
    if k == 0:
        return float(curve.x[0])
    x0, x1, y0, y1 = curve.x[k - 1], curve.x[k], curve.pgr[k - 1], curve.pgr[k]
    return float(x0 + (level - y0) / (y1 - y0) * (x1 - x0))


def roc_auc(p_fail0: np.ndarray, failed: np.ndarray) -> float:
    """ROC AUC by the rank statistic (ties count one half); NaN if only one class is present."""
    failed = np.asarray(failed, dtype=bool)
    n_pos, n_neg = int(failed.sum()), int((~failed).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    from scipy.stats import rankdata

    ranks = rankdata(np.asarray(p_fail0, dtype=float))
    return float((ranks[failed].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def reliability(p_fail: np.ndarray, failed: np.ndarray, n_bins: int = 10) -> tuple[np.ndarray, ...]:
    """ECE's bins: (mean predicted p_fail, observed failure rate, prompts) of each non-empty equal-width bin."""
    p = np.clip(np.asarray(p_fail, dtype=float), 0.0, 1.0)
    y = np.asarray(failed, dtype=float)
    bins = np.minimum((p * n_bins).astype(int), n_bins - 1)
    counts = np.bincount(bins, minlength=n_bins)
    full = counts > 0
    predicted = np.bincount(bins, p, n_bins)[full] / counts[full]
    observed = np.bincount(bins, y, n_bins)[full] / counts[full]
    return predicted, observed, counts[full]


def ece(p_fail0: np.ndarray, failed: np.ndarray, n_bins: int = 10) -> float:
    """Expected calibration error: sum over equal-width bins of (share of prompts) * |mean p - failure rate|."""
    predicted, observed, counts = reliability(p_fail0, failed, n_bins)
    return float(counts @ np.abs(predicted - observed) / max(1, counts.sum()))


def oracle_scores(correct: np.ndarray) -> np.ndarray:
    return 1.0 - np.asarray(correct, dtype=float)


def random_curve(correct: np.ndarray) -> Curve:
    c = np.asarray(correct, dtype=float)
    x = np.linspace(0.0, 1.0, 101)
    return Curve(x=x, quality=c[:, 0].mean() + x * (c[:, -1].mean() - c[:, 0].mean()), pgr=x)


def prior_scores(correct: np.ndarray) -> np.ndarray:
    """The tier prior (module docstring): every prompt gets each tier's failure rate."""
    failed = 1.0 - np.asarray(correct, dtype=float)
    return np.tile(failed.mean(axis=0), (len(failed), 1))


def report(p_fail: np.ndarray, correct: np.ndarray, costs: np.ndarray | None = None) -> dict:
    """The `cascade router eval --json` keys (DESIGN.md §4), plus `difficulty_apgr` (routing by
    p_fail[0] alone, cheapest vs top tier) and the oracle's, random router's and tier prior's APGR."""
    correct = np.asarray(correct, dtype=bool)
    p_fail = np.asarray(p_fail, dtype=float)
    if p_fail.shape != correct.shape:
        raise ValueError(f"p_fail {p_fail.shape} and correct {correct.shape} must have the same shape")
    curve = routing_curve(p_fail, correct, costs)
    p0 = p_fail[:, 0]
    return {
        "n": len(correct),
        "apgr": finite(apgr(curve)),
        "auc": finite(roc_auc(p0, ~correct[:, 0])),
        "ece": finite(ece(p0, ~correct[:, 0])),
        "cpt": {str(p): finite(cpt(curve, p / 100)) for p in CPT_LEVELS},
        "difficulty_apgr": finite(apgr(routing_curve(p0, correct, costs))),
        "oracle_apgr": finite(apgr(routing_curve(oracle_scores(correct), correct, costs))),
        "random_apgr": 0.5,
        "prior_apgr": finite(apgr(routing_curve(prior_scores(correct), correct, costs))),
    }


def finite(value: float) -> float | None:
    """Rounded for reports; None (JSON null) when undefined, e.g. PGR when both tiers score the same."""
    return round(value, 4) if np.isfinite(value) else None


def plot_curves(path: str | Path, p_fail: np.ndarray, correct: np.ndarray, tiers: list[str],
                costs: np.ndarray | None = None, title: str = "router",
                points: Sequence[tuple[str, float, float]] = ()) -> Path:
    """Two panels. Left: quality vs fraction routed up (normalised cost for 3+ tiers) for the router, random,
    oracle and, for 3+ tiers, the tier prior, with each tier alone and ``points`` (name, mean cost in the
    ``costs`` scale, accuracy: the operating points of the quality hints) marked on it. Right: each tier's
    reliability diagram (predicted p_fail against the observed failure rate in ECE's ten bins, marker area ~
    prompts), the picture behind ECE."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    correct = np.asarray(correct, dtype=bool)
    p_fail = np.asarray(p_fail, dtype=float)
    curves = {
        "router": routing_curve(p_fail, correct, costs),
        "random": random_curve(correct),
        "oracle": routing_curve(oracle_scores(correct), correct, costs),
    }
    if len(tiers) > 2:
        curves["tier prior"] = routing_curve(prior_scores(correct), correct, costs)
    fig, (ax, cal) = plt.subplots(1, 2, figsize=(11, 4.4), dpi=110, gridspec_kw={"width_ratios": [1.35, 1]})
    for (label, curve), style in zip(curves.items(), ("-", "--", ":", "-."), strict=False):
        ax.plot(curve.x, curve.quality, style, label=f"{label} (APGR {apgr(curve):.2f})")
    scale = linear_costs(len(tiers)) if costs is None else np.asarray(costs, dtype=float)
    ax.plot((scale - scale[0]) / (scale[-1] - scale[0]), correct.mean(axis=0), "s", color="grey", markersize=5,
            label="each tier alone")
    named: dict[tuple[float, float], list[str]] = {}
    for name, cost, accuracy in points:  # hints that land on the same point share one label
        x = (cost - scale[0]) / (scale[-1] - scale[0])
        named.setdefault((round(x, 3), round(accuracy, 3)), []).append(name)
    for (x, accuracy), names in named.items():
        ax.plot([x], [accuracy], "o", color="black", markersize=4)
        ax.annotate("/".join(names), (x, accuracy), textcoords="offset points", xytext=(4, -10), fontsize=8)
    ax.set_xlabel("fraction routed to " + tiers[-1] if len(tiers) == 2 else "normalised cost (0 = all cheapest)")
    ax.set_ylabel("quality (mean correctness)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    cal.plot([0, 1], [0, 1], ":", color="grey", label="perfectly calibrated")
    for t, tier in enumerate(tiers):
        failed = ~correct[:, t]
        predicted, observed, counts = reliability(p_fail[:, t], failed)
        cal.plot(predicted, observed, "-", alpha=0.5)
        cal.scatter(predicted, observed, s=8 + 400 * counts / len(correct), alpha=0.7,
                    label=f"{tier} (ECE {ece(p_fail[:, t], failed):.3f})")
    cal.set_xlim(0, 1)
    cal.set_ylim(0, 1)
    cal.set_xlabel("predicted p_fail")
    cal.set_ylabel("observed failure rate")
    cal.set_title("calibration", fontsize=10)
    cal.grid(alpha=0.3)
    cal.legend(loc="upper left", fontsize=7)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out
