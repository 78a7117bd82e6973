"""The run directory: `requests.jsonl`, `summary.json`, `report.md`, `report.html` (self-contained) and PNGs.

matplotlib is imported only here, lazily, with the Agg backend; without it the plots are skipped
(and the report says so) but every other file is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from cascade.data.records import RequestRecord
from loadgen.html_report import to_html
from loadgen.metrics import attainment_curve

_encode = msgspec.json.Encoder().encode


def write_run(out: Path, records: Sequence[RequestRecord], summary: dict[str, Any],
              sweep: dict[str, Any] | None = None, plots: bool = True) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    with (out / "requests.jsonl").open("wb") as f:
        for r in records:
            f.write(_encode(r) + b"\n")
    if sweep is not None:
        summary = {**summary, "sweep": sweep}
    (out / "summary.json").write_bytes(msgspec.json.format(_encode(summary), indent=2) + b"\n")
    images = write_plots(out, records, summary, sweep) if plots else []
    text = markdown(summary, images, sweep, plots)
    (out / "report.md").write_text(text)
    (out / "report.html").write_text(to_html(text, out))  # the same report, plots embedded: one file to share
    return [out / "requests.jsonl", out / "summary.json", out / "report.md", out / "report.html", *images]


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def _latency_table(stats: dict[str, Any]) -> list[str]:
    lines = ["| metric | p50 | p90 | p99 | mean |", "|---|---:|---:|---:|---:|"]
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        p = stats[key]
        lines.append(f"| {key} | {_fmt(p['p50'])} | {_fmt(p['p90'])} | {_fmt(p['p99'])} | {_fmt(p['mean'])} |")
    return lines


def _group_table(title: str, groups: dict[str, Any]) -> list[str]:
    lines = [f"### By {title}", "",
             f"| {title} | requests | failed | TTFT p50/p99 ms | TPOT p50 ms | E2EL p50/p99 ms | tokens | "
             "SLO attainment | goodput rps | accuracy | correct within SLO | correct goodput rps (95% CI) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, g in groups.items():
        lines.append(
            f"| {name} | {g['requests']} | {g['failed']} | "
            f"{_fmt(g['ttft_ms']['p50'])} / {_fmt(g['ttft_ms']['p99'])} | "
            f"{_fmt(g['tpot_ms']['p50'])} | {_fmt(g['e2el_ms']['p50'])} / {_fmt(g['e2el_ms']['p99'])} | "
            f"{_fmt(g['output_tokens_mean'])} | {_pct(g['slo_attainment'])} | {_fmt(g['goodput_rps'], 3)} | "
            f"{_pct(g['accuracy'])} | {_pct(g['correct_within_slo'])} | {_with_ci(g)} |")
    return [*lines, ""]


def _with_ci(stats: dict[str, Any]) -> str:
    """Correct goodput with its bootstrap interval, e.g. `1.234 (1.101-1.367)`; `-` without graded requests."""
    ci = stats.get("correct_goodput_ci95")
    value = _fmt(stats.get("correct_goodput_rps"), 3)
    return value if ci is None else f"{value} ({_fmt(ci[0], 3)}-{_fmt(ci[1], 3)})"


def _cost_rows(cost: dict[str, Any] | None) -> list[str]:
    """The summary's cost rows, when the responses carried a cost (cascade's `cascade.cost`)."""
    if not cost:
        return []
    unit = f" {cost['currency']}" if cost.get("currency") else ""

    def money(value: float | None) -> str:
        return "–" if value is None else f"{value:.6g}"

    return [f"| **cost per correct answer** | {money(cost['per_correct_answer'])}{unit} |",
            f"| cost per request / total ({cost['requests']} costed) | {money(cost['per_request'])} / "
            f"{money(cost['total'])}{unit} |"]


def markdown(summary: dict[str, Any], plots: Sequence[Path], sweep: dict[str, Any] | None = None,
             plotted: bool = True) -> str:
    run = summary.get("run", {})
    slo = summary.get("slo") or {}
    slo_text = ", ".join(f"{k} ≤ {v:g}" for k, v in slo.items()) or "none (every completed request counts)"
    lines = [
        "# Load test report", "",
        f"- target: `{run.get('url')}`, model `{run.get('model') or 'auto'}`, dataset `{run.get('dataset')}`",
        f"- arrivals: {run.get('arrival')} at {_fmt(run.get('rate_rps'), 2)} rps (burstiness {run.get('burstiness')}), "
        f"seed {run.get('seed')}, quality mix {run.get('quality_mix') or 'none'}",
        f"- SLO: {slo_text}", "",
        "## Summary", "",
        "| | |", "|---|---:|",
        f"| requests / completed / failed | {summary['requests']} / {summary['completed']} / {summary['failed']} |",
        f"| duration | {_fmt(summary['duration_s'], 2)} s |",
        f"| achieved send rate | {_fmt(summary['achieved_rate_rps'], 2)} rps |",
        f"| request throughput | {_fmt(summary['request_throughput_rps'], 2)} rps |",
        f"| output token throughput | {_fmt(summary['output_throughput_tps'], 1)} tok/s |",
        f"| **correct goodput** (graded correct and within the SLO) | {_with_ci(summary)} rps |",
        f"| goodput | {_fmt(summary['goodput_rps'], 3)} rps |",
        f"| SLO attainment | {_pct(summary['slo_attainment'])} |",
        f"| min SLO scale for {_pct(summary['min_slo_scale_level'])} attainment | "
        f"{_fmt(summary['min_slo_scale'], 3)} |",
        f"| accuracy ({summary['graded']} graded) | {_pct(summary['accuracy'])} |",
        f"| answers cut by the length limit (finish_reason `length`) | {summary.get('truncated', 0)} |",
        f"| correct within SLO | {_pct(summary['correct_within_slo'])} |",
        *_cost_rows(summary.get("cost")),
        f"| dispatch lag p50 / p99 | {_fmt(summary['dispatch_lag_ms']['p50'], 2)} / "
        f"{_fmt(summary['dispatch_lag_ms']['p99'], 2)} ms |",
        "", "## Latency (ms)", "", *_latency_table(summary), "",
        "## Breakdown", "",
        *_group_table("tier", summary["by_tier"]),
        *_group_table("quality", summary["by_quality"]),
    ]
    if summary.get("errors"):
        lines += ["## Errors", "", "| error | count |", "|---|---:|"]
        lines += [f"| {msg.replace('|', '/')} | {n} |" for msg, n in summary["errors"].items()] + [""]
    if sweep is not None:
        lines += ["## Rate sweep", "",
                  f"Target attainment {_pct(sweep['attainment_target'])}: maximum sustainable rate "
                  f"**{_fmt(sweep['max_sustainable_rate_rps'], 3)} rps**.", "",
                  "| rate rps | achieved rps | SLO attainment | goodput rps | correct goodput rps (95% CI) "
                  "| min SLO scale | TTFT p99 ms | E2EL p99 ms |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for p in sweep["points"]:
            lines.append(f"| {p['rate_rps']:g} | {_fmt(p['achieved_rate_rps'], 2)} | {_pct(p['slo_attainment'])} | "
                         f"{_fmt(p['goodput_rps'], 3)} | {_with_ci(p)} | {_fmt(p['min_slo_scale'], 3)} | "
                         f"{_fmt(p['ttft_p99_ms'])} | {_fmt(p['e2el_p99_ms'])} |")
        lines.append("")
    lines += ["## Plots", ""]
    if not plotted:
        lines.append("(no plots for a sweep step: see the sweep's report one folder up)")
    else:
        lines += [f"![{p.stem}]({p.name})" for p in plots] or ["(matplotlib is not installed: no plots)"]
    return "\n".join(lines) + "\n"


def write_plots(out: Path, records: Sequence[RequestRecord], summary: dict[str, Any],
                sweep: dict[str, Any] | None) -> list[Path]:
    try:
        from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend, faster import
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


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")  # the Agg renderer
    return path


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
        if values:
            xs = np.sort(np.asarray(values))
            ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs))
        ax.set_title(f"{name} CDF")
        ax.set_xlabel("ms")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of requests")
    return _save(fig, out / "latency_cdf.png")


def _per_tier(figure: Any, out: Path, summary: dict[str, Any]) -> Path:
    tiers = summary["by_tier"]
    names = list(tiers)
    fig = figure(figsize=(15, 3.8))
    axes = fig.subplots(1, 3)
    x = np.arange(len(names))
    axes[0].bar(x, [tiers[n]["requests"] for n in names])
    axes[0].set_title("requests served")
    for offset, pct in ((-0.2, "p50"), (0.2, "p99")):
        axes[1].bar(x + offset, [tiers[n]["e2el_ms"][pct] or 0 for n in names], width=0.4, label=pct)
    axes[1].set_title("E2E latency (ms)")
    axes[1].legend()
    axes[2].bar(x - 0.2, [tiers[n]["slo_attainment"] for n in names], width=0.4, label="SLO attainment")
    axes[2].bar(x + 0.2, [tiers[n]["accuracy"] or 0 for n in names], width=0.4, label="accuracy")
    axes[2].set_ylim(0, 1)
    axes[2].set_title("attainment / accuracy")
    axes[2].legend()
    for ax in axes:
        ax.set_xticks(x, names, rotation=20, ha="right", fontsize=8)
    return _save(fig, out / "per_tier.png")


def _attainment_vs_scale(figure: Any, out: Path, records: Sequence[RequestRecord], summary: dict[str, Any]) -> Path:
    scales = np.linspace(0.1, 5.0, 50)
    fig = figure(figsize=(6, 3.8))
    ax = fig.subplots()
    ax.plot(scales, attainment_curve(records, summary["slo"], scales.tolist()), label="all")
    for hint in summary["by_quality"]:
        subset = [r for r in records if (r.quality or "none") == hint]
        if len(summary["by_quality"]) > 1:
            ax.plot(scales, attainment_curve(subset, summary["slo"], scales.tolist()), label=hint, alpha=0.7)
    ax.axhline(summary["min_slo_scale_level"], color="grey", ls="--", lw=1)
    ax.set_xlabel("SLO scale (every bound × s)")
    ax.set_ylabel("SLO attainment")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, out / "attainment_vs_slo_scale.png")


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
    ax.legend()
    return _save(fig, out / "attainment_vs_rate.png")


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
    ax.legend(fontsize=8)
    return _save(fig, out / "accuracy_vs_goodput.png")
