"""What a request costs: its bill (cascade/service/lease.py `Bill`: every token the engines processed for it, per
tier) priced at each tier's `[tiers.price]` (cascade/config/prices.py), and the most it can cost, which a key's
budget reserves before dispatch (cascade/service/keys/budgets.py).

A tier priced per GPU-hour gets per-token prices here, once, from two measured sources:

    GPUs per replica     the plan's deployment for the tier (`cascade optimize plan`: its GPUs / its replicas), which
                         must be the shape its engine was profiled on (the profile's tp x pp)
    tokens per second    the engine's profile (`cascade profile`): input at its prefill rate (1 / prefill.per_token_s),
                         output at its best measured decode throughput (max of batch / step_s over decode_points)

    per input token  = gpu_hour x GPUs per replica / 3600 / input tokens per second
    per output token = gpu_hour x GPUs per replica / 3600 / output tokens per second

So a token costs the GPU time it takes on a busy engine; an idle GPU's hours are not in any request's cost. A source
that is missing is a ConfigError naming the key. (The profile is read with a Struct of its own: the online path
never imports cascade.optimizer, whose `Profile` writes the file.)
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

import msgspec

from cascade import files
from cascade.config import CascadeConfig
from cascade.config.prices import TierPrice
from cascade.errors import ConfigError
from cascade.plan import Plan
from cascade.schemas import Cost

log = logging.getLogger("cascade.gateway")

MTOK = 1_000_000
DIGITS = 12  # amounts are rounded to 1e-12 currency units: a token at 0.01 per million is 1e-8


class TokenPrice(msgspec.Struct, frozen=True):
    """One tier's price per token (not per million), input (prompt) and output (decoded)."""

    input: float
    output: float


class Prices(msgspec.Struct, frozen=True):
    """Every tier's price per token, by tier name, in one currency."""

    currency: str
    tiers: dict[str, TokenPrice]

    def cost(self, by_tier: Mapping[str, tuple[int, int]]) -> Cost:
        """The cost of `by_tier`: per tier, (prompt tokens, decoded tokens)."""
        spent_in = spent_out = 0.0
        for tier, (prompt, decoded) in by_tier.items():
            price = self.tiers[tier]
            spent_in += prompt * price.input
            spent_out += decoded * price.output
        return Cost(currency=self.currency, input=round(spent_in, DIGITS), output=round(spent_out, DIGITS),
                    total=round(spent_in + spent_out, DIGITS),
                    tiers={tier: round(amount, DIGITS) for tier, amount in self.by_tier(by_tier).items()})

    def by_tier(self, by_tier: Mapping[str, tuple[int, int]]) -> dict[str, float]:
        """Each tier's cost in `by_tier` (unrounded: summed into counters)."""
        return {tier: prompt * self.tiers[tier].input + decoded * self.tiers[tier].output
                for tier, (prompt, decoded) in by_tier.items()}

    def worst_case(self, tiers: Iterable[str], prompt_tokens: int, output_tokens: int) -> float:
        """The most `prompt_tokens` in and `output_tokens` out can cost on any of `tiers`: each at the dearest of
        their prices for it."""
        prices = [self.tiers[t] for t in tiers]
        if not prices:
            return 0.0
        return (prompt_tokens * max(p.input for p in prices)) + (output_tokens * max(p.output for p in prices))

    def dearer(self, tier: str, than: str) -> bool:
        """Whether `tier`'s tokens cost more than `than`'s (its output first, then its input)."""
        a, b = self.tiers[tier], self.tiers[than]
        return (a.output, a.input) > (b.output, b.input)


def cost_header(cost: Cost) -> bytes:
    """`x-cascade-cost`: the total as a plain decimal number, in the currency of `cascade.cost`."""
    return plain(cost.total)


def plain(amount: float) -> bytes:
    """`amount` as a header writes it: a decimal number without an exponent, to DIGITS places at most."""
    text = f"{amount:.{DIGITS}f}".rstrip("0").rstrip(".")
    return (text or "0").encode()


def tier_prices(config: CascadeConfig, plan: Plan | None = None) -> Prices | None:
    """The tiers' prices per token (None: no tier is priced); ConfigError when a GPU-hour price lacks a source."""
    priced = [(i, t.name, t.price) for i, t in enumerate(config.tiers) if t.price is not None]
    if not priced:
        return None
    tiers = {}
    for i, name, price in priced:
        if price.gpu_hour is None:
            assert price.input_per_mtok is not None and price.output_per_mtok is not None  # config/prices.py checked
            tiers[name] = TokenPrice(input=price.input_per_mtok / MTOK, output=price.output_per_mtok / MTOK)
        else:
            tiers[name] = gpu_hour_price(price, i, name, plan)
            log.info("tier %s: %g per GPU-hour is %.6g per million input tokens and %.6g per million output tokens",
                     name, price.gpu_hour, tiers[name].input * MTOK, tiers[name].output * MTOK)
    return Prices(currency=priced[0][2].currency, tiers=tiers)


class _PrefillFit(msgspec.Struct):
    per_token_s: float


class _DecodePoint(msgspec.Struct):
    batch: int
    step_s: float


class _Throughput(msgspec.Struct):
    """The fields of a `cascade profile` file (cascade/optimizer/profile.py `Profile`) that price a GPU-hour."""

    prefill: _PrefillFit
    tp: int = 1
    pp: int = 1
    decode_points: list[_DecodePoint] = msgspec.field(default_factory=list)


def gpu_hour_price(price: TierPrice, i: int, tier: str, plan: Plan | None) -> TokenPrice:
    """`tiers[i].price`'s GPU-hour as per-token prices (the module says how)."""
    where = f"tiers[{i}].price.gpu_hour"
    assert price.gpu_hour is not None
    deployed = None if plan is None else next((d for d in plan.deployment if d.tier == tier), None)
    if deployed is None:
        raise ConfigError(f"`{where}` needs the plan's GPUs for tier `{tier}`: serve with --plan, a plan whose "
                          "deployment lists the tier (`cascade optimize plan`), or price it per token "
                          "(input_per_mtok, output_per_mtok)")
    profile = files.load(price.profile, _Throughput, "profile", "json")
    replicas = sum(s.count for s in deployed.sets())
    if replicas < 1 or deployed.gpus < 1:
        raise ConfigError(f"`{where}`: the plan gives tier `{tier}` {deployed.gpus} GPUs on {replicas} replicas: "
                          "nothing to price")
    shapes = sorted({(s.tp, s.pp) for s in deployed.sets()})
    if shapes != [(profile.tp, profile.pp)]:
        planned = ", ".join(f"tp={tp} pp={pp}" for tp, pp in shapes)
        raise ConfigError(f"`{where}`: profile {price.profile} was measured on tp={profile.tp} pp={profile.pp}, the "
                          f"plan runs tier `{tier}` on {planned}: profile the engine as the plan deploys it")
    prefill_tps = 1.0 / profile.prefill.per_token_s if profile.prefill.per_token_s > 0 else 0.0
    decode_tps = max((p.batch / p.step_s for p in profile.decode_points if p.batch > 0 and p.step_s > 0), default=0.0)
    if not 0 < prefill_tps < float("inf") or not 0 < decode_tps < float("inf"):
        what = "prefill rate (prefill.per_token_s)" if not 0 < prefill_tps < float("inf") else "decode throughput"
        raise ConfigError(f"`{where}`: profile {price.profile} has no measured {what}: run `cascade profile` on the "
                          "tier's engine again")
    per_replica_s = price.gpu_hour * deployed.gpus / replicas / 3600.0
    return TokenPrice(input=per_replica_s / prefill_tps, output=per_replica_s / decode_tps)
