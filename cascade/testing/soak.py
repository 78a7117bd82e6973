"""A soak's requests and their verdicts, shared by benchmarks/soaks/fault.py and benchmarks/soaks/scaleout.py:
`send_chat` sends one chat request and classifies what the client received, `keep_in_flight` keeps `concurrency`
of them going, `counts` counts the verdicts.

The verdict (`classify`), one per request, is what "0 broken successes" counts:

* `ok_correct`: 200, exactly the expected answer, finish `stop`, and for a stream `[DONE]` as its last event;
* `error_reported`: a clean refusal: an error status with an OpenAI error object, or an `{"error": ...}` in a 200
  body or in a stream's event;
* `broken_success`: 200 and no error, but not that answer (other text, no `stop`, a malformed event, no `[DONE]`
  at the end): the number that must be 0;
* `lost`: no status, the connection failed or was cut before the body ended, or an error status without an error
  object;
* `hung`: the client's timeout fired.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

KINDS = ("ok_correct", "broken_success", "error_reported", "hung", "lost")


@dataclass(frozen=True)
class Outcome:
    """One request: its verdict, its status (None: no response), when it started and ended (perf_counter), what the
    client saw (for a report's samples of non-ok ones), the response's `cascade` object (retries, fallback_from) and
    the caller's id for it."""

    kind: str
    status: int | None
    started: float
    ended: float
    detail: str = ""
    cascade: dict[str, Any] = field(default_factory=dict)
    marker: str = ""

    @property
    def latency_s(self) -> float:
        return self.ended - self.started


def classify(status: int | None, raw: bytes, stream: bool, expected: str, cut: bool) -> tuple[str, dict[str, Any]]:
    """(kind, the response's `cascade` object or {}) from what the client received; `cut`: the connection failed or
    closed before the body ended."""
    if status is None:
        return "lost", {}
    if status != 200:
        with contextlib.suppress(ValueError):
            body = json.loads(raw)
            if isinstance(body, dict) and isinstance(body.get("error"), dict):
                return "error_reported", {}
        return "lost", {}
    return _classify_stream(raw, expected, cut) if stream else _classify_completion(raw, expected, cut)


def _classify_completion(raw: bytes, expected: str, cut: bool) -> tuple[str, dict[str, Any]]:
    try:
        body = json.loads(raw)
        if "error" in body:
            return "error_reported", {}
        choice = body["choices"][0]
        content, finish = choice["message"]["content"], choice["finish_reason"]
    except (ValueError, KeyError, IndexError, TypeError):
        return ("lost" if cut else "broken_success"), {}
    info = body["cascade"] if isinstance(body.get("cascade"), dict) else {}
    if cut:
        return "lost", info
    return ("ok_correct" if content == expected and finish == "stop" else "broken_success"), info


def _classify_stream(raw: bytes, expected: str, cut: bool) -> tuple[str, dict[str, Any]]:
    content: list[str] = []
    finishes: list[str | None] = []
    done = malformed = error = False
    info: dict[str, Any] = {}
    for line in raw.decode(errors="replace").splitlines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        malformed = malformed or done  # anything after `[DONE]` (another one included) breaks the stream
        if data == "[DONE]":
            done = True
            continue
        try:
            event = json.loads(data)
            assert isinstance(event, dict)
        except (ValueError, AssertionError):
            malformed = True
            continue
        error = error or "error" in event
        info = event["cascade"] if isinstance(event.get("cascade"), dict) else info
        for choice in event.get("choices") or []:
            content.append((choice.get("delta") or {}).get("content") or "")
            finishes.append(choice.get("finish_reason"))
    if error or cut:
        return ("error_reported" if error else "lost"), info
    good = done and not malformed and "".join(content) == expected and "stop" in finishes
    return ("ok_correct" if good else "broken_success"), info


async def send_chat(client: httpx.AsyncClient, url: str, body: dict[str, Any], expected: str, timeout_s: float, *,
                    headers: dict[str, str] | None = None, marker: str = "", label: str = "") -> Outcome:
    """POST the chat request `body` to `url`, read the whole response within `timeout_s` and classify it against the
    answer `expected`; a non-ok outcome's detail starts with `label`."""
    stream = bool(body.get("stream"))
    status, raw, error, hung = None, bytearray(), "", False
    started = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s), client.stream("POST", url, json=body, headers=headers) as response:
            status = response.status_code
            async for chunk in response.aiter_bytes():
                raw += chunk
    except (TimeoutError, httpx.TimeoutException) as exc:
        error, hung = type(exc).__name__, True
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"
    ended = time.perf_counter()
    kind, info = ("hung", {}) if hung else classify(status, bytes(raw), stream, expected, cut=bool(error))
    detail = "" if kind == "ok_correct" else f"{label}stream={stream} status={status} {error} {bytes(raw[-400:])!r}"
    return Outcome(kind, status, started, ended, detail, info, marker)


async def keep_in_flight(send: Callable[[int], Awaitable[Outcome]], n: int, concurrency: int, into: list[Outcome],
                         until: asyncio.Task[Any] | None = None, on_each: Callable[[], None] | None = None) -> None:
    """Send requests 0, 1, 2, ... (`send(i)`), `concurrency` at a time: `n` of them, or with `until` at least `n`
    and until that task is done. Each outcome is appended to `into` as it completes (a fault schedule may watch its
    length), then `on_each` is called (a progress bar)."""
    sent = 0

    async def worker() -> None:
        nonlocal sent
        while sent < n or (until is not None and not until.done()):
            i, sent = sent, sent + 1
            into.append(await send(i))
            if on_each is not None:
                on_each()

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def counts(outcomes: Sequence[Outcome], names: Mapping[str, str] | None = None) -> dict[str, int]:
    """How many outcomes of each kind (0 where none), in KINDS' order; with `names` ({kind: a report's own name},
    every kind), under those names in that order."""
    found = Counter(o.kind for o in outcomes)
    return {name: found[kind] for kind, name in (names or {k: k for k in KINDS}).items()}
