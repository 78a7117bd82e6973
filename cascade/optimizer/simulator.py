"""Discrete-event simulator of one continuously-batching replica (SGLang-like), seeded.

Requests arrive (Poisson, or any given times), wait FCFS, and are admitted at iteration boundaries
while the batch has room and the KV cache can hold prompt + output (the simulator knows each
request's output length, so admission never has to retract). An iteration is either a prefill of
the newly admitted prompts (which also yields their first token) or one decode step of the whole
batch. Between two events (an arrival, a completion) the batch is fixed and the decode step cost
is piecewise affine in the growing context, so all the steps in between are summed in closed form:
the cost of a run is O(events), not O(tokens).

With `max_batch=1`, deterministic lengths and Poisson arrivals this is an M/D/1 queue;
tests/optimizer/test_simulator.py checks it against the closed form.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

import msgspec
import numpy as np

from cascade.optimizer.roofline import StepCost


class SimResult(msgspec.Struct, frozen=True):
    latency_s: np.ndarray  # end-to-end (arrival to last token), per request, in input order
    ttft_s: np.ndarray
    stable: bool  # False: the queue was still growing at the end (arrival rate above capacity)

    def percentile(self, q: float, warmup: float = 0.1) -> float:
        """The q-th percentile latency, skipping the first `warmup` share (the system starts empty)."""
        if not self.stable:
            return math.inf
        start = int(len(self.latency_s) * warmup)
        return float(np.percentile(self.latency_s[start:], q))


def _series(a: float, b: float, j0: int, j1: int) -> float:
    """sum_{j=j0}^{j1-1} (a + b*j)."""
    n = j1 - j0
    return n * a + b * (j1 * (j1 - 1) - j0 * (j0 - 1)) / 2 if n > 0 else 0.0


def decode_steps_time(coeffs: tuple[float, float, float, float, float], c0: float, dc: float, k: int) -> float:
    """Time of k decode steps at fixed batch: step j has context c0 + j*dc, cost max(u_j, v_j) + g."""
    a1, b1, a2, b2, g = coeffs
    u0, du, v0, dv = a1 + b1 * c0, b1 * dc, a2 + b2 * c0, b2 * dc
    if du == dv:
        return k * (max(u0, v0) + g) + du * k * (k - 1) / 2
    # u_j >= v_j from j* on when du > dv (before it when du < dv): split the sum there.
    cross = min(k, max(0, math.ceil((v0 - u0) / (du - dv))))
    if du > dv:
        return _series(v0, dv, 0, cross) + _series(u0, du, cross, k) + k * g
    return _series(u0, du, 0, cross) + _series(v0, dv, cross, k) + k * g


def _first_reaching(a: float, b: float, budget: float) -> int:
    """Smallest k >= 1 with k*a + b*k*(k-1)/2 >= budget, for a > 0 and b >= 0."""
    if b <= 0.0:
        k = math.ceil(budget / a)
    else:  # root of b/2 k^2 + (a - b/2) k - budget
        half = a - b / 2
        k = math.ceil((-half + math.sqrt(half * half + 2 * b * budget)) / b)
    k = max(1, k)
    # Guard the float rounding of the root by one step either way.
    if k > 1 and (k - 1) * a + b * (k - 1) * (k - 2) / 2 >= budget:
        k -= 1
    elif k * a + b * k * (k - 1) / 2 < budget:
        k += 1
    return k


def _steps_until(coeffs: tuple[float, float, float, float, float], c0: float, dc: float,
                 budget: float, k_max: int) -> int:
    """Fewest steps (<= k_max) whose total time reaches `budget` (k_max if never)."""
    a1, b1, a2, b2, g = coeffs
    u0, du, v0, dv = a1 + b1 * c0, b1 * dc, a2 + b2 * c0, b2 * dc
    if du == dv:
        return min(k_max, _first_reaching(max(u0, v0) + g, du, budget))
    cross = min(k_max, max(0, math.ceil((v0 - u0) / (du - dv))))
    # Before `cross` one line dominates, after it the other.
    (s0, ds), (t0, dt) = ((v0, dv), (u0, du)) if du > dv else ((u0, du), (v0, dv))
    head = _series(s0, ds, 0, cross) + cross * g
    if cross > 0 and head >= budget:
        return _first_reaching(s0 + g, ds, budget)
    # After the crossing: steps j = cross + i cost (t0 + dt*cross + g) + dt*i.
    return min(k_max, cross + _first_reaching(t0 + dt * cross + g, dt, budget - head))


class WarmBatch(msgspec.Struct, frozen=True):
    """Requests already decoding at time 0 (so a short run starts near steady state); their own
    latencies are not reported."""

    input_tokens: list[int]
    output_tokens: list[int]
    done_tokens: list[int]  # tokens already generated, 1 <= done < output


def simulate(cost: StepCost, arrivals: np.ndarray, input_tokens: np.ndarray, output_tokens: np.ndarray, *,
             kv_capacity_tokens: int, max_batch: int = 256, max_prefill_tokens: int = 16384,
             warm: WarmBatch | None = None) -> SimResult:
    """Run the replica over requests sorted by arrival time; returns per-request latencies."""
    n = len(arrivals)
    warm = warm or WarmBatch(input_tokens=[], output_tokens=[], done_tokens=[])
    arr = arrivals.tolist()
    p = [int(x) for x in input_tokens.tolist()] + warm.input_tokens
    o = [max(1, int(x)) for x in output_tokens.tolist()] + warm.output_tokens
    need = [a + b for a, b in zip(p, o, strict=True)]
    if need and max(need) > kv_capacity_tokens:
        raise ValueError(f"a request needs {max(need)} KV tokens; the replica holds {kv_capacity_tokens}")
    finish = [0.0] * n
    first = [0.0] * n
    t, steps, nxt, done = 0.0, 0, 0, 0
    waiting: deque[int] = deque()
    running: list[tuple[int, int]] = []  # (decode-step count at which it finishes, request)
    start_step = [0] * len(p)
    kv_used, context_base = 0, 0  # context of the batch = context_base + batch * steps
    for w, done_w in enumerate(warm.done_tokens):
        # As if admitted at step 1 - done: same bookkeeping as a request admitted normally.
        j = n + w
        start_step[j] = 1 - done_w
        kv_used += need[j]
        context_base += p[j] + done_w
        heapq.heappush(running, (o[j] - done_w, j))
    queue_at_last_arrival = 0
    while done < n:
        while nxt < n and arr[nxt] <= t:
            waiting.append(nxt)
            nxt += 1
            if nxt == n:
                queue_at_last_arrival = len(waiting)
        # Admission: FCFS while the batch, the KV cache and the prefill budget allow.
        admitted: list[int] = []
        tokens = 0
        while waiting and len(running) + len(admitted) < max_batch:
            j = waiting[0]
            if kv_used + need[j] > kv_capacity_tokens or (admitted and tokens + p[j] > max_prefill_tokens):
                break
            admitted.append(waiting.popleft())
            kv_used += need[j]
            tokens += p[j]
        if admitted:
            t += cost.prefill_time(tokens, float(sum(p[j] * p[j] for j in admitted)), len(admitted))
            for j in admitted:
                first[j] = t
                if o[j] == 1:
                    finish[j], done, kv_used = t, done + 1, kv_used - need[j]
                    continue
                start_step[j] = steps
                context_base += p[j] + 1 - steps
                heapq.heappush(running, (steps + o[j] - 1, j))
            continue
        if not running:
            t = max(t, arr[nxt])  # idle until the next arrival
            continue
        batch = len(running)
        coeffs = cost.decode_coeffs(batch)
        k = running[0][0] - steps
        c0 = context_base + batch * steps
        if nxt < n and not waiting:
            # Stop at the step during which the next request arrives: it joins at the boundary.
            k = _steps_until(coeffs, c0, batch, arr[nxt] - t, k)
        t += decode_steps_time(coeffs, c0, batch, k)
        steps += k
        while running and running[0][0] <= steps:
            _, j = heapq.heappop(running)
            kv_used -= need[j]
            context_base -= p[j] + 1 - start_step[j]
            if j < n:
                finish[j], done = t, done + 1
    latency = np.asarray(finish) - arrivals
    # Overload shows as a backlog when the last request arrives; a stable queue rarely holds
    # more than a few percent of all requests at that moment.
    stable = queue_at_last_arrival <= max(4, 0.1 * n)
    return SimResult(latency_s=latency, ttft_s=np.asarray(first) - arrivals, stable=stable)


def fan_out(arrivals: np.ndarray, input_tokens: np.ndarray, output_tokens: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Requests as the sequences an engine runs: with `output_tokens` of shape (requests, N), each
    request's branches (lengths > 0) arrive with it and share its prompt. Returns per-sequence arrivals,
    prompt and output lengths, and the index of each request's first sequence (1-D: the requests)."""
    if output_tokens.ndim == 1:
        return arrivals, input_tokens, output_tokens, np.arange(len(arrivals))
    live = output_tokens > 0
    if not live.any(axis=1).all():
        raise ValueError("every request needs at least one branch with a positive length")
    per_request = live.sum(axis=1)
    starts = np.concatenate([[0], np.cumsum(per_request)[:-1]])
    return (np.repeat(arrivals, per_request), np.repeat(input_tokens, per_request), output_tokens[live],
            starts)


def simulate_branches(cost: StepCost, arrivals: np.ndarray, input_tokens: np.ndarray, output_tokens: np.ndarray, *,
                      kv_capacity_tokens: int, max_batch: int = 256, max_prefill_tokens: int = 16384,
                      warm: WarmBatch | None = None) -> SimResult:
    """`simulate` per request: with branches (`output_tokens` (requests, N), the lengths each branch decodes),
    a request's latency is its last branch's and its first token its first branch's. Each branch holds its
    own copy of the prompt in the KV cache (no prefix sharing: conservative for SGLang's radix cache)."""
    limits = dict(kv_capacity_tokens=kv_capacity_tokens, max_batch=max_batch, max_prefill_tokens=max_prefill_tokens)
    seq_arrivals, seq_inputs, seq_outputs, starts = fan_out(arrivals, input_tokens, output_tokens)
    result = simulate(cost, seq_arrivals, seq_inputs, seq_outputs, **limits, warm=warm)
    if output_tokens.ndim == 1:
        return result
    return SimResult(latency_s=np.maximum.reduceat(result.latency_s, starts),
                     ttft_s=np.minimum.reduceat(result.ttft_s, starts), stable=result.stable)


WAVE_ITERATIONS = 8  # runs of the replica to settle when second waves arrive (they move by < 1 ms after 3-4)
WAVE_SETTLED_S = 1e-3


def simulate_waves(cost: StepCost, arrivals: np.ndarray, input_tokens: np.ndarray, output_tokens: np.ndarray, *,
                   first_wave: int, kv_capacity_tokens: int, max_batch: int = 256, max_prefill_tokens: int = 16384,
                   warm: WarmBatch | None = None) -> SimResult:
    """Adaptive consistency's two waves (cascade/branches/runner.py, `first_wave`): a request's first `first_wave`
    branches (`output_tokens` (requests, N)) arrive with it; its other branches, those with a length > 0 (0: never
    launched, because the first wave agreed), arrive when the last branch of its first wave finished. A second
    wave's arrival depends on when the first wave ends, which the second waves' own load delays, so the replica is
    run again with the second waves at the first waves' last finish times until those move by less than
    WAVE_SETTLED_S (at most WAVE_ITERATIONS runs; the first run has no second waves). Latency: to the last branch
    of the last wave; first token: the first wave's."""
    limits = dict(kv_capacity_tokens=kv_capacity_tokens, max_batch=max_batch, max_prefill_tokens=max_prefill_tokens)
    first, later = output_tokens[:, :first_wave], output_tokens[:, first_wave:]
    second = np.flatnonzero((later > 0).any(axis=1))
    width = max(first.shape[1], later.shape[1])
    waves = np.zeros((len(arrivals) + len(second), width), dtype=output_tokens.dtype)
    waves[:len(arrivals), :first.shape[1]] = first
    waves[len(arrivals):, :later.shape[1]] = later[second]
    inputs = np.concatenate([input_tokens, input_tokens[second]])
    result = simulate_branches(cost, arrivals, input_tokens, first, **limits, warm=warm)
    first_done = arrivals + result.latency_s
    latency = result.latency_s.copy()
    for _ in range(WAVE_ITERATIONS if len(second) else 0):
        starts = np.concatenate([arrivals, first_done[second]])
        order = np.argsort(starts, kind="stable")
        run = simulate_branches(cost, starts[order], inputs[order], waves[order], **limits, warm=warm)
        ends = np.empty(len(starts))
        ends[order] = starts[order] + run.latency_s
        ttft = np.empty(len(starts))
        ttft[order] = run.ttft_s
        moved = float(np.max(np.abs(ends[:len(arrivals)] - first_done), initial=0.0))
        first_done = ends[:len(arrivals)]
        latency = first_done - arrivals
        latency[second] = ends[len(arrivals):] - arrivals[second]
        result = SimResult(latency_s=latency, ttft_s=ttft[:len(arrivals)], stable=run.stable)
        if moved < WAVE_SETTLED_S:
            break
    return SimResult(latency_s=latency, ttft_s=result.ttft_s, stable=result.stable)


def simulate_tier(cost: StepCost, arrivals: np.ndarray, input_tokens: np.ndarray, output_tokens: np.ndarray, *,
                  kv_capacity_tokens: int, max_batch: int = 256, max_prefill_tokens: int = 16384, first_wave: int = 0,
                  warm: WarmBatch | None = None) -> SimResult:
    """A tier's requests as its engine runs them: in two waves where the tier has a first wave and its requests have
    more branches than it (`simulate_waves`), else every branch with its request (`simulate_branches`)."""
    limits = dict(kv_capacity_tokens=kv_capacity_tokens, max_batch=max_batch, max_prefill_tokens=max_prefill_tokens)
    if first_wave and output_tokens.ndim == 2 and first_wave < output_tokens.shape[1]:
        return simulate_waves(cost, arrivals, input_tokens, output_tokens, first_wave=first_wave, **limits, warm=warm)
    return simulate_branches(cost, arrivals, input_tokens, output_tokens, **limits, warm=warm)


def steady_batch(cost: StepCost, rate_rps: float, input_tokens: np.ndarray, output_tokens: np.ndarray,
                 max_batch: int, rng: np.random.Generator) -> WarmBatch:
    """A batch as Little's law expects it at this rate: B = rate * (time a request spends decoding),
    with step times at batch B (fixed point). Members are length-biased (long requests are more
    likely to be in flight) and part-way through, uniformly."""
    mean_p, mean_o = float(np.mean(input_tokens)), float(np.mean(output_tokens))
    batch = 1.0
    for _ in range(50):
        b = max(1, min(max_batch, round(batch)))
        a1, b1, a2, b2, g = cost.decode_coeffs(b)
        context = b * (mean_p + mean_o / 2)
        step = max(a1 + b1 * context, a2 + b2 * context) + g
        new = min(float(max_batch), rate_rps * mean_o * step)
        if abs(new - batch) < 0.5:
            break
        batch = new
    size = max(0, min(max_batch, round(batch)))
    weights = output_tokens.astype(float) / output_tokens.sum()
    rows = rng.choice(len(output_tokens), size=size, p=weights)
    outs = [max(2, int(x)) for x in output_tokens[rows]]
    done = [int(rng.integers(1, x)) for x in outs]
    return WarmBatch(input_tokens=[int(x) for x in input_tokens[rows]], output_tokens=outs, done_tokens=done)


def poisson_arrivals(rate_rps: float, unit_gaps: np.ndarray) -> np.ndarray:
    """Arrival times from unit-rate exponential gaps: the same gaps at every rate (common random
    numbers) make latency curves over rates and shapes smooth and comparable."""
    return np.cumsum(unit_gaps) / rate_rps


def replica_percentile(cost: StepCost, rate_rps: float, input_tokens: np.ndarray, output_tokens: np.ndarray,
                       unit_gaps: np.ndarray, *, kv_capacity_tokens: int, max_batch: int, max_prefill_tokens: int,
                       percentile: float = 95.0, seed: int = 0, first_wave: int = 0) -> float:
    """The latency percentile of one replica at a Poisson rate, started from a steady-state batch
    (inf when overloaded)."""
    if rate_rps <= 0:
        raise ValueError("rate_rps must be > 0")
    # The warm batch holds sequences: with branches, every branch of a request is one.
    _, seq_inputs, seq_outputs, _ = fan_out(np.zeros(len(input_tokens)), input_tokens, output_tokens)
    seq_rate = rate_rps * len(seq_outputs) / len(input_tokens)
    warm = steady_batch(cost, seq_rate, seq_inputs, seq_outputs, max_batch, np.random.default_rng(seed))
    while sum(warm.input_tokens) + sum(warm.output_tokens) > kv_capacity_tokens and warm.output_tokens:
        warm = WarmBatch(input_tokens=warm.input_tokens[:-1], output_tokens=warm.output_tokens[:-1],
                         done_tokens=warm.done_tokens[:-1])
    result = simulate_tier(cost, poisson_arrivals(rate_rps, unit_gaps), input_tokens, output_tokens,
                           kv_capacity_tokens=kv_capacity_tokens, max_batch=max_batch,
                           max_prefill_tokens=max_prefill_tokens, first_wave=first_wave, warm=warm)
    return result.percentile(percentile)


def saturation_rps(cost: StepCost, input_tokens: np.ndarray, output_tokens: np.ndarray, *,
                   kv_capacity_tokens: int, max_batch: int, max_prefill_tokens: int, first_wave: int = 0) -> float:
    """Requests/s with every request queued at time 0 (a full batch all along): the capacity."""
    n = len(input_tokens)
    result = simulate_tier(cost, np.zeros(n), input_tokens, output_tokens, kv_capacity_tokens=kv_capacity_tokens,
                           max_batch=max_batch, max_prefill_tokens=max_prefill_tokens, first_wave=first_wave)
    # Measure over the first 80% of completions: the tail drains a shrinking batch.
    finish = np.sort(result.latency_s)
    return 0.8 * n / float(finish[int(0.8 * n) - 1])


def unloaded_percentile(cost: StepCost, input_tokens: np.ndarray, output_tokens: np.ndarray,
                        percentile: float = 95.0, first_wave: int = 0) -> float:
    """The latency percentile when every request runs alone (no queueing; its branches, if any, together, or in
    their two waves)."""
    if output_tokens.ndim == 2:
        alone_branches = [simulate_tier(cost, np.zeros(1), input_tokens[i:i + 1], output_tokens[i:i + 1],
                                        kv_capacity_tokens=10**12, max_batch=10**6, max_prefill_tokens=10**12,
                                        first_wave=first_wave).latency_s[0]
                          for i in range(len(input_tokens))]
        return float(np.percentile(alone_branches, percentile))
    coeffs = cost.decode_coeffs(1)
    alone = [cost.prefill_time(int(pi), float(pi) ** 2, 1) + decode_steps_time(coeffs, pi + 1, 1, max(0, int(oi) - 1))
             for pi, oi in zip(input_tokens.tolist(), output_tokens.tolist(), strict=True)]
    return float(np.percentile(alone, percentile))


def workload_sample(rng: np.random.Generator, input_tokens: np.ndarray, output_tokens: np.ndarray,
                    n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n requests from a tier's observed lengths, plus unit gaps. Stratified, not bootstrapped:
    every observed request appears n // m or n // m + 1 times (in random order), so two nearly
    equal request mixes give nearly equal samples and their latency curves differ by the mix, not
    by sampling noise (a p95 rests on the longest few percent of requests)."""
    if len(input_tokens) == 0:
        raise ValueError("no requests to sample lengths from")
    rows = rng.permutation(np.resize(rng.permutation(len(input_tokens)), n))
    return input_tokens[rows], output_tokens[rows], rng.exponential(1.0, size=n)
