"""The keys' budgets in Redis (cascade/service/budgets.py), shared by every gateway on it.

One hash per key, `cascade:budget:{KEY}`: the start of its current window and what it spent and reserved in it. Each
call is one Lua script (cascade/service/redis_store.py) on the Redis server's clock (`TIME`), which also says which
window is current (`window`, the same function as budgets.py's, calendar months included), so that N gateways
reserve from one amount per key, atomically: a request is admitted while the amount is below the budget, and the
amount grows by its worst case in the same step. A new window starts from zero; the hash expires when its window
ends. A settle names the window of its reservation and changes nothing once the key's window has moved on.

Redis away (`[gateway.redis] failure`): "open" reserves from this gateway's own ledger (a `LocalLedger`, empty at
first: while Redis is away a key may spend its budget once per gateway), "closed" refuses with LimitsUnavailable (a
503). A settle goes to the ledger that reserved (`Standing.shared`). One Redis did not take: never sent (the store
failing fast after a failure) is owed, summed per key and window, and sent again once Redis answers a ping, until its
window ends; sent without an answer is dropped (a hung Redis applies what it received when it resumes: at most once,
never twice), and the key keeps its worst case reserved for the window (never an overspend), counted in
`cascade_redis_settles_dropped_total` and logged (one line per LOG_EVERY_S at most).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from cascade.service.budgets import LocalLedger, Standing
from cascade.service.redis_store import RETRY_S, RedisStore, StoreUnavailable, ThrottledWarning, lua

# window(now, period): the UTC window holding `now` (whole seconds): period > 0, windows of that length from the
# epoch; 0, the calendar month (days to civil dates and back: Howard Hinnant's algorithms, proleptic Gregorian).
WINDOW = """
local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local doy = math.floor((153 * ((m + 9) % 12) + 2) / 5) + d - 1
  return era * 146097 + yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy - 719468
end

local function window(now, period)
  now = math.floor(now)
  if period > 0 then
    local start = now - now % period
    return start, start + period
  end
  local z = math.floor(now / 86400) + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local y, m = yoe + era * 400, mp + 3
  if mp >= 10 then y, m = y + 1, mp - 9 end
  local ny, nm = y, m + 1
  if nm > 12 then ny, nm = y + 1, 1 end
  return days_from_civil(y, m, 1) * 86400, days_from_civil(ny, nm, 1) * 86400
end

local function num(x) return string.format('%.17g', x) end

local function spent_in(key, start)
  local v = redis.call('HMGET', key, 'start', 'spent')
  if tonumber(v[1]) == start then return tonumber(v[2]) or 0 end
  return 0
end
"""

# KEYS: the key's hash. ARGV: budget, period (s; 0: month), amount. Returns admitted (1/0), spent (and reserved)
# after the decision, the window's start and end.
_RESERVE = lua(WINDOW + """
local budget, period, amount = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local start, stop = window(tonumber(redis.call('TIME')[1]), period)
local spent = spent_in(KEYS[1], start)
if spent >= budget then return {0, num(spent), num(start), num(stop)} end
spent = spent + amount
redis.call('HSET', KEYS[1], 'start', num(start), 'spent', num(spent))
redis.call('PEXPIREAT', KEYS[1], stop * 1000 + 1000)
return {1, num(spent), num(start), num(stop)}
""")

# KEYS: the key's hash. ARGV: the reservation's window start, the correction (cost - reservation).
_SETTLE = lua("""
local v = redis.call('HMGET', KEYS[1], 'start', 'spent')
if tonumber(v[1]) ~= tonumber(ARGV[1]) then return 0 end
local spent = math.max(0, (tonumber(v[2]) or 0) + tonumber(ARGV[2]))
redis.call('HSET', KEYS[1], 'spent', string.format('%.17g', spent))
return 1
""")

# KEYS: the key's hash. ARGV: period. Returns spent (and reserved), the window's start and end.
_STANDING = lua(WINDOW + """
local start, stop = window(tonumber(redis.call('TIME')[1]), tonumber(ARGV[1]))
return {num(spent_in(KEYS[1], start)), num(start), num(stop)}
""")


def ledger_key(key: str) -> str:
    """The Redis key of `key`'s budget (`{KEY}`: a Redis Cluster hash tag, as the rate limits' buckets have)."""
    return f"cascade:budget:{{{key}}}"


@dataclass
class _Owed:
    correction: float  # summed
    start: int
    end: int  # the window's end: after it the correction changes nothing


class RedisLedger:
    """Budgets in Redis, shared by every gateway (and `--processes` worker) on it."""

    def __init__(self, store: RedisStore, fallback: LocalLedger | None = None) -> None:
        self.store = store
        self.fallback = fallback or LocalLedger()  # [gateway.redis] failure = "open" while Redis is away
        self.dropped_settles = 0
        self._owed: dict[tuple[str, int], _Owed] = {}
        self._repaying: asyncio.Task[None] | None = None
        self._drops = ThrottledWarning()

    async def reserve(self, key: str, budget: float, period_s: int, amount: float) -> Standing:
        try:
            admitted, spent, start, end = await self.store.run("budget", _RESERVE, [ledger_key(key)],
                                                               [repr(budget), period_s, repr(amount)])
        except StoreUnavailable:
            self.store.unavailable("budget")  # closed: LimitsUnavailable
            return self.fallback.take(key, budget, period_s, amount)
        return Standing(float(spent), int(float(start)), int(float(end)), admitted=bool(admitted), shared=True)

    def settle(self, key: str, standing: Standing, correction: float) -> None:
        if not standing.shared:
            self.fallback.settle(key, standing, correction)  # the ledger that reserved it; Redis's never did
            return
        self.store.spawn("budget_settle", _SETTLE, [ledger_key(key)], [standing.start, repr(correction)],
                         lambda exc: self._unsettled(key, _Owed(correction, standing.start, standing.end), exc))

    async def standing(self, key: str, period_s: int) -> Standing:
        try:
            spent, start, end = await self.store.run("budget_read", _STANDING, [ledger_key(key)], [period_s])
        except StoreUnavailable:
            self.store.unavailable("budget_read")
            return self.fallback.read(key, period_s)
        return Standing(float(spent), int(float(start)), int(float(end)), shared=True)

    def owed(self) -> dict[str, float]:
        """The corrections waiting for Redis, by key."""
        return {key: owed.correction for (key, _), owed in self._owed.items()}

    def _unsettled(self, key: str, owed: _Owed, exc: StoreUnavailable) -> None:
        if exc.tried:
            self._drop(key, owed, "sent without an answer: Redis may have applied it, and a retry could apply it twice")
            return
        if (earlier := self._owed.get((key, owed.start))) is not None:
            owed = _Owed(earlier.correction + owed.correction, owed.start, owed.end)
        self._owed[(key, owed.start)] = owed
        if self._repaying is None or self._repaying.done():
            self._repaying = asyncio.ensure_future(self._repay())

    async def _repay(self) -> None:
        while self._owed and not self.store.closed:
            await asyncio.sleep(RETRY_S)
            for slot, owed in list(self._owed.items()):
                if time.time() >= owed.end:  # the window is over: the correction would change nothing
                    del self._owed[slot]
            if not self._owed or not await self.store.ping("budget_settle"):
                continue
            for slot in list(self._owed):
                owed = self._owed.pop(slot)
                try:
                    await self.store.run("budget_settle", _SETTLE, [ledger_key(slot[0])],
                                         [owed.start, repr(owed.correction)])
                except StoreUnavailable as exc:
                    self._unsettled(slot[0], owed, exc)
        for slot in list(self._owed):
            self._drop(slot[0], self._owed.pop(slot), "the gateway is stopping")

    def _drop(self, key: str, owed: _Owed, why: str) -> None:
        self.dropped_settles += 1
        self.store.series.settles_dropped.inc()
        if self._drops.due():
            self._drops.warn("redis at %s: dropped a budget correction of %+.6g for key %s (%s); the key keeps its "
                             "reservation for the period", self.store.where, owed.correction, key, why)
