"""Step times measured on a GPU for the planner's model shapes, and how far a `ReplicaCost` is from them.

The data is `../shared/data/gpu/<gpu>-steps.json` with `shapes.json` beside it (README there: decode steps at
batch 1..512 x context 512/2048 per sequence, prefills of one prompt of 128..8192 tokens, an unfused decoder with
CUDA-graph decode). What the roofline's default `Efficiency` is fitted to (benchmarks/planner/roofline_calibration.py)
and what tests/optimizer/test_roofline_calibration.py holds the planner's predictions to.

A prefill runs eagerly, one kernel launch at a time from Python: a short prompt of a small model takes as long as
the CPU needs to launch its kernels, whatever the GPU does (SmolLM2-135M: 20 ms at 128 and at 8,192 tokens; the
two 1.5B shapes, identical, 9.9 and 16.4 ms at 128). Such a point says nothing about the GPU: `launch_bound`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from cascade.optimizer.cards import GPU_MODEL_DIR, ModelCard, load_model
from cascade.optimizer.roofline import ReplicaCost

LAUNCH_BOUND = 1.5  # a prefill under this multiple of the shortest prompt's time is bound by kernel launches


class DecodeStep(msgspec.Struct, frozen=True):
    batch: int
    context_per_seq: int
    step_s: float


class Prefill(msgspec.Struct, frozen=True):
    tokens: int
    prefill_s: float


class MeasuredShape(msgspec.Struct, frozen=True):
    decode: list[DecodeStep]
    prefill: list[Prefill]


class MeasuredSteps(msgspec.Struct, frozen=True):
    models: dict[str, MeasuredShape]  # by shape name: a GPU model card's name, or an embedded model's
    device: dict[str, Any] = msgspec.field(default_factory=dict)


def load_steps(path: Path) -> MeasuredSteps:
    return msgspec.json.decode(path.read_bytes(), type=MeasuredSteps)


def has_card(name: str) -> bool:
    """Whether the shape is a GPU model card's (the planner's roofline serves cards only)."""
    return (GPU_MODEL_DIR / f"{name}.toml").is_file()


def shape_card(name: str, architecture: dict[str, Any]) -> ModelCard:
    """The GPU model card `name` when one ships, else a card of `architecture` (a shapes.json entry: the
    architecture numbers only, an untied LM head, as measure_steps.py allocates it)."""
    if has_card(name):
        return load_model(name)
    fields = {f: architecture[f] for f in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                                           "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size",
                                           "attention_bias")}
    card = ModelCard(name=name, hf_id=name, source="shapes.json", architecture="", max_position_embeddings=1,
                     params=1.0, **fields)
    params = card.num_hidden_layers * card.layer_params + card.embedding_params
    return msgspec.structs.replace(card, params=float(params))


def shape_cards(steps: Path) -> dict[str, ModelCard]:
    """A card for every shape of `steps`, from the shapes.json beside it."""
    architectures = msgspec.json.decode((steps.parent / "shapes.json").read_bytes())
    return {name: shape_card(name, architectures[name]) for name in load_steps(steps).models}


def decode_errors(cost: ReplicaCost, measured: MeasuredShape) -> np.ndarray:
    """predicted / measured - 1 at every decode point."""
    return np.array([cost.decode_time(p.batch, p.batch * p.context_per_seq) / p.step_s - 1 for p in measured.decode])


def prefill_errors(cost: ReplicaCost, measured: MeasuredShape) -> np.ndarray:
    """predicted / measured - 1 at every prefill point (one prompt each)."""
    return np.array([cost.prefill_time(p.tokens, float(p.tokens) ** 2, 1) / p.prefill_s - 1 for p in measured.prefill])


def launch_bound(measured: MeasuredShape) -> np.ndarray:
    """Which prefill points the CPU's kernel launches bound: under LAUNCH_BOUND x the shortest prompt's time."""
    floor = min(measured.prefill, key=lambda p: p.tokens).prefill_s
    return np.array([p.prefill_s < LAUNCH_BOUND * floor for p in measured.prefill])
