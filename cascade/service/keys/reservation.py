"""What a request reserves from its key before dispatch: tokens from its buckets, and a worst-case cost from its
budget. Settled to the bill when the request ends (cascade/service/lease.py)."""

from __future__ import annotations

from collections.abc import Collection

import msgspec

from cascade.schemas import ChatCompletionRequest
from cascade.service.keys.costs import Prices


def estimate_tokens(req: ChatCompletionRequest, branches: int = 1, default_max_tokens: int = 0) -> int:
    """Tokens reserved before dispatch: the messages' JSON bytes / 4, plus max_tokens (the tier's default when the
    request sets none) for each of the n choices and each of its `branches` (the most any tier it may reach runs)."""
    out = req.max_completion_tokens or req.max_tokens or default_max_tokens
    return estimate_prompt_tokens(req) + out * max(1, req.n) * max(1, branches)


def estimate_prompt_tokens(req: ChatCompletionRequest) -> int:
    """The prompt part of `estimate_tokens`: the messages' JSON bytes / 4."""
    return len(msgspec.json.encode(req.messages)) // 4 + 1


def reserved_tokens(req: ChatCompletionRequest, widths: Collection[int], default_max_tokens: Collection[int]) -> int:
    """The tokens `req` reserves when it may reach tiers running `widths` branches with `default_max_tokens` (each
    reachable tier's): the widest, and the largest default where the request sets no max_tokens."""
    return estimate_tokens(req, max(widths, default=1), max(default_max_tokens, default=0))


def worst_case(req: ChatCompletionRequest, prices: Prices | None, tiers: list[str], tokens: int) -> float:
    """What a budget reserves for `tokens` reserved tokens: its prompt and its output each priced at the dearest of
    `tiers` (0 without prices)."""
    if prices is None:
        return 0.0
    prompt = estimate_prompt_tokens(req)
    return prices.worst_case(tiers, prompt, tokens - prompt)
