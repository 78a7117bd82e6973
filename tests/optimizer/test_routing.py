"""Thresholds to loads and quality: Cascadia's cumulative cascade and the gateway's direct routing."""

from __future__ import annotations

import numpy as np
import pytest

from cascade.optimizer import routing
from cascade.router.policy import tier_for


def cascade_data() -> routing.RoutingData:
    # Four prompts, three tiers; judge scores per tier.
    score = np.array([[0.9, 0.9, 0.9], [0.5, 0.8, 0.9], [0.2, 0.3, 0.95], [0.1, 0.95, 0.4]])
    return routing.RoutingData(mode="cascade", signal=score, quality=score)


def test_escalated_requests_load_every_tier_they_pass() -> None:
    data = cascade_data()
    final = routing.final_tier(data, (70, 70))  # accept at score >= 0.7
    assert final.tolist() == [0, 1, 2, 1]
    assert routing.reach(data, final).mean(axis=0).tolist() == [1.0, 0.75, 0.25]
    assert routing.quality(data, final) == pytest.approx((0.9 + 0.8 + 0.95 + 0.95) / 4)


def test_threshold_zero_accepts_everything_and_never_escalates_nothing() -> None:
    data = cascade_data()
    assert routing.final_tier(data, (0, 0)).tolist() == [0, 0, 0, 0]
    assert routing.final_tier(data, (routing.NEVER, routing.NEVER)).tolist() == [2, 2, 2, 2]
    z1, z2 = routing.quality_bounds(data)
    assert (z1, z2) == (pytest.approx(0.7875), pytest.approx(0.425))


def test_route_mode_sends_each_request_where_the_gateway_would() -> None:
    difficulty = np.random.default_rng(0).uniform(size=500)
    data = routing.RoutingData(mode="route", signal=difficulty, quality=np.zeros((500, 3)))
    ks = (62, 31)  # unsorted on purpose: route thresholds are used ascending
    final = routing.final_tier(data, ks)
    thresholds = routing.thresholds("route", ks)
    assert thresholds == [0.31, 0.62]
    assert final.tolist() == [tier_for(float(d), thresholds) for d in difficulty]
    assert routing.reach(data, final).sum(axis=1).tolist() == [1] * 500


def test_proportional_start_gives_tier_i_one_over_i_of_the_requests() -> None:
    score = np.random.default_rng(1).uniform(size=(3000, 3))
    data = routing.RoutingData(mode="cascade", signal=score, quality=score)
    shares = routing.reach(data, routing.final_tier(data, routing.proportional_start(data))).mean(axis=0)
    assert shares == pytest.approx([1.0, 1 / 2, 1 / 3], abs=0.02)


def test_outcomes_written_by_cascade_label_are_read(tmp_path) -> None:
    from cascade.optimizer.outcomes import load_outcomes

    path = tmp_path / "outcomes.jsonl"
    path.write_text(
        '{"id": "gsm8k-train:1", "dataset": "gsm8k-train", "prompt": "What is 2+2? Think.", "tiers": {'
        '"a": {"correct": false, "answer": "5", "output_tokens": 40, "latency_s": 1.2, "finish_reason": "stop"},'
        '"b": {"correct": true, "answer": "4", "output_tokens": 90, "latency_s": 2.5, "finish_reason": "stop"}}}\n')
    outcomes = load_outcomes(path, ["a", "b"])
    assert outcomes.correct.tolist() == [[0.0, 1.0]]
    assert outcomes.output_tokens.tolist() == [[40.0, 90.0]]
    assert outcomes.input_tokens.tolist() == [4.0]  # ~4 characters per token when only the prompt is known
