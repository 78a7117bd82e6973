"""Re-answer one embedded tier's labelled prompts greedily in-process, recording token logprobs. Prints JSON.

Why: the embedded engine (`transformers serve`) returns no logprobs, and llama.cpp's server computes them at 8x
its decode cost (README, issue 23), so `cascade label --logprobs` cannot label the embedded ladder in useful
time. This script runs the tier's own model (the same safetensors the embedded worker serves, its dtype, its
chat template, the tier's `default_max_tokens`) with `generate(do_sample=False, output_scores=True)` in batches,
and keeps the log-probability of each chosen token: what an engine that returns logprobs (SGLang, vLLM) sends.

Method
  * Input: an outcomes file from `cascade label` on the embedded ladder (models/outcomes/*.jsonl), or RouteLLM's
    GSM8K CSV (its Mixtral and GPT-4 outcomes become tiers): a stronger tier to escalate to. The prompts are
    looked up by `dataset`/`id` in ../shared/data (read in place); rows without a reference answer are skipped.
  * The tier's answer to each row is generated again (or first, where the input lacks the tier): greedy, the
    user message only, as `cascade label` sends it; graded with cascade's grader; written with its
    `token_confidence` (cascade/branches/confidence.py, `--group` tokens) in place of the labelled one, the
    other tiers' labelled outcomes kept as they are.
    Greedy decoding in bfloat16 is not bit-stable across batch shapes, so the regenerated answer differs from
    the served one on some rows; both accuracies and the share of identical answers are reported.
  * Resumable: rows already in `--out` are skipped. Seeded (`--seed`: the row sample, torch).

Usage: .venv/bin/python -m benchmarks.router.greedy_logprobs OUTCOMES.jsonl --tier smollm2-135m --out OUT.jsonl
       [--n 600] [--batch 8] [--group 32] [--seed 0] [--threads 2]
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from cascade.branches.confidence import DEFAULT_GROUP, confidence_of
from cascade.config import CascadeConfig, TierConfig, WorkerBackendConfig, WorkerConfig
from cascade.data.datasets import DatasetError, prompts_of
from cascade.data.grading import extract, grade
from cascade.data.outcomes import OutcomeRow, TierOutcome, read_rows, write_row
from cascade.data.records import Prompt
from cascade.engines.embedded import embedded_config
from cascade.engines.models import load_card, prepare
from cascade.errors import ConfigError
from cascade.router.outcomes import load_outcomes
from cascade.testing.scripts import fail, print_result


def worker_of(config: CascadeConfig, tier: TierConfig) -> WorkerConfig:
    """The embedded worker a single-branch tier runs on."""
    if tier.branches.n != 1:
        raise ConfigError(f"tier `{tier.name}` has {tier.branches.n} reasoning branches; only a direct tier")
    names = [b.worker for b in tier.backends if isinstance(b, WorkerBackendConfig)]
    workers = [w for w in config.workers if w.name in names]
    if not workers:
        raise ConfigError(f"tier `{tier.name}` runs on no embedded worker")
    return workers[0]


class GreedyGenerator:
    """One embedded model, greedy, in batches; each answer with its chosen tokens' log-probabilities."""

    def __init__(self, model_name: str, threads: int, seed: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.manual_seed(seed)
        torch.set_num_threads(threads)
        directory = prepare(load_card(model_name))
        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(directory)
        self.tokenizer.padding_side = "left"  # generation continues from the right edge of every row
        # dtype "auto": the checkpoint's own (bfloat16), as `transformers serve --dtype auto` loads it.
        self.model = AutoModelForCausalLM.from_pretrained(directory, dtype="auto").eval()
        self.stop_ids = {i for i in (self.tokenizer.eos_token_id, self.tokenizer.pad_token_id) if i is not None}

    def answer(self, questions: list[str], max_tokens: int) -> list[tuple[str, list[float], str]]:
        """(text, chosen-token logprobs, finish_reason) per question."""
        torch, tok = self.torch, self.tokenizer
        texts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                         add_generation_prompt=True) for q in questions]
        batch = tok(texts, return_tensors="pt", padding=True)
        with torch.inference_mode():
            out = self.model.generate(**batch, max_new_tokens=max_tokens, do_sample=False, output_scores=True,
                                      return_dict_in_generate=True,
                                      pad_token_id=tok.pad_token_id if tok.pad_token_id is not None
                                      else tok.eos_token_id)
        generated = out.sequences[:, batch.input_ids.shape[1]:]
        steps = len(out.scores)
        # log_softmax over the vocabulary per step; only the chosen token's value is kept.
        chosen = torch.stack([torch.log_softmax(s.float(), dim=-1) for s in out.scores], dim=1).gather(
            2, generated[:, :steps].unsqueeze(-1)).squeeze(-1)
        results = []
        for i in range(len(questions)):
            ids = generated[i, :steps].tolist()
            length = next((k for k, t in enumerate(ids) if t in self.stop_ids), None)
            finish = "stop" if length is not None else "length"
            n = length if length is not None else len(ids)
            results.append((str(tok.decode(ids[:n], skip_special_tokens=True)), chosen[i, :n].tolist(), finish))
        return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outcomes", help="labelled outcomes JSONL (cascade label on the embedded ladder)")
    parser.add_argument("--tier", required=True, help="the direct embedded tier to re-answer")
    parser.add_argument("--out", required=True, help="outcomes JSONL to write (resumed if it exists)")
    parser.add_argument("--n", type=int, default=None, help="rows to use (a seeded sample; default all)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--group", type=int, default=DEFAULT_GROUP, help="tokens per confidence group")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json-out", help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.batch < 1 or args.group < 1 or (args.n is not None and args.n < 1):
        return fail("--batch, --group and --n must be >= 1")
    config = embedded_config()
    tiers = {t.name: t for t in config.tiers}
    if args.tier not in tiers:
        return fail(f"unknown tier {args.tier!r}; the embedded ladder has {', '.join(tiers)}")
    tier = tiers[args.tier]
    try:
        worker = worker_of(config, tier)
        rows = [r for r in source_rows(Path(args.outcomes)) if r.id is not None]
        if args.n is not None and args.n < len(rows):
            keep = np.sort(np.random.default_rng(args.seed).choice(len(rows), args.n, replace=False))
            rows = [rows[i] for i in keep]
        prompts = gradable_prompts(rows)
    except (ConfigError, DatasetError) as exc:
        return fail(str(exc))
    out = Path(args.out)
    done = {r.id for _, r in read_rows(out)} if out.exists() else set()
    todo = [r for r in rows if r.id not in done and r.id in prompts]
    generator = GreedyGenerator(worker.model, args.threads, args.seed)

    from tqdm import tqdm

    start, tokens = time.perf_counter(), 0
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("ab") as sink, tqdm(total=len(todo), desc=args.tier, unit="row", file=sys.stderr) as bar:
        for i in range(0, len(todo), args.batch):
            chunk = todo[i:i + args.batch]
            answers = generator.answer([prompts[r.id or ''].prompt for r in chunk], tier.default_max_tokens)
            for row, (text, logprobs, finish) in zip(chunk, answers, strict=True):
                reference = prompts[row.id or ""].reference or ""
                redone = TierOutcome(correct=grade(text, reference), answer=extract(text, reference),
                                     output_tokens=len(logprobs), finish_reason=finish,
                                     token_confidence=confidence_of(logprobs, args.group))
                write_row(sink, OutcomeRow(id=row.id, dataset=row.dataset,
                                           tiers={**row.tiers, args.tier: redone}))
                tokens += len(logprobs)
            sink.flush()
            bar.update(len(chunk))
    elapsed = time.perf_counter() - start
    print_result(summary(rows, [r for _, r in read_rows(out)], args.tier, tokens, elapsed), args.json_out, indent=1)
    return 0


def source_rows(path: Path) -> list[OutcomeRow]:
    """Labelled rows: an outcomes JSONL, or RouteLLM's GSM8K CSV (../shared/data/routellm/gsm8k_responses.csv),
    whose boolean columns become tiers named by their model and whose rows are `routellm-gsm8k:<row>`."""
    if path.suffix != ".csv":
        return [r for _, r in read_rows(path)]
    header = path.read_text(encoding="utf-8-sig").split("\n", 1)[0]
    columns = [c for c in next(csv.reader([header])) if c != "prompt" and not c.endswith("_response")]
    table = load_outcomes(path, columns)
    return [OutcomeRow(id=f"routellm-gsm8k:{i}", dataset="routellm-gsm8k",
                       tiers={t: TierOutcome(correct=bool(table.correct[i, k])) for k, t in enumerate(columns)})
            for i in range(len(table))]


def gradable_prompts(rows: list[OutcomeRow]) -> dict[str, Prompt]:
    """The rows' prompts by id, those with a reference answer (nothing else can be graded)."""
    return {i: p for i, p in prompts_of({r.id for r in rows if r.id}).items() if p.reference}


def summary(labelled: list[OutcomeRow], redone: list[OutcomeRow], tier: str, tokens: int, elapsed: float
            ) -> dict[str, Any]:
    """Served (labelled) against regenerated, on the rows whose input had the tier's answer: accuracy, identical
    answers; and this run's throughput."""
    before = {r.id: r.tiers[tier] for r in labelled if tier in r.tiers}
    pairs = [(before[r.id], r.tiers[tier]) for r in redone if r.id in before]
    return {
        "tier": tier, "rows_written": len(redone), "rows_with_a_served_answer": len(pairs),
        "accuracy_served": float(np.mean([bool(a.correct) for a, _ in pairs])) if pairs else None,
        "accuracy_regenerated": float(np.mean([bool(b.correct) for _, b in pairs])) if pairs else None,
        "same_answer": float(np.mean([a.answer == b.answer for a, b in pairs])) if pairs else None,
        "same_correctness": float(np.mean([a.correct == b.correct for a, b in pairs])) if pairs else None,
        "this_run": {"tokens": tokens, "seconds": round(elapsed, 1),
                     "tokens_per_s": round(tokens / elapsed, 1) if elapsed > 0 else None},
    }


if __name__ == "__main__":
    sys.exit(main())
