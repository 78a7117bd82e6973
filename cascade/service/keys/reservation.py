"""What a request reserves from its key before dispatch: tokens from its buckets, and a worst-case cost from its
budget. Settled to the bill when the request ends (cascade/service/lease.py).

The prompt's part is a bound no engine's count can beat (`estimate_prompt_tokens`: its bytes), or, where every tier
the request may reach counts with a tokenizer cascade has, that count (cascade/service/keys/counting.py), whichever is
less."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import msgspec

from cascade.schemas import ChatCompletionRequest
from cascade.service.keys.costs import Prices

# What a chat template adds beyond the messages' own bytes (Qwen2.5's default system prompt is ~25 tokens; ChatML's
# per-message markers are covered by each message's JSON structure, 28 bytes or more).
TEMPLATE_TOKENS = 32
# A template's instructions around tool definitions (Qwen2.5's ~190 tokens, Llama 3.1's ~300).
TOOLS_TEMPLATE_TOKENS = 1024


def estimate_tokens(req: ChatCompletionRequest, branches: int = 1, default_max_tokens: int = 0,
                    system_prompt: str = "") -> int:
    """Tokens reserved before dispatch: the prompt's bound (`estimate_prompt_tokens`), plus max_tokens (the tier's
    default when the request sets none) for each of the n choices and each of its `branches` (the most any tier it
    may reach runs)."""
    return estimate_prompt_tokens(req, system_prompt) + output_tokens(req, branches, default_max_tokens)


def output_tokens(req: ChatCompletionRequest, branches: int = 1, default_max_tokens: int = 0) -> int:
    """max_tokens (the tier's default when the request sets none) for each of the n choices and each branch."""
    out = req.token_limit or default_max_tokens
    return out * max(1, req.n) * max(1, branches)


def estimate_prompt_tokens(req: ChatCompletionRequest, system_prompt: str = "") -> int:
    """A bound on the prompt's tokens that no engine's count can beat, whatever its tokenizer: a token covers at
    least one byte of the text it encodes (byte-level BPE and byte-fallback vocabularies alike), so the UTF-8 bytes
    of the messages as JSON (their roles and structure standing for the template's per-message tokens), of the tools
    and of the tier's `system_prompt`, plus what a chat template adds on its own. About 4x an English prompt's count,
    and 1x that of spaced digits, which tokenize one token per byte (a reservation at bytes / 4 let ten concurrent
    requests spend 4x a budget). Text only: an image part's tokens are not its URL's bytes."""
    return prompt_bound(req, len(msgspec.json.encode(req.messages)), system_prompt)


def prompt_bound(req: ChatCompletionRequest, size: int, system_prompt: str = "") -> int:
    """`estimate_prompt_tokens` for `req` whose messages' JSON is `size` bytes."""
    size += len(system_prompt.encode())
    if req.tools:
        size += len(msgspec.json.encode(req.tools)) + TOOLS_TEMPLATE_TOKENS
    return size + TEMPLATE_TOKENS


@dataclass(frozen=True)
class Reservation:
    """What a request reserves from its key before dispatch."""

    tokens: int  # from its token bucket: the prompt's bound and every choice's max_tokens on every branch
    cost: float  # from its budget: `tokens` priced at the dearest tier it may reach (0: no prices, or no budget)
    prompt_tokens: int  # the prompt's bound within `tokens`: billed for a prompt the engine never counted
    counted: bool = False  # `prompt_tokens` is the tiers' tokenizers' count (below the byte bound)


def reservation(req: ChatCompletionRequest, widths: Collection[int], default_max_tokens: Collection[int],
                system_prompts: Collection[str], prices: Prices | None, tiers: list[str], counted: int | None = None,
                size: int | None = None) -> Reservation:
    """What `req` reserves when it may reach `tiers`, running `widths` branches, with `default_max_tokens` and
    `system_prompts` (each reachable tier's): the widest, the largest default where the request sets no max_tokens,
    the longest system prompt; priced at `prices` (None: no cost reserved). `counted`: the prompt as the tiers'
    tokenizers count it (cascade/service/keys/counting.py; None: not counted), reserved where below the byte bound;
    `size`: the messages' JSON bytes, when already measured."""
    system = max(system_prompts, key=len, default="")
    bound = prompt_bound(req, len(msgspec.json.encode(req.messages)) if size is None else size, system)
    prompt = bound if counted is None else min(counted, bound)
    out = output_tokens(req, max(widths, default=1), max(default_max_tokens, default=0))
    cost = 0.0 if prices is None else prices.worst_case(tiers, prompt, out)
    return Reservation(prompt + out, cost, prompt, prompt < bound)
