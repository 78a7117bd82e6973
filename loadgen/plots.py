"""The run directory's PNGs: latency CDFs, per-tier bars, attainment against SLO scale and (for a sweep) rate.

matplotlib is imported only here, lazily, without pyplot (no global state, no GUI backend; the Agg renderer);
without it no plot is written and the report says so. What each plot draws is computed in `plot_data`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cascade.data.records import RequestRecord
from loadgen.metrics import slo_scale_needed
from loadgen.plot_data import UNDEFINED, ecdf_steps, slo_scale_axis, visible_bars


def write_plots(out: Path, records: Sequence[RequestRecord], summary: dict[str, Any],
                sweep: dict[str, Any] | None) -> list[Path]:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return []
    paths = [_latency_cdfs(Figure, out, records), _per_tier(Figure, out, summary)]
    if summary.get("slo"):
        paths.append(_attainment_vs_scale(Figure, out, records, summary))
    if sweep is not None:
        paths.append(_attainment_vs_rate(Figure, out, sweep))
        if (pareto := _accuracy_vs_goodput(Figure, out, sweep)) is not None:
            paths.append(pareto)
    return paths


def save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")
    return path


def draw_ecdf(ax: Any, values: Sequence[float], total: int | None = None, right: float | None = None,
              **style: Any) -> Any:
    """One empirical CDF as a staircase (see `plot_data.ecdf_steps`); returns the line, or None without data."""
    xs, ys = ecdf_steps(values, total, right)
    if xs.size == 0:
        return None
    (line,) = ax.plot(xs, ys, drawstyle="steps-post", **style)
    return line


def _latency_cdfs(figure: Any, out: Path, records: Sequence[RequestRecord]) -> Path:
    fig = figure(figsize=(16, 3.6))
    axes = fig.subplots(1, 4)
    done = [r for r in records if r.ok]
    series = {
        "TTFT": [r.ttft_ms for r in done if r.ttft_ms is not None],
        "TPOT": [r.tpot_ms for r in done if r.tpot_ms is not None],
        "ITL": [x for r in done for x in r.itl_ms],
        "E2E latency": [r.e2el_ms for r in done if r.e2el_ms is not None],
    }
    for ax, (name, values) in zip(axes, series.items(), strict=True):
        if draw_ecdf(ax, values) is None:
            # TPOT and ITL need a stream (and answers of 2+ tokens): an empty panel would read as a bug.
            ax.text(0.5, 0.5, f"{UNDEFINED}\n(not streamed or single-token answers)", ha="center", va="center",
                    transform=ax.transAxes, color="grey")
        ax.set_title(f"{name} CDF")
        ax.set_xlabel("ms")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of requests")
    return save(fig, out / "latency_cdf.png")


def bars(ax: Any, x: Any, values: Sequence[float | None], span: float | None = None, digits: int = 1,
         **style: Any) -> Any:
    """Bars that show even at 0, each labelled with its value ("n/a" where undefined)."""
    heights, labels = visible_bars(values, span, digits)
    container = ax.bar(x, heights, **style)
    ax.bar_label(container, labels=labels, fontsize=7, padding=1)
    return container


def _per_tier(figure: Any, out: Path, summary: dict[str, Any]) -> Path:
    tiers = summary["by_tier"]
    names = list(tiers)
    fig = figure(figsize=(15, 3.8))
    axes = fig.subplots(1, 3)
    x = np.arange(len(names))
    bars(axes[0], x, [tiers[n]["requests"] for n in names], digits=0)
    axes[0].set_title("requests served")
    e2el = {pct: [tiers[n]["e2el_ms"][pct] for n in names] for pct in ("p50", "p99")}
    span = max((v for vs in e2el.values() for v in vs if v is not None), default=0.0) or None
    for offset, pct in ((-0.2, "p50"), (0.2, "p99")):
        bars(axes[1], x + offset, e2el[pct], span, digits=0, width=0.4, label=pct)
    axes[1].set_title("E2E latency (ms)")
    axes[1].legend(loc="best")  # loc asked: an unasked "best" that takes over 1 s (a busy CPU) warns
    bars(axes[2], x - 0.2, [tiers[n]["slo_attainment"] for n in names], 1.0, digits=2, width=0.4,
         label="SLO attainment")
    bars(axes[2], x + 0.2, [tiers[n]["accuracy"] for n in names], 1.0, digits=2, width=0.4, label="accuracy")
    axes[2].set_ylim(0, 1.1)  # room for the labels above a full bar
    axes[2].set_title("attainment / accuracy")
    axes[2].legend(loc="best")
    for ax in axes:
        ax.margins(y=0.12)
        ax.set_xticks(x, names, rotation=20, ha="right", fontsize=8)
    return save(fig, out / "per_tier.png")


def _attainment_vs_scale(figure: Any, out: Path, records: Sequence[RequestRecord], summary: dict[str, Any]) -> Path:
    """SLO attainment against a factor on every bound: the CDF of each request's needed scale (failures never
    meet it, so the curve tops out at the completed fraction)."""
    slo, reported, level = summary["slo"], summary["min_slo_scale"], summary["min_slo_scale_level"]
    needed = [slo_scale_needed(r, slo) for r in records]
    lo, hi = slo_scale_axis(reported, needed)
    fig = figure(figsize=(6, 3.8))
    ax = fig.subplots()
    draw_ecdf(ax, needed, len(needed), hi, label="all")
    if len(summary["by_quality"]) > 1:
        for hint in summary["by_quality"]:
            subset = [n for n, r in zip(needed, records, strict=True) if (r.quality or "none") == hint]
            draw_ecdf(ax, subset, len(subset), hi, label=hint, alpha=0.7)
    ax.axhline(level, color="grey", ls="--", lw=1)
    ax.axvline(1.0, color="black", lw=0.8, alpha=0.5)  # the SLO as given
    if reported is not None:
        ax.axvline(reported, color="green", ls=":", label=f"min scale for {100 * level:g}%: {reported:g}")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("SLO scale (every bound × s)")
    ax.set_ylabel("SLO attainment")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    return save(fig, out / "attainment_vs_slo_scale.png")


def _attainment_vs_rate(figure: Any, out: Path, sweep: dict[str, Any]) -> Path:
    points = sorted(sweep["points"], key=lambda p: p["rate_rps"])
    fig = figure(figsize=(6, 3.8))
    ax = fig.subplots()
    ax.plot([p["rate_rps"] for p in points], [p["slo_attainment"] for p in points], marker="o")
    ax.axhline(sweep["attainment_target"], color="grey", ls="--", lw=1, label="target")
    if sweep["max_sustainable_rate_rps"] is not None:
        ax.axvline(sweep["max_sustainable_rate_rps"], color="green", ls=":", label="max sustainable")
    ax.set_xlabel("offered rate (rps)")
    ax.set_ylabel("SLO attainment")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    return save(fig, out / "attainment_vs_rate.png")


def _accuracy_vs_goodput(figure: Any, out: Path, sweep: dict[str, Any]) -> Path | None:
    """Per sweep rate: accuracy against goodput, plain and correct (with its bootstrap interval), each point
    labelled with its rate; the points no other beats on both axes (the Pareto front) are joined."""
    points = [p for p in sorted(sweep["points"], key=lambda p: p["rate_rps"]) if p.get("accuracy") is not None]
    if not points:
        return None  # nothing graded: no accuracy axis
    fig = figure(figsize=(6.5, 4.2))
    ax = fig.subplots()
    accuracy = [p["accuracy"] for p in points]
    ax.scatter([p["goodput_rps"] for p in points], accuracy, marker="o", facecolors="none", edgecolors="grey",
               label="goodput (within SLO)")
    correct = [p["correct_goodput_rps"] or 0.0 for p in points]
    intervals = np.array([p["correct_goodput_ci95"] or [c, c] for c, p in zip(correct, points, strict=True)])
    errors = np.abs(intervals.T - np.array(correct))  # rows: below, above
    ax.errorbar(correct, accuracy, xerr=errors, fmt="o", capsize=3, label="correct goodput (95% CI)")
    front = sorted((c, a) for c, a in zip(correct, accuracy, strict=True)
                   if not any(c2 >= c and a2 >= a and (c2, a2) != (c, a)
                              for c2, a2 in zip(correct, accuracy, strict=True)))
    if len(front) > 1:
        ax.plot(*zip(*front, strict=True), ls="--", lw=1, color="C1", label="Pareto front")
    for c, a, p in zip(correct, accuracy, points, strict=True):
        ax.annotate(f"{p['rate_rps']:g} rps", (c, a), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("requests per second")
    ax.set_ylabel("accuracy")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    return save(fig, out / "accuracy_vs_goodput.png")
