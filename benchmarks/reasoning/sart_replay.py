"""Replay saved self-consistency branches under SART's rules, offline, to choose N, M, alpha, beta, K.

A live `cascade bench branches` run takes an hour per method on the CPU engine; this replays the
branches such a run saved (`--save-branches FILE`, every branch of every question, run to completion)
under the branch runner's rules in a few seconds, so a grid of settings can be compared before one
of them is measured live.

Model of time (stated, not hidden): branches of one request advance in lockstep, one token per step
each (what a continuous-batching engine does with branches admitted together). A branch's partial
text after t tokens is the first t tokens of its saved text (Qwen tokenizer of the embedded tier).
Rules are the runner's, by the same functions (cascade/branches/sart.py `to_prune`, `vote`):
  * every K completed reasoning steps (paragraphs) a branch is scored by the CPU scorer (--scorer
    heuristic, the default) or a model judging its steps (--scorer verifier:MODEL[:PROMPT],
    cascade/branches/verifier.py, run in this process as `cascade scorer-server` runs it; its scores are
    kept in --scores-cache, so a rerun with other settings scores nothing again);
  * phase 1 (nothing finished): prune live branches scoring < alpha, lowest first, at most beta,
    never the last live one;
  * the first finished branch's final score is alpha'; phase 2 prunes live branches scoring < alpha'
    (at their latest score);
  * early stop once M branches finished; majority vote over finished branches (answers cut by
    max_tokens only if nothing else finished), ties by best score, then the shorter branch.
Reported per setting: accuracy of the voted answer, decode tokens (all branches, pruned and stopped
included) and lockstep latency (tokens until the request ends), each also as a ratio of
self-consistency's on the same questions (N branches to completion). Branch order within a question
is the saved order (seeded sampling): the first N saved branches of each question are used.

`--rows FILE --tier NAME` (one setting: single --m, --alpha, --beta, --k values; pruning when alpha and beta are
set) also writes one outcome row per question, as `cascade label` writes them (cascade/data/outcomes.py: the voted
answer, whether it is right, the chosen branch's tokens, all branches' decode tokens; no text): the tier's label at
that setting, derived from branches already run instead of running the tier again.

`--outcomes FILE` replays branch outcomes without their text (benchmarks/reasoning/branch_outcomes.py writes them, and
such files are committed under models/outcomes/): each branch's answer, correctness and tokens. Nothing can be scored,
so only the settings without pruning replay from them (early stop at M, self-consistency, adaptive; --alpha 0
--beta 0), to the same numbers as from the branches' text, except that a branch whose grader found no number
votes as "no answer" (from its text, its last line would be its key).

Out of sample: the best of a grid replayed on the questions it is then credited with is partly luck (the served
SART setting: 0.77 as the best of 84 on 100 training questions, 0.54 replayed on test). `out_of_sample` in the JSON
is nested cross-validation over the questions (cascade/bench/out_of_fold.py; `--cv-folds` K, 5, seeded by
`--cv-seed`): on each fold, `best_within_2pts`'s criterion (fewest decode tokens within 2 accuracy points of
self-consistency) chooses among every replayed setting on the other folds, and the chosen one answers the held-out
fold. Keys: `all` (choosing among every setting) and `families` (choosing within one: `self_consistency` over the
first 1..N branches, `sart` (early stop at M < N, and pruning where branches have text), `adaptive`,
`doubling_waves`, and `greedy` with `--greedy`), each with `in_sample_best` (the criterion on all questions),
`out_of_fold` (accuracy, tokens, `minus_sc` and `minus_greedy`: paired bootstrap 95% intervals over questions,
`--resamples`, with wins and losses), `chosen_per_fold` and `distinct_choices` (how stable the choice is).

Queueing is not modelled: under load, fewer decode tokens also mean shorter waits for slots, which
only the live benchmark measures.

Usage:
  .venv/bin/python -m benchmarks.reasoning.sart_replay (--branches FILE | --outcomes FILE) [--n 4] [--m 1,2] [--alpha
      0,0.3,0.5] [--beta 0,1,2] [--k 1,2] [--max-tokens 400] [--scorer heuristic|verifier:qwen2.5-coder-0.5b]
      [--scores-cache F] [--greedy DIR] [--cv-folds 5] [--cv-seed 0] [--json-out F] [--rows F --tier NAME]
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cascade.bench.out_of_fold import Candidate, Plan, headline, report
from cascade.branches.cpu_scorer import CPUScorer
from cascade.branches.sart import Finished, Scored, next_wave, to_prune, vote, wave_settles
from cascade.branches.scoring import split_steps
from cascade.branches.verifier import PROMPTS
from cascade.data.datasets import DatasetError, prompts_by_id, prompts_of
from cascade.data.grading import extract
from cascade.data.outcomes import OutcomeRow, TierOutcome, read_rows, write_row
from cascade.engines.models import load_card, model_dir
from cascade.repo_paths import recorded_path
from cascade.testing.scripts import print_result, write_result


@dataclass
class SavedBranch:
    text: str
    correct: bool
    tokens: int
    capped: bool  # cut by max_tokens
    events: list[tuple[int, float]]  # (token position, score) at every K completed steps
    final_score: float


def step_positions(text: str, offsets: list[int]) -> list[tuple[int, int]]:
    """(token count, completed steps) at each token where the number of completed steps grows."""
    out: list[tuple[int, int]] = []
    done = 0
    for t, end in enumerate(offsets, start=1):
        steps = len(split_steps(text[:end])) - 1  # the last paragraph may still be growing
        if steps > done:
            done = steps
            out.append((t, steps))
    return out


class StepScorer:
    """`score_steps(steps, question)` of the heuristic, or of a verifier model (memoised, and kept in `cache`)."""

    def __init__(self, spec: str, cache: Path | None = None) -> None:
        self.spec = spec
        self.memo: dict[str, float] = {}
        self.ms: list[float] = []  # the model's calls in this run
        self.model = None
        self._file = None
        if spec == "heuristic":
            self.cpu = CPUScorer()
            return
        kind, _, rest = spec.partition(":")
        name, _, prompt = rest.partition(":")
        style = next((p for p in PROMPTS if p == (prompt or "judge")), None)
        if kind != "verifier" or not name or style is None:
            raise SystemExit(f"--scorer: heuristic or verifier:MODEL[:PROMPT] (PROMPT: {', '.join(PROMPTS)}), "
                             f"not {spec!r}")
        from cascade.engines.scorer_server import load_verifier, resolve_model

        self.model = load_verifier(resolve_model(name), prompt=style)
        if cache is not None:
            for line in cache.read_text().splitlines() if cache.exists() else []:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a stopped run
                if row.get("scorer") == spec:
                    self.memo[row["key"]] = row["score"]
            self._file = cache.open("a")

    def score_steps(self, steps: list[str], question: str) -> float:
        if self.model is None:
            return self.cpu.score_steps(steps, question)
        key = hashlib.sha256("\0".join([question, *steps]).encode()).hexdigest()[:24]
        if key not in self.memo:
            t0 = time.perf_counter()
            self.memo[key] = self.model.score([(question, steps)])[0].score
            self.ms.append((time.perf_counter() - t0) * 1e3)
            if self._file is not None:
                self._file.write(json.dumps({"scorer": self.spec, "key": key, "score": self.memo[key]}) + "\n")
                self._file.flush()
        return self.memo[key]

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def load(path: Path, n: int, max_tokens: int, k_values: list[int], scorer: StepScorer
         ) -> dict[int, dict[str, list[SavedBranch]]]:
    """Saved branches by K and question id, with their score events (the scorer sees the question)."""
    from tqdm import tqdm
    from transformers import AutoTokenizer  # heavy import: only here

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir(load_card("qwen2.5-coder-0.5b"))))
    by_question: dict[str, list[dict]] = defaultdict(list)
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            if row.get("method", "self_consistency") == "self_consistency":  # all N of a question, none settled early
                by_question[row["id"]].append(row)
    out: dict[int, dict[str, list[SavedBranch]]] = {k: {} for k in k_values}
    question = prompts_by_id(set(by_question))
    for qid, rows in tqdm(by_question.items(), desc=f"scoring ({scorer.spec})", unit="question", file=sys.stderr,
                          disable=scorer.model is None):
        q = question.get(qid, "")
        rows = sorted(rows, key=lambda r: r["branch"])[:n]
        if len(rows) < n:
            continue  # a question with a failed branch: not comparable
        parsed = []
        for row in rows:
            text = row["text"]
            enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
            offsets = [end for _, end in enc["offset_mapping"]]
            parsed.append((row, text, offsets, step_positions(text, offsets),
                           scorer.score_steps(split_steps(text), q)))
        for k in k_values:
            out[k][qid] = [
                SavedBranch(text=text, correct=bool(row["correct"]), tokens=len(offsets),
                            capped=len(offsets) >= max_tokens - 2, final_score=final,
                            events=[(t, scorer.score_steps(split_steps(text[: offsets[t - 1]])[:steps], q))
                                    for t, steps in positions if steps % k == 0])
                for row, text, offsets, positions, final in parsed
            ]
    return out


def load_outcomes(path: Path, n: int, max_tokens: int) -> dict[str, list[SavedBranch]]:
    """Branch outcomes (benchmarks/reasoning/branch_outcomes.py: answer, correct, tokens; no text) by question id. The
    answer stands in for the text: the vote keys it as it would the text's final number."""
    out: dict[str, list[SavedBranch]] = {}
    try:
        rows = read_rows(path)
    except DatasetError as exc:
        raise SystemExit(f"sart_replay: {exc}") from None
    for number, row in rows:
        tiers = [t for t in row.tiers.values() if t.branches]
        if len(tiers) != 1 or row.id is None:
            raise SystemExit(f"{path}:{number}: expected a row id and one tier with branches")
        saved = (tiers[0].branches or [])[:n]
        if len(saved) < n:
            continue  # a question with a failed branch: not comparable
        out[row.id] = [SavedBranch(text=b.answer or "", correct=b.correct, tokens=b.output_tokens,
                                   capped=b.output_tokens >= max_tokens - 2, events=[], final_score=0.0)
                       for b in saved]
    return out


@dataclass
class Outcome:
    correct: bool
    tokens: int
    latency: int
    chosen: int = 0  # the voted branch


@dataclass
class Run:
    """Where each branch of one lockstep run ended: its state, the token it stopped at, its last score."""
    state: list[str]
    ended_at: list[int]
    score: list[float | None]
    end: int  # the position the request ended at


def as_finished(index: int, branch: SavedBranch, score: float | None = None) -> Finished:
    """A saved branch as the vote sees it (complete unless max_tokens cut it)."""
    return Finished(index, branch.text, score, branch.tokens, not branch.capped)


def replay(branches: list[SavedBranch], m: int, alpha: float, beta: int, prune: bool) -> Outcome:
    run = run_lockstep(branches, m, alpha, beta, prune)
    # Without pruning the runner has no scorer (cascade/branches/runner.py): its ties go to the shorter branch.
    result = vote([as_finished(i, b, run.score[i] if prune else None)
                   for i, b in enumerate(branches) if run.state[i] == "finished"])
    return Outcome(correct=branches[result.chosen].correct, tokens=sum(run.ended_at), latency=run.end,
                   chosen=result.chosen)


def run_lockstep(branches: list[SavedBranch], m: int, alpha: float, beta: int, prune: bool) -> Run:
    n = len(branches)
    state = ["running"] * n
    ended_at = [b.tokens for b in branches]
    score: list[float | None] = [None] * n
    first_finished: float | None = None
    pruned1 = 0
    # Events in lockstep order; at one position finishes come before scores (the end is read first).
    timeline = sorted([(b.tokens, 0, i, b.final_score) for i, b in enumerate(branches)]
                      + [(t, 1, i, s) for i, b in enumerate(branches) for t, s in b.events if t < b.tokens])
    end = max(b.tokens for b in branches)

    def live() -> list[int]:
        return [i for i in range(n) if state[i] == "running"]

    def cut(i: int, t: int, why: str) -> None:
        state[i] = why
        ended_at[i] = t

    for t, kind, i, value in timeline:
        if state[i] != "running":
            continue
        if kind == 0:
            state[i] = "finished"
            score[i] = value
            if first_finished is None:
                first_finished = value
        else:
            score[i] = value
        if prune:
            victims = to_prune([Scored(j, score[j]) for j in live()], alpha, beta, pruned1, first_finished)
            for j in victims:
                cut(j, t, "pruned")
            pruned1 += len(victims) if first_finished is None else 0
        if sum(s == "finished" for s in state) >= m or not live():
            for j in live():
                cut(j, t, "stopped")
            end = t
            break
    return Run(state=state, ended_at=ended_at, score=score, end=end)


def replay_adaptive(branches: list[SavedBranch], wave: int, m: int = 0, margin: int = 0) -> Outcome:
    """`adaptive` (self-consistency in waves, cascade/branches/runner.py): the first `wave` branches in lockstep;
    when they settle the request (`wave_settles`: all of them end on their own with one answer, or with `margin`
    the leading answer is that many votes ahead) the finished ones vote; otherwise the next wave (`next_wave`:
    the rest, or twice as many with `margin`) starts once this one has ended and, as in the runner, the request
    stops when `m` branches in all (0: every one) have finished; those vote (no pruning)."""
    n, m = len(branches), m or len(branches)
    done: list[Finished] = []
    tokens = latency = launched = 0
    size = wave
    while True:
        batch = branches[launched:size]
        run = run_lockstep(batch, m=m - len(done), alpha=0.0, beta=0, prune=False)
        done += [as_finished(launched + i, b) for i, b in enumerate(batch) if run.state[i] == "finished"]
        tokens, latency, launched = tokens + sum(run.ended_at), latency + run.end, size
        if launched == n or len(done) >= m or wave_settles(launched, done, margin):
            break
        size = next_wave(launched, n, margin)
    result = vote(done)
    return Outcome(correct=branches[result.chosen].correct, tokens=tokens, latency=latency, chosen=result.chosen)


def summarize(outcomes: list[Outcome], baseline: list[Outcome]) -> dict[str, float]:
    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    acc, tok, lat = (mean([float(o.correct) for o in outcomes]), mean([o.tokens for o in outcomes]),
                     mean([o.latency for o in outcomes]))
    return {"accuracy": round(acc, 4), "tokens_mean": round(tok, 1), "lockstep_latency_tokens": round(lat, 1),
            "tokens_vs_sc": round(tok / mean([o.tokens for o in baseline]), 3),
            "latency_vs_sc": round(lat / mean([o.latency for o in baseline]), 3),
            "accuracy_minus_sc": round(acc - mean([float(o.correct) for o in baseline]), 4)}


def write_rows(path: Path, tier: str, by_question: dict[str, list[SavedBranch]],
               run: Callable[[list[SavedBranch]], Outcome]) -> None:
    """Each question's replayed answer as an outcome row of `tier` (the voted answer, no text)."""
    references = {i: p.reference for i, p in prompts_of(set(by_question)).items()}
    with path.open("wb") as out:
        for qid, branches in by_question.items():
            o = run(branches)
            chosen = branches[o.chosen]
            reference = references.get(qid)
            answer = extract(chosen.text, reference) if reference else None
            outcome = TierOutcome(correct=o.correct, answer=answer, output_tokens=chosen.tokens,
                                  finish_reason="length" if chosen.capped else "stop", decode_tokens=o.tokens)
            write_row(out, OutcomeRow(id=qid, dataset=qid.rpartition(":")[0], tiers={tier: outcome}))


def candidate(setting: dict[str, object], outcomes: list[Outcome]) -> Candidate:
    return Candidate(setting, np.array([o.correct for o in outcomes], dtype=float),
                     np.array([o.tokens for o in outcomes], dtype=float),
                     np.array([o.latency for o in outcomes], dtype=float))


def read_greedy(path: Path) -> dict[str, Outcome]:
    """Greedy answers by question (`cascade bench branches --methods vanilla` records; a resumed run's later
    record counts): one branch, so its lockstep latency is its decode tokens."""
    out: dict[str, Outcome] = {}
    for line in (path / "requests.jsonl" if path.is_dir() else path).read_text().splitlines():
        row = json.loads(line) if line.strip() else {}
        if row.get("method") == "vanilla" and row.get("error") is None:
            out[row["id"]] = Outcome(correct=bool(row["correct"]), tokens=row["decode_tokens"],
                                     latency=row["decode_tokens"])
    return out


def out_of_sample(candidates: list[Candidate], sc: list[Outcome], questions: list[str],
                  args: argparse.Namespace) -> dict[str, Any]:
    """Nested cross-validation of the choice (cascade/bench/out_of_fold.py), on the questions that also have a
    greedy answer when --greedy is given."""
    greedy = read_greedy(args.greedy) if args.greedy else {}
    keep = np.array([not greedy or q in greedy for q in questions])
    if args.cv_folds < 2 or keep.sum() < args.cv_folds:
        return {"skipped": f"{int(keep.sum())} questions, --cv-folds {args.cv_folds}"}

    def cut(c: Candidate) -> Candidate:
        return Candidate(c.setting, c.correct[keep], c.tokens[keep], c.latency[keep])

    baseline = candidate({"family": "greedy"}, [greedy[q] for q in questions if q in greedy]) if greedy else None
    plan = Plan(k=args.cv_folds, seed=args.cv_seed, points=args.cv_points, resamples=args.resamples)
    return {"greedy_file": recorded_path(args.greedy) if args.greedy else None,
            **report([cut(c) for c in candidates], cut(candidate({"family": "self_consistency", "n": args.n}, sc)),
                     baseline, plan)}


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--branches", type=Path, help="JSONL from cascade bench branches --save-branches")
    source.add_argument("--outcomes", type=Path, help="branch outcomes without text (reasoning/branch_outcomes.py):"
                        " settings without pruning only (--alpha 0 --beta 0)")
    p.add_argument("--n", type=int, default=4, help="branches per request (the first N saved of each question)")
    p.add_argument("--m", default="1,2", help="comma-separated M values")
    p.add_argument("--alpha", default="0,0.3,0.4,0.5,0.6", help="comma-separated phase-1 thresholds")
    p.add_argument("--beta", default="0,1,2,3", help="comma-separated phase-1 prune caps")
    p.add_argument("--k", default="1,2", help="comma-separated scoring intervals (steps)")
    p.add_argument("--max-tokens", type=int, default=400, help="the run's max_tokens (to spot capped branches)")
    p.add_argument("--top", type=int, default=15, help="settings to print, best tokens first among those "
                                                       "within 2 accuracy points of self-consistency")
    p.add_argument("--scorer", default="heuristic", help="heuristic (the CPU scorer) or verifier:MODEL[:PROMPT] "
                   "(an embedded model judging the steps, e.g. verifier:qwen2.5-coder-0.5b)")
    p.add_argument("--scores-cache", type=Path, help="JSONL of a verifier's scores, reused and appended to")
    p.add_argument("--first-wave", default="", help="comma-separated first waves to replay `adaptive` with "
                   "(self-consistency that stops when the first W branches agree), e.g. 2,3")
    p.add_argument("--wave-m", default="", help="comma-separated M values to replay each first wave with too "
                   "(the second wave stops when M branches in all have finished), e.g. 4,5,6")
    p.add_argument("--wave-margin", default="", help="comma-separated wave margins to replay each first wave with "
                   "too (doubling waves W, 2W, ... N until the leading answer is that many votes ahead), e.g. 2,3")
    p.add_argument("--greedy", type=Path, help="the same questions answered greedily (bench --out DIR of "
                   "--methods vanilla, or its requests.jsonl): out-of-fold results are paired against it")
    p.add_argument("--cv-folds", type=int, default=5, help="folds of the nested cross-validation (0: none)")
    p.add_argument("--cv-points", type=float, default=0.02, help="the criterion's slack: fewest tokens among "
                   "settings within this much accuracy of self-consistency")
    p.add_argument("--cv-seed", type=int, default=0, help="seed of the folds and of the bootstrap")
    p.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples of the paired intervals")
    p.add_argument("--json-out", type=Path)
    p.add_argument("--rows", type=Path, help="with one setting: write each question's outcome row here (JSONL)")
    p.add_argument("--rows-method", choices=("sart", "adaptive"), default="sart", help="the setting --rows "
                   "replays: sart (one --m, --alpha, --beta, --k) or adaptive (one --first-wave, at most one "
                   "--wave-m and --wave-margin)")
    p.add_argument("--tier", help="with --rows: the tier name the rows are keyed by")
    args = p.parse_args()
    ks = [int(x) for x in args.k.split(",")]
    waves, wave_ms, margins = ([int(x) for x in text.split(",") if x]
                               for text in (args.first_wave, args.wave_m, args.wave_margin))
    if args.rows is not None and args.tier is None:
        p.error("--rows needs --tier")
    if args.rows is not None and args.rows_method == "sart" and (len(ks) > 1 or "," in args.m + args.alpha + args.beta):
        p.error("--rows needs exactly one value each of --m, --alpha, --beta and --k")
    if args.rows is not None and args.rows_method == "adaptive" and (
            len(waves) != 1 or len(wave_ms) > 1 or len(margins) > 1):
        p.error("--rows-method adaptive needs exactly one --first-wave and at most one --wave-m and --wave-margin")
    if args.outcomes is not None and (any(floats(args.alpha) + floats(args.beta)) or args.scorer != "heuristic"):
        p.error("--outcomes holds no text to score: pass --alpha 0 --beta 0 (early stop and adaptive only)")
    scorer = StepScorer(args.scorer, args.scores_cache)
    try:
        if args.outcomes is not None:
            data = dict.fromkeys(ks, load_outcomes(args.outcomes, args.n, args.max_tokens))
        else:
            data = load(args.branches, args.n, args.max_tokens, ks, scorer)
    finally:
        scorer.close()
    questions = sorted(data[ks[0]])
    source_file = args.outcomes or args.branches
    if not questions:
        print(f"no question in {source_file} has {args.n} saved branches", file=sys.stderr)
        return 2
    sc = [replay(data[ks[0]][q], m=args.n, alpha=0.0, beta=0, prune=False) for q in questions]
    results = []
    # Self-consistency over the first n of the N branches, n = 1..N: a family of its own for out-of-fold choice.
    candidates = [candidate({"family": "self_consistency", "n": n},
                            [replay(data[ks[0]][q][:n], m=n, alpha=0.0, beta=0, prune=False) for q in questions])
                  for n in range(1, args.n + 1)]
    for m, alpha, beta, k, prune in itertools.product([int(x) for x in args.m.split(",")], floats(args.alpha),
                                                      [int(x) for x in args.beta.split(",")], ks,
                                                      (False,) if args.outcomes else (False, True)):
        if not prune and (alpha or beta or k != ks[0]):
            continue  # early stop only: one row per M
        if prune and ((alpha == 0) != (beta == 0)):
            continue
        outcomes = [replay(data[k][q], m=m, alpha=alpha, beta=beta, prune=prune) for q in questions]
        results.append({"m": m, "alpha": alpha, "beta": beta, "k": k, "prune": prune,
                        **summarize(outcomes, sc)})
        if prune or m < args.n:  # without pruning, M = N is self-consistency: that family has it
            candidates.append(candidate({"family": "sart", "n": args.n, "m": m, "alpha": alpha, "beta": beta,
                                         "k": k, "prune": prune}, outcomes))
    adaptive = []
    for w, m, d in itertools.product(waves, [0, *wave_ms], [0, *margins]):
        if 2 <= w < args.n and (m == 0 or w < m < args.n):
            outcomes = [replay_adaptive(data[ks[0]][q], w, m, d) for q in questions]
            adaptive.append({"first_wave": w, "m": m or args.n, "wave_margin": d, **summarize(outcomes, sc)})
            candidates.append(candidate({"family": "doubling_waves" if d else "adaptive", "n": args.n,
                                         "first_wave": w, "m": m or args.n, "wave_margin": d}, outcomes))
    cross_validated = out_of_sample(candidates, sc, questions, args)
    if "all" in cross_validated:
        print(headline(cross_validated), file=sys.stderr)
    scoring = {"calls": len(scorer.ms), "ms_mean": round(sum(scorer.ms) / len(scorer.ms), 1),
               "ms_p95": round(sorted(scorer.ms)[int(0.95 * (len(scorer.ms) - 1))], 1)} if scorer.ms else {}
    payload = {"questions": len(questions), "n": args.n, "branches_file": recorded_path(source_file),
               "scorer": args.scorer, "scoring_this_run": scoring,
               "self_consistency": summarize(sc, sc),
               "best_within_2pts": sorted([r for r in results if r["accuracy_minus_sc"] >= -0.02],
                                          key=lambda r: r["tokens_vs_sc"])[: args.top],
               "adaptive": adaptive,
               "all": results,
               "out_of_sample": cross_validated}
    if args.rows is not None:
        def setting(bs: list[SavedBranch]) -> Outcome:
            if args.rows_method == "adaptive":  # --m, --alpha, --beta may hold lists then: unread
                return replay_adaptive(bs, waves[0], (wave_ms or [0])[0], (margins or [0])[0])
            alpha = float(args.alpha)
            return replay(bs, m=int(args.m), alpha=alpha, beta=int(args.beta), prune=bool(alpha and int(args.beta)))

        write_rows(args.rows, args.tier, {q: data[ks[0]][q] for q in questions}, setting)
    if args.json_out:
        write_result(args.json_out, json.dumps(payload, indent=1))
    print_result({k: v for k, v in payload.items() if k != "all"}, None, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
