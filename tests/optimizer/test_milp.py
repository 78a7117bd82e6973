"""The allocation MILP: HiGHS and the dynamic program both equal brute-force enumeration."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from cascade.errors import ConfigError
from cascade.optimizer.milp import (
    INFEASIBLE,
    Allocation,
    LatencyTable,
    TierLatency,
    load_table,
    solve_dp,
    solve_highs,
    table_from_matrix,
)


def random_table(rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """Small instances: 1-4 tiers, 1-9 GPUs, holes (does not fit), ties, non-monotone rows."""
    tiers, gpus = int(rng.integers(1, 5)), int(rng.integers(1, 10))
    table = rng.uniform(0.1, 10.0, size=(tiers, gpus + 1))
    table[rng.uniform(size=table.shape) < 0.3] = np.inf
    if rng.uniform() < 0.3:
        table = np.round(table)
    return table, gpus


def brute_force(table: np.ndarray, total_gpus: int, exact: bool = True) -> Allocation:
    """Every allocation: the truth the solvers are checked against on small instances."""
    best: Allocation = INFEASIBLE
    for gpus in itertools.product(range(1, total_gpus + 1), repeat=table.shape[0]):
        used = sum(gpus)
        if used > total_gpus or (exact and used != total_gpus):
            continue
        worst = float(max(table[i, f] for i, f in enumerate(gpus)))
        if math.isfinite(worst) and worst < best.latency_s:
            best = Allocation(status="optimal", latency_s=worst, gpus=list(gpus))
    return best


def same(a: float, b: float) -> bool:
    return (math.isinf(a) and math.isinf(b)) or math.isclose(a, b, rel_tol=1e-9)


@pytest.mark.parametrize("exact", [True, False], ids=["sum=N", "sum<=N"])
def test_highs_and_dynamic_program_equal_brute_force_on_random_instances(exact: bool) -> None:
    rng = np.random.default_rng(20261122)
    for _ in range(120):
        table, gpus = random_table(rng)
        truth = brute_force(table, gpus, exact)
        for solver in (solve_highs, solve_dp):
            found = solver(table, gpus, exact)
            assert found.status == truth.status and same(found.latency_s, truth.latency_s), (solver, table, gpus)
            if found.status == "optimal":
                used = sum(found.gpus)
                assert used == gpus if exact else used <= gpus
                assert max(table[i, f] for i, f in enumerate(found.gpus)) == found.latency_s


def test_an_upper_bound_from_a_feasible_allocation_keeps_highs_exact() -> None:
    rng = np.random.default_rng(7)
    for _ in range(40):
        table, gpus = random_table(rng)
        truth = brute_force(table, gpus)
        if truth.status == "optimal":
            loose = truth.latency_s * float(rng.uniform(1.0, 2.0))
            assert same(solve_highs(table, gpus, upper_bound=loose).latency_s, truth.latency_s)


def test_ties_on_the_bottleneck_go_to_the_lowest_weighted_latency() -> None:
    # Tier 1 is the bottleneck at 10 s on any count; tier 0 should get the spare GPUs.
    table = np.array([[np.inf, 8.0, 6.0, 4.0, 2.0], [np.inf, 10.0, 10.0, 10.0, 10.0]])
    for solver in (solve_highs, solve_dp):
        assert solver(table, 4, True, weights=np.array([1.0, 0.1])).gpus == [3, 1]


def test_no_allocation_is_infeasible_not_an_error() -> None:
    table = np.array([[np.inf, np.inf, 1.0], [np.inf, np.inf, 1.0]])  # both need 2 GPUs, 3 exist
    for solver in (solve_highs, solve_dp, brute_force):
        result = solver(table, 2, True)
        assert result.status == "infeasible" and math.isinf(result.latency_s)


def test_solving_32_gpus_and_3_tiers_takes_well_under_a_second() -> None:
    rng = np.random.default_rng(1)
    table = np.minimum.accumulate(rng.uniform(1, 10, size=(3, 33)), axis=1)
    table[:, :3] = np.inf
    dp = solve_dp(table, 32)
    assert solve_highs(table, 32).latency_s == pytest.approx(dp.latency_s)


def test_latency_json_round_trips_and_missing_counts_mean_does_not_fit() -> None:
    matrix = np.array([[np.inf, 3.0, 2.0], [np.inf, np.inf, 5.0]])
    table = table_from_matrix(["a", "b"], matrix)
    assert table.tiers[1].latency_s == {"2": 5.0}
    np.testing.assert_array_equal(table.matrix(), matrix)


def test_bad_gpu_counts_in_latency_json_name_the_tier(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"tier `a`.*outside 1\.\.2"):
        LatencyTable(gpus=2, tiers=[TierLatency(name="a", latency_s={"3": 1.0})]).matrix()
    bad = tmp_path / "t.json"
    bad.write_text('{"gpus": 2, "tiers": [{"name": "a", "latency_s": {"x": 1}}]}')
    with pytest.raises(ConfigError, match="GPU count"):
        load_table(bad).matrix()


def test_allocate_command_prints_the_json_contract(tmp_path) -> None:
    spec = {"gpus": 8, "tiers": [{"name": "small", "latency_s": {str(f): 10.0 / f for f in range(1, 9)}},
                                 {"name": "large", "latency_s": {str(f): 40.0 / f for f in range(2, 9)}}]}
    path = tmp_path / "latency.json"
    path.write_text(json.dumps(spec))
    result = subprocess.run([sys.executable, "-m", "cascade.cli", "optimize", "allocate", "--table", str(path),
                             "--json"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert set(out) == {"status", "latency_s", "allocation"}
    assert out["status"] == "optimal" and out["allocation"] == {"small": 2, "large": 6}
    assert out["latency_s"] == pytest.approx(40.0 / 6)
