"""Roofline step costs of one serving replica: a model card on `tp x pp` GPUs of one type.

Every engine iteration is either a prefill (new prompts) or a decode step (every running sequence
gains one token), as in SGLang without mixed chunks. A stage runs its kernels one after another:
the weight GEMMs, whose FLOPs and weight reads overlap only in part (their time is the 2-norm of the
two, a smooth roofline: within 41% of the larger), then attention, bound by the larger of its FLOPs
and its KV traffic, plus a fixed cost per layer, tensor-parallel all-reduces (two per layer, ring
algorithm) and pipeline hand-offs. Pipeline parallelism runs `pp` micro-batches in flight, so one
decode step costs `pp` stage times of a `B/pp` micro-batch: PP adds memory (weights and KV cache)
but not per-token speed, which matches practice.

For a fixed batch size B a decode step is `max(a1 + b1*C, a2 + b2*C) + g`, C being the total
context tokens of the batch (attention compute-bound vs memory-bound), which lets the simulator sum
many steps in closed form. The numbers are estimates (`Efficiency` holds the assumed fractions of
peak, fitted to measured H200 steps); a tier with a measured profile (`cascade profile`,
cascade/optimizer/profile.py, or one shipped in models/gpu/profiles/) uses `ProfileCost` instead,
through the same `ReplicaCost` interface.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Protocol

import msgspec

from cascade.optimizer.cards import GpuSpec, ModelCard

Fraction = Annotated[float, msgspec.Meta(gt=0, le=1)]
Seconds = Annotated[float, msgspec.Meta(ge=0)]


class Efficiency(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Achieved fractions of datasheet peaks, and fixed costs.

    `compute`, `memory`, `attention_memory` and `layer_overhead_s` are fitted to the steps measured on one H200
    (../shared/data/gpu/h200-steps.json: an unfused decoder, CUDA-graph decode) of the 5 shapes with a GPU model card,
    1.5B-32B: 93 decode steps at batch 1-512 x context 512/2048 and 12 prefills of 512-8,192 tokens, every one
    predicted within 12% (`python -m benchmarks.planner.roofline_calibration`, which writes
    benchmarks/results/roofline_calibration.json; tests/optimizer/test_roofline_calibration.py holds them). SGLang's
    fused kernels should step at most that slow. The other fields are assumptions (no TP, PP or scheduler there).
    """

    compute: Fraction = 0.54  # GEMMs and attention FLOPs: of peak dense bf16
    memory: Fraction = 0.76  # streaming the weights: of HBM bandwidth
    attention_memory: Fraction = 0.61  # reading (decode) and writing (prefill) the KV cache: of HBM bandwidth
    link: Fraction = 0.8  # NVLink/PCIe/IB achievable fraction (assumed)
    step_overhead_s: Seconds = 0.001  # per engine iteration: scheduler + sampling (assumed)
    layer_overhead_s: Seconds = 71e-6  # per layer: ~20 kernels that move little data, a few us each
    allreduce_latency_s: Seconds = 20e-6  # per all-reduce, independent of size (assumed)
    p2p_latency_s: Seconds = 15e-6  # per pipeline hand-off (assumed)
    mem_fraction_static: Fraction = 0.88  # SGLang's share of GPU memory for weights + KV cache


@dataclass(frozen=True, order=True)
class Shape:
    """One replica's parallelism: tensor-parallel degree x pipeline-parallel degree."""

    tp: int
    pp: int = 1

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    def __str__(self) -> str:
        return f"TP{self.tp}" + (f"xPP{self.pp}" if self.pp > 1 else "")


class StepCost(Protocol):
    """What the simulator needs from a replica (roofline estimate or measured profile)."""

    def decode_coeffs(self, batch: int) -> tuple[float, float, float, float, float]:
        """(a1, b1, a2, b2, g): one decode step takes max(a1 + b1*C, a2 + b2*C) + g seconds."""
        ...

    def prefill_time(self, tokens: int, tokens_sq: float, requests: int) -> float:
        """Seconds to prefill `requests` prompts of `tokens` in total (sum of squares `tokens_sq`)."""
        ...


def valid_shape(model: ModelCard, shape: Shape, gpus_per_node: int) -> bool:
    """TP must split the attention heads evenly and stay inside a node; KV heads are split or
    replicated (SGLang needs one to divide the other); PP cannot exceed the layer count."""
    tp, kv = shape.tp, model.num_key_value_heads
    if tp > gpus_per_node or model.num_attention_heads % tp:
        return False
    if (kv % tp) and (tp % kv):
        return False
    return 1 <= shape.pp <= model.num_hidden_layers


class ReplicaCost(abc.ABC):
    """One replica shape as the planner sees it, whatever the source of its numbers (this roofline,
    or a measured profile). Subclasses set `shape` and give the three abstract members; the rest
    derives from them."""

    shape: Shape

    @property
    @abc.abstractmethod
    def kv_capacity_tokens(self) -> int: ...

    @abc.abstractmethod
    def decode_coeffs(self, batch: int) -> tuple[float, float, float, float, float]: ...

    @abc.abstractmethod
    def prefill_time(self, tokens: int, tokens_sq: float, requests: int = 1) -> float: ...

    def fits(self, min_kv_tokens: int) -> bool:
        return self.kv_capacity_tokens >= min_kv_tokens

    def decode_time(self, batch: int, context_tokens: float) -> float:
        a1, b1, a2, b2, g = self.decode_coeffs(batch)
        return max(a1 + b1 * context_tokens, a2 + b2 * context_tokens) + g

    def capacity_rps(self, mean_input: float, mean_output: float, max_batch: int, max_prefill_tokens: int) -> float:
        """Requests/s the replica sustains at full batch on this mix (the simulator's rate scale)."""
        per_request_kv = mean_input + mean_output
        batch = min(max_batch, int(self.kv_capacity_tokens // per_request_kv))
        if batch < 1:
            return 0.0
        step = self.decode_time(batch, batch * (mean_input + mean_output / 2))
        chunk = max(1, min(batch, int(max_prefill_tokens // max(mean_input, 1.0))))
        prefill = self.prefill_time(int(chunk * mean_input), chunk * mean_input**2, chunk) / chunk
        return 1.0 / (mean_output * step / batch + prefill)


class RooflineCost(ReplicaCost):
    def __init__(self, model: ModelCard, gpu: GpuSpec, shape: Shape, *, gpus_per_node: int = 8,
                 internode_gb_s: float = 25.0, efficiency: Efficiency | None = None) -> None:
        self.model, self.gpu, self.shape = model, gpu, shape
        self.eff = efficiency or Efficiency()
        self.flops = gpu.bf16_tflops * 1e12 * self.eff.compute
        self.bandwidth = gpu.memory_bandwidth_gb_s * 1e9 * self.eff.memory
        self.kv_bandwidth = gpu.memory_bandwidth_gb_s * 1e9 * self.eff.attention_memory
        self.tp_link = gpu.intra_node_gb_s * 1e9 * self.eff.link
        # Stages of one replica leave the node once the replica needs more GPUs than a node has.
        pp_gb_s = gpu.intra_node_gb_s if shape.gpus <= gpus_per_node else internode_gb_s
        self.pp_link = pp_gb_s * 1e9 * self.eff.link
        self.layers = math.ceil(model.num_hidden_layers / shape.pp)
        self._coeffs: dict[int, tuple[float, float, float, float, float]] = {}

    # ---- memory -------------------------------------------------------------------------------

    @cached_property
    def weight_bytes_per_gpu(self) -> float:
        """Weights on the fullest GPU: its stage's layers plus one embedding matrix (both if pp=1)."""
        m = self.model
        embed = m.embedding_params if self.shape.pp == 1 else m.vocab_size * m.hidden_size
        return (self.layers * m.layer_params + embed) * m.dtype_bytes / self.shape.tp

    @cached_property
    def kv_bytes_per_token(self) -> float:
        """K and V of one token on one GPU; KV heads are replicated when tp exceeds their count."""
        m = self.model
        heads = math.ceil(m.num_key_value_heads / self.shape.tp)
        return 2 * heads * m.head_dim * m.dtype_bytes * self.layers

    @cached_property
    def kv_capacity_tokens(self) -> int:
        usable = self.gpu.memory_gb * 1e9 * self.eff.mem_fraction_static - self.weight_bytes_per_gpu
        return max(0, int(usable // self.kv_bytes_per_token))

    # ---- time ---------------------------------------------------------------------------------

    @cached_property
    def _read_params_per_gpu(self) -> float:
        """Parameters a forward pass streams per GPU per stage: layers + LM head (embedding
        lookups read a few rows only). Stages are balanced, so the head is spread over them."""
        m = self.model
        return (m.num_hidden_layers * m.layer_params + m.vocab_size * m.hidden_size) / self.shape.gpus

    def _tp_comm(self, tokens: float) -> float:
        tp = self.shape.tp
        if tp == 1:
            return 0.0
        message = tokens * self.model.hidden_size * self.model.dtype_bytes
        per_allreduce = self.eff.allreduce_latency_s + 2 * (tp - 1) / tp * message / self.tp_link
        return 2 * self.layers * per_allreduce

    def _p2p(self, tokens: float) -> float:
        if self.shape.pp == 1:
            return 0.0
        message = tokens * self.model.hidden_size * self.model.dtype_bytes
        return self.eff.p2p_latency_s + message / self.pp_link

    def decode_coeffs(self, batch: int) -> tuple[float, float, float, float, float]:
        coeffs = self._coeffs.get(batch)
        if coeffs is None:
            coeffs = self._coeffs[batch] = self._decode_coeffs(batch)
        return coeffs

    def _gemms(self, tokens: float) -> float:
        """The weight GEMMs of one stage for `tokens` rows: FLOPs and weight reads, partly overlapped."""
        compute = 2 * tokens * self._read_params_per_gpu / self.flops
        memory = self._read_params_per_gpu * self.model.dtype_bytes / self.bandwidth
        return math.hypot(compute, memory)

    def _decode_coeffs(self, batch: int) -> tuple[float, float, float, float, float]:
        m, tp, pp = self.model, self.shape.tp, self.shape.pp
        micro = math.ceil(batch / pp)  # sequences per micro-batch
        share = micro / batch  # a micro-batch's share of the batch's context tokens
        gemms = self._gemms(micro)
        b1 = 4 * share * m.q_dim * self.layers / tp / self.flops
        b2 = share * self.kv_bytes_per_token / self.kv_bandwidth
        g_stage = self._tp_comm(micro) + self.layers * self.eff.layer_overhead_s + self._p2p(micro)
        return pp * gemms, pp * b1, pp * gemms, pp * b2, pp * g_stage + self.eff.step_overhead_s

    def prefill_time(self, tokens: int, tokens_sq: float, requests: int = 1) -> float:
        m, tp, pp = self.model, self.shape.tp, self.shape.pp
        attention = max(2 * tokens_sq * m.q_dim * self.layers / tp / self.flops,
                        tokens * self.kv_bytes_per_token / self.kv_bandwidth)
        stage = self._gemms(tokens) + attention + self._tp_comm(tokens) + self.layers * self.eff.layer_overhead_s
        return pp * stage + (pp - 1) * self._p2p(tokens) + self.eff.step_overhead_s
