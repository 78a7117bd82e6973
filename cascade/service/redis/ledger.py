"""The keys' budgets in Redis (cascade/service/keys/budgets.py), shared by every gateway on it.

One hash per key, `cascade:budget:{KEY}`: the start of its current window and what it spent and reserved in it. Each
call is one Lua script (cascade/service/redis/store.py) on the Redis server's clock (`TIME`), which also says which
window is current (`window`, the same function as budgets.py's, calendar months included), so that N gateways
reserve from one amount per key, atomically: a request is admitted while the amount is below the budget, and the
amount grows by its worst case in the same step. A new window starts from zero; the hash expires when its window
ends. A settle names the window of its reservation and changes nothing once the key's window has moved on.

Redis away (`[gateway.redis] failure`): "open" reserves from this gateway's own ledger (a `LocalLedger`, empty at
first: while Redis is away a key may spend its budget once per gateway), "closed" refuses with LimitsUnavailable (a
503). A settle goes to the ledger that reserved (`Standing.shared`). One Redis did not take is kept or dropped as
cascade/service/redis/corrections.py says, kept until its window ends; a dropped one leaves the key its worst case
reserved for the window (never an overspend).
"""

from __future__ import annotations

from cascade.service.keys.budget import Standing
from cascade.service.keys.budgets import LocalLedger
from cascade.service.redis.corrections import Corrections, Owed
from cascade.service.redis.store import RedisStore, StoreUnavailable, lua

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


class RedisLedger:
    """Budgets in Redis, shared by every gateway (and `--processes` worker) on it."""

    def __init__(self, store: RedisStore, fallback: LocalLedger | None = None) -> None:
        self.store = store
        self.fallback = fallback or LocalLedger()  # [gateway.redis] failure = "open" while Redis is away
        # By key and window start; past its window's end a correction changes nothing.
        self.corrections: Corrections[tuple[str, int]] = Corrections(
            store, "budget_settle", _SETTLE, None,
            lambda slot, amount, why: f"redis at {store.where}: dropped a budget correction of {amount:+.6g} for key "
                                      f"{slot[0]} ({why}); the key keeps its reservation for the period")

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
        start = standing.start
        self.corrections.send((key, start), Owed([ledger_key(key)], lambda amount: [start, repr(amount)], correction,
                                                 standing.end))

    async def standing(self, key: str, period_s: int) -> Standing:
        try:
            spent, start, end = await self.store.run("budget_read", _STANDING, [ledger_key(key)], [period_s])
        except StoreUnavailable:
            self.store.unavailable("budget_read")
            return self.fallback.read(key, period_s)
        return Standing(float(spent), int(float(start)), int(float(end)), shared=True)

    @property
    def dropped_settles(self) -> int:
        return self.corrections.dropped_count

    def owed(self) -> dict[str, float]:
        """The corrections waiting for Redis, by key."""
        return {key: amount for (key, _), amount in self.corrections.owed().items()}
