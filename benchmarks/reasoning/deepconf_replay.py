"""DeepConf on the reasoning tier, replayed offline: the served rule (adaptive, first wave 2) with the learned stop
and the confidence vote, against self-consistency, on saved branches scored by benchmarks/reasoning/branch_logprobs.py.

The reasoning tier serves adaptive self-consistency (cascade/branches/runner.py): two branches first; when they
agree, their answer stands; otherwise the other six start and all eight vote. DeepConf (issue 51 item 4) adds,
once the first wave disagrees: a stopping level learned from the first wave (`confidence_keep`: the level that
share of its branches reached at their weakest group), below which a later branch is stopped as it decodes, and a
vote weighted by (`aggregation = "confidence"`) or filtered to (`vote_keep`) the surest branches. This replays
exactly those rules (the runner's own: cascade.branches.confidence.TraceConfidence, quantile, and
cascade.branches.sart.vote / wave_agrees) on every question whose eight branches were all saved and scored: the
later branches decode in lockstep (one token each per step), a branch whose group confidence falls below the
level is stopped there (its tokens up to then are spent), never the last live one.

Besides the level each question learns from its own first wave (`confidence_keep`), `--fixed-quantiles` adds
fixed levels: quantiles of every question's first-wave confidence pooled (two traces of one question may be too few
to learn a level from; these levels read no correctness, but do read the held-out questions' confidences).

Settings are chosen out of sample: nested cross-validation over questions (cascade/bench/out_of_fold.py: on each
fold, the fewest tokens within --cv-points of self-consistency on the other folds, scored on the held-out fold),
so the report's out-of-fold line is what choosing this way serves; the in-sample best is printed beside it.
Tokens per question are every branch's (the first wave's two, plus what the later ones decoded before they
ended). Questions where the first wave agreed cost the same under every setting here and are not in the
comparison (their count is reported); so "tokens vs self-consistency" is on the questions that reach a second
wave, where DeepConf acts.

Goal (issue 51): decode tokens <= 0.5x self-consistency's at accuracy >= self-consistency - 1 point, out of
sample, with the paired interval. That goal is over all questions, so with `--outcomes` (the run's label rows) and
`--waves` (which questions ended after their first wave: benchmarks/reasoning/branch_logprobs.py --waves) the report
adds `all_questions`: the second-wave figures mixed with the questions whose first wave agreed, where every setting here
answers as the label did at the label's decode tokens, and self-consistency is taken to answer the same (the
first wave's answer: on 167 training and 100 test questions replayed with all 8 branches it did on every one) at
n / first_wave times those tokens (the other branches being samples of the same question): an estimate, marked
as one. Second-wave questions not scored yet are left out and counted.

Held out (`--held-out FILE`: a run whose every question has all N branches scored, e.g. a self-consistency run of
`cascade bench branches --save-branches` on GSM8K test, scored by reasoning/branch_logprobs.py): the settings are chosen
on --logprobs' second-wave questions by the criterion above (all of them, no folds), then the chosen setting, the best
DeepConf setting alone and the served adaptive rule replay on every held-out question (first waves that agree
included: with all N saved nothing is estimated), beside self-consistency on the same branches. `--also
NAME=FILE[:TIER]` adds other methods' per-question outcomes on those questions (benchmarks/reasoning/sart_replay.py
--rows on the same branches: SART; a `cascade bench` requests.jsonl), `--greedy FILE[:TIER]` the paired greedy line:
one table, every method on the same questions, none of them chosen on these. Usage:

    L=models/outcomes/qwen15-train-label
    .venv/bin/python -m benchmarks.reasoning.deepconf_replay --logprobs $L/reason-adaptive-logprobs.jsonl.gz \\
        --outcomes models/outcomes/gsm8k-train-embedded-reason-adaptive.jsonl --waves $L/reason-adaptive-waves.jsonl \\
        --json-out R.json
    # held out: choose on the training label's branches, score on a test run's
    T=models/outcomes/qwen15-test-bench
    .venv/bin/python -m benchmarks.reasoning.deepconf_replay --logprobs $L/reason-adaptive-logprobs.jsonl.gz \\
        --held-out $T/sc-s1/logprobs.jsonl.gz --greedy $T/vanilla/requests.jsonl \\
        --also sart=$T/sc-s1/sart-rows.jsonl:qwen2.5-coder-1.5b-reason --json-out R.json
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cascade.bench.out_of_fold import Candidate, Plan, choose, headline, measures, report
from cascade.bench.runs import json_rows
from cascade.branches.confidence import TraceConfidence, quantile
from cascade.branches.sart import Finished, vote, wave_agrees
from cascade.repo_paths import recorded_path, recorded_values
from cascade.testing.scripts import print_result

KINDS = ("logprob", "certainty", "certainty5")  # the per-token value the trace is read from


@dataclass(frozen=True)
class Scored:
    """A saved branch with its per-token values (benchmarks/reasoning/branch_logprobs.py), no text."""

    answer: str | None
    correct: bool
    tokens: int
    capped: bool
    values: dict[str, list[float]]


@dataclass(frozen=True)
class Setting:
    keep: float  # confidence_keep (0: no learned stop)
    group: int  # confidence_group
    kind: str  # which per-token value
    aggregation: str  # majority | confidence
    vote_keep: float
    # A fixed stopping level instead of the one learned from the question's first wave (keep 0 then): a level
    # from many questions' first waves, where two traces of one question may be too few to learn from.
    level: float | None = None
    level_quantile: float | None = None  # the quantile of first-wave confidences the level is (for the report)

    def describe(self) -> dict[str, Any]:
        deepconf = self.keep or self.aggregation != "majority" or self.vote_keep < 1 or self.level is not None
        described: dict[str, Any] = {
            "family": "deepconf" if deepconf else "adaptive", "first_wave": 2, "confidence_keep": self.keep,
            "confidence_group": self.group, "value": self.kind, "aggregation": self.aggregation,
            "vote_keep": self.vote_keep}
        if self.level is not None:
            described |= {"fixed_level": round(self.level, 4), "fixed_level_quantile": self.level_quantile}
        return described


def load(path: Path, n: int, max_tokens: int) -> dict[str, list[Scored]]:
    """Questions whose branches 0..n-1 are all scored (seed 0 runs first when a question was run twice)."""
    by_question: dict[tuple[str, int], dict[int, Scored]] = defaultdict(dict)
    for row in json_rows(path):  # a file cut by an interrupted run reads up to the cut
        values = {kind: row[kind] for kind in KINDS}
        by_question[(row["id"], row.get("seed", 0))][row["branch"]] = Scored(
            answer=row.get("answer"), correct=bool(row["correct"]), tokens=int(row["tokens"]),
            capped=int(row["tokens"]) >= max_tokens - 2, values=values)
    out: dict[str, list[Scored]] = {}
    for (qid, _), branches in sorted(by_question.items()):
        if qid not in out and all(i in branches for i in range(n)):
            out[qid] = [branches[i] for i in range(n)]
    return out


def finished(index: int, b: Scored, trace: TraceConfidence | None) -> Finished:
    return Finished(index, b.answer or "", None, b.tokens, not b.capped, None if trace is None else trace.weight)


def trace_of(b: Scored, s: Setting, upto: int | None = None) -> TraceConfidence:
    trace = TraceConfidence(s.group)
    trace.top_k = s.kind != "logprob"
    for value in b.values[s.kind][:upto]:
        trace.push(value)
    return trace


def replay(branches: list[Scored], s: Setting, wave: int = 2) -> tuple[bool, int]:
    """(correct, decode tokens) of one question under `s`; branches in launch order."""
    first = branches[:wave]
    tokens = sum(b.tokens for b in first)
    traces = [trace_of(b, s) for b in first]
    done = [finished(i, b, traces[i]) for i, b in enumerate(first)]
    if wave_agrees(done):
        result = vote(done)
        return branches[result.chosen].correct, tokens
    level = s.level
    if level is None and s.keep > 0:
        warm = [w for t in traces if (w := t.lowest_group) is not None]
        level = quantile(warm, 1.0 - s.keep) if warm else None
    later = list(range(wave, len(branches)))
    live = {i: TraceConfidence(s.group) for i in later}
    for i in later:
        live[i].top_k = s.kind != "logprob"
    spent = dict.fromkeys(later, 0)
    ended: dict[int, TraceConfidence] = {}
    for step in itertools.count():
        if not live:
            break
        for i in list(live):
            b = branches[i]
            if step >= b.tokens:  # its last token came: it finished
                ended[i] = live.pop(i)
                continue
            trace = live[i]
            trace.push(b.values[s.kind][step] if step < len(b.values[s.kind]) else 0.0)
            spent[i] = step + 1
            current = trace.current
            if level is not None and current is not None and current < level and len(live) > 1:
                del live[i]  # stopped: neither votes nor counts
    tokens += sum(spent.values())
    voters = done + [finished(i, branches[i], t) for i, t in sorted(ended.items())]
    result = vote(voters, by_confidence=s.aggregation == "confidence", keep=s.vote_keep)
    return branches[result.chosen].correct, tokens


def self_consistency(branches: list[Scored]) -> tuple[bool, int]:
    result = vote([finished(i, b, None) for i, b in enumerate(branches)])
    return branches[result.chosen].correct, sum(b.tokens for b in branches)


def all_questions(result: dict[str, Any], second_wave: dict[str, list[Scored]], reference: tuple[float, float],
                  outcomes: Path, tier: str, waves: Path, n: int, wave: int = 2) -> dict[str, Any]:
    """The report's headline lines over every question of the run (see the module's docstring): `reference` is
    self-consistency's (correct, decode tokens) summed over the second-wave questions."""
    saved = {r["id"]: int(r["saved"]) for r in json_rows(waves) if int(r.get("seed") or 0) == 0}
    labels = {r["id"]: r["tiers"][tier] for r in json_rows(outcomes) if tier in r.get("tiers", {})}
    agreed = [labels[q] for q, k in sorted(saved.items()) if k <= wave and q in labels
              and labels[q].get("correct") is not None and labels[q].get("decode_tokens")]
    pending = sorted(q for q, k in saved.items() if k > wave and q not in second_wave)
    n_agreed, n_second = len(agreed), len(second_wave)
    total = n_agreed + n_second
    right = sum(bool(r["correct"]) for r in agreed)
    tokens = sum(int(r["decode_tokens"]) for r in agreed)
    sc_tokens = (tokens * n / wave + reference[1]) / total
    sc_accuracy = (right + reference[0]) / total
    share = n_second / total

    def mixed(line: dict[str, Any]) -> dict[str, Any]:
        mean_tokens = (tokens + line["tokens_mean"] * n_second) / total
        d = line["minus_sc"]
        return {"accuracy": round((right + line["accuracy"] * n_second) / total, 4),
                "tokens_mean": round(mean_tokens, 1), "tokens_vs_sc": round(mean_tokens / sc_tokens, 3),
                "minus_sc": {"difference": round(d["difference"] * share, 4),
                             "ci95": [round(x * share, 4) for x in d["ci95"]]}}

    return {"questions": total, "first_wave_agreed": n_agreed, "second_wave": n_second,
            "second_wave_not_scored": len(pending),
            "self_consistency_estimate": {"accuracy": round(sc_accuracy, 4), "tokens_mean": round(sc_tokens, 1)},
            "served_adaptive": mixed(result["families"]["adaptive"]["in_sample_best"]),
            "in_sample_best": mixed(result["all"]["in_sample_best"]),
            "out_of_fold": mixed(result["all"]["out_of_fold"]),
            "note": "agreeing questions: every setting answers as the label, self-consistency assumed the same at "
                    f"{n / wave:g}x their tokens; the interval is the second wave's, scaled by its share"}


def candidate(setting: dict[str, Any], outcomes: list[tuple[bool, int]]) -> Candidate:
    """Per-question (correct, decode tokens) as a Candidate; lockstep latency is not modelled here: tokens."""
    tokens = np.array([float(t) for _, t in outcomes])
    return Candidate(setting, np.array([float(c) for c, _ in outcomes]), tokens, tokens)


def outcome_rows(spec: str) -> dict[str, tuple[bool, int]]:
    """id -> (correct, decode tokens) from a `cascade bench` requests.jsonl or (`FILE:TIER`) label outcome rows;
    the last record of an id counts (a resumed run appends)."""
    path, _, tier = spec.partition(":")
    out: dict[str, tuple[bool, int]] = {}
    for row in json_rows(Path(path)):
        if not isinstance(row, dict) or "id" not in row:
            continue
        outcome = (row.get("tiers") or {}).get(tier) if tier else row
        if outcome is not None and outcome.get("correct") is not None and not outcome.get("error"):
            out[str(row["id"])] = (bool(outcome["correct"]), int(outcome.get("decode_tokens") or 0))
    return out


def held_out(candidates: list[Candidate], reference: Candidate, settings: list[Setting], path: Path,
             args: argparse.Namespace, plan: Plan) -> dict[str, Any]:
    """Choose on the training questions (`candidates`, all of them), replay the choice on `path`'s questions."""
    everywhere = np.ones(len(reference.correct), dtype=bool)
    deepconf = [i for i, c in enumerate(candidates) if c.setting["family"] == "deepconf"]
    picks = {"served_adaptive": 0, "chosen": choose(candidates, reference.correct, everywhere, plan.points)}
    if deepconf:
        picks["chosen_deepconf"] = deepconf[choose([candidates[i] for i in deepconf], reference.correct, everywhere,
                                                   plan.points)]
    questions = load(path, args.n, args.max_tokens)
    others = {name: outcome_rows(spec) for name, _, spec in (x.partition("=") for x in args.also)}
    greedy_rows = outcome_rows(args.greedy) if args.greedy else None
    order = [q for q in sorted(questions)
             if all(q in rows for rows in others.values()) and (greedy_rows is None or q in greedy_rows)]
    if not order:
        raise SystemExit("error: --held-out: no question scored with all branches is in every --also/--greedy file")

    sc = candidate({"family": "self_consistency", "n": args.n}, [self_consistency(questions[q]) for q in order])
    greedy = None if greedy_rows is None else candidate({"family": "greedy"}, [greedy_rows[q] for q in order])
    second = np.array([not wave_agrees([finished(i, b, None) for i, b in enumerate(questions[q][:2])])
                       for q in order])
    methods: dict[str, Any] = {}
    for name, index in picks.items():
        s = settings[index]
        got = candidate(s.describe(), [replay(questions[q], s) for q in order])
        methods[name] = {"setting": s.describe(), **measures(got.correct, got.tokens, got.latency, sc, greedy, plan)}
        if second.any():
            on_second = Candidate(sc.setting, sc.correct[second], sc.tokens[second], sc.tokens[second])
            methods[name]["second_wave"] = measures(got.correct[second], got.tokens[second], got.tokens[second],
                                                    on_second, None, plan)
    for name, rows in others.items():
        got = candidate({"family": name}, [rows[q] for q in order])
        methods[name] = measures(got.correct, got.tokens, got.latency, sc, greedy, plan)
    if greedy is not None:
        methods["greedy"] = measures(greedy.correct, greedy.tokens, greedy.latency, sc, None, plan)
    return {"file": recorded_path(path), "questions": len(order),
            "scored_not_in_every_file": len(questions) - len(order), "second_wave": int(second.sum()),
            "self_consistency": {"accuracy": round(float(sc.correct.mean()), 4),
                                 "tokens_mean": round(float(sc.tokens.mean()), 1)},
            "chosen_on": f"{len(reference.correct)} second-wave questions of --logprobs, all of them", **methods}


def fixed_levels(questions: list[list[Scored]], group: int, kind: str, quantiles: list[float]) -> list[float]:
    """Stopping levels from every question's first wave pooled: the `quantiles` of their weakest-group confidence.
    Label-free (no correctness read), but from all questions, held-out folds included: a mild transductive choice,
    said in the report."""
    lowest = [w for branches in questions for b in branches[:2]
              if (w := trace_of(b, Setting(0.0, group, kind, "majority", 1.0)).lowest_group) is not None]
    return [quantile(lowest, q) for q in quantiles] if lowest else []


def grid(args: argparse.Namespace, questions: list[list[Scored]] | None = None) -> list[Setting]:
    keeps = [float(x) for x in args.keep.split(",")]
    groups = [int(x) for x in args.group.split(",")]
    kinds = args.values.split(",")
    votes = [("majority", 1.0), ("confidence", 1.0), *(("majority", float(k)) for k in args.vote_keep.split(","))]
    served = Setting(0.0, groups[0], kinds[0], "majority", 1.0)
    settings = [served, *(Setting(k, g, v, a, vk) for k, g, v, (a, vk)
                          in itertools.product(keeps, groups, kinds, votes) if (k, a, vk) != (0.0, "majority", 1.0))]
    quantiles = [float(x) for x in args.fixed_quantiles.split(",") if x]
    if questions and quantiles:
        for g, v in itertools.product(groups, kinds):
            for q, level in zip(quantiles, fixed_levels(questions, g, v, quantiles), strict=False):
                settings.append(Setting(0.0, g, v, "majority", 1.0, level, q))
    return settings


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--logprobs", type=Path, required=True, help="reasoning/branch_logprobs.py's output (.jsonl.gz)")
    p.add_argument("--n", type=int, default=8, help="branches per question (the served N)")
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--keep", default="0,0.1,0.3,0.5,0.7,0.9", help="confidence_keep values")
    p.add_argument("--group", default="32,16,64", help="confidence_group values (the first: the served rule's)")
    p.add_argument("--values", default=",".join(KINDS), help="per-token values: " + ", ".join(KINDS))
    p.add_argument("--vote-keep", default="0.5,0.75", help="vote_keep values besides 1")
    p.add_argument("--fixed-quantiles", default="0.05,0.1,0.25", help="also stop at fixed levels: these quantiles "
                   "of all questions' first-wave confidences (empty: none)")
    p.add_argument("--cv-folds", type=int, default=5)
    p.add_argument("--cv-points", type=float, default=0.01, help="the criterion's slack below self-consistency")
    p.add_argument("--cv-seed", type=int, default=0)
    p.add_argument("--resamples", type=int, default=10_000)
    p.add_argument("--outcomes", type=Path, help="the run's label rows: adds all_questions (needs --waves)")
    p.add_argument("--tier", default="qwen2.5-coder-1.5b-reason", help="the tier of --outcomes' rows")
    p.add_argument("--waves", type=Path,
                   help="reasoning/branch_logprobs.py --waves output: which questions had one wave")
    p.add_argument("--held-out", type=Path, help="a scored run with all N branches of every question: choose on "
                   "--logprobs, score the choice here")
    p.add_argument("--also", action="append", default=[], metavar="NAME=FILE[:TIER]",
                   help="with --held-out: another method's per-question outcomes on those questions")
    p.add_argument("--greedy", metavar="FILE[:TIER]", help="with --held-out: greedy's outcomes, for the paired line")
    p.add_argument("--json-out", type=Path)
    args = p.parse_args()
    if (args.also or args.greedy) and args.held_out is None:
        p.error("--also and --greedy go with --held-out")
    for spec in args.also:
        if not spec.partition("=")[2] or not spec.partition("=")[0]:
            p.error(f"--also {spec!r}: expected NAME=FILE[:TIER]")
    if (args.outcomes is None) != (args.waves is None):
        p.error("--outcomes and --waves go together")
    for kind in args.values.split(","):
        if kind not in KINDS:
            p.error(f"--values: unknown {kind!r} (known: {', '.join(KINDS)})")
    questions = load(args.logprobs, args.n, args.max_tokens)
    second_wave = {q: b for q, b in questions.items() if not wave_agrees([finished(i, x, None)
                                                                            for i, x in enumerate(b[:2])])}
    settings = grid(args, list(second_wave.values()))
    if len(second_wave) < max(2, args.cv_folds):
        print(f"error: {len(second_wave)} questions reach a second wave with all {args.n} branches scored; "
              f"need at least {max(2, args.cv_folds)}", file=sys.stderr)
        return 2
    order = sorted(second_wave)

    sc = [self_consistency(second_wave[q]) for q in order]
    reference = candidate({"family": "self_consistency", "n": args.n}, sc)
    candidates = [candidate(s.describe(), [replay(second_wave[q], s) for q in order]) for s in settings]
    plan = Plan(args.cv_folds, args.cv_seed, args.cv_points, args.resamples)
    result = report(candidates, reference, None, plan)
    result["questions"] = {"scored": len(questions), "second_wave": len(order),
                           "first_wave_agreed": len(questions) - len(order)}
    if args.outcomes is not None:
        result["all_questions"] = all_questions(
            result, second_wave, (float(sum(c for c, _ in sc)), float(sum(t for _, t in sc))), args.outcomes,
            args.tier, args.waves, args.n)
    if args.held_out is not None:
        result["held_out"] = held_out(candidates, reference, settings, args.held_out, args, plan)
    result["config"] = recorded_values(vars(args))
    print_result(result, args.json_out, indent=1)
    print(headline(result), file=sys.stderr)
    if "held_out" in result:
        h = result["held_out"]
        for name in ("chosen", "chosen_deepconf", "served_adaptive"):
            if name in h:
                d = h[name]["minus_sc"]
                print(f"held out ({h['questions']} questions) {name}: {h[name]['accuracy']} at "
                      f"{h[name]['tokens_vs_sc']}x self-consistency's tokens, {d['difference']:+} "
                      f"({d['ci95'][0]:+}..{d['ci95'][1]:+}) vs its {h['self_consistency']['accuracy']}",
                      file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
