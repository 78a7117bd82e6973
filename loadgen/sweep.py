"""Rate sweep: raise the offered rate until SLO attainment falls below a target.

Each step is a full run (its own sub-directory `rate-<R>/` when an output directory is given). The
sweep stops at the first rate whose attainment is below the target; optional bisection steps then
narrow the knee between the last good and the first bad rate. The maximum sustainable rate is the
highest rate at which attainment met the target with every lower rate tried meeting it too.
Each point also carries Cascadia's minimum SLO scale, to compare a cascade plan with single-model
baselines at the same offered rates.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from cascade.data.records import RequestRecord
from loadgen.run import LoadConfig, LoadgenError, run_load

RunFn = Callable[[LoadConfig], tuple[dict[str, Any], list[RequestRecord]]]


def parse_rates(spec: str) -> list[float]:
    """`1,2,4,8` or `START:STOP:STEP` (inclusive, linear) -> ascending positive rates."""
    try:
        if ":" in spec:
            start, stop, step = (float(x) for x in spec.split(":"))
            if step <= 0 or stop < start:
                raise ValueError
            count = int((stop - start) / step + 1e-9) + 1
            rates = [round(start + i * step, 6) for i in range(count)]
        else:
            rates = [float(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise LoadgenError(f"--sweep takes rates as 1,2,4,8 or START:STOP:STEP, got {spec!r}") from None
    if not rates or any(r <= 0 for r in rates):
        raise LoadgenError(f"--sweep rates must be positive, got {spec!r}")
    return sorted(set(rates))


def _point(rate: float, summary: dict[str, Any]) -> dict[str, Any]:
    return {
        "rate_rps": rate,
        "achieved_rate_rps": summary["achieved_rate_rps"],
        "slo_attainment": summary["slo_attainment"],
        "goodput_rps": summary["goodput_rps"],
        "correct_goodput_rps": summary["correct_goodput_rps"],
        "correct_goodput_ci95": summary["correct_goodput_ci95"],
        "min_slo_scale": summary["min_slo_scale"],
        "accuracy": summary["accuracy"],
        "failed": summary["failed"],
        "ttft_p99_ms": summary["ttft_ms"]["p99"],
        "e2el_p99_ms": summary["e2el_ms"]["p99"],
    }


def run_sweep(cfg: LoadConfig, rates: list[float], target: float, refine: int = 0,
              run: RunFn = run_load) -> tuple[dict[str, Any], dict[str, Any], list[RequestRecord]]:
    """Returns (sweep result, summary of the run at the best rate, that run's records)."""
    if cfg.concurrency is not None:
        raise LoadgenError("--sweep steps the open-loop rate; it cannot be combined with --concurrency")
    if not cfg.slo:
        raise LoadgenError("--sweep needs --slo: attainment is measured against it")
    runs: dict[float, tuple[dict[str, Any], list[RequestRecord]]] = {}

    def at(rate: float) -> bool:
        out = str(Path(cfg.out) / f"rate-{rate:g}") if cfg.out else None
        runs[rate] = run(msgspec.structs.replace(cfg, rate=rate, out=out, plots=False))
        return runs[rate][0]["slo_attainment"] >= target

    good: float | None = None
    bad: float | None = None
    for rate in rates:
        if not at(rate):
            bad = rate
            break
        good = rate
    if good is not None and bad is not None:
        for _ in range(refine):
            mid = round((good + bad) / 2, 6)
            if mid in (good, bad):
                break
            if at(mid):
                good = mid
            else:
                bad = mid
    points = [_point(r, runs[r][0]) for r in sorted(runs)]
    sweep = {
        "attainment_target": target,
        "max_sustainable_rate_rps": good,
        "first_failing_rate_rps": bad,
        "points": points,
    }
    best = good if good is not None else min(runs)
    summary, records = runs[best]
    return sweep, summary, records
