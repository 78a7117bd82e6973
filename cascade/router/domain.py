"""Is a prompt like the ones the router was trained on? A range check on the router's own features.

A router learns p_fail from one kind of traffic (GSM8K word problems, say). On a prompt unlike any of them
("Say hello.", a multiple-choice quiz, code) its logistic models extrapolate, and a linear model far outside
its data is confidently wrong in whichever direction its weights point. So the router also keeps the range of
its training features and flags a prompt whose features lie outside it; the gateway then routes that prompt
by the documented heuristic instead (cascade/router/policy.py) and says so in the response.

Score: the prompt's *excess*, summed over the dense standardised feature columns (lexical, steps, restated,
topic; not hashes or embeddings), of how far each lies outside [min, max] of the training prompts, in
training standard deviations. A prompt is out of domain when its excess is above a threshold: the
``quantile`` (default 0.99) of the excess of *held-out* training prompts against the range of the other
folds (5-fold cross-fitting), so about 1% of unseen in-domain prompts are flagged by construction; at least
``MIN_THRESHOLD`` (two standard deviations in total), so that templated training prompts, whose held-out excess
is all 0, do not flag every prompt that differs from them by a word.

Optionally (``domain_embeddings``, needs the MiniLM wheel at training and serving, ~25 ms per decision) a second
test on the prompt's MiniLM sentence embedding: its distance to the plane of the first ``EMBEDDING_AXES``
principal axes of the training prompts' embeddings (the reconstruction residual), with a threshold from the
same held-out rule. A prompt is out of domain when either test says so. Lexical features cannot tell the genre
of a paragraph (a code request or an essay prompt of a word problem's length passes them); the embedding can.

A third test needs nothing but the prompts (``domain_words``, on by default): the prompt's mean surprise, in
nats per token, under a word bigram model of the training prompts (interpolated with a smoothed unigram model;
numbers folded into one token), thresholded by the same held-out rule. It tells genre, which the feature range
cannot: alone it flags 89% of ShareGPT first turns against 50% for the range test on the embedded router
(both together 95%), and 0.6% of unseen GSM8K questions (both 1.0%); it costs ~0.1 ms per decision. A prompt
is out of domain when any test says so.

Chosen by measurement (benchmarks/router/domain.py, the embedded ladder's router, same 0.99 held-out rule): a
Ledoit-Wolf Mahalanobis distance flagged 10% of 20 chat prompts and 73% of MMLU prompts (a short prompt is far
out on a few features only, and rare count features widen a covariance threshold); counting out-of-range
features flagged 15% of the chat prompts; the summed excess flags all chat and all 12,106 MMLU prompts, and
0.4% of the 1,319 unseen GSM8K test questions.

This module is what a fitted router scores a prompt with (numpy only); fitting the three tests and their
thresholds (``MIN_THRESHOLD``, ``EMBEDDING_AXES``, the held-out folds) is training, in
cascade/router/train/domain_check.py.
"""

from __future__ import annotations

import re
import zlib
from collections import Counter
from collections.abc import Sequence
from itertools import pairwise

import numpy as np

DEFAULT_QUANTILE = 0.99  # a classifier parameter's default, so it lives beside what serving reads


def excess(Z: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Per row of ``Z``: the summed distance of its columns outside [low, high] (0 inside)."""
    Z = np.asarray(Z, dtype=float)
    return np.maximum(0.0, np.maximum(low - Z, Z - high)).sum(axis=1)


def residual(E: np.ndarray, mean: np.ndarray, axes: np.ndarray) -> np.ndarray:
    """Per row of ``E``: the norm of its part outside the plane through ``mean`` spanned by ``axes``."""
    centred = np.asarray(E, dtype=float) - mean
    return np.linalg.norm(centred - (centred @ axes.T) @ axes, axis=1)


# Weight of the bigram estimate against the unigram one. Measured on both committed routers' training prompts
# (scratch harness, 0.99 held-out rule): 0.6 flags 89-91% of ShareGPT and 1.1% of unseen GSM8K, 0.3 one point
# fewer of ShareGPT and 5-10 points fewer of the chat prompts at the same in-domain rate.
WORD_MIX = 0.6
UNIGRAM_PSEUDOCOUNT = 0.1
_WORD = re.compile(r"[a-z]+|\d+|[^\sa-z\d]")


def word_tokens(prompt: str) -> list[str]:
    """Lower-cased words, numbers (all one token: a problem's numbers change, its wording does not) and
    punctuation, between start and end markers."""
    return ["<s>", *("<num>" if t[0].isdigit() else t for t in _WORD.findall(prompt.lower())), "</s>"]


def _key(text: str) -> int:
    return zlib.crc32(text.encode())


def _table(counter: Counter[int]) -> tuple[np.ndarray, np.ndarray]:
    keys = np.array(sorted(counter), dtype=np.uint32)
    return keys, np.array([counter[k] for k in keys.tolist()], dtype=np.int32)


def _lookup(keys: np.ndarray, counts: np.ndarray, query: np.ndarray) -> np.ndarray:
    at = np.minimum(np.searchsorted(keys, query), max(len(keys) - 1, 0))
    return np.where(keys[at] == query, counts[at], 0) if len(keys) else np.zeros(len(query), dtype=np.int32)


class WordModel:
    """Counts of the training prompts' words and word pairs, keyed by crc32 (plain arrays, for skops), and the
    flag threshold of the mean surprise."""

    def __init__(self, prompts: Sequence[str], threshold: float = float("inf")) -> None:
        words: Counter[int] = Counter()
        contexts: Counter[int] = Counter()
        pairs: Counter[int] = Counter()
        for prompt in prompts:
            tokens = word_tokens(prompt)
            keys = [_key(t) for t in tokens]
            words.update(keys[1:])
            contexts.update(keys[:-1])
            pairs.update(_key(f"{a} {b}") for a, b in pairwise(tokens))
        self.word_keys, self.word_counts = _table(words)
        self.context_keys, self.context_counts = _table(contexts)
        self.pair_keys, self.pair_counts = _table(pairs)
        self.threshold = threshold

    def surprise(self, prompts: Sequence[str]) -> np.ndarray:
        """Per prompt: the mean of -log P(word | previous word) over its tokens, in nats."""
        total = float(self.word_counts.sum())
        vocabulary = len(self.word_keys) + 1  # + every unseen word, as one
        out = np.empty(len(prompts))
        for i, prompt in enumerate(prompts):
            tokens = word_tokens(prompt)
            keys = np.array([_key(t) for t in tokens], dtype=np.uint32)  # words are keys[1:], contexts keys[:-1]
            pairs = np.array([_key(f"{a} {b}") for a, b in pairwise(tokens)], dtype=np.uint32)
            unigram = (_lookup(self.word_keys, self.word_counts, keys[1:]) + UNIGRAM_PSEUDOCOUNT) / (
                total + UNIGRAM_PSEUDOCOUNT * vocabulary)
            seen = _lookup(self.context_keys, self.context_counts, keys[:-1])
            bigram = _lookup(self.pair_keys, self.pair_counts, pairs) / np.maximum(seen, 1)
            out[i] = float(-np.log(WORD_MIX * bigram + (1.0 - WORD_MIX) * unigram).mean())
        return out
