"""The roofline's `Efficiency` fitted to step times measured on a GPU, and how far the shipped default is from them.

Input: ../shared/data/gpu/h200-steps.json (README there) with shapes.json beside it: 153 decode steps over 8 model
shapes (batch 1..512 x context 512/2048 per sequence) and their prefills (one prompt of 128..8192 tokens).

Fitted: `compute`, `memory`, `attention_memory` and `layer_overhead_s` of cascade/optimizer/roofline.py's
`Efficiency`, on a TP1 replica of each shape that has a GPU model card (models/gpu-models/: the roofline plans no other
model; the embedded ladder's shapes are reported, not fitted), over every decode point and every prefill point that
kernel launches do not bound (cascade/optimizer/measured_steps.py, `launch_bound`). The rest keep their defaults: no
TP or PP was measured, and the measured steps have no scheduler (`step_overhead_s`, SGLang's, stays assumed). Least
squares on log(predicted / measured), then on its higher even powers up to the 64th: close to the fit whose worst point
is best. `default` is what `Efficiency()` ships (the fit, rounded); `shapes` gives each shape's errors under it.

Output: one JSON object. Usage: .venv/bin/python -m benchmarks.planner.roofline_calibration [--json-out F]
(benchmarks/results/roofline_calibration.json; a few seconds.)
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from scipy.optimize import least_squares

from cascade.data.datasets import shared_data_dir
from cascade.optimizer import measured_steps as ms
from cascade.optimizer.cards import ModelCard, load_gpu
from cascade.optimizer.roofline import Efficiency, RooflineCost, Shape
from cascade.repo_paths import recorded_path
from cascade.testing.scripts import fail, print_result

FITTED = ("compute", "memory", "attention_memory", "layer_overhead_s")
FRACTIONS = 3  # the first three are fractions of a peak (at most 1)
POWERS = (4, 8, 16, 32, 64)


def efficiency(x: np.ndarray) -> Efficiency:
    return msgspec.structs.replace(Efficiency(), **dict(zip(FITTED, (float(v) for v in np.exp(x)), strict=True)))


def log_errors(eff: Efficiency, cards: dict[str, ModelCard], steps: ms.MeasuredSteps, gpu: str) -> np.ndarray:
    """log(predicted / measured) at every decode point and every prefill point not bound by kernel launches."""
    spec, parts = load_gpu(gpu), []
    for name, measured in steps.models.items():
        cost = RooflineCost(cards[name], spec, Shape(1), efficiency=eff)
        parts += [np.log1p(ms.decode_errors(cost, measured)),
                  np.log1p(ms.prefill_errors(cost, measured)[~ms.launch_bound(measured)])]
    return np.concatenate(parts)


def fit(cards: dict[str, ModelCard], steps: ms.MeasuredSteps, gpu: str) -> Efficiency:
    """The `FITTED` fields that best fit every shape of `steps` (the others at their defaults)."""
    default = Efficiency()
    start = np.log([getattr(default, f) for f in FITTED])
    upper = [0.0] * FRACTIONS + [np.inf] * (len(FITTED) - FRACTIONS)
    bounds = ([-np.inf] * len(FITTED), upper)
    x = least_squares(lambda x: log_errors(efficiency(x), cards, steps, gpu), start, bounds=bounds).x
    for p in POWERS:
        x = least_squares(lambda x, p=p: np.abs(log_errors(efficiency(x), cards, steps, gpu)) ** (p / 2), x,
                          bounds=bounds).x
    return efficiency(x)


def rounded(eff: Efficiency) -> dict[str, float]:
    """The fit as `Efficiency`'s defaults write it: fractions to 0.01, overheads to 2 significant digits."""
    out = {}
    for f in FITTED:
        v = getattr(eff, f)
        out[f] = round(v, 2) if f in FITTED[:FRACTIONS] else round(v, 1 - math.floor(math.log10(v)))
    return out


def shape_errors(eff: Efficiency, card: ModelCard, measured: ms.MeasuredShape, gpu: str) -> dict[str, Any]:
    cost = RooflineCost(card, load_gpu(gpu), Shape(1), efficiency=eff)
    decode, prefill = ms.decode_errors(cost, measured), ms.prefill_errors(cost, measured)
    bound = ms.launch_bound(measured)
    return {"decode_worst": round(float(np.max(np.abs(decode))), 3),
            "decode_range": [round(float(decode.min()), 3), round(float(decode.max()), 3)],
            "prefill_worst": round(float(np.max(np.abs(prefill[~bound]), initial=0.0)), 3),
            "prefill": {str(p.tokens): round(float(e), 3) for p, e in zip(measured.prefill, prefill, strict=True)},
            "prefill_launch_bound": [p.tokens for p, b in zip(measured.prefill, bound, strict=True) if b]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=Path, default=shared_data_dir() / "gpu" / "h200-steps.json",
                        help="measured step times (default: ../shared/data/gpu/h200-steps.json)")
    parser.add_argument("--gpu", default="h200", help="the GPU spec of models/gpu/ they were measured on")
    parser.add_argument("--json-out", help="also write the JSON result here")
    args = parser.parse_args(argv)
    if not args.steps.is_file():
        return fail(f"no measured steps at {args.steps} (put ../shared beside the clone or set CASCADE_SHARED_DATA)")
    steps, cards = ms.load_steps(args.steps), ms.shape_cards(args.steps)
    carded = msgspec.structs.replace(steps, models={n: m for n, m in steps.models.items() if ms.has_card(n)})
    fitted = fit(cards, carded, args.gpu)
    default = Efficiency()
    worst = {label: float(np.expm1(np.max(np.abs(log_errors(e, cards, carded, args.gpu)))))
             for label, e in (("fitted", fitted), ("default", default))}
    result = {
        "steps": recorded_path(args.steps), "gpu": args.gpu, "fitted_shapes": list(carded.models),
        "held": "every decode point; prefill points not bound by kernel launches "
                f"(at least {ms.LAUNCH_BOUND}x the shortest prompt's time)",
        "points": len(log_errors(default, cards, carded, args.gpu)),
        "fitted": {f: getattr(fitted, f) for f in FITTED}, "fitted_rounded": rounded(fitted),
        "default": {f: getattr(default, f) for f in FITTED},
        "default_is_fit": rounded(fitted) == {f: getattr(default, f) for f in FITTED},
        "worst_error": {k: round(v, 3) for k, v in worst.items()},
        "shapes": {name: shape_errors(default, cards[name], measured, args.gpu)
                   for name, measured in steps.models.items()},
    }
    print_result(msgspec.to_builtins(result), args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
