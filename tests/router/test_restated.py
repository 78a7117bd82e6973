"""The restated_number block: does the question end on a number that a restating answer would end on (and a
grader reading the last number would then take for the answer)?"""

from __future__ import annotations

import json

import numpy as np
import pytest

from cascade.cli import main
from cascade.router import evaluate as ev
from cascade.router.artifact import load_router
from cascade.router.classifier import DifficultyClassifier
from cascade.router.features import FeatureSpec, Featurizer
from cascade.router.lexical import LEXICAL_NAMES, restated_number
from cascade.router.train import fit_classifier


@pytest.mark.parametrize(("prompt", "expected"), [
    ("Claire makes a 3 egg omelet every morning. How many dozens of eggs will she eat in 4 weeks?", 1.0),
    ("Allen's age is 11 times Tom's. How old will Allen be 10 years from now?", 1.0),
    ("Kylar buys glasses for $5 each. How much does he pay?", 0.0),  # numbers only before the question
    ("After 3 days, how many apples are left?", 0.0),  # the number comes before the question word
    ("How many of the 12 apples are left after she gives some of them away to her friends?", 0.0),  # far from the end
    ("She walks 3 miles a day. Find the miles she walks in 7 days.", 1.0),  # no "?": the last sentence
    ("", 0.0),
])
def test_restated_number_reads_the_question_sentence(prompt: str, expected: float) -> None:
    assert restated_number(prompt) == expected


def test_the_block_is_one_standardised_column_after_lexical() -> None:
    featurizer = Featurizer(FeatureSpec(restated_number=True))
    X = featurizer.transform(["How many eggs in 4 weeks?", "How many eggs?"])
    assert X.shape == (2, len(LEXICAL_NAMES) + 1) and featurizer.names[-1] == "restated_number"
    assert X[:, -1].tolist() == [1.0, 0.0] and featurizer.standardize_mask.all()
    alone = Featurizer(FeatureSpec(lexical=False, restated_number=True)).transform(["How many eggs in 4 weeks?"])
    assert alone.tolist() == [[1.0]]


def _graded_like_routellm(n: int = 400, seed: int = 0) -> tuple[list[str], np.ndarray]:
    """The strong tier is right unless its answer restates a trailing number (then graded wrong 70% of the
    time); the weak tier fails at random, 40%. Routing gains only where the question does not restate. Both
    forms have the same words and numbers, in another order, so the lexical block cannot tell them apart."""
    rng = np.random.default_rng(seed)
    prompts, correct = [], []
    for _ in range(n):
        eggs, weeks = int(rng.integers(2, 20)), int(rng.integers(2, 9))
        trailing = bool(rng.random() < 0.3)
        ask = f"How many eggs does she eat in {weeks} weeks?" if trailing else f"In {weeks} weeks how many eggs does she eat?"
        prompts.append(f"Claire eats {eggs} eggs a week. {ask}")
        correct.append([rng.random() > 0.4, not (trailing and rng.random() < 0.7)])
    return prompts, np.array(correct, dtype=bool)


def test_a_router_with_the_block_learns_where_routing_up_gains_nothing() -> None:
    prompts, correct = _graded_like_routellm()
    test_prompts, test_correct = _graded_like_routellm(seed=1)
    apgr = {}
    for flag in (False, True):
        model = fit_classifier(DifficultyClassifier(restated_number=flag), prompts, correct)
        apgr[flag] = ev.apgr(ev.routing_curve(model.predict_p_fail(test_prompts), test_correct))
    assert apgr[True] > apgr[False] + 0.1


def test_train_with_the_restated_block_saves_it_in_the_card(tmp_path, capsys) -> None:
    prompts, correct = _graded_like_routellm(200)
    data = tmp_path / "outcomes.csv"
    data.write_text("prompt,weak,strong\n" + "".join(
        f'"{p}",{bool(w)},{bool(s)}\n' for p, (w, s) in zip(prompts, correct, strict=True)))
    out = tmp_path / "router"
    assert main(["router", "train", "--outcomes", str(data), "--tiers", "weak,strong", "--features",
                 "lexical,restated", "--out", str(out), "--cv-folds", "0"]) == 0
    card = json.loads((out / "card.json").read_text())
    assert card["feature_spec"]["restated_number"] is True
    model, _ = load_router(out)
    assert model.featurizer().names[-1] == "restated_number"
