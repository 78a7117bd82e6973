"""End-to-end evaluation of a plan: a request-level simulation through the whole ladder.

The planner's L is the worst tier's p95 (Cascadia's objective). What a client sees in cascade mode
is the sum over the tiers it visits plus a judge call per hop. This simulates it: Poisson arrivals
of profiled prompts enter tier 0; each tier's replicas (per the deployment) run the simulator on
the requests dispatched to them (random, in proportion to replica capacity); an escalated request
enters the next tier when the previous one finished plus the judge latency. Tiers are simulated
in order, so the feed-forward network is exact given the dispatch.
"""

from __future__ import annotations

import numpy as np

from cascade.optimizer import routing
from cascade.optimizer.instance import Instance
from cascade.optimizer.parallelism import TierTable
from cascade.optimizer.roofline import Shape
from cascade.optimizer.search import Deployment
from cascade.optimizer.simulator import simulate_tier


def e2e_latencies(inst: Instance, tables: list[TierTable], deployment: Deployment, ks: tuple[int, ...],
                  rate_rps: float, n_requests: int = 1500, seed: int = 0) -> np.ndarray:
    """Per-request end-to-end latency (s) in arrival order; inf for requests that never finish."""
    return routed_latencies(inst, tables, deployment, routing.final_tier(inst.data, ks), rate_rps, n_requests,
                            seed)[1]


def routed_latencies(inst: Instance, tables: list[TierTable], deployment: Deployment, final_by_row: np.ndarray,
                     rate_rps: float, n_requests: int = 1500, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(the outcome row of each request, its end-to-end latency in s), in arrival order, each row answered by the
    tier `final_by_row` gives it (any routing, not only thresholds'); inf for a request that never finishes, or
    that reaches a tier without GPUs."""
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, inst.data.quality.shape[0], size=n_requests)
    arrivals = np.cumsum(rng.exponential(1.0 / rate_rps, size=n_requests))
    final = final_by_row[rows]
    judge = inst.problem.routing.judge_latency_s if inst.data.mode == "cascade" else 0.0
    last = len(inst.names) - 1
    entry = arrivals.copy()
    done = np.full(n_requests, np.inf)
    for i, table in enumerate(tables):
        here = np.flatnonzero(final >= i) if inst.data.mode == "cascade" else np.flatnonzero(final == i)
        if len(here) == 0:
            continue
        if deployment.gpus[i] == 0:  # nothing serves it: its requests never finish
            entry[here] = np.inf
            continue
        finish = _serve_tier(inst, i, table, deployment, here, rows, entry, rng)
        # A cascade tier's answer is judged before it is accepted or escalated (not the last tier's).
        ready = finish + (judge if (inst.data.mode == "cascade" and i < last) else 0.0)
        stops = final[here] == i
        done[here[stops]] = ready[stops]
        entry[here[~stops]] = ready[~stops]
    return rows, done - arrivals


def _serve_tier(inst: Instance, tier: int, table: TierTable, deployment: Deployment, here: np.ndarray,
                rows: np.ndarray, entry: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    replicas = [r for r in table.replicas(deployment.groups[tier], deployment.gpus[tier]) for _ in range(r.count)]
    capacity = {(c.tp, c.pp): c.capacity_rps for c in table.curves}
    weights = np.array([capacity[(r.tp, r.pp)] for r in replicas])
    choice = rng.choice(len(replicas), size=len(here), p=weights / weights.sum())
    finish = np.full(len(here), np.inf)
    settings = inst.settings[tier]
    for k, replica in enumerate(replicas):
        mine = np.flatnonzero(choice == k)
        if len(mine) == 0:
            continue
        order = mine[np.argsort(entry[here[mine]], kind="stable")]
        cost = inst.costs[tier][Shape(replica.tp, replica.pp)]
        lengths = inst.decode_lengths(tier, rows[here[order]])
        result = simulate_tier(cost, entry[here[order]], inst.input_tokens[rows[here[order]]], lengths,
                               kv_capacity_tokens=cost.kv_capacity_tokens, max_batch=settings.max_batch,
                               max_prefill_tokens=settings.max_prefill_tokens, first_wave=inst.first_wave(tier))
        finish[order] = entry[here[order]] + result.latency_s
    return finish


def percentile(latencies: np.ndarray, q: float, warmup: float = 0.1) -> float:
    """q-th percentile after dropping the first `warmup` share of arrivals (the system starts empty)."""
    kept = latencies[int(len(latencies) * warmup):]
    return float(np.percentile(kept, q))
