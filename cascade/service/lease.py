"""A request's lease: everything one request holds, given back exactly once on every way out, and its bill.

What a request holds, in the order it takes it (`Lease.take`, then the answerers' `enter`/`hold`):

    the key's in-flight place   its API key's `max_in_flight` (cascade/service/keys/tenants.py)
    the key's tokens            reserved from its token bucket before dispatch, settled to the bill at the end
    the key's budget            its worst case cost reserved before dispatch, settled to the cost at the end
                                (cascade/service/keys/budgets.py)
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

from cascade.errors import UsageFault
from cascade.service.admission import Admission
from cascade.service.keys.bill import Bill
from cascade.service.keys.budgets import Budgets
from cascade.service.keys.claims import Charge, Pass
from cascade.service.keys.reservation import Reservation
from cascade.service.keys.tenant import Tenant
from cascade.service.keys.tenants import Tenants
from cascade.tiers.answer import Opened
from cascade.tiers.build import Tier


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

    async def take(self, reservation: Reservation) -> None:
        """Take the key's in-flight place, reserve `reservation` from its buckets and its budget, then take a gateway
        place (Overloaded, RateLimited, QuotaExceeded: a 429; what was taken before the refusal stays recorded for
        `aclose`)."""
        if self.caller is not None:
            await self.tenants.enter(self.caller)
            self._key_place = True
        await self.reserve(reservation)
        await self.admission.admit()
        self._gateway_place = True

    async def reserve(self, reservation: Reservation) -> None:
        """Reserve `reservation`'s tokens from the key's buckets and its cost from its budget, and no place (`take`
        without its places: for a request whose end is never seen, charged at its reservation: `ChatService.charge`).
        A prompt the engines never count (a stream cut before its usage) is billed at the reservation's bound."""
        self.bill.prompt_bound = reservation.prompt_tokens
        if self.caller is None:
            return
        self.granted = await self.tenants.reserve(self.caller, reservation.tokens)
        if self.budgets is not None:
            self.charge = await self.budgets.reserve(self.caller, reservation.cost)

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

    def answered(self, tier: Tier, prompt_tokens: int, decoded: int, requests: int = 1) -> None:
        self.bill.add(tier.name, prompt_tokens, decoded, requests)

    def failed(self, exc: BaseException) -> None:
        """An answer failed with `exc`: an engine whose usage was impossible (UsageFault) did work it will not count
        truthfully, so the key is charged its reservation, the most the request could cost."""
        if isinstance(exc, UsageFault):
            self.bill.unknown = True

    async def aclose(self) -> None:
        """Give back everything still held, once, and bill the key. Safe to call more than once. Exception-safe: each
        piece is given back even when giving back an earlier one raised (a live answer's close, a settle, a metric:
        an engine's usage cannot stop the key's place from coming back); the first exception is raised at the end."""
        if self._closed:
            return
        self._closed = True
        failures: list[BaseException] = []
        while self.opened:
            try:
                await self.opened.pop().aclose()
            except BaseException as exc:  # a cancel included: the rest is still given back, then it is raised
                failures.append(exc)
        for give_back in (self._leave_places, self._release_gateway, self._settle_budget, self._settle_tokens,
                          self._leave_key):
            try:
                give_back()
            except Exception as exc:
                failures.append(exc)
        if failures:
            raise failures[0]

    def _leave_places(self) -> None:
        failures = []
        for place in reversed(self.places):
            try:
                self.leave(place)
            except Exception as exc:
                failures.append(exc)
        if failures:
            raise failures[0]

    def _release_gateway(self) -> None:
        if self._gateway_place:
            self._gateway_place = False
            self.admission.release()

    def _settle_budget(self) -> None:
        if self.answering:
            self.bill.unknown = True
        if self.budgets is not None:
            self.budgets.settle(self.caller, self.bill, self.charge)

    def _settle_tokens(self) -> None:
        if self.caller is not None and self.granted is not None:
            self.tenants.settle(self.granted, self.bill)

    def _leave_key(self) -> None:
        if self.caller is not None and self._key_place:
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
