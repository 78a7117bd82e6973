"""In-process fakes of the branch seams: a Backend and a Scorer with no engine, no HTTP, no model.

They keep each protocol's promises (a stream that ends has yielded a finish reason; a score is in
[0, 1]) so that code built on a seam can be tested against them, and they are in the contract suites
next to the real implementations (tests/branches/test_backend_contract.py, tests/branches/test_scorer_contract.py),
which is what makes them trustworthy stand-ins. Faults are scripted, not random.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Iterable

import msgspec

from cascade.branches.backend import GenerationRequest, StreamDelta
from cascade.errors import BackendFailed, BackendUnavailable, CascadeError

# A script turns a request into the deltas of its answer. Written as a generator, it can fail
# anywhere in the answer by raising (a BackendError, as an engine's fault would be).
Script = Callable[[GenerationRequest], Iterable[StreamDelta]]


def numbered_tokens(request: GenerationRequest, tokens: int = 16, prompt_tokens: int = 8) -> Iterable[StreamDelta]:
    """`t0 `, `t1 `, ... one delta each, up to `max_tokens` (then finish_reason "length"), as the fake
    engine (cascade/testing/fakes/engine.py) answers; the last delta carries the usage."""
    n = min(tokens, request.max_tokens)
    for i in range(n):
        yield StreamDelta(text=f"t{i} ")
    yield StreamDelta(finish_reason="length" if n < tokens else "stop", prompt_tokens=prompt_tokens,
                      completion_tokens=n, chunks=0)


class FakeBackendStats(msgspec.Struct):
    # Named as the fake engine's /fake/stats, so that a test can read either the same way.
    streams_started: int = 0
    streams_finished: int = 0
    streams_cancelled: int = 0  # closed by the consumer before the answer ended
    streams_failed: int = 0
    in_flight: int = 0


class FakeBackend:
    """A Backend answering from `script`. `up = False` makes it refuse (BackendUnavailable) and fail
    its health check, as an engine that went away; `delay_s` is slept before every delta, so that a
    consumer can be slower or faster than the engine. Reusable after `aclose`, as the HTTP clients."""

    def __init__(self, name: str = "fake", script: Script = numbered_tokens, *, delay_s: float = 0.0,
                 up: bool = True) -> None:
        self.name = name
        self.script = script
        self.delay_s = delay_s
        self.up = up
        self.stats = FakeBackendStats()
        self.requests: list[GenerationRequest] = []

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[StreamDelta, None]:
        if not self.up:
            raise BackendUnavailable(f"backend `{self.name}` is down", self.name)
        self.requests.append(request)
        self.stats.streams_started += 1
        self.stats.in_flight += 1
        finished = False
        try:
            for delta in self.script(request):
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                finished = finished or delta.finish_reason is not None
                # A copy: the consumer may merge later deltas into the one it holds (StreamDelta.absorb).
                yield msgspec.structs.replace(delta)
            if not finished:
                raise BackendFailed(f"backend `{self.name}` ended the stream without a finish reason "
                                    "(the answer is incomplete)", self.name)
            self.stats.streams_finished += 1
        except CascadeError:
            self.stats.streams_failed += 1
            raise
        except (GeneratorExit, asyncio.CancelledError):
            self.stats.streams_cancelled += 1
            raise
        finally:
            self.stats.in_flight -= 1

    async def health(self) -> bool:
        return self.up

    async def aclose(self) -> None:
        return None


class FakeScorer:
    """A Scorer that answers `rule(question, steps)` (clipped to [0, 1]), or raises `fault` when set
    (a BackendError, as an unreachable PRM would). The default rule is deterministic and depends on
    both arguments: more steps score higher, a question the steps never mention lower."""

    def __init__(self, rule: Callable[[str, list[str]], float] | None = None, *, name: str = "fake",
                 fault: CascadeError | None = None) -> None:
        self.name = name
        self.rule = rule or steps_rule
        self.fault = fault
        self.calls: list[tuple[str, list[str]]] = []

    async def score(self, question: str, steps: list[str]) -> float:
        self.calls.append((question, list(steps)))
        if self.fault is not None:
            raise self.fault
        return min(1.0, max(0.0, self.rule(question, steps)))

    async def aclose(self) -> None:
        return None


def steps_rule(question: str, steps: list[str]) -> float:
    """0.5 with no steps, rising towards 1 with every step; halved when no step shares a word with the question."""
    score = 1.0 - 0.5 / (1 + len(steps))
    words = set(question.lower().split())
    if steps and words and not any(words & set(step.lower().split()) for step in steps):
        score /= 2
    return score
