"""The stored responses of `/v1/responses` (cascade/service/responses_api/store.py): one contract, run against the
in-process store and the Redis one (cascade/service/redis/responses.py, a real `redis-server`: skipped without it) —
a record is read back only under its owner, a foreign read or delete finds nothing, a delete is for good; then each
limit of the in-process store ([gateway.responses] max_entries, max_bytes, ttl_s) and Redis's expiry."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import msgspec
import pytest

from cascade.config import ResponsesConfig, decode_config
from cascade.service.keys.tenant import Tenant
from cascade.service.redis.responses import RedisResponseStore, response_key
from cascade.service.responses_api.store import LocalResponseStore, ResponseStore, owner_of
from cascade.testing.waiting import eventually
from tests.gateway.test_redis_limits import inspect, redis, run, store  # noqa: F401 (the `redis` fixture)

ID_A, ID_B = "resp_" + "a" * 48, "resp_" + "b" * 48


@pytest.fixture(params=["local", "redis"])
def made(request: pytest.FixtureRequest) -> Callable[[], ResponseStore]:
    if request.param == "local":
        return lambda: LocalResponseStore(ResponsesConfig())
    url = request.getfixturevalue("redis").url
    return lambda: RedisResponseStore(store(url), ttl_s=60)


def test_a_record_is_read_back_only_by_its_owner(made) -> None:
    async def work():
        kept = made()
        await kept.put(ID_A, "owner-1", b'{"x": "\xc3\xa9"}')
        return (await kept.get(ID_A, "owner-1"), await kept.get(ID_A, "owner-2"), await kept.get(ID_A, ""),
                await kept.get(ID_B, "owner-1"))

    assert run(work) == ('{"x": "é"}'.encode(), None, None, None)


def test_another_owner_cannot_delete_a_record_and_a_delete_is_for_good(made) -> None:
    async def work():
        kept = made()
        await kept.put(ID_A, "owner-1", b"{}")
        foreign = await kept.delete(ID_A, "owner-2")
        still = await kept.get(ID_A, "owner-1")
        own, again = await kept.delete(ID_A, "owner-1"), await kept.delete(ID_A, "owner-1")
        return foreign, still, own, again, await kept.get(ID_A, "owner-1")

    assert run(work) == (False, b"{}", True, False, None)


def test_a_record_written_again_replaces_the_first(made) -> None:
    async def work():
        kept = made()
        await kept.put(ID_A, "owner-1", b"[1]")
        await kept.put(ID_A, "owner-1", b"[2]")
        return await kept.get(ID_A, "owner-1")

    assert run(work) == b"[2]"


def test_owners_are_per_key_digest_and_never_the_digest_itself() -> None:
    a, b = (Tenant(name, hashlib.sha256(name.encode()).digest()) for name in ("a", "b"))
    assert owner_of(None) == ""
    assert owner_of(a) != owner_of(b) and len(owner_of(a)) == 32
    assert owner_of(a) == owner_of(Tenant("renamed", a.digest))  # the key, not its label
    assert owner_of(a) not in a.digest.hex()


# --- the in-process store's limits --------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def local(**limits: int) -> tuple[LocalResponseStore, Clock]:
    clock = Clock()
    return LocalResponseStore(ResponsesConfig(**limits), clock), clock


def ident(i: int) -> str:
    return f"resp_{i:048x}"


def test_past_max_entries_the_least_recently_used_go_first() -> None:
    async def work():
        kept, _ = local(max_entries=3)
        for i in range(3):
            await kept.put(ident(i), "o", b"{}")
        await kept.get(ident(0), "o")  # used: 1 is now the least recently used
        await kept.put(ident(3), "o", b"{}")
        return [await kept.get(ident(i), "o") is not None for i in range(4)], len(kept), kept.evicted

    assert run(work) == ([True, False, True, True], 3, 1)


def test_past_max_bytes_records_are_dropped_until_the_rest_fits() -> None:
    async def work():
        kept, _ = local(max_bytes=100)
        for i in range(4):
            await kept.put(ident(i), "o", b"x" * 30)
        big = await kept.put(ident(9), "o", b"y" * 101)  # could never fit: not kept, nothing dropped for it
        return [await kept.get(ident(i), "o") is not None for i in range(4)], kept.bytes, big, len(kept)

    assert run(work) == ([False, True, True, True], 90, None, 3)


def test_a_record_past_ttl_s_is_gone_and_its_bytes_freed() -> None:
    async def work():
        kept, clock = local(ttl_s=10)
        await kept.put(ident(0), "o", b"abc")
        clock.now = 9.9
        before = await kept.get(ident(0), "o")
        clock.now = 10.0
        return before, await kept.get(ident(0), "o"), kept.bytes, await kept.delete(ident(0), "o")

    assert run(work) == (b"abc", None, 0, False)


def test_redis_expires_a_record_after_ttl_s(redis) -> None:  # noqa: F811
    async def work():
        kept = RedisResponseStore(store(redis.url), ttl_s=1)
        await kept.put(ID_A, "o", b"{}")
        return await kept.get(ID_A, "o")

    assert run(work) == b"{}"
    client = inspect(redis)
    assert 0 < client.pttl(response_key(ID_A)) <= 1000
    assert eventually(lambda: not client.exists(response_key(ID_A)), within_s=5)


def test_every_limit_is_a_config_number_with_a_default() -> None:
    defaults = ResponsesConfig()
    assert (defaults.ttl_s, defaults.max_entries, defaults.max_bytes, defaults.max_conversation_bytes,
            defaults.max_conversation_turns) == (2_592_000, 10_000, 67_108_864, 1_048_576, 256)
    set_ = decode_config('[gateway.responses]\nttl_s = 60\nmax_entries = 5\nmax_bytes = 1000\n'
                         'max_conversation_bytes = 500\nmax_conversation_turns = 3\n'
                         '[[tiers]]\nname = "t"\nbackends = [{ kind = "openai", url = "http://127.0.0.1:1", model = "m" }]\n')
    assert msgspec.to_builtins(set_.gateway.responses) == {"ttl_s": 60, "max_entries": 5, "max_bytes": 1000,
                                                           "max_conversation_bytes": 500,
                                                           "max_conversation_turns": 3}
