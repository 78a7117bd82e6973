"""Per-tier latency tables l(f) built from replica curves."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from cascade.optimizer.cards import load_gpu, load_model
from cascade.optimizer.parallelism import U_GRID, ReplicaCurve, SimSettings, TierTable, candidate_shapes, replica_curve
from cascade.optimizer.roofline import RooflineCost, Shape


def curve(tp: int, capacity: float, base: float, pp: int = 1) -> ReplicaCurve:
    return ReplicaCurve(tp=tp, pp=pp, capacity_rps=capacity,
                        latency_s=[base * (1 + 2 * u) for u in U_GRID[:-1]] + [None])


def test_latency_falls_as_gpus_are_added_and_is_infinite_below_one_replica() -> None:
    table = TierTable([curve(2, 10.0, 5.0), curve(4, 15.0, 3.0)], total_gpus=16)
    lat, _ = table.latency(12.0)
    assert math.isinf(lat[1]) and math.isinf(lat[2])  # one TP2 replica cannot keep up with 12 req/s
    assert all(b <= a for a, b in itertools.pairwise(lat))


def test_at_grid_points_the_table_returns_the_curve() -> None:
    table = TierTable([curve(1, 10.0, 2.0)], total_gpus=4)
    lat, _ = table.latency(0.6 * 10.0 * 2)  # two replicas at u = 0.6
    assert lat[2] == pytest.approx(2.0 * (1 + 2 * 0.6))


def test_leftover_gpus_are_filled_with_a_second_shape() -> None:
    table = TierTable([curve(4, 20.0, 3.0), curve(2, 8.0, 4.0)], total_gpus=6)
    lat, groups = table.latency(22.0)
    replicas = table.replicas(int(groups[6]), 6)
    assert {(r.tp, r.count) for r in replicas} == {(4, 1), (2, 1)}
    assert math.isfinite(lat[6]) and math.isinf(lat[4])


def test_no_traffic_costs_no_latency_but_the_model_must_still_fit() -> None:
    table = TierTable([curve(4, 20.0, 3.0)], total_gpus=8)
    lat, _ = table.latency(0.0)
    assert math.isinf(lat[3]) and lat[4] == 0.0


def test_pipeline_inside_a_node_is_pruned_in_favour_of_tensor_parallelism() -> None:
    model, gpu = load_model("deepseek-r1-distill-qwen-7b"), load_gpu("h100-sxm")
    costs = {s: RooflineCost(model, gpu, s) for s in (Shape(1), Shape(2), Shape(1, 2), Shape(4), Shape(2, 2))}
    kept = candidate_shapes(costs, 100.0, 800.0, SimSettings())
    assert Shape(1, 2) not in kept and Shape(2, 2) not in kept and Shape(4) in kept


def test_replica_curves_are_monotone_in_load() -> None:
    cost = RooflineCost(load_model("llama-3.1-8b"), load_gpu("h100-sxm"), Shape(1))
    rng = np.random.default_rng(0)
    c = replica_curve(cost, rng.integers(50, 200, 300), rng.integers(100, 800, 300), SimSettings(requests=300))
    finite = [v for v in c.latency_s if v is not None]
    assert finite == sorted(finite) and len(finite) >= 3 and c.capacity_rps > 0
