"""Committed results replay from the repo (issue 51 item 6): what a result read is named repo-relative and is in the
repo, or the result says it is not and how it was made; and the replayable ones give their committed numbers again.
(benchmarks/results/sart_replay_qwen15_train_cv.json: tests/benchmarks/reasoning/test_sart_replay_out_of_fold.py.)"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from cascade.repo_paths import OUTSIDE

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
# Keys under which a result names a file it read or wrote.
PATH_KEYS = {"branches_file", "outcomes_file", "greedy_file", "outcomes", "spec", "router", "plot"}


def _named_paths(tree: Any, key: str = "") -> list[tuple[str, str]]:
    if isinstance(tree, dict):
        return [pair for k, v in tree.items() for pair in _named_paths(v, k)]
    if isinstance(tree, list):
        return [pair for v in tree for pair in _named_paths(v, key)]
    named = key in PATH_KEYS and isinstance(tree, str) and ("/" in tree or tree.endswith(OUTSIDE))
    return [(key, tree)] if named else []


def _run(command: str, tmp_path: Path) -> dict:
    argv = shlex.split(command)
    assert argv[:2] == ["python", "-m"] and argv[2].startswith("benchmarks.")
    out = tmp_path / "replay.json"
    done = subprocess.run([sys.executable, *argv[1:], *(["--json-out", str(out)] if "sart_replay" in argv[2] else [])],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text() if out.exists() else done.stdout)


def test_every_file_a_committed_result_names_is_in_the_repo_or_the_result_says_how_it_was_made() -> None:
    named = 0
    for path in sorted(RESULTS.glob("*.json")):
        result = json.loads(path.read_text())
        for key, value in _named_paths(result):
            named += 1
            if value.endswith(OUTSIDE):
                note = result.get("reproduce", {})
                assert note.get("not_in_repo"), f"{path.name}: {key} {value!r} and no reproduce.not_in_repo note"
            else:  # a path, or one in a note: "learned (models/routers/x)"
                where = next(word for word in re.split(r"[\s()]+", value) if "/" in word)
                in_repo = where.startswith("../shared/data/") or (ROOT / where).exists()  # shared data: beside it
                assert in_repo, f"{path.name}: {key} {value!r} is not in the repo"
    assert named >= 10


def test_the_in_sample_sart_grid_replays_from_committed_outcomes_where_it_needs_no_text(tmp_path: Path) -> None:
    """benchmarks/results/sart_replay_qwen15_train.json: self-consistency and every setting without pruning, by the
    command the result records (the pruning rows scored branch text that is not in the repo)."""
    committed = json.loads((RESULTS / "sart_replay_qwen15_train.json").read_text())
    assert committed["reproduce"]["from_repo"] == "self_consistency and the rows without pruning"
    replayed = _run(committed["reproduce"]["command"], tmp_path)
    assert replayed["branches_file"] == committed["branches_file"]
    assert (replayed["questions"], replayed["self_consistency"]) == (100, committed["self_consistency"])
    unpruned = [row for row in committed["all"] if not row["prune"]]
    assert len(unpruned) == 4 and replayed["all"] == unpruned


def test_the_vote_curves_on_training_questions_replay_from_committed_outcomes() -> None:
    """benchmarks/results/branch_votes_qwen15_train.json end to end: majority@N, any-correct@N and greedy, with
    their bootstrap intervals, from the inputs it names."""
    committed = json.loads((RESULTS / "branch_votes_qwen15_train.json").read_text())
    done = subprocess.run([sys.executable, "-m", "benchmarks.reasoning.branch_votes", "--outcomes", committed["outcomes_file"],
                           "--tier", "qwen2.5-coder-1.5b-reason", "--greedy", committed["greedy_file"]],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {k: v for k, v in committed.items() if k != "plot"}
