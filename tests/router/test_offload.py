"""The router's child process (cascade/router/offload.py): it answers as the policy does in the serving process, and
a child that is gone or closed costs speed, never an answer."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from cascade.config import load_config
from cascade.router.offload import ProcessAssessor
from cascade.router.policy import RoutingPolicy
from cascade.router.signals import routing_signal

EMBEDDED = Path(__file__).resolve().parents[2] / "cascade" / "engines" / "embedded.toml"
START_S = 120.0  # a child's start (spawn, imports) on a loaded 2-core machine; ~2 s when idle
PROMPTS = ["1+" * 4000, "\u00a0\u0663" * 4000, "Sam buys 3 apples for $2 each. " * 60, "(A) " * 2000]


@pytest.fixture(scope="module")
def policy() -> RoutingPolicy:
    config = load_config(EMBEDDED)
    names = [t.name for t in config.tiers]
    signal_ = routing_signal(config.routing, names)
    assert signal_.name == "learned"
    return RoutingPolicy(len(names), None, signal_)


async def _until_child(assessor: ProcessAssessor, text: str) -> None:
    deadline = time.monotonic() + START_S
    while assessor.child_calls == 0:
        assert time.monotonic() < deadline, "the child did not come up"
        await assessor.assess(text)
        await asyncio.sleep(0.2)


def test_the_child_assesses_as_the_policy_does_and_falls_back_to_a_thread_when_gone(policy: RoutingPolicy) -> None:
    async def scenario() -> None:
        assessor = ProcessAssessor(policy)
        try:
            first = await assessor.assess(PROMPTS[0])  # a thread's answer while the child starts
            assert first == policy.assess(PROMPTS[0])
            await _until_child(assessor, PROMPTS[0])
            for text in PROMPTS:
                calls = assessor.child_calls
                assert await assessor.assess(text) == policy.assess(text)
                assert assessor.child_calls == calls + 1
            pool = assessor._pool
            assert pool is not None
            for pid in list(pool._processes):  # killed as an OOM killer would
                os.kill(pid, signal.SIGKILL)
            calls = assessor.child_calls
            for text in PROMPTS:  # the dead child's calls are answered in threads
                assert await assessor.assess(text) == policy.assess(text)
            assert assessor.child_calls == calls
            assert assessor._pool is None  # replaced at most every RESTART_S
        finally:
            assessor.close()

    asyncio.run(scenario())


def test_a_closed_assessor_stops_its_child_and_answers_in_threads(policy: RoutingPolicy) -> None:
    async def scenario() -> None:
        assessor = ProcessAssessor(policy)
        await _until_child(assessor, PROMPTS[1])
        pool = assessor._pool
        assert pool is not None
        children = list(pool._processes.values())
        assessor.close()
        assessor.close()  # idempotent
        deadline = time.monotonic() + 30
        while any(p.is_alive() for p in children):
            assert time.monotonic() < deadline, "the child outlived close()"
            await asyncio.sleep(0.1)
        calls = assessor.child_calls
        assert await assessor.assess(PROMPTS[1]) == policy.assess(PROMPTS[1])
        assert assessor.child_calls == calls and assessor._pool is None

    asyncio.run(scenario())
