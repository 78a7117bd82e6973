"""What the attacks of hostile_attacks.py came to, per target, from their records: plain functions over the phases'
records (no I/O), so that the billing and budget verdicts are tested without servers
(tests/benchmarks/frontdoor/test_hostile_clients.py).

Billing is read in tokens (every tier costs 1 per million, in and out: hostile_attacks.PRICE_TOML).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from benchmarks.frontdoor import hostile_attacks as attacks

# The ledger sums costs as floats: spends within this many tokens are equal.
TOKEN_SLACK = 0.01


def counts(values: list[str]) -> dict[str, int]:
    return dict(sorted(Counter(values).items()))


def cut_bills(cut: dict[str, Any], reserved: int, budget: float) -> list[float]:
    """What each admitted cut stream of one phase was billed, in tokens: the streams went one at a time, each after
    the last had settled, so the budget left after one's reservation (its x-cascade-budget-remaining) is the budget
    less the spend before it and its reservation; the next one's (or the spend read after the last) tells what it
    spent. Empty where the target says neither (through Envoy)."""
    before = [budget - r["budget_left"] - reserved for r in cut["sent"]
              if r["outcome"] == "200" and r["budget_left"] is not None]
    if not before or cut["spent_after"] is None:
        return []
    return [round(after - spent, 3) for spent, after in zip(before, [*before[1:], cut["spent_after"]], strict=True)]


def cut_billing(cuts: list[dict[str, Any]], prompt_bound: int, reserved: int, budget: float) -> dict[str, Any]:
    """Cut streams, over the phases: each admitted one must be billed at least its prompt (the engine never reported
    it, so its bound) and at most its reservation (the bound and max_tokens)."""
    billed = [b for cut in cuts for b in cut_bills(cut, reserved, budget)]
    short = [b for b in billed if b < prompt_bound - TOKEN_SLACK]
    over = [b for b in billed if b > reserved + TOKEN_SLACK]
    outcomes = [r["outcome"] for cut in cuts for r in cut["sent"]]
    return {"sent": len(outcomes), "outcomes": counts(outcomes),
            "prompt_bound_tokens": prompt_bound, "reserved_tokens": reserved,
            "billed_tokens": None if not billed else {"n": len(billed), "min": min(billed), "max": max(billed),
                                                      "total": round(sum(billed), 3)},
            "billed_below_prompt": len(short), "billed_over_reservation": len(over),
            "every_cut_billed_its_prompt": None if not billed else not short}


def lie_billing(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Lies: per kind and whether streamed, what they came to and what they were billed; a usage fault must be billed
    its reservation, and nothing may be a 500 or a refusal for a place in flight (a place a lie never gave back)."""
    by_kind: dict[str, dict[str, Any]] = {}
    for r in records:
        entry = by_kind.setdefault(f"{r['kind']}/{'stream' if r['stream'] else 'whole'}",
                                   {"outcomes": Counter(), "billed": Counter(), "reserved_tokens": r["reserved"],
                                    "prompt_bound_tokens": r["prompt_bound"]})
        entry["outcomes"][r["outcome"]] += 1
        if r["billed"] is not None:
            entry["billed"][f"{r['outcome']}: {r['billed']:g}"] += 1
    faults = [r for r in records if r["outcome"].endswith("usage_fault") and r["billed"] is not None]
    return {"sent": len(records), "outcomes": counts([r["outcome"] for r in records]),
            "by_kind": {name: {**e, "outcomes": dict(e["outcomes"]), "billed": dict(e["billed"])}
                        for name, e in sorted(by_kind.items())},
            "status_500": sum(r["outcome"].startswith("500") for r in records),
            "in_flight_refused": sum(r["outcome"].endswith("in_flight_refused") for r in records),
            "usage_faults_billed_at_reservation": None if not faults else all(
                abs(r["billed"] - r["reserved"]) <= TOKEN_SLACK for r in faults)}


def readers_memory(run: dict[str, Any]) -> dict[str, Any]:
    """Slow readers: what they read, and each server process's VmRSS before them, then per hold the most while they
    were held and after. `growth_second_half_kib`: the most it grew over the second half of a hold's samples, once the
    buffers to the readers had filled; `growth_from_first_hold_kib`: what the last hold's most added to the first's
    (both about 0: bounded, whatever the answers' size, and nothing kept)."""
    holds = run["holds"]
    readers = [reader for hold in holds for reader in hold["readers"]]
    rss: dict[str, dict[str, Any]] = {}
    late: dict[str, int | None] = {}
    for name, before in run["rss_kib_before"].items():
        most = [max((x for x in hold["rss_kib_samples"][name] if x is not None), default=None) for hold in holds]
        rss[name] = {"before": before, "most_while_held": most, "after": [h["rss_kib_after"].get(name) for h in holds]}
        for hold in holds:
            half = [x for x in hold["rss_kib_samples"][name][len(hold["rss_kib_samples"][name]) // 2:] if x is not None]
            if len(half) > 1:
                late[name] = max(late.get(name) or 0, max(half) - half[0])
    grown = {name: None if None in (e["most_while_held"][0], e["most_while_held"][-1]) else
             e["most_while_held"][-1] - e["most_while_held"][0] for name, e in rss.items()}
    return {"readers": len(readers), "holds": len(holds), "statuses": counts([r["status"] for r in readers]),
            "ended_by": counts([r["ended_by"] for r in readers]), "bytes_read": sum(r["bytes_read"] for r in readers),
            "rss_kib": rss, "growth_second_half_kib": late, "growth_from_first_hold_kib": grown}


def pipelined(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Pipelined slow bodies: how they ended, the statuses they got, and how long they stayed open."""
    return {"connections": len(records), "ended_by": counts([r["ended_by"] for r in records]),
            "statuses": counts([",".join(map(str, r["statuses"])) or "none" for r in records]),
            "seconds_open_max": max((r["seconds_open"] for r in records), default=None),
            "seconds_open_min": min((r["seconds_open"] for r in records), default=None)}


def in_flight(checks: list[dict[str, dict[str, int]]]) -> dict[str, Any]:
    """After each phase, each attack key's max_in_flight requests at once: refused for a place in flight = leaked."""
    total: dict[str, Counter[str]] = {}
    for check in checks:
        for key, outcomes in check.items():
            total.setdefault(key, Counter()).update(outcomes)
    leaked = sum(n for outcomes in total.values() for o, n in outcomes.items() if o.endswith("in_flight_refused"))
    return {"by_key": {key: dict(c) for key, c in total.items()}, "leaked_places": leaked}


SPENT = re.compile(r"has spent ([0-9.eE+-]+) ")


def spent_in_refusal(message: str) -> float | None:
    """The spend a budget refusal states (`... has spent 0.512 USD of its budget of 0.5 USD ...`)."""
    found = SPENT.search(message)
    return None if found is None else float(found.group(1))


def budget(drained: dict[str, Any], amount: float, worst_case: float, cut: tuple[int, int], lie: tuple[int, int]
           ) -> dict[str, Any]:
    """The drain's key: spent against its budget. The promise (docs/operations.md#budgets): at most one request's
    worst case beyond it. `reached`: the budget refused a request (else `budget_held` says nothing). `cut` and `lie`:
    the drain's requests' (prompt bound, reservation) in tokens: the spend must lie between every admitted cut billed
    its prompt and every one billed its reservation, with every lie that reached an engine billed its reservation
    (the gateway: a usage fault; the picker: what it charges every request)."""
    status, message = drained["refusal_after"]
    spent = spent_in_refusal(message) if status == 429 else None
    outcomes = drained["outcomes"]
    cuts = outcomes.get("cut:200", 0)
    # A lie that reached an engine: a usage fault at the gateway, an answer through the picker.
    lies = sum(n for o, n in outcomes.items() if o in ("lie:502:usage_fault", "lie:200:usage_fault",
                                                         "lie:200:answered"))
    low, high = (cuts * cut[0] + lies * lie[1]) / 1e6, (cuts * cut[1] + lies * lie[1]) / 1e6
    return {"budget": amount, "spent": spent, "worst_case": worst_case, "reached": spent is not None,
            "overspend": None if spent is None else round(spent - amount, 9),
            "budget_held": spent is not None and spent <= amount + worst_case + 1e-9,
            "admitted": {"cuts": cuts, "lies": lies}, "spent_if_billed": [round(low, 9), round(high, 9)],
            "spent_within_bills": spent is not None and low - 1e-9 <= spent <= high + 1e-9,
            "gauge_spent": None if drained["gauge_tokens"] is None else drained["gauge_tokens"] / 1e6,
            "outcomes": outcomes, "request_after": {"status": status, "message": message[:200]}}


# A front process (gateway, Envoy, ext_proc) whose RSS grew less than this over the second half of a slow readers'
# hold, while each held megabytes unread, and whose second hold's most was less than this over the first's, holds a
# bounded amount for them and keeps nothing after them.
FLAT_KIB = 1024


def verdicts(summary: dict[str, Any]) -> dict[str, bool | None]:
    """Each check of the attacks, true or false (None: not measurable on this target, or not run)."""
    cut, lies, drained = summary["cut_streams"], summary["lies"], summary["budget"]
    readers, timeout = summary["slow_readers"], summary["body_timeout"]
    outcomes = [*cut["outcomes"], *lies["outcomes"], *(drained["outcomes"] if drained else [])]
    front = [(name, kib) for measure in ("growth_second_half_kib", "growth_from_first_hold_kib")
             for name, kib in (readers or {}).get(measure, {}).items() if not name.endswith("engine")]
    return {
        "every_cut_billed_its_prompt": cut["every_cut_billed_its_prompt"],
        "usage_faults_billed_at_reservation": lies["usage_faults_billed_at_reservation"],
        "no_status_500": not any(":500" in f":{o}" for o in outcomes),
        "no_place_leaked": summary["in_flight_after_phases"]["leaked_places"] == 0 and lies["in_flight_refused"] == 0,
        "budget_held": None if drained is None or not drained["reached"] else drained["budget_held"],
        "drain_billed_as_promised": None if drained is None else drained["spent_within_bills"],
        "slow_readers_memory_flat": None if not front or any(kib is None for _, kib in front) else
        all(kib is not None and kib < FLAT_KIB for _, kib in front),
        "slow_bodies_closed": None if timeout is None else
        sum(timeout["ended_by"].get(end, 0) for end in ("server_closed", "server_reset")) == timeout["connections"],
    }


def attacks_summary(hostile: list[dict[str, Any]], drained: dict[str, Any], read_slowly: dict[str, Any],
                    body_timeout: list[dict[str, Any]], keys: dict[str, attacks.AttackKey]) -> dict[str, Any]:
    """The attacks beside the corpus (over the `hostile` phases, those with the attacker), then the budget drain, the
    slow readers and the body timeout's wait (empty: not run), and their verdicts."""
    cut, lie = attacks.reserved(attacks.CUT_BODY), attacks.reserved(attacks.lie_body("negative_prompt", False))
    summary = {
        "cut_streams": cut_billing([p["attacks"]["cut"] for p in hostile], *cut,
                                   keys["cut"].budget * attacks.TOKENS_PER_UNIT),
        "lies": lie_billing([r for p in hostile for r in p["attacks"]["lies"]]),
        "pipelined_slow_bodies": pipelined([r for p in hostile for r in p["attacks"]["pipelined"]]),
        "in_flight_after_phases": in_flight([p["in_flight"] for p in hostile]),
        "budget": None if not drained else budget(drained, keys["drain"].budget,
                                                  max(cut[1], lie[1]) / attacks.TOKENS_PER_UNIT, cut, lie),
        "slow_readers": None if not read_slowly else readers_memory(read_slowly),
        "body_timeout": None if not body_timeout else pipelined(body_timeout),
    }
    return {"verdicts": verdicts(summary), **summary}
