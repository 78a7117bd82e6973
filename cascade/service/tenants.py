"""API keys as tenants: who is calling (`Keyring.authenticate`), what it may ask for and how much (`Tenants.admit`),
and what it used (`Tenants.settle`: its token bucket corrected, its metrics counted).

Keys are known by their sha256 only (`[[gateway.keys]]`, made by `cascade keys add`); the digest of what a client
sends is compared with every configured one in constant time (hmac.compare_digest, no early exit). Plain
`[gateway] api_keys` still work: each is a tenant named `api_keys[i]` with no limits.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

import msgspec

from cascade.config import ApiKey
from cascade.errors import ConfigError, Forbidden, RateLimited, Unauthorized
from cascade.router.policy import NAMED_HINTS, parse_hint
from cascade.schemas import ChatCompletionRequest
from cascade.service.metrics import GatewayMetrics
from cascade.service.ratelimit import Allowance, RateLimiter
from cascade.service.telemetry import Meter

ROUTED_MODEL = "cascade"
_NO_KEY = "missing or invalid API key: send `Authorization: Bearer <key>`"


@dataclass(frozen=True)
class Tenant:
    name: str  # the metrics label
    digest: bytes
    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    hints: frozenset[str] = frozenset()  # empty: all
    tiers: frozenset[str] = frozenset()  # empty: all


class Keyring:
    def __init__(self, keys: tuple[ApiKey, ...] = (), plain: tuple[str, ...] = ()) -> None:
        """ConfigError when one key is configured twice (plain or hashed, in either list): which entry would it be?
        Its limits and permits would depend on the order (a key listed in `api_keys` and, with limits, in
        `[[gateway.keys]]` lost its limits)."""
        self.tenants = [Tenant(k.name, bytes.fromhex(k.sha256), k.requests_per_minute, k.tokens_per_minute,
                               frozenset(k.hints), frozenset(k.tiers)) for k in keys]
        self.tenants += [Tenant(f"api_keys[{i}]", _digest(key)) for i, key in enumerate(plain)]
        first: dict[bytes, str] = {}
        for tenant in self.tenants:
            if (other := first.setdefault(tenant.digest, tenant.name)) != tenant.name:
                raise ConfigError(f"one API key is configured twice, as `{other}` and as `{tenant.name}`: keep one "
                                  "entry per key (a [[gateway.keys]] entry holds its limits and permits)")

    def __bool__(self) -> bool:
        return bool(self.tenants)

    def authenticate(self, authorization: str) -> Tenant | None:
        """The tenant whose key `authorization` (the header, "" if absent) carries as `Bearer <key>`; None when no
        keys are configured (every request passes); else Unauthorized."""
        if not self.tenants:
            return None
        scheme, _, token = authorization.partition(" ")
        digest = _digest(token)
        found = None
        for tenant in self.tenants:  # every one compared: the time does not tell which matched
            if hmac.compare_digest(tenant.digest, digest):
                found = tenant
        if scheme.lower() != "bearer" or not token or found is None:
            raise Unauthorized(_NO_KEY)
        return found


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


# A plain key a gateway reachable from the network refuses to start with (`cascade keys add` makes 47 characters).
MIN_KEY_CHARS = 24
MIN_KEY_DISTINCT = 8


def weak_plain_keys(plain: tuple[str, ...]) -> list[str]:
    """The `api_keys[i]` entries that are easy to guess: shorter than MIN_KEY_CHARS characters, or made of fewer
    than MIN_KEY_DISTINCT distinct ones."""
    return [f"api_keys[{i}]" for i, key in enumerate(plain)
            if len(key) < MIN_KEY_CHARS or len(set(key)) < MIN_KEY_DISTINCT]


@dataclass(frozen=True)
class Pass:
    """An admitted request's claim on its tenant's buckets."""

    tenant: Tenant
    reserved: int
    allowance: Allowance


class Tenants:
    def __init__(self, limiter: RateLimiter, metrics: GatewayMetrics, tier_names: list[str],
                 default_quality: str) -> None:
        self.limiter = limiter
        self.metrics = metrics
        self.tier_names = tier_names
        self.default_quality = default_quality

    async def admit(self, tenant: Tenant, req: ChatCompletionRequest, hint_header: str | None) -> Pass:
        """Check what `req` asks for against `tenant`'s hints and tiers (Forbidden: a 403) and take its request and
        estimated tokens from its buckets (RateLimited: a 429; LimitsUnavailable, a 503, when the buckets are in a
        Redis that does not answer and `redis_failure = "closed"`)."""
        self._permit(tenant, req, hint_header)
        reserved = estimate_tokens(req)
        allowance = await self.limiter.acquire(tenant.name, tenant.requests_per_minute, tenant.tokens_per_minute,
                                               reserved)
        if allowance.refused is not None:
            self.metrics.key_rate_limited.labels(tenant.name, allowance.refused).inc()
            raise RateLimited(_refusal(tenant, allowance, reserved), allowance.refused, allowance.retry_after_s,
                              allowance.headers())
        return Pass(tenant, reserved, allowance)

    def settle(self, granted: Pass, meter: Meter | None) -> None:
        """The request ended: with `meter` filled (it was served), count its usage and correct its token bucket to
        it; with None (it failed before an answer), give its tokens back; with an empty meter (a stream cut short),
        keep the reservation. The correction goes to the buckets that admitted it (Redis's, or this gateway's own
        when Redis was away), wherever Redis is now."""
        tenant = granted.tenant
        if meter is None:
            self.limiter.settle(tenant.name, tenant.tokens_per_minute, granted.reserved, 0, granted.allowance)
            return
        if meter.tier is None:
            return
        used = meter.prompt_tokens + meter.completion_tokens
        self.limiter.settle(tenant.name, tenant.tokens_per_minute, granted.reserved, used, granted.allowance)
        self.metrics.key_requests.labels(tenant.name, meter.tier).inc()
        self.metrics.key_tokens.labels(tenant.name, meter.tier, "in").inc(meter.prompt_tokens)
        self.metrics.key_tokens.labels(tenant.name, meter.tier, "out").inc(meter.completion_tokens)

    def _permit(self, tenant: Tenant, req: ChatCompletionRequest, hint_header: str | None) -> None:
        model = req.model
        if model in self.tier_names:
            if tenant.tiers and model not in tenant.tiers:
                may = ", ".join(sorted(tenant.tiers))
                raise Forbidden(f"this API key may not use tier `{model}`; it may use: {may} (or `{ROUTED_MODEL}` "
                                "with a quality hint)", "model")
            return
        base, _, alias = model.partition(":")
        if base != ROUTED_MODEL or not tenant.hints:
            return  # an unknown model is the service's 404
        raw = req.quality if req.quality is not None else hint_header or alias or self.default_quality
        hint = parse_hint(raw, "quality")
        name = "numeric" if hint is None or hint.name not in NAMED_HINTS else hint.name
        if name not in tenant.hints:
            may = ", ".join(h for h in (*NAMED_HINTS, "numeric") if h in tenant.hints)
            raise Forbidden(f"this API key may not use quality hint `{raw}`; it may use: {may}", "quality")


def estimate_tokens(req: ChatCompletionRequest) -> int:
    """Tokens reserved at admission: the messages' JSON bytes / 4, plus max_tokens for each of the n choices (none
    when the request sets no max_tokens: then the usage settles it)."""
    prompt = len(msgspec.json.encode(req.messages)) // 4 + 1
    out = req.max_completion_tokens or req.max_tokens or 0
    return prompt + out * max(1, req.n)


def _refusal(tenant: Tenant, allowance: Allowance, reserved: int) -> str:
    if allowance.refused == "requests":
        limit = tenant.requests_per_minute
        return (f"Rate limit reached for API key `{tenant.name}` on requests per min (RPM): Limit {limit}, Used "
                f"{limit - allowance.requests.remaining}, Requested 1. Please try again in "
                f"{allowance.retry_after_s:.3g}s.")
    limit = tenant.tokens_per_minute
    if reserved > limit:
        return (f"Request too large for API key `{tenant.name}` on tokens per min (TPM): Limit {limit}, Requested "
                f"{reserved}. Send fewer messages or a smaller max_tokens.")
    return (f"Rate limit reached for API key `{tenant.name}` on tokens per min (TPM): Limit {limit}, Used "
            f"{limit - allowance.tokens.remaining}, Requested {reserved}. Please try again in "
            f"{allowance.retry_after_s:.3g}s.")
