"""The request-level evaluation (cascade/optimizer/evaluate.py) with any routing: a row assignment given directly is
the thresholds' own when they give the same one, and a tier without GPUs never answers."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cascade.optimizer import evaluate, routing
from cascade.optimizer.instance import load_instance
from cascade.optimizer.problem import load_problem
from cascade.optimizer.search import Deployment


def test_routed_latencies_are_the_thresholds_own_for_the_same_routing_and_inf_without_gpus(small_problem: Path
                                                                                          ) -> None:
    problem, base = load_problem(small_problem)
    inst = load_instance(problem, base)
    ks = (50,)  # route scores above 0.5 to the large tier
    final = routing.final_tier(inst.data, ks)
    assert 0 < final.mean() < 1
    deployment = Deployment(gpus=[4, 4], groups=[0, 0])
    by_ks = evaluate.e2e_latencies(inst, inst.tables(ks), deployment, ks, 2.0, n_requests=300, seed=1)
    rows, by_rows = evaluate.routed_latencies(inst, inst.routed_tables(final), deployment, final, 2.0, 300, seed=1)
    assert np.array_equal(by_ks, by_rows) and np.isfinite(by_rows).all()
    # Nothing on the large tier: its requests never finish, the small tier's still do.
    rows, starved = evaluate.routed_latencies(inst, inst.routed_tables(final), Deployment([8, 0], [0, 0]), final,
                                              2.0, 300, seed=1)
    on_large = final[rows] == 1
    assert np.isinf(starved[on_large]).all() and np.isfinite(starved[~on_large]).all()
