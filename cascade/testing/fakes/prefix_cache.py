"""A prefix cache for the fake engine (`cascade fake-server --prefix-cache-tokens N --cached-ttft-ms T`), so that
replica choice by prefix can be measured without GPUs (benchmarks/frontdoor/replica_affinity.py).

It models SGLang's radix cache at message granularity: a prompt is its chain of message prefixes, each keyed by a
BLAKE2b digest of the previous key and the message, and weighing that message's tokens (about 4 characters per
token, plus 4 for the chat template's role markers). A request's cached tokens are those of its longest run of
leading prefixes still held; then all its prefixes are held, least recently used evicted first once they weigh more
than the capacity, a prefix's longer prefixes before it (they are touched first, as a radix cache evicts leaves
first). As on a real engine, at least the prompt's last token is computed, so a repeated prompt is not entirely
cached, and the answer is not cached (the next turn's copy of it is the client's, which need not be the same).

Time to first token falls with the share of the prompt cached: `cached_ttft_ms` when all of it is, the script's
`ttft_ms` when none is, in proportion in between. Usage reports `prompt_tokens_details.cached_tokens`, as SGLang
(with --enable-cache-report), vLLM and OpenAI do.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

TEMPLATE_TOKENS = 4  # role markers per message (ChatML: <|im_start|>role\n ... <|im_end|>\n)
CHARS_PER_TOKEN = 4


def message_tokens(text: str) -> int:
    return TEMPLATE_TOKENS + -(-len(text) // CHARS_PER_TOKEN)


def _text(message: Any) -> tuple[str, str]:
    """A message's role and text from a request body, whatever its shape (a part without text counts as none)."""
    if not isinstance(message, dict):
        return "", ""
    role, content = message.get("role"), message.get("content")
    if isinstance(content, list):
        content = "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return (role if isinstance(role, str) else ""), (content if isinstance(content, str) else "")


class PrefixCache:
    """An LRU of message prefixes holding at most `capacity_tokens` tokens."""

    def __init__(self, capacity_tokens: int, cached_ttft_ms: float = 0.0) -> None:
        if capacity_tokens < 1 or cached_ttft_ms < 0:
            raise ValueError(f"capacity_tokens must be >= 1 and cached_ttft_ms >= 0, got {capacity_tokens}, "
                             f"{cached_ttft_ms:g}")
        self.capacity_tokens = capacity_tokens
        self.cached_ttft_ms = cached_ttft_ms
        self._held: OrderedDict[bytes, int] = OrderedDict()  # prefix key -> its last message's tokens
        self.held_tokens = 0

    def admit(self, messages: Any) -> tuple[int, int]:
        """A request's (prompt tokens, cached tokens); its prefixes are held from now on."""
        chain: list[tuple[bytes, int]] = []
        key = b""
        for message in messages if isinstance(messages, list) else []:
            role, text = _text(message)
            key = hashlib.blake2b(key + role.encode() + b"\x00" + text.encode("utf-8", "surrogatepass"),
                                  digest_size=16).digest()
            chain.append((key, message_tokens(text)))
        prompt = sum(tokens for _, tokens in chain)
        cached = 0
        for key, tokens in chain:
            if key not in self._held:
                break
            cached += tokens
        for key, tokens in reversed(chain):  # the shortest prefix ends most recently used: evicted last
            if key in self._held:
                self._held.move_to_end(key)
            else:
                self._held[key] = tokens
                self.held_tokens += tokens
        while self.held_tokens > self.capacity_tokens and self._held:
            _, tokens = self._held.popitem(last=False)
            self.held_tokens -= tokens
        return prompt, min(cached, max(0, prompt - 1))

    def ttft_ms(self, uncached_ttft_ms: float, prompt: int, cached: int) -> float:
        """Time to first token of a prompt with `cached` of its `prompt` tokens in the cache."""
        if prompt <= 0:
            return uncached_ttft_ms
        share = cached / prompt
        return self.cached_ttft_ms * share + uncached_ttft_ms * (1.0 - share)
