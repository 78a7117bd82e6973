"""A window of the gateway's traffic log, as `cascade optimize drift` reads it.

The gateway writes one `cascade.schemas.TrafficRecord` per served request (`[gateway] traffic_log`).
Lines that do not decode, or carry impossible values (non-finite times, negative counts), are
skipped and counted. The window is the last `window_s` seconds of records by `ts`, ending at the
newest record (not at the current time, so an old log can be checked offline). Records of a tier
index the plan does not have are dropped and counted too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from cascade.errors import ConfigError
from cascade.plan import Plan
from cascade.schemas import TrafficRecord

BYPASS = "bypass"  # the hint of a request that named a tier's own model: the gateway did not route it


@dataclass(frozen=True)
class Window:
    records: list[TrafficRecord]  # sorted by ts, never empty
    window_s: float
    malformed: int  # over the whole file
    unknown_tier: int  # in the window

    @property
    def span_s(self) -> float:
        return self.records[-1].ts - self.records[0].ts

    @property
    def rate_rps(self) -> float | None:
        """Arrival rate: (n - 1) / span (None with fewer than two distinct times)."""
        n, span = len(self.records), self.span_s
        return (n - 1) / span if n >= 2 and span > 0 else None


def read_window(path: str | Path, window_s: float, n_tiers: int) -> Window:
    p = Path(path)
    if not (window_s > 0 and math.isfinite(window_s)):
        raise ConfigError(f"--window-s must be a positive number of seconds, got {window_s}")
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read traffic log {p}: {exc.strerror} (the gateway writes it when "
                          "`[gateway] traffic_log` is set)") from None
    decode = msgspec.json.Decoder(TrafficRecord).decode
    records, malformed = [], 0
    for line in data.splitlines():
        if not line.strip():
            continue
        try:
            record = decode(line)
        except msgspec.MsgspecError:
            malformed += 1
            continue
        if _valid(record):
            records.append(record)
        else:
            malformed += 1
    end = max((r.ts for r in records), default=0.0)
    recent = sorted((r for r in records if r.ts >= end - window_s), key=lambda r: r.ts)
    usable = [r for r in recent if r.tier < n_tiers]
    unknown = len(recent) - len(usable)
    if not usable:
        raise ConfigError(f"{p}: no usable traffic record in the last {window_s:g} s ({malformed} malformed "
                          f"line(s), {unknown} record(s) of tiers the plan does not have)")
    return Window(records=usable, window_s=window_s, malformed=malformed, unknown_tier=unknown)


def _valid(r: TrafficRecord) -> bool:
    return (math.isfinite(r.ts) and math.isfinite(r.latency_s) and r.latency_s >= 0 and r.tier >= 0
            and r.prompt_tokens >= 0 and r.completion_tokens >= 0 and r.escalations >= 0)


class Columns:
    """The window's records as numpy columns, for one plan's ladder."""

    def __init__(self, plan: Plan, window: Window) -> None:
        recs = window.records
        self.n, k = len(recs), len(plan.tiers)
        self.hints = np.array([r.hint for r in recs], dtype=object)
        self.tier = np.array([r.tier for r in recs], dtype=int)
        self.latency = np.array([r.latency_s for r in recs], dtype=float)
        self.prompt = np.array([r.prompt_tokens for r in recs], dtype=float)
        self.completion = np.array([r.completion_tokens for r in recs], dtype=float)
        self.escalations = np.array([r.escalations for r in recs], dtype=int)
        self.learned_router = np.array([r.router == "learned" for r in recs], dtype=bool)
        self.out_of_domain = np.array([r.out_of_domain for r in recs], dtype=bool)  # routed by the heuristic
        one_hot = np.arange(k)[None, :] == self.tier[:, None]
        reach = np.arange(k)[None, :] <= self.tier[:, None]  # a cascade ran every cheaper tier first
        cascade = (self.hints != BYPASS)[:, None] if plan.routing == "cascade" else np.zeros((self.n, 1), bool)
        self.load = np.where(cascade, reach, one_hot).astype(float)  # (n, tiers): the tiers that processed it

    def hint_names(self) -> list[str]:
        return sorted(set(self.hints.tolist()))
