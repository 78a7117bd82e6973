"""The `/v1/route` outputs the docs show (docs/configuration.md) are what the embedded default decides for the same
body (issue 65 item 5: the example had drifted from what the live gateway does). The decision is the gateway's own
(the embedded config's learned router, its operating points, the out-of-domain note), without engines or a server;
every value a doc shows is checked to the decimals it shows. Field names alone: tests/test_docs_commands.py."""

from __future__ import annotations

import re

import pytest

from cascade.engines.embedded import embedded_config
from cascade.router.load import TierShape
from cascade.router.policy import QualityHint, out_of_domain_note
from cascade.router.router import Router
from cascade.router.signals import routing_signal
from tests.docs_text import shown_routes

SCALAR = re.compile(r'"(\w+)":("(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?|true|false|null)')
TIER_VALUE = re.compile(r'"([\w.-]+)":(-?\d+(?:\.\d+)?)')


@pytest.fixture(scope="module")
def decide():
    """The embedded default's decision for a prompt and a named hint, as /v1/route reports it (module scope: the
    learned router takes seconds to load)."""
    config = embedded_config()
    names = [t.name for t in config.tiers]
    router = Router([TierShape(t.name, t.branches.slots, t.branches.n) for t in config.tiers], config.routing,
                    routing_signal(config.routing, names))

    def decision(prompt: str, hint: str) -> dict:
        route = router.policy.place(router.assess(prompt), QualityHint(name=hint))
        a = route.assessment
        return {"object": "cascade.route", "tier": route.tier, "tier_name": names[route.tier], "quality": hint,
                "router": route.router, "out_of_domain": a.out_of_domain, "difficulty": a.difficulty,
                "route_score": a.score, "note": out_of_domain_note(route, names),
                "p_fail": dict(zip(names, a.p_fail or (), strict=False)), "thresholds": route.thresholds}

    return decision


def _matches(shown: str, actual: object) -> bool:
    """Whether a value as a doc shows it is `actual` (a number to the decimals shown)."""
    if shown.startswith('"'):
        return shown[1:-1].replace('\\"', '"') == actual
    if shown in ("true", "false", "null"):
        return {"true": True, "false": False, "null": None}[shown] == actual
    decimals = len(shown.partition(".")[2])
    return isinstance(actual, int | float) and round(float(actual), decimals) == float(shown)


@pytest.mark.parametrize(("where", "body", "output"), shown_routes(), ids=[w for w, _, _ in shown_routes()])
def test_a_shown_route_output_is_what_the_embedded_default_decides(decide, where, body, output) -> None:
    actual = decide(body["messages"][-1]["content"], body["quality"])
    top = output.split('"p_fail":')[0] + output.split('"p_fail":')[-1].partition("}")[2]  # without p_fail's own keys
    wrong = [f"{key}: shown {value}, decided {actual[key]!r}" for key, value in SCALAR.findall(top)
             if not _matches(value, actual[key])]
    p_fail = output.partition('"p_fail":')[2].partition("}")[0]
    wrong += [f"p_fail.{tier}: shown {value}, decided {actual['p_fail'][tier]!r}"
              for tier, value in TIER_VALUE.findall(p_fail) if not _matches(value, actual["p_fail"][tier])]
    thresholds = re.search(r'"thresholds":\[(-?\d[-\d.,\s]*)\]', output)
    if thresholds:
        shown = [t.strip() for t in thresholds.group(1).split(",")]
        if len(shown) != len(actual["thresholds"]) or not all(map(_matches, shown, actual["thresholds"])):
            wrong.append(f"thresholds: shown {shown}, decided {actual['thresholds']}")
    assert not wrong, f"{where}: the doc shows another decision than the embedded default makes:\n" + "\n".join(wrong)
