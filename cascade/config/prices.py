"""`[tiers.price]` of `cascade.toml`: what a tier's tokens cost, and the checks across tiers and keys (every tier
priced or none, one currency, a key's budget needs prices, its downgrade target exists and is permitted to it).

A price is one of two forms:

    price = { input_per_mtok = 0.15, output_per_mtok = 0.60 }          currency units per million tokens
    price = { gpu_hour = 2.50, profile = "profiles/big.json" }         per GPU-hour: per-token prices from the
                                                                       plan's GPUs for the tier and the engine's
                                                                       measured throughput
                                                                       (cascade/service/keys/costs.py)

What a request costs, and how budgets are kept: docs/operations.md, "Cost" and "Budgets".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import msgspec

from cascade.config.base import Strict
from cascade.errors import ConfigError

if TYPE_CHECKING:
    from cascade.config.gateway import ApiKey
    from cascade.config.tiers import TierConfig  # which holds a TierPrice

# A million currency units per million tokens (one per token) is above any model's list price by three orders of
# magnitude; beyond it a typo (a price per token written per million) is refused instead of billed.
MAX_PRICE_PER_MTOK = 1_000_000.0
MAX_GPU_HOUR = 10_000.0  # per GPU-hour; an H100 rents for a few units

PricePerMTok = Annotated[float, msgspec.Meta(ge=0, le=MAX_PRICE_PER_MTOK)]
Currency = Annotated[str, msgspec.Meta(min_length=1, max_length=16, pattern=r"^[A-Za-z][A-Za-z0-9_-]*$")]
NAMED_HINTS = ("fast", "balanced", "best")  # cascade.router.policy.NAMED_HINTS (config imports no router)


class TierPrice(Strict, frozen=True):
    """`[tiers.price]`: per million input (prompt) and output (decoded) tokens, or per GPU-hour."""

    input_per_mtok: PricePerMTok | None = None
    output_per_mtok: PricePerMTok | None = None
    gpu_hour: Annotated[float, msgspec.Meta(ge=0, le=MAX_GPU_HOUR)] | None = None
    # With gpu_hour: a `cascade profile` file of the tier's engine (its prefill rate and decode throughput), relative
    # to cascade.toml's folder.
    profile: str = ""
    # A label for the amounts (responses, budgets, metrics); every priced tier uses the same one.
    currency: Currency = "USD"


def check_price(price: TierPrice, i: int) -> None:
    """What the types cannot say about `tiers[i].price`: exactly one of its two forms, complete."""
    where = f"tiers[{i}].price"
    per_token = price.input_per_mtok is not None or price.output_per_mtok is not None
    if per_token and price.gpu_hour is not None:
        raise ConfigError(f"`{where}` sets both per-token prices and `gpu_hour`: keep one form")
    if per_token:
        missing = "input_per_mtok" if price.input_per_mtok is None else "output_per_mtok"
        if price.input_per_mtok is None or price.output_per_mtok is None:
            raise ConfigError(f"`{where}.{missing}` is missing: give both input_per_mtok and output_per_mtok (0 for "
                              "free tokens)")
        if price.profile:
            raise ConfigError(f"`{where}.profile` is read with `gpu_hour` only: leave it out of per-token prices")
        return
    if price.gpu_hour is None:
        raise ConfigError(f"`{where}` needs input_per_mtok and output_per_mtok (per million tokens), or gpu_hour "
                          "with profile")
    if not price.profile:
        raise ConfigError(f"`{where}.gpu_hour` needs `profile`: a `cascade profile` file of the tier's engine (its "
                          "measured throughput turns the GPU-hour into per-token prices)")


def check_prices(tiers: list[TierConfig], keys: tuple[ApiKey, ...]) -> None:
    """Across tables: every tier priced or none (an unpriced tier would be free to every budget), one currency,
    and each key's budget with prices to count it and a downgrade target that exists and that it may use."""
    for i, tier in enumerate(tiers):
        if tier.price is not None:
            check_price(tier.price, i)
    priced = [t for t in tiers if t.price is not None]
    if priced and len(priced) != len(tiers):
        free = next(i for i, t in enumerate(tiers) if t.price is None)
        raise ConfigError(f"`tiers[{free}].price` is missing: once one tier has a price every tier needs one (a free "
                          "tier: price = { input_per_mtok = 0, output_per_mtok = 0 })")
    currencies = sorted({t.price.currency for t in priced if t.price is not None})
    if len(currencies) > 1:
        raise ConfigError(f"`tiers[].price.currency` differs between tiers ({', '.join(currencies)}): costs and "
                          "budgets add them up, so use one")
    names = [t.name for t in tiers]
    for i, key in enumerate(keys):
        where = f"gateway.keys[{i}]"
        if key.budget and not priced:
            raise ConfigError(f"`{where}.budget` needs prices to count it: give every tier a [tiers.price]")
        if not key.downgrade_at:
            continue
        if not key.budget:
            raise ConfigError(f"`{where}.downgrade_at` is a fraction of the key's budget: set `budget` too")
        target = key.downgrade_to
        if target not in NAMED_HINTS and target not in names:
            raise ConfigError(f"`{where}.downgrade_to` is {target!r}: name a quality hint ({', '.join(NAMED_HINTS)}) "
                              f"or a tier ({', '.join(names)})")
        if target in NAMED_HINTS and key.hints and target not in key.hints:
            raise ConfigError(f"`{where}.downgrade_to` is hint `{target}`, which the key may not use (its hints: "
                              f"{', '.join(key.hints)})")
        if target in names and key.tiers and target not in key.tiers:
            raise ConfigError(f"`{where}.downgrade_to` is tier `{target}`, which the key may not use (its tiers: "
                              f"{', '.join(key.tiers)})")
