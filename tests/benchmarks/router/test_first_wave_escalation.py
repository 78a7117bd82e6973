"""benchmarks/router/first_wave_escalation.py: the first wave's agreement, the vote, and each escalation policy's
accuracy and tokens, on questions built so that every number is known by hand."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.router.first_wave_escalation import Branch, Cascade, adaptive, first_wave, majority, policies


def test_a_first_wave_agrees_only_on_one_readable_answer() -> None:
    right, wrong = Branch("7", True, 10), Branch("8", False, 20)
    assert first_wave([right, Branch("7", True, 30), wrong]) == (True, 40, True)
    assert first_wave([right, wrong, right]) == (True, 30, False)
    assert first_wave([Branch(None, False, 5), Branch(None, False, 6)])[2] is False  # unreadable agrees with nothing


def test_the_vote_takes_the_majority_and_a_tie_goes_to_the_shortest_tied_branch() -> None:
    assert majority([Branch("8", False, 5), Branch("7", True, 9), Branch("7", True, 9)]) is True
    assert majority([Branch("8", False, 5), Branch("7", True, 4)]) is True
    assert majority([Branch(None, False, 9), Branch(None, True, 3)]) is True  # no readable answer: the shortest
    assert adaptive([Branch("8", False, 5), Branch("7", True, 9), Branch("7", True, 9)]) == (True, 23)
    assert adaptive([Branch("7", True, 5), Branch("7", True, 9), Branch("8", False, 9)]) == (True, 14)


def _cascade(agreed: list[bool], wave: list[bool], greedy: list[bool]) -> Cascade:
    n = len(agreed)
    return Cascade("c", "m", wave_correct=np.asarray(wave, dtype=float), wave_tokens=np.full(n, 20.0),
                   agreed=np.asarray(agreed), greedy_correct=np.asarray(greedy, dtype=float),
                   greedy_tokens=np.full(n, 10.0), target_correct=np.ones(n), target_tokens=np.full(n, 100.0))


def test_each_policy_escalates_what_it_should_and_pays_for_it() -> None:
    # Four questions: the wave disagrees exactly on the two the cheap model gets wrong; the router ranks the
    # other two highest, so at agreement's share it escalates the wrong ones.
    c = _cascade(agreed=[False, False, True, True], wave=[False, False, True, True], greedy=[False, False, True, True])
    p_fail = np.array([0.1, 0.2, 0.9, 0.8])
    out = policies(c, p_fail, draws=200, resamples=200, seed=0)
    assert out["escalated"] == 2
    assert out["agreement"] == {"accuracy": 1.0, "tokens": 20 + 2 / 4 * 100}
    assert out["router"] == {"accuracy": 0.5, "tokens": 10 + 2 / 4 * 100}
    assert 0.5 <= out["random"]["accuracy"] <= 1.0 and out["random"]["share_at_least_agreement"] < 0.5
    assert out["auc"]["disagreement_for_greedy_wrong"] == 1.0 and out["auc"]["router_p_fail_for_greedy_wrong"] == 0.0
    # Agreement's 70 tokens a question buy the router 2 escalations (10 + 2 x 25 = 60 <= 70 < 85)
    same = out["at_agreements_tokens"]
    assert same["router"] == {"escalated": 2, "accuracy": 0.5, "tokens": 60.0}
    assert same["agreement_minus_router"]["accuracy"] == pytest.approx(0.5, abs=0.1)
