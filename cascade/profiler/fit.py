"""`cascade profile` (command line: cascade/profiler/cli.py): measure a live OpenAI-compatible
backend's prefill and decode-step times and write a profile file (format:
cascade/optimizer/profile.py) that `cascade optimize plan` uses in place of the roofline estimate
(`profile = "..."` on a tier of problem.toml). Or, with `--from-loadgen RUN`, fit the same model
from a finished `cascade loadgen` run's own timings (`profile_from_loadgen`; the method is
`cascade.optimizer.profile.fit_trace`): the engine as it behaves under staggered arrivals.

How the live backend is measured (the prefill and decode sweeps) is cascade/profiler/probe.py; this
module turns either source into a `Profile`.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from cascade.errors import CascadeError
from cascade.optimizer.profile import Profile, TracedRequest, fit_decode, fit_prefill, fit_trace
from cascade.profiler.probe import Profiler, Settings
from cascade.repo_paths import recorded_value

# Settings is part of this module's API: callers build one to call `measure`.
__all__ = ["Settings", "measure", "profile_from_loadgen", "profile_from_records", "read_loadgen_records"]


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
        prefill, use_usage = await profiler.prefill_sweep(started + settings.time_limit_s / 2)
        decode = await profiler.decode_sweep(started + settings.time_limit_s, use_usage)
    if len(prefill) < 2 or not decode:
        raise CascadeError(f"measured {len(prefill)} prompt length(s) and {len(decode)} batch size(s) within "
                           f"--time-limit-s {settings.time_limit_s:g} (need 2 and 1): raise it, or lower "
                           "--prompt-tokens, --repeats, --max-batch or --output-tokens")
    return Profile(
        model=_recorded_model(profiler.model), url=settings.url, label=settings.label, tp=settings.tp, pp=settings.pp,
        kv_capacity_tokens=kv, prefill=fit_prefill(prefill),
        decode=fit_decode(decode, prefill, settings.output_tokens),
        prompt_tokens_source="usage" if use_usage else "estimate", prefill_points=prefill, decode_points=decode,
        measured_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), elapsed_s=round(time.monotonic() - started, 3))


def read_loadgen_records(run: str | Path) -> list[Any]:
    """The rows of a finished `cascade loadgen --out RUN` (its requests.jsonl; RUN may also name that file)."""
    from cascade.data.records import RecordsError, read_request_records

    try:
        return read_request_records(run)
    except RecordsError as exc:
        raise CascadeError(str(exc)) from None


def profile_from_loadgen(run: str | Path, *, model: str = "", label: str = "", kv_capacity_tokens: int | None = None,
                         tp: int = 1, pp: int = 1) -> Profile:
    """A profile fitted from a finished `cascade loadgen --out RUN` (see `profile_from_records`)."""
    records = read_loadgen_records(run)
    try:
        return profile_from_records(records, model=model, label=label, origin=str(recorded_value(str(run))),
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
    served = model or (models.most_common(1)[0][0] if models else "")
    return Profile(source="loadgen", model=_recorded_model(served), url="",
                   label=label or f"fitted from {origin} ({len(done)} requests, {fit.decode_gaps} gaps)",
                   tp=tp, pp=pp, kv_capacity_tokens=kv_capacity_tokens, prefill=fit.prefill, decode=fit.decode,
                   prompt_tokens_source="usage", prefill_points=fit.prefill_points, decode_points=fit.decode_points,
                   measured_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), elapsed_s=round(elapsed, 3))


def _recorded_model(model: str) -> str:
    """The model as a profile records it: `transformers serve` names a local model by its directory
    (`/root/.cache/cascade/models/qwen2.5-coder-0.5b`), whose name is the embedded model's card name
    (models/embedded/); a profile is committed, so it keeps that name, not one machine's path."""
    return Path(model).name if Path(model).is_absolute() else model
