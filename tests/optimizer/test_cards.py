"""GPU specs and GPU model cards: they decode, cite a source, and their numbers agree."""

from __future__ import annotations

import pytest

from cascade.errors import ConfigError
from cascade.optimizer import cards

REQUIRED_MODELS = {
    "deepseek-r1-distill-qwen-1.5b", "deepseek-r1-distill-qwen-7b", "deepseek-r1-distill-qwen-14b",
    "deepseek-r1-distill-qwen-32b", "deepseek-r1-distill-llama-70b", "llama-3.1-8b", "llama-3.1-70b",
}


def all_gpus() -> list[cards.GpuSpec]:
    return [cards.load_gpu(p.stem) for p in sorted(cards.GPU_DIR.glob("*.toml"))]


def all_models() -> list[cards.ModelCard]:
    return [cards.load_model(p.stem) for p in sorted(cards.GPU_MODEL_DIR.glob("*.toml"))]


def test_every_required_model_and_gpu_has_a_card() -> None:
    assert {m.name for m in all_models()} >= REQUIRED_MODELS
    assert {g.name for g in all_gpus()} >= {"a100-80g", "h100-sxm", "h200", "l40s"}


@pytest.mark.parametrize("model", sorted(REQUIRED_MODELS))
def test_architecture_numbers_reproduce_the_published_parameter_count(model: str) -> None:
    card = cards.load_model(model)
    assert card.source.startswith(f"https://huggingface.co/{card.hf_id}/")
    architecture_params = card.num_hidden_layers * card.layer_params + card.embedding_params
    assert architecture_params == pytest.approx(card.params, rel=0.01)


def test_head_geometry_is_consistent() -> None:
    for card in all_models():
        assert card.num_attention_heads % card.num_key_value_heads == 0
        assert card.q_dim == card.hidden_size  # true of every checkpoint listed here


def test_gpu_specs_cite_a_datasheet_and_only_l40s_lacks_nvlink() -> None:
    for gpu in all_gpus():
        assert "datasheet" in gpu.source
        assert (gpu.nvlink_gb_s == 0) == (gpu.name == "l40s")
    assert cards.load_gpu("h200").memory_gb > cards.load_gpu("h100-sxm").memory_gb


def test_unknown_card_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"llama-3\.1-8b"):
        cards.load_model("gpt-5")
    with pytest.raises(ConfigError, match="h100-sxm"):
        cards.load_gpu("tpu-v5")
