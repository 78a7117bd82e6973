"""Heuristic CPU scorer vs a small model judging partial branches (the verifier scorer), on saved branches.

Input: finished branches with their graded correctness, as written by
  cascade bench branches --methods self_consistency --save-branches FILE
(rows {"id", "branch", "text", "correct", ...}; FILE stays local: model outputs on dataset questions).

For each scorer, `heuristic` (cascade/branches/cpu_scorer.py, default weights) and
`verifier:<model>:<prompt>` per --model and --prompt (cascade/branches/verifier.py: the model's
P(Yes) / (P(Yes) + P(No)) after "Is the reasoning so far correct?", one prefill, run in this process
exactly as `cascade scorer-server` runs it):

* `partial`: every branch cut at --fraction of its words, the last (unfinished) step dropped (what the
  runner scores mid-flight; the same cut as benchmarks/reasoning/branch_scorer.py); `finished`: the whole branch
  (SART's alpha-prime). Each with
  - `auc`: over all branches, and `auc_ci95`: a bootstrap 95% interval (--bootstrap resamples of the
    questions, with replacement: branches of one question move together);
  - `auc_within_question`: over pairs of one right and one wrong branch OF THE SAME QUESTION (ties count
    half), with its bootstrap interval. Pruning compares branches of one request (phase 2: against the
    first finished branch's score), so this is the number that decides what pruning keeps; the pooled
    `auc` also rewards telling easy questions from hard ones, which prunes nothing within a request.
* `cost`: milliseconds per scoring call (mean, p95) as run here, per block, with the batch size; for the
  verifier also prompt tokens, tokens reused from the prefix cache and ms per computed token. Inputs are
  scored branch by branch, partial then finished, so the finished call reuses the partial one's prefix.
* `step_cost` (verifier): --step-cost-branches branches scored after every step, each call reusing the
  previous one's prefix: the live pattern of SART scoring every K = 1 steps, i.e. the cost per scored step.

--scores-cache FILE keeps every score (JSONL, appended as they are computed): a rerun reuses them and
computes only the missing ones, so a long run can be stopped and resumed. Costs are then those recorded.

Output: one JSON object. Usage (the plumbing check: smollm2-135m, a few questions, ~1 min):
  .venv/bin/python -m benchmarks.reasoning.verifier_scorer --branches FILE [--model qwen2.5-coder-0.5b] [--model ...]
      [--n-questions K] [--fraction 0.5] [--bootstrap 1000] [--dtype bfloat16] [--threads 1]
      [--prompt judge[,self]] [--batch 1] [--prefix-cache-tokens 16384] [--step-cost-branches 8]
      [--scores-cache F] [--json-out F]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.metrics import roc_auc_score

from benchmarks.reasoning.branch_scorer import partial_steps  # the same cut as the heuristic's own benchmark
from cascade.branches.cpu_scorer import CPUScorer
from cascade.branches.scoring import split_steps
from cascade.branches.verifier import (
    JUDGE_INSTRUCTION,
    JUDGE_QUESTION,
    NO_SPELLINGS,
    PROMPTS,
    SELF_QUESTION,
    YES_SPELLINGS,
)
from cascade.data.datasets import prompts_by_id
from cascade.testing.scripts import print_result

# Scores in --scores-cache are reused only under the same prompt text.
PROMPT_VERSION = hashlib.sha256(repr((JUDGE_INSTRUCTION, JUDGE_QUESTION, SELF_QUESTION, YES_SPELLINGS, NO_SPELLINGS)
                                     ).encode()).hexdigest()[:8]


def load_rows(path: Path, n_questions: int | None, seed: int) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if rows and "text" not in rows[0]:
        raise SystemExit(f"{path}: rows have no `text`: branches were saved without their text, nothing to score")
    rows = [r for r in rows if isinstance(r.get("text"), str)]
    ids = sorted({r["id"] for r in rows})
    if n_questions is not None and n_questions < len(ids):
        keep = set(np.random.default_rng(seed).choice(ids, n_questions, replace=False).tolist())
        rows = [r for r in rows if r["id"] in keep]
    return rows


def row_key(row: dict) -> str:
    return hashlib.sha256(f"{row['id']}\0{row['text']}".encode()).hexdigest()[:16]


# --- metrics -----------------------------------------------------------------------------------------


def auc(y: np.ndarray, s: np.ndarray) -> float | None:
    return None if len(set(y.tolist())) < 2 else float(roc_auc_score(y, s))


def within_pairs(y: np.ndarray, s: np.ndarray) -> tuple[float, int]:
    """(concordant pairs, ties counted half; pairs) over one question's right x wrong branches."""
    right, wrong = s[y], s[~y]
    if not len(right) or not len(wrong):
        return 0.0, 0
    diff = right[:, None] - wrong[None, :]
    return float((diff > 0).sum() + 0.5 * (diff == 0).sum()), diff.size


def metrics(qids: list[str], y: np.ndarray, s: np.ndarray, n_boot: int, seed: int) -> dict[str, Any]:
    by_q: dict[str, list[int]] = defaultdict(list)
    for i, q in enumerate(qids):
        by_q[q].append(i)
    questions = sorted(by_q)
    index = [np.array(by_q[q]) for q in questions]
    pairs = np.array([within_pairs(y[ix], s[ix]) for ix in index])
    rng = np.random.default_rng(seed)
    boot, boot_within = [], []
    for _ in range(n_boot):
        pick = rng.integers(0, len(questions), len(questions))
        rows = np.concatenate([index[k] for k in pick])
        value = auc(y[rows], s[rows])
        if value is not None:
            boot.append(value)
        total = pairs[pick].sum(0)
        if total[1]:
            boot_within.append(total[0] / total[1])
    full = pairs.sum(0)
    return {"auc": _round(auc(y, s)), "auc_ci95": _interval(boot),
            "auc_within_question": _round(full[0] / full[1] if full[1] else None),
            "auc_within_question_ci95": _interval(boot_within),
            "questions_with_both_outcomes": int((pairs[:, 1] > 0).sum())}


def _interval(values: list[float]) -> list[float | None] | None:
    return [_round(float(np.percentile(values, 2.5))), _round(float(np.percentile(values, 97.5)))] if values else None


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(float(x), digits)


def cost(records: list[dict]) -> dict[str, Any]:
    ms = np.array([r["ms"] for r in records])
    out: dict[str, Any] = {"calls": len(records), "ms_mean": _round(ms.mean(), 3) if len(ms) else None,
                           "ms_p95": _round(float(np.percentile(ms, 95)), 3) if len(ms) else None}
    if records and "prompt_tokens" in records[0]:
        prompt = np.array([r["prompt_tokens"] for r in records])
        computed = prompt - np.array([r["cached_tokens"] for r in records])
        out.update(prompt_tokens_mean=_round(prompt.mean(), 1), computed_tokens_mean=_round(computed.mean(), 1),
                   ms_per_computed_token=_round(ms.sum() / max(1, computed.sum()), 3))
    return out


# --- scoring -----------------------------------------------------------------------------------------


class ScoreCache:
    """Scores by (scorer, row key, what was scored), read from and appended to an optional JSONL file."""

    def __init__(self, path: Path | None) -> None:
        self.records: dict[tuple[str, str, str], dict] = {}
        if path is not None and path.exists():
            for line in path.read_text().splitlines():
                try:
                    r = json.loads(line)
                    self.records[(r["scorer"], r["row"], r["what"])] = r
                except (ValueError, KeyError):
                    continue  # a line cut short by a stopped run
        self._file = None if path is None else path.open("a")

    def get(self, scorer: str, row: str, what: str) -> dict | None:
        return self.records.get((scorer, row, what))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def put(self, record: dict) -> None:
        self.records[(record["scorer"], record["row"], record["what"])] = record
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()


def heuristic_records(rows: list[dict], questions: dict[str, str], fraction: float) -> dict[str, list[dict]]:
    scorer = CPUScorer()
    out: dict[str, list[dict]] = {"partial": [], "finished": []}
    for row in rows:
        for what, f in (("partial", fraction), ("finished", 1.0)):
            steps = partial_steps(row["text"], f)
            t0 = time.perf_counter()
            score = scorer.score_steps(steps, questions.get(row["id"], ""))
            out[what].append({"score": score, "ms": (time.perf_counter() - t0) * 1e3})
    return out


def verifier_records(model: Any, name: str, rows: list[dict], questions: dict[str, str], fraction: float,
                     batch: int, cache: ScoreCache) -> dict[str, list[dict]]:
    from tqdm import tqdm

    jobs = [(row, what, partial_steps(row["text"], f)) for row in rows
            for what, f in (("partial", fraction), ("finished", 1.0))]
    todo = [j for j in jobs if cache.get(name, row_key(j[0]), j[1]) is None]
    # With the prefix cache off (batch > 1) inputs run as padded batches; with it on, one by one in this order.
    size = batch if model.cache is None else 1
    with tqdm(total=len(todo), desc=name, unit="input", file=sys.stderr) as bar:
        for start in range(0, len(todo), size):
            chunk = todo[start:start + size]
            scored = model.score([(questions.get(row["id"], ""), steps) for row, _, steps in chunk])
            for (row, what, _), s in zip(chunk, scored, strict=True):
                cache.put({"scorer": name, "row": row_key(row), "what": what, "score": s.score,
                           "ms": s.seconds * 1e3, "prompt_tokens": s.prompt_tokens, "cached_tokens": s.cached_tokens,
                           "batch": len(chunk)})
            bar.update(len(chunk))
    out: dict[str, list[dict]] = {"partial": [], "finished": []}
    for row, what, _ in jobs:
        record = cache.get(name, row_key(row), what)
        assert record is not None
        out[what].append(record)
    return out


def step_cost(model: Any, rows: list[dict], questions: dict[str, str], n: int, seed: int) -> dict[str, Any]:
    """Every step of `n` branches scored in order (SART at K = 1): ms per scored step."""
    if n <= 0 or not rows:
        return {}
    picks = np.random.default_rng(seed).choice(len(rows), min(n, len(rows)), replace=False)
    if model.cache is not None:
        model.cache.clear()  # the whole branches scored before would serve every step's prefix
    records = []
    for i in picks:
        row = rows[int(i)]
        steps = split_steps(row["text"])
        for k in range(1, len(steps) + 1):
            s = model.score([(questions.get(row["id"], ""), steps[:k])])[0]
            records.append({"ms": s.seconds * 1e3, "prompt_tokens": s.prompt_tokens, "cached_tokens": s.cached_tokens})
    return {"branches": len(picks), "steps_mean": _round(len(records) / len(picks), 1), **cost(records)}


def score_model(model_name: str, args: argparse.Namespace, rows: list[dict], questions: dict[str, str],
                cache: ScoreCache, report: Any) -> None:
    from cascade.engines.scorer_server import load_verifier, resolve_model

    batch = args.batch if not args.prefix_cache_tokens else 1
    model = load_verifier(resolve_model(model_name), dtype=args.dtype, threads=args.threads,
                          prefix_cache_tokens=args.prefix_cache_tokens, max_batch=args.batch)
    for prompt in args.prompt.split(","):
        model.prompt = prompt
        if model.cache is not None:
            model.cache.clear()
        name = f"verifier:{Path(model_name).name}:{prompt}"
        records = verifier_records(model, f"{name}:{args.dtype}:{PROMPT_VERSION}", rows, questions, args.fraction,
                                   args.batch, cache)
        report(name, records, {"batch": batch, "dtype": args.dtype, "threads": args.threads,
                               "prefix_cache_tokens": args.prefix_cache_tokens,
                               "step_cost": step_cost(model, rows, questions, args.step_cost_branches, args.seed)})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--branches", required=True, type=Path, help="JSONL from cascade bench branches --save-branches")
    p.add_argument("--model", action="append", help="verifier model: embedded name or directory (repeatable; "
                   "default qwen2.5-coder-0.5b); --model none: the heuristic only")
    p.add_argument("--fraction", type=float, default=0.5, help="score each branch at this share of its words")
    p.add_argument("--n-questions", type=int, help="a seeded sample of this many questions (default: all)")
    p.add_argument("--bootstrap", type=int, default=1000, help="question resamples for the 95%% intervals")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--batch", type=int, default=1, help="inputs per padded forward pass (needs "
                   "--prefix-cache-tokens 0; with the prefix cache on, inputs run one by one)")
    p.add_argument("--prefix-cache-tokens", type=int, default=16384, help="as `cascade scorer-server` (0: off)")
    p.add_argument("--prompt", default="judge", help=f"verifier prompt(s), comma-separated, of {', '.join(PROMPTS)} "
                   "(cascade/branches/verifier.py `judge_messages`)")
    p.add_argument("--step-cost-branches", type=int, default=8, help="branches scored after every step (0: skip)")
    p.add_argument("--scores-cache", type=Path, help="JSONL of computed scores, reused and appended to")
    p.add_argument("--json-out", type=Path)
    args = p.parse_args()
    if not set(args.prompt.split(",")) <= set(PROMPTS):
        p.error(f"--prompt takes names from {', '.join(PROMPTS)}")
    if args.batch > 1 and args.prefix_cache_tokens:
        p.error("--batch > 1 runs padded batches: pass --prefix-cache-tokens 0 with it")
    rows = load_rows(args.branches, args.n_questions, args.seed)
    if not rows:
        print(f"no branches in {args.branches}", file=sys.stderr)
        return 2
    qids = [r["id"] for r in rows]
    questions = prompts_by_id(set(qids))
    y = np.array([bool(r["correct"]) for r in rows])
    result: dict[str, Any] = {
        "branches": len(rows), "questions": len(set(qids)), "questions_without_text": len(set(qids) - set(questions)),
        "correct_rate": _round(y.mean()), "fraction": args.fraction, "bootstrap": args.bootstrap,
        "prompt_version": PROMPT_VERSION, "scorers": {}}

    def report(name: str, records: dict[str, list[dict]], extra: dict[str, Any]) -> None:
        block: dict[str, Any] = {what: metrics(qids, y, np.array([r["score"] for r in records[what]]),
                                               args.bootstrap, args.seed) for what in ("partial", "finished")}
        block["cost"] = {**extra, **{what: cost(records[what]) for what in ("partial", "finished")}}
        result["scorers"][name] = block

    report("heuristic", heuristic_records(rows, questions, args.fraction), {"batch": 1})
    models = [] if args.model == ["none"] else (args.model or ["qwen2.5-coder-0.5b"])
    cache = ScoreCache(args.scores_cache)
    try:
        for model_name in models:
            score_model(model_name, args, rows, questions, cache, report)
    finally:
        cache.close()
    print_result(result, args.json_out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
