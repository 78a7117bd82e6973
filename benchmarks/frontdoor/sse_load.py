"""A lean load client for streamed chat completions, run as its own process by benchmarks/frontdoor/peer_gateways.py.

Why not aiohttp or httpx: on this 2-core box the client shares the cores with the engine and the gateway it
measures, so every microsecond it spends per token is one the gateway does not get. This one is uvloop (when
installed) + httptools over asyncio Protocols: HTTP/1.1 keep-alive connections, one request on a connection at a
time, the body fed to httptools' C parser (chunked or sized) and scanned for the fake engine's tokens ("t0 ",
"t1 ", ...) only until the first one; the rest is counted once, when the response is complete.

Modes (SPEC is one JSON object on the command line; the result is one JSON object on stdout):
  * "closed": `concurrency` workers, each on its own connection, send back to back; TTFT runs from the write.
  * "open": Poisson arrivals at `rate`/s (seeded, so every target sees the same arrivals); a request takes an
    idle connection or opens one; TTFT runs from its *scheduled* time, so a client that falls behind shows up as
    latency (no coordinated omission) and as `lag_ms`.
A request counts if it started inside the window (after `warmup_s`, for `window_s`); those still running at the
end get `drain_s` to finish, else they are errors. A request is ok when it answered 200, ended with
`data: [DONE]` and carried all `tokens` tokens.

SPEC: {"port", "path", "body", "tokens", "mode", "concurrency" | "rate", "seed", "warmup_s", "window_s",
"drain_s"}. Result: ttft_ms (sorted, the ok requests in the window), ok, errors, started (every request,
warm-up included), cpu_s and wall_s of this process, lag_ms (open mode: p50/p99 of how late requests started),
loop ("uvloop" or "asyncio").
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import random
import re
import sys
import time
from typing import Any

import httptools

try:
    import uvloop
except ImportError:  # plain asyncio still works; the result says which loop ran
    uvloop = None  # type: ignore[assignment]

TOKEN = re.compile(rb"t\d+ ")
DONE = b"data: [DONE]"


class Connection(asyncio.Protocol):
    """One keep-alive connection; `request` sends the prepared bytes and resolves with (TTFT s or None, ok)."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self.transport: Any = None  # uvloop's transports are not asyncio.Transport subclasses
        self.parser = httptools.HttpResponseParser(self)
        self.done: asyncio.Future[tuple[float | None, bool]] | None = None
        self.closed = False
        # the request in flight
        self.t0, self.status = 0.0, 0
        self.ttft: float | None = None
        self.body: list[bytes] = []
        self.pending = b""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._finish(False)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._finish(False)
            self.close()

    def request(self, raw: bytes, t0: float) -> asyncio.Future[tuple[float | None, bool]]:
        self.t0, self.ttft, self.status, self.body, self.pending = t0, None, 0, [], b""
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(raw)
        return self.done

    # httptools callbacks
    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        if self.ttft is None:
            seen = self.pending + body
            if TOKEN.search(seen):
                self.ttft = time.perf_counter() - self.t0
            self.pending = seen[-8:]  # a token cut between two reads

    def on_message_complete(self) -> None:
        whole = b"".join(self.body)
        ok = self.status == 200 and DONE in whole and len(TOKEN.findall(whole)) == self.tokens
        if not self.parser.should_keep_alive():
            self.close()
        self._finish(ok)

    def _finish(self, ok: bool) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result((self.ttft, ok))

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Run:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        body = spec["body"].encode()
        self.raw = (f"POST {spec['path']} HTTP/1.1\r\nHost: 127.0.0.1:{spec['port']}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
        self.ttft: list[float] = []
        self.lag: list[float] = []
        self.ok = self.errors = self.started = self.counted = 0
        self.idle: collections.deque[Connection] = collections.deque()

    async def connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(lambda: Connection(self.spec["tokens"]), "127.0.0.1",
                                               self.spec["port"])
        return conn

    async def one(self, conn: Connection | None, t0: float, counted: bool) -> Connection | None:
        """One request (on `conn`, or a new connection); returns the connection if it can be reused."""
        self.started += 1
        self.counted += counted
        try:
            if conn is None or conn.closed:
                conn = await self.connect()
            ttft, ok = await conn.request(self.raw, t0)
        except OSError:
            ttft, ok, conn = None, False, None
        if counted:
            if ok and ttft is not None:
                self.ok += 1
                self.ttft.append(ttft * 1e3)
            else:
                self.errors += 1
        return conn if conn is not None and not conn.closed else None

    async def closed_loop(self, w0: float, w1: float) -> None:
        concurrency = self.spec["concurrency"]
        # Spread the first requests over one stream's length so that the workers do not move in lock step.
        spread_s = min(self.spec["warmup_s"], self.spec.get("stream_s", 0.2))

        async def worker(i: int) -> None:
            await asyncio.sleep(i * spread_s / concurrency)
            conn: Connection | None = None
            while (t0 := time.perf_counter()) < w1:
                conn = await self.one(conn, t0, t0 >= w0)

        await asyncio.gather(*(worker(i) for i in range(concurrency)))

    async def open_loop(self, w0: float, w1: float) -> None:
        rng = random.Random(self.spec["seed"])
        rate, arrivals, t = self.spec["rate"], [], w0 - self.spec["warmup_s"]
        while (t := t + rng.expovariate(rate)) < w1:
            arrivals.append(t)
        tasks: set[asyncio.Task[None]] = set()

        async def fire(at: float, counted: bool) -> None:
            conn = self.idle.pop() if self.idle else None
            kept = await self.one(conn, at, counted)
            if kept is not None:
                self.idle.append(kept)

        for at in arrivals:
            if (wait := at - time.perf_counter()) > 0:
                await asyncio.sleep(wait)
            counted = at >= w0
            if counted:
                self.lag.append((time.perf_counter() - at) * 1e3)
            task = asyncio.get_running_loop().create_task(fire(at, counted))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(set(tasks))

    async def main(self) -> dict[str, Any]:
        spec = self.spec
        start = time.perf_counter()
        w0 = start + spec["warmup_s"]
        w1 = w0 + spec["window_s"]
        loop_fn = self.closed_loop if spec["mode"] == "closed" else self.open_loop
        task = asyncio.ensure_future(loop_fn(w0, w1))
        with contextlib.suppress(TimeoutError):  # requests still running count as errors below
            await asyncio.wait_for(asyncio.shield(task), w1 - start + spec["drain_s"])
        unfinished = self.counted - self.ok - self.errors  # in the window, still running at the deadline
        return {"ttft_ms": sorted(round(v, 4) for v in self.ttft), "ok": self.ok, "errors": self.errors + unfinished,
                "started": self.started, "wall_s": round(time.perf_counter() - start, 3)}


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))], 3)


def main() -> int:
    spec = json.loads(sys.argv[1])
    run = Run(spec)
    cpu0 = time.process_time()
    if uvloop is not None:
        uvloop.install()
    result = asyncio.run(run.main())
    result.update(cpu_s=round(time.process_time() - cpu0, 4), loop="uvloop" if uvloop is not None else "asyncio",
                  lag_ms={"p50": percentile(run.lag, 50), "p99": percentile(run.lag, 99)})
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)  # connections still open at the drain deadline: no orderly teardown to wait for


if __name__ == "__main__":
    sys.exit(main())
