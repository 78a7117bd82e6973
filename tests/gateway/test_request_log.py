"""`[gateway] log_requests`: one log line per answered request (what a newcomer watching `cascade serve` sees), and
the line saying where the gateway listens once it is ready."""

from __future__ import annotations

import logging

import httpx
import pytest

from cascade.config import decode_config
from cascade.gateway.server import Gateway
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.testing.servers import ladder_toml
from tests.gateway.gateway_setup import user


def _served(caplog: pytest.LogCaptureFixture, extra: str, port: int | None) -> list[str]:
    with serve_asgi(FakeEngine(FakeScript(tokens=5))) as engine, caplog.at_level(logging.INFO, "cascade.gateway"):
        gateway = Gateway(decode_config(ladder_toml(engine, extra)), port=port)
        with serve_asgi(gateway.app, lifespan="on") as base:
            whole = httpx.post(f"{base}/v1/chat/completions", json={"model": "cascade:fast", "messages": user()},
                               timeout=10)
            assert whole.status_code == 200
            with httpx.stream("POST", f"{base}/v1/chat/completions", timeout=10,
                              json={"model": "cascade:best", "messages": user(), "stream": True}) as stream:
                assert stream.status_code == 200 and "[DONE]" in "".join(stream.iter_text())
    return [r.getMessage() for r in caplog.records if r.name == "cascade.gateway"]


def test_each_answered_request_is_one_line_naming_hint_tier_tokens_and_time(caplog: pytest.LogCaptureFixture) -> None:
    lines = _served(caplog, "[gateway]\nlog_requests = true\n", port=8123)
    requests = [line for line in lines if " -> " in line]
    assert len(requests) == 2, lines
    assert requests[0].startswith("whole fast -> ") and requests[1].startswith("stream best -> ")
    assert all(" prompt + 5 completion tokens in " in line and line.endswith(" s") for line in requests)
    assert any(line.startswith("ready: listening on http://127.0.0.1:8123 ") for line in lines)


def test_requests_are_not_logged_unless_asked(caplog: pytest.LogCaptureFixture) -> None:
    lines = _served(caplog, "", port=None)
    assert not [line for line in lines if " -> " in line or "listening" in line], lines


def test_a_voted_request_logs_the_branches_it_launched_of_those_configured() -> None:
    from types import SimpleNamespace
    from typing import cast

    from cascade.branches.runner import BranchReport
    from cascade.service.decision import Decision
    from cascade.service.telemetry import request_line
    from cascade.tiers.answer import Answer

    report = BranchReport(launched=2, finished=2, pruned_phase1=0, pruned_phase2=0, early_stopped=0, failed=0,
                          decode_tokens=8, scores_computed=0, answer="391", votes={"391": 2}, chosen=0)
    decision = cast(Decision, SimpleNamespace(hint="best", tier=SimpleNamespace(name="reason"), escalations=0))
    line = request_line(decision, 1.25, 45, 4, Answer(results=[], reports=[report], branches_configured=8), False)
    assert line == "whole best -> reason: 45 prompt + 4 completion tokens in 1.2 s, 2 of 8 branches, 8 decoded"
