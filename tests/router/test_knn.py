"""cascade/router/knn.py and train/knn.py: kNN p_fail over embeddings -- neighbours found in blocks are the brute-force ones, a
prompt among failing neighbours gets a high p_fail, k and m come from the training rows' CV, probabilities stay
inside [P_MIN, 1 - P_MIN] whatever the embeddings, and each limit is refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from cascade.router.knn import BLOCK_ROWS, MAX_K, P_MIN, knn_p_fail, neighbours, unit_rows
from cascade.router.train.knn import KnnFailure


def clusters(n: int = 200, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two clusters of embeddings: the weak tier fails in the second and answers in the first; the strong tier
    answers nearly everywhere."""
    rng = np.random.default_rng(seed)
    side = rng.random(n) < 0.5
    centres = np.where(side[:, None], np.eye(8)[1], np.eye(8)[0])
    E = centres + 0.3 * rng.standard_normal((n, 8))
    failed = np.c_[side ^ (rng.random(n) < 0.1), rng.random(n) < 0.05]
    return E, failed.astype(float)


def test_blockwise_neighbours_are_the_brute_force_ones() -> None:
    rng = np.random.default_rng(1)
    queries, reference = unit_rows(rng.standard_normal((BLOCK_ROWS + 37, 6))), unit_rows(rng.standard_normal((50, 6)))
    sims, index = neighbours(queries, reference, 7)
    brute = np.argsort(-(queries @ reference.T), axis=1, kind="stable")[:, :7]
    assert np.array_equal(index, brute)
    assert np.allclose(sims, np.take_along_axis(queries @ reference.T, brute, axis=1))
    assert np.all(np.diff(sims, axis=1) <= 1e-12)


def test_a_prompt_among_failing_neighbours_gets_a_high_p_fail() -> None:
    E, failed = clusters()
    model = KnnFailure().fit(E[:150], failed[:150])
    p = model.predict_p_fail(E[150:])
    side = E[150:, 1] > E[150:, 0]
    assert p[side, 0].mean() > 0.7 > 0.3 > p[~side, 0].mean()
    assert set(model.k_) <= set(model.ks) and set(model.m_) <= set(model.smoothing)


def test_smoothing_pulls_toward_the_prior_and_soft_labels_are_averaged() -> None:
    sims = np.array([[0.9, 0.8]])
    labels = np.array([[1.0, 0.5]])
    unsmoothed = knn_p_fail(sims, labels, prior=0.0, k=2, m=0.0)[0]
    assert 0.75 < unsmoothed < 1.0  # the nearer, fully failing neighbour weighs more
    assert knn_p_fail(sims, labels, prior=0.0, k=2, m=2.0)[0] == pytest.approx(unsmoothed / 2)


def test_the_choice_of_k_sees_only_the_rows_fitted_on() -> None:
    E, failed = clusters()
    a = KnnFailure(random_state=3).fit(E[:120], failed[:120])
    b = KnnFailure(random_state=3).fit(E[:120], failed[:120])
    assert np.array_equal(a.k_, b.k_) and np.array_equal(a.predict_p_fail(E[120:]), b.predict_p_fail(E[120:]))


hostile = st.one_of(st.floats(-1e300, 1e300), st.just(0.0), st.floats(-1e-300, 1e-300))


@settings(max_examples=40, deadline=None)
@given(E=arrays(float, (24, 3), elements=hostile), queries=arrays(float, (5, 3), elements=hostile),
       failed=arrays(float, (24, 2), elements=st.sampled_from([0.0, 0.25, 1.0])))
def test_probabilities_stay_in_bounds_for_hostile_embeddings(E: np.ndarray, queries: np.ndarray,
                                                             failed: np.ndarray) -> None:
    with np.errstate(over="ignore", invalid="ignore"):  # 1e300 squared: norms overflow to inf, rows become 0
        p = KnnFailure(ks=(1, 5, 40)).fit(E, failed).predict_p_fail(queries)
    assert p.shape == (5, 2) and np.all((p >= P_MIN) & (p <= 1 - P_MIN))


@pytest.mark.parametrize("kwargs", [{"ks": ()}, {"ks": (0,)}, {"ks": (MAX_K + 1,)}, {"smoothing": (-1.0,)},
                                    {"cv": 1}])
def test_bad_settings_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        KnnFailure(**kwargs)


def test_labels_outside_zero_one_and_too_few_rows_are_refused() -> None:
    E, failed = clusters(40)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        KnnFailure().fit(E, failed * 2)
    with pytest.raises(ValueError, match="at least 10 rows"):
        KnnFailure().fit(E[:9], failed[:9])


def _topic_outcomes(path, n: int = 40, seed: int = 0) -> None:
    """A CSV of outcomes where the weak tier fails arithmetic word problems and answers questions about animals."""
    rng = np.random.default_rng(seed)
    animals = ["cat", "dog", "horse", "owl", "whale", "fox", "bee", "crow"]
    rows = ["prompt,weak,strong"]
    for i in range(n):
        a, b = (int(v) for v in rng.integers(2, 99, size=2))
        rows.append(f"Sam buys {a} apples for {b} dollars each. How much does he pay?,false,true")
        rows.append(f"What does a {animals[i % len(animals)]} eat in winter? Question {i}.,true,true")
    path.write_text("\n".join(rows) + "\n")


def test_the_knn_estimator_trains_saves_and_serves_from_embeddings_alone(tmp_path, capsys) -> None:
    """`cascade router train --features minilm --estimator knn` (real MiniLM embeddings): the saved router loads
    through the skops allowlist and routes an unseen word problem as its neighbours failed."""
    from cascade.cli import main
    from cascade.router.artifact import load_router

    _topic_outcomes(tmp_path / "outcomes.csv")
    code = main(["router", "train", "--outcomes", str(tmp_path / "outcomes.csv"), "--tiers", "weak,strong",
                 "--out", str(tmp_path / "router"), "--features", "minilm", "--estimator", "knn", "--cv-folds", "3",
                 "--null-draws", "0"])
    assert code == 0
    assert "APGR" in capsys.readouterr().out
    model, card = load_router(tmp_path / "router")
    assert card.params["estimator"] == "knn" and model.knn_reference_.shape == (80, 384)
    assert len(card.params["knn_k_chosen"]) == len(card.params["knn_m_chosen"]) == 2
    p = model.predict_p_fail(["Ann buys 7 pears for 3 dollars each. How much does she pay?",
                              "What does a rabbit eat in summer?"])
    assert p[0, 0] > 0.8 > 0.2 > p[1, 0]
    assert np.all((p > 0) & (p < 1))


@pytest.mark.parametrize("features", ["lexical", "minilm,lexical"])
def test_the_knn_estimator_refuses_other_feature_blocks(tmp_path, capsys, features: str) -> None:
    from cascade.cli import main

    _topic_outcomes(tmp_path / "outcomes.csv", n=6)
    code = main(["router", "train", "--outcomes", str(tmp_path / "outcomes.csv"), "--tiers", "weak,strong",
                 "--out", str(tmp_path / "router"), "--features", features, "--estimator", "knn"])
    err = capsys.readouterr().err
    assert code == 2 and "--estimator knn" in err and "--features minilm" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "router").exists()
