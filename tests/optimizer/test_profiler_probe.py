"""The live profiler's timing pieces, without a server (cascade/profiler/probe.py)."""

from __future__ import annotations

import pytest

from cascade.profiler.probe import Prompts, Settings, Stream


def test_gaps_are_per_token_when_a_chunk_carries_several_tokens() -> None:
    stream = Stream(sent=0.0, chunks=[1.0, 1.2, 1.4], completion_tokens=6)  # 2 tokens a chunk
    assert stream.ttft_s == 1.0
    assert stream.gaps() == pytest.approx([0.1, 0.1])


def test_gaps_keep_only_pairs_inside_the_window() -> None:
    stream = Stream(sent=0.0, chunks=[1.0, 1.1, 1.3, 1.6])
    assert stream.gaps(start=1.1, end=1.6) == pytest.approx([0.2, 0.3])
    assert stream.gaps(start=1.05, end=1.5) == pytest.approx([0.2])


@pytest.mark.parametrize(("max_batch", "batches"), [(1, [1]), (8, [1, 2, 4, 8]), (6, [1, 2, 4, 6])])
def test_the_decode_sweep_doubles_and_ends_at_max_batch(max_batch: int, batches: list[int]) -> None:
    assert Settings(url="http://x", max_batch=max_batch).batches() == batches


def test_prompts_are_seeded_and_start_differently() -> None:
    first, again = Prompts(seed=3), Prompts(seed=3)
    a, b = first(64), first(64)
    assert a == again(64)
    assert a != b
    assert len(a.split()) == 64
