"""The continuous-batching simulator: exact step sums, queueing theory, overload, determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cascade.optimizer.cards import load_gpu, load_model
from cascade.optimizer.roofline import RooflineCost, Shape
from cascade.optimizer.simulator import (
    _steps_until,
    decode_steps_time,
    poisson_arrivals,
    replica_percentile,
    saturation_rps,
    simulate,
)


class ConstantCost:
    """Fixed prefill and decode-step times: with batch size 1 the replica is an M/D/1 server."""

    def __init__(self, step_s: float, prefill_s: float) -> None:
        self.step_s, self.prefill_s = step_s, prefill_s

    def decode_coeffs(self, batch: int) -> tuple[float, float, float, float, float]:
        return 0.0, 0.0, self.step_s, 0.0, 0.0

    def prefill_time(self, tokens: int, tokens_sq: float, requests: int = 1) -> float:
        return self.prefill_s


def md1_sojourn_cdf(t: float, lam: float, d: float) -> float:
    """P(sojourn <= t) for M/D/1: waiting time W = sojourn - D has Erlang's closed form
    P(W <= w) = (1 - rho) sum_{k=0}^{floor(w/D)} (lam (k D - w))^k / k! exp(-lam (k D - w))."""
    w = t - d
    if w < 0:
        return 0.0
    rho = lam * d
    terms = [(lam * (k * d - w)) ** k / math.factorial(k) * math.exp(-lam * (k * d - w))
             for k in range(int(w // d) + 1)]
    return (1 - rho) * math.fsum(terms)


def md1_quantile(q: float, lam: float, d: float) -> float:
    # The alternating sum loses precision for large w/D; a p95 at rho <= 0.7 is below 20 D.
    lo, hi = d, 20 * d
    assert md1_sojourn_cdf(hi, lam, d) > q
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if md1_sojourn_cdf(mid, lam, d) < q else (lo, mid)
    return hi


def test_closed_form_step_sums_equal_step_by_step_sums() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        coeffs = tuple(float(x) for x in rng.uniform(0, 1e-3, 5))
        c0, dc, k = float(rng.uniform(0, 1e5)), int(rng.integers(1, 200)), int(rng.integers(1, 400))
        brute = sum(max(coeffs[0] + coeffs[1] * (c0 + j * dc), coeffs[2] + coeffs[3] * (c0 + j * dc)) + coeffs[4]
                    for j in range(k))
        assert decode_steps_time(coeffs, c0, dc, k) == pytest.approx(brute, rel=1e-9)
        budget = float(rng.uniform(0, brute))
        steps = _steps_until(coeffs, c0, dc, budget, k)
        assert decode_steps_time(coeffs, c0, dc, steps) >= budget
        assert steps == 1 or decode_steps_time(coeffs, c0, dc, steps - 1) < budget


@pytest.mark.parametrize("rho", [0.3, 0.5, 0.7])
def test_batch_size_one_matches_the_md1_closed_form_within_5_percent(rho: float) -> None:
    cost = ConstantCost(step_s=0.01, prefill_s=0.01)
    service = 0.01 + 9 * 0.01  # prefill yields token 1, nine decode steps yield tokens 2..10
    lam = rho / service
    n = 40_000
    rng = np.random.default_rng(1)
    result = simulate(cost, poisson_arrivals(lam, rng.exponential(1.0, n)), np.full(n, 16), np.full(n, 10),
                      kv_capacity_tokens=10**6, max_batch=1)
    mean = service + rho * service / (2 * (1 - rho))  # Pollaczek-Khinchine
    assert result.latency_s.mean() == pytest.approx(mean, rel=0.05)
    assert result.percentile(95) == pytest.approx(md1_quantile(0.95, lam, service), rel=0.05)


def test_an_overloaded_replica_reports_infinite_latency() -> None:
    cost = ConstantCost(step_s=0.01, prefill_s=0.0)
    n = 2000
    gaps = np.random.default_rng(2).exponential(1.0, n)
    result = simulate(cost, poisson_arrivals(1.3 / 0.1, gaps), np.full(n, 8), np.full(n, 11),
                      kv_capacity_tokens=10**6, max_batch=1)
    assert not result.stable and math.isinf(result.percentile(95))


def test_continuous_batching_serves_far_more_than_one_request_at_a_time() -> None:
    c = RooflineCost(load_model("deepseek-r1-distill-qwen-7b"), load_gpu("h100-sxm"), Shape(1))
    rng = np.random.default_rng(3)
    p, o = rng.integers(50, 200, 400), rng.integers(200, 1200, 400)
    limits = dict(kv_capacity_tokens=c.kv_capacity_tokens, max_prefill_tokens=16384)
    one = saturation_rps(c, p, o, max_batch=1, **limits)
    many = saturation_rps(c, p, o, max_batch=256, **limits)
    assert many > 20 * one


def test_latency_grows_with_load_and_runs_are_reproducible() -> None:
    c = RooflineCost(load_model("llama-3.1-8b"), load_gpu("a100-80g"), Shape(2))
    rng = np.random.default_rng(4)
    p, o, gaps = rng.integers(50, 300, 500), rng.integers(100, 900, 500), rng.exponential(1.0, 500)
    limits = dict(kv_capacity_tokens=c.kv_capacity_tokens, max_batch=256, max_prefill_tokens=16384)
    capacity = saturation_rps(c, p, o, **limits)
    low = replica_percentile(c, 0.2 * capacity, p, o, gaps, **limits)
    high = replica_percentile(c, 0.9 * capacity, p, o, gaps, **limits)
    assert low < high
    assert replica_percentile(c, 0.9 * capacity, p, o, gaps, **limits) == high


def test_a_request_larger_than_the_kv_cache_is_refused() -> None:
    with pytest.raises(ValueError, match="KV tokens"):
        simulate(ConstantCost(0.01, 0.0), np.zeros(1), np.array([100]), np.array([100]), kv_capacity_tokens=150)
