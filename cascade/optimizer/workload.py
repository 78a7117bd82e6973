"""Request lengths and arrival rate of a problem's workload.

Each outcome row is one request. Its prompt and output token counts come, in this order, from:

1. the outcomes file (measured: `input_tokens`, each tier's `output_tokens`, e.g. from `cascade label`);
2. `workload.trace` (a BurstGPT-format CSV: each row's request and response tokens) or
   `workload.dataset` (a loadgen dataset: prompt tokens estimated as characters / 4, output tokens
   where the dataset carries reply lengths, as ShareGPT and JSONL files with `max_tokens` do);
   an outcome row whose `id` names a dataset prompt (as `cascade label` writes them, e.g.
   "gsm8k-train:17") takes that prompt's lengths, any other draws one trace/dataset row (seeded);
   a response length serves every tier;
3. the lognormal `workload.input_tokens` / `workload.output_tokens`.

Synthetic outcomes carry modelled lengths, not measured ones: there a trace or dataset replaces
what it knows. `workload.rate_rps` may be omitted with a trace: its mean rate is then used (the
simulator still draws Poisson arrivals at that rate; the trace's burstiness is not modelled).
A `LengthScale` (a re-plan from observed traffic, `cascade optimize drift --spec`) then multiplies
the resolved counts, so that their means follow the traffic while their spread and their relation
to difficulty stay the outcomes'.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cascade.errors import ConfigError
from cascade.optimizer.outcomes import Outcomes
from cascade.optimizer.problem import LengthSpec, WorkloadSpec


@dataclass(frozen=True)
class Lengths:
    """Token counts per source row (NaN where the source does not know them)."""

    input_tokens: np.ndarray
    output_tokens: np.ndarray
    rate_rps: float | None = None  # the mean arrival rate of a trace
    ids: tuple[str, ...] = ()  # a dataset's prompt ids


@dataclass(frozen=True)
class LengthScale:
    """Factors for the resolved token counts: prompts, and each tier's outputs (empty: 1.0)."""

    prompt: float = 1.0
    output: tuple[float, ...] = ()

    def apply(self, inputs: np.ndarray, outputs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        factors = np.asarray(self.output if self.output else [1.0] * outputs.shape[1], dtype=float)
        if len(factors) != outputs.shape[1]:
            raise ConfigError(f"length scale has {len(factors)} output factors for {outputs.shape[1]} tiers")
        scaled_in = np.maximum(1, np.round(inputs * self.prompt)).astype(np.int64)
        scaled_out = np.maximum(1, np.round(outputs * factors[None, :])).astype(np.int64)
        return scaled_in, scaled_out


def resolve(workload: WorkloadSpec, outcomes: Outcomes, base_dir: Path, synthetic: bool,
            rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, float]:
    """(input tokens (n,), output tokens (n, tiers), arrival rate) for the outcome rows."""
    n, tiers = outcomes.n, len(outcomes.tiers)
    source = _source(workload, base_dir)
    inputs, outputs = outcomes.input_tokens, outcomes.output_tokens
    if source is not None:
        rows = rng.integers(len(source.input_tokens), size=n)
        if source.ids and outcomes.ids:  # the same prompts: their own lengths
            index = {prompt_id: k for k, prompt_id in enumerate(source.ids)}
            matched = np.array([index.get(row_id, -1) for row_id in outcomes.ids])
            rows = np.where(matched >= 0, matched, rows)
        src_in, src_out = source.input_tokens[rows], np.repeat(source.output_tokens[rows, None], tiers, axis=1)
        inputs, outputs = (_prefer(src_in, inputs), _prefer(src_out, outputs)) if synthetic else \
            (_prefer(inputs, src_in), _prefer(outputs, src_out))
    inputs = _fill(inputs, workload.input_tokens, rng)
    outputs = np.stack([_fill(outputs[:, i], workload.output_tokens, rng) for i in range(tiers)], axis=1)
    rate = workload.rate_rps or (source.rate_rps if source is not None else None)
    if rate is None:
        raise ConfigError("`workload.rate_rps` is missing and the trace spans no time: give the rate")
    return inputs, outputs, rate


def _prefer(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(first), second, first)


def _fill(values: np.ndarray, spec: LengthSpec, rng: np.random.Generator) -> np.ndarray:
    """Known token counts as they are; unknown ones drawn from the workload's distribution."""
    drawn = np.clip(np.round(rng.lognormal(np.log(spec.median), spec.sigma, size=len(values))), 1, spec.max)
    return np.where(np.isnan(values), drawn, values).astype(np.int64)


def _source(workload: WorkloadSpec, base_dir: Path) -> Lengths | None:
    if workload.trace:
        return trace_lengths(_resolve_path(workload.trace, base_dir))
    if workload.dataset:
        return dataset_lengths(workload.dataset, base_dir)
    return None


def _resolve_path(path: str, base_dir: Path) -> Path:
    p = Path(path)
    return p if p.is_absolute() else base_dir / p


def trace_lengths(path: Path) -> Lengths:
    from cascade.data.arrivals import load_trace

    try:
        trace = load_trace(path)
    except ValueError as exc:
        raise ConfigError(f"`workload.trace`: {exc}") from None
    times = trace.times_s
    rate = (len(times) - 1) / times[-1] if len(times) > 1 and times[-1] > 0 else None
    return Lengths(input_tokens=np.maximum(1, np.asarray(trace.request_tokens, dtype=float)),
                   output_tokens=np.maximum(1, np.asarray(trace.response_tokens, dtype=float)), rate_rps=rate)


def dataset_lengths(spec: str, base_dir: Path) -> Lengths:
    from cascade.data import datasets

    name = spec.partition(":")[0]
    if name not in datasets.NAMES:  # a file: relative to the problem, like every path in it
        spec = str(_resolve_path(spec, base_dir))
    try:
        prompts = datasets.load(spec, np.random.default_rng(0))
    except (datasets.DatasetError, OSError) as exc:
        raise ConfigError(f"`workload.dataset`: {exc}") from None
    if not prompts:
        raise ConfigError(f"`workload.dataset`: {spec} holds no prompts")
    inputs = np.array([datasets.estimate_tokens(p.prompt) for p in prompts], dtype=float)
    outputs = np.array([np.nan if p.max_tokens is None else max(1, p.max_tokens) for p in prompts], dtype=float)
    return Lengths(input_tokens=inputs, output_tokens=outputs, ids=tuple(p.id for p in prompts))
