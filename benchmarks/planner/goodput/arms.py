"""The arms of the goodput benchmark: how G emulated GPUs are split over the ladder's tiers, what fronts them, and
how requests are routed. An arm is data (`Arm`); `gateway_toml` writes the `cascade serve` config that serves it.

Every tier of the embedded ladder (cascade/testing/twin.py `V8_TWIN`) keeps its place in the config, since the router
scores all four; a tier an arm gives no GPU points at a closed port, so a request routed there fails and is counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.planner.goodput.folds import TIERS, Fold

PLAIN_TIER = "qwen2.5-coder-1.5b"  # the plain deployment's model, answering directly
REASON_TIER = "qwen2.5-coder-1.5b-reason"
NO_ENGINE = "http://127.0.0.1:9"  # the discard port: nothing listens there
MAX_TOKENS = 512  # every tier's answer budget, as the ladder was labelled (examples/embedded-1.5b-ladder.toml)
# The gateway's admission limits per emulated GPU: at 8 GPUs, `[gateway.limits]`'s defaults (1024 requests in flight,
# 512 per tier, 2048 backend streams, 4096 connections); a larger fleet gets them in proportion, as its operator
# would set them (at 32 GPUs the defaults shed a fifth of the requests at 300 req/s with 429s).
LIMITS_PER_GPU = {"max_in_flight": 128, "max_in_flight_per_tier": 64, "max_backend_streams": 256,
                  "max_connections": 512}


@dataclass(frozen=True)
class Arm:
    """`replicas`: emulated GPUs per tier (one TP1 replica each). `front`: "smg" (SGLang's model gateway, round robin,
    over the plain tier's replicas) or "cascade". `tier_smg`: with a cascade front, "" (each tier's backends are its
    engines: cascade picks the replica) or an smg policy (each tier's replicas sit behind one smg with that policy,
    the tier's one backend: smg picks the replica; benchmarks/planner/goodput/smg.py). `replica_choice`: cascade's
    `[tiers.replicas] choice` on every tier ("": its default, least outstanding). `model`: the model requests
    name (a tier name bypasses routing; "cascade": the router picks). `routing`: the `[routing]` table's body for a
    fold (None: no router). `branches`: the reasoning tier's (n, m, first_wave)."""

    name: str
    replicas: dict[str, int]
    front: str = "cascade"
    tier_smg: str = ""
    replica_choice: str = ""
    model: str = "cascade"
    routing: dict[str, str] = field(default_factory=dict)  # fold name -> TOML lines of [routing]
    branches: tuple[int, int, int] = (8, 8, 2)
    load_reactive: bool = False
    plan: dict[str, Path] = field(default_factory=dict)  # fold name -> plan.json (`cascade serve --plan`)

    @property
    def gpus(self) -> int:
        return sum(self.replicas.values())


def plain(gpus: int) -> Arm:
    return Arm("a-plain-smg", {PLAIN_TIER: gpus}, front="smg", model=PLAIN_TIER)


def all_reasoning(gpus: int) -> Arm:
    return Arm("b-all-reasoning", {REASON_TIER: gpus}, model=REASON_TIER)


def learned_even(gpus: int, folds: list[Fold]) -> Arm:
    """Cascade's learned router (each fold's router from the other fold), the GPUs split evenly over the tiers."""
    share, extra = divmod(gpus, len(TIERS))
    replicas = {t: share + (1 if i >= len(TIERS) - extra else 0) for i, t in enumerate(TIERS)}  # extras to the top
    return Arm("c-learned-even", replicas,
               routing={f.name: f'policy = "learned"\nrouter = "{f.router}"' for f in folds})


def random_null(replicas: dict[str, int], folds: list[Fold], name: str, seed: int = 0) -> Arm:
    """The null: route scores drawn at random (`[routing] policy = "random"`) on `replicas`, the split calibrated to
    the same target on the same training fold (each tier's accuracy there; costs the tier index, as the learned
    router's calibration weighs them)."""
    routing = {}
    for f in folds:
        accuracies = ", ".join(f"{f.accuracy[t]:.6f}" for t in TIERS)
        routing[f.name] = f'policy = "random"\n\n[routing.random]\nseed = {seed}\naccuracies = [{accuracies}]'
    return Arm(name, replicas, routing=routing)


def gateway_toml(arm: Arm, urls: dict[str, list[str]], fold: str, *, max_running: int,
                 slo_e2e_ms: float = 0.0) -> str:
    """The config of the gateway serving `fold` in `arm`, its tiers on `urls` (tier -> backend URLs: the tier's
    engines, or the one smg in front of them)."""
    timeouts = "{ connect_s = 5.0, read_s = 3600.0, total_s = 36000.0 }"
    lines = ['[gateway]', 'default_quality = "balanced"', '', '[gateway.limits]',
             *(f"{key} = {per_gpu * max(arm.gpus, 1)}" for key, per_gpu in LIMITS_PER_GPU.items()), '']
    for tier in TIERS:
        backends = ", ".join(f'{{ kind = "sglang", url = "{u}", model = "{tier}", timeouts = {timeouts} }}'
                             for u in urls.get(tier) or [NO_ENGINE])
        lines += ['[[tiers]]', f'name = "{tier}"', f'default_max_tokens = {MAX_TOKENS}', f'backends = [{backends}]']
        if tier == REASON_TIER:
            n, m, first = arm.branches
            replicas = max(1, arm.replicas.get(tier, 0))  # GPUs, not backends: one smg may front them all
            lines += ['scorer = "none"', '', '[tiers.branches]', f'n = {n}', f'm = {m}', f'first_wave = {first}',
                      f'slots = {max_running * replicas}']
        if arm.replica_choice:
            lines += ['', '[tiers.replicas]', f'choice = "{arm.replica_choice}"']
        lines.append('')
    lines += ['[routing]', arm.routing.get(fold, 'policy = "heuristic"')]
    if arm.tier_smg:  # smg serves no /metrics on its main port: the engine poller would read 404s, twice a second
        lines += ['', '[routing.engine_load]', 'enabled = false']
    if arm.load_reactive:
        lines += ['', '[routing.load]', 'enabled = true', f'e2el_ms = {slo_e2e_ms:.0f}']
    return "\n".join(lines) + "\n"
