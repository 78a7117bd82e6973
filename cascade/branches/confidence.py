"""Confidence read from an answer's own token log-probabilities (DeepConf-style), where the engine returns them.

DeepConf (Fu et al., 2025, "Deep Think with Confidence") scores a reasoning trace by how sure the model was
while writing it: a token's confidence, averaged over a sliding *group* of tokens, and the trace's **lowest
group confidence** (the weakest stretch of reasoning) separates right from wrong traces better than the mean
over the whole trace; online, a trace whose current group confidence falls below a threshold is stopped.

DeepConf's token confidence is the negative mean log-probability of the top-k candidates, which needs
`top_logprobs`; cascade reads the sampled token's own log-probability, which every OpenAI-compatible engine
returns with `logprobs: true` (SGLang, vLLM, llama.cpp, OpenAI), and puts each statistic on a probability
scale, so that it lives in [0, 1] beside vote agreement and the router's prior:

* ``mean``: the geometric-mean probability of the answer's tokens, ``exp(mean logprob)``;
* ``lowest_group``: the lowest ``exp(mean logprob)`` over every window of ``group`` consecutive tokens (the
  whole answer when it is shorter);
* ``tail``: ``exp(mean logprob)`` over the last ``group`` tokens (where the final answer is written).

None of them is a probability of being right: cascade/router/acceptance.py maps them through a per-tier
calibration fitted on labelled outcomes (benchmarks/router/answer_confidence.py prints one).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

import msgspec

from cascade.data.outcomes import TokenConfidence

__all__ = ["DEFAULT_GROUP", "LOGPROBS_REQUEST", "STATISTICS", "Certainties", "GroupWindow", "TokenConfidence",
           "TraceConfidence", "confidence_of", "quantile", "token_certainties", "token_logprobs"]

# What cascade adds to a request to read its answer's confidence: `top_logprobs: 1` too, because llama.cpp's
# server returns no logprobs without it (SGLang, vLLM and OpenAI return the sampled token's either way).
LOGPROBS_REQUEST: dict[str, object] = {"logprobs": True, "top_logprobs": 1}
DEFAULT_GROUP = 32  # tokens per group (DeepConf uses 2048 on traces of ~10k tokens; ours are ~300)
FLOOR_LOGPROB = -100.0  # engines send -inf / -9999 for impossible tokens: one such token must not own the mean


STATISTICS = ("mean", "lowest_group", "tail")


class _Candidate(msgspec.Struct):
    logprob: float | None = None


class _Entry(msgspec.Struct):
    logprob: float | None = None
    top_logprobs: list[_Candidate] | None = None


_decode_entry = msgspec.json.Decoder(_Entry).decode


def _clamped(value: float | None) -> float | None:
    if value is None or math.isnan(value):
        return None
    return max(FLOOR_LOGPROB, min(0.0, value))


def token_logprobs(entries: Sequence[msgspec.Raw]) -> list[float]:
    """The sampled tokens' log-probabilities from an engine's `logprobs.content` entries (as sent); an entry
    without a number is skipped."""
    values = []
    for raw in entries:
        try:
            value = _clamped(_decode_entry(raw).logprob)
        except msgspec.MsgspecError:
            continue
        if value is not None:
            values.append(value)
    return values


class Certainties(NamedTuple):
    values: list[float]
    top_k: bool  # DeepConf's (from 2 or more candidates per token); False: the sampled tokens' logprobs


def token_certainties(entries: Sequence[msgspec.Raw]) -> Certainties:
    """Each token's confidence as DeepConf defines it, -(mean log-probability of the top-k candidates the engine
    sent), where the entries carry `top_logprobs` of 2 or more numbers; else the sampled token's own
    log-probability stands in (one engine sends one kind throughout, so a branch's values share a scale). Higher is
    surer either way: a peaked distribution leaves its runners-up far below zero."""
    values, top_k = [], False
    for raw in entries:
        try:
            entry = _decode_entry(raw)
        except msgspec.MsgspecError:
            continue
        top = [v for c in entry.top_logprobs or () if (v := _clamped(c.logprob)) is not None]
        if len(top) >= 2:
            values.append(-math.fsum(top) / len(top))
            top_k = True
        elif (own := _clamped(entry.logprob)) is not None:
            values.append(own)
    return Certainties(values, top_k)


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile of `values` (linear between order statistics, numpy's default); q in [0, 1]."""
    if not values:
        raise ValueError("the quantile of no values")
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    low = math.floor(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def confidence_of(logprobs: Sequence[float], group: int = DEFAULT_GROUP) -> TokenConfidence | None:
    """The answer's confidence statistics; None when there are no log-probabilities (engine sent none)."""
    if not logprobs:
        return None
    if group < 1:
        raise ValueError(f"group must be >= 1 token, got {group}")
    window = GroupWindow(group)
    lowest = math.inf
    for value in logprobs:
        window.push(value)
        if window.full:
            lowest = min(lowest, window.mean)
    if not window.full:  # shorter than one group: the whole answer is its only group
        lowest = window.mean
    return TokenConfidence(tokens=len(logprobs), group=group, mean=math.exp(math.fsum(logprobs) / len(logprobs)),
                           lowest_group=math.exp(lowest), tail=math.exp(window.mean))


class GroupWindow:
    """The mean log-probability of the last `size` tokens, updated one token at a time (the online test a
    branch runner prunes on)."""

    __slots__ = ("_sum", "_values", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._values: deque[float] = deque()
        self._sum = 0.0

    def push(self, logprob: float) -> None:
        self._values.append(logprob)
        self._sum += logprob
        if len(self._values) > self.size:
            self._sum -= self._values.popleft()

    @property
    def full(self) -> bool:
        return len(self._values) >= self.size

    @property
    def mean(self) -> float:
        return self._sum / len(self._values) if self._values else 0.0

    @property
    def confidence(self) -> float:
        """exp(mean logprob) of the window: the current group confidence."""
        return math.exp(self.mean)


class TraceConfidence:
    """One branch's running confidence (DeepConf): the mean of its last `group` token certainties
    (`token_certainties`) and the lowest such group mean so far, the trace's confidence. A trace shorter than one
    group has one group, itself."""

    __slots__ = ("_lowest", "tokens", "top_k", "window")

    def __init__(self, group: int) -> None:
        self.window = GroupWindow(group)
        self._lowest = math.inf
        self.tokens = 0
        self.top_k = False

    def extend(self, certainties: Certainties) -> None:
        self.top_k = self.top_k or certainties.top_k
        for value in certainties.values:
            self.push(value)

    def push(self, value: float) -> None:
        self.tokens += 1
        self.window.push(value)
        if self.window.full:
            self._lowest = min(self._lowest, self.window.mean)

    @property
    def current(self) -> float | None:
        """The last full group's mean (None until `group` tokens have come)."""
        return self.window.mean if self.window.full else None

    @property
    def lowest_group(self) -> float | None:
        """The trace's confidence: its weakest group's mean (None before any token)."""
        if math.isfinite(self._lowest):
            return self._lowest
        return self.window.mean if self.tokens else None

    @property
    def weight(self) -> float | None:
        """The trace confidence as a vote's weight, > 0: DeepConf's as it is, a mean logprob as exp() of it."""
        lowest = self.lowest_group
        if lowest is None:
            return None
        return max(lowest, 1e-9) if self.top_k else math.exp(lowest)
