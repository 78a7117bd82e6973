"""benchmarks/reasoning/vote_vs_greedy.py: the served vote against greedy, paired and pooled over questions never used for
selection; the verdict follows the interval."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from benchmarks.reasoning.vote_vs_greedy import mcnemar_p, paired

ROOT = Path(__file__).resolve().parents[3]


def test_the_verdict_follows_the_interval() -> None:
    method, greedy = np.array([1.0] * 60 + [0.0] * 40), np.array([1.0] * 30 + [0.0] * 70)
    assert paired(method, greedy, 2000, 0)["verdict"] == "the vote beats greedy"
    assert paired(greedy, method, 2000, 0)["verdict"] == "greedy beats the vote"
    same = np.array([1.0, 0.0] * 500)
    assert paired(same, same, 2000, 0)["verdict"].startswith("a vote does not pay")  # 0..0: below +0.03
    noisy = paired(np.array([1.0, 0.0, 1.0, 0.0]), np.array([0.0, 1.0, 1.0, 0.0]), 2000, 0)
    assert noisy["verdict"] == "not settled" and noisy["method_only_right"] == noisy["greedy_only_right"] == 1


def test_mcnemar_is_the_exact_binomial() -> None:
    assert mcnemar_p(0, 0) == 1.0 and mcnemar_p(5, 5) == 1.0
    assert abs(mcnemar_p(11, 6) - 0.3323) < 1e-4  # the 100 GSM8K test questions, adaptive vs greedy


def test_sets_pool_and_excluded_questions_are_left_out(tmp_path: Path) -> None:
    bench = tmp_path / "requests.jsonl"
    bench.write_text("".join(json.dumps({"id": f"t{i}", "correct": i % 2 == 0}) + "\n" for i in range(10))
                     + json.dumps({"id": "t1", "correct": True}) + "\n")  # a resumed run's later record counts
    greedy = tmp_path / "greedy.jsonl"
    greedy.write_text("".join(json.dumps({"id": f"t{i}", "correct": False}) + "\n" for i in range(10)))
    label = tmp_path / "label.jsonl"
    label.write_text("".join(json.dumps({"id": f"r{i}", "tiers": {"reason": {"correct": True}, "direct":
                                                                    {"correct": i < 2}}}) + "\n" for i in range(6)))
    exclude = tmp_path / "chosen_on.jsonl"
    exclude.write_text(json.dumps({"id": "r0"}) + "\n" + json.dumps({"id": "r1"}) + "\n")
    done = subprocess.run([sys.executable, "-m", "benchmarks.reasoning.vote_vs_greedy", "--set", f"test={bench},{greedy}",
                           "--set", f"train={label}:reason,{label}:direct", "--exclude", str(exclude),
                           "--resamples", "500"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["sets"]["test"]["questions"] == 10 and result["sets"]["test"]["method_accuracy"] == 0.6
    assert result["sets"]["train"]["questions"] == 4 and result["sets"]["train"]["excluded"] == 2
    assert result["pooled"]["questions"] == 14 and result["pooled"]["difference"] == round(10 / 14, 4)


def test_a_question_sampled_under_two_seeds_counts_once_at_its_mean(tmp_path: Path) -> None:
    """Two sampling seeds of the same 4 questions: the pool has 4 questions, not 8; a question right under one
    seed only scores 0.5, and the discordant counts are questions, not samples."""
    seed0, seed1, greedy = tmp_path / "s0.jsonl", tmp_path / "s1.jsonl", tmp_path / "g.jsonl"
    seed0.write_text("".join(json.dumps({"id": f"q{i}", "correct": i < 3}) + "\n" for i in range(4)))
    seed1.write_text("".join(json.dumps({"id": f"q{i}", "correct": i < 1}) + "\n" for i in range(4)))
    greedy.write_text("".join(json.dumps({"id": f"q{i}", "correct": i == 3}) + "\n" for i in range(4)))
    done = subprocess.run([sys.executable, "-m", "benchmarks.reasoning.vote_vs_greedy", "--set", f"s0={seed0},{greedy}",
                           "--set", f"s1={seed1},{greedy}", "--resamples", "500",
                           "--json-out", str(tmp_path / "new" / "folder" / "r.json")],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "new" / "folder" / "r.json").read_text()) == json.loads(done.stdout)
    pooled = json.loads(done.stdout)["pooled"]
    assert (pooled["questions"], pooled["samples"], pooled["questions_in_several_sets"]) == (4, 8, 4)
    assert pooled["method_accuracy"] == (1 + 0.5 + 0.5 + 0) / 4 and pooled["greedy_accuracy"] == 0.25
    assert (pooled["method_only_right"], pooled["greedy_only_right"]) == (3, 1)
