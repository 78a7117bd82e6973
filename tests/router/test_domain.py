"""The router's domain check: a prompt unlike the training prompts is flagged, unseen in-domain ones are not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cascade.data.datasets import load, load_sharegpt, sample, shared_data_dir
from cascade.router.artifact import DataRef, load_router, save_router
from cascade.router.classifier import DifficultyClassifier
from cascade.router.domain import WordModel, excess, residual, word_tokens
from cascade.router.learned import LearnedSignal
from cascade.router.outcomes import Outcomes, load_outcomes, split_indices
from cascade.router.train.domain_check import (
    EMBEDDING_AXES,
    MIN_THRESHOLD,
    fit_domain,
    fit_embedding_plane,
    fit_word_model,
)
from cascade.router.train.estimator import fit_classifier

REPO = Path(__file__).resolve().parents[2]
EMBEDDED_OUTCOMES = REPO / "models" / "outcomes" / "gsm8k-train-embedded-v4.jsonl"
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
    outcomes = load_outcomes(EMBEDDED_OUTCOMES, EMBEDDED_TIERS)
    return fit_classifier(DifficultyClassifier(steps=True), outcomes.prompts, outcomes.correct)


def test_a_router_trained_on_gsm8k_flags_chat_and_multiple_choice_but_few_unseen_gsm8k_questions(
        embedded_router: DifficultyClassifier) -> None:
    gsm8k_test = [p.prompt for p in sample(load("gsm8k"), 300, np.random.default_rng(0))]
    mmlu = load_outcomes(shared_data_dir() / "routellm" / "mmlu", ["mistralai/Mixtral-8x7B-Instruct-v0.1"])
    mmlu_sample = [mmlu.prompts[i] for i in np.random.default_rng(0).choice(len(mmlu.prompts), 200, replace=False)]
    assert embedded_router.out_of_domain(gsm8k_test).mean() <= 0.03
    assert embedded_router.out_of_domain(CHAT).all()
    assert embedded_router.out_of_domain(mmlu_sample).mean() >= 0.95


def test_quantile_zero_and_a_router_saved_without_the_check_never_flag(embedded_router: DifficultyClassifier) -> None:
    outcomes = load_outcomes(EMBEDDED_OUTCOMES, EMBEDDED_TIERS)
    off = fit_classifier(DifficultyClassifier(lexical=True, domain_quantile=0), outcomes.prompts, outcomes.correct)
    assert off.domain_threshold_ is None and not off.out_of_domain(CHAT).any()
    older = DifficultyClassifier(steps=True)
    older.__setstate__({k: v for k, v in embedded_router.__getstate__().items() if not k.startswith("domain_")})
    assert older.domain_quantile == 0.0 and older.domain_words is False  # parameters added later load as "off"
    assert not older.out_of_domain(CHAT).any()


def test_the_embedding_plane_flags_rows_off_it_and_about_the_quantile_of_rows_on_it() -> None:
    rng = np.random.default_rng(0)
    basis = np.linalg.qr(rng.normal(size=(32, 4)))[0].T  # 4 orthonormal axes in 32 dimensions

    def on_plane(n: int) -> np.ndarray:
        return rng.normal(size=(n, 4)) @ basis * 3 + rng.normal(size=(n, 32)) * 0.1

    plane = fit_embedding_plane(on_plane(400), quantile=0.95)
    assert plane is not None and plane.axes.shape == (EMBEDDING_AXES, 32)
    assert 0.01 <= (residual(on_plane(4000), plane.mean, plane.axes) > plane.threshold).mean() <= 0.1
    off = on_plane(100) + rng.normal(size=(100, 32))  # the same points pushed off the plane
    assert (residual(off, plane.mean, plane.axes) > plane.threshold).all()
    assert fit_embedding_plane(on_plane(5 * (EMBEDDING_AXES + 2) - 1)) is None


ROUTELLM_DATA = shared_data_dir() / "routellm" / "gsm8k_responses.csv"


@pytest.fixture(scope="module")
def routellm() -> tuple[Outcomes, Outcomes, Outcomes, list[str]]:
    """RouteLLM GSM8K outcomes, their seed-0 halves (train, test), and 300 ShareGPT first turns."""
    outcomes = load_outcomes(ROUTELLM_DATA, ["mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview"])
    train, test = (outcomes.subset(rows) for rows in split_indices(len(outcomes), 0.5, 0))
    return outcomes, train, test, [p.prompt for p in sample(load_sharegpt(), 300, np.random.default_rng(0))]


def _save_and_load(model: DifficultyClassifier, out: Path, outcomes: Outcomes, train: Outcomes) -> LearnedSignal:
    save_router(model, out, tiers=outcomes.tiers, metrics={}, data=DataRef(
        path=str(ROUTELLM_DATA), sha256=outcomes.sha256, n_rows=len(outcomes), train_rows=len(train)))
    return LearnedSignal(*load_router(out))


def test_with_domain_embeddings_prose_that_passes_lexical_features_is_flagged_and_survives_save_and_load(
        tmp_path: Path, routellm: tuple[Outcomes, Outcomes, Outcomes, list[str]]) -> None:
    outcomes, train, test, chat = routellm
    lexical = fit_classifier(DifficultyClassifier(domain_words=False), train.prompts, train.correct)
    both = fit_classifier(DifficultyClassifier(domain_embeddings=True, domain_words=False), train.prompts, train.correct)
    assert both.out_of_domain(test.prompts[:300]).mean() <= 0.03
    assert lexical.out_of_domain(chat).mean() <= 0.8  # real chat traffic lexical features let through...
    assert both.out_of_domain(chat).mean() >= 0.9  # ...the embedding catches
    signal = _save_and_load(both, tmp_path / "router", outcomes, train)
    assert signal.card.params["domain_embeddings"] is True and signal.card.params["domain_residual_threshold"] > 0
    flags = [signal.assess(p).out_of_domain for p in chat[:20]]
    assert flags == both.out_of_domain(chat[:20]).tolist()


def test_word_tokens_fold_numbers_and_mark_the_ends() -> None:
    assert word_tokens("Tom has 12 apples, and 3.5 pears?") == [
        "<s>", "tom", "has", "<num>", "apples", ",", "and", "<num>", ".", "<num>", "pears", "?", "</s>"]


def test_the_word_model_finds_its_own_wording_less_surprising_than_other_wording() -> None:
    problems = [f"Ann has {n} apples and buys {n + 3} more. How many apples does Ann have?" for n in range(30)]
    model = fit_word_model(problems, quantile=0.99)
    assert model is not None and np.isfinite(model.threshold)
    seen, other = model.surprise(["Ann has 7 apples and buys 2 more. How many apples does Ann have?",
                                  "Write a haiku about autumn leaves."])
    assert seen < model.threshold < other
    assert fit_word_model(problems[:9]) is None
    with pytest.raises(ValueError, match="quantile"):
        fit_word_model(problems, quantile=0.0)
    assert WordModel([]).surprise(["anything at all"])[0] > 0  # no counts: every word unseen, finite surprise


def test_the_word_test_catches_real_chat_that_the_range_test_lets_through_and_survives_save_and_load(
        tmp_path: Path, routellm: tuple[Outcomes, Outcomes, Outcomes, list[str]]) -> None:
    outcomes, train, test, chat = routellm
    range_only = fit_classifier(DifficultyClassifier(domain_words=False), train.prompts, train.correct)
    with_words = fit_classifier(DifficultyClassifier(), train.prompts, train.correct)
    assert with_words.out_of_domain(test.prompts).mean() <= 0.03
    assert range_only.out_of_domain(chat).mean() <= 0.8
    assert with_words.out_of_domain(chat).mean() >= 0.9
    signal = _save_and_load(with_words, tmp_path / "router", outcomes, train)
    assert signal.card.params["domain_words"] is True and signal.card.params["domain_word_threshold"] > 0
    assert [signal.assess(p).out_of_domain for p in chat[:20]] == with_words.out_of_domain(chat[:20]).tolist()
