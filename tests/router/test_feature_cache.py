"""cascade/router/feature_cache.py: vectors computed once per prompt and read back, a rerun computes nothing, a
run stopped between batches resumes, and a namespace cannot leave the cache's folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.router.signal_features import branch_fail_rates
from cascade.router.feature_cache import MAX_BATCH, MAX_NAMESPACE_CHARS, FeatureCache


class Counting:
    def __init__(self, fail_after: int | None = None) -> None:
        self.seen: list[str] = []
        self.fail_after = fail_after

    def __call__(self, texts: list[str]) -> np.ndarray:
        if self.fail_after is not None and len(self.seen) >= self.fail_after:
            raise KeyboardInterrupt
        self.seen += texts
        return np.array([[len(t), t.count("a")] for t in texts], dtype=float)


def test_a_rerun_reads_every_vector_and_computes_none(tmp_path: Path) -> None:
    cache = FeatureCache("toy", tmp_path)
    texts = ["a", "bb", "a", "ccc"]
    first = Counting()
    vectors = cache.vectors(texts, first, batch=2)
    assert first.seen == ["a", "bb", "ccc"]  # a repeated prompt is computed once
    assert np.array_equal(vectors, [[1, 1], [2, 0], [1, 1], [3, 0]])
    again = Counting()
    assert np.array_equal(cache.vectors(texts, again), vectors) and again.seen == []


def test_a_run_stopped_between_batches_resumes_where_it_stopped(tmp_path: Path) -> None:
    cache = FeatureCache("toy", tmp_path)
    texts = [f"prompt {i}" for i in range(5)]
    with pytest.raises(KeyboardInterrupt):
        cache.vectors(texts, Counting(fail_after=2), batch=2)
    assert cache.missing(texts) == texts[2:]
    rest = Counting()
    cache.vectors(texts, rest, batch=2)
    assert rest.seen == texts[2:]


def test_a_compute_of_the_wrong_shape_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="shape"):
        FeatureCache("toy", tmp_path).vectors(["a", "b"], lambda texts: np.zeros((1, 2)))
    with pytest.raises(ValueError, match="batch"):
        FeatureCache("toy", tmp_path).vectors(["a"], Counting(), batch=MAX_BATCH + 1)


@settings(max_examples=60, deadline=None)
@given(name=st.one_of(st.text(min_size=0, max_size=MAX_NAMESPACE_CHARS + 20),
                      st.sampled_from(["..", ".", "../x", "a/b", "a\\b", "", "x" * (MAX_NAMESPACE_CHARS + 1)])))
def test_a_namespace_stays_one_folder_under_the_root(name: str) -> None:
    root = Path("/nonexistent-cache-root")
    try:
        cache = FeatureCache(name, root)
    except ValueError:
        return
    assert cache.folder.parent == root and cache.folder.name == name and name.strip(".")


def test_branch_fail_rates_read_each_rows_branches() -> None:
    lines = ['{"id": "q:1", "tiers": {"r": {"correct": true, "branches": [{"correct": true}, {"correct": false},'
             ' {"correct": false}, {"correct": false}]}}}', '{"id": "q:2", "tiers": {"r": {"correct": true}}}', "",
             '{"id": "q:3", "tiers": {"other": {"branches": [{"correct": true}]}}}']
    assert branch_fail_rates(lines, tier="r") == {"q:1": 0.75}
