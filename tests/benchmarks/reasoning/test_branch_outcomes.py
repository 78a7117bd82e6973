"""benchmarks/reasoning/branch_outcomes.py: saved branches (text) become per-branch outcome rows without text, which the
planner reads as a tier's branch draws."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.reasoning import branch_outcomes as bo
from cascade.data.datasets import load
from cascade.data.grading import reference_answer
from cascade.data.outcomes import read_rows
from cascade.optimizer.outcomes import from_rows

ROOT = Path(__file__).resolve().parents[3]
MODULE = "benchmarks.reasoning.branch_outcomes"


def test_saved_branches_become_rows_the_planner_reads(tmp_path) -> None:
    prompts = load("gsm8k-train")[:2]
    saved = tmp_path / "saved.jsonl"
    lines = []
    for p in prompts:
        texts = [f"so #### {reference_answer(p.reference or '')}", "I think #### 123457", "no idea at all", "so #### 123457 then"]
        lines += [json.dumps({"id": p.id, "branch": b, "text": t, "correct": None, "state": "finished"})
                  for b, t in enumerate(texts)]
    lines.append(json.dumps({"id": prompts[0].id, "branch": 9, "text": "cut", "state": "cancelled"}))
    # An adaptive run's branches in the same file: a settled wave, not all N of the question, so not kept.
    lines.append(json.dumps({"id": prompts[1].id, "branch": 0, "text": "#### 1", "state": "finished",
                             "method": "adaptive"}))
    saved.write_text("\n".join(lines) + "\n")
    rows = bo.to_rows(bo.read_saved(saved), "reason", lambda text: len(text.split()))
    assert [r.id for r in rows] == [p.id for p in prompts]
    out = tmp_path / "rows.jsonl"
    with out.open("wb") as sink:
        for row in rows:
            bo.write_row(sink, row)
    text = out.read_text()
    assert prompts[0].prompt[:30] not in text and "I think" not in text  # no dataset or model text is kept
    back = [row for _, row in read_rows(out)]
    tier = back[0].tiers["reason"]
    assert tier.branches is not None and len(tier.branches) == 4  # the cancelled branch is dropped
    assert back[1].tiers["reason"].branches is not None and len(back[1].tiers["reason"].branches) == 4
    assert [b.correct for b in tier.branches] == [True, False, False, False]
    assert tier.correct is True and tier.output_tokens == 3  # branch 0 stands for the single answer
    draws = from_rows(back, ["reason"]).branches[0]
    assert draws is not None and draws.answer[0].tolist()[:2] == [0, 1] and draws.answer[0, 3] == 1


def test_a_file_that_is_not_saved_branches_is_one_line_and_exit_2(tmp_path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x:1"}\n')
    done = subprocess.run([sys.executable, "-m", MODULE, str(bad), "--tier", "t", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "not a saved branch" in done.stderr


V6 = ROOT / "models" / "outcomes" / "gsm8k-train-embedded-v6.jsonl"


def test_with_labelled_rows_keeps_their_questions_copies_their_tiers_and_adds_an_out_of_fold_difficulty(
        tmp_path) -> None:
    labelled = [row for _, row in read_rows(V6)][:2]
    by_id = {p.id: p for p in load("gsm8k-train")}
    unlabelled = next(p for p in by_id.values() if p.id not in {r.id for _, r in read_rows(V6)})
    saved = tmp_path / "saved.jsonl"
    saved.write_text("".join(
        json.dumps({"id": i, "branch": b, "text": f"#### {reference_answer(by_id[i].reference or '')}"}) + "\n"
        for i in [*(r.id for r in labelled), unlabelled.id] for b in range(3)))
    rows = bo.to_rows(bo.read_saved(saved), "qwen2.5-coder-0.5b-reason", lambda text: 5)
    merged, dropped = bo.with_labelled(rows, "qwen2.5-coder-0.5b-reason", str(V6), "qwen2.5-coder-0.5b", "lexical", 0)
    assert dropped == 1 and [r.id for r in merged] == [r.id for r in labelled]
    for row, source in zip(merged, labelled, strict=True):
        assert row.tiers["smollm2-135m"] == source.tiers["smollm2-135m"]  # copied
        reason = row.tiers["qwen2.5-coder-0.5b-reason"]
        assert reason.branches is not None and len(reason.branches) == 3  # replaced by the branches
        assert row.difficulty is not None and 0.0 < row.difficulty < 1.0


def test_difficulty_without_labelled_rows_is_refused(tmp_path) -> None:
    done = subprocess.run([sys.executable, "-m", MODULE, str(tmp_path / "s.jsonl"), "--tier", "t", "--out",
                           str(tmp_path / "o"), "--difficulty-tier", "x"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2 and "needs --with" in done.stderr
