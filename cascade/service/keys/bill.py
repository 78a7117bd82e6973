"""A request's bill: every token the engines processed for it, per tier, priced where the tiers have prices."""

from __future__ import annotations

from cascade.schemas import Billed, Cost
from cascade.service.keys.costs import Prices


class Bill:
    """What a request made the engines process and decode, charged to its key: the prompt once per upstream request
    of each tier that answered it (each choice, each branch; an escalated draft's and the final answer's), and every
    token decoded (every branch, pruned and stopped ones included; retries that produced tokens; a stream up to where
    it was cut). `usage` keeps OpenAI's meaning (the returned answer); this is the separate `cascade.billed` figure
    and `x-cascade-billed-tokens`."""

    __slots__ = ("completion_tokens", "prices", "prompt_bound", "prompt_tokens", "tier", "tiers", "unknown")

    def __init__(self, prices: Prices | None = None) -> None:
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.tier: str | None = None  # the last tier that answered (the key's metrics label)
        self.tiers: dict[str, tuple[int, int]] = {}  # per tier: its prompt and decoded tokens, which prices it
        self.prices = prices  # None: the tiers have no prices, and the bill no cost
        # An answer was cut while under way (a whole answer's tokens are counted when it ends): the key is charged
        # its reservation, the most the request could have cost.
        self.unknown = False
        # A prompt the engine never counted (0: a stream cut before its last chunk, where SGLang reports usage; an
        # engine that reports none) is billed at the reservation's bound (cascade/service/keys/reservation.py).
        self.prompt_bound = 0

    def add(self, tier: str, prompt_tokens: int, decoded: int, requests: int = 1) -> None:
        """`prompt_tokens` the engines processed over `requests` upstream requests (each choice, each branch) and
        `decoded` tokens, on `tier`."""
        if prompt_tokens <= 0:
            prompt_tokens = self.prompt_bound * requests
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
