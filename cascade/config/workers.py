"""`[[workers]]` of `cascade.toml`: the embedded engine processes `cascade serve` starts and supervises."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from cascade.config.base import Name, Port, PositiveFloat, PositiveInt, Strict


class WorkerConfig(Strict, frozen=True):
    """An embedded engine process: `transformers serve` on a model from models/ (see `cascade models`), or with
    `role = "scorer"` that model as a step scorer (`cascade scorer-server`, SGLang's PRM wire format) for tiers
    whose `scorer = { worker = ... }` names it."""

    name: Name
    model: Name
    port: Port = 0  # 0: pick a free loopback port
    role: Literal["chat", "scorer"] = "chat"
    threads: PositiveInt = 1  # a scorer worker's torch threads (a chat worker's engine picks its own)
    # Continuous-batching KV cache in blocks of 256 tokens: 128 holds 32k tokens (16 branches of 2k) and
    # bounds the worker's memory (FACTS.md: unbounded it grew to 7 GB).
    cb_num_blocks: PositiveInt = 128
    # Tokens per forward pass. transformers plans attention masks of this x the cache size before the first
    # batch and refuses to start when the plan exceeds 60% of free RAM: its default (8192) with 512 blocks
    # needed 5.9 GB, more than a 9 GB machine offers. 1024 still prefills several prompts per step.
    cb_max_batch_tokens: PositiveInt = 1024
    # How this worker decodes EVERY request: transformers serve with continuous batching builds one generation
    # config, from its first request, and ignores later requests' temperature, top_p and seed (checked: three
    # seeds at temperature 1.5 gave one text). cascade's start-up generation sets it: 0 = greedy; > 0 =
    # sampled at this temperature and top_p. A tier with reasoning branches needs a sampling worker (greedy
    # branches come out identical and vote as one); a tier answering directly, a greedy one.
    temperature: Annotated[float, msgspec.Meta(ge=0, le=2)] = 0.0
    top_p: Annotated[float, msgspec.Meta(gt=0, le=1)] = 1.0
    max_restarts: Annotated[int, msgspec.Meta(ge=0)] = 5
    startup_timeout_s: PositiveFloat = 300.0
