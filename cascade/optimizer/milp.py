"""GPU allocation across tiers (Cascadia's inner MILP): one GPU count per tier, the counts add up
to N (or at most N), minimize the worst tier latency L.

    min L  s.t.  sum_f x[i,f] = 1 (each tier),  sum_{i,f} f x[i,f] = N (or <= N),
                 L >= sum_f l_i(f) x[i,f] (each tier),  x binary, x[i,f] = 0 where l_i(f) is missing

`solve_highs` is that model in HiGHS (status always checked). `solve_dp` solves the same problem
exactly by dynamic programming over GPU counts, O(C * N^2): the outer search calls it thousands of
times, where HiGHS would dominate the run time. Tests check both against brute-force enumeration.
Tables are arrays of shape (tiers, N + 1), column f = latency on f GPUs, inf = does not fit.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import msgspec
import numpy as np

from cascade import files
from cascade.errors import CascadeError, ConfigError

Status = Literal["optimal", "infeasible"]


class SolverError(CascadeError):
    """HiGHS ended without an optimal or proven-infeasible answer (time limit, numerical trouble)."""


class Allocation(msgspec.Struct, frozen=True):
    status: Status
    latency_s: float  # inf when infeasible
    gpus: list[int]  # per tier; empty when infeasible


INFEASIBLE = Allocation(status="infeasible", latency_s=math.inf, gpus=[])


def _check(table: np.ndarray, total_gpus: int) -> None:
    if table.ndim != 2 or table.shape[1] != total_gpus + 1:
        raise ValueError(f"table must have shape (tiers, {total_gpus + 1}), got {table.shape}")


def solve_highs(table: np.ndarray, total_gpus: int, exact: bool = True, time_limit_s: float = 60.0,
                upper_bound: float | None = None, weights: np.ndarray | None = None, slack: float = 0.0,
                allow_idle: bool = False) -> Allocation:
    """The MILP in HiGHS. `upper_bound`, the latency of some feasible allocation, drops the columns
    above it (no optimal allocation can use them): the answer stays exact and comes ~10x faster.
    `weights` (per tier) breaks ties among the allocations reaching the optimal L by a second MILP,
    min sum_i w_i l_i(f_i) over the columns within (1 + slack) L: min-max alone leaves the GPUs the
    bottleneck tier does not need to an arbitrary tier."""
    _check(table, total_gpus)
    usable = np.isfinite(table)
    if upper_bound is not None:
        usable &= table <= upper_bound * (1 + 1e-9)
    if not allow_idle:
        usable[:, 0] = False  # every tier gets at least one GPU
    first = _highs(table, total_gpus, exact, usable, None, time_limit_s)
    if first.status != "optimal" or weights is None:
        return first
    usable &= table <= first.latency_s * (1 + slack + 1e-9)
    return _highs(table, total_gpus, exact, usable, np.asarray(weights, dtype=float), time_limit_s)


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Send file descriptor 1 to stderr while HiGHS runs: highspy >= 1.16 prints its banner on
    stdout when a Highs object is built, before `silent()` can stop it, and that would corrupt
    `--json` output. C stdio buffers are flushed before the descriptor goes back, so nothing the
    library printed leaks to stdout later."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).fflush(None)
        os.dup2(saved, 1)
        os.close(saved)


def _highs(table: np.ndarray, total_gpus: int, exact: bool, usable: np.ndarray, weights: np.ndarray | None,
           time_limit_s: float) -> Allocation:
    import highspy

    if not usable.any(axis=1).all():
        return INFEASIBLE
    with _stdout_to_stderr():
        h = highspy.Highs()
        h.silent()
    h.setOptionValue("mip_rel_gap", 0.0)  # prove optimality, not 0.01% of it
    h.setOptionValue("time_limit", time_limit_s)
    x: list[dict[int, Any]] = []
    for i in range(table.shape[0]):
        cols = {int(f): h.addBinary() for f in np.flatnonzero(usable[i])}
        x.append(cols)
        h.addConstr(h.qsum(cols.values()) == 1)
    used = h.qsum(f * v for cols in x for f, v in cols.items())
    h.addConstr(used == total_gpus if exact else used <= total_gpus)
    if weights is None:  # min L, L >= each tier's latency
        latency = h.addVariable(lb=0.0)
        for i, cols in enumerate(x):
            h.addConstr(latency >= h.qsum(float(table[i, f]) * v for f, v in cols.items()))
        h.minimize(latency)
    else:
        h.minimize(h.qsum(float(weights[i] * table[i, f]) * v for i, cols in enumerate(x) for f, v in cols.items()))
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kInfeasible:
        return INFEASIBLE
    if status != highspy.HighsModelStatus.kOptimal:
        raise SolverError(f"HiGHS could not solve the allocation: {h.modelStatusToString(status)}")
    gpus = [_chosen(h, cols) for cols in x]
    # Report the table's value of the chosen allocation, not the solver's float L.
    return Allocation(status="optimal", latency_s=_worst(table, gpus), gpus=gpus)


def _chosen(h: Any, cols: dict[int, Any]) -> int:
    """The GPU count whose binary is set (the largest value, robust to integrality tolerance)."""
    return max(cols, key=lambda f: float(h.val(cols[f])))


def solve_dp(table: np.ndarray, total_gpus: int, exact: bool = True, weights: np.ndarray | None = None,
             slack: float = 0.0, allow_idle: bool = False) -> Allocation:
    """The same problem (and tie-break) by dynamic programming over GPU counts, O(C * N^2). `allow_idle`: a tier
    may get 0 GPUs where the table's column 0 is finite (otherwise every tier gets at least one)."""
    _check(table, total_gpus)
    if not allow_idle:
        table = table.copy()
        table[:, 0] = np.inf
    gpus = _dp(table, total_gpus, exact, np.maximum)
    if gpus is None:
        return INFEASIBLE
    if weights is not None:
        worst = _worst(table, gpus)
        tied = np.where(table <= worst * (1 + slack + 1e-9), table * np.asarray(weights, dtype=float)[:, None], np.inf)
        gpus = _dp(tied, total_gpus, exact, np.add) or gpus
    return Allocation(status="optimal", latency_s=_worst(table, gpus), gpus=gpus)


def _dp(table: np.ndarray, total_gpus: int, exact: bool, combine: Any) -> list[int] | None:
    """best[i][n] = min over allocations of tiers 0..i using exactly n GPUs of combine(values)."""
    size = total_gpus + 1
    lat = table
    best = lat[0].copy()
    choices = []
    valid, prev_idx, f_idx = _dp_indices(size)
    for i in range(1, table.shape[0]):
        # cand[n, f] = combine(best[n - f], lat[f]) for f <= n: a (size x size) matrix per tier.
        cand = np.where(valid, combine(best[prev_idx], lat[i][f_idx]), np.inf)
        choice = np.argmin(cand, axis=1)
        best = cand[np.arange(size), choice]
        choices.append(choice)
    end = total_gpus if exact else int(np.argmin(best))
    if not math.isfinite(best[end]):
        return None
    gpus = []
    for choice in reversed(choices):
        f = int(choice[end])
        gpus.append(f)
        end -= f
    gpus.append(end)
    gpus.reverse()
    return gpus


@functools.lru_cache(maxsize=8)
def _dp_indices(size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n_idx, f_idx = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
    valid = f_idx <= n_idx
    return valid, np.where(valid, n_idx - f_idx, 0), f_idx


def _worst(table: np.ndarray, gpus: list[int]) -> float:
    return float(max(table[i, f] for i, f in enumerate(gpus)))


def weighted(table: np.ndarray, gpus: list[int], weights: np.ndarray) -> float:
    return float(sum(weights[i] * table[i, f] for i, f in enumerate(gpus)))


# ---- latency.json (the `cascade optimize allocate` input) ----------------------------------------


class TierLatency(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    latency_s: dict[str, float]  # "<f>" -> seconds; a missing f does not fit


class LatencyTable(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    gpus: int
    tiers: list[TierLatency]

    def matrix(self) -> np.ndarray:
        table = np.full((len(self.tiers), self.gpus + 1), np.inf)
        for i, tier in enumerate(self.tiers):
            for key, value in tier.latency_s.items():
                f = _gpu_count(key, tier.name, self.gpus)
                if not (math.isfinite(value) and value >= 0):
                    raise ConfigError(f"tier `{tier.name}`: latency_s[{key!r}] must be a finite number >= 0")
                table[i, f] = value
        return table


def _gpu_count(key: str, tier: str, total: int) -> int:
    try:
        f = int(key)
    except ValueError:
        raise ConfigError(f"tier `{tier}`: latency_s key {key!r} must be a GPU count like \"4\"") from None
    if not 1 <= f <= total:
        raise ConfigError(f"tier `{tier}`: latency_s key {key!r} is outside 1..{total} (`gpus`)")
    return f


def load_table(path: str | Path) -> LatencyTable:
    p = Path(path)
    table = files.load(p, LatencyTable, "latency table")
    if table.gpus < 1 or not table.tiers:
        raise ConfigError(f"{p}: `gpus` must be >= 1 and `tiers` non-empty")
    names = [t.name for t in table.tiers]
    if len(set(names)) != len(names):
        raise ConfigError(f"{p}: tier names must be unique, got {names}")
    return table


def table_from_matrix(names: list[str], matrix: np.ndarray) -> LatencyTable:
    tiers = [TierLatency(name=name, latency_s={str(f): float(v) for f, v in enumerate(row) if f and math.isfinite(v)})
             for name, row in zip(names, matrix, strict=True)]
    return LatencyTable(gpus=matrix.shape[1] - 1, tiers=tiers)


def allocation_json(names: list[str], allocation: Allocation) -> dict[str, object]:
    """The `cascade optimize allocate --json` contract: status, latency_s, allocation."""
    if allocation.status != "optimal":
        return {"status": "infeasible", "latency_s": None, "allocation": {}}
    return {"status": "optimal", "latency_s": allocation.latency_s,
            "allocation": dict(zip(names, allocation.gpus, strict=True))}
