"""One load-test run end to end: build the workload, send it, grade the answers, summarize, report."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from cascade.data import arrivals, datasets, grading
from cascade.data.records import Prompt, RequestRecord
from loadgen.client import Client, build_body
from loadgen.metrics import summarize
from loadgen.runner import Planned, RunResult, no_gc_pauses, run_closed_loop, run_open_loop

DEFAULT_N = 100


class LoadConfig(msgspec.Struct, kw_only=True):
    url: str
    dataset: str
    rate: float | None = None
    arrival: str = "poisson"
    burstiness: float = 1.0
    trace: str | None = None
    n: int | None = None
    duration_s: float | None = None
    concurrency: int | None = None  # set: closed loop with this many requests in flight
    slo: dict[str, float] = {}
    quality_mix: dict[str, float] = {}
    seed: int = 0
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = 0.0
    stream: bool = True
    timeout_s: float = 600.0
    drain_s: float | None = None
    attainment_level: float = 0.95
    normalize: bool = True
    api_key: str | None = None
    data_dir: str | None = None
    event_loop: str = "auto"  # auto (uvloop when installed) | uvloop | asyncio
    progress: bool | None = None
    out: str | None = None
    plots: bool = True


class LoadgenError(ValueError):
    """A bad option or input; the message names it and how to fix it."""


def parse_quality_mix(spec: str | None) -> dict[str, float]:
    """`fast=0.5,best=0.5` (weights, normalized to sum 1); a hint may be a name or a number in (0, 1]."""
    mix: dict[str, float] = {}
    for item in (spec or "").split(","):
        if not item.strip():
            continue
        hint, sep, weight = item.partition("=")
        try:
            value = float(weight) if sep else math.nan
        except ValueError:
            value = math.nan
        if not hint.strip() or not value >= 0:
            raise LoadgenError(f"--quality-mix takes HINT=WEIGHT pairs such as fast=0.5,best=0.5; got {item.strip()!r}")
        mix[hint.strip()] = mix.get(hint.strip(), 0.0) + value
    total = sum(mix.values())
    if mix and total <= 0:
        raise LoadgenError("--quality-mix weights must not all be zero")
    return {k: v / total for k, v in mix.items()}


def _hint_value(hint: str) -> str | float:
    try:
        return float(hint)
    except ValueError:
        return hint


class Workload(msgspec.Struct, kw_only=True):
    prompts: list[Prompt]
    qualities: list[str | None]
    offsets: list[float] | None  # None: closed loop


def build_workload(cfg: LoadConfig) -> Workload:
    """Prompts, quality hints and send offsets, all from `cfg.seed` (independent streams)."""
    schedule_rng, sample_rng, quality_rng, data_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(cfg.seed).spawn(4))
    n = cfg.n if cfg.n is not None or cfg.duration_s is not None else DEFAULT_N
    offsets: np.ndarray | None = None
    trace = None
    if cfg.concurrency is not None:
        count = n if n is not None else 0
    elif cfg.arrival == "trace":
        if not cfg.trace:
            raise LoadgenError("--arrival trace needs --trace FILE (a BurstGPT-format CSV)")
        try:
            trace = arrivals.load_trace(cfg.trace)
        except ValueError as exc:
            raise LoadgenError(str(exc)) from None
        offsets = arrivals.trace_schedule(trace, cfg.rate, n, cfg.duration_s)
        count = len(offsets)
    else:
        if cfg.rate is None:
            raise LoadgenError("--rate RPS is required for open-loop arrivals (or use --concurrency for a closed loop)")
        try:
            offsets = arrivals.schedule(cfg.arrival, cfg.rate, schedule_rng, n=n, duration_s=cfg.duration_s,
                                        burstiness=cfg.burstiness, normalize=cfg.normalize)
        except ValueError as exc:
            raise LoadgenError(str(exc)) from None
        count = len(offsets)
    try:
        if trace is not None and cfg.dataset.split(":")[0] == "random":
            prompts = datasets.for_trace(trace.request_tokens[:count], trace.response_tokens[:count], data_rng)
        else:
            pool = datasets.load(cfg.dataset, data_rng, Path(cfg.data_dir) if cfg.data_dir else None)
            prompts = datasets.sample(pool, count, sample_rng) if count else pool
            if trace is not None:
                prompts = [msgspec.structs.replace(p, max_tokens=max(1, trace.response_tokens[i]))
                           for i, p in enumerate(prompts)]
    except datasets.DatasetError as exc:
        raise LoadgenError(str(exc)) from None
    qualities: list[str | None] = [None] * len(prompts)
    if cfg.quality_mix:
        names = list(cfg.quality_mix)
        picks = quality_rng.choice(len(names), size=len(prompts), p=list(cfg.quality_mix.values()))
        qualities = [names[i] for i in picks]
    return Workload(prompts=prompts, qualities=qualities, offsets=None if offsets is None else offsets.tolist())


def _plans(cfg: LoadConfig, client: Client, work: Workload, model: str, unbounded: bool) -> Iterator[Planned]:
    """Encoded requests in order; cycles through the prompts when a closed loop runs by time only."""
    index = 0
    while True:
        for prompt, quality in zip(work.prompts, work.qualities, strict=True):
            body = build_body(prompt, model, cfg.max_tokens, None if quality is None else _hint_value(quality),
                              cfg.stream, cfg.temperature)
            record = RequestRecord(index=index, prompt_id=prompt.id, quality=quality, reference=prompt.reference)
            yield Planned(record=record, request=client.prepare(body))
            index += 1
        if not unbounded:
            return


async def _discover_model(client: Client) -> str:
    """The first model the server lists (the gateway lists `cascade` first); `default` if it lists none."""
    try:
        status, body = await client.get("/v1/models" if not client.endpoint.base_path.endswith("/v1") else "/models")
        if status == 200:
            data = msgspec.json.decode(body).get("data") or []
            if data and isinstance(data[0], dict) and data[0].get("id"):
                return str(data[0]["id"])
    except Exception:  # the run itself will record what is wrong with the server
        pass
    return "default"


async def execute(cfg: LoadConfig, work: Workload) -> RunResult:
    client = Client(cfg.url, cfg.timeout_s, cfg.api_key)
    model = cfg.model or await _discover_model(client)
    unbounded = cfg.concurrency is not None and cfg.n is None
    plans_iter = _plans(cfg, client, work, model, unbounded)
    with no_gc_pauses():
        if cfg.concurrency is not None:
            result = await run_closed_loop(client, plans_iter if unbounded else list(plans_iter), cfg.concurrency,
                                           stream=cfg.stream, duration_s=cfg.duration_s, drain_s=cfg.drain_s,
                                           progress=cfg.progress)
        else:
            assert work.offsets is not None
            result = await run_open_loop(client, list(plans_iter), work.offsets, stream=cfg.stream,
                                         duration_s=cfg.duration_s, drain_s=cfg.drain_s, progress=cfg.progress)
    result.model = model
    return result


def run_async(coro: Any, event_loop: str = "auto") -> Any:
    """Run on uvloop when asked or (auto) when installed, else on the stdlib loop."""
    if event_loop != "asyncio":
        try:
            import uvloop
        except ImportError:
            if event_loop == "uvloop":
                raise LoadgenError("--event-loop uvloop: uvloop is not installed (pip install uvloop)") from None
        else:
            return uvloop.run(coro)
    return asyncio.run(coro)


def grade_records(records: list[RequestRecord]) -> None:
    for r in records:
        if r.reference is None:
            continue
        full = r.reference
        r.reference = grading.reference_answer(full)
        r.extracted = grading.extract(r.output, full) if r.ok else None
        r.correct = r.ok and grading.grade(r.output, full)


def run_load(cfg: LoadConfig) -> tuple[dict[str, Any], list[RequestRecord]]:
    """Run once; return the summary and the records (and write the run directory if `cfg.out`)."""
    work = build_workload(cfg)
    started = time.time()
    result: RunResult = run_async(execute(cfg, work), cfg.event_loop)
    grade_records(result.records)
    summary = summarize(result.records, cfg.slo, result.duration_s, cfg.attainment_level)
    summary["run"] = {
        "url": cfg.url, "dataset": cfg.dataset, "rate_rps": cfg.rate,
        "arrival": "closed" if cfg.concurrency is not None else cfg.arrival, "burstiness": cfg.burstiness,
        "concurrency": cfg.concurrency, "n": cfg.n, "duration_s": cfg.duration_s, "seed": cfg.seed,
        "quality_mix": cfg.quality_mix, "model": result.model, "max_tokens": cfg.max_tokens, "stream": cfg.stream,
        "event_loop": result.loop, "connections_opened": result.connections_opened, "started_unix": started,
    }
    if cfg.out:
        from loadgen.report import write_run

        write_run(Path(cfg.out), result.records, summary, plots=cfg.plots)
    return summary, result.records
