"""Recorded answers (cascade/testing/fakes/recorded.py): the grader reads every replayed answer as it was recorded,
branches are told apart by their request ids, and a question without a record is refused, never made up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from cascade.data.datasets import prompts_of
from cascade.data.grading import answer_key, extract, grade
from cascade.data.outcomes import BranchOutcome, TierOutcome, read_rows
from cascade.optimizer.profile import load_profile
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.gpu import GpuSGLang
from cascade.testing.fakes.recorded import RecordedAnswers, RecordError, load_recorded, replay_text
from cascade.testing.servers import fake_engine

ROOT = Path(__file__).resolve().parents[3]
OUTCOMES = ROOT / "models" / "outcomes"
LADDER = OUTCOMES / "gsm8k-train-embedded-v8.jsonl"
PROFILE = ROOT / "models" / "gpu" / "profiles" / "h200" / "qwen2.5-coder-1.5b.json"
RECORDS = [LADDER, OUTCOMES / "qwen15-train-bench" / "sc-t07" / "branches.jsonl",
           OUTCOMES / "qwen15-test-bench" / "sc-s1" / "branches.jsonl", OUTCOMES / "gsm8k-train-embedded-branches.jsonl"]


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_every_recorded_answer_replays_as_the_grader_read_it(path: Path) -> None:
    rows = [row for _, row in read_rows(path)]
    references = {qid: p.reference or "" for qid, p in prompts_of({r.id for r in rows if r.id}).items()}
    checked = 0
    for row in rows:
        assert row.id is not None
        for outcome in row.tiers.values():
            replays: list[TierOutcome | BranchOutcome] = [outcome, *(outcome.branches or [])]
            for branch, recorded in enumerate(replays):
                answer = recorded.answer if isinstance(recorded.answer, str) else None
                text = "".join(replay_text(answer, recorded.output_tokens or 0, branch))
                assert extract(text, references[row.id]) == answer, (row.id, branch)
                assert grade(text, references[row.id]) == recorded.correct, (row.id, branch)
                assert answer is None or answer_key(text) == answer
                checked += 1
    assert checked >= 4 * len(rows)


def _answers() -> RecordedAnswers:
    branches = [BranchOutcome(answer="7", correct=True, output_tokens=5),
                BranchOutcome(answer=None, correct=False, output_tokens=3),
                BranchOutcome(answer="18", correct=False, output_tokens=512)]
    records = {"q:1": TierOutcome(correct=True, answer="7", output_tokens=5, finish_reason="stop", branches=branches),
               "q:2": TierOutcome(correct=False, answer="12.5", output_tokens=4, finish_reason="length")}
    return RecordedAnswers(records, {"How many apples?": "q:1", "How far is it?": "q:2"}, "reason")


def _body(question: str, rid: str = "", max_tokens: int = 512) -> dict[str, object]:
    return {"messages": [{"role": "system", "content": "Think."}, {"role": "user", "content": question}],
            "rid": rid, "max_tokens": max_tokens}


def test_branches_are_told_apart_by_their_request_ids() -> None:
    answers = _answers()
    first = answers.answer(_body("How many apples?"))  # no rid: branch 0
    unread = answers.answer(_body("  How many\napples? ", rid="cascade-ab12-c00-b01"))
    cut = answers.answer(_body("How many apples?", rid="cascade-ab12-c01-b02"))
    assert (len(first.steps), first.finish, answer_key("".join(t for _, t in first.steps))) == (5, "stop", "7")
    assert (len(unread.steps), extract("".join(t for _, t in unread.steps), "#### 7")) == (3, None)
    assert (len(cut.steps), cut.finish) == (512, "length")  # within 2 tokens of max_tokens: cut, as sart_replay reads
    with pytest.raises(ValueError, match="3 recorded branches"):
        answers.answer(_body("How many apples?", rid="cascade-ab12-c00-b03"))


def test_a_single_answer_replays_its_finish_and_a_shorter_limit_cuts_it() -> None:
    answers = _answers()
    whole = answers.answer(_body("How far is it?", rid="cascade-ab12-c00-b05"))  # one answer for every branch
    short = answers.answer(_body("How far is it?", max_tokens=2))
    assert (len(whole.steps), whole.finish, "".join(t for _, t in whole.steps)[-12:]) == (4, "length", "Answer: 12.5")
    assert (len(short.steps), short.finish, extract("".join(t for _, t in short.steps), "#### 12.5")) == (
        2, "length", None)


def test_a_question_without_a_record_is_refused() -> None:
    with serve_asgi(GpuSGLang(load_profile(PROFILE), _answers(), time_scale=0.1)) as url:
        response = httpx.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": [
            {"role": "user", "content": "How old is she?"}]}, timeout=10)
    assert response.status_code == 400
    assert "no recorded answer of tier `reason`" in response.json()["message"]


def test_records_without_their_column_or_text_are_refused() -> None:
    with pytest.raises(RecordError, match="no column `gpt-5`"):
        load_recorded([LADDER], "gpt-5")
    with pytest.raises(RecordError, match="without their text"):
        RecordedAnswers({"q:9": TierOutcome(correct=True, answer="1", output_tokens=1)}, {})


def test_fake_server_replays_a_tiers_records(tmp_path: Path) -> None:
    row = next(row for _, row in read_rows(LADDER))
    assert row.id is not None
    recorded, prompt = row.tiers["qwen2.5-coder-1.5b"], prompts_of({row.id})[row.id]
    with fake_engine(tmp_path, "--gpu-profile", str(PROFILE), "--time-scale", "0.1",
                     "--recorded", f"{LADDER}:qwen2.5-coder-1.5b") as url:
        answer = httpx.post(f"{url}/v1/chat/completions", json={"model": "m", "max_tokens": 512, "messages": [
            {"role": "user", "content": prompt.prompt}]}, timeout=30).json()
    text = answer["choices"][0]["message"]["content"]
    assert (extract(text, prompt.reference or ""), grade(text, prompt.reference or "")) == (recorded.answer,
                                                                                            recorded.correct)
    assert answer["usage"]["completion_tokens"] == recorded.output_tokens
    assert answer["choices"][0]["finish_reason"] == recorded.finish_reason


def test_fake_server_names_records_it_cannot_replay() -> None:
    done = subprocess.run([sys.executable, "-m", "cascade.cli", "fake-server", "--gpu-profile", str(PROFILE),
                           "--recorded", f"{LADDER}:gpt-5"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "no column `gpt-5`" in done.stderr and len(done.stderr.strip().splitlines()) == 1
