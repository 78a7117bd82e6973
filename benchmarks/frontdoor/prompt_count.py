"""A reservation's prompt counted with the tiers' tokenizers against the byte bound (cascade/service/keys/counting.py,
cascade/service/keys/reservation.py): what each costs the gateway per byte, what each reserves on GSM8K against what
the engine reports, and what counting costs the event loop inline or in the counting threads.

Method
  * Models: the embedded ones prepared on this machine (~/.cache/cascade/models; one per tokenizer file), loaded as
    the gateway loads them (`TemplateCounter`).
  * Prompts: GSM8K test questions (`--data`: the shared data folder, read in place), each one user message, as
    loadgen sends it; and text of the same length made of spaced digits (one token a byte, the slowest text measured).
  * `us_per_byte`: CPU seconds (`time.process_time`) of counting every prompt (the model's template rendered and the
    text encoded, as a count in the gateway does) or of the byte bound (`estimate_prompt_tokens`: the messages' JSON
    encoded), over the messages' JSON bytes, the median of `--rounds`.
  * `ratio`: reserved / actual per prompt, actual being the model's exact count (what its worker reports:
    tests/engines/test_prompt_count.py), reserved the byte bound or the count with its margin (never above the
    bound); `ladder`: the count a request that may reach every embedded tier reserves (the most over the models),
    against each model's actual.
  * `loop_us`: the event loop thread's CPU (`time.thread_time`) per request, counting a prompt of N bytes inline
    (`TemplateCounter.count` on the loop) or as the gateway does (`PromptCounter.count`: in the counting threads),
    requests one after another, the median of `--rounds`; `wall_us` the same requests' wall time.
  * `cap`: the CPU one count of a prompt at the byte cap (COUNT_MAX_BYTES) costs, English and digits.
Output: one JSON object on stdout (and in --json-out).
Usage: .venv/bin/python -m benchmarks.frontdoor.prompt_count [--rounds 3] [--n 1319] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import numpy as np

from cascade.config import decode_config
from cascade.data.datasets import load_gsm8k, shared_data_dir
from cascade.engines.models import all_cards, is_prepared, model_dir
from cascade.engines.prompt_count import TemplateCounter
from cascade.repo_paths import recorded_path
from cascade.schemas import ChatCompletionRequest, ChatMessage
from cascade.service.keys.counting import COUNT_MAX_BYTES, PromptCounter, margin
from cascade.service.keys.reservation import estimate_prompt_tokens
from cascade.testing.scripts import fail, print_result
from cascade.testing.servers import ladder_toml
from cascade.tiers.build import Tier, build_tiers

LOOP_SIZES = (64, 256, 1024, 4096)


def request(text: str) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="cascade", messages=[ChatMessage(role="user", content=text)])


def digits_like(text: str) -> str:
    """Spaced digits as long as `text` in bytes."""
    n = len(text.encode())
    return (" ".join("0123456789" * (n // 20 + 1)))[:n]


def cpu_s(work: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.process_time()
        work()
        times.append(time.process_time() - start)
    return statistics.median(times)


def summary(values: list[float]) -> dict[str, float]:
    a = np.asarray(values)
    return {"mean": round(float(a.mean()), 3), "p50": round(float(np.median(a)), 3),
            "p95": round(float(np.percentile(a, 95)), 3), "min": round(float(a.min()), 3),
            "max": round(float(a.max()), 3)}


def cost(counter: TemplateCounter, reqs: list[ChatCompletionRequest], rounds: int) -> dict[str, float]:
    size = sum(len(msgspec.json.encode(r.messages)) for r in reqs)
    counting = cpu_s(lambda: [counter.count(r.messages) for r in reqs], rounds)
    bound = cpu_s(lambda: [estimate_prompt_tokens(r) for r in reqs], rounds)
    return {"count_us_per_byte": round(counting * 1e6 / size, 3), "bound_us_per_byte": round(bound * 1e6 / size, 4),
            "count_us_per_prompt": round(counting * 1e6 / len(reqs), 1), "bytes_per_prompt": round(size / len(reqs))}


def ratios(counters: dict[str, TemplateCounter], reqs: list[ChatCompletionRequest]) -> dict[str, object]:
    actual = {name: [c.count(r.messages) or 0 for r in reqs] for name, c in counters.items()}
    bounds = [estimate_prompt_tokens(r) for r in reqs]
    out: dict[str, object] = {}
    for name, counts in actual.items():
        out[name] = {"actual_tokens": summary([float(a) for a in counts]),
                     "byte_bound": summary([b / a for b, a in zip(bounds, counts, strict=True)]),
                     "counted": summary([min(margin(a), b) / a for b, a in zip(bounds, counts, strict=True)])}
    ladder = [min(margin(max(per)), b) for b, per in zip(bounds, zip(*actual.values(), strict=True), strict=True)]
    out["ladder"] = {name: summary([r / a for r, a in zip(ladder, counts, strict=True)])
                     for name, counts in actual.items()}
    return out


def loop_cost(counter: TemplateCounter, directory: Path, texts: list[str], rounds: int) -> dict[str, object]:
    """The loop thread's CPU per request counting inline or through PromptCounter, per prompt size."""
    shared = PromptCounter(queue_bytes=1 << 30)
    built = build_tiers(decode_config(ladder_toml("http://127.0.0.1:9")), {})[0]  # its engine is never called
    tier = msgspec.structs.replace(built, model_dirs=(directory,))
    assert shared.wait_loaded([tier], timeout_s=120)
    out: dict[str, object] = {}
    for size in LOOP_SIZES:
        reqs = [request((t * (size // max(1, len(t)) + 1))[:size]) for t in texts]
        out[str(size)] = loop_row(counter, shared, tier, reqs, rounds)
    return out


def loop_row(counter: TemplateCounter, shared: PromptCounter, tier: Tier, reqs: list[ChatCompletionRequest],
             rounds: int) -> dict[str, dict[str, float]]:
    sizes = [len(msgspec.json.encode(r.messages)) for r in reqs]

    async def inline() -> None:
        for r in reqs:
            counter.count(r.messages)

    async def threaded() -> None:
        for r, s in zip(reqs, sizes, strict=True):
            await shared.count(r, [tier], s)

    row = {}
    for name, work in (("inline", inline), ("thread", threaded)):
        loop_times, walls = [], []
        for _ in range(rounds):
            start, wall = time.thread_time(), time.perf_counter()
            asyncio.run(work())
            loop_times.append((time.thread_time() - start) * 1e6 / len(reqs))
            walls.append((time.perf_counter() - wall) * 1e6 / len(reqs))
        row[name] = {"loop_us": round(statistics.median(loop_times), 1), "wall_us": round(statistics.median(walls), 1)}
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.frontdoor.prompt_count", description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=None, help="the shared data folder (default: cascade's)")
    parser.add_argument("--n", type=int, default=1319, help="GSM8K test questions (all: 1319)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--loop-n", type=int, default=200, help="requests per size in the loop measurement")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    gsm8k = (args.data or shared_data_dir()) / "gsm8k" / "test.jsonl"
    if not gsm8k.is_file():
        return fail(f"{gsm8k} is missing: point --data at the shared data folder")
    prepared = [model_dir(c) for c in all_cards() if is_prepared(c)]
    # One model per tokenizer file (Qwen2.5's 0.5B and 1.5B share theirs).
    models = {hashlib.sha256((d / "tokenizer.json").read_bytes()).digest(): d for d in reversed(prepared)}
    if not models:
        return fail("no embedded model is prepared: run `cascade models prepare`")
    load_before = os.getloadavg()[0]
    counters = {d.name: TemplateCounter.load(d) for d in models.values()}
    questions = [p.prompt for p in load_gsm8k(gsm8k)[:args.n]]
    english = [request(q) for q in questions]
    digits = [request(digits_like(q)) for q in questions]
    at_cap = request((" ".join(questions) * 4)[:COUNT_MAX_BYTES - 64])
    digits_at_cap = request(digits_like(at_cap.messages[0].text()))
    first = next(iter(models.values()))
    result = {
        "benchmark": "prompt_count",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "loadavg_before": load_before,
                    "note": "shares its cores with other work"},
        "config": {"data": recorded_path(gsm8k), "gsm8k": len(questions), "rounds": args.rounds,
                   "count_max_bytes": COUNT_MAX_BYTES, "models": list(counters)},
        "cost": {name: {"gsm8k": cost(c, english, args.rounds), "digits": cost(c, digits, args.rounds)}
                 for name, c in counters.items()},
        "ratio": ratios(counters, english),
        "loop": {first.name: loop_cost(counters[first.name], first, questions[:args.loop_n], args.rounds)},
        "cap": {name: {"english_ms": round(cpu_s(lambda c=c: c.count(at_cap.messages), args.rounds) * 1e3, 1),
                       "digits_ms": round(cpu_s(lambda c=c: c.count(digits_at_cap.messages), args.rounds) * 1e3, 1)}
                for name, c in counters.items()},
    }
    print_result(result, args.json_out, indent=2)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
