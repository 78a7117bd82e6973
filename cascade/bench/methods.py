"""`cascade bench branches`: vanilla vs self-consistency vs SART (and ablations) on GSM8K, side by side.

Method (SART's evaluation, ../shared/PAPERS.md §2.6, on whatever tier is given):

* The same seeded sample of GSM8K questions (`--dataset`, default the test split) and the same Poisson
  arrival schedule (`--rate`) are replayed for every method, one method after the other, against the
  tier's backend (the embedded CPU ladder's reasoning tier unless --config/--tier say otherwise).
* Methods: `vanilla` (one greedy branch), `self_consistency` (N sampled branches to completion,
  majority vote), `sart` (N branches, early stop at M, two-phase pruning by the tier's scorer),
  `early_stop_only` (N, M, no pruning), `prune_only` (N branches must all finish or be pruned) and
  `adaptive` (self-consistency with a first wave: `--first-wave` branches first, the other N only when they
  disagree; with `--wave-margin` D, doubling waves until the leading answer is D votes ahead;
  cascade/branches/runner.py).
  Which tier each runs on and how it decodes (an embedded worker decodes as it is set, whatever the
  request asks): cascade/bench/targets.py.
* Each method runs with the tier's branch slots (`--slots`, default 4 x N): requests wait for free
  slots, and slots freed by finished, pruned and stopped branches admit waiting requests; latency is
  measured from the scheduled arrival, so it includes that queueing.
* Per request: end-to-end latency, correctness (the shared grader), decode tokens of all branches.
  `--save-branches FILE` also writes every finished self-consistency and adaptive branch's text with its
  correctness and method (local use only: never commit model outputs on dataset questions).
* A run stopped half-way resumes where it stopped (cascade/bench/runs.py).

Output (`--json`): {"methods": {name: {"accuracy", "latency_s_mean", "latency_s_p95", "tokens_mean", ...}},
"config": {...}, "questions": [ids]}; with `--sweep N:M,N:M` also a sweep of SART and self-consistency
over (N, M) and a PNG of accuracy vs mean latency.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import msgspec
import numpy as np

from cascade.branches.runner import BranchRun
from cascade.branches.slots import BranchSlots
from cascade.config import BranchSettings, BrokenRule, check_branches
from cascade.data.arrivals import schedule
from cascade.data.grading import grade
from cascade.data.records import Prompt
from cascade.errors import CascadeError, ConfigError
from cascade.schemas import ChatMessage
from cascade.tiers.answer import answer
from cascade.tiers.build import Tier
from cascade.tiers.upstream import Sampling

METHODS = ("vanilla", "self_consistency", "sart", "early_stop_only", "prune_only", "adaptive")
# Methods whose finished branches are plain samples (none pruned for its score): the ones --save-branches keeps,
# so a scorer judged on them is judged on branches no scorer chose.
UNPRUNED_METHODS = ("self_consistency", "adaptive")
# Methods that score their branches with the tier's scorer and prune by the scores; the others run without it.
PRUNING_METHODS = ("sart", "prune_only")


class BenchSettings(msgspec.Struct, frozen=True, kw_only=True):
    n: int = 4
    m: int = 2
    alpha: float = 0.3
    beta: int = 1
    k: int = 2
    rate: float = 0.05
    max_tokens: int = 512
    # How the branched methods sample (vanilla decodes greedily); top_p None: not sent (the engine's default).
    temperature: float = 0.7
    top_p: float | None = None
    slots: int = 0  # 0: 4 x n
    seed: int = 0
    # The branches' sampling seed (None: `seed`): another one samples the same questions, arriving as before, again.
    sampling_seed: int | None = None
    first_wave: int = 2  # `adaptive`'s first wave
    wave_margin: int = 0  # `adaptive`'s waves: 0 two (the first, then the rest), > 0 doubling ones (runner.py)


def sampling_seed(s: BenchSettings) -> int:
    return s.seed if s.sampling_seed is None else s.sampling_seed


def method_settings(method: str, s: BenchSettings) -> BranchSettings:
    return {
        "vanilla": BranchSettings(n=1, m=1),
        "self_consistency": BranchSettings(n=s.n, m=s.n),
        "sart": BranchSettings(n=s.n, m=s.m, alpha=s.alpha, beta=s.beta, k=s.k),
        "early_stop_only": BranchSettings(n=s.n, m=s.m),
        "prune_only": BranchSettings(n=s.n, m=s.n, alpha=s.alpha, beta=s.beta, k=s.k),
        "adaptive": BranchSettings(n=s.n, m=s.n, first_wave=s.first_wave, wave_margin=s.wave_margin),
    }[method]


def check_settings(method: str, s: BenchSettings) -> None:
    """`method`'s branch settings from `s`, held to the rules every branch setting is (check_branches): a
    ConfigError naming the flag to change."""
    ran = method_settings(method, s)
    if method == "adaptive" and not ran.first_wave:
        raise ConfigError("`--first-wave` must be from 2 to n - 1 for adaptive: without a first wave it is "
                          "self-consistency")
    try:
        check_branches(ran, _flag)
    except BrokenRule as broken:
        raise ConfigError(f"`{_flag(broken.key)}` {broken.rule} ({method} runs n = {ran.n}, m = {ran.m})") from None


def _flag(key: str) -> str:
    """The `cascade bench branches` flag of a [tiers.branches] setting: `first_wave` -> `--first-wave`."""
    return "--" + key.replace("_", "-")


def decoding(method: str, s: BenchSettings) -> tuple[float, float | None]:
    """(temperature, top_p) that `method`'s requests ask for: vanilla greedy (no top_p), the others `s`'s."""
    return (0.0, None) if method == "vanilla" else (s.temperature, s.top_p)


def run_key(method: str, s: BenchSettings, tier: str = "") -> bytes:
    """What decides a method's run on `tier`: two runs with equal keys replay the same requests the same way
    (self-consistency ignores M, so a sweep over M runs it once per N)."""
    ran = method_settings(method, s)
    # The branch settings under the names, and in the order, the runner's struct had when the first runs were
    # recorded, so that they still resume; a wave only when there is one (keys before the waves existed).
    branch = {"n": ran.n, "m": ran.m, "alpha": ran.alpha, "beta": ran.beta, "prune": method in PRUNING_METHODS,
              "score_every_steps": ran.k, "aggregation": ran.aggregation, "prune_confidence": ran.prune_confidence,
              "confidence_group": ran.confidence_group}
    branch |= {key: getattr(ran, key) for key in ("first_wave", "wave_margin") if getattr(ran, key)}
    key: list[object] = [branch, s.slots or 4 * s.n, s.max_tokens, *decoding(method, s), s.rate, s.seed, tier]
    if s.sampling_seed is not None:  # appended only when set: the keys recorded before it existed stay as they were
        key.append({"sampling_seed": s.sampling_seed})
    return msgspec.json.encode(key)


class RequestRecord(msgspec.Struct, kw_only=True):
    id: str
    correct: bool
    latency_s: float
    queue_s: float
    decode_tokens: int
    launched: int = 0
    finished: int = 0
    pruned: int = 0
    early_stopped: int = 0
    error: str | None = None


async def run_method(
    tier: Tier, method: str, settings: BenchSettings, prompts: list[Prompt], offsets: np.ndarray,
    on_done: Callable[[RequestRecord], None] | None = None,
    on_branches: Callable[[list[dict]], None] | None = None,
) -> list[RequestRecord]:
    """Replay `prompts` at `offsets` (seconds from now) with `method` on `tier`; `on_done` receives each
    request's record and `on_branches` each self-consistency or adaptive request's finished branches as soon as it
    completes (so a long run keeps what it finished if it is stopped)."""
    branch_settings = method_settings(method, settings)
    if method not in PRUNING_METHODS:
        tier = msgspec.structs.replace(tier, scorer=None)  # the runner scores and prunes with a scorer it is given
    slots = BranchSlots(tier.name, settings.slots or 4 * settings.n)
    # The gateway's answer on a tier (cascade/tiers/answer.py), with this method's branch settings and slots.
    temperature, top_p = decoding(method, settings)
    sampling = Sampling(max_tokens=settings.max_tokens, temperature=temperature, top_p=top_p,
                        seed=sampling_seed(settings) * 1000)
    start = time.perf_counter() + 0.05

    async def one(i: int, prompt: Prompt) -> RequestRecord:
        arrival = start + float(offsets[i])
        await asyncio.sleep(max(0.0, arrival - time.perf_counter()))
        admitted = arrival

        def on_admitted() -> None:
            nonlocal admitted
            admitted = time.perf_counter()

        try:
            whole = await answer(tier, [ChatMessage(role="user", content=prompt.prompt)], sampling, branch_settings,
                                 slots=slots, on_admitted=on_admitted)
        except CascadeError as exc:
            record = RequestRecord(id=prompt.id, correct=False, latency_s=time.perf_counter() - arrival,
                                   queue_s=admitted - arrival, decode_tokens=0, error=exc.message)
        else:
            text = whole.results[0].text
            record = RequestRecord(id=prompt.id, correct=grade(text, prompt.reference or ""),
                                   latency_s=time.perf_counter() - arrival, queue_s=admitted - arrival,
                                   decode_tokens=whole.decode_tokens, launched=1, finished=1)
            if whole.reports:
                r = whole.reports[0]
                record = msgspec.structs.replace(record, launched=r.launched, finished=r.finished,
                                                 pruned=r.pruned_phase1 + r.pruned_phase2,
                                                 early_stopped=r.early_stopped)
            if on_branches is not None and method in UNPRUNED_METHODS:
                on_branches(_branch_rows(prompt, whole.runs[0]))
        if on_done is not None:
            on_done(record)
        return record

    return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))


def _branch_rows(prompt: Prompt, run: BranchRun) -> list[dict]:
    return [{"id": prompt.id, "branch": i, "text": text, "correct": grade(text, prompt.reference or ""),
             "state": state}
            for i, (text, state) in enumerate(run.branch_texts) if state == "finished"]


def summarize(records: list[RequestRecord]) -> dict:
    latencies = np.array([r.latency_s for r in records])
    return {
        "requests": len(records),
        "accuracy": round(float(np.mean([r.correct for r in records])), 4),
        "latency_s_mean": round(float(latencies.mean()), 3),
        "latency_s_p95": round(float(np.percentile(latencies, 95)), 3),
        "tokens_mean": round(float(np.mean([r.decode_tokens for r in records])), 1),
        "queue_s_mean": round(float(np.mean([r.queue_s for r in records])), 3),
        "errors": sum(r.error is not None for r in records),
        "branches": {k: int(sum(getattr(r, k) for r in records))
                     for k in ("launched", "finished", "pruned", "early_stopped")},
    }


def arrival_offsets(n: int, rate: float, seed: int) -> np.ndarray:
    return schedule("poisson", rate, np.random.default_rng(seed), n=n)
