"""Stored responses (`/v1/responses`, cascade/service/responses_api/store.py) in Redis, shared by every gateway on it:
one hash per response, `cascade:response:{ID}`, holding its owner and its record, expiring `ttl_s` after it was
written.

The owner is checked inside each script, so that another key's record never leaves Redis: a read or a delete by
another owner finds nothing, as for an unknown id. A call Redis does not answer raises StoreFailed: a conversation is
in Redis or nowhere, so `[gateway.redis] failure = "open"` has no local fallback here (the caller refuses a read with
a 503 and notes a write it could not make).
"""

from __future__ import annotations

from cascade.service.redis.store import RedisStore, Script, StoreUnavailable, lua
from cascade.service.responses_api.store import StoreFailed

# KEYS: the response's hash. ARGV: owner, record, ttl (ms).
_PUT = lua("""
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'record', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
""")

# KEYS: the response's hash. ARGV: owner. Returns the record, or nil (unknown, expired or another owner's).
_GET = lua("""
local v = redis.call('HMGET', KEYS[1], 'owner', 'record')
if v[1] ~= ARGV[1] then return false end
return v[2]
""")

# KEYS: the response's hash. ARGV: owner. Returns 1 when the owner's record was deleted.
_DELETE = lua("""
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
""")


def response_key(response_id: str) -> str:
    return f"cascade:response:{{{response_id}}}"


class RedisResponseStore:
    def __init__(self, store: RedisStore, ttl_s: int) -> None:
        self.store = store
        self.ttl_ms = ttl_s * 1000

    async def put(self, response_id: str, owner: str, record: bytes) -> None:
        await self._run("response_put", _PUT, response_id, [owner, record.decode(), self.ttl_ms])

    async def get(self, response_id: str, owner: str) -> bytes | None:
        found = await self._run("response_get", _GET, response_id, [owner])
        return None if found is None else str(found).encode()

    async def delete(self, response_id: str, owner: str) -> bool:
        return bool(await self._run("response_delete", _DELETE, response_id, [owner]))

    async def _run(self, op: str, script: Script, response_id: str, args: list[str | int]) -> object:
        try:
            return await self.store.run(op, script, [response_key(response_id)], args)
        except StoreUnavailable as exc:
            raise StoreFailed(str(exc)) from None
