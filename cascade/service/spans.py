"""What the routing decision's span ("cascade.route", cascade/tracing/) says: the decision, never the prompt.

    cascade.tier, cascade.tier.index   the tier asked first
    cascade.routing.policy             the signal that decided: "learned", "heuristic", "random" or "bypass" (a tier
                                       named)
    cascade.routing.mode               "route" or "cascade"
    cascade.quality                    the hint's operating point ("balanced", "best", "0.9", ... or "bypass")
    cascade.difficulty, cascade.route_score, cascade.p_fail (per tier, cheapest first), cascade.out_of_domain
    cascade.load.in_flight, cascade.load.tier_in_flight   this gateway's requests in flight, and on that tier's
    cascade.load.degraded (+ .served, .reason)            load-reactive routing moved it below its hint
    cascade.key                        the API key's name (keys as tenants)
"""

from __future__ import annotations

from typing import Any

from cascade.service.admission import Admission
from cascade.service.decision import Decision
from cascade.service.keys.tenant import Tenant


def route_attributes(decision: Decision, mode: str, admission: Admission, caller: Tenant | None) -> dict[str, Any]:
    tier = decision.tier
    attributes: dict[str, Any] = {
        "cascade.tier": tier.name, "cascade.tier.index": tier.index, "cascade.routing.policy": decision.router,
        "cascade.routing.mode": mode, "cascade.quality": decision.hint,
        "cascade.load.in_flight": admission.in_flight, "cascade.load.tier_in_flight": admission.requests(tier.index),
        "cascade.load.degraded": decision.degraded is not None}
    if (assessment := decision.assessment) is not None:
        attributes["cascade.difficulty"] = assessment.difficulty
        attributes["cascade.route_score"] = assessment.score
        attributes["cascade.out_of_domain"] = assessment.out_of_domain
        if assessment.p_fail is not None:
            attributes["cascade.p_fail"] = list(assessment.p_fail)
    if (degraded := decision.degraded) is not None:
        attributes["cascade.load.served"] = degraded.served
        attributes["cascade.load.reason"] = degraded.reason
    if caller is not None:
        attributes["cascade.key"] = caller.name
    return attributes
