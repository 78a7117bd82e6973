"""Distributed tracing (OpenTelemetry), as one seam that the rest of cascade calls without knowing whether it is on.

Off (the default: `[gateway.tracing] endpoint` empty) `active` is None, nothing of OpenTelemetry is imported, no
header is added, and each call here is a global read and a constant return (a few per request, none per token).
On, `configure` installs an `OTelTracer` (cascade/tracing/otel.py) and:

  * the gateway's ASGI adapter opens a SERVER span per request under the caller's W3C `traceparent`, current for the
    request's task and every task it starts, and answers with the span's own `traceparent` (`OTelTracer.serve`);
  * the request core opens an INTERNAL span for the routing decision (`span`);
  * every upstream call opens a CLIENT span named and attributed per OpenTelemetry's GenAI conventions and sends its
    `traceparent` to the engine (cascade/branches/openai_client.py, `OTelTracer.upstream`);
  * a branch run opens an INTERNAL span with one child per branch, and prune / stop / vote events (`branches`).

This package imports nothing of cascade's layers (pyproject.toml's import contracts): they all import it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from cascade.config import TracingConfig
from cascade.errors import ConfigError
from cascade.tracing.branch_spans import BranchSpans

if TYPE_CHECKING:
    from cascade.tracing.otel import OTelTracer, RecordingSpan

active: OTelTracer | None = None  # the process's tracer; None: tracing is off
_NO_SPAN: AbstractContextManager[None] = contextlib.nullcontext()


def configure(config: TracingConfig) -> OTelTracer:
    """Install a tracer exporting to `config.endpoint` over OTLP/HTTP (the caller checked it is set); ConfigError when
    the `otel` extra is missing."""
    try:
        from cascade.tracing.otel import OTelTracer
    except ImportError as exc:
        raise ConfigError(f"`gateway.tracing.endpoint` is set but OpenTelemetry is not installed ({exc.name} is "
                          "missing): install cascade with the `otel` extra (pip install -e '.[otel]'), or clear "
                          "the endpoint") from None
    tracer = OTelTracer.exporting(config)
    install(tracer)
    return tracer


def install(tracer: OTelTracer | None) -> None:
    """Make `tracer` the process's (None: off). Tests install one over an in-memory exporter."""
    global active
    active = tracer


def span(name: str, attributes: Mapping[str, Any] | None = None) -> AbstractContextManager[RecordingSpan | None]:
    """An INTERNAL span, current inside the block, its error recorded; yields None when tracing is off."""
    if active is None:
        return _NO_SPAN
    return active.span(name, attributes)


_NO_BRANCH_SPANS: AbstractContextManager[BranchSpans] = contextlib.nullcontext(BranchSpans())


def branches(tier: str, n: int, m: int) -> AbstractContextManager[BranchSpans]:
    """The spans of one branch run on `tier` (n branches at most, m to finish), current inside the block."""
    if active is None:
        return _NO_BRANCH_SPANS
    return active.branches(tier, n, m)
