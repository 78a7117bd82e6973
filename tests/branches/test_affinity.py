"""The affinity key and the hash ring of replica choice by prefix (cascade/branches/affinity.py): what a key depends
on, that it is the same in every process, that a hostile prompt costs a bounded number of steps, and the load bound.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cascade.branches.affinity import VIRTUAL_NODES, Ring, affinity_point, bounded_choice, load_bound
from cascade.branches.backend import GenerationRequest
from cascade.schemas import ChatMessage, TextPart

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                            HealthCheck.data_too_large])
SYSTEM = ChatMessage(role="system", content="You are a helpful assistant.")


def ask(*messages: ChatMessage, key: str = "") -> GenerationRequest:
    return GenerationRequest(messages=list(messages), max_tokens=8, affinity_key=key)


def user(text: str) -> ChatMessage:
    return ChatMessage(role="user", content=text)


def assistant(text: str) -> ChatMessage:
    return ChatMessage(role="assistant", content=text)


def point(request: GenerationRequest, prefix_messages: int = 1, prefix_chars: int = 1024) -> int:
    return affinity_point(request, prefix_messages, prefix_chars)


# --- what the key depends on ------------------------------------------------------------------------------


def test_every_turn_of_a_conversation_has_the_key_of_its_opening() -> None:
    turns = [ask(SYSTEM, user("plan a trip")),
             ask(SYSTEM, user("plan a trip"), assistant("Where to?"), user("Lisbon")),
             ask(SYSTEM, user("plan a trip"), assistant("Where to?"), user("Lisbon"), assistant("When?"),
                 user("May"))]
    assert len({point(t) for t in turns}) == 1


def test_conversations_with_other_openings_or_system_prompts_have_other_keys() -> None:
    base = point(ask(SYSTEM, user("plan a trip")))
    assert point(ask(SYSTEM, user("plan a party"))) != base
    assert point(ask(ChatMessage(role="system", content="Be terse."), user("plan a trip"))) != base
    assert point(ask(user("plan a trip"))) != base


def test_prefix_messages_takes_more_of_the_opening() -> None:
    one, two = (ask(SYSTEM, user("hi"), assistant(a), user("go on")) for a in ("hello", "hey"))
    assert point(one, prefix_messages=1) == point(two, prefix_messages=1)
    assert point(one, prefix_messages=2) != point(two, prefix_messages=2)


def test_a_clients_key_replaces_the_opening() -> None:
    assert point(ask(SYSTEM, user("a"), key="session-1")) == point(ask(user("b"), key="session-1"))
    assert point(ask(user("a"), key="session-1")) != point(ask(user("a"), key="session-2"))
    assert point(ask(user("session-1"))) != point(ask(user("x"), key="session-1"))


def test_text_parts_and_none_contents_are_hashed() -> None:
    parts = ChatMessage(role="user", content=[TextPart(type="text", text="plan "), TextPart(type="text", text="a trip")])
    assert point(ask(SYSTEM, parts)) == point(ask(SYSTEM, parts))
    assert point(ask(SYSTEM, parts)) != point(ask(SYSTEM, ChatMessage(role="user", content=None)))


def test_the_key_is_the_same_in_another_process_with_another_hash_seed() -> None:
    """N gateways must agree: nothing of Python's per-process salted hash() may leak into the ring or the key."""
    code = ("from cascade.branches.affinity import Ring, affinity_point\n"
            "from cascade.branches.backend import GenerationRequest\n"
            "from cascade.schemas import ChatMessage\n"
            "r = GenerationRequest(messages=[ChatMessage(role='user', content='plan a trip')], max_tokens=8)\n"
            "p = affinity_point(r, 1, 1024)\n"
            "print(p, list(Ring(['http://a:1', 'http://b:2', 'http://c:3']).walk(p)))\n")
    outputs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                              env={"PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    here = point(ask(user("plan a trip")))
    assert outputs == {f"{here} {list(Ring(['http://a:1', 'http://b:2', 'http://c:3']).walk(here))}\n"}


# --- hostile prompts cost bounded work --------------------------------------------------------------------


class Counted(list[Any]):
    """A list that counts the items taken from it."""

    taken = 0

    def __iter__(self) -> Iterator[Any]:
        for item in super().__iter__():
            Counted.taken += 1
            yield item


UNIT = st.sampled_from(["a", " ", "\n", "\u00e9", "\U0001f600", "\ud800", "<|im_start|>", "\x00"])
TEXT = st.tuples(UNIT, st.integers(0, 200_000)).map(lambda r: r[0] * r[1])
ROLE = st.sampled_from(["system", "developer", "user", "assistant", "tool"])


@st.composite
def hostile_messages(draw: st.DrawFn) -> list[ChatMessage]:
    """Many messages (system ones, which never count against prefix_messages, included), huge texts, many parts."""
    count = draw(st.integers(1, 3_000))
    role = draw(ROLE)
    text = draw(TEXT)
    parts = draw(st.integers(0, 20_000))
    content: Any = Counted([TextPart(type="text", text=text[:50])] * parts) if parts else text
    return Counted([ChatMessage(role=role, content=content)] * count)


@PROPERTY
@given(messages=hostile_messages(), prefix_messages=st.integers(1, 64), prefix_chars=st.integers(16, 65_536),
       key=TEXT)
def test_a_hostile_prompt_costs_at_most_prefix_chars_steps(messages: list[ChatMessage], prefix_messages: int,
                                                           prefix_chars: int, key: str) -> None:
    request = GenerationRequest(messages=messages, max_tokens=8)
    Counted.taken = 0
    point(request, prefix_messages, prefix_chars)
    # Messages and parts taken (each costs one character of the budget; the one that finds it spent is taken too);
    # characters are sliced to the budget before they are encoded or hashed.
    assert Counted.taken <= prefix_chars + 2
    assert point(ask(user("x"), key=key), prefix_messages, prefix_chars) >= 0


@PROPERTY
@given(head=TEXT, tail=TEXT, prefix_chars=st.integers(16, 4096))
def test_nothing_past_prefix_chars_changes_the_key(head: str, tail: str, prefix_chars: int) -> None:
    long = (head + "x" * prefix_chars)
    assert point(ask(user(long + tail)), 1, prefix_chars) == point(ask(user(long)), 1, prefix_chars)
    assert point(ask(user("q"), key=long + tail), 1, prefix_chars) == point(ask(user("q"), key=long), 1,
                                                                             prefix_chars)


# --- the ring and the bound -------------------------------------------------------------------------------


def test_the_ring_walks_every_replica_once() -> None:
    ring = Ring([f"http://10.0.0.{i}:30000" for i in range(5)])
    for p in (0, 1 << 63, (1 << 64) - 1, 12345):
        assert sorted(ring.walk(p)) == list(range(5))


def test_keys_spread_over_the_replicas_within_a_tenth_of_even() -> None:
    ring = Ring([f"http://10.0.0.{i}:30000" for i in range(4)])
    counts = [0] * 4
    for i in range(4000):
        counts[next(ring.walk(point(ask(user(f"conversation {i}")))))] += 1
    assert all(abs(c - 1000) <= 150 for c in counts), counts  # 160 points each: about +-10% (seeded: fixed keys)
    assert VIRTUAL_NODES == 160


def test_a_repeated_replica_id_gets_points_of_its_own() -> None:
    ring = Ring(["http://same:1", "http://same:1"])
    firsts = {next(ring.walk(point(ask(user(f"c{i}"))))) for i in range(50)}
    assert firsts == {0, 1}


def test_removing_a_replica_moves_only_its_own_keys() -> None:
    ids = [f"http://10.0.0.{i}:30000" for i in range(4)]
    full, without = Ring(ids), Ring(ids[:3])
    for i in range(500):
        p = point(ask(user(f"conversation {i}")))
        first = next(full.walk(p))
        if first != 3:
            assert next(without.walk(p)) == first
        else:  # its keys go to the replica after it on the full ring
            assert next(without.walk(p)) == next(r for r in full.walk(p) if r != 3)


def test_the_load_bound_is_the_ceiling_of_load_factor_times_the_average() -> None:
    assert load_bound(0, 4, 1.25) == 1  # an idle tier: every replica may take one
    assert load_bound(7, 4, 1.25) == 3  # 8 requests over 4 replicas: average 2, bound ceil(2.5)
    assert load_bound(49, 1, 1.1) == 55  # 1.1 x 50 is 55.00000000000001 in floats: not 56
    assert load_bound(7, 4, 1.0) == 2


@given(loads=st.lists(st.integers(0, 1_000_000), min_size=1, max_size=32), factor=st.floats(1.0, 8.0),
       start=st.integers(0, 31))
def test_the_bounded_choice_always_finds_a_replica_within_the_bound(loads: list[int], factor: float,
                                                                    start: int) -> None:
    by_index = dict(enumerate(loads))
    order = iter([(start + k) % len(loads) for k in range(len(loads))])
    index, _ = bounded_choice(order, by_index, factor)
    assert by_index[index] + 1 <= load_bound(sum(loads), len(loads), factor)
