"""What each router signal costs per request (benchmarks/router/signals.py): process CPU seconds, one thread, the
garbage collector on, at a typical GSM8K prompt (the median-length question of the embedded ladder's outcomes) and
at `max_prompt_chars` (the most of a prompt any router reads: that question repeated to 8,192 characters)."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from benchmarks.router.hidden_states import PromptStates
from cascade.config.routing import RoutingConfig
from cascade.router.artifact import load_router, read_card
from cascade.router.embeddings import TOPIC_EMBEDDINGS, embed, forget_embeddings
from cascade.router.knn import neighbours, unit_rows
from cascade.router.outcomes import load_outcomes

ROUTER = "models/routers/embedded-gsm8k"
KNN_ROWS = 384  # the embedded ladder's labelled questions: what a kNN router would search


def cpu_seconds(call: Callable[[], Any], repeats: int) -> float:
    """Median process CPU seconds of ``call`` over ``repeats`` runs (the first run, which may load a model, is not
    counted)."""
    call()
    spent = []
    for _ in range(repeats):
        start = time.process_time()
        call()
        spent.append(time.process_time() - start)
    return round(float(np.median(spent)), 5)


def prompts_to_time() -> dict[str, str]:
    card = read_card(ROUTER)
    outcomes = load_outcomes(card.data.path, card.tiers)
    lengths = np.array([len(p) for p in outcomes.prompts])
    typical = outcomes.prompts[int(np.argsort(lengths)[len(lengths) // 2])]
    limit = RoutingConfig().max_prompt_chars
    return {"typical": typical, "max": (typical + " ") * (limit // (len(typical) + 1)) + typical[:limit % (
        len(typical) + 1)]}


def costs(states: PromptStates) -> dict[str, Any]:
    model, _ = load_router(ROUTER)
    reference = unit_rows(np.random.default_rng(0).standard_normal((KNN_ROWS, 384)))

    def knn(prompt: str) -> None:
        forget_embeddings()  # each request embeds its own prompt
        neighbours(embed(TOPIC_EMBEDDINGS, [prompt]), reference, 80)

    result: dict[str, Any] = {"threads": 1, "unit": "process CPU seconds per request (median)"}
    for size, prompt in prompts_to_time().items():
        hidden = states.timed(prompt, repeats=3 if size == "typical" else 1)
        result[size] = {"prompt_chars": len(prompt), "prompt_tokens": hidden["prompt_tokens"],
                        "text": cpu_seconds(partial(model.predict_p_fail, [prompt]), 20),
                        "knn": cpu_seconds(partial(knn, prompt), 10),
                        "hidden": hidden["cpu_s"], "hidden_wall_s": hidden["wall_s"]}
    return result
