"""A goodput run's summary (`goodput_per_gpu --json-out`) as a Markdown table: one row per arm and rate.

    .venv/bin/python -m benchmarks.planner.goodput.table benchmarks/results/goodput_per_gpu_g8_poisson.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HEADER = ("| arm | rate (req/s) | correct within SLO / s / GPU [95 % CI] | SLO attainment | accuracy | shed | "
          "lag (s) |\n|---|---|---|---|---|---|---|")


def interval(stats: dict[str, Any], key: str) -> str:
    ci = stats.get("ci95", {}).get(key)
    return f"{stats[key]:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else f"{stats[key]:.2f}"


def table(run: dict[str, Any]) -> str:
    lines = [HEADER]
    for arm, measured in run["arms"].items():
        for rate, s in measured["by_rate"].items():
            lines.append(f"| {arm} | {rate} | {interval(s, 'goodput_per_gpu')} | {s['slo_attainment']:.3f} | "
                         f"{s['accuracy']:.3f} | {s['shed']:.3f} | {s['lag_s_max']:.2f} |")
    held = ", ".join(f"{arm} {m['held_rate'] if m['held_rate'] is not None else 'none'}"
                     for arm, m in run["arms"].items())
    return "\n".join(lines) + f"\n\nHighest rate held (attainment >= 0.95, accuracy >= target - 0.01): {held}.\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m benchmarks.planner.goodput.table SUMMARY.json", file=sys.stderr)
        return 2
    print(table(json.loads(Path(args[0]).read_text())), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
