"""Decode speed, start time and memory of one embedded worker, as `cascade serve` starts it.

Why: choosing the embedded ladder's models and engine needs, per model, how fast one worker decodes alone
and with 8 or 16 requests in flight, how long it takes to start, and how much memory it holds once its
KV cache is allocated (README's embedded-ladder table quotes these numbers).

Method
  * The worker: `WorkerConfig(name, model=--model, temperature=--temperature)` started by cascade's own
    `Worker` (same command, environment and KV-cache limits as `cascade serve`), stopped at exit.
  * `start_s`: process start to healthy and its first one-token generation (weights already converted:
    a later start, not the first `make serve`).
  * For each concurrency c in `--concurrency`: `--rounds` x c non-streamed requests of `--max-tokens`
    tokens, c in flight at once (closed loop), GSM8K test questions read in place from ../shared/data.
    `decode_tok_s` = completion tokens / wall time of the pass; `per_request_tok_s` = that / c.
  * `rss_gb`: resident memory of the worker's process tree after the passes (its KV pool is allocated).

Output: one JSON object on stdout; progress on stderr.
Usage: .venv/bin/python -m benchmarks.planner.engine_speed --model qwen2.5-coder-1.5b [--concurrency 1,8,16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from cascade.config import WorkerConfig
from cascade.engines.models import load_card, prepare
from cascade.engines.supervisor import Supervisor, Worker, sampling_fields
from cascade.testing.scripts import print_result

GSM8K_TEST = Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k" / "test.jsonl"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def questions(n: int) -> list[str]:
    rows = [json.loads(line) for line in GSM8K_TEST.read_text().splitlines()[:n]]
    return [row["question"] for row in rows]


async def one_pass(client: httpx.AsyncClient, worker: Worker, prompts: list[str], concurrency: int,
                   max_tokens: int, extra: dict[str, Any]) -> dict[str, float]:
    queue = list(prompts)
    tokens = 0

    async def user() -> None:
        nonlocal tokens
        while queue:
            prompt = queue.pop()
            body = {"model": str(worker.model_dir), "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": max_tokens, "stream": False, **extra}
            response = await client.post(f"{worker.url}/v1/chat/completions", json=body)
            response.raise_for_status()
            tokens += int(response.json()["usage"]["completion_tokens"])

    start = time.perf_counter()
    await asyncio.gather(*(user() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    return {"concurrency": concurrency, "requests": len(prompts), "completion_tokens": tokens,
            "wall_s": round(wall, 2), "decode_tok_s": round(tokens / wall, 2),
            "per_request_tok_s": round(tokens / wall / concurrency, 2)}


def tree_rss_gb(pid: int) -> float:
    process = psutil.Process(pid)
    return round(sum(p.memory_info().rss for p in [process, *process.children(recursive=True)]) / 1e9, 2)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    config = WorkerConfig(name="bench", model=args.model, temperature=args.temperature)
    model_dir = prepare(load_card(args.model))
    with tempfile.TemporaryDirectory() as logs:
        worker = Worker(config, model_dir, Path(logs))
        started = time.perf_counter()
        async with Supervisor([worker]):  # as `cascade serve` starts it: healthy after one generation
            start_s = time.perf_counter() - started
            log(f"{args.model}: started in {start_s:.1f} s")
            extra = sampling_fields(model_dir, config) if args.temperature > 0 else {}
            passes = []
            async with httpx.AsyncClient(trust_env=False, timeout=None) as client:
                for c in (int(x) for x in args.concurrency.split(",")):
                    result = await one_pass(client, worker, questions(c * args.rounds), c, args.max_tokens, extra)
                    log(f"  c={c}: {result['decode_tok_s']} tok/s total, {result['per_request_tok_s']} per request")
                    passes.append(result)
            assert worker.process is not None
            rss = tree_rss_gb(worker.process.pid)
    return {"model": args.model, "temperature": args.temperature, "max_tokens": args.max_tokens,
            "cb_num_blocks": config.cb_num_blocks, "start_s": round(start_s, 1), "rss_gb": rss, "passes": passes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="embedded model card name (models/embedded/*.toml)")
    parser.add_argument("--concurrency", default="1,8,16", help="comma-separated requests in flight per pass")
    parser.add_argument("--rounds", type=int, default=1, help="requests per pass = rounds x concurrency")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy worker; > 0: sampling worker")
    parser.add_argument("--json-out", help="also write the JSON here")
    args = parser.parse_args()
    print_result(asyncio.run(measure(args)), args.json_out, indent=2)


if __name__ == "__main__":
    main()
