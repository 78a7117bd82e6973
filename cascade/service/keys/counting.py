"""A request's prompt counted with the tokenizers of the tiers it may reach, for its reservation
(cascade/service/keys/reservation.py): the byte bound reserves ~3.3x a GSM8K question's tokens (up to 4.5x), a count
with its margin ~1.06x (docs/measured.md, "Prompt counting for reservations").

`PromptCounter.count` answers, when every tier the request may reach runs on embedded workers (`Tier.model_dirs`:
their models' directories, with the tokenizer and chat template the worker itself loads), the most prompt tokens any
of those workers will report for it (cascade/engines/prompt_count.py: each tier's messages as it sends them, its
system prompt first, rendered with the model's template and encoded with its tokenizer), plus `margin`. The count is
exact for the workers' transformers release (tests/engines/test_prompt_count.py checks it against transformers' own
functions); the margin is for a release that prepares messages another way. Otherwise it answers None, and the
request reserves the byte bound, which no tokenizer can beat:

* a tier without model directories (a URL backend: an SGLang or other server whose tokenizer cascade does not have);
* tools, `chat_template_kwargs`, or an assistant turn that called tools (rendered from parsed JSON, not counted here);
* a prompt over `max_bytes` (its messages' JSON): counting costs ~1.4 us a byte of GSM8K text and up to ~2.5 us a
  byte of spaced digits, so one count at 16 KiB costs 25-90 ms of CPU, and a 1 MB body would cost seconds;
* a model whose tokenizer is still loading, or failed to load (logged once, never an error to the client);
* counts already `queue_bytes` behind (the count would wait longer than it saves).

Where the work runs: never on the event loop. A model's template is loaded once per model directory, its tokenizer
once per distinct tokenizer.json, when a request first needs them, in one background thread (~0.8 s for Qwen2.5's);
counts run in a process-wide pool of `COUNT_THREADS` threads (the loop submits and is woken: ~0.17 ms of its time
per request, against ~0.32 ms to count even a 64-byte prompt inline, the template's own text included;
benchmarks/frontdoor/prompt_count.py). The Rust encoder releases the GIL, so the loop serves other requests while a
prompt is encoded.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cascade.engines.prompt_count import TemplateCounter
from cascade.schemas import ChatCompletionRequest, ChatMessage
from cascade.tiers.build import Tier
from cascade.tiers.upstream import engine_fields

log = logging.getLogger("cascade.gateway")

COUNT_MAX_BYTES = 16 * 1024  # above this, the byte bound (module docstring)
COUNT_THREADS = 2  # counts running at once in a process
COUNT_QUEUE_BYTES = 64 * 1024  # prompt bytes counted or waiting at most (under 0.1 s of the pool's work)
MARGIN_TOKENS = 4  # added to a count: 4 tokens and 1/64 of it
# `text_tokens` (an answer's reasoning, counted once it is whole): a text up to 256 KiB (~65k tokens; ~0.4 s of one
# pool thread at spaced digits' 2.5 us a byte), and up to 1 MiB of them counted or waiting at once.
TEXT_MAX_BYTES = 256 * 1024
TEXT_QUEUE_BYTES = 1024 * 1024
MARGIN_DIVISOR = 64

_fault_logged = False
_pool_lock = threading.Lock()
_pools: dict[str, concurrent.futures.ThreadPoolExecutor] = {}


def _pool(name: str, threads: int) -> concurrent.futures.ThreadPoolExecutor:
    """A process-wide pool (shared by every service in the process, so the bound is the process's)."""
    with _pool_lock:
        if name not in _pools:
            _pools[name] = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix=f"cascade-{name}")
        return _pools[name]


def margin(tokens: int) -> int:
    """A count with its margin."""
    return tokens + tokens // MARGIN_DIVISOR + MARGIN_TOKENS


class PromptCounter:
    """One service's prompt counts: its models' counters, loaded on first need, and the bytes it has counting."""

    def __init__(self, max_bytes: int = COUNT_MAX_BYTES, queue_bytes: int = COUNT_QUEUE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.queue_bytes = queue_bytes
        self.pending_bytes = 0  # prompt bytes being counted or waiting (changed on the event loop only)
        self.text_pending_bytes = 0  # the same for `text_tokens`' texts
        self._loads: dict[Path, concurrent.futures.Future[TemplateCounter]] = {}
        self._tokenizers: dict[str, Any] = {}  # loaded, by the sha256 of their file (touched by the loader only)
        self._failed: set[Path] = set()  # logged once

    async def count(self, req: ChatCompletionRequest, tiers: Sequence[Tier], size: int) -> int | None:
        """The most prompt tokens any of `tiers`' engines will count for `req` (whose messages' JSON is `size`
        bytes), with the margin; None when not counted (module docstring): the caller reserves the byte bound."""
        if not tiers or req.tools or req.chat_template_kwargs or size > self.max_bytes:
            return None
        if req.reasoning_effort is not None or req.reasoning is not None:  # its thinking switch renders the template
            return None
        if any(not t.model_dirs for t in tiers) or any(m.tool_calls for m in req.messages):
            return None
        counters = {d: self.loaded(d) for t in tiers for d in t.model_dirs}  # every load started on first need
        jobs: dict[tuple[Path, str], tuple[TemplateCounter, list[ChatMessage]]] = {}
        for tier in tiers:
            for model_dir in tier.model_dirs:
                if (counter := counters[model_dir]) is None:
                    return None
                if (key := (model_dir, tier.config.system_prompt)) not in jobs:
                    jobs[key] = (counter, engine_fields(tier.config, req.messages, None)[0])
        if self.pending_bytes + size > self.queue_bytes:
            return None
        self.pending_bytes += size
        work = asyncio.get_running_loop().run_in_executor(_pool("count", COUNT_THREADS),
                                                          functools.partial(_most, list(jobs.values())))
        work.add_done_callback(functools.partial(self._done, size))
        # Shielded: a request cancelled while its prompt is counted leaves the count to finish, and its bytes pending
        # until it does.
        counted = await asyncio.shield(work)
        return None if counted is None else margin(counted)

    def _done(self, size: int, _: object) -> None:
        self.pending_bytes -= size

    async def text_tokens(self, model_dirs: Sequence[Path], text: str) -> int | None:
        """`text`'s tokens (no template, no special token) by the tokenizer of the first of `model_dirs`, counted off
        the event loop in the prompts' pool (cascade/service/reasoning.py: an answer's reasoning); None when not
        counted: no model directory, its tokenizer still loading (the first call starts it) or failed, `text` over
        TEXT_MAX_BYTES, or texts already TEXT_QUEUE_BYTES behind."""
        if not model_dirs or len(text) > TEXT_MAX_BYTES:  # characters: a cheap first bound on the bytes
            return None
        size = len(text.encode())
        if size > TEXT_MAX_BYTES or self.text_pending_bytes + size > TEXT_QUEUE_BYTES:
            return None
        counter = self.loaded(model_dirs[0])
        if counter is None:
            return None
        self.text_pending_bytes += size
        work = asyncio.get_running_loop().run_in_executor(_pool("count", COUNT_THREADS), counter.tokens, text)
        work.add_done_callback(functools.partial(self._text_done, size))
        return await asyncio.shield(work)

    def _text_done(self, size: int, _: object) -> None:
        self.text_pending_bytes -= size

    def loaded(self, model_dir: Path) -> TemplateCounter | None:
        """`model_dir`'s counter once loaded; None while it loads (the first call starts it) or when it failed."""
        load = self._loads.get(model_dir)
        if load is None:
            load = self._loads[model_dir] = _pool("tokenizer-load", 1).submit(
                TemplateCounter.load, model_dir, self._tokenizers)
        if not load.done():
            return None
        if (error := load.exception()) is not None:
            if model_dir not in self._failed:
                self._failed.add(model_dir)
                log.warning("prompts for %s reserve their byte bound: its tokenizer did not load (%s: %s)",
                            model_dir, type(error).__name__, error)
            return None
        return load.result()

    def wait_loaded(self, tiers: Sequence[Tier], timeout_s: float) -> bool:
        """Start loading `tiers`' tokenizers and wait for them, up to `timeout_s` (outside the event loop: tests,
        benchmarks); whether every one loaded."""
        for tier in tiers:
            for model_dir in tier.model_dirs:
                self.loaded(model_dir)
        loads = [self._loads[d] for t in tiers for d in t.model_dirs]
        concurrent.futures.wait(loads, timeout=timeout_s)
        return all(self.loaded(d) is not None for t in tiers for d in t.model_dirs)


def _most(jobs: list[tuple[TemplateCounter, list[ChatMessage]]]) -> int | None:
    """The most tokens among `jobs` (a counter and the messages its tier sends); None if one is not counted, or
    counting fails (logged once). Each distinct text is encoded once per tokenizer (Qwen2.5's 0.5B and 1.5B render and
    encode alike)."""
    global _fault_logged
    try:
        texts: dict[tuple[str, str], TemplateCounter] = {}
        for counter, messages in jobs:
            text = counter.render(messages)
            if text is None:
                return None
            texts.setdefault((counter.tokenizer_id, text), counter)
        return max(counter.tokens(text) for (_, text), counter in texts.items())
    except Exception:
        if not _fault_logged:
            _fault_logged = True
            log.exception("counting a prompt failed: it reserves its byte bound (logged once)")
        return None
