"""Per-prompt feature vectors cached on disk by the sha256 of the prompt, so training (`cascade router train
--features hidden`) or a benchmark that embeds thousands of prompts (MiniLM, a 0.5B model's hidden states) pays once
and resumes where it stopped. Training only writes here; serving never caches a prompt.

Layout: ``ROOT/<namespace>/<sha[:2]>/<sha>.npy``, one float32 vector per prompt. The namespace names what made the
vector (model, its weights' hash, the template, the layers), so a changed featurizer never reads an old vector. Each
file is written to a temporary name and renamed, so a killed run leaves whole files or none; vectors are computed in
batches of `batch` prompts and each batch is saved before the next starts.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np


def default_root() -> Path:
    """$CASCADE_CACHE_DIR/router-features, else ~/.cache/cascade/router-features: beside the embedded models."""
    from cascade.engines.models import cache_root

    return cache_root().parent / "router-features"


# A namespace is a folder name: letters, digits and . _ - + = , only, at most this long (no separators: it cannot
# escape the root).
MAX_NAMESPACE_CHARS = 200
_NAMESPACE = re.compile(r"[A-Za-z0-9._+=,-]+")
MAX_BATCH = 4096


def prompt_key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class FeatureCache:
    """Vectors of one featurizer (``namespace``) under ``root``; `vectors` computes only what is missing."""

    def __init__(self, namespace: str, root: Path | None = None) -> None:
        if (not 0 < len(namespace) <= MAX_NAMESPACE_CHARS or not _NAMESPACE.fullmatch(namespace)
                or namespace.strip(".") == ""):
            raise ValueError(f"a cache namespace is 1 to {MAX_NAMESPACE_CHARS} of [A-Za-z0-9._+=,-] and not only "
                             f"dots, got {namespace[:80]!r}")
        self.folder = (default_root() if root is None else root) / namespace

    def path(self, text: str) -> Path:
        key = prompt_key(text)
        return self.folder / key[:2] / f"{key}.npy"

    def missing(self, texts: Sequence[str]) -> list[str]:
        """The distinct texts without a cached vector, in first-seen order."""
        return [t for t in dict.fromkeys(texts) if not self.path(t).is_file()]

    def vectors(self, texts: Sequence[str], compute: Callable[[list[str]], np.ndarray], batch: int = 32,
                on_batch: Callable[[int, int], None] | None = None) -> np.ndarray:
        """(len(texts), dims) float64: cached vectors, and ``compute(batch_of_texts)`` -> (len, dims) for the rest,
        saved batch by batch. ``on_batch(done, todo)`` reports progress."""
        if not 1 <= batch <= MAX_BATCH:
            raise ValueError(f"batch must be 1..{MAX_BATCH}, got {batch}")
        todo = self.missing(texts)
        for start in range(0, len(todo), batch):
            chunk = todo[start:start + batch]
            computed = np.asarray(compute(chunk), dtype=np.float32)
            if computed.ndim != 2 or len(computed) != len(chunk):
                raise ValueError(f"compute returned shape {computed.shape} for {len(chunk)} texts")
            for text, vector in zip(chunk, computed, strict=True):
                self._save(self.path(text), vector)
            if on_batch is not None:
                on_batch(start + len(chunk), len(todo))
        rows = [np.load(self.path(t)) for t in texts]
        dims = {len(r) for r in rows}
        if len(dims) > 1:
            raise ValueError(f"cached vectors in {self.folder} differ in length: {sorted(dims)}")
        return np.asarray(rows, dtype=float).reshape(len(texts), -1)

    @staticmethod
    def _save(path: Path, vector: np.ndarray) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.stem}.{os.getpid()}.partial.npy")
        np.save(partial, vector)
        partial.replace(path)
