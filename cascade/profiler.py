"""`cascade profile` (command line: cascade/profiler_cli.py): measure a live OpenAI-compatible
backend's prefill and decode-step times and write a profile file (format:
cascade/optimizer/profile.py) that `cascade optimize plan` uses in place of the roofline estimate
(`profile = "..."` on a tier of problem.toml). Or, with `--from-loadgen RUN`, fit the same model
from a finished `cascade loadgen` run's own timings (`profile_from_loadgen`; the method is
`cascade.optimizer.profile.fit_trace`): the engine as it behaves under staggered arrivals.

Method, all with streaming chat requests of `max_tokens = --output-tokens`:

* prefill: at concurrency 1, `--repeats` requests per prompt length of a ladder (`--prompt-tokens`);
  TTFT (send to first content chunk) per length, median over the repeats, fitted as a line
  (fixed + per-token cost). The same requests' inter-token latency gives the per-context-token
  decode cost (batch 1, growing prompt).
* decode: B = 1, 2, 4, ... up to `--max-batch` concurrent requests; the step time at B is the median
  inter-token gap while all B stream (after the last one's first token, before the first one ends),
  fitted as a line over B (fixed + per-sequence cost).

Every prompt starts with different random words, so a prefix cache (SGLang's radix cache) cannot
skip its prefill. Token counts come from the server's `usage` when it reports them and they grow
along the ladder, else from the requested lengths (`prompt_tokens_source` says which). The run is
bounded by `--time-limit-s`: half for the prefill ladder, the rest for the decode ladder; rungs that
do not finish in time are dropped.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import msgspec
import numpy as np

from cascade.errors import CascadeError
from cascade.optimizer.profile import (
    DecodePoint,
    PrefillPoint,
    Profile,
    TracedRequest,
    fit_decode,
    fit_prefill,
    fit_trace,
)

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
        """SGLang reports its KV cache size; other servers do not (the profile then leaves it out)."""
        if self.s.kv_capacity_tokens:
            return self.s.kv_capacity_tokens
        try:
            response = await self.client.get(f"{self.s.url}/get_server_info", timeout=5.0)
            value = response.json().get("max_total_num_tokens") if response.status_code == 200 else None
        except Exception:
            return None
        return int(value) if isinstance(value, int | float) and value > 0 else None

    async def prefill_ladder(self, deadline: float) -> tuple[list[PrefillPoint], bool]:
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
        # The server's own prompt token counts, if it reports them and they grow along the ladder.
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

    async def decode_ladder(self, deadline: float, use_usage: bool) -> list[DecodePoint]:
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


async def measure(settings: Settings, tick: Callable[[], None] = lambda: None) -> Profile:
    started = time.monotonic()
    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    limits = httpx.Limits(max_connections=settings.max_batch + 4)
    async with httpx.AsyncClient(trust_env=False, headers=headers, limits=limits) as client:
        profiler = Profiler(settings, client, tick)
        await profiler.resolve_model()
        kv = await profiler.kv_capacity()
        try:  # warm-up: connections, first-request compilation; not measured
            await profiler.stream(settings.decode_prompt_tokens, started + settings.time_limit_s)
        except TimeoutError:
            raise CascadeError("the warm-up request did not finish within --time-limit-s "
                               f"{settings.time_limit_s:g}") from None
        tick()
        prefill, use_usage = await profiler.prefill_ladder(started + settings.time_limit_s / 2)
        decode = await profiler.decode_ladder(started + settings.time_limit_s, use_usage)
    if len(prefill) < 2 or not decode:
        raise CascadeError(f"measured {len(prefill)} prompt length(s) and {len(decode)} batch size(s) within "
                           f"--time-limit-s {settings.time_limit_s:g} (need 2 and 1): raise it, or lower "
                           "--prompt-tokens, --repeats, --max-batch or --output-tokens")
    return Profile(
        model=profiler.model, url=settings.url, label=settings.label, tp=settings.tp, pp=settings.pp,
        kv_capacity_tokens=kv, prefill=fit_prefill(prefill),
        decode=fit_decode(decode, prefill, settings.output_tokens),
        prompt_tokens_source="usage" if use_usage else "estimate", prefill_points=prefill, decode_points=decode,
        measured_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), elapsed_s=round(time.monotonic() - started, 3))


def read_loadgen_records(run: str | Path) -> list[Any]:
    """The rows of a finished `cascade loadgen --out RUN` (its requests.jsonl; RUN may also name that
    file), as loadgen's RequestRecord."""
    from cascade.data.records import RequestRecord

    path = Path(run)
    path = path / "requests.jsonl" if path.is_dir() else path
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise CascadeError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return [msgspec.json.decode(line, type=RequestRecord) for line in lines if line.strip()]
    except msgspec.MsgspecError as exc:
        raise CascadeError(f"{path}: not a cascade loadgen requests file: {exc}") from None


def profile_from_loadgen(run: str | Path, *, model: str = "", label: str = "", kv_capacity_tokens: int | None = None,
                         tp: int = 1, pp: int = 1) -> Profile:
    """A profile fitted from a finished `cascade loadgen --out RUN` (see `profile_from_records`)."""
    records = read_loadgen_records(run)
    try:
        return profile_from_records(records, model=model, label=label, origin=str(run),
                                    kv_capacity_tokens=kv_capacity_tokens, tp=tp, pp=pp)
    except CascadeError as exc:
        raise CascadeError(f"{run}: {exc.message}") from None


def profile_from_records(records: list[Any], *, model: str = "", label: str = "", origin: str = "a load test",
                         kv_capacity_tokens: int | None = None, tp: int = 1, pp: int = 1) -> Profile:
    """A profile fitted from a load test's rows (loadgen RequestRecords). Needs streamed requests with
    the server's prompt token counts (usage). The model is `model`, else the one the responses named
    most often."""
    done = [r for r in records if r.ok and r.sent_s is not None and r.ttft_ms is not None and r.itl_ms]
    if done and any(not r.prompt_tokens for r in done):
        raise CascadeError("the server reported no prompt token counts (usage); a profile needs them")
    traced = [TracedRequest(sent_s=float(r.sent_s or 0.0), ttft_s=float(r.ttft_ms or 0.0) / 1000,
                            itl_s=[x / 1000 for x in r.itl_ms], prompt_tokens=int(r.prompt_tokens or 0))
              for r in done]
    try:
        fit = fit_trace(traced)
    except ValueError as exc:
        raise CascadeError(str(exc)) from None
    models = Counter(r.model for r in done if r.model)
    elapsed = max(r.sent_s or 0.0 for r in done) - min(r.sent_s or 0.0 for r in done)
    return Profile(source="loadgen", model=model or (models.most_common(1)[0][0] if models else ""), url="",
                   label=label or f"fitted from {origin} ({len(done)} requests, {fit.decode_gaps} gaps)",
                   tp=tp, pp=pp, kv_capacity_tokens=kv_capacity_tokens, prefill=fit.prefill, decode=fit.decode,
                   prompt_tokens_source="usage", prefill_points=fit.prefill_points, decode_points=fit.decode_points,
                   measured_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), elapsed_s=round(elapsed, 3))
