"""Does an engine slow down with the requests it has served? Batch-of-one ITL before and after rounds of load.

Why: the simulator check (benchmarks/planner/simulator_vs_loadgen.py) saw the embedded SmolLM2 worker's
batch-of-one ITL grow 1.46x over a 52-minute load test. If the worker itself degrades with requests
served (state growing inside transformers' continuous batching), the supervisor should recycle
workers; if a worker that served as many requests keeps its speed, the drift was the machine's.

Method
  * The engine: `--embedded smollm2|qwen` starts the worker exactly as `cascade serve` does (same
    command, environment and limits; stopped at exit), or `--url` probes a running one.
  * Probe: `--probe-requests` sequential streamed requests of `--probe-tokens` tokens (greedy, nothing
    else in flight); the ITL of a probe is the median gap between content chunks after the first.
  * Load: `--rounds` rounds of `--requests` short requests (`--load-tokens`) at concurrency
    `--concurrency`; a probe before the first round and after each.
  * Reported: each probe's median ITL, the ratio of the last probe to the first, the slope of ITL
    over requests served (least squares, ms per 100 requests), and the spread of the probes
    (max/min): a trend well inside the spread is no trend.

Output: one JSON object on stdout; progress on stderr.
Usage: .venv/bin/python -m benchmarks.soaks.worker_drift --embedded smollm2 [--rounds 3 --requests 120 --concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from benchmarks.planner.simulator_vs_loadgen import log, serve_target
from cascade.repo_paths import recorded_values
from cascade.testing.scripts import print_result


async def _stream(session: aiohttp.ClientSession, url: str, model: str | None, prompt: str,
                  max_tokens: int) -> list[float]:
    """Arrival times of the content chunks of one streamed completion."""
    body = {"model": model or "default", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "stream": True, "temperature": 0}
    times: list[float] = []
    async with session.post(f"{url}/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.content:
            if line.startswith(b"data:") and b"[DONE]" not in line and b'"content"' in line:
                times.append(time.perf_counter())
    return times


async def probe_itl_ms(session: aiohttp.ClientSession, url: str, model: str | None, requests: int,
                       tokens: int) -> float:
    gaps: list[float] = []
    for i in range(requests):
        times = await _stream(session, url, model, f"Count from {i} to {i + 80}, one number per line.", tokens)
        # The gaps after the second chunk: the first gap may still carry the end of the prefill.
        gaps += [1000 * (b - a) for a, b in itertools.pairwise(times[1:])]
    if not gaps:
        raise RuntimeError("the probe got fewer than three content chunks per request: is the engine streaming?")
    return statistics.median(gaps)


async def measure(args: argparse.Namespace, url: str, model: str | None) -> dict[str, Any]:
    timeout = aiohttp.ClientTimeout(total=args.request_timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        probes = [{"served": 0, "itl_ms": await probe_itl_ms(session, url, model, args.probe_requests,
                                                              args.probe_tokens), "t_s": 0.0}]
        log(f"probe before load: batch-of-one ITL {probes[0]['itl_ms']:.1f} ms")
        started, served = time.monotonic(), 0
        gate = asyncio.Semaphore(args.concurrency)

        async def one(i: int) -> None:
            async with gate:
                await _stream(session, url, model, f"What is {i} plus {3 * i}? Explain briefly.", args.load_tokens)

        for r in range(args.rounds):
            await asyncio.gather(*(one(served + i) for i in range(args.requests)))
            served += args.requests
            itl = await probe_itl_ms(session, url, model, args.probe_requests, args.probe_tokens)
            probes.append({"served": served, "itl_ms": itl, "t_s": round(time.monotonic() - started, 1)})
            log(f"round {r + 1}/{args.rounds}: {served} requests served, batch-of-one ITL {itl:.1f} ms")
    itl = np.array([p["itl_ms"] for p in probes])
    served_axis = np.array([p["served"] for p in probes], dtype=float)
    slope = float(np.polyfit(served_axis, itl, 1)[0]) * 100 if len(probes) > 1 else 0.0
    return {
        "probes": [{**p, "itl_ms": round(p["itl_ms"], 2)} for p in probes],
        "last_over_first": round(float(itl[-1] / itl[0]), 3),
        "slope_ms_per_100_requests": round(slope, 3),
        "spread_max_over_min": round(float(itl.max() / itl.min()), 3),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--url", help="a running OpenAI-compatible engine")
    which.add_argument("--embedded", choices=["smollm2", "qwen"],
                       help="start this embedded worker as `cascade serve` does")
    p.add_argument("--model", help="with --url: the model to request")
    p.add_argument("--rounds", type=int, default=3, help="rounds of load, a probe after each (default 3)")
    p.add_argument("--requests", type=int, default=120, help="requests per round (default 120)")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight during a round (default 8)")
    p.add_argument("--load-tokens", type=int, default=24, help="max_tokens of the load's requests (default 24)")
    p.add_argument("--probe-requests", type=int, default=5, help="sequential requests per probe (default 5)")
    p.add_argument("--probe-tokens", type=int, default=64, help="max_tokens of a probe request (default 64)")
    p.add_argument("--request-timeout-s", type=float, default=600.0)
    p.add_argument("--out", default="runs/worker_drift", help="folder for the worker's log")
    p.add_argument("--json-out", help="also write the JSON here")
    args = p.parse_args(argv)
    if min(args.rounds, args.requests, args.concurrency, args.load_tokens, args.probe_requests) < 1 \
            or args.probe_tokens < 3:
        p.error("counts must be >= 1 and --probe-tokens >= 3")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    with serve_target(args, out) as target:
        result = asyncio.run(measure(args, target.url, target.model))
    config = {k: v for k, v in vars(args).items() if k != "json_out"}
    result["config"] = recorded_values(config | {"target": target.info})  # paths repo-relative
    print_result(result, args.json_out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
