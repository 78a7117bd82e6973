"""SART's pruning and voting rules (cascade/branches/sart.py), which the branch runner and the offline
replay (benchmarks/reasoning/sart_replay.py) share."""

from __future__ import annotations

import pytest

from cascade.branches.sart import Finished, Scored, to_prune, vote


def test_phase_one_prunes_lowest_scores_below_alpha_at_most_beta_in_all() -> None:
    live = [Scored(0, 0.9), Scored(1, 0.1), Scored(2, 0.2), Scored(3, None)]
    assert to_prune(live, alpha=0.3, beta=2, pruned_in_phase1=0, first_finished_score=None) == [1, 2]
    assert to_prune(live, alpha=0.3, beta=2, pruned_in_phase1=1, first_finished_score=None) == [1]
    assert to_prune(live, alpha=0.0, beta=2, pruned_in_phase1=0, first_finished_score=None) == []


def test_phase_one_never_prunes_the_last_live_branch() -> None:
    assert to_prune([Scored(0, 0.1), Scored(1, 0.05)], alpha=0.5, beta=5, pruned_in_phase1=0,
                    first_finished_score=None) == [1]


def test_phase_two_prunes_every_live_branch_below_the_first_finished_score_and_no_unscored_one() -> None:
    live = [Scored(0, 0.4), Scored(1, 0.8), Scored(2, None), Scored(3, 0.59)]
    assert to_prune(live, alpha=0.3, beta=0, pruned_in_phase1=0, first_finished_score=0.6) == [0, 3]


def test_the_majority_answer_wins_and_its_best_scored_shortest_branch_is_returned() -> None:
    finished = [Finished(0, "Answer: 5", 0.4, 30, True), Finished(1, "Answer: 7", 0.9, 20, True),
                Finished(2, "Answer: 5", 0.7, 40, True), Finished(3, "Answer: 5", 0.7, 35, True)]
    result = vote(finished)
    assert (result.answer, result.chosen) == ("5", 3)
    assert result.votes == {"5": 3, "7": 1}


def test_cut_off_branches_vote_only_when_nothing_else_finished() -> None:
    cut = Finished(0, "Answer: 9", 0.9, 100, False)
    assert vote([cut, Finished(1, "Answer: 4", 0.1, 50, True)]).answer == "4"
    assert vote([cut]).answer == "9"


def test_a_branch_without_an_answer_never_outvotes_one_with_an_answer() -> None:
    finished = [Finished(0, "", 0.9, 10, True), Finished(1, "  ", 0.9, 10, True),  # no answer key
                Finished(2, "Answer: 3", 0.1, 50, True)]
    assert vote(finished).answer == "3"


def test_weighted_vote_follows_the_scores() -> None:
    finished = [Finished(0, "Answer: 1", 0.2, 10, True), Finished(1, "Answer: 1", 0.2, 10, True),
                Finished(2, "Answer: 2", 0.9, 10, True)]
    assert vote(finished).answer == "1"
    assert vote(finished, weighted=True).answer == "2"


def test_a_vote_needs_a_finished_branch() -> None:
    with pytest.raises(ValueError, match="at least one"):
        vote([])


def test_a_first_wave_settles_only_when_every_branch_ended_on_its_own_with_one_answer() -> None:
    from cascade.branches.sart import wave_agrees

    def done(text: str, complete: bool = True) -> Finished:
        return Finished(0, text, None, 10, complete)

    assert wave_agrees([done("#### 18"), done("so 18.\n#### 18")])
    assert not wave_agrees([done("#### 18"), done("#### 19")])
    assert not wave_agrees([done("#### 18"), done("#### 18", complete=False)])
    assert not wave_agrees([])


def test_a_wave_margin_settles_once_the_leading_answer_is_that_many_votes_ahead() -> None:
    from cascade.branches.sart import Finished, next_wave, wave_settles

    def done(answer: str, complete: bool = True) -> Finished:
        return Finished(0, f"so #### {answer}" if answer else "", None, 10, complete)

    assert wave_settles(2, [done("18"), done("18")], 2) and not wave_settles(2, [done("18"), done("19")], 2)
    assert wave_settles(4, [done("18"), done("18"), done("18"), done("19")], 2)
    assert not wave_settles(4, [done("18"), done("18"), done("19"), done("20")], 2)  # 2-1: one ahead
    assert not wave_settles(4, [done("18"), done("18"), done("18", complete=False), done("19")], 2)  # cut: no vote
    assert wave_settles(2, [done("18"), done("")], 1) and not wave_settles(2, [done(""), done("")], 1)
    # Margin 0 is the two-wave rule: every launched branch finished, one answer.
    assert wave_settles(2, [done("18"), done("18")], 0) and not wave_settles(3, [done("18"), done("18")], 0)
    assert [next_wave(w, 8, 2) for w in (2, 4)] == [4, 8] and next_wave(3, 8, 1) == 6 and next_wave(6, 8, 1) == 8
    assert next_wave(2, 8, 0) == 8
