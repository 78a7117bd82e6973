"""Roofline step costs behave the way the hardware does."""

from __future__ import annotations

import pytest

from cascade.optimizer.cards import load_gpu, load_model
from cascade.optimizer.roofline import RooflineCost, Shape, valid_shape

H100 = load_gpu("h100-sxm")


def cost(model: str, shape: Shape, gpu: str = "h100-sxm") -> RooflineCost:
    return RooflineCost(load_model(model), load_gpu(gpu), shape)


def test_single_stream_decode_is_memory_bound_at_the_weights_read_time() -> None:
    c = cost("llama-3.1-8b", Shape(1))
    weights_read = c.model.params * 2 / (H100.memory_bandwidth_gb_s * 1e9 * c.eff.memory)
    assert weights_read < c.decode_time(1, 500) < weights_read * 1.5


def test_tensor_parallelism_speeds_up_decoding_and_pipeline_parallelism_does_not() -> None:
    tp1, tp4 = cost("deepseek-r1-distill-qwen-32b", Shape(1)), cost("deepseek-r1-distill-qwen-32b", Shape(4))
    pp4 = cost("deepseek-r1-distill-qwen-32b", Shape(1, 4))
    assert tp4.decode_time(1, 1000) < 0.5 * tp1.decode_time(1, 1000)
    assert pp4.decode_time(1, 1000) >= tp1.decode_time(1, 1000)


def test_more_gpus_per_replica_leave_more_room_for_the_kv_cache() -> None:
    sizes = [cost("deepseek-r1-distill-llama-70b", Shape(tp)).kv_capacity_tokens for tp in (2, 4, 8)]
    assert sizes[0] < sizes[1] < sizes[2]


def test_a_70b_model_needs_more_than_two_80gb_gpus() -> None:
    assert not cost("llama-3.1-70b", Shape(1)).fits(1)
    assert not cost("llama-3.1-70b", Shape(2)).fits(4096)
    assert cost("llama-3.1-70b", Shape(4)).fits(100_000)


def test_batching_amortizes_the_weights_read() -> None:
    c = cost("deepseek-r1-distill-qwen-7b", Shape(1))
    per_token_alone = c.decode_time(1, 1000)
    per_token_batched = c.decode_time(64, 64 * 1000) / 64
    assert per_token_batched < per_token_alone / 10


def test_prefill_of_a_long_prompt_is_compute_bound() -> None:
    c = cost("llama-3.1-8b", Shape(1))
    flops = 2 * c.model.params * 8192
    assert c.prefill_time(8192, 8192**2) == pytest.approx(flops / c.flops, rel=0.3)


def test_decode_time_is_the_max_of_two_affine_pieces_in_the_context() -> None:
    c = cost("deepseek-r1-distill-qwen-14b", Shape(2, 2))
    a1, b1, a2, b2, g = c.decode_coeffs(48)
    for context in (0, 10_000, 1_000_000):
        assert c.decode_time(48, context) == pytest.approx(max(a1 + b1 * context, a2 + b2 * context) + g)


@pytest.mark.parametrize(("model", "tp", "ok"), [
    ("deepseek-r1-distill-qwen-7b", 4, True),   # 28 heads, 4 KV heads
    ("deepseek-r1-distill-qwen-7b", 8, False),  # 28 heads do not split 8 ways
    ("deepseek-r1-distill-qwen-1.5b", 4, True),  # 2 KV heads replicated twice
    ("llama-3.1-70b", 8, True),
    ("llama-3.1-70b", 16, False),  # TP stays inside an 8-GPU node
])
def test_tensor_parallel_degree_must_split_heads_and_stay_in_a_node(model: str, tp: int, ok: bool) -> None:
    assert valid_shape(load_model(model), Shape(tp), gpus_per_node=8) is ok
