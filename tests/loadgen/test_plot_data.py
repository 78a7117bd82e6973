"""What the loadgen report plots and prints: step CDFs, the SLO-scale axis, visible zero bars, TPOT "n/a"."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadgen.plot_data import (
    MIN_BAR_FRACTION,
    SLO_SCALE_AXIS_HEADROOM,
    SLO_SCALE_AXIS_MAX,
    ecdf_steps,
    latency_cell,
    slo_scale_axis,
    visible_bars,
)

# Hostile numbers: zeros, huge and tiny magnitudes, infinities (failed requests need an infinite scale), repeats.
latencies = st.lists(st.one_of(st.floats(0, 1e300), st.just(0.0), st.just(math.inf), st.sampled_from([1.0, 2.0])),
                     max_size=300)
scales = st.one_of(st.just(0.0), st.floats(1e-300, 1e11), st.floats(1e11, 1e300))


def test_an_ecdf_is_a_staircase_from_zero_rising_one_step_per_sample() -> None:
    xs, ys = ecdf_steps([30.0, 10.0, 20.0])
    assert xs.tolist() == [10.0, 10.0, 20.0, 30.0]
    assert ys.tolist() == pytest.approx([0, 1 / 3, 2 / 3, 1])


def test_an_ecdf_over_all_requests_tops_out_at_the_finished_fraction_and_extends_to_the_edge() -> None:
    xs, ys = ecdf_steps([1.0, math.inf, 2.0], total=4, right=5.0)
    assert xs.tolist() == [1.0, 1.0, 2.0, 5.0] and ys.tolist() == [0, 0.25, 0.5, 0.5]


def test_an_ecdf_of_nothing_draws_nothing() -> None:
    xs, ys = ecdf_steps([math.inf])
    assert xs.size == ys.size == 0


@given(latencies, st.integers(0, 400))
def test_an_ecdf_never_falls_and_never_passes_one(values: list[float], extra: int) -> None:
    finite = [v for v in values if math.isfinite(v)]
    xs, ys = ecdf_steps(values, total=len(finite) + extra)
    assert xs.size == ys.size == (len(finite) + 1 if finite else 0)
    if finite:
        assert ys[0] == 0 and np.all(np.diff(xs) >= 0) and np.all(np.diff(ys) > 0) and ys[-1] <= 1.0
        assert ys[-1] == pytest.approx(len(finite) / (len(finite) + extra))


def test_the_scale_axis_covers_a_reported_scale_beyond_the_old_fixed_range_with_room() -> None:
    lo, hi = slo_scale_axis(7.3, [0.5, 7.3, math.inf])
    assert lo < 0 and hi == pytest.approx(7.3 * SLO_SCALE_AXIS_HEADROOM)


def test_the_scale_axis_always_shows_the_slo_as_given() -> None:
    lo, hi = slo_scale_axis(0.2, [0.1, 0.2])
    assert lo < 0.2 < 1.0 < hi


def test_the_scale_axis_without_a_reported_scale_covers_every_finite_need() -> None:
    assert slo_scale_axis(None, [0.5, 3.0, math.inf])[1] > 3.0
    assert slo_scale_axis(None, [math.inf]) == slo_scale_axis(1.0, [])


@given(scales, latencies)
def test_the_reported_scale_lies_strictly_inside_the_axis_with_margin(reported: float, needed: list[float]) -> None:
    lo, hi = slo_scale_axis(reported, needed)
    assert math.isfinite(lo) and math.isfinite(hi) and hi <= SLO_SCALE_AXIS_MAX
    if reported * SLO_SCALE_AXIS_HEADROOM <= SLO_SCALE_AXIS_MAX:  # the limit: past it the axis stops
        margin = 0.02 * (hi - lo)
        assert lo + margin <= reported <= hi - margin


def test_a_zero_bar_is_lifted_to_a_visible_height_and_labelled_zero() -> None:
    heights, labels = visible_bars([0.0, 0.5, 1.0], span=1.0, digits=2)
    assert heights == [MIN_BAR_FRACTION, 0.5, 1.0] and labels == ["0.00", "0.50", "1.00"]


def test_an_undefined_bar_is_labelled_n_a_not_zero() -> None:
    heights, labels = visible_bars([None, float("nan"), 3.0])
    assert heights[:2] == [0.0, 0.0] and labels == ["n/a", "n/a", "3.0"]


def test_bars_with_no_defined_value_still_have_an_axis_to_be_seen_on() -> None:
    assert visible_bars([0.0, None])[0] == [MIN_BAR_FRACTION, 0.0]


@given(st.lists(st.one_of(st.none(), st.floats(0, 1e300), st.just(0.0)), max_size=200))
def test_every_defined_bar_is_at_least_the_visible_floor_and_keeps_its_true_label(values: list[float | None]) -> None:
    heights, labels = visible_bars(values, digits=0)
    top = max((v for v in values if v is not None), default=0.0) or 1.0
    for v, h, label in zip(values, heights, labels, strict=True):
        if v is None:
            assert h == 0.0 and label == "n/a"
        else:
            assert h >= MIN_BAR_FRACTION * top and h >= v and label == f"{v:.0f}"


def test_an_undefined_latency_reads_n_a_and_a_measured_zero_reads_zero() -> None:
    assert latency_cell(None) == "n/a" and latency_cell(0.0) == "0.0" and latency_cell(12.345) == "12.3"
