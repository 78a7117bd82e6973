"""What each API key may ask for (`Tenants.permit`, and the tiers that may serve it), how much it may hold and spend
(`enter`, `reserve`), and what it is billed (`Tenants.settle`: its token bucket corrected to the bill, its metrics
counted). Who is calling is the key ring's (keyring.py); the key itself is a `Tenant` (tenant.py).
"""

from __future__ import annotations

from typing import NoReturn

from cascade.errors import Forbidden, Overloaded, RateLimited
from cascade.router.policy import NAMED_HINTS, ROUTED_MODEL, QualityHint
from cascade.service.admission import SharedPlaces
from cascade.service.keys.bill import Bill
from cascade.service.keys.claims import Pass
from cascade.service.keys.ratelimit import Allowance, RateLimiter
from cascade.service.keys.tenant import Tenant
from cascade.service.metrics import GatewayMetrics


class Tenants:
    """What each key may ask for (`permit`, `allowed_tiers`), holds (`enter`/`leave`: its requests in flight) and
    spends (`reserve` before dispatch, `settle` to its bill at the end). A request's lease (cascade/service/lease.py)
    calls them in that order and gives back exactly what it took."""

    def __init__(self, limiter: RateLimiter, metrics: GatewayMetrics, tier_names: list[str],
                 places: SharedPlaces | None = None) -> None:
        """`places`: in-flight places shared with the other gateways (Redis), by scope `key:NAME`."""
        self.limiter = limiter
        self.metrics = metrics
        self.tier_names = tier_names
        self.tier_index = {name: i for i, name in enumerate(tier_names)}
        self.places = places
        self.in_flight: dict[str, int] = {}

    def permit(self, tenant: Tenant, tier: str | None, hint: QualityHint | None) -> None:
        """Check the tier a request names as its model, or the quality hint it is routed with (the service's, after
        the body > header > model alias > default precedence), against `tenant`'s permits (Forbidden: a 403). The
        tier the router, an escalation or a fallback picks is kept to the key's tiers by the service
        (`allowed_tiers`)."""
        if tier is not None:
            if tenant.tiers and tier not in tenant.tiers:
                may = ", ".join(sorted(tenant.tiers))
                raise Forbidden(f"this API key may not use tier `{tier}`; it may use: {may} (or `{ROUTED_MODEL}` "
                                "with a quality hint)", "model")
            return
        if hint is None or not tenant.hints:
            return
        name = hint.name if hint.name in NAMED_HINTS else "numeric"
        if name not in tenant.hints:
            may = ", ".join(h for h in (*NAMED_HINTS, "numeric") if h in tenant.hints)
            raise Forbidden(f"this API key may not use quality hint `{hint.label}`; it may use: {may}", "quality")

    def allowed_tiers(self, tenant: Tenant | None) -> frozenset[int] | None:
        """The tier indices that may serve `tenant` (None: all)."""
        if tenant is None or not tenant.tiers:
            return None
        return frozenset(self.tier_index[name] for name in tenant.tiers if name in self.tier_index)

    async def enter(self, tenant: Tenant) -> None:
        """Take one of `tenant`'s in-flight places (`max_in_flight`; Overloaded, a 429, when all are held)."""
        cap = tenant.max_in_flight
        if not cap:
            return
        held = self.in_flight.get(tenant.name, 0)
        if held >= cap:
            self._refused_in_flight(tenant)
        self.in_flight[tenant.name] = held + 1
        if self.places is not None:
            try:
                taken = await self.places.take(f"key:{tenant.name}", cap)
            except BaseException:
                self._leave_local(tenant)
                raise
            if not taken:
                self._leave_local(tenant)
                self._refused_in_flight(tenant, across=True)

    def leave(self, tenant: Tenant) -> None:
        if not tenant.max_in_flight:
            return
        self._leave_local(tenant)
        if self.places is not None:
            self.places.give(f"key:{tenant.name}")

    def _leave_local(self, tenant: Tenant) -> None:
        left = self.in_flight[tenant.name] - 1
        if left:
            self.in_flight[tenant.name] = left
        else:
            del self.in_flight[tenant.name]

    def _refused_in_flight(self, tenant: Tenant, across: bool = False) -> NoReturn:
        self.metrics.key_rate_limited.labels(tenant.name, "in_flight").inc()
        where = " across the gateways" if across else ""
        raise Overloaded(f"API key `{tenant.name}` has {tenant.max_in_flight} requests in flight{where}, its limit "
                         "(max_in_flight): wait for one to end")

    async def reserve(self, tenant: Tenant, tokens: int) -> Pass:
        """Take one request and `tokens` from `tenant`'s buckets (RateLimited: a 429; LimitsUnavailable, a 503, when
        the buckets are in a Redis that does not answer and `failure = "closed"`)."""
        allowance = await self.limiter.acquire(tenant.name, tenant.requests_per_minute, tenant.tokens_per_minute,
                                               tokens)
        if allowance.refused is not None:
            self.metrics.key_rate_limited.labels(tenant.name, allowance.refused).inc()
            raise RateLimited(_refusal(tenant, allowance, tokens), allowance.refused, allowance.retry_after_s,
                              allowance.headers())
        return Pass(tenant, tokens, allowance)

    def settle(self, granted: Pass, bill: Bill) -> None:
        """The request ended: correct its token bucket to its bill (nothing decoded: its tokens go back; an answer
        cut while under way, whose count is unknown: the reservation stands) and count the bill in the key's
        metrics. The correction goes to the buckets that admitted it (Redis's, or this gateway's own when Redis was
        away), wherever Redis is now."""
        tenant = granted.tenant
        used = granted.reserved if bill.unknown else bill.total
        self.limiter.settle(tenant.name, tenant.tokens_per_minute, granted.reserved, used, granted.allowance)
        if bill.tier is None:
            return
        self.metrics.key_requests.labels(tenant.name, bill.tier).inc()
        self.metrics.key_tokens.labels(tenant.name, bill.tier, "in").inc(bill.prompt_tokens)
        self.metrics.key_tokens.labels(tenant.name, bill.tier, "out").inc(bill.completion_tokens)


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
