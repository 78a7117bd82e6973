"""Per-key rate limits in Redis: the token buckets of cascade/service/keys/ratelimit.py, shared by every gateway.

The same semantics as `LocalRateLimiter`: a bucket holds at most a minute's limit and refills at limit/60 per second;
`acquire` takes 1 request and the estimated tokens, all or nothing; `settle` corrects the tokens. Each call is one Lua
script (cascade/service/redis/store.py) that reads, refills and writes both buckets in one atomic step, on the Redis
server's clock (`TIME`), so N gateways draw from exactly one bucket per key and limit.

A bucket is a hash `cascade:rl:{KEY}:requests` (and `:tokens`) of its level and when it was last written; it expires
when it would be full again (a missing bucket reads as full, which is the same), so the keys of idle tenants leave
Redis on their own. `{KEY}` is a Redis Cluster hash tag: a key's two buckets live on one node.

When Redis does not answer (`[gateway.redis] failure`): "open" decides on this gateway's own buckets (a
`LocalRateLimiter`, full at first), "closed" refuses with LimitsUnavailable (a 503).

A request settles in the buckets that admitted it (`Allowance.shared`), wherever Redis is by then: one admitted on
this gateway's buckets never touches Redis's, which never reserved its tokens. One admitted by Redis settles in Redis;
a correction Redis does not take is kept or dropped as cascade/service/redis/corrections.py says, and kept for
SETTLE_RETRY_S at most: after that the bucket has refilled a whole minute's limit and the correction means little. A
timed-out `acquire` is the dropped case: a hung Redis may take its tokens on resuming, while this gateway admitted
the request on its own buckets.
"""

from __future__ import annotations

import time

from cascade.service.keys.ratelimit import Allowance, Limit, LocalRateLimiter, state
from cascade.service.redis.corrections import Corrections, Owed
from cascade.service.redis.store import RedisStore, StoreUnavailable, lua

SETTLE_RETRY_S = 60.0  # a correction Redis could not take is sent again for this long at most

_BUCKET = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000

local function level(key, limit)
  local v = redis.call('HMGET', key, 'level', 'stamp')
  local lvl, stamp = tonumber(v[1]), tonumber(v[2])
  if lvl == nil or stamp == nil then return limit end
  return math.min(limit, lvl + math.max(0, now - stamp) * limit / 60)
end

local function store(key, limit, lvl)
  redis.call('HSET', key, 'level', string.format('%.17g', lvl), 'stamp', string.format('%.17g', now))
  redis.call('PEXPIRE', key, math.ceil((limit - lvl) * 60000 / limit) + 1000)  -- until full again, and a second
end
"""

# KEYS: the key's requests and tokens buckets. ARGV: rpm, tpm (0: no limit, its bucket untouched), tokens.
# Returns the limit it is over ("" if none) and both levels after the decision.
_ACQUIRE = lua(_BUCKET + """
local rpm, tpm, need = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local req, tok = nil, nil
if rpm > 0 then req = level(KEYS[1], rpm) end
if tpm > 0 then tok = level(KEYS[2], tpm) end
local refused = ''
if req ~= nil and req < 1 then
  refused = 'requests'
elseif tok ~= nil and (tok < need or need > tpm) then
  refused = 'tokens'
end
if refused == '' then
  if req ~= nil then req = req - 1; store(KEYS[1], rpm, req) end
  if tok ~= nil then tok = tok - need; store(KEYS[2], tpm, tok) end
end
return {refused, string.format('%.17g', req or 0), string.format('%.17g', tok or 0)}
""")

# KEYS: the key's tokens bucket. ARGV: tpm, reserved - used (a refund > 0, a debt < 0).
_SETTLE = lua(_BUCKET + """
local limit = tonumber(ARGV[1])
store(KEYS[1], limit, math.min(limit, level(KEYS[1], limit) + tonumber(ARGV[2])))
return 1
""")

_UNLIMITED = Allowance(Limit(0, 0, 0.0), Limit(0, 0, 0.0))


def bucket(key: str, kind: str) -> str:
    """The Redis key of `key`'s bucket of `kind` ("requests" or "tokens")."""
    return f"cascade:rl:{{{key}}}:{kind}"


class RedisRateLimiter:
    """Token buckets in Redis, shared by every gateway (and `--processes` worker) on it."""

    def __init__(self, store: RedisStore, fallback: LocalRateLimiter | None = None) -> None:
        self.store = store
        self.fallback = fallback or LocalRateLimiter()  # [gateway.redis] failure = "open" while Redis is away
        self.corrections: Corrections[str] = Corrections(
            store, "settle", _SETTLE, f"Redis did not answer for {SETTLE_RETRY_S:g} s",
            lambda key, tokens, why: f"redis at {store.where}: dropped a token correction of {tokens:+.0f} tokens "
                                     f"({why}); the key's bucket stays as the request's admission left it")

    async def acquire(self, key: str, rpm: int, tpm: int, tokens: int) -> Allowance:
        if not rpm and not tpm:
            return _UNLIMITED
        try:
            refused, req, tok = await self.store.run("acquire", _ACQUIRE, [bucket(key, "requests"),
                                                                            bucket(key, "tokens")], [rpm, tpm, tokens])
        except StoreUnavailable:
            self.store.unavailable("acquire")  # closed: LimitsUnavailable
            return self.fallback.take(key, rpm, tpm, tokens)
        return Allowance(state(float(req) if rpm else None, rpm, 1), state(float(tok) if tpm else None, tpm, tokens),
                         refused or None, shared=True)

    def settle(self, key: str, tpm: int, reserved: int, used: int, admitted: Allowance) -> None:
        if not tpm or used == reserved:
            return
        if not admitted.shared:
            self.fallback.settle(key, tpm, reserved, used)  # the bucket that reserved them; Redis's never did
            return
        self.corrections.send(key, Owed([bucket(key, "tokens")], lambda tokens: [tpm, int(tokens)], reserved - used,
                                        time.time() + SETTLE_RETRY_S))

    @property
    def dropped_settles(self) -> int:
        """Corrections given up: Redis may have applied them, or did not answer for long."""
        return self.corrections.dropped_count

    def owed(self) -> dict[str, int]:
        """The corrections waiting for Redis, by key (tokens: a refund > 0, a debt < 0)."""
        return {key: int(tokens) for key, tokens in self.corrections.owed().items()}
