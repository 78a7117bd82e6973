"""A small ladder model's hidden states over a prompt, prefill only: the features of the hidden-state probe
(benchmarks/router/probe.py; issue 63 item 2, arXiv 2602.09924).

The prompt is sent as the tier sees it: one user message rendered by the model's own chat template the way
`transformers serve` renders it (cascade/engines/prompt_count.py), with the generation prompt, encoded with the
model's tokenizer without added special tokens. One forward pass in float32 on the CPU with one intra-op thread (as
the router's MiniLM runs: cascade/router/embeddings.py), and from it, for each of LAYERS, the states mean-pooled over
the prompt's positions and the state at its last position (the one the answer's first token is predicted from):

    [mean L12 | last L12 | mean L18 | last L18 | mean final | last final]      6 x 896 = 5,376 floats

"final" is the last layer after the model's final norm: what an engine hands the LM head, and what SGLang returns
when asked for hidden states (docs/measured.md, "Router signals beyond the text"). Vectors are cached on disk by
prompt sha256 (cascade/router/feature_cache.py) under a namespace naming the model's weights.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from cascade.router import hidden
from cascade.router.feature_cache import FeatureCache

# The benchmarks' vectors (MiniLM's too: benchmarks/router/signal_features.py), apart from what training caches.
BENCH_CACHE = Path.home() / ".cache" / "cascade-bench" / "router-signals"
MODEL = "qwen2.5-coder-0.5b"  # an embedded model (models/embedded/<MODEL>.toml)
LAYERS = (12, 18, "final")  # 1/2 and 3/4 of Qwen2.5-0.5B's 24 layers, and the last after its final norm
POOLS = ("mean", "last")


def view_columns(hidden_size: int) -> dict[str, np.ndarray]:
    """Each (layer, pool) block's column indices in a vector `states` returns: the probe's candidate views."""
    names = [f"{pool} L{layer}" for layer in LAYERS for pool in POOLS]
    return {name: np.arange(i * hidden_size, (i + 1) * hidden_size) for i, name in enumerate(names)}


class PromptStates:
    """One embedded model loaded for prefill-only feature extraction, as the router's hidden block loads it
    (cascade/router/hidden.py: the same rendering, tokenizer and forward pass; torch imported on first use)."""

    def __init__(self, model_name: str = MODEL) -> None:
        from cascade.engines.models import load_card

        self.model_name, self.weights_sha256 = model_name, load_card(model_name).sha256

    @property
    def namespace(self) -> str:
        layers = ",".join(str(layer) for layer in LAYERS)
        return f"{self.model_name}-{self.weights_sha256[:16]}-chat-L{layers}-mean+last"

    def cache(self, root: Path | None = None) -> FeatureCache:
        return FeatureCache(self.namespace, BENCH_CACHE if root is None else root)

    def token_ids(self, prompt: str) -> list[int]:
        return hidden.token_ids(hidden.loaded(self.model_name)[1], prompt)

    def states(self, prompts: list[str]) -> np.ndarray:
        """(len(prompts), len(LAYERS) * 2 * hidden) float32, one forward pass per prompt."""
        return np.stack([self._one(self.token_ids(p)) for p in prompts])

    def timed(self, prompt: str, repeats: int = 3) -> dict[str, Any]:
        """What the features of one prompt cost: tokens, and the median process CPU and wall seconds of `repeats`
        forward passes (tokenizing included; the model already loaded)."""
        cpu, wall = [], []
        for _ in range(repeats):
            start_cpu, start_wall = time.process_time(), time.perf_counter()
            ids = self.token_ids(prompt)
            self._one(ids)
            cpu.append(time.process_time() - start_cpu)
            wall.append(time.perf_counter() - start_wall)
        return {"prompt_chars": len(prompt), "prompt_tokens": len(ids), "repeats": repeats,
                "cpu_s": round(float(np.median(cpu)), 4), "wall_s": round(float(np.median(wall)), 4)}

    def _one(self, ids: list[int]) -> np.ndarray:
        import torch

        out = hidden.forward(hidden.loaded(self.model_name)[0], ids)
        blocks = []
        for layer in LAYERS:
            h = (out.last_hidden_state if layer == "final" else out.hidden_states[int(layer)])[0]
            blocks += [h.mean(dim=0), h[-1]]
        return torch.cat(blocks).float().numpy()
