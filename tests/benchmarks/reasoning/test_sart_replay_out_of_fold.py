"""Choosing a branch setting out of sample (cascade/bench/out_of_fold.py) and benchmarks/reasoning/sart_replay.py's
`out_of_sample` report: nested cross-validation over questions, so the best of a grid is scored on questions it was
not chosen on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from cascade.bench.out_of_fold import Candidate, Plan, choose, compare, folds, nested, paired_difference

ROOT = Path(__file__).resolve().parents[3]
MODULE = "benchmarks.reasoning.sart_replay"
TIER = "qwen2.5-coder-1.5b-reason"


def _candidate(name: str, correct: list[int] | np.ndarray, tokens: float) -> Candidate:
    right = np.asarray(correct, dtype=float)
    return Candidate({"family": name}, right, np.full(len(right), tokens), np.full(len(right), tokens))


def test_folds_are_seeded_and_differ_in_size_by_one_at_most() -> None:
    fold = folds(23, 5, seed=3)
    assert sorted(np.bincount(fold)) == [4, 4, 5, 5, 5]
    assert (fold == folds(23, 5, seed=3)).all() and not (fold == folds(23, 5, seed=4)).all()


def test_the_criterion_takes_the_fewest_tokens_within_the_slack_else_the_most_accurate() -> None:
    reference = np.array([1, 1, 1, 1, 0], dtype=float)  # 0.8
    cheap_close = _candidate("cheap", [1, 1, 1, 0, 0], 100)  # 0.6: 0.2 below
    dear_close = _candidate("dear", [1, 1, 1, 1, 0], 300)  # 0.8
    every = np.ones(5, dtype=bool)
    assert choose([dear_close, cheap_close], reference, every, points=0.2) == 1
    assert choose([dear_close, cheap_close], reference, every, points=0.02) == 0
    assert choose([cheap_close], reference, every, points=0.02) == 0  # none within: the most accurate


def test_each_fold_is_answered_by_the_setting_chosen_on_the_other_folds() -> None:
    rng = np.random.default_rng(0)
    reference = np.zeros(40)
    candidates = [_candidate(f"c{i}", rng.integers(0, 2, 40), 100) for i in range(6)]
    oof = nested(candidates, reference, k=4, seed=1, points=0.0)
    for f, index in enumerate(oof.chosen):
        held = oof.fold == f
        assert index == choose(candidates, reference, ~held, 0.0)
        assert (oof.correct[held] == candidates[index].correct[held]).all()


def test_the_best_of_many_lucky_settings_loses_its_luck_out_of_fold() -> None:
    """60 settings that are all right with probability 0.6, at equal cost, on 100 questions (10 such grids): the
    in-sample best looks better than 0.6 only by luck, and the out-of-fold estimate of choosing that way does not."""
    rng = np.random.default_rng(7)
    in_sample, out_of_fold, distinct = [], [], []
    for _ in range(10):
        candidates = [_candidate(f"c{i}", rng.random(100) < 0.6, 100) for i in range(60)]
        reference = _candidate("reference", np.zeros(100), 100)
        result = compare(candidates, reference, None, Plan(k=5, seed=0, points=0.0, resamples=100))
        in_sample.append(result["in_sample_best"]["accuracy"])
        out_of_fold.append(result["out_of_fold"]["accuracy"])
        distinct.append(result["distinct_choices"])
    assert np.mean(in_sample) > 0.68  # about 0.6 + 2.2 standard errors: the winner's curse
    assert abs(np.mean(out_of_fold) - 0.6) < 0.04
    assert max(distinct) > 1  # luck does not repeat across folds


def test_a_paired_difference_counts_the_questions_one_gets_and_the_other_misses() -> None:
    a = np.array([1, 1, 0, 1, 0, 1], dtype=float)
    b = np.array([1, 0, 1, 0, 0, 1], dtype=float)
    d = paired_difference(a, b, resamples=500, seed=0)
    assert (d["difference"], d["wins"], d["losses"]) == (round(1 / 6, 4), 2, 1)
    assert d["ci95"][0] <= d["difference"] <= d["ci95"][1]


def _outcomes(tmp_path: Path, questions: int) -> tuple[Path, Path]:
    """Branch outcomes (4 branches each) and greedy bench records for `questions` GSM8K training ids."""
    rng = np.random.default_rng(0)
    rows, greedy = [], []
    for q in range(questions):
        qid = f"gsm8k-train:{q}"
        branches = [{"answer": "7" if right else str(q % 3), "correct": bool(right),
                     "output_tokens": int(rng.integers(50, 300))} for right in rng.random(4) < 0.6]
        rows.append({"id": qid, "dataset": "gsm8k-train", "tiers": {TIER: {**branches[0], "branches": branches}}})
        greedy.append({"id": qid, "method": "vanilla", "correct": bool(rng.random() < 0.5), "decode_tokens": 120,
                       "error": None})
    (tmp_path / "outcomes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "greedy.jsonl").write_text("".join(json.dumps(r) + "\n" for r in greedy))
    return tmp_path / "outcomes.jsonl", tmp_path / "greedy.jsonl"


def test_the_replay_reports_the_out_of_fold_choice_beside_the_in_sample_best(tmp_path: Path) -> None:
    outcomes, greedy = _outcomes(tmp_path, 30)
    out = tmp_path / "replay.json"
    done = subprocess.run([sys.executable, "-m", MODULE, "--outcomes", str(outcomes), "--n", "4", "--m", "1,2,3",
                           "--alpha", "0", "--beta", "0", "--first-wave", "2", "--wave-margin", "1",
                           "--greedy", str(greedy), "--resamples", "200", "--json-out", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "in-sample best of" in done.stderr and "out of fold (5 folds" in done.stderr
    payload = json.loads(out.read_text())
    assert {"questions", "n", "self_consistency", "best_within_2pts", "adaptive", "all"} <= set(payload)
    report = payload["out_of_sample"]
    assert (report["folds"], report["questions"]) == (5, 30)
    assert set(report["families"]) == {"self_consistency", "sart", "adaptive", "doubling_waves", "greedy"}
    everything = report["all"]
    assert len(everything["chosen_per_fold"]) == 5
    assert everything["candidates"] == 4 + 3 + 1 + 1  # SC over 1-4 branches, M 1-3 of 4, W 2, W 2 with D 1
    assert {"in_sample_best", "out_of_fold"} <= set(everything)
    assert {"minus_sc", "minus_greedy"} <= set(everything["out_of_fold"])


def test_the_committed_out_of_fold_replay_is_what_the_committed_records_give(tmp_path: Path) -> None:
    """benchmarks/results/sart_replay_qwen15_train_cv.json, replayed from the repo's own records end to end (the
    command docs/measured.md gives): every number, every setting and both input paths, as committed."""
    committed = json.loads((ROOT / "benchmarks/results/sart_replay_qwen15_train_cv.json").read_text())
    out = tmp_path / "replay.json"
    done = subprocess.run([sys.executable, "-m", MODULE, "--outcomes", committed["branches_file"], "--n", "8",
                           "--m", "1,2,3,4,5,6,7", "--alpha", "0", "--beta", "0", "--k", "2", "--max-tokens", "512",
                           "--first-wave", "2,3,4", "--wave-m", "3,4,5,6", "--wave-margin", "1,2,3",
                           "--greedy", committed["out_of_sample"]["greedy_file"], "--json-out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["out_of_sample"] == committed["out_of_sample"]
    assert json.loads(out.read_text()) == committed
