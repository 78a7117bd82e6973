"""The `[routing]` table of `cascade.toml`: policy and router, route or cascade mode, operating points, the random
split (`[routing.random]`), the load-reactive (`[routing.load]`), engine-load (`[routing.engine_load]`) and
answer-confidence (`[routing.confidence]`) switches, and what `reasoning_effort` routes as (`[routing.effort]`,
cascade/config/effort.py)."""

from __future__ import annotations

import itertools
from typing import Annotated, Literal

import msgspec

from cascade.config.base import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, Strict, UnitFloat
from cascade.config.effort import EffortConfig, check_effort
from cascade.errors import ConfigError


class LoadReactiveConfig(Strict, frozen=True):
    """Load-reactive operating points (cascade/router/load.py): while a tier is full or near its SLO, requests
    with a named hint that would load it are served at the next cheaper operating point, and its reasoning branches
    shrink to the M that must finish. Off by default; numeric hints always keep their target."""

    enabled: bool = False
    # The SLO a tier's recent answers are held to, in ms (0: that latency is not watched); `percentile` of the
    # answers in the last `window_s` (at least `min_samples` of them) is compared with it.
    ttft_ms: NonNegativeFloat = 0.0
    e2el_ms: NonNegativeFloat = 0.0
    percentile: Annotated[float, msgspec.Meta(gt=0, le=100)] = 90.0
    window_s: PositiveFloat = 10.0
    min_samples: PositiveInt = 5
    # Per tier name: requests in flight at which the tier is full (read live: only the excess moves; set it to
    # the engine's batch size). A tier not named here is full at branches.slots / branches.n requests when it has
    # branch slots, else its load is not watched.
    max_in_flight: dict[str, PositiveInt] = msgspec.field(default_factory=dict)
    # Pressure is latency / SLO. A tier is pressed from `enter_at` on and free again once below `exit_at`, after
    # at least `hold_s` pressed (hysteresis: no flapping); while pressed, every movable request moves off it.
    enter_at: PositiveFloat = 0.9
    exit_at: PositiveFloat = 0.7
    hold_s: PositiveFloat = 5.0
    # `best` keeps its operating point unless this is set; `fast` has none cheaper.
    degrade_best: bool = False
    shed_branches: bool = True


class EngineLoadConfig(Strict, frozen=True):
    """Tiers on SGLang read their engines' own load from each engine's Prometheus `/metrics` (queue, running
    requests, KV usage, TTFT histogram; cascade/branches/engine_poller.py), one shared poll per engine URL. Load-
    reactive routing then sees every client's requests on the engine, not only this gateway's, and admission may
    refuse a tier whose engines queue. A tier with a replica that is not SGLang, whose engine publishes nothing
    (SGLang without --enable-metrics: 404) or whose reading is stale falls back to this gateway's own counters."""

    enabled: bool = True
    poll_s: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.5
    timeout_s: PositiveFloat = 1.0  # one read of /metrics at most
    stale_after: PositiveInt = 3  # polls without a good reading after which the last one is not used
    # Load-reactive routing: a tier is full while every one of its engines has had requests waiting for this long
    # (0: from the first reading that shows a queue), or while its engines hold its `max_in_flight` x branches.
    queue_for_s: NonNegativeFloat = 0.0
    # Admission: 429 for a tier whose engines have this many requests waiting, all together (0: off).
    max_queue: NonNegativeInt = 0


class AnswerConfidenceConfig(Strict, frozen=True):
    """What cascade mode reads as a single answer's confidence (cascade/router/acceptance.py). Vote agreement
    (two or more finished reasoning branches) always comes first; then `source`."""

    # "prior": the router's prior that the tier answers this prompt correctly (1 without a learned router).
    # "mean" / "lowest_group" / "tail": the answer's own token-logprob confidence (cascade/branches/confidence.py),
    # which the gateway asks the engine for (`logprobs: true`, never shown to a client that did not ask) on
    # tiers whose engine returns them; a tier whose engine cannot (the embedded one) keeps the prior.
    source: Literal["prior", "mean", "lowest_group", "tail"] = "prior"
    group_tokens: PositiveInt = 32
    # Per tier name: [slope, intercept] of the logistic map P(correct) = 1 / (1 + exp(-(slope * logit(c) +
    # intercept))) from the raw token confidence c, fitted on labelled outcomes (benchmarks/router/answer_confidence.py
    # prints them). A tier not named here reads c as it is, which is no probability of being right.
    calibration: dict[str, tuple[float, float]] = msgspec.field(default_factory=dict)


class RandomSplitConfig(Strict, frozen=True):
    """The random-route null (`[routing] policy = "random"`, cascade/router/random_split.py): each prompt's score is
    uniform in [0, 1) from a keyed hash of its text, so a learned router can be compared with a random split at the
    same accuracy. Read only under that policy."""

    # The hash's key: one seed, one fixed split of every prompt; another seed, an independent one.
    seed: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] = 0  # TOML integers are signed 64-bit
    # Each tier's accuracy alone, cheapest first (empty: numeric quality hints are refused, named ones still route);
    # a numeric hint then gets the cheapest mixture of tiers whose expected accuracy reaches it.
    accuracies: list[UnitFloat] = msgspec.field(default_factory=list)
    # Each tier's cost per prompt, on any one scale (empty: the tier index, 0, 1, 2, ...); needs `accuracies`.
    costs: list[NonNegativeFloat] = msgspec.field(default_factory=list)


class RoutingConfig(Strict, frozen=True):
    # "learned": the difficulty classifier saved at `router` (from `cascade router train`);
    # "heuristic": cascade/router/heuristic.py, no model needed;
    # "random": the random-route null of `[routing.random]`, no model needed (a `router` set is not read, as with
    # "heuristic", so one config switches between a learned router and its null by `policy` alone).
    policy: Literal["heuristic", "learned", "random"] = "heuristic"
    # Router directory; a relative path is relative to the config file's folder.
    router: str = ""
    # "route": one tier per request, picked by `operating_points`; "cascade": start on the cheapest tier
    # that can accept and escalate while the answer's confidence is below the tier's `accept` threshold
    # (cascade/router/acceptance.py). A --plan's own mode wins.
    mode: Literal["route", "cascade"] = "route"
    # Cascade mode: acceptance thresholds per named operating point, one per tier but the last.
    accept: dict[str, list[float]] = msgspec.field(default_factory=dict)
    # Thresholds per named operating point (ascending, n_tiers - 1 values); a plan file overrides them.
    operating_points: dict[str, list[float]] = msgspec.field(default_factory=dict)
    # The router reads at most this many characters of a prompt (the last user message): its first and last halves
    # when longer. Routing work per request is then bounded, whatever the body holds; every committed router was
    # trained on prompts far shorter (GSM8K questions are under 1,000 characters), so none is changed by it.
    max_prompt_chars: Annotated[int, msgspec.Meta(ge=256, le=1_000_000)] = 8192
    # Where a prompt over 1,024 characters is assessed (cascade/router/offload.py): "process", in one child process
    # per serving process, on another core, so that routing hostile text (up to ~40 ms for what the router reads)
    # never slows the other requests on the event loop; "thread", in the serving process (no child, but that work
    # then shares the GIL with the loop).
    assess_long_prompts: Literal["process", "thread"] = "process"
    load: LoadReactiveConfig = LoadReactiveConfig()
    engine_load: EngineLoadConfig = EngineLoadConfig()
    confidence: AnswerConfidenceConfig = AnswerConfidenceConfig()
    random: RandomSplitConfig = RandomSplitConfig()
    # What each `reasoning_effort` level routes as (cascade/config/effort.py).
    effort: EffortConfig = EffortConfig()


def check_routing(routing: RoutingConfig, tiers: list[str], any_branch_slots: bool, any_sglang: bool = False
                  ) -> None:
    """What the types cannot say about `[routing]` on a ladder of `tiers` (names, cheapest first; `any_sglang`:
    some tier has an SGLang backend, whose engine load can be read)."""
    if routing.policy == "learned" and not routing.router:
        raise ConfigError("`routing.router` must name a router directory when `routing.policy` is \"learned\"")
    _check_random(routing, tiers)
    check_effort(routing.effort)
    n_thresholds = len(tiers) - 1
    for hint, thresholds in routing.operating_points.items():
        key = f"routing.operating_points.{hint}"
        if len(thresholds) != n_thresholds:
            raise ConfigError(f"`{key}` needs {n_thresholds} thresholds (one fewer than tiers)")
        if any(b < a for a, b in itertools.pairwise(thresholds)):
            raise ConfigError(f"`{key}` must be ascending, got {thresholds}")
    for hint, thresholds in routing.accept.items():
        key = f"routing.accept.{hint}"
        if len(thresholds) != n_thresholds:
            raise ConfigError(f"`{key}` needs {n_thresholds} acceptance thresholds (one per tier but the last)")
        if any(not h >= 0.0 for h in thresholds):  # written so that NaN fails too
            raise ConfigError(f"`{key}` thresholds must be >= 0 (above 1 means the tier never accepts), "
                              f"got {thresholds}")
    _check_load(routing.load, tiers, any_branch_slots or (any_sglang and routing.engine_load.enabled))
    confidence = routing.confidence
    if unknown := sorted(set(confidence.calibration) - set(tiers)):
        raise ConfigError(f"`routing.confidence.calibration` names {unknown}, which are not tiers ({', '.join(tiers)})")
    for name, (slope, _) in confidence.calibration.items():
        if not slope > 0:
            raise ConfigError(f"`routing.confidence.calibration.{name}` slope must be > 0 (a higher confidence "
                              f"cannot mean a lower chance of being right), got {slope}")


def _check_random(routing: RoutingConfig, names: list[str]) -> None:
    split = routing.random
    for key, values in (("accuracies", split.accuracies), ("costs", split.costs)):
        if values and len(values) != len(names):
            raise ConfigError(f"`routing.random.{key}` needs one value per tier ({len(names)}: {', '.join(names)}), "
                              f"got {len(values)}")
    if split.costs and not split.accuracies:
        raise ConfigError("`routing.random.costs` needs `routing.random.accuracies`: costs price the split that "
                          "reaches a numeric quality hint, which only the tiers' accuracies give")
    check_policy_mode(routing)


def check_policy_mode(routing: RoutingConfig, whose: str = "`routing.mode`") -> None:
    """The random split is a null for route mode; `whose` names where the mode came from (a plan's wins)."""
    if routing.policy == "random" and routing.mode == "cascade":
        raise ConfigError(f"`routing.policy` \"random\" is a null for route mode, and {whose} is \"cascade\": cascade "
                          "mode picks tiers by the answers' confidence, never by the route score")


def _check_load(load: LoadReactiveConfig, names: list[str], capacity_known: bool) -> None:
    if load.exit_at >= load.enter_at:
        raise ConfigError(f"`routing.load.exit_at` ({load.exit_at:g}) must be below `enter_at` ({load.enter_at:g}): "
                          "the gap is what keeps a tier from flapping")
    unknown = sorted(set(load.max_in_flight) - set(names))
    if unknown:
        raise ConfigError(f"`routing.load.max_in_flight` names {unknown}, which are not tiers ({', '.join(names)})")
    watched = load.ttft_ms or load.e2el_ms or load.max_in_flight or capacity_known
    if load.enabled and not watched:
        raise ConfigError("`routing.load.enabled` watches nothing: set `ttft_ms`, `e2el_ms` or `max_in_flight` "
                          "(or give a tier `branches.slots`, or an SGLang backend with `routing.engine_load` on)")
