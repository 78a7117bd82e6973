"""`cascade loadgen compare RUN_A RUN_B`: two run directories side by side.

Reads each run's `summary.json` and `requests.jsonl` (as `cascade loadgen --out` wrote them) and gives one
table of the headline metrics with B's ratio to A (correct goodput first), as Markdown and JSON, plus a PNG
of both runs' latency CDFs overlaid (TTFT and E2E). Runs made with different SLOs are compared as they are,
and the table says so: their goodputs answer different questions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cascade.data.records import RecordsError, RequestRecord, read_request_records
from loadgen.plots import draw_ecdf, save

# (label, key path in summary.json, digits); the correct goodput row also shows its bootstrap interval.
ROWS: tuple[tuple[str, tuple[str, ...], int], ...] = (
    ("correct goodput rps", ("correct_goodput_rps",), 3),
    ("goodput rps", ("goodput_rps",), 3),
    ("SLO attainment", ("slo_attainment",), 4),
    ("accuracy", ("accuracy",), 4),
    ("correct within SLO", ("correct_within_slo",), 4),
    ("cost per correct answer", ("cost", "per_correct_answer"), 6),
    ("requests", ("requests",), 0),
    ("failed", ("failed",), 0),
    ("achieved rate rps", ("achieved_rate_rps",), 3),
    ("output tokens/s", ("output_throughput_tps",), 1),
    ("TTFT p50 ms", ("ttft_ms", "p50"), 1),
    ("TTFT p99 ms", ("ttft_ms", "p99"), 1),
    ("E2E p50 ms", ("e2el_ms", "p50"), 1),
    ("E2E p99 ms", ("e2el_ms", "p99"), 1),
)


class CompareError(Exception):
    """A run directory that cannot be read (one line for the CLI)."""


def load_run(folder: Path) -> tuple[dict[str, Any], list[RequestRecord]]:
    summary_path = folder / "summary.json"
    try:
        summary = json.loads(summary_path.read_text())
        return summary, read_request_records(folder / "requests.jsonl")
    except OSError as exc:
        raise CompareError(f"{folder} is not a loadgen run directory: cannot read {summary_path} "
                           f"({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise CompareError(f"{summary_path} is not JSON: {exc}") from None
    except RecordsError as exc:
        raise CompareError(f"{folder} is not a loadgen run directory: {exc}") from None


def _value(summary: dict[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = summary
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, int | float) else None


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The table as data: per row A, B and B/A (None where a side is missing or A is 0)."""
    rows = []
    for label, path, digits in ROWS:
        va, vb = _value(a, path), _value(b, path)
        ratio = None if va is None or vb is None or va == 0 else round(vb / va, 4)
        rows.append({"metric": label, "a": va, "b": vb, "b_over_a": ratio, "digits": digits})
    return {"rows": rows, "a_ci95": a.get("correct_goodput_ci95"), "b_ci95": b.get("correct_goodput_ci95"),
            "same_slo": (a.get("slo") or {}) == (b.get("slo") or {}), "slo_a": a.get("slo"), "slo_b": b.get("slo")}


def markdown(table: dict[str, Any], name_a: str, name_b: str, plot: Path | None) -> str:
    def shown(value: float | None, digits: int) -> str:
        return "–" if value is None else (f"{value:.{digits}f}" if digits else f"{value:.0f}")

    lines = [f"# {name_a} vs {name_b}", ""]
    if not table["same_slo"]:
        lines += [f"Different SLOs ({table['slo_a']} vs {table['slo_b']}): the goodputs measure different things.", ""]
    lines += [f"| metric | A: {name_a} | B: {name_b} | B / A |", "|---|---:|---:|---:|"]
    for row in table["rows"]:
        a, b = shown(row["a"], row["digits"]), shown(row["b"], row["digits"])
        if row["metric"] == "correct goodput rps":
            a += _interval(table["a_ci95"])
            b += _interval(table["b_ci95"])
        ratio = "–" if row["b_over_a"] is None else f"{row['b_over_a']:.3f}"
        lines.append(f"| {row['metric']} | {a} | {b} | {ratio} |")
    if plot is not None:
        lines += ["", f"![latency CDFs]({plot.name})"]
    return "\n".join(lines) + "\n"


def _interval(ci: list[float] | None) -> str:
    return "" if not ci else f" ({ci[0]:.3f}-{ci[1]:.3f})"


def plot_cdfs(out: Path, runs: dict[str, list[RequestRecord]]) -> Path | None:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    fig = Figure(figsize=(11, 3.8))
    axes = fig.subplots(1, 2)
    for ax, (title, field) in zip(axes, (("TTFT", "ttft_ms"), ("E2E latency", "e2el_ms")), strict=True):
        for name, records in runs.items():
            draw_ecdf(ax, [v for r in records if r.ok and (v := getattr(r, field)) is not None], label=name)
        ax.set_title(f"{title} CDF")
        ax.set_xlabel("ms")
        ax.grid(alpha=0.3)
        ax.legend(loc="best")
    axes[0].set_ylabel("fraction of completed requests")
    return save(fig, out / "compare_cdfs.png")


def run_compare(run_a: Path, run_b: Path, out: Path) -> dict[str, Any]:
    """Write compare.md, compare.json and compare_cdfs.png to `out`; return the table."""
    summary_a, records_a = load_run(run_a)
    summary_b, records_b = load_run(run_b)
    table = compare(summary_a, summary_b)
    out.mkdir(parents=True, exist_ok=True)
    names = (run_a.name or str(run_a), run_b.name or str(run_b))
    if names[0] == names[1]:
        names = (f"A ({run_a})", f"B ({run_b})")
    plot = plot_cdfs(out, {names[0]: records_a, names[1]: records_b})
    (out / "compare.md").write_text(markdown(table, *names, plot))
    payload = {"a": str(run_a), "b": str(run_b), **table}
    (out / "compare.json").write_text(json.dumps(payload, indent=2) + "\n")
    return payload
