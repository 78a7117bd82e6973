"""cascade/testing/soak.py: the verdict both soak benchmarks give each request (what "0 broken successes" counts),
and the loop that keeps requests in flight."""

from __future__ import annotations

import asyncio
import json

import pytest

from cascade.testing.soak import KINDS, Outcome, classify, counts, keep_in_flight

EXPECTED = "t0 t1 "


def completion(content: str = EXPECTED, finish: str = "stop", **extra: object) -> bytes:
    return json.dumps({"choices": [{"message": {"content": content}, "finish_reason": finish}], **extra}).encode()


def stream(*events: object, done: bool = True) -> bytes:
    lines = [f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in events]
    return "".join(lines + (["data: [DONE]\n\n"] if done else [])).encode()


def delta(content: str, finish: str | None = None) -> dict:
    return {"choices": [{"delta": {"content": content}, "finish_reason": finish}]}


ERROR = {"error": {"message": "upstream failed", "code": "upstream_unavailable"}}


@pytest.mark.parametrize(("status", "raw", "is_stream", "cut", "kind"), [
    (200, completion(), False, False, "ok_correct"),
    (200, stream(delta("t0 "), delta("t1 ", "stop")), True, False, "ok_correct"),
    (503, json.dumps(ERROR).encode(), False, False, "error_reported"),
    (200, json.dumps(ERROR).encode(), False, False, "error_reported"),
    (200, stream(delta("t0 "), ERROR), True, False, "error_reported"),
    (200, completion("t0 "), False, False, "broken_success"),
    (200, completion(finish="length"), False, False, "broken_success"),
    (200, stream(delta("t0 "), delta("t1 ", "stop"), done=False), True, False, "broken_success"),
    (200, stream(delta("t0 "), "{oops", delta("t1 ", "stop")), True, False, "broken_success"),
    (200, stream(delta("t0 "), "[DONE]", delta("t1 ", "stop")), True, False, "broken_success"),
    (None, b"", False, True, "lost"),
    (502, b"<html>bad gateway</html>", False, False, "lost"),
    (200, stream(delta("t0 ")), True, True, "lost"),
    (200, completion()[:10], False, True, "lost"),
])
def test_each_response_gets_one_verdict(status: int | None, raw: bytes, is_stream: bool, cut: bool,
                                        kind: str) -> None:
    assert classify(status, raw, is_stream, EXPECTED, cut)[0] == kind


def test_the_verdict_carries_the_gateways_cascade_object() -> None:
    raw = completion(cascade={"retries": 1, "fallback_from": None})
    assert classify(200, raw, False, EXPECTED, cut=False) == ("ok_correct", {"retries": 1, "fallback_from": None})


def test_counts_name_every_kind_even_when_none_happened() -> None:
    outcomes = [Outcome("ok_correct", 200, 0.0, 1.0), Outcome("lost", None, 0.0, 1.0)]
    assert counts(outcomes) == {"ok_correct": 1, "broken_success": 0, "error_reported": 0, "hung": 0, "lost": 1}
    names = {"ok_correct": "ok", "error_reported": "error", "lost": "cut", "hung": "hung", "broken_success": "wrong"}
    assert counts(outcomes, names) == {"ok": 1, "error": 0, "cut": 1, "hung": 0, "wrong": 0}
    assert set(counts([])) == set(KINDS)


def test_the_loop_sends_n_requests_each_once_or_goes_on_until_the_task_is_done() -> None:
    async def scenario() -> tuple[list[int], int]:
        sent: list[int] = []

        async def send(i: int) -> Outcome:
            sent.append(i)
            await asyncio.sleep(0)
            return Outcome("ok_correct", 200, 0.0, 0.0)

        into: list[Outcome] = []
        await keep_in_flight(send, 10, 3, into)
        assert sorted(sent) == list(range(10)) and len(into) == 10
        more: list[Outcome] = []
        until = asyncio.create_task(asyncio.sleep(0.05))
        await keep_in_flight(send, 1, 2, more, until=until)
        assert until.done()
        return sent, len(more)

    sent, more = asyncio.run(scenario())
    assert more >= 1 and len(sent) == 10 + more
