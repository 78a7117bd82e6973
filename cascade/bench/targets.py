"""Which tier each `cascade bench branches` method runs on, and how it decodes: from the config alone, so
that every refusal comes before a model starts.

An embedded worker (a [[workers]] entry) decodes every request as it is set, whatever the request asks
(WorkerConfig.temperature / top_p: 0 = greedy); openai and sglang backends decode as each request asks.

* `vanilla` (one greedy branch) asks for temperature 0. On a tier backed by a sampling worker that would
  still sample, so vanilla runs on a tier of the same model whose workers are greedy (and with the same
  system prompt: the same question asked); with none in the config it is refused, naming what to add.
* The branched methods (self_consistency, sart, early_stop_only, prune_only, and --sweep) are refused on
  a tier whose worker is greedy, as the gateway refuses `branches.n` there: its branches would be one
  answer repeated. On a sampling worker's tier they sample at the worker's temperature and top_p (a
  different --temperature or --top-p is refused: it would not be what ran); elsewhere at --temperature
  (default the tier's `branches.temperature`) and --top-p (default 1.0), sent with every request.
"""

from __future__ import annotations

import msgspec

from cascade.config import CascadeConfig, TierConfig, WorkerBackendConfig, WorkerConfig
from cascade.errors import ConfigError


class BenchTargets(msgspec.Struct, frozen=True, kw_only=True):
    tier: str  # the branched methods'
    vanilla_tier: str
    # How the branched methods sample (what their requests ask, and on a worker what it is set to).
    temperature: float
    top_p: float


def bench_targets(config: CascadeConfig, tier_name: str, *, vanilla: bool, branched: bool,
                  temperature: float | None = None, top_p: float | None = None) -> BenchTargets:
    """Where and how the methods run on tier `tier_name` (`vanilla`/`branched`: whether any such method runs);
    raises ConfigError (one line: what is wrong and what to do) where the bench would not measure what it says."""
    tier = next(t for t in config.tiers if t.name == tier_name)
    workers = workers_of(config, tier)
    decodings = sorted({_decoding(w) for w in workers})
    if len(decodings) > 1:
        listed = ", ".join(f"`{w.name}` at temperature {w.temperature:g}" for w in workers)
        raise ConfigError(f"tier `{tier.name}`'s workers decode differently ({listed}): the bench needs every "
                          "replica of a tier to decode alike; give them one temperature and top_p")
    sampler = next((w for w in workers if w.temperature > 0), None)
    greedy = next((w for w in workers if w.temperature == 0), None)
    if branched and greedy is not None:
        samplers = [t.name for t in config.tiers if _runs_only(config, t, {greedy.model}, sampling=True)]
        other = f" (tier `{samplers[0]}` runs the same model sampling)" if samplers else ""
        raise ConfigError(f"tier `{tier.name}`'s engine decodes every request greedily (worker `{greedy.name}` at "
                          f"temperature 0), so its branches would be one answer repeated, and the gateway refuses "
                          f"`branches.n` > 1 there: run only --methods vanilla on it, or give --tier a tier whose "
                          f"worker samples{other}")
    if sampler is not None:
        for flag, field, asked, fixed in (("--temperature", "temperature", temperature, sampler.temperature),
                                          ("--top-p", "top_p", top_p, sampler.top_p)):
            if branched and asked is not None and asked != fixed:
                raise ConfigError(f"{flag} {asked:g} differs from worker `{sampler.name}`'s {field} ({fixed:g}), "
                                  f"which its engine samples every request at: leave {flag} out (the branches then "
                                  f"run at {fixed:g}) or set the worker's {field}")
        branch_temperature, branch_top_p = sampler.temperature, sampler.top_p
    else:
        branch_temperature = tier.branches.temperature if temperature is None else temperature
        branch_top_p = 1.0 if top_p is None else top_p
    if branched and branch_temperature == 0:
        source = "--temperature" if temperature is not None else f"tier `{tier.name}`'s branches.temperature"
        raise ConfigError(f"the branches' temperature is 0 ({source}): every branch would be the same greedy "
                          "answer; give them a temperature > 0")
    vanilla_tier = _greedy_sibling(config, tier, sampler) if vanilla and sampler is not None else tier.name
    return BenchTargets(tier=tier.name, vanilla_tier=vanilla_tier, temperature=branch_temperature,
                        top_p=branch_top_p)


def workers_of(config: CascadeConfig, tier: TierConfig) -> list[WorkerConfig]:
    """The [[workers]] entries the tier's backends run on, in backend order."""
    by_name = {w.name: w for w in config.workers}
    return [by_name[b.worker] for b in tier.backends if isinstance(b, WorkerBackendConfig)]


def _decoding(worker: WorkerConfig) -> tuple[float, float]:
    return (worker.temperature, worker.top_p if worker.temperature > 0 else 1.0)  # greedy ignores top_p


def _runs_only(config: CascadeConfig, tier: TierConfig, models: set[str], *, sampling: bool) -> bool:
    """Whether every backend of `tier` is a worker of `models`, all sampling (or all greedy)."""
    workers = workers_of(config, tier)
    return (len(workers) == len(tier.backends) and {w.model for w in workers} == models
            and all((w.temperature > 0) == sampling for w in workers))


def _greedy_sibling(config: CascadeConfig, tier: TierConfig, sampler: WorkerConfig) -> str:
    """The first tier that answers as `tier` asks (its system prompt) from greedy workers of its model."""
    models = {w.model for w in workers_of(config, tier)}
    greedy = [t for t in config.tiers if _runs_only(config, t, models, sampling=False)]
    same = [t for t in greedy if t.system_prompt == tier.system_prompt]
    if same:
        return same[0].name
    model = ", ".join(sorted(models))
    other = (f" with its system_prompt (tier `{greedy[0].name}` does, but asks with another system_prompt)"
             if greedy else "")
    raise ConfigError(f"vanilla must decode greedily, but tier `{tier.name}`'s worker `{sampler.name}` samples "
                      f"every request (temperature {sampler.temperature:g}) and no tier answers from a greedy worker "
                      f"of model `{model}`{other}: add a [[workers]] entry with model = \"{model}\" (temperature 0) "
                      f"and a [[tiers]] entry on it, or leave vanilla out of --methods")
