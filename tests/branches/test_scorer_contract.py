"""One contract for every Scorer (cascade/branches/scoring.py): each implementation runs the same tests.

- cpu:       CPUScorer (embedded, no model)
- prm-last, prm-min, prm-mean: SGLangPRMScorer over real HTTP on 127.0.0.1 against `FakePRM` below, which
  answers SGLang's `/classify` shape (tests/fixtures/sglang/README.md) with a reward computed from each input
- fake:      cascade.branches.fakes.FakeScorer

The promises: a name; a score in [0, 1] for any branch (no steps, one, many, odd text); the same score
for the same branch, also when called from many tasks at once; a fault is a BackendError (which the
branch runner reads as "no score"), never another exception; `aclose` may be called twice.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
import pytest

from cascade.branches.cpu_scorer import CPUScorer
from cascade.branches.fakes import FakeScorer
from cascade.branches.prm_client import STEP_MARKER, SGLangPRMScorer
from cascade.branches.scoring import Scorer, split_steps
from cascade.config import Timeouts
from cascade.engines.asgi import read_body, send_json
from cascade.errors import BackendError, BackendUnavailable
from cascade.testing.asgi import serve_asgi
from tests.servers import dead_url

TIMEOUTS = Timeouts(connect_s=1.0, read_s=5.0, total_s=10.0)
QUESTION = "Tom has 12 apples and 5 pears. He buys 7 more apples. How many fruits does he have?"
BRANCHES = {
    "no_steps": [],
    "one_step": ["12 + 7 = 19 apples."],
    "many_steps": split_steps("12 + 7 = 19 apples.\n\n19 + 5 = 24 fruits.\n\nThe answer is \\boxed{24}."),
    "wrong_arithmetic": ["12 + 7 = 21 apples.", "21 + 5 = 30 fruits."],
    "looping": ["He has 19 apples."] * 12,
    "odd_text": [f"{STEP_MARKER} ∑ 🍎 \\frac{{1}}{{0}} = ∞", "x" * 20_000],
}
T = TypeVar("T")


class FakePRM:
    """ASGI app speaking SGLang's `/classify` for a PRM: one `embedding: [P(positive)]` per input text,
    a deterministic function of the text; `GET /health` answers 200."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        if (scope["method"], scope["path"]) == ("POST", "/classify"):
            text = msgspec.json.decode(body)["text"]
            outputs = [{"embedding": [self.reward(t)]} for t in ([text] if isinstance(text, str) else text)]
            await send_json(send, 200, outputs[0] if isinstance(text, str) else outputs)
        else:
            await send_json(send, 200 if (scope["method"], scope["path"]) == ("GET", "/health") else 404, {})

    @staticmethod
    def reward(text: str) -> float:
        return hashlib.sha256(text.encode()).digest()[0] / 255


@dataclass(frozen=True)
class Flavor:
    make: Callable[[str], Scorer]  # given the fake PRM's URL
    broken: Callable[[], Scorer] | None  # one that faults, if the implementation can fault


def prm(aggregate: str) -> Flavor:
    return Flavor(lambda url: SGLangPRMScorer(url, "fake-prm", TIMEOUTS, aggregate=aggregate),
                  lambda: SGLangPRMScorer(dead_url(), "fake-prm", TIMEOUTS, aggregate=aggregate))


FLAVORS = {
    "cpu": Flavor(lambda url: CPUScorer(), None),
    **{f"prm-{aggregate}": prm(aggregate) for aggregate in ("last", "min", "mean")},
    "fake": Flavor(lambda url: FakeScorer(), lambda: FakeScorer(fault=BackendUnavailable("PRM down", "fake"))),
}


@pytest.fixture(scope="module")
def prm_url() -> Iterator[str]:
    with serve_asgi(FakePRM()) as url:
        yield url


@pytest.fixture(params=sorted(FLAVORS))
def flavor(request: pytest.FixtureRequest) -> Flavor:
    return FLAVORS[request.param]


def using(scorer: Scorer, use: Callable[[Scorer], Awaitable[T]]) -> T:
    async def main() -> T:
        try:
            return await use(scorer)
        finally:
            await scorer.aclose()

    return asyncio.run(main())


def test_a_scorer_is_a_scorer_with_a_name(flavor: Flavor, prm_url: str) -> None:
    scorer = flavor.make(prm_url)
    assert isinstance(scorer, Scorer) and isinstance(scorer.name, str) and scorer.name


@pytest.mark.parametrize("branch", sorted(BRANCHES))
def test_a_score_is_in_0_1_for_any_branch(flavor: Flavor, prm_url: str, branch: str) -> None:
    score = using(flavor.make(prm_url), lambda s: s.score(QUESTION, BRANCHES[branch]))
    assert isinstance(score, float) and 0.0 <= score <= 1.0


def test_a_score_is_deterministic_also_from_many_tasks_at_once(flavor: Flavor, prm_url: str) -> None:
    branches = [BRANCHES[name] for name in sorted(BRANCHES)]

    async def use(scorer: Scorer) -> tuple[list[float], list[float]]:
        one_by_one = [await scorer.score(QUESTION, steps) for steps in branches]
        at_once = await asyncio.gather(*(scorer.score(QUESTION, steps) for steps in branches * 3))
        return one_by_one, list(at_once)

    one_by_one, at_once = using(flavor.make(prm_url), use)
    assert at_once == one_by_one * 3


@pytest.mark.parametrize("name", sorted(name for name, flavor in FLAVORS.items() if flavor.broken is not None))
def test_a_fault_is_a_backend_error(name: str) -> None:
    broken = FLAVORS[name].broken
    assert broken is not None
    with pytest.raises(BackendError):
        using(broken(), lambda s: s.score(QUESTION, BRANCHES["many_steps"]))


def test_aclose_may_be_called_twice(flavor: Flavor, prm_url: str) -> None:
    async def use(scorer: Scorer) -> None:
        await scorer.score(QUESTION, BRANCHES["one_step"])
        await scorer.aclose()

    using(flavor.make(prm_url), use)
