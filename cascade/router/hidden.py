"""The ``hidden`` feature block: an embedded ladder model's own state over the prompt, before it answers
(`cascade router train --features hidden`; issue 63 item 2, arXiv 2602.09924). Opt-in: off by default.

The prompt is sent as the tier sees it: one user message rendered by the model's own chat template the way
`transformers serve` renders it (cascade/engines/prompt_count.py), with the generation prompt, encoded with the
model's tokenizer without added special tokens. One forward pass in float32 on the CPU with one intra-op thread (as
MiniLM runs: cascade/router/embeddings.py); the feature is the state at the prompt's last position (the one the
answer's first token is predicted from) after one layer. The view was chosen by the probe's nested cross-validation
(benchmarks/router/signals.py): the last token of layer 18 of Qwen2.5-Coder-0.5B's 24 was ahead of the text router
in all 5 fold assignments of the embedded ladder; the final layer's state, what SGLang returns when asked for hidden
states, added nothing there (docs/measured.md, "Router signals beyond the text").

Cost, on a 2-core AVX2 CPU (process CPU, one thread): 1.78 s for a GSM8K question, 30.7 s at `max_prompt_chars`
(8,192 characters): a router with this block is for a machine with CPU to spare or for measurement. Out of fold it
moved APGR by +0.023 (-0.002..+0.044) on the embedded ladder, an interval that does not exclude zero.
"""

from __future__ import annotations

from functools import cache
from typing import Any, NamedTuple

import numpy as np

from cascade.errors import ConfigError
from cascade.router.feature_cache import FeatureCache


class HiddenView(NamedTuple):
    model: str  # an embedded model (models/embedded/<model>.toml)
    layer: int  # hidden_states[layer]: the output of that many decoder layers
    dims: int


HIDDEN_STATES = {"qwen2.5-coder-0.5b-last-l18": HiddenView(model="qwen2.5-coder-0.5b", layer=18, dims=896)}


def hidden_available(name: str) -> bool:
    """Whether the wheel holding the view's model is installed (the model may still need its one-time conversion)."""
    from cascade.engines.models import load_card, part_paths

    try:
        part_paths(load_card(HIDDEN_STATES[name].model))
    except ConfigError:
        return False
    return True


def namespace(name: str) -> str:
    """The feature cache's folder for this view: names the model's weights, so other weights never read it."""
    from cascade.engines.models import load_card

    view = HIDDEN_STATES[name]
    return f"{name}-{load_card(view.model).sha256[:16]}-chat"


def prompt_states(name: str, prompts: list[str], cache: FeatureCache | None = None) -> np.ndarray:
    """(len(prompts), dims) float64: the view's state for each prompt. ``cache`` (training only) keeps each
    prompt's vector on disk by its sha256, so a second training run computes none."""
    if name not in HIDDEN_STATES:
        raise ConfigError(f"unknown hidden-state view {name!r}; known: {', '.join(HIDDEN_STATES)}")
    if cache is not None:
        return cache.vectors(prompts, lambda batch: _compute(name, batch), batch=16)
    return _compute(name, prompts)


def _compute(name: str, prompts: list[str]) -> np.ndarray:
    view = HIDDEN_STATES[name]
    model, counter = loaded(view.model)
    return np.stack([_one(model, counter, view, p) for p in prompts]) if prompts else np.zeros((0, view.dims))


def _one(model: Any, counter: Any, view: HiddenView, prompt: str) -> np.ndarray:
    out = forward(model, token_ids(counter, prompt))
    return np.asarray(out.hidden_states[view.layer][0, -1].float().numpy(), dtype=float)


def token_ids(counter: Any, prompt: str) -> list[int]:
    """The prompt as the tier sees it (module docstring), as token ids of ``counter``'s tokenizer."""
    from cascade.schemas import ChatMessage

    text = counter.render([ChatMessage(role="user", content=prompt)])
    if text is None:
        raise ValueError("the chat template did not render this prompt")
    return list(counter.tokenizer.encode_batch([text], add_special_tokens=False)[0].ids)


def forward(model: Any, ids: list[int]) -> Any:
    """One prefill of ``ids`` with every layer's hidden states (``hidden_states[i]``: after i layers)."""
    import torch

    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    if len(out.hidden_states) != model.config.num_hidden_layers + 1:
        raise RuntimeError(f"expected {model.config.num_hidden_layers + 1} hidden states, got {len(out.hidden_states)}")
    return out


@cache
def loaded(model_name: str) -> tuple[Any, Any]:
    """The model (float32, eval) and its template counter, prepared from its wheel on first use."""
    from cascade.engines.models import load_card, prepare
    from cascade.engines.prompt_count import TemplateCounter

    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise ConfigError("the hidden feature block needs torch and transformers: pip install -e '.[embedded]'"
                          ) from None
    folder = prepare(load_card(model_name))
    # One prompt at a time on a shared CPU: intra-op threads only contend (cascade/router/embeddings.py).
    torch.set_num_threads(1)
    # The causal LM as saved (loading the bare decoder from it warns of an unused head), run without its head.
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).model
    model.eval()
    return model, TemplateCounter.load(folder)
