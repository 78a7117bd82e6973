"""A ladder on emulated GPUs that answer what its real models answered (issue 62 items 1-2): the digital twin's
engines. Each tier gets one GpuSGLang engine (cascade/testing/fakes/gpu.py) timed by its model's measured profile and
replaying that tier's recorded answers (cascade/testing/fakes/recorded.py); the tier's backends become that engine.

`V8_TWIN` is the embedded ladder of examples/embedded-1.5b-ladder.toml as models/outcomes/gsm8k-train-embedded-v8.jsonl
recorded it on H200 profiles: the direct tiers' answers, and the reasoning tier's sampled branches (rows 1-100 from
qwen15-train-bench/sc-t07, the live rows from the label run's derived branches, qwen15-train-label/README.md; five
live rows have only their per-question outcome).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import msgspec

from cascade.config import CascadeConfig, SGLangBackendConfig
from cascade.data.datasets import prompts_of
from cascade.data.outcomes import TierOutcome
from cascade.optimizer.profile import load_profile
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.gpu import GpuSGLang
from cascade.testing.fakes.recorded import load_recorded

ROOT = Path(__file__).resolve().parents[2]  # the repo (the twin's inputs are committed files, read from a checkout)
EMBEDDED_LADDER = ROOT / "examples" / "embedded-1.5b-ladder.toml"
H200 = ROOT / "models" / "gpu" / "profiles" / "h200"
_OUTCOMES = ROOT / "models" / "outcomes"
V8 = _OUTCOMES / "gsm8k-train-embedded-v8.jsonl"
SAMPLED_BRANCHES = _OUTCOMES / "qwen15-train-bench" / "sc-t07" / "branches.jsonl"  # v8 rows 1-100: 8 branches each
DERIVED_BRANCHES = _OUTCOMES / "qwen15-train-label" / "reason-adaptive-branch-outcomes.jsonl"  # v8's live rows


class TwinTier(msgspec.Struct, frozen=True, kw_only=True):
    """One tier's engine: its profile (a file under the profiles folder, by model name) and its records (outcome
    files, a later file's row replacing an earlier one's)."""

    tier: str
    profile: str
    records: tuple[Path, ...]


V8_TWIN = (
    TwinTier(tier="smollm2-135m", profile="smollm2-135m", records=(V8,)),
    TwinTier(tier="qwen2.5-coder-0.5b", profile="qwen2.5-coder-0.5b", records=(V8,)),
    TwinTier(tier="qwen2.5-coder-1.5b", profile="qwen2.5-coder-1.5b", records=(V8,)),
    TwinTier(tier="qwen2.5-coder-1.5b-reason", profile="qwen2.5-coder-1.5b", records=(
        V8, DERIVED_BRANCHES, SAMPLED_BRANCHES)),
)


@contextmanager
def twin_ladder(config: CascadeConfig, tiers: Sequence[TwinTier] = V8_TWIN, *, time_scale: float = 1.0,
                profiles: Path = H200) -> Iterator[CascadeConfig]:
    """`config` with each of `tiers` served by its own emulated engine on 127.0.0.1 for the block (its tier's
    backends replaced, its workers dropped); a config tier not in `tiers` is a ValueError."""
    by_name = {t.tier: t for t in tiers}
    unknown = [t.name for t in config.tiers if t.name not in by_name]
    if unknown:
        raise ValueError(f"no twin engine for tier(s) {', '.join(unknown)}")
    with ExitStack() as stack:
        replaced = []
        for tier in config.tiers:
            twin = by_name[tier.name]
            engine = GpuSGLang(load_profile(profiles / f"{twin.profile}.json"),
                               load_recorded(twin.records, tier.name), time_scale=time_scale)
            url = stack.enter_context(serve_asgi(engine))
            replaced.append(msgspec.structs.replace(tier, backends=[SGLangBackendConfig(url=url, model=tier.name)]))
        yield msgspec.structs.replace(config, tiers=replaced, workers=[])


def label_on_twin(config: CascadeConfig, ids: Sequence[str], seed: int = 0) -> dict[str, dict[str, TierOutcome]]:
    """Every question of `ids` (dataset row ids) answered and graded on every tier of `config` (a `twin_ladder`'s)
    exactly as `cascade label` labels them (cascade/label.py `answer_on_tier`, at the tiers' own lengths): per
    question, per tier, its outcome."""
    import asyncio

    from cascade.label import answer_on_tier
    from cascade.tiers.build import build_tiers

    prompts = prompts_of(set(ids))
    ladder = build_tiers(config, {})

    async def label() -> list[list[TierOutcome]]:
        try:
            return await asyncio.gather(*(asyncio.gather(*(answer_on_tier(t, prompts[q], None, seed) for t in ladder))
                                          for q in ids))
        finally:
            for t in ladder:
                await t.backend.aclose()

    rows = asyncio.run(label())
    return {q: {t.name: o for t, o in zip(ladder, row, strict=True)} for q, row in zip(ids, rows, strict=True)}
