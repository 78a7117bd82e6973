"""`cascade label` labels exactly what the gateway serves: both answer through cascade/tiers/answer.py.

One fake engine plays per-seed answers (`[fake@seed=N ...]`), so any difference in how label and the gateway
derive seeds (per choice, per branch) or temperature shows up as a different answer.
"""

from __future__ import annotations

import asyncio
from contextlib import ExitStack

import httpx

from cascade.config import decode_config
from cascade.data.records import Prompt
from cascade.gateway.server import Gateway
from cascade.label import answer_on_tier
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.tiers.build import build_tiers
from tests.gateway.gateway_setup import small_and_thinker_toml

SEED = 5
# Branches with seeds 5 and 6 say 18, seed 7 says 19, any other seed 20: a vote over seeds 5..7 gives 18.
PROMPT = ("Q [fake answer=####_20] [fake@seed=5 answer=####_18] [fake@seed=6 answer=####_18] "
          "[fake@seed=7 answer=####_19]")


def ladder(url: str) -> str:
    return small_and_thinker_toml(url, m=3)  # every branch votes


def test_label_and_gateway_give_the_same_answer_for_the_same_seed() -> None:
    engine = FakeEngine(FakeScript(tokens=8))
    with ExitStack() as stack:
        url = stack.enter_context(serve_asgi(engine))
        config = decode_config(ladder(url))

        async def labelled() -> dict[str, str | None]:
            tiers = build_tiers(config, {})
            try:
                prompt = Prompt(id="q:0", prompt=PROMPT, reference="#### 18")
                return {t.name: (await answer_on_tier(t, prompt, None, SEED)).answer for t in tiers}
            finally:
                for tier in tiers:
                    await tier.backend.aclose()

        label_answers = asyncio.run(labelled())
        gateway = Gateway(decode_config(ladder(url)))
        base = stack.enter_context(serve_asgi(gateway.app, lifespan="on"))
        served = {}
        for tier, extra in (("small", {"temperature": 0}), ("thinker", {})):
            body = {"model": tier, "seed": SEED, "messages": [{"role": "user", "content": PROMPT}], **extra}
            response = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=10).json()
            served[tier] = response["choices"][0]["message"]["content"]
    assert label_answers == {"small": "18", "thinker": "18"}
    assert "18" in served["small"] and "18" in served["thinker"] and "20" not in served["thinker"]
