"""Arrival schedules: seeded, right mean rate, right burstiness, bounded, and trace replay."""

from __future__ import annotations

import numpy as np
import pytest

from cascade.data import arrivals


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_poisson_schedule_has_the_target_mean_rate() -> None:
    offsets = arrivals.schedule("poisson", 50.0, _rng(), n=20_000, normalize=False)
    assert offsets[0] == 0.0
    rate = (len(offsets) - 1) / offsets[-1]
    assert rate == pytest.approx(50.0, rel=0.03)
    gaps = np.diff(offsets)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)  # exponential: CV 1


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_gaps_have_cv_one_over_sqrt_burstiness(burstiness: float) -> None:
    offsets = arrivals.schedule("gamma", 20.0, _rng(1), n=40_000, burstiness=burstiness, normalize=False)
    gaps = np.diff(offsets)
    assert gaps.mean() == pytest.approx(1 / 20.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(burstiness), rel=0.06)


def test_same_seed_gives_the_same_schedule_and_another_seed_does_not() -> None:
    a = arrivals.schedule("poisson", 10.0, _rng(7), n=100)
    b = arrivals.schedule("poisson", 10.0, _rng(7), n=100)
    c = arrivals.schedule("poisson", 10.0, _rng(8), n=100)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_normalized_schedule_puts_the_last_request_at_n_minus_one_over_rate() -> None:
    offsets = arrivals.schedule("gamma", 40.0, _rng(), n=500, burstiness=0.5)
    assert offsets[-1] == pytest.approx(499 / 40.0)
    assert np.all(np.diff(offsets) >= 0)


def test_constant_schedule_is_evenly_spaced() -> None:
    offsets = arrivals.schedule("constant", 4.0, _rng(), n=5)
    assert offsets.tolist() == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])


def test_duration_bound_keeps_only_sends_inside_the_window() -> None:
    offsets = arrivals.schedule("poisson", 100.0, _rng(), duration_s=3.0)
    assert offsets.max() < 3.0
    assert len(offsets) == pytest.approx(300, rel=0.2)
    both = arrivals.schedule("constant", 10.0, _rng(), n=1000, duration_s=1.0)
    assert len(both) == 10


def test_bad_rate_or_process_is_refused() -> None:
    with pytest.raises(ValueError, match="rate must be a positive"):
        arrivals.schedule("poisson", 0.0, _rng(), n=3)
    with pytest.raises(ValueError, match="unknown arrival process"):
        arrivals.schedule("zipf", 1.0, _rng(), n=3)


BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
7,GPT-4,417,30,447,Conversation log
105,ChatGPT,1000,200,1200,API log
"""


def test_trace_replay_reads_burstgpt_rows_in_time_order(tmp_path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(BURSTGPT)
    trace = arrivals.load_trace(path)
    assert trace.times_s == [0.0, 2.0, 40.0, 100.0]
    assert trace.request_tokens == [472, 417, 1087, 1000]
    assert trace.response_tokens == [18, 30, 0, 200]
    assert arrivals.trace_schedule(trace).tolist() == [0.0, 2.0, 40.0, 100.0]
    # rescaled to a mean rate of 3 rps: 3 gaps in 1 s
    assert arrivals.trace_schedule(trace, rate=3.0).tolist() == pytest.approx([0.0, 0.02, 0.4, 1.0])
    assert arrivals.trace_schedule(trace, n=2).tolist() == [0.0, 2.0]


def test_trace_without_the_needed_columns_is_refused(tmp_path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("time,tokens\n1,2\n")
    with pytest.raises(ValueError, match="lacks column"):
        arrivals.load_trace(path)
