"""The live measurement behind `cascade profile --url` (cascade/profiler/fit.py fits what it measures):
streamed chat requests to an OpenAI-compatible backend, timed chunk by chunk.

Method, all with streaming chat requests of `max_tokens = --output-tokens`:

* prefill: at concurrency 1, `--repeats` requests per prompt length of a sweep (`--prompt-tokens`);
  TTFT (send to first content chunk) per length, median over the repeats, fitted as a line
  (fixed + per-token cost). The same requests' inter-token latency gives the per-context-token
  decode cost (batch 1, growing prompt).
* decode: B = 1, 2, 4, ... up to `--max-batch` concurrent requests; the step time at B is the median
  inter-token gap while all B stream (after the last one's first token, before the first one ends),
  fitted as a line over B (fixed + per-sequence cost).

Every prompt starts with different random words, so a prefix cache (SGLang's radix cache) cannot
skip its prefill. Token counts come from the server's `usage` when it reports them and they grow
along the sweep, else from the requested lengths (`prompt_tokens_source` says which). The run is
bounded by `--time-limit-s`: half for the prefill sweep, the rest for the decode sweep; points that
do not finish in time are dropped.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from cascade.errors import CascadeError
from cascade.optimizer.profile import DecodePoint, PrefillPoint

WORDS = ("time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child", "world", "school",
         "state", "family", "student", "group", "country", "problem", "hand", "part", "place", "case", "week",
         "company", "system", "program", "question", "work", "number", "night", "point", "home", "water",
         "room", "mother", "area", "money", "story", "fact", "month", "lot", "right", "study", "book", "eye")
INSTRUCTION = "Ignore the words above. Count upwards from 1, one number per line, and do not stop."


@dataclass(frozen=True)
class Settings:
    url: str
    model: str = ""
    prompt_tokens: tuple[int, ...] = (64, 256, 1024)
    repeats: int = 3
    max_batch: int = 8
    output_tokens: int = 32
    decode_prompt_tokens: int = 64
    time_limit_s: float = 300.0
    api_key: str = ""
    ignore_eos: bool = False
    kv_capacity_tokens: int | None = None
    tp: int = 1
    pp: int = 1
    label: str = ""
    seed: int = 0

    def batches(self) -> list[int]:
        sizes = [b for b in (1 << k for k in range(20)) if b <= self.max_batch]
        return sizes if sizes[-1] == self.max_batch else [*sizes, self.max_batch]


@dataclass
class Stream:
    """One streamed request: when it was sent and when each content chunk arrived."""

    sent: float
    chunks: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    @property
    def ttft_s(self) -> float:
        return self.chunks[0] - self.sent

    def gaps(self, start: float = float("-inf"), end: float = float("inf")) -> list[float]:
        """Per-token gaps between chunks that both arrived in [start, end] (a chunk may hold several
        tokens: servers that batch their stream report more completion tokens than chunks)."""
        per_chunk = max(1.0, (self.completion_tokens or 0) / max(1, len(self.chunks)))
        pairs = itertools.pairwise(self.chunks)
        return [(b - a) / per_chunk for a, b in pairs if a >= start and b <= end]


class Prompts:
    """Prompts of about n tokens (one common word is about one token), each with a distinct start."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def __call__(self, tokens: int) -> str:
        words = max(1, tokens - len(INSTRUCTION.split()))
        picks = self.rng.integers(0, len(WORDS), size=words)
        return " ".join(WORDS[i] for i in picks) + "\n\n" + INSTRUCTION


class Profiler:
    def __init__(self, settings: Settings, client: httpx.AsyncClient, tick: Callable[[], None]) -> None:
        self.s, self.client, self.tick = settings, client, tick
        self.prompts = Prompts(settings.seed)
        self.model = settings.model

    async def stream(self, prompt_tokens: int, deadline: float) -> Stream:
        body: dict[str, Any] = {
            "model": self.model, "messages": [{"role": "user", "content": self.prompts(prompt_tokens)}],
            "max_tokens": self.s.output_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.s.ignore_eos:
            body["ignore_eos"] = True
        result = Stream(sent=time.perf_counter())
        timeout = httpx.Timeout(max(0.1, deadline - time.monotonic()), connect=5.0)
        url = f"{self.s.url}/v1/chat/completions"
        try:
            async with self.client.stream("POST", url, json=body, timeout=timeout) as response:
                if response.status_code != 200:
                    text = (await response.aread()).decode(errors="replace")
                    raise CascadeError(f"{url} answered {response.status_code}: {' '.join(text.split())[:200]}")
                async for line in response.aiter_lines():
                    if line.startswith("data:") and line.strip() != "data: [DONE]":
                        _read_chunk(line[5:], result)
        except httpx.ConnectError as exc:
            raise CascadeError(f"cannot reach {self.s.url}: {exc}; is the backend running?") from None
        except httpx.TimeoutException:
            raise TimeoutError from None
        except httpx.HTTPError as exc:
            raise CascadeError(f"{url}: {type(exc).__name__}: {exc}") from None
        if not result.chunks:
            raise CascadeError(f"{url} streamed no content for a {prompt_tokens}-token prompt")
        return result

    async def resolve_model(self) -> None:
        if self.model:
            return
        try:
            response = await self.client.get(f"{self.s.url}/v1/models", timeout=10.0)
            self.model = response.json()["data"][0]["id"]
        except httpx.ConnectError as exc:
            raise CascadeError(f"cannot reach {self.s.url}: {exc}; is the backend running?") from None
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
            raise CascadeError(f"{self.s.url}/v1/models does not name a model; pass --model") from None

    async def kv_capacity(self) -> int | None:
        """SGLang reports its KV cache size (`max_total_num_tokens`) at GET /server_info; older versions only
        at /get_server_info, which 0.5 keeps but logs a deprecation warning for on every call. So the new
        route first, the old one only when the server does not have it (404). Other servers report
        nothing (the profile then leaves it out)."""
        if self.s.kv_capacity_tokens:
            return self.s.kv_capacity_tokens
        try:
            response = await self.client.get(f"{self.s.url}/server_info", timeout=5.0)
            if response.status_code == 404:
                response = await self.client.get(f"{self.s.url}/get_server_info", timeout=5.0)
            value = response.json().get("max_total_num_tokens") if response.status_code == 200 else None
        except Exception:
            return None
        return int(value) if isinstance(value, int | float) and value > 0 else None

    async def prefill_sweep(self, deadline: float) -> tuple[list[PrefillPoint], bool]:
        """Points per prompt length, and whether usage token counts were usable."""
        runs: list[tuple[int, list[Stream]]] = []
        for tokens in self.s.prompt_tokens:
            streams = []
            for _ in range(self.s.repeats):
                if time.monotonic() >= deadline:
                    break
                try:
                    streams.append(await asyncio.wait_for(self.stream(tokens, deadline), deadline - time.monotonic()))
                except TimeoutError:
                    break
                self.tick()
            if len(streams) < self.s.repeats:
                break
            runs.append((tokens, streams))
        # The server's own prompt token counts, if it reports them and they grow along the sweep.
        counts = [int(statistics.median(s.prompt_tokens or 0 for s in streams)) for _, streams in runs]
        use_usage = all(s.prompt_tokens for _, streams in runs for s in streams) and \
            all(a < b for a, b in itertools.pairwise(counts))
        points = []
        for (tokens, streams), count in zip(runs, counts, strict=True):
            itls = [statistics.median(g) for s in streams if (g := s.gaps())]
            points.append(PrefillPoint(prompt_tokens=count if use_usage else tokens,
                                       ttft_s=statistics.median(s.ttft_s for s in streams),
                                       itl_s=statistics.median(itls) if itls else None, samples=len(streams)))
        return points, use_usage

    async def decode_sweep(self, deadline: float, use_usage: bool) -> list[DecodePoint]:
        points = []
        for batch in self.s.batches():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                streams = await asyncio.wait_for(
                    asyncio.gather(*(self.stream(self.s.decode_prompt_tokens, deadline) for _ in range(batch))),
                    remaining)
            except TimeoutError:
                break
            self.tick()
            start, end = max(s.chunks[0] for s in streams), min(s.chunks[-1] for s in streams)
            gaps = [g for s in streams for g in s.gaps(start, end)]
            if len(gaps) < 3:  # no common window (short outputs): every gap after the first token
                gaps = [g for s in streams for g in s.gaps()]
            if not gaps:
                raise CascadeError("the backend streamed fewer than 2 chunks per request; raise --output-tokens "
                                   "or pass --ignore-eos (SGLang, vLLM)")
            prompt = statistics.median(s.prompt_tokens or 0 for s in streams) if use_usage \
                else self.s.decode_prompt_tokens
            points.append(DecodePoint(batch=batch, step_s=statistics.median(gaps),
                                      context_tokens=float(prompt) + self.s.output_tokens / 2, samples=len(gaps)))
        return points


def _read_chunk(data: str, into: Stream) -> None:
    try:
        chunk = json.loads(data)
    except ValueError:
        raise CascadeError(f"the stream sent a chunk that is not JSON: {data[:80]!r}") from None
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        into.prompt_tokens = usage.get("prompt_tokens", into.prompt_tokens)
        into.completion_tokens = usage.get("completion_tokens", into.completion_tokens)
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content"):
            into.chunks.append(time.perf_counter())
