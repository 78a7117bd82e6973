"""Token confidence (DeepConf-style) from an engine's logprob entries: the statistics, the online window."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cascade.branches.confidence import (
    GroupWindow,
    TraceConfidence,
    confidence_of,
    quantile,
    token_certainties,
    token_logprobs,
)
from cascade.branches.sart import Finished, vote


def entries(*values: object) -> list[msgspec.Raw]:
    return [msgspec.Raw(msgspec.json.encode({"token": "t", "logprob": v, "bytes": [116], "top_logprobs": []}))
            for v in values]


def test_the_statistics_are_geometric_mean_probabilities() -> None:
    # Four sure tokens, then two unsure ones: the lowest group (size 2) is the unsure stretch.
    logprobs = [0.0, 0.0, 0.0, 0.0, math.log(0.25), math.log(0.25)]
    c = confidence_of(logprobs, group=2)
    assert c is not None and c.tokens == 6 and c.group == 2
    assert c.mean == pytest.approx(0.25 ** (2 / 6))
    assert c.lowest_group == pytest.approx(0.25)
    assert c.tail == pytest.approx(0.25)
    assert c.read("mean") == c.mean


def test_lowest_group_catches_a_dip_that_the_mean_hides() -> None:
    logprobs = [-0.01] * 200 + [-2.0] * 8 + [-0.01] * 200
    c = confidence_of(logprobs, group=8)
    assert c is not None
    assert c.mean > 0.9 and c.lowest_group == pytest.approx(math.exp(-2.0)) and c.tail > 0.98


def test_an_answer_shorter_than_a_group_is_its_own_group_and_no_logprobs_is_none() -> None:
    c = confidence_of([math.log(0.5)], group=32)
    assert c is not None and c.lowest_group == pytest.approx(0.5) == c.tail == c.mean
    assert confidence_of([], group=32) is None
    with pytest.raises(ValueError, match="group"):
        confidence_of([-0.1], group=0)


def test_entries_are_read_leniently_and_floored() -> None:
    raw = [*entries(-0.5, None, -1e9), msgspec.Raw(b'"not an entry"'), msgspec.Raw(b'{"token": "x"}')]
    assert token_logprobs(raw) == [-0.5, -100.0]  # null and missing logprobs skipped; -1e9 floored


def test_the_group_window_slides() -> None:
    window = GroupWindow(3)
    for value in (-1.0, -1.0, -1.0):
        window.push(value)
    assert window.full and window.mean == pytest.approx(-1.0)
    window.push(0.0)
    window.push(0.0)
    assert window.mean == pytest.approx(-1 / 3) and window.confidence == pytest.approx(math.exp(-1 / 3))


def top_entries(*tops: list[object]) -> list[msgspec.Raw]:
    return [msgspec.Raw(msgspec.json.encode({"token": "t", "logprob": top[0] if top else None,
                                             "top_logprobs": [{"token": "t", "logprob": v} for v in top]}))
            for top in tops]


def test_deepconf_token_confidence_is_the_negative_mean_of_the_top_k_logprobs() -> None:
    sure = [math.log(0.97), math.log(0.01), math.log(0.01), math.log(0.01)]
    unsure = [math.log(0.4), math.log(0.3), math.log(0.2), math.log(0.1)]
    got = token_certainties(top_entries(sure, unsure))
    assert got.top_k and got.values == pytest.approx([-sum(sure) / 4, -sum(unsure) / 4])
    assert got.values[0] > got.values[1]  # a peaked distribution is the surer token
    one = token_certainties(top_entries([-0.5], []))  # one candidate or none: the sampled token's own logprob
    assert not one.top_k and one.values == [-0.5]


def test_the_trace_confidence_is_its_weakest_group_and_a_vote_weight_is_positive() -> None:
    trace = TraceConfidence(2)
    assert trace.lowest_group is None and trace.current is None and trace.weight is None
    trace.push(-0.1)
    assert trace.current is None and trace.lowest_group == pytest.approx(-0.1)  # shorter than a group
    for value in (-0.1, -2.0, -2.0, -0.1):
        trace.push(value)
    assert trace.lowest_group == pytest.approx(-2.0) and trace.current == pytest.approx(-1.05)
    assert trace.weight == pytest.approx(math.exp(-2.0))  # sampled logprobs: exp of the mean
    deep = TraceConfidence(2)
    deep.extend(token_certainties(top_entries([-0.1, -5.0], [-0.1, -5.0])))
    assert deep.top_k and deep.weight == pytest.approx(2.55)


def test_quantile_interpolates_like_numpy() -> None:
    assert quantile([3.0, 1.0, 2.0, 4.0], 0.1) == pytest.approx(1.3)
    assert quantile([5.0], 0.9) == 5.0 and quantile([1.0, 2.0], 0.0) == 1.0 and quantile([1.0, 2.0], 1.0) == 2.0
    with pytest.raises(ValueError):
        quantile([], 0.5)


def finished(branch: int, answer: str, confidence: float | None) -> Finished:
    return Finished(branch, f"So the answer is {answer}.", None, 10, True, confidence)


def test_the_filtered_vote_keeps_the_most_confident_share_and_those_without_a_confidence() -> None:
    voters = [finished(0, "1", 0.2), finished(1, "1", 0.3), finished(2, "2", 0.9), finished(3, "1", None)]
    assert vote(voters).answer == "1"
    assert vote(voters, keep=0.34).votes == {"1": 2, "2": 1}  # 2 of the 3 rated (0.9 and 0.3), and the unrated
    assert vote(voters[:3], keep=0.33).votes == {"2": 1} and vote(voters[:3], keep=0.33).answer == "2"
    assert vote(voters, by_confidence=True).answer == "2"  # 0.9 + nothing vs 0.2 + 0.3 + 0.2 (the floor)
    assert vote(voters[:2], keep=0.01).votes == {"1": 1}  # at least one votes


@given(st.lists(st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**30, 10**30),
                          st.text(max_size=5), st.lists(st.floats(), max_size=3)), max_size=200),
       st.integers(0, 30))
def test_hostile_logprob_entries_give_finite_certainties_or_none(values: list[object], k: int) -> None:
    raws = [msgspec.Raw(msgspec.json.encode({"token": "t", "logprob": v if not isinstance(v, list) else None,
                                             "top_logprobs": [{"logprob": x} for x in (v if isinstance(v, list)
                                                                                       else [v] * k)]}))
            for v in values]
    got = token_certainties(raws)
    assert len(got.values) <= len(values) and all(math.isfinite(x) for x in got.values)
    assert all(-100.0 <= x <= 100.0 for x in got.values)
