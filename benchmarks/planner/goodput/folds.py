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

from cascade.data.datasets import prompts_of
from cascade.data.outcomes import OutcomeRow, read_rows, write_row
from cascade.data.records import Prompt
from cascade.testing.twin import V8, V8_TWIN

TIERS = [t.tier for t in V8_TWIN]
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


def split(ids: list[str], seed: int) -> tuple[list[str], list[str]]:
    order = np.random.default_rng(seed).permutation(sorted(ids))
    half = len(order) // 2
    return sorted(order[:half].tolist()), sorted(order[half:].tolist())


def build(work: Path, seed: int = 0) -> list[Fold]:
    """The two folds under `work` (reused when already there: training takes a minute)."""
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
        planning = base / "planning.jsonl"
        if not planning.exists():
            _planning_rows(planning, [rows[q] for q in trained], seed)
        accuracy = {t: float(np.mean([bool(rows[q].tiers[t].correct) for q in trained])) for t in TIERS}
        folds.append(Fold(name=name, questions=served, trained_on=trained, dataset=dataset, router=router,
                          planning_rows=planning, accuracy=accuracy))
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


def _planning_rows(path: Path, rows: list[OutcomeRow], seed: int) -> None:
    """`rows` for the planner: difficulty is the route score of a router that never saw the row (cross-validated
    within these rows). The reasoning tier is one answer as long as all the branches its adaptive vote decoded (the
    recorded `decode_tokens`): the planner models fixed widths (N, M) and the records hold the adaptive vote's
    branches only as far as it ran them (two where the first wave agreed), so it plans the tokens the tier decodes,
    not their overlap in time."""
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
    with path.open("wb") as sink:
        for row in rows:
            tiers = dict(row.tiers)
            reason = tiers[TIERS[-1]]
            decoded = reason.decode_tokens or reason.output_tokens
            tiers[TIERS[-1]] = msgspec.structs.replace(reason, output_tokens=decoded)
            write_row(sink, msgspec.structs.replace(row, tiers=tiers, difficulty=round(score[row.id or ""], 6)))
