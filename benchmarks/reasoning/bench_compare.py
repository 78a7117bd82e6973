"""Paired comparison of `cascade bench branches` runs on the same questions: accuracy, latency, decode tokens.

Why: issue 31 asks whether SART keeps self-consistency's accuracy (within 2 points, interval stated) at <= 0.5x
its latency and <= 0.6x its tokens, and whether both votes beat greedy. Each method runs separately (its own
`--out`, the same `--seed`, questions and Poisson schedule), so the comparison is paired by question id and the
intervals come from resampling questions: every resample draws the same questions for every run.

Input: `--run NAME=PATH` twice or more, PATH a bench `--out` directory (its requests.jsonl) or the file itself.
A file that a resumed run appended to holds a question more than once: the last record counts (the bench's own
rule); a file of several methods is refused. Only questions every run answered without an error are compared; the
rest are counted and named. Each record names the machine that ran it (cascade/machine.py); when the compared
requests ran on more than one (or some records predate that field), `latency_warning` says their latencies do
not compare (accuracy and tokens do), and it is printed on stderr.

Output: one JSON object: per run, n, accuracy (95% CI), mean and p95 latency, mean decode tokens; per pair (A, B)
in the order given, accuracy A - B, and latency mean / latency p95 / tokens ratios A / B, each with a paired
bootstrap 95% interval. Usage:
  .venv/bin/python -m benchmarks.reasoning.bench_compare --run sart=runs/sart --run sc=runs/sc --run greedy=runs/greedy
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path
from typing import Any

import numpy as np

from cascade.bench.runs import RequestRow, request_rows
from cascade.testing.scripts import print_result


def read_run(path: Path) -> dict[str, RequestRow]:
    """Question id -> its last record in a bench requests.jsonl (a directory names its requests.jsonl)."""
    file = path / "requests.jsonl" if path.is_dir() else path
    if not file.is_file():
        raise SystemExit(f"bench_compare: no requests.jsonl at {path}")
    latest = {row.id: row for row in request_rows(file)}
    methods = {row.method for row in latest.values()}
    if len(methods) > 1:  # a run of several --methods answers each question once per method
        raise SystemExit(f"bench_compare: {path} holds several methods ({', '.join(sorted(methods))}): "
                         "compare runs made with one --methods each")
    return latest


def _interval(samples: np.ndarray) -> list[float]:
    return [round(float(np.percentile(samples, 2.5)), 4), round(float(np.percentile(samples, 97.5)), 4)]


def _reduce(values: np.ndarray, how: str) -> np.ndarray:
    """Mean or p95 over the last axis: a run's point value (1-d) or one per bootstrap resample (2-d)."""
    return np.percentile(values, 95, axis=-1) if how == "p95" else values.mean(axis=-1)


def compare(runs: dict[str, dict[str, RequestRow]], resamples: int, seed: int) -> dict[str, Any]:
    names = list(runs)
    answered = [{q for q, r in runs[n].items() if r.error is None} for n in names]
    common = sorted(set.intersection(*answered))
    if not common:
        raise SystemExit("bench_compare: no question was answered without an error by every run")
    left_out = sorted(set.union(*[set(r) for r in runs.values()]) - set(common))
    columns = {n: {k: np.array([getattr(runs[n][q], k) for q in common], dtype=float)
                   for k in ("correct", "latency_s", "decode_tokens")} for n in names}
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(common), size=(resamples, len(common)))

    def stat(name: str, key: str, how: str) -> np.ndarray:
        """`how` of column `key` of run `name`, on each resample (rows of picks)."""
        return _reduce(columns[name][key][picks], how)

    per_run = {}
    for n in names:
        c = columns[n]
        per_run[n] = {
            "n": len(common),
            "accuracy": round(float(c["correct"].mean()), 4),
            "accuracy_ci95": _interval(stat(n, "correct", "mean")),
            "latency_s_mean": round(float(c["latency_s"].mean()), 2),
            "latency_s_p95": round(float(np.percentile(c["latency_s"], 95)), 2),
            "decode_tokens_mean": round(float(c["decode_tokens"].mean()), 1),
            "machines": sorted({runs[n][q].machine or "unrecorded" for q in common}),
        }
    pairs = {}
    for a, b in itertools.combinations(names, 2):
        ratios: dict[str, Any] = {}
        for label, key, how in (("latency_mean", "latency_s", "mean"), ("latency_p95", "latency_s", "p95"),
                                ("decode_tokens", "decode_tokens", "mean")):
            ratios[f"{label}_ratio"] = round(float(_reduce(columns[a][key], how) / _reduce(columns[b][key], how)), 4)
            ratios[f"{label}_ratio_ci95"] = _interval(stat(a, key, how) / stat(b, key, how))
        diff = columns[a]["correct"] - columns[b]["correct"]
        pairs[f"{a} vs {b}"] = {
            "accuracy_diff": round(float(diff.mean()), 4),
            "accuracy_diff_ci95": _interval(diff[picks].mean(axis=1)),
            "wins": int((diff > 0).sum()), "losses": int((diff < 0).sum()),
            **ratios,
        }
    machines = set().union(*[r["machines"] for r in per_run.values()])
    result = {"questions": len(common), "left_out": left_out, "resamples": resamples, "seed": seed,
              "runs": per_run, "pairs": pairs}
    if len(machines) > 1:
        # The CPU engine's speed differs up to 8x between CPUs (cascade/machine.py): accuracy and tokens still
        # compare, latencies measured on different machines do not.
        result["latency_warning"] = (f"the compared requests ran on {len(machines)} machines (each run's `machines`):"
                                     " their latencies are not comparable")
    return result


def plot(result: dict[str, Any], path: Path, title: str) -> None:
    """Accuracy (95% CI) against mean decode tokens, and mean / p95 latency, one marker per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["runs"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    for name, r in runs.items():
        low, high = r["accuracy_ci95"]
        left.errorbar(r["decode_tokens_mean"], r["accuracy"], yerr=[[r["accuracy"] - low], [high - r["accuracy"]]],
                      marker="o", capsize=4, label=name)
    left.set(xlabel="decode tokens per question (all branches)", ylabel="accuracy (95% CI)", title=title)
    left.legend(loc="best", fontsize=8)
    x = np.arange(len(runs))
    right.bar(x - 0.2, [r["latency_s_mean"] for r in runs.values()], 0.4, label="mean")
    right.bar(x + 0.2, [r["latency_s_p95"] for r in runs.values()], 0.4, label="p95")
    right.set_xticks(x, list(runs))
    right.set(ylabel="latency from arrival (s)", title=f"{result['questions']} questions")
    right.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_run(spec: str) -> tuple[str, Path]:
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--run takes NAME=PATH, got {spec!r}")
    return name, Path(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", action="append", type=parse_run, required=True, metavar="NAME=PATH",
                   help="a bench --out directory or requests.jsonl, named; two or more, compared in pairs in order")
    p.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples of the questions")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", type=Path, help="also write the JSON here")
    p.add_argument("--plot", type=Path, help="write a PNG: accuracy against decode tokens, and latency, per run")
    p.add_argument("--title", default="accuracy against decode tokens")
    args = p.parse_args(argv)
    names = [n for n, _ in args.run]
    if len(names) < 2 or len(set(names)) != len(names):
        p.error("--run needs two or more runs with distinct names")
    result = compare({n: read_run(path) for n, path in args.run}, args.resamples, args.seed)
    if "latency_warning" in result:
        print(f"bench_compare: {result['latency_warning']}", file=sys.stderr)
    print_result(result, args.json_out, indent=2)
    if args.plot:
        plot(result, args.plot, args.title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
