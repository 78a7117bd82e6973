"""A request's lease: everything one request holds, given back exactly once on every way out, and its bill.

What a request holds, in the order it takes it (`Lease.take`, then the answerers' `enter`/`hold`):

    the key's in-flight place   its API key's `max_in_flight` (cascade/service/tenants.py)
    the key's tokens            reserved from its token bucket before dispatch, settled to the bill at the end
    the key's budget            its worst case cost reserved before dispatch, settled to the cost at the end
                                (cascade/service/budgets.py)
    the gateway's place         `[gateway.limits] max_in_flight` (cascade/service/admission.py)
    tier places                 one per tier it is answered on, with its upstream streams (admission `enter`)
    a live answer               a streamed answer's upstreams and branch slots (cascade/tiers/answer.py `Opened`)

Whole answers hold their branch slots inside `answer` itself (taken and given back within one await), so the lease
sees them only as the tier place around them. `aclose` closes what is still open and gives back what is still
held, in reverse order, whatever ended the request (an answer, an error, a cancel, a client that left, the drain):
each piece knows whether it is held, so a piece given back early (a tier's place when its answer ended) is not
given back twice. Then the key is billed (`Bill`), and the bill's cost counted and settled with the key's budget.
"""

from __future__ import annotations

from cascade.schemas import Billed, Cost
from cascade.service.admission import Admission
from cascade.service.budgets import Budgets, Charge
from cascade.service.costs import Prices
from cascade.service.tenants import Pass, Tenant, Tenants
from cascade.tiers.answer import Opened
from cascade.tiers.build import Tier


class Bill:
    """What a request made the engines process and decode, charged to its key: the prompt once per tier that
    answered it (an escalated draft's and the final answer's), and every token decoded (every branch, pruned and
    stopped ones included; retries that produced tokens; a stream up to where it was cut). `usage` keeps OpenAI's
    meaning (the returned answer); this is the separate `cascade.billed` figure and `x-cascade-billed-tokens`."""

    __slots__ = ("completion_tokens", "prices", "prompt_tokens", "tier", "tiers", "unknown")

    def __init__(self, prices: Prices | None = None) -> None:
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.tier: str | None = None  # the last tier that answered (the key's metrics label)
        self.tiers: dict[str, tuple[int, int]] = {}  # per tier: its prompt and decoded tokens, which prices it
        self.prices = prices  # None: the tiers have no prices, and the bill no cost
        # An answer was cut while under way (a whole answer's tokens are counted when it ends): the key is charged
        # its reservation, the most the request could have cost.
        self.unknown = False

    def add(self, tier: str, prompt_tokens: int, decoded: int) -> None:
        self.tier = tier
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += decoded
        prompt, out = self.tiers.get(tier, (0, 0))
        self.tiers[tier] = (prompt + prompt_tokens, out + decoded)

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def billed(self) -> Billed:
        return Billed(prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
                      total_tokens=self.total)

    def cost(self) -> Cost | None:
        """The bill priced per tier (`cascade.cost`); None when the tiers have no prices."""
        return None if self.prices is None else self.prices.cost(self.tiers)


class TierPlace:
    """One tier's request place and `streams` upstream streams, held by one request until `Lease.leave`."""

    __slots__ = ("held", "streams", "tier")

    def __init__(self, tier: Tier, streams: int) -> None:
        self.tier = tier
        self.streams = streams
        self.held = True


class Lease:
    def __init__(self, admission: Admission, tenants: Tenants, caller: Tenant | None,
                 budgets: Budgets | None = None) -> None:
        """`budgets`: the keys' budgets and the tiers' prices (None: no cost is counted)."""
        self.admission = admission
        self.tenants = tenants
        self.caller = caller
        self.budgets = budgets
        self.bill = Bill(None if budgets is None else budgets.prices)
        self.granted: Pass | None = None
        self.charge: Charge | None = None
        self.places: list[TierPlace] = []
        self.opened: list[Opened] = []
        self.answering = 0  # whole answers under way
        self._key_place = False
        self._gateway_place = False
        self._closed = False

    async def take(self, reserve: int, worst_case: float = 0.0) -> None:
        """Take the key's in-flight place, reserve `reserve` tokens from its buckets and `worst_case` from its budget,
        then take a gateway place (Overloaded, RateLimited, QuotaExceeded: a 429; what was taken before the refusal
        stays recorded for `aclose`)."""
        if self.caller is not None:
            await self.tenants.enter(self.caller)
            self._key_place = True
            self.granted = await self.tenants.reserve(self.caller, reserve)
            if self.budgets is not None:
                self.charge = await self.budgets.reserve(self.caller, worst_case)
        await self.admission.admit()
        self._gateway_place = True

    async def enter(self, tier: Tier, streams: int) -> TierPlace:
        """Occupy one of `tier`'s places and `streams` upstream streams (Overloaded: a 429)."""
        await self.admission.enter(tier, streams)
        place = TierPlace(tier, streams)
        self.places.append(place)
        return place

    def leave(self, place: TierPlace) -> None:
        if place.held:
            place.held = False
            self.admission.leave(place.tier, place.streams)

    def hold(self, opened: Opened) -> None:
        """A live answer: closed by `close_opened`, or at the end."""
        self.opened.append(opened)

    async def close_opened(self, opened: Opened) -> None:
        if opened in self.opened:
            self.opened.remove(opened)
            await opened.aclose()

    def answered(self, tier: Tier, prompt_tokens: int, decoded: int) -> None:
        self.bill.add(tier.name, prompt_tokens, decoded)

    async def aclose(self) -> None:
        """Give back everything still held, once, and bill the key. Safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        try:
            while self.opened:
                await self.opened.pop().aclose()
        finally:
            for place in reversed(self.places):
                self.leave(place)
            if self._gateway_place:
                self._gateway_place = False
                self.admission.release()
            if self.answering:
                self.bill.unknown = True
            if self.budgets is not None:
                self.budgets.settle(self.caller, self.bill, self.charge)
            if self.caller is not None:
                if self.granted is not None:
                    self.tenants.settle(self.granted, self.bill)
                if self._key_place:
                    self._key_place = False
                    self.tenants.leave(self.caller)

    def limit_headers(self) -> list[tuple[bytes, bytes]]:
        """The key's rate-limit headers (x-ratelimit-*), as its buckets stood when it was admitted."""
        limits = [] if self.granted is None else self.granted.allowance.headers()
        return limits if self.budgets is None else limits + self.budgets.headers(self.charge)

    @property
    def held(self) -> bool:
        """Whether anything is still held (the tests' check after every way out)."""
        return bool(self._key_place or self._gateway_place or self.opened or any(p.held for p in self.places))
