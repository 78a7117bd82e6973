"""Token confidence (DeepConf-style) from an engine's logprob entries: the statistics, the online window."""

from __future__ import annotations

import math

import msgspec
import pytest

from cascade.branches.confidence import GroupWindow, confidence_of, token_logprobs


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
