"""Honest operating points: each named hint's accuracy and token share beside the random-route null calibrated the
same way, in sample and out of fold.

A router's operating point means something only beside what a route score that reads nothing of the prompt reaches
when its thresholds are searched by the same rule on the same rows: `calibrate_scores` hits its target on the rows it
searched whatever the score, so in sample a uniform-random score reaches `best`'s accuracy too, and what is left to
compare is what each spends. A review of the shipped router found exactly that (a random score calibrated the same
way reached 0.729-0.734 at a median 0.73x the reasoning tier's tokens, 4 of 100 draws at 0.58x or less). So for each
named hint this module reports

* **in sample**: thresholds calibrated on all rows and measured on them (what a card's calibration states);
* **out of fold** (nested): rows split into seeded folds, each fold's thresholds calibrated on the *other* folds'
  rows alone and applied to it, so every row is routed by thresholds that never saw it;

and, for each, the router's accuracy, mean cost and token share (mean decode tokens of the picked tiers over the
most accurate tier's alone, on the same rows; None where the outcomes hold no token counts), the null's mean and 95%
band over `draws` uniform score vectors (one seed), and the paired difference router - null with a 95% interval:
a percentile bootstrap over rows in which resample b compares the router with draw b mod `draws` on the same
resampled rows, so the interval carries both the rows' and the null's own spread.

Pure numpy besides the calibration rule it shares with training (cascade/router/train/calibration.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import msgspec
import numpy as np

from cascade.router.operating import chosen_tiers
from cascade.router.train.calibration import named_thresholds

# At least this many draws: the review's 4-in-100 tail is the resolution the band needs, and fewer is noise.
MIN_DRAWS = 100
MAX_DRAWS = 10_000  # each draw calibrates folds + 1 times (~5 ms each on 384 rows of 4 tiers)
DEFAULT_DRAWS = 100
DEFAULT_FOLDS = 5
MIN_FOLDS, MAX_FOLDS = 2, 20
RESAMPLES = 1000


class Interval(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    mean: float
    ci95: list[float]


class Spread(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A mean with its 95% interval for each of accuracy, cost and token share (None: tokens unknown)."""

    accuracy: Interval
    cost: Interval
    token_share: Interval | None


class Measured(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    accuracy: float
    cost: float  # mean tier cost per prompt (the --costs scale)
    token_share: float | None  # mean decode tokens over the most accurate tier's; None when tokens are unknown


class Versus(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    router: Measured
    null: Spread  # mean and 2.5-97.5 percentiles over the draws
    router_minus_null: Spread  # paired bootstrap over rows with the draws


class HonestPoint(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    in_sample: Versus  # thresholds calibrated on the rows they are measured on
    out_of_fold: Versus  # each fold's thresholds calibrated on the other folds (nested)


class NullReport(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    draws: int
    seed: int
    folds: int
    resamples: int
    token_reference: str | None  # the tier token shares are relative to (the most accurate alone); None: unknown
    points: list[HonestPoint]


def check_draws(draws: int, folds: int) -> None:
    if not MIN_DRAWS <= draws <= MAX_DRAWS:
        raise ValueError(f"the random-route null needs {MIN_DRAWS} to {MAX_DRAWS:,} draws, got {draws}")
    if not MIN_FOLDS <= folds <= MAX_FOLDS:
        raise ValueError(f"nested calibration needs {MIN_FOLDS} to {MAX_FOLDS} folds, got {folds}")


def fold_of_rows(n: int, folds: int, seed: int) -> np.ndarray:
    """The fold of each row: a seeded permutation dealt round-robin, so fold sizes differ by at most one."""
    fold = np.empty(n, dtype=int)
    fold[np.random.default_rng(seed).permutation(n)] = np.arange(n) % folds
    return fold


def nested_thresholds(scores: np.ndarray, correct: np.ndarray, costs: np.ndarray | None,
                      fold: np.ndarray) -> list[dict[str, list[float]]]:
    """Per fold k, each named hint's thresholds calibrated on the rows outside fold k only: fold k's rows are not
    passed to the calibration at all."""
    return [named_thresholds(scores[fold != k], correct[fold != k], costs) for k in range(int(fold.max()) + 1)]


def named_picks(scores: np.ndarray, correct: np.ndarray, costs: np.ndarray | None,
                fold: np.ndarray | None) -> dict[str, np.ndarray]:
    """The tier each row gets under each named hint: thresholds calibrated on all rows (``fold`` None, in sample) or
    on the other folds' rows (nested)."""
    if fold is None:
        return {hint: chosen_tiers(scores, np.array(t)) for hint, t in named_thresholds(scores, correct, costs).items()}
    tiers: dict[str, np.ndarray] = {}
    for k, named in enumerate(nested_thresholds(scores, correct, costs, fold)):
        held_out = fold == k
        for hint, thresholds in named.items():
            tiers.setdefault(hint, np.zeros(len(scores), dtype=int))[held_out] = chosen_tiers(
                scores[held_out], np.array(thresholds))
    return tiers


def _top_tier(correct: np.ndarray) -> int:
    """The most accurate tier: token shares are relative to its decode tokens."""
    return int(np.asarray(correct, dtype=float).mean(axis=0).argmax())


def _known_tokens(tokens: np.ndarray | None) -> np.ndarray | None:
    """Decode tokens as floats, or None unless every row's every tier has a count."""
    known = tokens is not None and bool(np.isfinite(tokens).all())
    return np.asarray(tokens, dtype=float) if known else None


def _token_reference(correct: np.ndarray, tokens: np.ndarray | None, tiers: list[str] | None) -> str | None:
    if _known_tokens(tokens) is None:
        return None
    top = _top_tier(correct)
    return tiers[top] if tiers else str(top)


class _Rows:
    """What each row's picked tier scores: correct (0/1), cost and decode tokens (NaN-free or None)."""

    def __init__(self, correct: np.ndarray, costs: np.ndarray, tokens: np.ndarray | None) -> None:
        self.correct = np.asarray(correct, dtype=float)
        self.costs = costs
        self.top = _top_tier(correct)
        self.tokens = _known_tokens(tokens)

    def per_row(self, tiers: np.ndarray) -> np.ndarray:
        """(metrics, rows): correctness, cost and tokens (NaN rows when unknown) of ``tiers``' picks."""
        at = (np.arange(len(tiers)), tiers)
        tokens = self.tokens[at] if self.tokens is not None else np.full(len(tiers), np.nan)
        return np.vstack([self.correct[at], self.costs[tiers], tokens])

    def summary(self, per_row: np.ndarray, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
        """Accuracy, cost and token share of per-row metrics (..., 3, n) over ``rows``."""
        picked = per_row[..., rows]
        share = (picked[..., 2, :].sum(axis=-1) / self.tokens[rows, self.top].sum() if self.tokens is not None
                 else np.full(picked.shape[:-2], np.nan))
        return np.stack([picked[..., 0, :].mean(axis=-1), picked[..., 1, :].mean(axis=-1), share], axis=-1)


class Samples(NamedTuple):
    """One named hint in one mode, as arrays of (accuracy, cost, token share) columns (token share NaN where tokens are
    unknown): the router's, the null's per draw (draws, 3), and the paired bootstrap differences router - null
    (resamples, 3). Callers that pool several reports (e.g. repeated fold assignments) pool these."""

    router: np.ndarray
    null: np.ndarray
    differences: np.ndarray


def random_null(scores: np.ndarray, correct: np.ndarray, *, costs: np.ndarray | None = None,
                tokens: np.ndarray | None = None, tiers: list[str] | None = None, draws: int = DEFAULT_DRAWS,
                folds: int = DEFAULT_FOLDS, seed: int = 0, resamples: int = RESAMPLES) -> NullReport:
    """The router's named operating points (its route ``scores`` calibrated by `calibrate_scores`) beside the
    random-route null's, in sample and out of fold (module docstring). ``correct`` and ``tokens``: (rows, tiers);
    every random choice (the draws, the folds, the resamples) follows ``seed``."""
    samples = null_samples(scores, correct, costs=costs, tokens=tokens, draws=draws, folds=folds, seed=seed,
                           resamples=resamples)
    points = [HonestPoint(name=hint, **{mode: _versus(s) for mode, s in by_mode.items()})
              for hint, by_mode in samples.items()]
    return NullReport(draws=draws, seed=seed, folds=folds, resamples=resamples,
                      token_reference=_token_reference(correct, tokens, tiers), points=points)


def null_samples(scores: np.ndarray, correct: np.ndarray, *, costs: np.ndarray | None = None,
                 tokens: np.ndarray | None = None, draws: int = DEFAULT_DRAWS, folds: int = DEFAULT_FOLDS,
                 seed: int = 0, resamples: int = RESAMPLES) -> dict[str, dict[str, Samples]]:
    """hint -> mode ("in_sample", "out_of_fold") -> `Samples`: what `random_null` summarises, with the same
    arguments and the same seeded draws, folds and resamples."""
    check_draws(draws, folds)
    correct = np.asarray(correct, dtype=bool)
    n, n_tiers = correct.shape
    if n < 2 * folds:
        raise ValueError(f"nested calibration over {folds} folds needs at least {2 * folds} rows, got {n}")
    cost_scale = np.arange(n_tiers, dtype=float) if costs is None else np.asarray(costs, dtype=float)
    rows = _Rows(correct, cost_scale, tokens)
    rng = np.random.default_rng(seed)
    fold = fold_of_rows(n, folds, seed)
    null_scores = rng.random((draws, n))
    resampled = rng.integers(0, n, (resamples, n))
    modes: dict[str, np.ndarray | None] = {"in_sample": None, "out_of_fold": fold}
    router = {mode: named_picks(np.asarray(scores, float), correct, costs, f) for mode, f in modes.items()}
    null = {mode: [named_picks(u, correct, costs, f) for u in null_scores] for mode, f in modes.items()}
    samples: dict[str, dict[str, Samples]] = {}
    for hint in router["in_sample"]:
        for mode in modes:
            mine = rows.per_row(router[mode][hint])
            theirs = np.stack([rows.per_row(picks[hint]) for picks in null[mode]])
            draw_of = np.arange(len(resampled)) % len(theirs)
            differences = np.stack([rows.summary(mine, r) - rows.summary(theirs[d], r)
                                    for r, d in zip(resampled, draw_of, strict=True)])
            samples.setdefault(hint, {})[mode] = Samples(rows.summary(mine), rows.summary(theirs), differences)
    return samples


def _versus(samples: Samples) -> Versus:
    router, per_draw = samples.router, samples.null
    return Versus(router=Measured(accuracy=_round(router[0]), cost=_round(router[1]), token_share=_known(router[2])),
                  null=_spread(per_draw, lambda m: per_draw[:, m].mean()),
                  router_minus_null=_spread(samples.differences, lambda m: router[m] - per_draw[:, m].mean()))


def _spread(values: np.ndarray, mean: Callable[[int], float]) -> Spread:
    """Mean and 2.5-97.5 percentiles of each metric column of ``values`` (samples, 3)."""
    intervals = [Interval(mean=_round(mean(m)), ci95=[_round(v) for v in np.percentile(values[:, m], [2.5, 97.5])])
                 if np.isfinite(values[:, m]).all() else None for m in range(3)]
    accuracy, cost, share = intervals
    assert accuracy is not None and cost is not None
    return Spread(accuracy=accuracy, cost=cost, token_share=share)


def _round(value: float) -> float:
    return round(float(value), 4)


def _known(value: float) -> float | None:
    return _round(value) if np.isfinite(value) else None
