"""Two folds of the twin's questions, so that every routing choice is scored on questions it was not made on.

The twin replays the 384 questions of models/outcomes/gsm8k-train-embedded-v8.jsonl (cascade/testing/twin.py); the
committed router was trained on all of them. So the questions are split in two by a seeded permutation, and for each
fold a router is trained on the other fold (`cascade router train`, the committed router's feature blocks), its
operating points calibrated there, and the planner fed there (rows with the router's out-of-fold route score as their
difficulty, the signal the gateway routes by: cascade/router/operating.py). A fold's questions are then served by the
gateway holding the other fold's router and plan.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from cascade.config import load_config
from cascade.data.datasets import prompts_of
from cascade.data.outcomes import BranchOutcome, OutcomeRow, read_rows, write_row
from cascade.data.records import Prompt
from cascade.testing.fakes.recorded import read_tier
from cascade.testing.twin import EMBEDDED_LADDER, V8, V8_TWIN

TIERS = [t.tier for t in V8_TWIN]
# The reasoning tier's vote in the planning rows: "waves", its recorded branches, which the planner votes and times
# as the ladder serves them (adaptive consistency's two waves, cascade/optimizer/widths.py); "sequence", one answer
# as long as all the tokens its branches decoded (how runs before the planner modelled waves were planned).
VOTES = ("waves", "sequence")
FEATURES = "lexical,steps"  # the committed router's blocks (models/routers/embedded-gsm8k/card.json)


@dataclass(frozen=True)
class Fold:
    """Fold `name`: its questions (served) and what was fitted on the other fold's questions."""

    name: str
    questions: list[str]  # row ids served in this fold
    trained_on: list[str]  # row ids the router and the plan saw
    dataset: Path  # loadgen's JSONL of this fold's questions (id, prompt, reference), written at run time
    router: Path  # the router trained on `trained_on`
    planning_rows: Path  # `trained_on`'s rows for the planner (`_planning_rows`)
    accuracy: dict[str, float]  # per tier, on `trained_on`
    vote: str = "waves"  # how the planning rows give the reasoning tier's vote (VOTES)


def split(ids: list[str], seed: int) -> tuple[list[str], list[str]]:
    order = np.random.default_rng(seed).permutation(sorted(ids))
    half = len(order) // 2
    return sorted(order[:half].tolist()), sorted(order[half:].tolist())


def build(work: Path, seed: int = 0, vote: str = "waves") -> list[Fold]:
    """The two folds under `work` (reused when already there: training takes a minute), their planning rows giving
    the reasoning tier's vote as `vote` says (VOTES)."""
    rows = {row.id: row for _, row in read_rows(V8) if row.id is not None}
    a, b = split(list(rows), seed)
    prompts = prompts_of(set(rows))
    folds = []
    for name, served, trained in (("A", a, b), ("B", b, a)):
        base = work / f"fold-{name}"
        base.mkdir(parents=True, exist_ok=True)
        dataset = write_questions(base / "questions.jsonl", served, prompts)
        train_file = base / "train.jsonl"
        with train_file.open("wb") as sink:
            for q in trained:
                write_row(sink, rows[q])
        router = base / "router"
        if not (router / "card.json").exists():
            _train(train_file, router, seed)
        planning = base / ("planning.jsonl" if vote == "sequence" else f"planning-{vote}.jsonl")
        if not planning.exists():
            _planning_rows(planning, [rows[q] for q in trained], seed, vote)
        accuracy = {t: float(np.mean([bool(rows[q].tiers[t].correct) for q in trained])) for t in TIERS}
        folds.append(Fold(name=name, questions=served, trained_on=trained, dataset=dataset, router=router,
                          planning_rows=planning, accuracy=accuracy, vote=vote))
    return folds


def write_questions(path: Path, ids: list[str], prompts: dict[str, Prompt] | None = None) -> Path:
    """loadgen's JSONL of the questions `ids` (id, prompt, reference), their texts read in place."""
    prompts = prompts or prompts_of(set(ids))
    path.write_bytes(b"".join(msgspec.json.encode({"id": q, "prompt": prompts[q].prompt,
                                                   "reference": prompts[q].reference}) + b"\n" for q in ids))
    return path


def _train(outcomes: Path, out: Path, seed: int) -> None:
    argv = [sys.executable, "-m", "cascade.cli", "router", "train", "--outcomes", str(outcomes),
            "--tiers", ",".join(TIERS), "--features", FEATURES, "--seed", str(seed), "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"router training failed: {done.stderr[-2000:]}")


def _planning_rows(path: Path, rows: list[OutcomeRow], seed: int, vote: str) -> None:
    """`rows` for the planner: difficulty is the route score of a router that never saw the row (cross-validated
    within these rows). The reasoning tier's vote (`vote`): "waves", the branches the twin replays (`vote_branches`)
    for the planner to vote and time in the ladder's waves; "sequence", one answer as long as all the branches its
    adaptive vote decoded (the recorded `decode_tokens`)."""
    from cascade.router.operating import route_score
    from cascade.router.outcomes import load_outcomes
    from cascade.router.train.pipeline import TrainOptions, out_of_fold_p_fail

    plain = path.with_suffix(".rows.jsonl")
    with plain.open("wb") as sink:
        for row in rows:
            write_row(sink, row)
    outcomes = load_outcomes(plain, TIERS)
    p_fail = out_of_fold_p_fail(outcomes, TrainOptions(features=tuple(FEATURES.split(",")), seed=seed))
    score = dict(zip(outcomes.ids, route_score(p_fail).tolist(), strict=True))
    branches = vote_branches([row.id or "" for row in rows]) if vote == "waves" else {}
    with path.open("wb") as sink:
        for row in rows:
            tiers = dict(row.tiers)
            reason = tiers[TIERS[-1]]
            if vote == "waves":
                reason = msgspec.structs.replace(reason, branches=branches[row.id or ""])
            else:
                reason = msgspec.structs.replace(reason, output_tokens=reason.decode_tokens or reason.output_tokens)
            tiers[TIERS[-1]] = reason
            write_row(sink, msgspec.structs.replace(row, tiers=tiers, difficulty=round(score[row.id or ""], 6)))


def reasoning_width() -> tuple[int, int, int]:
    """The reasoning tier's (N, M, first wave), as the ladder the twin serves configures it."""
    settings = next(t for t in load_config(EMBEDDED_LADDER).tiers if t.name == TIERS[-1]).branches
    return settings.n, settings.m, settings.first_wave


def vote_branches(ids: list[str]) -> dict[str, list[BranchOutcome]]:
    """The reasoning tier's N branches per question as the twin replays them (cascade/testing/fakes/recorded.py):
    its recorded branches; where a first wave agreed and only it was recorded, the rest as copies of it (never
    launched: the wave settles it, whatever they hold); where only the question's outcome was recorded, that answer
    on every branch."""
    n = reasoning_width()[0]
    records = read_tier(next(t for t in V8_TWIN if t.tier == TIERS[-1]).records, TIERS[-1])
    out = {}
    for q in ids:
        record = records[q]
        recorded = list(record.branches or [])
        if not recorded:
            answer = record.answer if isinstance(record.answer, str) else None
            recorded = [BranchOutcome(answer=answer, correct=bool(record.correct),
                                      output_tokens=max(1, record.output_tokens or 1))]
        out[q] = (recorded * n)[:n] if len(recorded) < n else recorded[:n]
    return out
