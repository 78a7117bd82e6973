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
prompt sha256 (benchmarks/router/feature_cache.py) under a namespace naming the model's weights.
"""

from __future__ import annotations

import json
import time
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.router.feature_cache import FeatureCache

MODEL_DIR = Path.home() / ".cache" / "cascade" / "models" / "qwen2.5-coder-0.5b"
LAYERS = (12, 18, "final")  # 1/2 and 3/4 of Qwen2.5-0.5B's 24 layers, and the last after its final norm
POOLS = ("mean", "last")


def view_columns(hidden_size: int) -> dict[str, np.ndarray]:
    """Each (layer, pool) block's column indices in a vector `states` returns: the probe's candidate views."""
    names = [f"{pool} L{layer}" for layer in LAYERS for pool in POOLS]
    return {name: np.arange(i * hidden_size, (i + 1) * hidden_size) for i, name in enumerate(names)}


class PromptStates:
    """One model loaded for prefill-only feature extraction (torch and transformers imported on first use)."""

    def __init__(self, model_dir: Path = MODEL_DIR) -> None:
        self.model_dir = model_dir
        ready = json.loads((model_dir / "cascade-ready.json").read_text())
        self.model_name, self.weights_sha256 = str(ready["name"]), str(ready["sha256"])

    @property
    def namespace(self) -> str:
        layers = ",".join(str(layer) for layer in LAYERS)
        return f"{self.model_name}-{self.weights_sha256[:16]}-chat-L{layers}-mean+last"

    def cache(self, root: Path | None = None) -> FeatureCache:
        return FeatureCache(self.namespace, root)

    def token_ids(self, prompt: str) -> list[int]:
        from cascade.schemas import ChatMessage

        counter = _counter(self.model_dir)
        text = counter.render([ChatMessage(role="user", content=prompt)])
        if text is None:
            raise ValueError("the chat template did not render this prompt")
        return list(counter.tokenizer.encode_batch([text], add_special_tokens=False)[0].ids)

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

        model = _model(self.model_dir)
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
        hidden = out.hidden_states
        if len(hidden) != model.config.num_hidden_layers + 1:
            raise RuntimeError(f"expected {model.config.num_hidden_layers + 1} hidden states, got {len(hidden)}")
        blocks = []
        for layer in LAYERS:
            h = (out.last_hidden_state if layer == "final" else hidden[int(layer)])[0]
            blocks += [h.mean(dim=0), h[-1]]
        return torch.cat(blocks).float().numpy()


@cache
def _counter(model_dir: Path) -> Any:
    from cascade.engines.prompt_count import TemplateCounter

    return TemplateCounter.load(model_dir)


@cache
def _model(model_dir: Path) -> Any:
    import torch
    from transformers import AutoModel

    # One prompt at a time on a shared 2-core box: intra-op threads only contend (cascade/router/embeddings.py).
    torch.set_num_threads(1)
    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    return model
