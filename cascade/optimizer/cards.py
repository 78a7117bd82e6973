"""GPU specs (`models/gpu/*.toml`) and GPU model cards (`models/gpu-models/*.toml`).

A model card holds the architecture numbers of a checkpoint's `config.json` (same field names) and
where they come from; a GPU spec holds datasheet peaks. The roofline model reads nothing else. A card
also names the SGLang output parsers that fit the model (`reasoning_parser`, `tool_call_parser`; empty:
none), which the planner writes into the plan and `cascade deploy` passes to `sglang.launch_server`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, TypeVar

import msgspec

from cascade import files
from cascade.engines.sglang_parsers import check_parser
from cascade.errors import ConfigError

MODELS_ROOT = Path(__file__).resolve().parents[2] / "models"
GPU_DIR = MODELS_ROOT / "gpu"
GPU_MODEL_DIR = MODELS_ROOT / "gpu-models"

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8": 1, "int8": 1}

Positive = Annotated[float, msgspec.Meta(gt=0)]
NonNegative = Annotated[float, msgspec.Meta(ge=0)]
Count = Annotated[int, msgspec.Meta(ge=1)]
T = TypeVar("T")


class GpuSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    display_name: str
    memory_gb: Positive
    memory_bandwidth_gb_s: Positive
    bf16_tflops: Positive
    fp8_tflops: NonNegative = 0.0
    # Per GPU, per direction. 0 means no NVLink: tensor parallelism goes over PCIe.
    nvlink_gb_s: NonNegative = 0.0
    pcie_gb_s: Positive = 32.0
    source: str

    @property
    def intra_node_gb_s(self) -> float:
        return self.nvlink_gb_s or self.pcie_gb_s


class ModelCard(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    hf_id: str
    source: str
    architecture: str
    num_hidden_layers: Count
    hidden_size: Count
    num_attention_heads: Count
    num_key_value_heads: Count
    head_dim: Count
    intermediate_size: Count
    vocab_size: Count
    max_position_embeddings: Count
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    params: Positive
    torch_dtype: str = "bfloat16"
    # SGLang's --reasoning-parser (thinking -> `reasoning_content`) and --tool-call-parser (-> `tool_calls`)
    # for this model; "" for none. Checked against the names SGLang accepts (cascade/engines/sglang_parsers.py).
    reasoning_parser: str = ""
    tool_call_parser: str = ""

    def __post_init__(self) -> None:
        check_parser("reasoning_parser", self.reasoning_parser, self.name)
        check_parser("tool_call_parser", self.tool_call_parser, self.name)
        if self.torch_dtype not in _DTYPE_BYTES:
            raise ValueError(f"torch_dtype must be one of {sorted(_DTYPE_BYTES)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")

    @property
    def dtype_bytes(self) -> int:
        return _DTYPE_BYTES[self.torch_dtype]

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        """Weights of one decoder layer: attention (GQA), SwiGLU MLP, two RMSNorms."""
        h = self.hidden_size
        attention = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        if self.attention_bias:
            attention += self.q_dim + 2 * self.kv_dim
        return attention + 3 * h * self.intermediate_size + 2 * h

    @property
    def embedding_params(self) -> int:
        """Input embedding plus LM head (one matrix when tied) plus the final norm."""
        matrices = 1 if self.tie_word_embeddings else 2
        return matrices * self.vocab_size * self.hidden_size + self.hidden_size


def _load(directory: Path, name: str, kind: type[T], what: str) -> T:
    path = directory / f"{name}.toml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in directory.glob("*.toml")))
        raise ConfigError(f"unknown {what} `{name}`; known: {known} (in {directory})")
    return files.load(path, kind, what)


def load_gpu(name: str) -> GpuSpec:
    return _load(GPU_DIR, name, GpuSpec, "GPU spec")


def load_model(name: str) -> ModelCard:
    return _load(GPU_MODEL_DIR, name, ModelCard, "GPU model card")


def served_card(model: str) -> ModelCard | None:
    """The GPU model card of the checkpoint a plan serves: the card whose `hf_id` or `name` is `model`, or
    whose Hugging Face repository name is `model`'s last path component (a local copy of the checkpoint,
    e.g. /models/DeepSeek-R1-Distill-Qwen-7B), ignoring case there; None when no card matches."""
    if not model:
        return None
    cards = [load_model(p.stem) for p in sorted(GPU_MODEL_DIR.glob("*.toml"))]
    exact = [c for c in cards if model in (c.hf_id, c.name)]
    if exact:
        return exact[0]
    tail = model.rstrip("/").rsplit("/", 1)[-1].lower()
    return next((c for c in cards if c.hf_id.rsplit("/", 1)[-1].lower() == tail), None)
