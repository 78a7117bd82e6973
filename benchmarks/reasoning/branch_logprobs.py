"""Token log-probabilities of saved reasoning branches, by one prefill each (no decode).

The embedded engine (`transformers serve`) returns no logprobs, so DeepConf's confidence (issue 51 item 4,
cascade/branches/confidence.py) cannot be read live on this machine. This reads it offline: each saved branch
(`cascade label --save-branches` or `cascade bench branches --save-branches`) is put after the prompt its tier
sent (the question as the only user message, the model's chat template) and run through the model once; the
logits at each of the branch's tokens give

* `logprob`: the token's own log-probability (what `logprobs: true` returns);
* `certainty`: DeepConf's token confidence, -(mean log-probability of the top k candidates), k = --top-k
  (what `top_logprobs: k` lets cascade compute), and `certainty5` with k = 5.

The model's own distribution (temperature 1, no top_p), as engines report logprobs. The text is re-tokenized,
so a branch's tokens can differ slightly from those the engine sampled (counts differ by a few at most).

Output: gzipped JSONL appended to --out, one row per branch: id, seed, branch, tokens, correct, answer (the
vote's key of its final number) and the three arrays (rounded to 3 decimals); no text. Resumable: branches
already in --out are skipped. `--waves W.jsonl`: also one row per question of --branches (id, seed, saved: how
many branches it launched; 2 when its first wave agreed), merged into W, so that a replay knows which questions
ended after their first wave without the local branch texts (benchmarks/reasoning/deepconf_replay.py --waves).
Reads the dataset in place (../shared/data) for the questions. Usage:

    .venv/bin/python -m benchmarks.reasoning.branch_logprobs --branches B.jsonl --dataset gsm8k-train \\
        --out models/outcomes/qwen15-train-label/reason-adaptive-logprobs.jsonl.gz

On this 2-core CPU a 1.5B prefill of ~450 tokens takes a few seconds (`--limit` for a smoke run).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cascade.testing.scripts import print_result

DEFAULT_MODEL = "qwen2.5-coder-1.5b"


def branch_key(row: dict[str, Any]) -> tuple[str, int, int]:
    return str(row["id"]), int(row.get("seed") or 0), int(row["branch"])


def read_rows(path: Path) -> Iterator[dict[str, Any]]:
    from cascade.bench.runs import json_rows

    return (row for row in json_rows(path) if isinstance(row, dict))


def certainties(top: Any, k: int) -> list[float]:
    """DeepConf's token confidence from each row of `top` (sorted top logprobs per token, descending)."""
    return [round(-float(row[:k].mean()), 3) for row in top]


def write_waves(branches: Path, path: Path) -> None:
    """Merge each question's launched-branch count (id, seed, saved) from `branches` into `path` (rewritten whole,
    sorted; a question seen before keeps the larger count: a branches file lost between sessions loses nothing)."""
    counts = {(r["id"], int(r.get("seed") or 0)): int(r["saved"]) for r in read_rows(path)} if path.exists() else {}
    launched = {branch_key(r) for r in read_rows(branches)}  # a relabelled question's branches count once
    for key, n in Counter((q, s) for q, s, _ in launched).items():
        counts[key] = max(n, counts.get(key, 0))
    text = "".join(json.dumps({"id": q, "seed": s, "saved": n}) + "\n" for (q, s), n in sorted(counts.items()))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--branches", type=Path, required=True, help="saved branches (JSONL with id, branch, text)")
    p.add_argument("--dataset", required=True, help="the questions they answer: gsm8k, gsm8k-train or a .jsonl")
    p.add_argument("--out", type=Path, required=True, help="gzipped JSONL to append to (resumable)")
    p.add_argument("--model", default=DEFAULT_MODEL, help="embedded model card (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=20, help="candidates per token for `certainty` (default 20)")
    p.add_argument("--states", default="finished", help="branch states to score (comma-separated)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--limit", type=int, default=0, help="score at most this many branches (0: all)")
    p.add_argument("--waves", type=Path, help="also merge each question's saved-branch count into this JSONL")
    p.add_argument("--min-branches", type=int, default=0, help="only questions with at least this many saved "
                   "branches (8: those whose first wave disagreed, where DeepConf acts)")
    p.add_argument("--json-out", help="also write the JSON here")
    args = p.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cascade.data.datasets import load
    from cascade.data.grading import answer_key
    from cascade.engines.models import load_card, model_dir
    from cascade.repo_paths import recorded_path

    if args.waves:
        write_waves(args.branches, args.waves)
    states = set(args.states.split(","))
    done = {branch_key(r) for r in read_rows(args.out)}
    todo = [r for r in read_rows(args.branches) if r.get("state", "finished") in states and branch_key(r) not in done]
    todo = list({branch_key(r): r for r in todo}.values())  # a rerun of the labeller may have saved one twice
    if args.min_branches:
        saved = Counter((r["id"], int(r.get("seed") or 0)) for r in read_rows(args.branches))
        todo = [r for r in todo if saved[(r["id"], int(r.get("seed") or 0))] >= args.min_branches]
    if args.limit:
        todo = todo[:args.limit]
    questions = {p.id: p.prompt for p in load(args.dataset)}
    missing = sorted({r["id"] for r in todo} - set(questions))
    if missing:
        print(f"error: {len(missing)} branch ids are not in --dataset {args.dataset} (e.g. {missing[0]})",
              file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    where = model_dir(load_card(args.model))
    tokenizer = AutoTokenizer.from_pretrained(where)
    model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.bfloat16)
    model.eval()
    print(f"{len(todo)} branches to score ({len(done)} already in {args.out})", file=sys.stderr)
    started, tokens_seen = time.perf_counter(), 0
    with gzip.open(args.out, "at") as out, torch.inference_mode():
        for i, row in enumerate(todo):
            prompt = tokenizer.apply_chat_template([{"role": "user", "content": questions[row["id"]]}],
                                                   add_generation_prompt=True, tokenize=True)
            prompt_ids = list(prompt["input_ids"] if isinstance(prompt, dict) or hasattr(prompt, "keys")
                              else prompt)
            answer_ids = tokenizer(row["text"], add_special_tokens=False)["input_ids"]
            if not answer_ids:
                continue
            ids = torch.tensor([prompt_ids + answer_ids])
            logits = model(ids).logits[0, len(prompt_ids) - 1:-1].float()  # the logits that predicted each token
            logprobs = torch.log_softmax(logits, dim=-1)
            own = logprobs.gather(1, torch.tensor(answer_ids).unsqueeze(1)).squeeze(1)
            top = logprobs.topk(max(args.top_k, 5), dim=-1).values.clamp(min=-100.0)
            result = {"id": row["id"], "seed": int(row.get("seed") or 0), "branch": int(row["branch"]),
                      "tokens": len(answer_ids), "correct": bool(row.get("correct")),
                      "answer": answer_key(row["text"]),
                      "logprob": [round(max(-100.0, float(v)), 3) for v in own],
                      "top_k": args.top_k, "certainty": certainties(top, args.top_k),
                      "certainty5": certainties(top, 5)}
            out.write(json.dumps(result) + "\n")
            out.flush()
            tokens_seen += len(prompt_ids) + len(answer_ids)
            if (i + 1) % 10 == 0 or i + 1 == len(todo):
                rate = tokens_seen / (time.perf_counter() - started)
                print(f"{i + 1}/{len(todo)} branches, {rate:.0f} prefill tok/s", file=sys.stderr)
    elapsed = time.perf_counter() - started
    print_result({"scored": len(todo), "seconds": round(elapsed, 1),
                  "prefill_tokens_per_s": round(tokens_seen / elapsed, 1) if elapsed else math.nan,
                  "out": recorded_path(args.out)}, args.json_out, indent=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
