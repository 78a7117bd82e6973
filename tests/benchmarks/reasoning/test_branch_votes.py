"""benchmarks/reasoning/branch_votes.py: majority@N and any-correct@N exact over every N-subset, and the same curves from
saved branches (text) and from their committable outcome rows (no text)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.reasoning import branch_votes as bv
from cascade.data.datasets import load
from cascade.data.grading import reference_answer

ROOT = Path(__file__).resolve().parents[3]
MODULE = "benchmarks.reasoning.branch_votes"


def test_a_vote_is_exact_over_every_subset_and_ties_go_to_the_shortest_branch() -> None:
    keys, lengths, correct = ["7", "7", "9"], [30, 20, 10], [True, True, False]
    majority, any_correct = bv.question_curves(keys, lengths, correct, 3)
    # N=1: 2 of 3 branches right. N=2: {0,1} votes 7; {0,2} and {1,2} tie and go to branch 2 (shortest), wrong.
    assert majority == pytest.approx([2 / 3, 1 / 3, 1.0])
    assert any_correct == pytest.approx([2 / 3, 1.0, 1.0])
    # An unreadable answer agrees with nothing: two unreadable branches never outvote one readable answer.
    assert bv.question_curves([None, None, "5"], [1, 1, 9], [False, False, True], 3)[0][2] == 1.0


def test_any_correct_is_one_minus_the_chance_that_every_drawn_branch_is_wrong() -> None:
    correct = [True] + [False] * 7
    _, any_correct = bv.question_curves([str(i) for i in range(8)], [1] * 8, correct, 8)
    assert any_correct == pytest.approx([1 - math.comb(7, n) / math.comb(8, n) for n in range(1, 9)])


def test_saved_branches_and_their_outcome_rows_give_the_same_curves(tmp_path: Path) -> None:
    prompts = load("gsm8k-train")[:4]
    saved, greedy = tmp_path / "saved.jsonl", tmp_path / "greedy.jsonl"
    lines, records = [], []
    for q, p in enumerate(prompts):
        right = reference_answer(p.reference or "")
        texts = [f"so #### {right}" if b < q + 1 else f"so #### {int(right) + b}" for b in range(4)]
        lines += [json.dumps({"id": p.id, "branch": b, "text": t, "state": "finished"}) for b, t in enumerate(texts)]
        records.append(json.dumps({"method": "vanilla", "id": p.id, "correct": q % 2 == 0, "error": None}))
    saved.write_text("\n".join(lines) + "\n")
    greedy.write_text("\n".join(records) + "\n")
    rows = tmp_path / "rows.jsonl"
    subprocess.run([sys.executable, "-m", "benchmarks.reasoning.branch_outcomes", str(saved), "--tier", "reason",
                    "--model", "smollm2-135m", "--out", str(rows)], check=True, capture_output=True, timeout=300, cwd=ROOT)
    runs = [[sys.executable, "-m", MODULE, "--branches", str(saved), "--greedy", str(greedy), "--n", "4",
             "--resamples", "200"],
            [sys.executable, "-m", MODULE, "--outcomes", str(rows), "--tier", "reason", "--greedy", str(greedy),
             "--n", "4", "--resamples", "200"]]
    text, no_text = (json.loads(subprocess.run(r, check=True, capture_output=True, text=True, timeout=120, cwd=ROOT).stdout)
                     for r in runs)
    assert text["questions"] == no_text["questions"] == 4 and text["greedy"] == 0.5
    assert text["per_branch"] == no_text["per_branch"] == pytest.approx((1 + 2 + 3 + 4) / 16, abs=1e-3)
    assert [r["majority"] for r in text["by_n"]] == [r["majority"] for r in no_text["by_n"]]
