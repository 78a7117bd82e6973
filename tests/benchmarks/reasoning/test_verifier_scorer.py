"""benchmarks/reasoning/verifier_scorer.py on a small made-up branches file: the heuristic alone (no model), and with the
real SmolLM2 weights as the verifier (e2e), resumed from its scores cache."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
MODULE = "benchmarks.reasoning.verifier_scorer"


def branches(path: Path, questions: int = 3) -> Path:
    """Per question two right branches (right arithmetic) and two wrong ones (the same words, a wrong sum)."""
    rows = []
    for q in range(questions):
        a, b = 10 + q, 7 + q
        for i, (total, correct) in enumerate(((a + b, True), (a + b + 2, False), (a + b, True), (a + b + 3, False))):
            text = (f"First we add the apples.\n\n{a} + {b} = {total} apples.\n\nThen we count them again "
                    f"{'carefully' if i < 2 else 'slowly'}.\n\nThe answer is {total}.")
            rows.append({"id": f"gsm8k-train:{q}", "branch": i, "text": text, "correct": correct, "state": "finished"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run(*args: str, timeout: int = 120) -> dict:
    done = subprocess.run([sys.executable, "-m", MODULE, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_heuristic_is_reported_with_intervals_within_question_auc_and_cost(tmp_path: Path) -> None:
    result = run("--branches", str(branches(tmp_path / "b.jsonl")), "--model", "none", "--bootstrap", "50")
    assert (result["branches"], result["questions"], result["correct_rate"]) == (12, 3, 0.5)
    heuristic = result["scorers"]["heuristic"]
    # A wrong sum is what the heuristic checks: within each question the right branches score higher (pooled over
    # questions, its question features mix the questions' levels in).
    assert heuristic["finished"]["auc_within_question"] == 1.0 and 0.5 < heuristic["finished"]["auc"] <= 1.0
    assert heuristic["finished"]["questions_with_both_outcomes"] == 3
    low, high = heuristic["finished"]["auc_ci95"]
    assert 0 <= low <= high <= 1
    assert heuristic["cost"]["finished"]["calls"] == 12 and heuristic["cost"]["finished"]["ms_mean"] > 0
    assert set(result["scorers"]) == {"heuristic"}


def test_branches_saved_without_text_are_refused_saying_so(tmp_path: Path) -> None:
    path = tmp_path / "b.jsonl"
    path.write_text(json.dumps({"id": "gsm8k-train:0", "branch": 0, "correct": True}) + "\n")
    done = subprocess.run([sys.executable, "-m", MODULE, "--branches", str(path), "--model", "none"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode != 0 and "without their text" in done.stderr


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_the_verifier_is_scored_and_a_rerun_reuses_its_scores(tmp_path: Path) -> None:
    path, cache = branches(tmp_path / "b.jsonl", questions=2), tmp_path / "scores.jsonl"
    argv = ["--branches", str(path), "--model", "smollm2-135m", "--bootstrap", "20", "--step-cost-branches", "1",
            "--scores-cache", str(cache)]
    first = run(*argv, timeout=240)
    verifier = first["scorers"]["verifier:smollm2-135m:judge"]
    assert verifier["partial"]["auc"] is not None and 0 <= verifier["finished"]["auc"] <= 1
    cost = verifier["cost"]
    assert cost["finished"]["calls"] == 8 and cost["finished"]["ms_mean"] > 0 and cost["batch"] == 1
    assert cost["step_cost"]["branches"] == 1 and cost["step_cost"]["calls"] == 4  # one call per step
    lines = cache.read_text().count("\n")
    assert lines == 16  # 8 branches x (partial, finished)
    again = run(*argv, timeout=240)
    assert cache.read_text().count("\n") == lines  # nothing scored twice
    assert again["scorers"]["verifier:smollm2-135m:judge"]["finished"] == verifier["finished"]
