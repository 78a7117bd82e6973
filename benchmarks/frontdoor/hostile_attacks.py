"""The attacks of hostile_clients.py on a key's bill, the gateway's memory and its connections (issue 61), as clients:
cut streams, lies and pipelined slow bodies run in the attacker process beside the corpus in a phase; slow readers,
the budget drain and the body timeout's wait alone after the rounds. What they came to is judged in hostile_checks.py.

  * cut streams: a streamed request with a ~32k-character prompt, cut by the client after its first chunk, while its
    engine is still decoding (`[fake itl_ms=200]`: 3 s of tokens), so that the engine never reports its usage and the
    gateway bills the prompt at its bound (cascade/service/keys/reservation.py).
  * lies: requests whose engine reports impossible usage (negative, fractional, 10^12). The fake engine lies when
    the request's own `[fake usage=...]` directive says so (cascade/testing/fakes/script.py), so that only these
    requests meet a lying engine. The gateway's breaker would bench the tier after three (each is an engine fault)
    and answer the rest 503 before any engine saw them, billing nothing; the benchmark's config turns it off
    (`breaker_failures`), so that every lie reaches the engine and its bill is the one checked.
  * slow readers: streamed n = 8 requests of 400 tokens a choice with 20 top logprobs each (~4.8 MB of SSE through
    the gateway) read 256 bytes every 0.1 s through a 4 KiB receive buffer: what the servers hold for them is their
    memory (VmRSS, sampled every 0.5 s while they are held, twice).
  * pipelined slow bodies: `GET /health` and, on the same keep-alive connection, a POST whose body trickles 4 bytes a
    second: the POST's body timeout must apply behind the GET's answer (408 at `body_timeout_s`, 30 s).

Each attack has its own API key (`attack_keys`, in [[gateway.keys]]: a budget, a token limit and max_in_flight), so
that what each was billed is its key's alone. At the gateway a key's spend is its `cascade_key_budget_spent` gauge,
read after a request that reads the key's budget before routing (`downgrade_at` makes the gateway read it) and is
refused before it reserves anything (max_tokens over the limit: a 400): the gauge is then the ledger. The lies read it
after each lie (one at a time, so the change is that lie's bill); the cut streams, whose answers say the budget left
after their reservation (x-cascade-budget-remaining), read it once, after the last (hostile_checks.cut_bills). The
Envoy picker exports neither (cascade/extproc/metrics.py SHARED_PREFIXES): through Envoy a spend is read only from a
budget refusal's message (`has spent X USD`), so only the budget drain reads it there.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from cascade.service.bodies import decode_chat_request
from cascade.service.keys.reservation import estimate_prompt_tokens, estimate_tokens

# Every attack names this tier: no normal request is routed there (the report's `normal_routes`), and it has a fake
# engine of its own, so that the fake engine's own CPU for the attacks (a real engine's is a GPU's) is not spent on the
# normal requests' engine's event loop.
ATTACK_TIER = "qwen2.5-coder-0.5b"
DEFAULT_MAX_TOKENS = 16  # every tier's default_max_tokens in the benchmark's config
# Every tier costs 1 per million tokens, in and out: a key's spend x 1e6 is the tokens it was billed.
PRICE_TOML = "price = { input_per_mtok = 1, output_per_mtok = 1 }\n"
TOKENS_PER_UNIT = 1e6
BUDGET_PERIOD_S = 31_622_400  # the longest: one window for the whole run


@dataclass(frozen=True)
class AttackKey:
    name: str
    key: str
    max_in_flight: int
    budget: float

    @property
    def auth(self) -> str:
        return f"Bearer {self.key}"

    def toml(self) -> str:
        # downgrade_at: the gateway reads the key's budget before routing, which `spent_tokens` needs (served as
        # "fast" past it: the attacks name their tier, which a hint does not change).
        return (f'[[gateway.keys]]\nname = "{self.name}"\nsha256 = "{hashlib.sha256(self.key.encode()).hexdigest()}"\n'
                f"max_in_flight = {self.max_in_flight}\ntokens_per_minute = 50000000\nbudget = {self.budget}\n"
                f"budget_period = {BUDGET_PERIOD_S}\ndowngrade_at = 0.999999\n\n")


def attack_keys(readers: int, drain_workers: int, drain_budget: float) -> dict[str, AttackKey]:
    """The attacks' keys. Budgets far above what a run spends, but the drain's, which is to be reached."""
    return {
        "cut": AttackKey("cut-streams", "csk-hostile-cut-streams-0123456789abcdef0123", 2, 1000.0),
        "liar": AttackKey("liar", "csk-hostile-liar-0123456789abcdef0123456789ab", 1, 1000.0),  # 1: a leak refuses
        "readers": AttackKey("slow-readers", "csk-hostile-slow-readers-0123456789abcdef01", max(1, readers), 1000.0),
        "drain": AttackKey("budget-drain", "csk-hostile-budget-drain-0123456789abcdef01", drain_workers, drain_budget),
    }


@dataclass(frozen=True)
class AttackPlan:
    """What the attacker runs in a phase beside the corpus, and where."""

    keys: dict[str, AttackKey]
    cut_rate: float  # cut streams a second, one at a time (0: none)
    lie_rate: float  # lies a second, one at a time (0: none)
    pipelined: int  # pipelined slow-body connections, reopened when closed
    ledger: bool  # the target exports the keys' spend (the gateway does, the picker does not)


# --- bodies and what they reserve -------------------------------------------------------------------------------


def chat_body(tier: str, content: str, **fields: Any) -> bytes:
    return json.dumps({"model": tier, "messages": [{"role": "user", "content": content}], **fields}).encode()


CUT_BODY = chat_body(ATTACK_TIER, "Sam buys 12 apples for $3 each and sells them at a market. " * 540
                     + "How much does he earn? [fake itl_ms=200]", stream=True, max_tokens=DEFAULT_MAX_TOKENS)
# 20 top logprobs a token make each token's SSE frame ~1.5 kB: 8 x 400 tokens are ~4.8 MB of answer, more than the
# kernel buffers between the gateway and a reader with a 4 KiB receive buffer (measured: ~2.8 MB), in few frames.
# Unpaced (itl_ms=0): the engine sends it all at once and the gateway reads it in large pieces (paced at 10 ms a token,
# the same answer cost the gateway 6x the CPU, ~0.6 s: a wake-up per token per choice).
READER_TOKENS = 400
READER_BODY = chat_body(ATTACK_TIER, f"Count to {READER_TOKENS}. [fake tokens={READER_TOKENS} itl_ms=0]", stream=True,
                        n=8, max_tokens=READER_TOKENS, logprobs=True, top_logprobs=20)
# The engine's lies, as its usage object; prompt bound 4,096 + the body, completion bound max_tokens x n.
LIES: dict[str, dict[str, int | float]] = {
    "negative_prompt": {"prompt_tokens": -5, "completion_tokens": 16, "total_tokens": 11},
    "fractional_prompt": {"prompt_tokens": 12.5, "completion_tokens": 16, "total_tokens": 28.5},
    "prompt_10e12": {"prompt_tokens": 10**12, "completion_tokens": 16, "total_tokens": 10**12 + 16},
    "completion_10e12": {"prompt_tokens": 8, "completion_tokens": 10**12, "total_tokens": 10**12 + 8},
}


def lie_body(kind: str, stream: bool) -> bytes:
    usage = json.dumps(LIES[kind], separators=(",", ":"))
    return chat_body(ATTACK_TIER, f"What is 2 + 2? [fake usage={usage}]", stream=stream, max_tokens=DEFAULT_MAX_TOKENS)


def reserved(body: bytes) -> tuple[int, int]:
    """(the prompt's bound, every token reserved) for `body` on a tier without branches or system prompt: what the
    gateway bills a prompt the engine never counted, and the most it bills the request."""
    req = decode_chat_request(body)
    return estimate_prompt_tokens(req), estimate_tokens(req, 1, DEFAULT_MAX_TOKENS)


# --- a key's spend ----------------------------------------------------------------------------------------------


async def spent_tokens(session: aiohttp.ClientSession, base: str, key: AttackKey) -> float | None:
    """What `key` has spent and holds reserved at the gateway at `base`, in tokens (None: the gauge is not there). One
    read costs the gateway ~5 ms of CPU (its /metrics): the attacks read it once a request at most."""
    probe = chat_body(ATTACK_TIER, "x", max_tokens=10**9)  # 400 after the budget's read, before any reservation
    async with session.post(base + "/v1/chat/completions", data=probe,
                            headers={"authorization": key.auth, "content-type": "application/json"}) as reply:
        await reply.read()
    async with session.get(base + "/metrics") as reply:
        text = await reply.text()
    gauge = f'cascade_key_budget_spent{{key="{key.name}"}} '
    found = re.search("^" + re.escape(gauge) + r"(\S+)$", text, re.M)
    return None if found is None else round(float(found.group(1)) * TOKENS_PER_UNIT, 3)


# --- cut streams and lies ---------------------------------------------------------------------------------------


async def cut_stream(session: aiohttp.ClientSession, base: str, key: AttackKey) -> tuple[str, float | None]:
    """The status line and the first chunk, then the connection closed: ("200", or what refused it (`outcome`); the
    key's budget left after this request's reservation, x-cascade-budget-remaining, where the target says it)."""
    headers = {"authorization": key.auth, "content-type": "application/json"}
    try:
        async with session.post(base + "/v1/chat/completions", data=CUT_BODY, headers=headers) as reply:
            if reply.status != 200:
                return outcome(reply.status, await reply.read()), None
            left = reply.headers.get("x-cascade-budget-remaining")
            await reply.content.readany()
            reply.close()
            return "200", None if left is None else float(left) * TOKENS_PER_UNIT
    except (TimeoutError, aiohttp.ClientError) as exc:
        return type(exc).__name__, None


async def cut_streams(base: str, key: AttackKey, stop_at: float, rate: float, ledger: bool) -> dict[str, Any]:
    """Cut streams one at a time at `rate` a second until `stop_at`: each one's outcome and the budget its answer
    said was left, and with `ledger` the key's spend once the last had settled (what each was billed follows:
    hostile_checks.cut_bills)."""
    sent: list[dict[str, Any]] = []
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(force_close=True)) as session:
        due = time.monotonic()
        while rate > 0 and time.monotonic() < stop_at:
            result, left = await cut_stream(session, base, key)
            sent.append({"outcome": result, "budget_left": left})
            due += 1 / rate
            await asyncio.sleep(max(0.0, due - time.monotonic()))
        await asyncio.sleep(0.3)  # the last one settles (the gateway notices its client left)
        spent = await spent_tokens(session, base, key) if ledger and sent else None
    return {"sent": sent, "spent_after": spent}


def outcome(status: int, body: bytes) -> str:
    """What an answer to a lie came to: its status, and the error it carried (an in-band one after a 200)."""
    text = body.decode(errors="replace")
    if "insufficient_quota" in text:
        kind = "budget_refused"
    elif "impossible for this request" in text:
        kind = "usage_fault"
    elif "unreadable stream chunk" in text:
        kind = "unreadable_chunk"
    elif "no replica can take" in text:
        kind = "replica_benched"
    elif "in flight" in text and status == 429:
        kind = "in_flight_refused"
    elif '"error"' in text:
        kind = "other_error"
    else:
        kind = "answered"
    return f"{status}:{kind}"


async def lies(base: str, key: AttackKey, stop_at: float, rate: float, ledger: bool) -> list[dict[str, Any]]:
    """Lies one at a time at `rate` a second, each kind streamed and not in turn; with `ledger`, what each was billed
    (the key's spend before and after it: its key has one request in flight at most, so it is that request's)."""
    combos = [(kind, stream) for kind in LIES for stream in (False, True)]
    sent: list[dict[str, Any]] = []
    timeout = aiohttp.ClientTimeout(total=30)
    headers = {"authorization": key.auth, "content-type": "application/json"}
    async with aiohttp.ClientSession(timeout=timeout) as session:
        before = await spent_tokens(session, base, key) if ledger and rate > 0 else None
        due, i = time.monotonic(), 0
        while rate > 0 and time.monotonic() < stop_at:
            kind, stream = combos[i % len(combos)]
            i += 1
            body = lie_body(kind, stream)
            try:
                async with session.post(base + "/v1/chat/completions", data=body, headers=headers) as reply:
                    result = outcome(reply.status, await reply.read())
            except (TimeoutError, aiohttp.ClientError) as exc:
                result = type(exc).__name__
            await asyncio.sleep(0.2)  # a stream's lease is given back as its last frame goes
            after = await spent_tokens(session, base, key) if ledger else None
            bound, most = reserved(body)
            sent.append({"kind": kind, "stream": stream, "outcome": result, "prompt_bound": bound, "reserved": most,
                         "billed": None if after is None or before is None else round(after - before, 3)})
            before = after
            due += 1 / rate
            await asyncio.sleep(max(0.0, due - time.monotonic()))
    return sent


# --- slow readers and pipelined slow bodies ---------------------------------------------------------------------


def rss_kib(pid: int) -> int | None:
    """VmRSS of `pid` (KiB), from /proc/PID/status."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return None


def request_bytes(host: str, path: str, body: bytes, auth: str, method: str = "POST") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\nauthorization: {auth}\r\n"
    return (head + f"content-length: {len(body)}\r\n\r\n").encode() + body


async def slow_reader(host: str, port: int, key: AttackKey, stop_at: float) -> dict[str, Any]:
    """One n = 8 stream read 256 bytes every 0.1 s through a 4 KiB receive buffer until `stop_at` or its end."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window the server sees
    sock.setblocking(False)
    t0, read, head = time.monotonic(), 0, b""
    try:
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
        reader, writer = await asyncio.open_connection(sock=sock, limit=1024)
    except OSError as exc:
        sock.close()
        return {"status": type(exc).__name__, "bytes_read": 0, "seconds": 0.0, "ended_by": "connect_failed"}
    ended_by = "phase_end"
    try:
        writer.write(request_bytes(host, "/v1/chat/completions", READER_BODY, key.auth))
        while time.monotonic() < stop_at:
            chunk = await asyncio.wait_for(reader.read(256), max(0.01, stop_at - time.monotonic()))
            if not chunk:
                ended_by = "server_closed"
                break
            head = head or chunk
            read += len(chunk)
            await asyncio.sleep(0.1)
    except TimeoutError:
        pass
    except OSError as exc:
        ended_by = type(exc).__name__
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 1)
    status = head.split(b"\r\n", 1)[0].decode(errors="replace") or "nothing"
    return {"status": status, "bytes_read": read, "seconds": round(time.monotonic() - t0, 2), "ended_by": ended_by}


async def slow_readers(host: str, port: int, key: AttackKey, stop_at: float, readers: int, pids: dict[str, int]
                       ) -> dict[str, Any]:
    """`readers` slow readers for the phase, and the servers' VmRSS every 0.5 s while they are held: memory that
    stays flat once the buffers between the engine and the readers are full is bounded, whatever the answers' size."""
    tasks = [asyncio.create_task(slow_reader(host, port, key, stop_at)) for _ in range(readers)]
    samples: dict[str, list[int | None]] = {name: [] for name in pids}
    while readers and time.monotonic() < stop_at - 0.2:
        await asyncio.sleep(min(0.5, max(0.0, stop_at - 0.2 - time.monotonic())))
        for name, pid in pids.items():
            samples[name].append(rss_kib(pid))
    return {"readers": await asyncio.gather(*tasks), "rss_kib_samples": samples}


async def read_slowly(url: str, pids: dict[str, int], key: AttackKey, readers: int, seconds: float, holds: int = 2
                      ) -> dict[str, Any]:
    """Slow readers alone on the target at `url`, `holds` times for `seconds` each, with its processes' (`pids`)
    VmRSS before, during and after each: memory a second hold does not add to was not kept for the first. Alone: up
    to the buffers' fill, a slow reader's answer is an ordinary stream's (measured alone, two cost the gateway 0.23 s
    of CPU in their first second, then ~0, and the fake engine as much again), a burst of legitimate load on the cores
    the normal clients share, which a p99 beside the corpus is not about; what they hold once the buffers are full,
    their memory, is."""
    host, port = url.removeprefix("http://").split(":")
    before = {name: rss_kib(pid) for name, pid in pids.items()}
    done = []
    for _ in range(holds):
        held = await slow_readers(host, int(port), key, time.monotonic() + seconds, readers, pids)
        await asyncio.sleep(1.0)  # the cut streams closed upstream
        done.append({**held, "rss_kib_after": {name: rss_kib(pid) for name, pid in pids.items()}})
    return {"rss_kib_before": before, "holds": done}


async def pipelined_slow_body(host: str, port: int, auth: str, stop_at: float, bytes_per_s: float = 4.0
                              ) -> dict[str, Any]:
    """`GET /health`, then on the same connection a POST whose 100,000-byte body trickles, until the server closes
    the connection or `stop_at`: how long it stayed open, and the status lines it got."""
    t0 = time.monotonic()
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError as exc:
        return {"seconds_open": 0.0, "statuses": [], "ended_by": type(exc).__name__}
    get = f"GET /health HTTP/1.1\r\nhost: {host}\r\n\r\n".encode()
    post = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
            f"authorization: {auth}\r\ncontent-length: 100000\r\n\r\n").encode()
    writer.write(get + post)
    received, ended_by = b"", "phase_end"
    answer = asyncio.ensure_future(reader.read(65536))
    trickle = b'{"model":"cascade","messages":[' + b" " * 99_968
    try:
        for i in range(len(trickle)):
            if time.monotonic() >= stop_at:
                break
            await asyncio.wait([answer], timeout=min(1 / bytes_per_s, max(0.0, stop_at - time.monotonic())))
            if answer.done():
                chunk = answer.result()
                if not chunk:
                    ended_by = "server_closed"
                    break
                received += chunk
                answer = asyncio.ensure_future(reader.read(65536))
            writer.write(trickle[i:i + 1])
    except OSError as exc:
        # A server that answered 408 and closed while the body still trickled in resets the connection (Envoy does):
        # the client's next write meets the reset, which is the server closing it, not the client's fault.
        timed_out = isinstance(exc, ConnectionResetError | BrokenPipeError) and b"HTTP/1.1 408" in received
        ended_by = "server_reset" if timed_out else type(exc).__name__
    finally:
        answer.cancel()
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 1)
    statuses = re.findall(rb"HTTP/1\.1 (\d{3})", received)
    return {"seconds_open": round(time.monotonic() - t0, 2), "statuses": [int(s) for s in statuses],
            "ended_by": ended_by}


async def waited_out(urls: list[str], auth: str, connections: int, wait_s: float) -> list[list[dict[str, Any]]]:
    """`connections` pipelined slow bodies on every target (`urls`) at once, waited out for `wait_s` (past the
    gateway's 30 s body timeout): when, and with what, each target closed them."""
    stop_at = time.monotonic() + wait_s

    async def on(url: str) -> list[dict[str, Any]]:
        host, port = url.removeprefix("http://").split(":")
        return list(await asyncio.gather(*(pipelined_slow_body(host, int(port), auth, stop_at)
                                           for _ in range(connections))))

    return list(await asyncio.gather(*(on(url) for url in urls)))


async def pipelined_slow_bodies(host: str, port: int, auth: str, stop_at: float, connections: int
                                ) -> list[dict[str, Any]]:
    """`connections` pipelined slow bodies, each reopened when the server closes it, until `stop_at`."""
    async def one() -> list[dict[str, Any]]:
        done = []
        while time.monotonic() < stop_at - 0.5:
            done.append(await pipelined_slow_body(host, port, auth, stop_at))
        return done

    return [record for records in await asyncio.gather(*(one() for _ in range(connections))) for record in records]


# --- after the rounds: in-flight places, the budget drain -------------------------------------------------------


async def in_flight_check(base: str, key: AttackKey) -> dict[str, int]:
    """`key`'s max_in_flight requests at once: the statuses, and how many were refused for requests in flight (a
    place some earlier request never gave back)."""
    body = chat_body(ATTACK_TIER, "What is 2 + 2?", max_tokens=1)
    headers = {"authorization": key.auth, "content-type": "application/json"}

    async def one(session: aiohttp.ClientSession) -> str:
        try:
            async with session.post(base + "/v1/chat/completions", data=body, headers=headers) as reply:
                return outcome(reply.status, await reply.read())
        except (TimeoutError, aiohttp.ClientError) as exc:
            return type(exc).__name__

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        results = await asyncio.gather(*(one(session) for _ in range(key.max_in_flight)))
    counts: dict[str, int] = {}
    for result in results:
        counts[result] = counts.get(result, 0) + 1
    return counts


async def drain(base: str, key: AttackKey, cap_s: float, ledger: bool) -> dict[str, Any]:
    """Spend `key`'s budget: max_in_flight workers sending cut streams and lies in turn until a budget refusal (or
    `cap_s`); then, once they have settled, what it spent, from one more request's refusal (and the gauge where the
    target has it). A lie sent right after its worker's cut may find the key's places all held, the cut's among them
    (the gateway gives a cut stream's back when it notices the client left): refused for a place in flight, counted,
    and no leak (the check after each phase is the leak check)."""
    stop_at = time.monotonic() + cap_s
    counts: dict[str, int] = {}
    headers = {"authorization": key.auth, "content-type": "application/json"}

    async def worker(session: aiohttp.ClientSession, w: int) -> None:
        i = w
        while time.monotonic() < stop_at:
            if i % 2 == 0:
                result = "cut:" + (await cut_stream(session, base, key))[0]
            else:
                async with session.post(base + "/v1/chat/completions", data=lie_body("negative_prompt", False),
                                        headers=headers) as reply:
                    result = "lie:" + outcome(reply.status, await reply.read())
            i += 1
            counts[result] = counts.get(result, 0) + 1
            if result.endswith("budget_refused"):
                return

    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(force_close=True)) as session:
        await asyncio.gather(*(worker(session, w) for w in range(key.max_in_flight)))
        await asyncio.sleep(1.0)  # the last cut streams settle
        async with session.post(base + "/v1/chat/completions", headers=headers,
                                data=chat_body(ATTACK_TIER, "What is 2 + 2?", max_tokens=1)) as reply:
            refusal = (reply.status, (await reply.text())[:400])
        gauge = await spent_tokens(session, base, key) if ledger else None
    return {"outcomes": counts, "refusal_after": refusal, "gauge_tokens": gauge}
