"""Admission places shared by the gateways in Redis: `[gateway.limits] max_in_flight` and each tier's places
(cascade/service/admission.py) counted across every gateway on one Redis, so that 3 gateways together admit the
configured limit, not 3 times it.

The choice: one member per place, with a lease. Each place held is a member `HOLDER:N` of a sorted set per scope
(`cascade:{adm}:gateway`, `cascade:{adm}:tier:NAME`) scored by when its lease ends, in the Redis server's
milliseconds. Taking a place is one Lua script: drop the members whose lease ended, count the rest, add one if below
the cap. Giving it back removes the member. Every LEASE_S / 4 each gateway renews the leases of all the places it
holds in one script (the heartbeat), so a gateway that dies (SIGKILL, a lost host) stops renewing, and its places are
freed at most LEASE_S later, by the next take of any gateway.

Why not a count per gateway (a hash of holder -> places): a count must be corrected when its holder dies or Redis
restarts, and a release that races either goes wrong; a member is there or not, and removing it twice does nothing.
Why leases and not a TTL per request: a reasoning stream can run for minutes; a lease costs one renewal per gateway per
LEASE_S / 4, whatever the number of requests.

A Redis that restarted (without persistence) lost the sets: the heartbeat finds its holder's marker key gone and adds
back every place it still holds, so the count is whole again within LEASE_S / 4; a gateway that could not reach Redis
for longer than a lease does the same. The keys share the hash tag `{adm}` (one Redis Cluster slot), so the heartbeat
is one script.

A place admitted while Redis was away (`failure = "open"`) is counted by its own gateway only, and each place
remembers where it was taken: in Redis (`held`, renewed) or on this gateway's count (`local`). Places are
interchangeable, and the callers give one back by scope, not by request; so a give returns a local place first, and
that never removes a member another request holds: the Redis count stays the places Redis admitted that are still
held (had a Redis place gone first, Redis would count one place fewer than held while the local one ran, and the
heartbeat would not add it back). A local place whose take was sent but not answered may have been added all the same
(a hung Redis runs it when it resumes): giving it back removes that member, by its own unique name, and if that fails
too, nothing renews it and its lease ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import time

from cascade.service.redis.store import RedisStore, StoreUnavailable, lua

LEASE_S = 5.0  # a dead gateway's places are freed within this; renewed every LEASE_S / 4

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: the scope's sorted set. ARGV: cap, member, lease (ms). Returns -1 when taken, else the places held.
_TAKE = lua(_NOW + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZCARD', KEYS[1])
if held >= tonumber(ARGV[1]) then return held end
local lease = tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], now + lease, ARGV[2])
redis.call('PEXPIRE', KEYS[1], 2 * lease)
return -1
""")

_GIVE = lua("return redis.call('ZREM', KEYS[1], ARGV[1])")

# KEYS: the holder's marker, then one sorted set per scope. ARGV: lease (ms), then for each scope its number of
# members and the members. Renews them (only those still there), or adds them all back when the marker is gone.
_BEAT = lua(_NOW + """
local lease = tonumber(ARGV[1])
local fresh = redis.call('EXISTS', KEYS[1]) == 0
local i = 2
for k = 2, #KEYS do
  local n = tonumber(ARGV[i])
  i = i + 1
  while n > 0 do
    local args = {}
    for _ = 1, math.min(n, 500) do
      args[#args + 1] = now + lease
      args[#args + 1] = ARGV[i]
      i = i + 1
      n = n - 1
    end
    if fresh then redis.call('ZADD', KEYS[k], unpack(args)) else redis.call('ZADD', KEYS[k], 'XX', unpack(args)) end
  end
  redis.call('PEXPIRE', KEYS[k], 2 * lease)
end
redis.call('SET', KEYS[1], '1', 'PX', lease)
if fresh then return 1 end
return 0
""")


def place_key(scope: str) -> str:
    """The sorted set of a scope's places ("gateway", "tier:NAME")."""
    return f"cascade:{{adm}}:{scope}"


class RedisPlaces:
    """This gateway's side of the shared places (`SharedPlaces`, cascade/service/admission.py)."""

    def __init__(self, store: RedisStore, lease_s: float = LEASE_S, holder: str | None = None) -> None:
        self.store = store
        self.lease_s = lease_s
        self.holder = holder or f"{socket.gethostname()}/{os.getpid()}/{time.time_ns():x}"
        self.held: dict[str, list[str]] = {}  # scope -> this gateway's members in it
        # scope -> the places admitted on this gateway's own count: for each, the member its unanswered take may
        # have left in Redis, or None (the take was never sent)
        self.local: dict[str, list[str | None]] = {}
        self._numbers = itertools.count()
        self._heartbeat: asyncio.Task[None] | None = None

    async def take(self, scope: str, cap: int) -> bool:
        """Take one of `scope`'s `cap` places; False when all are held. Redis away: True (open) or
        LimitsUnavailable (closed)."""
        member = f"{self.holder}:{next(self._numbers)}"
        try:
            held = await self.store.run("admit", _TAKE, [place_key(scope)], [cap, member, self._lease_ms])
        except StoreUnavailable as exc:
            self.store.unavailable("admit")  # closed: LimitsUnavailable
            self.local.setdefault(scope, []).append(member if exc.tried else None)
            return True
        if int(held) >= 0:
            return False
        self.held.setdefault(scope, []).append(member)
        if self._heartbeat is None:
            self._heartbeat = asyncio.ensure_future(self._renew())
        return True

    def give(self, scope: str) -> None:
        """Give back one of `scope`'s places (in the background): one admitted locally first, which frees no place in
        Redis but its own take's member, if that take reached Redis unanswered."""
        local = self.local.get(scope)
        if local:
            stray = local.pop()
            if stray is not None:
                self.store.spawn("release", _GIVE, [place_key(scope)], [stray])
            return
        members = self.held.get(scope)
        if members:
            self.store.spawn("release", _GIVE, [place_key(scope)], [members.pop()])

    async def renew(self) -> None:
        """Renew the leases of every place this gateway holds (StoreUnavailable if Redis does not answer)."""
        scopes = [scope for scope, members in self.held.items() if members]
        if not scopes:
            return
        args: list[str | int | float] = [self._lease_ms]
        for scope in scopes:
            args += [len(self.held[scope]), *self.held[scope]]
        await self.store.run("heartbeat", _BEAT, [f"cascade:{{adm}}:holder:{self.holder}",
                                                  *(place_key(s) for s in scopes)], args)

    async def aclose(self) -> None:
        """Stop renewing (the places held, none after a drain, expire with their lease)."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
            self._heartbeat = None

    @property
    def _lease_ms(self) -> int:
        return max(1, round(self.lease_s * 1000))

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 4)
            with contextlib.suppress(StoreUnavailable):
                await self.renew()
