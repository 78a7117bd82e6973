"""Measured GPU step times turned into cascade profiles (cascade/optimizer/profile.py), one per model shape: what the
GPU emulator (cascade/testing/fakes/gpu.py) runs on and what `cascade optimize plan` can plan with.

Input: `h200-steps.json` of ../shared/data/gpu/ (README there: decode step_s at batch 1..512 x context 512/2048
per sequence, prefill of one prompt of 128..8192 tokens, per shape) and `shapes.json` (each shape's architecture).

* decode: least squares of `step_s` on (1, B, B x context_per_seq), the profile's
  `fixed_s + per_sequence_s * B + per_context_token_s * C` with C the batch's context tokens in total;
* prefill: `fit_line` (the profiler's) of `prefill_s` on the prompt's tokens, fixed + per token;
* KV capacity in tokens as SGLang sizes it on that GPU (`kv_capacity_tokens`: GPU memory x mem_fraction_static
  less the weights, over the bytes one token's K and V take in every layer).

    python -m cascade.testing.fakes.gpu_profiles --steps ../shared/data/gpu/h200-steps.json \\
        --shapes ../shared/data/gpu/shapes.json --gpu h200 --out models/gpu/profiles/h200
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from cascade.errors import CascadeError
from cascade.optimizer.cards import GPU_MODEL_DIR, load_gpu, load_model
from cascade.optimizer.measured_steps import shape_card
from cascade.optimizer.profile import (
    DecodeModel,
    DecodePoint,
    PrefillModel,
    PrefillPoint,
    Profile,
    fit_line,
    write_profile,
)

# SGLang 0.5.23 (sglang/srt/arg_groups/memory_hook.py, _handle_gpu_memory_settings) on a 90-160 GiB GPU at tp = pp = 1:
# chunked_prefill_size 8192 and decode CUDA graphs up to batch 256, whose reserve is
# 512 MB + 1.5 MB x activation tokens + tp x pp / 8 x 1024 MB + 2 MB x graph max batch, at least 10 GiB on a GPU
# over 60 GiB; mem_fraction_static = round((memory - reserve) / memory, 3), and the KV pool is what that fraction
# leaves after the weights (mem_cache/kv_cache_configurator.py: free memory less memory x (1 - fraction)).
CHUNKED_PREFILL_TOKENS = 8192
GRAPH_MAX_BATCH = 256


class ShapeFit(msgspec.Struct, frozen=True):
    """One shape's profile and how well the decode model fits its measured points."""

    profile: Profile
    max_decode_error: float  # largest |fit - measured| / measured over the decode points


def mem_fraction_static(memory_mib: float, tp: int = 1, pp: int = 1) -> float:
    reserved = 512 + 1.5 * max(CHUNKED_PREFILL_TOKENS, 2048) + tp * pp / 8 * 1024 + 2 * GRAPH_MAX_BATCH
    if memory_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((memory_mib - reserved) / memory_mib, 3)


def kv_capacity_tokens(shape: dict[str, Any], weight_bytes: float, memory_bytes: float, dtype_bytes: int = 2) -> int:
    """SGLang's max_total_num_tokens for one replica (tp = pp = 1) of `shape` on a GPU of `memory_bytes`."""
    cell = shape["num_hidden_layers"] * shape["num_key_value_heads"] * shape["head_dim"] * 2 * dtype_bytes
    pool = memory_bytes * mem_fraction_static(memory_bytes / 2**20) - weight_bytes
    if pool <= 0:
        raise ValueError(f"the weights ({weight_bytes / 1e9:.1f} GB) leave no KV cache on a {memory_bytes / 1e9:.0f} "
                         "GB GPU")
    return int(pool // cell)


def weight_params(name: str, shape: dict[str, Any]) -> float:
    """The checkpoint's parameter count from its GPU model card when there is one, else from the shape (an untied
    LM head, as measure_steps.py allocates it)."""
    return shape_card(name, shape).params


def fit_shape(name: str, measured: dict[str, Any], shape: dict[str, Any], memory_bytes: float, label: str) -> ShapeFit:
    decode = measured["decode"]
    batch = np.array([p["batch"] for p in decode], dtype=float)
    context = np.array([p["context_per_seq"] for p in decode], dtype=float)
    step = np.array([p["step_s"] for p in decode], dtype=float)
    design = np.column_stack([np.ones_like(batch), batch, batch * context])
    fixed, per_sequence, per_context = (float(c) for c in np.linalg.lstsq(design, step, rcond=None)[0])
    if min(fixed, per_sequence, per_context) < 0:
        raise ValueError(f"{name}: a negative decode coefficient ({fixed:.3g}, {per_sequence:.3g}, {per_context:.3g}); "
                         "the measured points do not follow the profile's decode model")
    error = float(np.max(np.abs(design @ np.array([fixed, per_sequence, per_context]) - step) / step))
    prefill = measured["prefill"]
    prefill_fixed, per_token = fit_line([p["tokens"] for p in prefill], [p["prefill_s"] for p in prefill])
    weights = weight_params(name, shape) * 2  # bf16, as measured
    profile = Profile(
        model=load_model(name).hf_id if (GPU_MODEL_DIR / f"{name}.toml").is_file() else name,
        label=label, kv_capacity_tokens=kv_capacity_tokens(shape, weights, memory_bytes),
        prefill=PrefillModel(fixed_s=prefill_fixed, per_token_s=per_token),
        decode=DecodeModel(fixed_s=fixed, per_sequence_s=per_sequence, per_context_token_s=per_context),
        prefill_points=[PrefillPoint(prompt_tokens=p["tokens"], ttft_s=p["prefill_s"]) for p in prefill],
        decode_points=[DecodePoint(batch=p["batch"], step_s=p["step_s"], context_tokens=float(p["context_per_seq"]))
                       for p in decode])
    return ShapeFit(profile=profile, max_decode_error=error)


def convert(steps: Path, shapes: Path, gpu: str = "h200") -> dict[str, ShapeFit]:
    """Every shape of `steps` fitted, by name (`shapes` holds each shape's architecture)."""
    data, architectures = json.loads(steps.read_text()), json.loads(shapes.read_text())
    spec = load_gpu(gpu)
    device = data.get("device", {})
    label = (f"{device.get('name', spec.display_name)} measured step times ({steps.name}: measure_steps.py, unfused "
             f"decoder, CUDA-graph decode, torch {device.get('torch', '?')})")
    return {name: fit_shape(name, measured, architectures[name], spec.memory_gb * 1e9, label)
            for name, measured in data["models"].items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cascade.testing.fakes.gpu_profiles", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", required=True, type=Path, help="h200-steps.json (measured step times)")
    parser.add_argument("--shapes", type=Path, help="shapes.json (default: beside --steps)")
    parser.add_argument("--gpu", default="h200", help="GPU spec of models/gpu/ whose memory sizes the KV cache")
    parser.add_argument("--out", required=True, type=Path, help="folder for one SHAPE.json profile per shape")
    args = parser.parse_args(argv)
    try:
        fits = convert(args.steps, args.shapes or args.steps.with_name("shapes.json"), args.gpu)
    except (OSError, ValueError, KeyError, CascadeError) as exc:
        print(f"gpu_profiles: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    summary = {}
    for name, fit in fits.items():
        write_profile(args.out / f"{name}.json", fit.profile)
        d, p = fit.profile.decode, fit.profile.prefill
        summary[name] = {"fixed_ms": round(d.fixed_s * 1e3, 2), "per_sequence_us": round(d.per_sequence_s * 1e6, 1),
                         "per_context_token_ns": round(d.per_context_token_s * 1e9, 1),
                         "prefill_ms": round(p.fixed_s * 1e3, 1), "prefill_us_per_token": round(p.per_token_s * 1e6, 1),
                         "max_decode_error": round(fit.max_decode_error, 3),
                         "kv_capacity_tokens": fit.profile.kv_capacity_tokens}
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
