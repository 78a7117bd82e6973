"""The router's domain check: a prompt unlike the training prompts is flagged, unseen in-domain ones are not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cascade.router.classifier import DifficultyClassifier
from cascade.router.domain import MIN_THRESHOLD, excess, fit_domain
from cascade.router.outcomes import load_outcomes, shared_data_dir
from loadgen.datasets import load, sample

REPO = Path(__file__).resolve().parents[2]
EMBEDDED_OUTCOMES = REPO / "models" / "outcomes" / "gsm8k-train-embedded-v3.jsonl"
EMBEDDED_TIERS = ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-reason"]
# Written for this test: prompts a GSM8K-trained router has never seen the like of.
CHAT = ["Say hello.", "hi", "Write a haiku about autumn leaves.", "What is the capital of Australia?",
        "Translate 'good morning' into French.", "Write a Python function that reverses a linked list.",
        "Summarize the plot of Hamlet in two sentences.", "Compose a short email declining a meeting invitation."]


def test_excess_is_zero_inside_the_range_and_sums_the_distances_outside() -> None:
    low, high = np.array([0.0, -1.0]), np.array([1.0, 1.0])
    Z = np.array([[0.5, 0.0], [2.0, 0.0], [-1.0, 3.0]])
    assert excess(Z, low, high).tolist() == [0.0, 1.0, 3.0]


def test_unseen_rows_of_the_training_distribution_are_flagged_at_about_the_quantile() -> None:
    rng = np.random.default_rng(0)
    scale = 20.0  # wide enough that the threshold's floor (in absolute units) plays no part
    fit = fit_domain(rng.normal(scale=scale, size=(200, 20)), quantile=0.95, seed=0)
    assert fit is not None and fit.threshold > MIN_THRESHOLD
    fresh = excess(rng.normal(scale=scale, size=(4000, 20)), fit.low, fit.high) > fit.threshold
    assert 0.01 <= fresh.mean() <= 0.08
    shifted = excess(rng.normal(scale=scale, size=(100, 20)) + np.eye(20)[0] * 10 * scale, fit.low, fit.high)
    assert (shifted > fit.threshold).all()


def test_the_threshold_has_a_floor_for_templated_training_data() -> None:
    Z = np.tile([1.0, 2.0, 3.0], (50, 1))  # every held-out row inside the range: its excess quantile is 0
    fit = fit_domain(Z)
    assert fit is not None and fit.threshold == MIN_THRESHOLD


def test_too_little_data_gives_no_check_and_a_bad_quantile_is_refused() -> None:
    assert fit_domain(np.zeros((9, 3))) is None
    assert fit_domain(np.zeros((20, 0))) is None
    with pytest.raises(ValueError, match="quantile"):
        fit_domain(np.zeros((20, 3)), quantile=1.0)


@pytest.fixture(scope="module")
def embedded_router() -> DifficultyClassifier:
    if not (shared_data_dir() / "gsm8k" / "train.jsonl").exists():
        pytest.skip("shared data not found (set CASCADE_SHARED_DATA)")
    outcomes = load_outcomes(EMBEDDED_OUTCOMES, EMBEDDED_TIERS)
    return DifficultyClassifier(steps=True).fit(outcomes.prompts, outcomes.correct)


def test_a_router_trained_on_gsm8k_flags_chat_and_multiple_choice_but_few_unseen_gsm8k_questions(
        embedded_router: DifficultyClassifier) -> None:
    featurize = embedded_router.featurizer().transform
    gsm8k_test = [p.prompt for p in sample(load("gsm8k"), 300, np.random.default_rng(0))]
    mmlu = load_outcomes(shared_data_dir() / "routellm" / "mmlu", ["mistralai/Mixtral-8x7B-Instruct-v0.1"])
    mmlu_sample = [mmlu.prompts[i] for i in np.random.default_rng(0).choice(len(mmlu.prompts), 200, replace=False)]
    assert embedded_router.out_of_domain_features(featurize(gsm8k_test)).mean() <= 0.03
    assert embedded_router.out_of_domain_features(featurize(CHAT)).all()
    assert embedded_router.out_of_domain_features(featurize(mmlu_sample)).mean() >= 0.95


def test_quantile_zero_and_a_router_saved_without_the_check_never_flag(embedded_router: DifficultyClassifier) -> None:
    outcomes = load_outcomes(EMBEDDED_OUTCOMES, EMBEDDED_TIERS)
    off = DifficultyClassifier(lexical=True, domain_quantile=0).fit(outcomes.prompts, outcomes.correct)
    assert off.domain_threshold_ is None and not off.out_of_domain_features(off.featurizer().transform(CHAT)).any()
    older = DifficultyClassifier(steps=True)
    older.__setstate__({k: v for k, v in embedded_router.__getstate__().items() if not k.startswith("domain_")})
    assert older.domain_quantile == 0.0  # a parameter added later loads as "off"
    assert not older.out_of_domain_features(older.featurizer().transform(CHAT)).any()
