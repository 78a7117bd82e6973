"""A process reward model served by SGLang: Qwen2.5-Math-PRM-style step rewards for partial branches.

What goes over the wire (tests/fixtures/sglang/README.md, "PRM scorer", has the sources):

- `POST /classify` (SGLang's "reward model" route; same handler and body as `/encode`) with
  `{"model": ..., "text": <str or list of str>}`. `text` is the model card's chat rendering of
  (system, question, steps), every step followed by `<extra_0>`, cut right after the last marker.
- SGLang answers `{"embedding": [...], "meta_info": {...}}` per input (a list of them for a list).
  A process-reward head (`Qwen2ForProcessRewardModel`) pools the LAST token and returns the softmax
  probability of the positive class there: `embedding == [P(positive)]`. Because the text ends on a
  marker, that is the reward of the last step, exactly as the model card reads it (the hidden state at
  a marker depends only on the tokens before it, so cutting the text there changes nothing).
- Upstream SGLang has no such head (its `qwen2_rm.py` serves only the outcome model
  `Qwen2ForRewardModel`, one unbounded scalar): the server must be an SGLang build that registers a
  PRM class, launched with `--is-embedding`. Anything but one value in [0, 1] per input is refused
  as `BackendFailed` rather than silently read as a reward.

Aggregation of a partial branch's step rewards (`aggregate`):

- "last" (default): the reward at the newest step marker. One text per call.
- "min" / "mean": over the rewards at every marker. SGLang pools one position per input, so these send
  one prefix per step (a list of k texts, k = number of steps): k forward passes instead of one.

Why "last" is the default: how SART aggregates a partial branch's step rewards is NOT recovered
(../shared/PAPERS.md §2.5), so this is our choice, not the paper's. The PRM is causal: its reward at
the newest marker is computed over the whole prefix, so it can already account for an earlier wrong
step (how well it does is the PRM's quality, not something this module assumes); it is on the same
[0, 1] scale as the reward of a finished branch (SART's α′); and it is the only reading that
costs one forward pass per call. Whether min or mean prunes better is an empirical question
(benchmarks, not this module).

Faults are always `BackendError`s (the branch runner treats those as "no score" and never fails the
request): unreachable -> BackendUnavailable (the URL is in the message), no answer within the deadline
-> BackendTimeout, any other status or an unreadable body -> BackendFailed; 429/503 (overloaded,
warming up) -> BackendUnavailable. A 400 from SGLang (e.g. a prompt past the context length, or a
server launched without `--is-embedding`) is the PRM's fault here, not the client's: BackendFailed.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Literal

import aiohttp
import msgspec

from cascade.branches.openai_client import make_session, read_capped, split_credentials
from cascade.branches.openai_wire import error_message
from cascade.config import PRM_TIMEOUTS, PRMScorerConfig, Timeouts
from cascade.errors import BackendError, BackendFailed, BackendTimeout, BackendUnavailable, ConfigError

log = logging.getLogger("cascade.backend")
Aggregate = Literal["last", "min", "mean"]
AGGREGATES: tuple[Aggregate, ...] = ("last", "min", "mean")
__all__ = ["PRMScorerConfig", "SGLangPRMScorer", "prm_input"]
STEP_MARKER = "<extra_0>"
# The model card's system prompt (a literal backslash before "boxed").
SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
NEUTRAL_SCORE = 0.5
DEFAULT_PRM_TIMEOUTS = PRM_TIMEOUTS


class _Output(msgspec.Struct):
    embedding: list[float]


_decode_outputs = msgspec.json.Decoder(_Output | list[_Output]).decode
_encode = msgspec.json.Encoder().encode


def _clean(text: str) -> str:
    # A marker inside the text would be read by the PRM as an extra step boundary.
    return text.replace(STEP_MARKER, "")


def prm_input(question: str, steps: list[str], system: str = SYSTEM_PROMPT) -> str:
    """The Qwen2.5-Math-PRM input for `steps` so far, ending right after the last step's marker.

    It is the model card's `apply_chat_template([system, user: question, assistant: "<extra_0>".join(steps)
    + "<extra_0>"])` without the trailing `<|im_end|>\\n`, so that SGLang's LAST pooling reads the marker.
    """
    response = "".join(f"{_clean(step)}{STEP_MARKER}" for step in steps)
    return (f"<|im_start|>system\n{system}<|im_end|>\n"
            f"<|im_start|>user\n{_clean(question)}<|im_end|>\n"
            f"<|im_start|>assistant\n{response}")


class SGLangPRMScorer:
    """`Scorer` over an SGLang PRM. Safe to share between tasks; one keep-alive session, made lazily."""

    def __init__(
        self,
        url: str,
        model: str,
        timeouts: Timeouts = DEFAULT_PRM_TIMEOUTS,
        *,
        aggregate: str = "last",
        name: str = "prm",
        api_key: str = "",
        system_prompt: str = SYSTEM_PROMPT,
        path: str = "/classify",
    ) -> None:
        if aggregate not in AGGREGATES:
            raise ConfigError(f"PRM scorer `aggregate` must be one of {', '.join(AGGREGATES)}, not `{aggregate}`")
        self.name = name
        # As the chat backends: `user:pass@` in the URL is sent as Basic auth and never shown.
        self.url, basic = split_credentials(url.rstrip("/"))
        self.model = model
        self.timeouts = timeouts
        self.aggregate = aggregate
        self.system_prompt = system_prompt
        self.endpoint = f"{self.url}{path}"
        self.deadline_s = min(timeouts.read_s, timeouts.total_s)
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        elif basic:
            self._headers["Authorization"] = f"Basic {basic}"
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_config(cls, config: PRMScorerConfig, name: str = "prm") -> SGLangPRMScorer:
        return cls(config.url, config.model, config.timeouts, aggregate=config.aggregate, name=name,
                   api_key=config.api_key)

    @property
    def session(self) -> aiohttp.ClientSession:
        # Created on first use: an aiohttp session belongs to the loop that runs it.
        if self._session is None or self._session.closed:
            self._session = make_session(self.timeouts, max_connections=256)
        return self._session

    @property
    def holds_session(self) -> bool:
        """Whether the scorer holds its keep-alive session: made by the first call that posts, shared by every
        call after it, dropped by `aclose`."""
        return self._session is not None

    def texts(self, question: str, steps: list[str]) -> list[str]:
        """The inputs one `score` call sends: the whole branch, or one prefix per step for min/mean."""
        steps = [step.strip() for step in steps if step.strip()]
        if not steps:
            return []
        if self.aggregate == "last":
            return [prm_input(question, steps, self.system_prompt)]
        return [prm_input(question, steps[:end], self.system_prompt) for end in range(1, len(steps) + 1)]

    async def step_rewards(self, question: str, steps: list[str]) -> list[float]:
        """The PRM's reward at each marker sent (only the last one when aggregate is "last")."""
        texts = self.texts(question, steps)
        if not texts:
            return []
        # A single input goes as a string: SGLang's own warm-up avoids one-element lists for embedding
        # models ("embedding errors for list of size 1"), and a string gets a single object back.
        body = _encode({"model": self.model, "text": texts[0] if len(texts) == 1 else texts})
        content = await self._post(body)
        try:
            decoded = _decode_outputs(content)
        except msgspec.DecodeError as exc:
            raise self._failed(f"sent an unreadable response ({exc})") from None
        outputs = decoded if isinstance(decoded, list) else [decoded]
        if len(outputs) != len(texts):
            raise self._failed(f"answered {len(outputs)} outputs for {len(texts)} inputs")
        return [self._reward(output.embedding) for output in outputs]

    async def score(self, question: str, steps: list[str]) -> float:
        rewards = await self.step_rewards(question, steps)
        if not rewards:
            return NEUTRAL_SCORE  # nothing to judge yet: neither prune nor favour the branch
        if self.aggregate == "min":
            return min(rewards)
        if self.aggregate == "mean":
            return math.fsum(rewards) / len(rewards)
        return rewards[-1]

    async def health(self) -> bool:
        """SGLang's /health (a one-input probe on embedding servers; 503 while warming up)."""
        try:
            async with asyncio.timeout(self.deadline_s):
                async with self.session.get(f"{self.url}/health", headers=self._headers) as response:
                    await read_capped(response)
                    return response.status == 200
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _post(self, body: bytes) -> bytes:
        try:
            async with asyncio.timeout(self.deadline_s):
                async with self.session.post(self.endpoint, data=body, headers=self._headers) as response:
                    status, content = response.status, await read_capped(response)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise self._translate(exc) from None
        except ValueError as exc:
            raise self._failed(f"answered with {exc}") from None
        if status == 200:
            return content
        detail = error_message(content)
        if status in (429, 503):
            log.warning("PRM %s at %s is unavailable (%d): %s", self.name, self.endpoint, status, detail)
            raise BackendUnavailable(f"PRM `{self.name}` is unavailable ({status}): {detail}", self.name)
        raise self._failed(f"returned HTTP {status}: {detail}")

    def _reward(self, embedding: list[float]) -> float:
        if len(embedding) == 1 and 0.0 <= embedding[0] <= 1.0:
            return embedding[0]
        shown = ", ".join(f"{value:g}" for value in embedding[:4]) + (", ..." if len(embedding) > 4 else "")
        raise self._failed(
            f"returned `embedding` [{shown}]; a process reward model returns one P(positive) in [0, 1] per "
            "input (is the server running a PRM head, not an outcome reward or embedding model?)")

    def _failed(self, what: str) -> BackendFailed:
        # Its URL in the log only: the message may end up in an OpenAI error body, sent to a client.
        log.warning("PRM %s at %s %s", self.name, self.endpoint, what)
        return BackendFailed(f"PRM `{self.name}` {what}", self.name)

    def _translate(self, exc: BaseException) -> BackendError:
        kind = type(exc).__name__
        if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError):
            log.warning("PRM %s at %s is unreachable: %s", self.name, self.url, exc)
            return BackendUnavailable(f"PRM `{self.name}` is unreachable ({kind})", self.name)
        if isinstance(exc, TimeoutError):
            return BackendTimeout(
                f"PRM `{self.name}` did not answer within {self.deadline_s:g} s ({kind})",
                self.name)
        if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
            return self._failed("closed the connection mid-response")
        log.warning("PRM %s at %s failed: %s: %s", self.name, self.endpoint, kind, exc)  # aiohttp's text names the URL
        return BackendFailed(f"PRM `{self.name}` failed ({kind})", self.name)
