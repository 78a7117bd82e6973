"""The verifier step scorer with the real SmolLM2-135M weights: the scorer server over real HTTP on 127.0.0.1,
read by cascade's PRM client, and a tier's scorer worker started by the supervisor. Plumbing only: whether a
135M model tells right steps from wrong ones is benchmarks/reasoning/verifier_scorer.py's question, not a test's."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from cascade.branches.prm_client import SGLangPRMScorer, prm_input
from cascade.config import Timeouts, decode_config
from cascade.engines.models import load_card, prepare
from cascade.engines.scorer_server import ScorerApp
from cascade.engines.supervisor import Supervisor
from cascade.engines.verifier_model import VerifierModel
from cascade.testing.asgi import serve_asgi
from cascade.tiers.build import build_tiers, make_workers

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

TIMEOUTS = Timeouts(connect_s=2.0, read_s=30.0, total_s=30.0)
QUESTION = "Tom has 12 apples and 5 pears. He buys 7 more apples. How many fruits does he have?"
STEPS = ["Tom buys 7 more apples: 12 + 7 = 19 apples.", "With the pears: 19 + 5 = 24 fruits.",
         "The answer is \\boxed{24}."]
WRONG = ["Tom buys 7 more apples: 12 + 7 = 21 apples.", "With the pears: 21 * 5 = 105 fruits."]


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return prepare(load_card("smollm2-135m"))


@pytest.fixture(scope="module")
def padded(smollm2: Path) -> VerifierModel:
    # float32: a padded batch then computes each input as alone would, to rounding (bf16 differs by ~1e-2).
    return VerifierModel(smollm2, dtype="float32", prefix_cache_tokens=0, max_batch=8)


def scores(url: str, steps_list: list[list[str]], aggregate: str = "last") -> list[float]:
    async def main() -> list[float]:
        scorer = SGLangPRMScorer(url, "smollm2", TIMEOUTS, aggregate=aggregate)
        try:
            return [await scorer.score(QUESTION, steps) for steps in steps_list]
        finally:
            await scorer.aclose()

    return asyncio.run(main())


def test_the_real_tokenizer_has_one_token_per_answer_spelling(padded: VerifierModel) -> None:
    assert len(padded.yes_ids) == len(padded.no_ids) == 4 and not set(padded.yes_ids) & set(padded.no_ids)
    for token in padded.yes_ids + padded.no_ids:
        assert padded.tokenizer.decode([token]).strip().lower() in ("yes", "no")


def test_the_server_scores_in_unit_range_and_a_batch_equals_one_by_one(padded: VerifierModel) -> None:
    prefixes = [STEPS[:k] for k in range(1, len(STEPS) + 1)] + [WRONG[:k] for k in range(1, len(WRONG) + 1)]
    with serve_asgi(ScorerApp(padded, "smollm2")) as url:
        one_by_one = scores(url, prefixes)
        texts = [prm_input(QUESTION, steps) for steps in prefixes]
        batch = httpx.post(f"{url}/classify", json={"text": texts}, timeout=30).json()
        health = httpx.get(f"{url}/health")
        bad = httpx.post(f"{url}/classify", json={"text": "not a PRM input"})
        # The client's min over prefixes: one list, one padded forward pass.
        minimum = scores(url, [STEPS], aggregate="min")
    assert all(0.0 <= s <= 1.0 for s in one_by_one)
    assert [o["embedding"][0] for o in batch] == pytest.approx(one_by_one, abs=1e-4)
    assert minimum == pytest.approx([min(one_by_one[:3])], abs=1e-4)
    assert health.status_code == 200
    assert bad.status_code == 400 and "not a PRM input" in bad.json()["error"]["message"]


def test_the_prefix_cache_reuses_a_branchs_earlier_steps_and_scores_the_same(smollm2: Path,
                                                                             padded: VerifierModel) -> None:
    cached = VerifierModel(smollm2, dtype="float32", prefix_cache_tokens=4096)
    prefixes = [STEPS[:k] for k in range(1, len(STEPS) + 1)]
    reused = cached.score([(QUESTION, steps) for steps in prefixes])
    alone = padded.score([(QUESTION, steps) for steps in prefixes])
    assert [s.score for s in reused] == pytest.approx([s.score for s in alone], abs=1e-4)
    assert reused[0].cached_tokens == 0 and all(s.cached_tokens > 0 for s in reused[1:])
    assert all(s.prompt_tokens - s.cached_tokens < 40 for s in reused[1:])  # only the new step and the question


def test_a_tier_scores_with_a_scorer_worker_the_supervisor_started(tmp_path: Path) -> None:
    config = decode_config("""
[[workers]]
name = "judge"
model = "smollm2-135m"
role = "scorer"

[[tiers]]
name = "reason"
branches = { n = 2 }
scorer = { worker = "judge" }
backends = [{ kind = "openai", url = "http://127.0.0.1:1", model = "m" }]
""")
    workers = make_workers(config, tmp_path, ["reason"])
    supervisor = Supervisor(list(workers.values()))

    async def main() -> list[float]:
        await supervisor.start()
        [tier] = build_tiers(config, workers, ["reason"])
        assert tier.scorer is not None
        try:
            return [await tier.scorer.score(QUESTION, STEPS), await tier.scorer.score(QUESTION, WRONG)]
        finally:
            await tier.scorer.aclose()

    try:
        values = asyncio.run(main())
    finally:
        supervisor.stop()
    assert all(0.0 <= v <= 1.0 for v in values)
    assert not workers["judge"].alive()
