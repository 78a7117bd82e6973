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
  sweep of prompt lengths; it includes the first token and the HTTP round trip, as a client sees it);
* decode step of a batch of B sequences holding C context tokens in total:
  `fixed_s + per_sequence_s * B + per_context_token_s * C` (inter-token latency at concurrency
  B = 1, 2, 4, ...; the context term from the batch-1 requests of the prefill sweep).

`kv_capacity_tokens` is the engine's KV cache in tokens (SGLang's `max_total_num_tokens`); when it
is unknown the replica is limited by the tier's `max_batch` only. A profile holds one replica shape
(`tp` x `pp`): a profiled tier is planned with data-parallel copies of the shapes it has profiles for.

Profiles measured on a GPU of models/gpu/ ship in models/gpu/profiles/<gpu>/<model card>.json (their README); the
planner takes one in place of the roofline for that shape of a tier on that GPU (`shipped_profile`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import msgspec
import numpy as np

from cascade import files
from cascade.config import NonNegativeFloat, PositiveInt, Strict
from cascade.errors import ConfigError
from cascade.optimizer.cards import GPU_DIR
from cascade.optimizer.roofline import ReplicaCost, Shape

UNBOUNDED_KV_TOKENS = 1 << 40  # no known KV cache size: only max_batch limits the batch
NOISE = 0.05  # a fitted context cost smaller than this share of the step is dropped
PROFILE_DIR = GPU_DIR / "profiles"  # <gpu>/<model card>.json: measured, shipped with cascade


class PrefillModel(Strict, frozen=True):
    fixed_s: NonNegativeFloat
    per_token_s: NonNegativeFloat


class DecodeModel(Strict, frozen=True):
    fixed_s: NonNegativeFloat
    per_sequence_s: NonNegativeFloat = 0.0
    per_context_token_s: NonNegativeFloat = 0.0


class PrefillPoint(Strict, frozen=True):
    prompt_tokens: int
    ttft_s: float  # median over `samples` requests
    itl_s: float | None = None  # median inter-token latency of the same requests (batch 1)
    samples: int = 1


class DecodePoint(Strict, frozen=True):
    batch: int
    step_s: float  # inter-token latency while `batch` sequences decode together (probe: median; loadgen: mean)
    context_tokens: float  # mean context (prompt + generated) per sequence during the measurement
    samples: int = 1


class Profile(Strict, frozen=True, kw_only=True):
    version: Literal[1] = 1
    # probe: `cascade profile --url` (synchronized batches, medians); loadgen: `cascade profile
    # --from-loadgen` (a load test's own timings under staggered arrivals, means: see fit_trace)
    source: Literal["probe", "loadgen"] = "probe"
    model: str
    url: str = ""
    label: str = ""  # free text: engine, version, hardware
    tp: PositiveInt = 1
    pp: PositiveInt = 1
    kv_capacity_tokens: PositiveInt | None = None
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
    return files.load(path, Profile, "profile")


def shipped_profile(gpu: str, model: str) -> Path | None:
    """The profile measured on GPU spec `gpu` for GPU model card `model` that ships with cascade, if there is one."""
    path = PROFILE_DIR / gpu / f"{model}.json"
    return path if path.is_file() else None


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
    """Context cost from batch-1 ITL over the prompt sweep (context = prompt + half the output),
    then fixed and per-sequence costs from the batch sweep with the context part taken out. A
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


# ---- fitting from a load test's own timings (`cascade profile --from-loadgen`) -----------------

MIN_BATCH_SAMPLES = 20  # gaps a batch size needs before it is listed as a decode point


class TracedRequest(msgspec.Struct, frozen=True):
    """One streamed request of a load test, on a clock shared by all of them."""

    sent_s: float
    ttft_s: float
    itl_s: list[float]  # gap before each token after the first
    prompt_tokens: int


class TraceFit(msgspec.Struct, frozen=True):
    prefill: PrefillModel
    decode: DecodeModel
    prefill_points: list[PrefillPoint]
    decode_points: list[DecodePoint]
    decode_gaps: int  # inter-token gaps the decode fit used
    prefill_requests: int  # requests the prefill fit used


def fit_trace(requests: list[TracedRequest]) -> TraceFit:
    """Step costs read off a load test, as the engine ran them under staggered arrivals.

    Why: a batch probe starts its B requests together; on transformers' continuous batching the
    same worker steps 20-30% slower when requests join and leave at random (session-6 SmolLM2 runs:
    probe 30 ms + 20 ms/sequence, load test 38 ms + 24 ms/sequence), and a replay with the probe
    underestimated p95 by 27-32%.

    * decode: every inter-token gap that overlaps no request's wait for its first token (a prefill
      blocks the whole batch, so those gaps hold prefill time), with B = the requests decoding through
      the gap and C = their context (prompt + tokens so far). Least squares of the gap on (1, B, C);
      the mean, not the median, because the simulator sums steps (GC pauses and jitter count).
    * prefill: requests whose wait overlaps no other request's wait (their own prefill ran alone),
      timed from the end of the decode step in progress when they arrived (the first token anyone
      received after their send) or from their send on an idle engine; least squares on prompt
      tokens. (The last token before their first would under-read it: transformers streams a first
      token a few steps after the prefill that blocked the batch.)
    """
    if len(requests) < 3:
        raise ValueError(f"{len(requests)} completed request(s): a trace fit needs at least 3")
    sent = np.array([r.sent_s for r in requests])
    first = sent + np.array([r.ttft_s for r in requests])
    tokens = [f + np.concatenate([[0.0], np.cumsum(r.itl_s)]) for f, r in zip(first, requests, strict=True)]
    ends = np.array([t[-1] for t in tokens])
    prompt = np.array([r.prompt_tokens for r in requests], dtype=float)
    gap_parts, batch_parts, context_parts = [], [], []
    for t in tokens:
        a, b = t[:-1], t[1:]
        if len(a) == 0:
            continue
        prefilling = ((sent[None, :] < b[:, None]) & (first[None, :] > a[:, None])).any(axis=1)
        # Decoding through the gap: first token before its middle, last after it (clients receive one
        # step's tokens a little apart, so its ends would not compare reliably).
        middle = (a + b) / 2
        live = (first[None, :] <= middle[:, None]) & (ends[None, :] >= middle[:, None])
        context = np.zeros(len(a))
        for j in np.nonzero(live.any(axis=0))[0]:
            done = np.searchsorted(tokens[j], middle)
            context += np.where(live[:, j], prompt[j] + done, 0.0)
        keep = ~prefilling
        gap_parts.append((b - a)[keep])
        batch_parts.append(live.sum(axis=1)[keep].astype(float))
        context_parts.append(context[keep])
    gaps = np.concatenate(gap_parts) if gap_parts else np.zeros(0)
    if len(gaps) == 0:
        raise ValueError("no inter-token gap outside a prefill: the requests streamed one token each, or every "
                         "gap overlapped another request's prefill")
    batch, context = np.concatenate(batch_parts), np.concatenate(context_parts)
    decode = _fit_decode_gaps(gaps, batch, context)
    points = [DecodePoint(batch=int(size), step_s=float(np.mean(gaps[batch == size])),
                          context_tokens=float(np.mean(context[batch == size]) / size),
                          samples=int(np.sum(batch == size)))
              for size in np.unique(batch) if np.sum(batch == size) >= MIN_BATCH_SAMPLES]

    waits_overlap = (sent[None, :] < first[:, None]) & (first[None, :] > sent[:, None])
    alone = waits_overlap.sum(axis=1) == 1  # only its own wait
    if alone.sum() < 3:  # one prompt length is enough: the prefill cost is then flat (fit_line)
        raise ValueError(f"{int(alone.sum())} request(s) prefilled alone (need 3): the load was too high to see "
                         "a prefill on its own; use a lower rate")
    # A prefill starts when the step in progress ends: the first token anyone received after this
    # request was sent, if that came before its own first token (else the engine was idle).
    stream_times = np.append(np.sort(np.concatenate(tokens)), np.inf)
    after = stream_times[np.searchsorted(stream_times, sent, side="right")]
    ttft = first - np.where(after < first, after, sent)
    fixed, per_token = fit_line(list(prompt[alone]), list(ttft[alone]))
    order = np.argsort(prompt[alone])
    bins = np.array_split(order, min(6, len(order)))
    prefill_points = [PrefillPoint(prompt_tokens=int(np.median(prompt[alone][rows])),
                                   ttft_s=float(np.mean(ttft[alone][rows])), samples=len(rows)) for rows in bins]
    return TraceFit(prefill=PrefillModel(fixed_s=fixed, per_token_s=per_token), decode=decode,
                    prefill_points=prefill_points, decode_points=points, decode_gaps=len(gaps),
                    prefill_requests=int(alone.sum()))


def _fit_decode_gaps(gaps: np.ndarray, batch: np.ndarray, context: np.ndarray) -> DecodeModel:
    """gap = fixed + per_sequence*B + per_context*C by least squares, every coefficient >= 0; a context
    cost below NOISE of the step at the largest context is dropped (as in fit_decode)."""
    design = np.column_stack([np.ones_like(gaps), batch, context])
    if len(np.unique(batch)) >= 2 and len(np.unique(context)) >= 3:
        fixed, per_sequence, per_context = (float(x) for x in np.linalg.lstsq(design, gaps, rcond=None)[0])
        top = int(np.argmax(context))
        if min(fixed, per_sequence, per_context) >= 0 and \
                per_context * context[top] >= NOISE * (fixed + per_sequence * batch[top] + per_context * context[top]):
            return DecodeModel(fixed_s=fixed, per_sequence_s=per_sequence, per_context_token_s=per_context)
    fixed, per_sequence = fit_line(list(batch), list(gaps))
    return DecodeModel(fixed_s=fixed, per_sequence_s=per_sequence)
