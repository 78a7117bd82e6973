"""The run directory: `requests.jsonl`, `summary.json`, `report.md`, `report.html` (self-contained) and PNGs.

The PNGs come from `plots` (matplotlib, lazily); without matplotlib they are skipped (and the report says so)
but every other file is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from cascade.data.records import RequestRecord
from loadgen.html_report import to_html
from loadgen.plot_data import latency_cell
from loadgen.plots import write_plots

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
        cells = " | ".join(latency_cell(p[k]) for k in ("p50", "p90", "p99", "mean"))
        lines.append(f"| {key} | {cells} |")
    return lines


def _unstreamed_note(run: dict[str, Any]) -> list[str]:
    if run.get("stream", True):
        return []
    return ["Not streamed (`--no-stream`): each answer arrived in one body, so TTFT is the whole latency and TPOT "
            "and ITL are undefined (n/a).", ""]


def _group_table(title: str, groups: dict[str, Any]) -> list[str]:
    lines = [f"### By {title}", "",
             f"| {title} | requests | failed | TTFT p50/p99 ms | TPOT p50 ms | E2EL p50/p99 ms | tokens | "
             "SLO attainment | goodput rps | accuracy | correct within SLO | correct goodput rps (95% CI) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, g in groups.items():
        lines.append(
            f"| {name} | {g['requests']} | {g['failed']} | "
            f"{latency_cell(g['ttft_ms']['p50'])} / {latency_cell(g['ttft_ms']['p99'])} | "
            f"{latency_cell(g['tpot_ms']['p50'])} | "
            f"{latency_cell(g['e2el_ms']['p50'])} / {latency_cell(g['e2el_ms']['p99'])} | "
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
        "", "## Latency (ms)", "", *_latency_table(summary), "", *_unstreamed_note(run),
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
