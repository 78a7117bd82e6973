"""Overload: does one stalled tier starve the others? Prints one JSON object.

Method
  * `cascade fake-server` (16 tokens, 5 ms apart) and `cascade serve` with the three-tier ladder of
    tests/gateway/gateway_setup.py (every tier on that engine; read timeout 5 s), both on free 127.0.0.1 ports
    in their own process groups, killed at the end.
  * Phase 1, `--seconds`: closed-loop chat requests to the cheapest tier at `--concurrency` (the baseline).
  * Phase 2, `--seconds`: the same, while `--stall-concurrency` clients keep sending requests to the top
    tier that the engine holds for `--stall-ms` before its first token (a `[fake@fake-2 ttft_ms=...]`
    directive: a stalled tier). A client told 429 waits as `Retry-After` says (at most 1 s), as the
    OpenAI SDK does.
  * `--limits` is the `[gateway.limits]` table of the gateway (default: 128 in flight in all, 32 per tier).

Reported per phase and target: requests, statuses, requests/s, latency p50/p99 (ms); for 429s also their
latency and whether they carried Retry-After. Run it on the code before per-tier admission with
`--limits 'max_in_flight = 32'` (that code knows no per-tier limit) to see the starvation this prevents.
Usage: .venv/bin/python -m benchmarks.frontdoor.overload [--seconds 10] [--limits 'max_in_flight = 128 ...']
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from cascade.testing.scripts import print_result
from cascade.testing.servers import cascade_serve, fake_engine


class Tally:
    def __init__(self) -> None:
        self.statuses: Counter[str] = Counter()
        self.latency_ms: list[float] = []
        self.refused_ms: list[float] = []
        self.retry_after = 0

    def summary(self, seconds: float) -> dict[str, Any]:
        def pct(values: list[float], q: float) -> float | None:
            return round(float(np.percentile(values, q)), 1) if values else None

        ok = self.statuses.get("200", 0)
        return {"requests": sum(self.statuses.values()), "statuses": dict(sorted(self.statuses.items())),
                "ok_rps": round(ok / seconds, 1), "ok_p50_ms": pct(self.latency_ms, 50),
                "ok_p99_ms": pct(self.latency_ms, 99), "refused_429_p50_ms": pct(self.refused_ms, 50),
                "refused_429_with_retry_after": self.retry_after}


async def loop(client: httpx.AsyncClient, url: str, body: dict[str, Any], until: float, tally: Tally) -> None:
    while time.monotonic() < until:
        start = time.perf_counter()
        try:
            response = await client.post(url, json=body)
            status = str(response.status_code)
        except httpx.HTTPError as exc:
            status = type(exc).__name__
            response = None
        elapsed_ms = 1000 * (time.perf_counter() - start)
        tally.statuses[status] += 1
        if status == "200":
            tally.latency_ms.append(elapsed_ms)
        elif status == "429" and response is not None:
            tally.refused_ms.append(elapsed_ms)
            tally.retry_after += "retry-after" in response.headers
            # As the OpenAI SDK does: wait as told (at most 1 s here), else a little.
            await asyncio.sleep(min(1.0, float(response.headers.get("retry-after", 0.1))))


async def phase(base: str, args: argparse.Namespace, stalled: bool) -> dict[str, Any]:
    url = f"{base}/v1/chat/completions"
    limits = httpx.Limits(max_connections=args.concurrency + args.stall_concurrency + 8)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        until = time.monotonic() + args.seconds
        small, large = Tally(), Tally()
        work = [loop(client, url, {"model": "tier-small", "messages": [{"role": "user", "content": "hi"}]},
                     until, small) for _ in range(args.concurrency)]
        if stalled:
            stall = {"model": "tier-large", "messages": [
                {"role": "user", "content": f"hi [fake@fake-2 ttft_ms={args.stall_ms}]"}]}
            work += [loop(client, url, stall, until, large) for _ in range(args.stall_concurrency)]
        await asyncio.gather(*work)
    result = {"tier-small": small.summary(args.seconds)}
    if stalled:
        result["tier-large (stalled)"] = large.summary(args.seconds)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per phase")
    parser.add_argument("--concurrency", type=int, default=16, help="clients of the cheapest tier")
    parser.add_argument("--stall-concurrency", type=int, default=48, help="clients of the stalled tier")
    parser.add_argument("--stall-ms", type=int, default=4000, help="the stalled tier's time to first token")
    parser.add_argument("--limits", default="max_in_flight = 128\nmax_in_flight_per_tier = 32",
                        help="the gateway's [gateway.limits] table (TOML lines)")
    parser.add_argument("--json-out", help="also write the JSON here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp, fake_engine(Path(tmp), "--tokens", "16", "--itl-ms", "5") as engine, \
            cascade_serve(Path(tmp), engine, f"[gateway.limits]\n{args.limits}\n") as served:
        result = {"config": {"limits": args.limits, "seconds": args.seconds, "concurrency": args.concurrency,
                             "stall_concurrency": args.stall_concurrency, "stall_ms": args.stall_ms},
                  "alone": asyncio.run(phase(served.url, args, stalled=False)),
                  "beside_a_stalled_tier": asyncio.run(phase(served.url, args, stalled=True))}
    print_result(result, args.json_out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
