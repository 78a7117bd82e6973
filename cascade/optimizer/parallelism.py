"""Parallelism search: for each tier and GPU count f, the best set of DP replicas with their own
(TP, PP) on at most f GPUs, and its latency l_i(f) (Cascadia's step 1).

Per replica shape, the simulator gives a latency curve over utilization u = rate / capacity (one
saturation run for the capacity, an unloaded closed form at u = 0, a few Poisson runs in between).
A tier's traffic is split over its replicas in proportion to their capacities, so every replica
runs at the same u and a configuration's latency is the worst of its shapes' curves at that u.
Configurations mix at most two shapes (Cascadia allows any mix; two covers "fill the leftover
GPUs with smaller replicas"). For a fixed pair of shapes the best mix on f GPUs is the one with
the most capacity, which does not depend on the rate, so the rate-dependent part of l_i(f) is a
vectorized interpolation: cheap enough to redo for every candidate routing in the outer search.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import msgspec
import numpy as np

from cascade.optimizer import simulator
from cascade.optimizer.roofline import ReplicaCost, Shape

# Utilization grid of the latency curves; beyond the last point a replica counts as overloaded.
U_GRID = np.array([0.0, 0.3, 0.6, 0.8, 0.92])
TP_DEGREES = (1, 2, 4, 8)
PP_DEGREES = (1, 2, 4)


class ReplicaCurve(msgspec.Struct, frozen=True):
    tp: int
    pp: int
    capacity_rps: float
    latency_s: list[float | None]  # at U_GRID; None: overloaded

    @property
    def shape(self) -> Shape:
        return Shape(self.tp, self.pp)


class ReplicaGroup(msgspec.Struct, frozen=True):
    tp: int
    pp: int
    count: int


@dataclass(frozen=True)
class SimSettings:
    requests: int = 600
    percentile: float = 95.0
    max_batch: int = 256
    max_prefill_tokens: int = 16384
    seed: int = 0
    first_wave: int = 0  # the tier's adaptive first wave (simulator.simulate_tier)


def candidate_shapes(costs: dict[Shape, ReplicaCost], mean_input: float, mean_output: float,
                     settings: SimSettings) -> list[Shape]:
    """Drop shapes another shape beats on both counts: a shape on g' GPUs loses to one on g | g'
    GPUs whose g'/g replicas have at least its capacity at no worse single-request speed (e.g. PP
    inside a node loses to TP on the same GPUs, or to two half-size replicas)."""
    speed = {s: c.decode_time(1, mean_input + mean_output / 2) for s, c in costs.items()}
    capacity = {s: c.capacity_rps(mean_input, mean_output, settings.max_batch, settings.max_prefill_tokens)
                for s, c in costs.items()}
    keep = []
    for s in costs:
        beaten = any(
            o != s and s.gpus % o.gpus == 0 and (s.gpus // o.gpus) * capacity[o] >= capacity[s]
            and speed[o] <= speed[s] and (o.gpus < s.gpus or speed[o] < speed[s] or capacity[o] > capacity[s])
            for o in costs
        )
        if not beaten and capacity[s] > 0:
            keep.append(s)
    return sorted(keep)


def enumerate_shapes(max_gpus: int) -> list[Shape]:
    return [Shape(tp, pp) for tp, pp in itertools.product(TP_DEGREES, PP_DEGREES) if tp * pp <= max_gpus]


def replica_curve(cost: ReplicaCost, input_tokens: np.ndarray, output_tokens: np.ndarray,
                  settings: SimSettings) -> ReplicaCurve:
    """Capacity and latency percentile over U_GRID for one shape on one tier's request mix."""
    rng = np.random.default_rng(settings.seed)
    p, o, gaps = simulator.workload_sample(rng, input_tokens, output_tokens, settings.requests)
    limits = dict(kv_capacity_tokens=cost.kv_capacity_tokens, max_batch=settings.max_batch,
                  max_prefill_tokens=settings.max_prefill_tokens, first_wave=settings.first_wave)
    capacity = simulator.saturation_rps(cost, p, o, **limits)
    values: list[float | None] = [simulator.unloaded_percentile(cost, p, o, settings.percentile,
                                                                first_wave=settings.first_wave)]
    for u in U_GRID[1:]:
        value = simulator.replica_percentile(cost, u * capacity, p, o, gaps, percentile=settings.percentile,
                                             seed=settings.seed, **limits)
        values.append(value if math.isfinite(value) else None)
        if values[-1] is None:
            values.extend([None] * (len(U_GRID) - len(values)))
            break
    # A curve must not fall as load grows: sampling noise could make it dip.
    finite = [v for v in values if v is not None]
    monotone = list(np.maximum.accumulate(finite)) if finite else []
    latency: list[float | None] = [float(v) for v in monotone] + [None] * (len(values) - len(finite))
    return ReplicaCurve(tp=cost.shape.tp, pp=cost.shape.pp, capacity_rps=capacity, latency_s=latency)


class TierTable:
    """l(f) for one tier at any arrival rate, from its replica curves (f = 0..total_gpus)."""

    def __init__(self, curves: list[ReplicaCurve], total_gpus: int) -> None:
        self.curves = curves
        self.total_gpus = total_gpus
        f = np.arange(total_gpus + 1)
        groups: list[tuple[int, ...]] = [(i,) for i in range(len(curves))]
        groups += list(itertools.combinations(range(len(curves)), 2))
        caps, mixes, logs = [], [], []
        for group in groups:
            cap, mix = self._best_mix(group, f)
            caps.append(cap)
            mixes.append(mix)
            logs.append(np.max([_log_curve(curves[i]) for i in group], axis=0))
        self.groups = groups
        self.capacity = np.array(caps)  # (groups, f): best capacity of the group on <= f GPUs
        self.mix = np.array(mixes)  # (groups, f): replicas of the group's second shape (pairs)
        self.log_latency = np.array(logs)  # (groups, len(U_GRID)); inf where overloaded
        self._segments = _Segments(self.log_latency)

    def _best_mix(self, group: tuple[int, ...], f: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        first = self.curves[group[0]]
        g1, c1 = first.tp * first.pp, first.capacity_rps
        if len(group) == 1:
            return (f // g1) * c1, np.zeros_like(f)
        second = self.curves[group[1]]
        g2, c2 = second.tp * second.pp, second.capacity_rps
        best, best_k2 = np.zeros(len(f)), np.zeros(len(f), dtype=int)
        for k2 in range(1, self.total_gpus // g2 + 1):
            k1 = (f - k2 * g2) // g1
            cap = np.where(k1 >= 1, k1 * c1 + k2 * c2, 0.0)
            better = cap > best
            best, best_k2 = np.where(better, cap, best), np.where(better, k2, best_k2)
        return best, best_k2

    def latency(self, rate_rps: float, allowed: np.ndarray | None = None, idle: bool = False
                ) -> tuple[np.ndarray, np.ndarray]:
        """(l(f), chosen group per f) for f = 0..N; inf where nothing fits or keeps up. `allowed`
        (bool per group) restricts the configurations, e.g. to one uniform shape. `idle`: a tier no request reaches
        may go without GPUs (l(0) = 0 then; otherwise l(0) is inf)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            u = np.where(self.capacity > 0, rate_rps / self.capacity, np.inf)
        values = self._segments(u)
        if rate_rps <= 0:  # no request reaches the tier: deployed (it must fit) but never waited on
            values = np.where(np.isfinite(values), -np.inf, np.inf)
            if idle:
                values[:, 0] = -np.inf
        if allowed is not None:
            values = np.where(allowed[:, None], values, np.inf)
        best = np.argmin(values, axis=0)
        lat = np.exp(values[best, np.arange(values.shape[1])])
        return lat, best

    def replicas(self, group_index: int, gpus: int) -> list[ReplicaGroup]:
        group = self.groups[group_index]
        first = self.curves[group[0]]
        if len(group) == 1:
            return [ReplicaGroup(tp=first.tp, pp=first.pp, count=gpus // (first.tp * first.pp))]
        second = self.curves[group[1]]
        k2 = int(self.mix[group_index, gpus])
        k1 = (gpus - k2 * second.tp * second.pp) // (first.tp * first.pp)
        return [ReplicaGroup(tp=first.tp, pp=first.pp, count=k1), ReplicaGroup(tp=second.tp, pp=second.pp, count=k2)]

    def group_latency(self, group_index: int, gpus: int, rate_rps: float) -> float:
        """Latency of one fixed configuration at another rate (a deployment serving a new routing)."""
        cap = self.capacity[group_index, gpus]
        if rate_rps <= 0:
            return 0.0 if cap > 0 or gpus == 0 else math.inf  # an idle tier without GPUs waits for nothing
        u = np.full((len(self.groups), 1), rate_rps / cap if cap > 0 else np.inf)
        return float(np.exp(self._segments(u)[group_index, 0]))


def _log_curve(curve: ReplicaCurve) -> np.ndarray:
    return np.array([math.log(v) if v is not None else math.inf for v in curve.latency_s])


class _Segments:
    """Row-wise piecewise-linear log-latency over U_GRID, precomputed once per table so that the
    thousands of calls from the outer search cost a handful of vector operations each."""

    def __init__(self, log_curves: np.ndarray) -> None:
        finite = np.isfinite(log_curves)
        last = finite.sum(axis=1) - 1  # curves are finite up to some grid point, inf after
        self.limit = np.where(last >= 0, U_GRID[np.maximum(last, 0)], -1.0)[:, None]
        width = np.diff(U_GRID)
        with np.errstate(invalid="ignore"):
            slope = np.diff(log_curves, axis=1) / width
        self.base = np.where(finite, log_curves, 0.0)
        self.slope = np.where(np.isfinite(slope), slope, 0.0)
        self.rows = np.arange(log_curves.shape[0])[:, None]

    def __call__(self, u: np.ndarray) -> np.ndarray:
        idx = np.clip(np.searchsorted(U_GRID, u, side="right") - 1, 0, len(U_GRID) - 2)
        with np.errstate(invalid="ignore"):  # u = inf (no replica fits) is masked just below
            value = self.base[self.rows, idx] + self.slope[self.rows, idx] * (u - U_GRID[idx])
        return np.where(u <= self.limit, value, np.inf)
