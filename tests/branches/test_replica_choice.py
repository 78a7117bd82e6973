"""Replica choice by prefix in the replica pool (`[tiers.replicas] choice = "prefix"`, cascade/branches/pool.py over
cascade/branches/affinity.py): two gateways agree with nothing shared, a full replica spills to the next on the ring,
a broken one is skipped and its keys move only to their next replicas, failover still retries elsewhere, and the
default choice is unchanged. Pools over in-process FakeBackends (they are in the Backend contract suite)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from contextlib import aclosing

import pytest

from cascade.branches.affinity import Ring, affinity_point
from cascade.branches.backend import GenerationRequest, StreamDelta
from cascade.branches.fakes import FakeBackend, numbered_tokens
from cascade.branches.openai_wire import parse_chunk
from cascade.branches.pool import ReplicaPool
from cascade.config import FailoverConfig, ReplicasConfig, TierConfig, decode_config
from cascade.errors import ConfigError
from cascade.schemas import ChatMessage

IDS = [f"http://10.0.0.{i}:30000" for i in range(4)]
PREFIX = ReplicasConfig(choice="prefix")
SYSTEM = ChatMessage(role="system", content="You are a helpful assistant.")


def turns(conversation: int, n: int = 3) -> list[GenerationRequest]:
    """The requests of a conversation's first `n` turns, each carrying the turns before it."""
    messages = [SYSTEM]
    requests = []
    for turn in range(n):
        messages = [*messages, ChatMessage(role="user", content=f"conversation {conversation}, question {turn}")]
        requests.append(GenerationRequest(messages=messages, max_tokens=4))
        messages = [*messages, ChatMessage(role="assistant", content=f"answer {turn}")]
    return requests


def pool_of(replicas: list[FakeBackend], choice: ReplicasConfig | None = PREFIX,
            failover: FailoverConfig | None = None) -> ReplicaPool:
    return ReplicaPool("tier", replicas, failover, choice, IDS[:len(replicas)])


def replicas(n: int = 4) -> list[FakeBackend]:
    return [FakeBackend(f"tier/{i}") for i in range(n)]


def served_by(backends: list[FakeBackend], request: GenerationRequest) -> int:
    """Which replica took `request` (by its request object)."""
    (index,) = [i for i, b in enumerate(backends) if any(r is request for r in b.requests)]
    return index


def ring_order(request: GenerationRequest, n: int = 4) -> list[int]:
    return list(Ring(IDS[:n]).walk(affinity_point(request, PREFIX.prefix_messages, PREFIX.prefix_chars)))


async def answer_all(pool: ReplicaPool, requests: Iterable[GenerationRequest]) -> None:
    for request in requests:
        await pool.generate(request)


def test_two_gateways_send_every_turn_of_a_conversation_to_the_same_replica() -> None:
    gateway_a, gateway_b = replicas(), replicas()  # two gateways' own clients of the same four engines
    conversations = [turns(c) for c in range(24)]

    async def main() -> None:
        for backends in (gateway_a, gateway_b):
            await answer_all(pool_of(backends), (r for conversation in conversations for r in conversation))

    asyncio.run(main())
    for conversation in conversations:
        chosen_a = {served_by(gateway_a, r) for r in conversation}
        chosen_b = {served_by(gateway_b, r) for r in conversation}
        assert chosen_a == chosen_b and len(chosen_a) == 1
        assert chosen_a == {ring_order(conversation[0])[0]}
    assert all(b.requests for b in gateway_a), "24 conversations land on every one of 4 replicas"


def test_a_full_replica_spills_the_key_to_the_next_on_the_ring() -> None:
    backends = [FakeBackend(f"tier/{i}", lambda r: numbered_tokens(r, tokens=1000), delay_s=0.001)
                for i in range(4)]
    pool = pool_of(backends)
    first, second = turns(7, 2)
    order = ring_order(first)

    async def main() -> None:
        async with aclosing(pool.stream(first)) as busy:
            await anext(busy)  # in flight on the key's replica: 1 of 1 allowed (ceil(1.25 x 2 / 4))
            await pool.generate(second)

    asyncio.run(main())
    assert (served_by(backends, first), served_by(backends, second)) == (order[0], order[1])
    assert pool.spilled == 1


def test_under_the_load_bound_a_key_stays_on_its_replica() -> None:
    backends = [FakeBackend(f"tier/{i}", lambda r: numbered_tokens(r, tokens=1000), delay_s=0.001)
                for i in range(4)]
    pool = pool_of(backends, ReplicasConfig(choice="prefix", load_factor=4.0))
    first, second = turns(7, 2)

    async def main() -> None:
        async with aclosing(pool.stream(first)) as busy:
            await anext(busy)  # bound ceil(4 x 2 / 4) = 2: the key's replica takes a second request
            await pool.generate(second)

    asyncio.run(main())
    assert served_by(backends, first) == served_by(backends, second) == ring_order(first)[0]
    assert pool.spilled == 0


def test_a_broken_replica_is_skipped_and_only_its_keys_move_to_their_next_replica() -> None:
    healthy, broken = replicas(), replicas()
    dead = 2
    broken[dead].up = False  # refuses connections: benched at its first request, which fails over
    conversations = [turns(c, 2) for c in range(32)]
    pool = pool_of(broken, failover=FailoverConfig(breaker_open_s=60.0))
    retries: list[int] = []

    async def main() -> None:
        await answer_all(pool_of(healthy), (r for c in conversations for r in c))
        for conversation in conversations:
            for request in conversation:
                retries.append((await pool.generate(request)).retries)

    asyncio.run(main())
    moved = 0
    for conversation in conversations:
        before = served_by(healthy, conversation[0])
        after = {served_by(broken, r) for r in conversation}
        if before != dead:
            assert after == {before}  # the others' keys stay where they were
        else:
            assert after == {next(i for i in ring_order(conversation[0]) if i != dead)}  # the next on the ring
            moved += 1
    assert moved > 0 and not broken[dead].requests
    assert sum(retries) == 1  # the one request that found the replica down was retried on another


def test_a_failed_attempt_is_retried_on_the_next_replica_on_the_ring() -> None:
    backends = replicas()
    request = turns(3, 1)[0]
    order = ring_order(request)
    backends[order[0]].up = False
    pool = pool_of(backends)

    result = asyncio.run(pool.generate(request))
    assert result.retries == 1 and served_by(backends, request) == order[1]


def test_the_default_choice_is_least_outstanding_unchanged() -> None:
    assert TierConfig(name="t", backends=[]).replicas.choice == "least_outstanding"
    backends = replicas(2)
    default = ReplicaPool("tier", backends)
    by_prefix = replicas(2)
    conversation = turns(1, 4)

    async def main() -> None:
        await answer_all(default, conversation)
        await answer_all(pool_of(by_prefix), conversation)

    asyncio.run(main())
    assert [len(b.requests) for b in backends] == [2, 2]  # idle replicas take turns: no affinity
    assert sorted(len(b.requests) for b in by_prefix) == [0, 4]


def test_the_pool_counts_the_prompt_and_cached_tokens_engines_report() -> None:
    def cached(request: GenerationRequest) -> Iterable[StreamDelta]:
        yield StreamDelta(text="a")
        yield StreamDelta(finish_reason="stop", prompt_tokens=100, completion_tokens=1, cached_tokens=64, chunks=0)

    pool = ReplicaPool("tier", [FakeBackend("tier/0", cached)])

    async def main() -> None:
        await pool.generate(turns(0, 1)[0])
        async with aclosing(pool.stream(turns(1, 1)[0])) as deltas:
            async for _ in deltas:
                pass

    asyncio.run(main())
    assert (pool.prompt_tokens, pool.cached_prompt_tokens) == (200, 128)


@pytest.mark.parametrize(("usage", "cached"), [
    (b'{"prompt_tokens": 9, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 5}}', 5),
    (b'{"prompt_tokens": 9, "completion_tokens": 2, "prompt_tokens_details": null}', None),
    (b'{"prompt_tokens": 9, "completion_tokens": 2, "prompt_tokens_details": {}}', None),
    (b'{"prompt_tokens": 9, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": -3}}', 0),
    (b'{"prompt_tokens": 9, "completion_tokens": 2}', None),
])
def test_a_usage_chunk_carries_the_engines_cached_tokens(usage: bytes, cached: int | None) -> None:
    delta = parse_chunk(b'{"choices": [], "usage": ' + usage + b"}", "engine")
    assert delta is not None and delta.prompt_tokens == 9 and delta.cached_tokens == cached


@pytest.mark.parametrize(("table", "error"), [
    ("load_factor = 0.5", "Expected `float` >= 1.0 in `tiers[0].replicas.load_factor`"),
    ("load_factor = 9", "<= 8.0 in `tiers[0].replicas.load_factor`"),
    ("prefix_chars = 8", ">= 16 in `tiers[0].replicas.prefix_chars`"),
    ("prefix_messages = 0", ">= 1 in `tiers[0].replicas.prefix_messages`"),
    ('choice = "random"', "`tiers[0].replicas.choice`"),
    ("hash = 1", "unknown key `hash` in `tiers[0].replicas`"),
])
def test_a_bad_replicas_table_names_its_key(table: str, error: str) -> None:
    toml = ('[[tiers]]\nname = "a"\nbackends = [{ kind = "openai", url = "http://127.0.0.1:1", model = "m" }]\n'
            f"[tiers.replicas]\n{table}\n")
    with pytest.raises(ConfigError) as info:
        decode_config(toml)
    assert error in str(info.value)


def test_a_pool_refuses_ring_ids_that_do_not_match_its_replicas() -> None:
    with pytest.raises(ValueError, match="2 replicas, got 1 ring ids"):
        ReplicaPool("tier", replicas(2), None, PREFIX, IDS[:1])
