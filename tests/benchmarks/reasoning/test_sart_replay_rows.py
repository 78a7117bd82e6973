"""benchmarks/reasoning/sart_replay.py --rows: a tier's label at one SART setting, derived from saved branches, as outcome
rows (the voted answer and its correctness, decode tokens of every branch; no text)."""

from __future__ import annotations

import functools
import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from cascade.data.datasets import load
from cascade.data.grading import reference_answer

ROOT = Path(__file__).resolve().parents[3]
MODULE = "benchmarks.reasoning.sart_replay"
TIER = "qwen2.5-coder-1.5b-reason"


def _saved(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """Three branches for each of two GSM8K training questions: two agree on the reference, one is wrong and
    longest; on the second question the wrong answer is the majority."""
    prompts = load("gsm8k-train")[:2]
    answers = {p.id: reference_answer(p.reference) for p in prompts}
    rows = []
    for q, (qid, ref) in enumerate(answers.items()):
        wrong = str(int(float(ref)) + 1)
        picks = [ref, ref, wrong] if q == 0 else [wrong, wrong, ref]
        for b, answer in enumerate(picks):
            text = "First we add the numbers.\n\n" * (b + 1) + f"The answer is {answer}."
            rows.append({"id": qid, "branch": b, "text": text, "correct": answer == ref, "state": "finished"})
    path = tmp_path / "saved.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, answers


def test_rows_carry_the_voted_answer_its_grade_and_every_branchs_tokens(tmp_path: Path) -> None:
    saved, answers = _saved(tmp_path)
    out = tmp_path / "rows.jsonl"
    done = subprocess.run([sys.executable, "-m", MODULE, "--branches", str(saved), "--n", "3", "--m", "3",
                           "--alpha", "0", "--beta", "0", "--k", "1", "--rows", str(out), "--tier", TIER],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(rows) == set(answers)
    (id1, ref1), (id2, ref2) = answers.items()
    first, second = rows[id1]["tiers"][TIER], rows[id2]["tiers"][TIER]
    assert first["correct"] is True and first["answer"] == ref1
    assert second["correct"] is False and second["answer"] != ref2
    # M = N, no pruning: every branch ran to its end, so decode tokens are all three branches' lengths.
    assert first["decode_tokens"] > 3 * first["output_tokens"] // 2
    assert all(r["dataset"] == "gsm8k-train" and "text" not in json.dumps(r) for r in rows.values())


def test_rows_need_one_setting(tmp_path: Path) -> None:
    saved, _ = _saved(tmp_path)
    done = subprocess.run([sys.executable, "-m", MODULE, "--branches", str(saved), "--n", "3", "--m", "1,2",
                           "--rows", str(tmp_path / "r.jsonl"), "--tier", TIER],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2 and "exactly one value" in done.stderr


@functools.cache
def _replay_module() -> Any:
    """benchmarks/reasoning/sart_replay.py as a module, loaded once."""
    return importlib.import_module(MODULE)


def test_without_pruning_a_tie_goes_to_the_shorter_branch_as_in_the_runner() -> None:
    """The live runner has no scorer when it does not prune (self-consistency, early stop only), so its ties go to
    the shorter branch; replaying them by score made self-consistency 0.79 where the live run measured 0.75."""
    replay_module = _replay_module()
    saved = replay_module.SavedBranch
    short_wrong = saved(text="The answer is 5.", correct=False, tokens=10, capped=False, events=[], final_score=0.1)
    long_right = saved(text="The answer is 7.", correct=True, tokens=20, capped=False, events=[], final_score=0.9)
    unpruned = replay_module.replay([long_right, short_wrong], m=2, alpha=0.0, beta=0, prune=False)
    assert unpruned.correct is False and unpruned.chosen == 1
    scored = replay_module.replay([long_right, short_wrong], m=2, alpha=0.05, beta=1, prune=True)
    assert scored.correct is True and scored.chosen == 0


def _answer_branch(answer: int, tokens: int, capped: bool = False) -> Any:
    """A saved branch answering `answer` (7 is right) in `tokens` tokens, unscored."""
    return _replay_module().SavedBranch(text=f"The answer is {answer}.", correct=answer == 7, tokens=tokens,
                                        capped=capped, events=[], final_score=0.5)


def test_adaptive_stops_at_an_agreeing_first_wave_and_otherwise_waits_for_every_branch() -> None:
    replay_module = _replay_module()
    branch = _answer_branch

    agree = replay_module.replay_adaptive([branch(7, 10), branch(7, 12), branch(5, 30), branch(5, 40)], 2)
    assert (agree.correct, agree.tokens, agree.latency) == (True, 22, 12)
    split = replay_module.replay_adaptive([branch(7, 10), branch(5, 12), branch(5, 30), branch(5, 40)], 2)
    assert (split.correct, split.tokens, split.latency) == (False, 92, 12 + 40)  # the second wave after the first
    capped = replay_module.replay_adaptive([branch(7, 10), branch(7, 12, capped=True), branch(7, 5), branch(5, 6)], 2)
    assert capped.tokens == 33  # a first-wave branch cut by max_tokens is no agreement


def test_adaptive_with_an_early_stop_votes_the_first_wave_and_the_first_finishers_of_the_second() -> None:
    replay_module = _replay_module()
    branch = _answer_branch
    split = [branch(7, 10), branch(5, 12), branch(7, 30), branch(5, 40)]
    early = replay_module.replay_adaptive(split, 2, m=3)  # one more finisher after the wave: 7, 5, 7
    assert (early.correct, early.tokens, early.latency) == (True, 10 + 12 + 30 + 30, 12 + 30)
    assert replay_module.replay_adaptive(split, 2, m=0).tokens == 92  # m 0: every branch


def test_adaptive_with_a_wave_margin_doubles_its_waves_until_one_answer_leads_by_the_margin() -> None:
    replay_module = _replay_module()
    branch = _answer_branch
    # Waves of 2, 4, 8: 7/5 splits the first; 7, 7 in the second leads 3-1, so the last four never start.
    eight = [branch(7, 10), branch(5, 12), branch(7, 20), branch(7, 8), *(branch(5, 50) for _ in range(4))]
    settled = replay_module.replay_adaptive(eight, 2, margin=2)
    assert (settled.correct, settled.tokens, settled.latency) == (True, 10 + 12 + 20 + 8, 12 + 20)
    # 7, 5 then 5, 7: 2-2 at four, so all eight run and 5 wins 6-2.
    tied = [branch(7, 10), branch(5, 12), branch(5, 20), branch(7, 8), *(branch(5, 50) for _ in range(4))]
    assert replay_module.replay_adaptive(tied, 2, margin=2).correct is False
    assert replay_module.replay_adaptive(tied, 2, margin=2).tokens == 10 + 12 + 20 + 8 + 4 * 50
    # Margin 0 is the two-wave rule: all eight after the split, whatever the second wave's first two say.
    assert replay_module.replay_adaptive(eight, 2).tokens == 10 + 12 + 20 + 8 + 4 * 50


def test_adaptive_rows_are_the_adaptive_replay(tmp_path: Path) -> None:
    saved, answers = _saved(tmp_path)
    out = tmp_path / "rows.jsonl"
    done = subprocess.run([sys.executable, "-m", MODULE, "--branches", str(saved), "--n", "3", "--rows", str(out),
                           "--tier", TIER, "--rows-method", "adaptive", "--first-wave", "2", "--k", "1"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    rows = {r["id"]: r["tiers"][TIER] for r in map(json.loads, out.read_text().splitlines())}
    (id1, ref1), (id2, _) = answers.items()
    # The first question's first two agree (the third never runs); the second's agree on the wrong answer.
    assert rows[id1]["correct"] is True and rows[id1]["answer"] == ref1
    assert rows[id2]["correct"] is False
    three = subprocess.run([sys.executable, "-m", MODULE, "--branches", str(saved), "--n", "3", "--rows",
                            str(tmp_path / "r.jsonl"), "--tier", TIER, "--rows-method", "adaptive",
                            "--first-wave", "2", "--wave-margin", "1,2"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert three.returncode == 2 and "exactly one --first-wave" in three.stderr


def test_branch_outcomes_without_text_replay_as_the_branches_do(tmp_path: Path) -> None:
    """Committed branch outcomes (answer, grade, tokens; no text) replay every setting without pruning exactly as
    the saved branches they were made from; a setting that prunes needs the text and is refused."""
    saved, _ = _saved(tmp_path)
    outcomes = tmp_path / "outcomes.jsonl"
    made = subprocess.run([sys.executable, "-m", "benchmarks.reasoning.branch_outcomes", str(saved), "--tier", TIER,
                           "--out", str(outcomes)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert made.returncode == 0, made.stderr
    grid = ["--n", "3", "--m", "1,2,3", "--alpha", "0", "--beta", "0", "--k", "1", "--first-wave", "2",
            "--wave-margin", "1"]
    results = []
    for source in (["--branches", str(saved)], ["--outcomes", str(outcomes)]):
        out = tmp_path / f"replay{len(results)}.json"
        done = subprocess.run([sys.executable, "-m", MODULE, *source, *grid, "--json-out", str(out)],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        results.append(json.loads(out.read_text()))
    from_text, from_outcomes = results
    assert from_outcomes["questions"] == from_text["questions"] == 2
    for key in ("self_consistency", "adaptive"):
        assert from_outcomes[key] == from_text[key]
    # Phase 2 prunes on the first finished branch's score even at alpha 0, beta 0: those rows need the text.
    assert from_outcomes["all"] == [r for r in from_text["all"] if not r["prune"]]
    assert len(from_outcomes["all"]) == 3
    refused = subprocess.run([sys.executable, "-m", MODULE, "--outcomes", str(outcomes), "--n", "3", "--m", "2",
                              "--alpha", "0.5", "--beta", "1"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert refused.returncode == 2 and "no text to score" in refused.stderr
