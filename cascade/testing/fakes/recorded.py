"""Recorded answers for the GPU emulator (cascade/testing/fakes/gpu.py): an engine that answers what the real model
answered (issue 62 item 2). One `RecordedAnswers` per emulated engine, built from one tier's column of outcome rows
(cascade/data/outcomes.py: models/outcomes/*.jsonl), so an engine serves exactly one tier.

* **The question** is the request's last user message, matched to the dataset row it was built from: the records
  name rows by id (`gsm8k-train:5646`, no text), and the texts are read in place from the shared datasets
  (cascade/data/datasets.py `prompts_of`). The key is the text with its whitespace collapsed, so a gateway's system
  prompt or a client's spacing does not matter. A question without a record is refused (400, as SGLang refuses a
  request it cannot serve): never a made-up answer.
* **The branch** is read off the request id cascade sends upstream (cascade/tiers/upstream.py: ``<base>-cCC-bBB``;
  cascade's SGLang client sends it as `rid`); a request without one is branch 0. Seeds cannot tell branches apart
  (their base is random unless the client sent a seed).
* **A single answer** (a direct tier: no `branches` in the record) replays the recorded answer (the grader's reading,
  `answer`) and output token count, and the recorded finish reason, on every branch and choice. So a reasoning tier
  whose record holds only its per-question outcome votes on the recorded answer (its accuracy is the recorded one),
  but its decode tokens are those of the branches it launches (adaptive: two chosen branches' worth), not the
  recorded `decode_tokens`; benchmarks/reasoning/wave_branches.py derives a live label run's branches instead.
* **Recorded branches** (`branches`: every branch of the record run to completion, in sampling order) replay branch
  `b`'s answer and output tokens; a branch past the recorded ones is refused. The records carry no per-branch finish
  reason: a branch within 2 tokens of the request's max_tokens ends "length" (cut), as
  benchmarks/reasoning/sart_replay.py reads saved branches, so cascade's own branch runner votes and stops (first
  waves, early stop at M: branches finish in the order of their recorded lengths) on what the replay of those
  records voted on. Pruning by a scorer is not replayed: the records hold no partial scores, and a scorer would read
  the filler below.
* A request allowing fewer tokens than recorded gets the recorded answer's first max_tokens tokens, ending "length";
  the answer comes last, so a cut replay carries no answer (as a real cut answer mostly would not).

The text is `tokens - 1` filler tokens without a digit, then one token `` Answer: <answer>`` that
cascade/data/grading.py reads as exactly the recorded answer (`extract` and `answer_key` alike). An answer the
grader could not read (`null`) replays as a last token without a number that names its branch, so that two of them
never vote together. The emulator streams one token per step, so usage and timing count the recorded tokens.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from cascade.data.datasets import prompts_of
from cascade.data.outcomes import BranchOutcome, TierOutcome, read_rows
from cascade.testing.fakes.answers import Answer, max_new_tokens
from cascade.testing.fakes.gpu import UNSET_MAX_TOKENS

FILLER = " step"
CUT_SLACK_TOKENS = 2  # a recorded branch this close to max_tokens was cut (sart_replay.py's `capped`)
_BRANCH_RID = re.compile(r"-c\d+-b(\d+)$")
_BRANCH_NAMES = "abcdefghijklmnopqrstuvwxyz"


class RecordError(ValueError):
    """Records that cannot be replayed: a tier missing from a file, a row without its question."""


def question_key(text: str) -> str:
    """What a question is matched by: its text with whitespace collapsed."""
    return " ".join(text.split())


def last_user_text(body: Mapping[str, Any]) -> str:
    """The text of a chat request's last user message (string content or text parts)."""
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return " ".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
            return str(content or "")
    return ""


def branch_of(body: Mapping[str, Any]) -> int:
    """The branch a request is, by its rid's ``-bBB`` (cascade/tiers/upstream.py `rid`); 0 without one."""
    match = _BRANCH_RID.search(str(body.get("rid") or ""))
    return int(match.group(1)) if match else 0


def replay_text(answer: str | None, tokens: int, branch: int = 0) -> list[str]:
    """`tokens` token pieces (at least one) whose text the grader reads as `answer`."""
    last = f" no final number in branch {_name(branch)}" if answer is None else f" Answer: {answer}"
    return [FILLER] * (max(1, tokens) - 1) + [last]


def _name(branch: int) -> str:
    name = ""
    while True:
        branch, digit = divmod(branch, len(_BRANCH_NAMES))
        name = _BRANCH_NAMES[digit] + name
        if not branch:
            return name


class RecordedAnswers:
    """An `AnswerSource` replaying one tier's records. `records`: question id -> the tier's recorded outcome;
    `questions`: question key (`question_key` of its text) -> question id."""

    def __init__(self, records: Mapping[str, TierOutcome], questions: Mapping[str, str], tier: str = "") -> None:
        missing = sorted(set(records) - set(questions.values()))
        if missing:
            raise RecordError(f"{len(missing)} recorded question(s) without their text, e.g. {missing[0]}")
        self.records = dict(records)
        self.questions = dict(questions)
        self.tier = tier

    def outcome(self, body: Mapping[str, Any]) -> tuple[str, TierOutcome]:
        """The question a request asks (its id) and its recorded outcome; ValueError when it has none."""
        text = last_user_text(body)
        qid = self.questions.get(question_key(text))
        if qid is None:
            raise ValueError(f"no recorded answer of tier `{self.tier}` for this question "
                             f"({question_key(text)[:60]!r}...): the replay never makes one up")
        return qid, self.records[qid]

    def answer(self, body: dict[str, Any]) -> Answer:
        qid, outcome = self.outcome(body)
        limit = max_new_tokens(body, UNSET_MAX_TOKENS)
        branch = branch_of(body)
        if outcome.branches:
            if branch >= len(outcome.branches):
                raise ValueError(f"question {qid} has {len(outcome.branches)} recorded branches of tier "
                                 f"`{self.tier}`; branch {branch} has none")
            recorded: BranchOutcome | TierOutcome = outcome.branches[branch]
            tokens = recorded.output_tokens or 0
            cut = tokens >= limit - CUT_SLACK_TOKENS
        else:
            recorded, tokens = outcome, outcome.output_tokens or 0
            cut = outcome.finish_reason == "length"
        answer = recorded.answer if isinstance(recorded.answer, str) else None
        pieces = replay_text(answer, tokens, branch)
        if len(pieces) > limit:
            pieces, cut = pieces[:limit], True
        return Answer([("content", p) for p in pieces], "length" if cut else "stop")


def read_tier(paths: Iterable[str | Path], tier: str) -> dict[str, TierOutcome]:
    """`tier`'s outcome per question id from outcome files, a later file's row replacing an earlier one's (e.g. a
    ladder's labels, then a run that saved the same tier's branches on some of its questions)."""
    records: dict[str, TierOutcome] = {}
    for path in paths:
        rows = [row for _, row in read_rows(path)]
        found = {row.id: row.tiers[tier] for row in rows if row.id is not None and tier in row.tiers}
        if not found:
            columns = sorted({name for row in rows for name in row.tiers})
            raise RecordError(f"{path} holds no column `{tier}`; its tiers: {', '.join(columns) or 'none'}")
        records.update(found)
    return records


def load_recorded(paths: Iterable[str | Path], tier: str, data_dir: Path | None = None) -> RecordedAnswers:
    """The replay of `tier`'s records in `paths`, their questions read in place from the shared datasets."""
    records = read_tier(paths, tier)
    prompts = prompts_of(set(records), data_dir)
    return RecordedAnswers(records, {question_key(p.prompt): qid for qid, p in prompts.items()}, tier)


def recorded_spec(spec: str) -> tuple[list[str], str]:
    """`FILE[,FILE...]:TIER` (the fake-server option) as (files, tier)."""
    files, sep, tier = spec.rpartition(":")
    if not sep or not files or not tier:
        raise RecordError(f"--recorded {spec!r}: expected OUTCOMES.jsonl[,MORE.jsonl]:TIER")
    return files.split(","), tier

