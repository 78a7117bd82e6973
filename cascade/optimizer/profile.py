"""Measured step costs of one serving replica: the profile file `cascade profile` writes, and the
`ReplicaCost` the planner builds from it in place of the roofline estimate.

The file is JSON (one `Profile` Struct), for example:

    {"version": 1, "model": "Qwen/Qwen2.5-7B-Instruct", "url": "http://10.0.0.5:30000",
     "label": "sglang 0.5, 1 x H100", "tp": 1, "pp": 1, "kv_capacity_tokens": 520000,
     "prefill": {"fixed_s": 0.018, "per_token_s": 6.1e-05},
     "decode": {"fixed_s": 0.0071, "per_sequence_s": 0.00012, "per_context_token_s": 2.0e-08},
     "prompt_tokens_source": "usage",
     "prefill_points": [{"prompt_tokens": 128, "ttft_s": 0.026, "itl_s": 0.0072, "samples": 3}, ...],
     "decode_points": [{"batch": 8, "step_s": 0.0082, "context_tokens": 180.0, "samples": 240}, ...],
     "measured_at": "2025-06-01T12:00:00Z", "elapsed_s": 41.2}

The model it encodes, fitted by least squares on the measured points:

* prefill of one engine iteration: `fixed_s + per_token_s * tokens` (TTFT at concurrency 1 over a
  ladder of prompt lengths; it includes the first token and the HTTP round trip, as a client sees it);
* decode step of a batch of B sequences holding C context tokens in total:
  `fixed_s + per_sequence_s * B + per_context_token_s * C` (inter-token latency at concurrency
  B = 1, 2, 4, ...; the context term from the batch-1 requests of the prefill ladder).

`kv_capacity_tokens` is the engine's KV cache in tokens (SGLang's `max_total_num_tokens`); when it
is unknown the replica is limited by the tier's `max_batch` only. A profile holds one replica shape
(`tp` x `pp`): a profiled tier is planned with data-parallel copies of the shapes it has profiles for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import msgspec
import numpy as np

from cascade.errors import ConfigError
from cascade.optimizer.roofline import ReplicaCost, Shape

NonNegative = Annotated[float, msgspec.Meta(ge=0)]
Positive = Annotated[int, msgspec.Meta(ge=1)]
UNBOUNDED_KV_TOKENS = 1 << 40  # no known KV cache size: only max_batch limits the batch
NOISE = 0.05  # a fitted context cost smaller than this share of the step is dropped


class _Strict(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class PrefillModel(_Strict, frozen=True):
    fixed_s: NonNegative
    per_token_s: NonNegative


class DecodeModel(_Strict, frozen=True):
    fixed_s: NonNegative
    per_sequence_s: NonNegative = 0.0
    per_context_token_s: NonNegative = 0.0


class PrefillPoint(_Strict, frozen=True):
    prompt_tokens: int
    ttft_s: float  # median over `samples` requests
    itl_s: float | None = None  # median inter-token latency of the same requests (batch 1)
    samples: int = 1


class DecodePoint(_Strict, frozen=True):
    batch: int
    step_s: float  # median inter-token latency while `batch` sequences decode together
    context_tokens: float  # mean context (prompt + generated) per sequence during the measurement
    samples: int = 1


class Profile(_Strict, frozen=True, kw_only=True):
    version: Literal[1] = 1
    model: str
    url: str = ""
    label: str = ""  # free text: engine, version, hardware
    tp: Positive = 1
    pp: Positive = 1
    kv_capacity_tokens: Positive | None = None
    prefill: PrefillModel
    decode: DecodeModel
    prompt_tokens_source: Literal["usage", "estimate"] = "usage"
    prefill_points: list[PrefillPoint] = msgspec.field(default_factory=list)
    decode_points: list[DecodePoint] = msgspec.field(default_factory=list)
    measured_at: str = ""
    elapsed_s: float = 0.0

    @property
    def shape(self) -> Shape:
        return Shape(self.tp, self.pp)


def load_profile(path: str | Path) -> Profile:
    p = Path(path)
    try:
        return msgspec.json.decode(p.read_bytes(), type=Profile)
    except OSError as exc:
        raise ConfigError(f"cannot read profile {p}: {exc.strerror}") from None
    except msgspec.MsgspecError as exc:
        raise ConfigError(f"{p}: invalid profile: {exc}") from None


def write_profile(path: str | Path, profile: Profile) -> None:
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(msgspec.json.format(msgspec.json.encode(profile)) + b"\n")
    except OSError as exc:
        raise ConfigError(f"cannot write profile {p}: {exc.strerror}") from None


class ProfileCost(ReplicaCost):
    """A replica's step costs from a profile (same interface as `RooflineCost`)."""

    def __init__(self, profile: Profile, kv_capacity_tokens: int | None = None) -> None:
        self.profile = profile
        self.shape = profile.shape
        self._kv = kv_capacity_tokens or profile.kv_capacity_tokens or UNBOUNDED_KV_TOKENS

    @property
    def kv_capacity_tokens(self) -> int:
        return self._kv

    def decode_coeffs(self, batch: int) -> tuple[float, float, float, float, float]:
        d = self.profile.decode
        base = d.fixed_s + d.per_sequence_s * batch
        return base, d.per_context_token_s, base, d.per_context_token_s, 0.0

    def prefill_time(self, tokens: int, tokens_sq: float, requests: int = 1) -> float:
        p = self.profile.prefill
        return p.fixed_s + p.per_token_s * tokens


# ---- fitting (used by `cascade profile`; pure numpy, no I/O) ----------------------------------


def fit_line(x: list[float], y: list[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope), both kept >= 0: a negative slope (noise around a flat
    line) becomes a flat line at the mean; a negative intercept, a line through the origin."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(xs) == 0:
        raise ValueError("no points to fit")
    if len(np.unique(xs)) < 2:
        return max(0.0, float(np.mean(ys))), 0.0
    slope, intercept = np.polyfit(xs, ys, 1)
    if slope < 0:
        return max(0.0, float(np.mean(ys))), 0.0
    if intercept < 0:
        return 0.0, max(0.0, float(np.dot(xs, ys) / np.dot(xs, xs)))
    return float(intercept), float(slope)


def fit_prefill(points: list[PrefillPoint]) -> PrefillModel:
    fixed, per_token = fit_line([p.prompt_tokens for p in points], [p.ttft_s for p in points])
    return PrefillModel(fixed_s=fixed, per_token_s=per_token)


def fit_decode(points: list[DecodePoint], batch1: list[PrefillPoint], output_tokens: int) -> DecodeModel:
    """Context cost from batch-1 ITL over the prompt ladder (context = prompt + half the output),
    then fixed and per-sequence costs from the batch ladder with the context part taken out. A
    context cost below NOISE of the step at the longest measured context counts as noise (0)."""
    single = [p for p in batch1 if p.itl_s is not None]
    per_context = 0.0
    if len(single) >= 2:
        contexts = [p.prompt_tokens + output_tokens / 2 for p in single]
        base, per_context = fit_line(contexts, [float(p.itl_s or 0.0) for p in single])
        if per_context * max(contexts) < NOISE * (base + per_context * max(contexts)):
            per_context = 0.0
    fixed, per_sequence = fit_line([p.batch for p in points],
                                   [p.step_s - per_context * p.batch * p.context_tokens for p in points])
    return DecodeModel(fixed_s=fixed, per_sequence_s=per_sequence, per_context_token_s=per_context)
