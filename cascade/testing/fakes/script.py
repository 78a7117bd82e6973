"""What the fake engines (engine.py, sglang.py) do for a request: the `FakeScript`, its fault modes, and the
``[fake ...]`` directives that override it per request.

The script can be overridden per request by a directive in the last user message, e.g.
``[fake status=500]`` or ``[fake ttft_ms=50 itl_ms=5 tokens=20 stall_after=3 logprob=-2]``, so that tests can
inject faults through the gateway without any side channel. ``[fake@MODEL ...]`` applies only to
requests for that model (one engine can play every tier of a ladder), and ``[fake@seed=N ...]`` only
to requests with that seed (one engine can play distinct branches). In ``answer=``, ``_`` is a space
and ``|`` a paragraph break (a reasoning step). ``usage=`` takes a JSON object without spaces, e.g.
``[fake usage={"prompt_tokens":-5,"completion_tokens":16}]``: the usage reported instead of the counts (engine.py), an
engine whose count must not reach a bill (negative, fractional, 10^12).

`fault` makes the engine misbehave on the wire the way real upstreams do (one line each; a stream is
a request with ``"stream": true``):

- ``html``: 200 ``text/html``, an HTML error page (a misconfigured proxy), streamed or not.
- ``malformed_sse``: stream: 200 SSE whose events are not JSON (``data: {oops``), then ``data: [DONE]``;
  otherwise 200 ``application/json`` whose body is not JSON.
- ``truncated``: stream: 200 SSE, some tokens, then a clean end of body with no finish_reason and no
  ``[DONE]``; otherwise a 200 completion cut short with ``finish_reason: null``.
- ``stall_first_byte``: reads the request, then sends nothing (not even headers) until the client leaves.
- ``stall_mid``: stream: some tokens, then silence until the client leaves; otherwise as
  ``stall_first_byte``. ("Some tokens": ``stall_after`` if set, else half; also for truncated, kill_mid.)
- ``kill_mid``: stream: some tokens, then the connection is closed without the chunked terminator;
  otherwise headers announcing more bytes than are sent, then the close. (The app raises after
  `http.response.start`; uvicorn then closes the transport. httpx reports `RemoteProtocolError`.)

Bytes that are not HTTP cannot come from an ASGI app: cascade/testing/fakes/garbage.py serves those.
"""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec

# No `[` inside a directive: a scan for its `]` stops at the next `[`, so many unclosed `[fake ` cost linear time.
_DIRECTIVE = re.compile(r"\[fake(?:@([^\s\[\]]+))? ([^\[\]]*)\]")
FAULTS = ("", "html", "malformed_sse", "truncated", "stall_first_byte", "stall_mid", "kill_mid")


class FakeScript(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    ttft_ms: float = 0.0
    itl_ms: float = 0.0
    tokens: int = 16
    status: int = 200  # non-200: reply with an OpenAI error object and this status
    stall_after: int = -1  # >= 0: send this many tokens, then hang (slow/stuck stream)
    answer: str = ""  # text to produce instead of numbered tokens
    model: str = "fake-model"
    fault: str = ""  # one of FAULTS (see the module docstring)
    # Each token's log-probability, sent when the request asks for `logprobs` (a real engine's are per token;
    # one value per script is enough to make an answer, or one branch with `[fake@seed=N logprob=-3]`, unsure).
    logprob: float = -0.05
    # The `usage` object to report instead of the counts (None: the counts), sent as given: a lying or broken engine.
    usage: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            raise ValueError(f"fault must be one of {', '.join(repr(f) for f in FAULTS)}, got {self.fault!r}")
        if not 100 <= self.status <= 599 or self.tokens < 0 or self.logprob > 0:
            raise ValueError("status must be in [100, 599], tokens >= 0 and logprob <= 0")


def script_for(base: FakeScript, body: dict[str, Any]) -> FakeScript:
    messages = body.get("messages") or []
    text = ""
    if messages and isinstance(messages[-1], dict):
        content = messages[-1].get("content")
        text = content if isinstance(content, str) else ""
    overrides: dict[str, Any] = {}
    # Unscoped directives first, so that a model-scoped one overrides them for its model.
    for model, items in sorted(_DIRECTIVE.findall(text), key=lambda d: bool(d[0])):
        if model and model != body.get("model") and model != f"seed={body.get('seed')}":
            continue
        for item in items.split():
            key, _, value = item.partition("=")
            if key in ("ttft_ms", "itl_ms", "logprob"):
                overrides[key] = float(value)
            elif key in ("tokens", "status", "stall_after"):
                overrides[key] = int(value)
            elif key == "answer":
                overrides[key] = value.replace("_", " ").replace("|", "\n\n")
            elif key == "fault":
                overrides[key] = value
            elif key == "usage":
                overrides[key] = _usage(value)
    return msgspec.structs.replace(base, **overrides)  # ValueError: a bad value (e.g. an unknown fault)


def _usage(value: str) -> dict[str, Any]:
    try:
        usage = msgspec.json.decode(value)
    except msgspec.DecodeError:
        usage = None
    if not isinstance(usage, dict):
        raise ValueError(f"usage must be a JSON object without spaces, got {value!r}")
    return usage


def token_pieces(script: FakeScript, max_tokens: int) -> list[str]:
    if script.answer:
        words = script.answer.split(" ")
        return [w if i == 0 else " " + w for i, w in enumerate(words)][:max_tokens]
    return [f"t{i} " for i in range(min(script.tokens, max_tokens))]


def logprob_entries(script: FakeScript, pieces: list[str], top: object = 0) -> list[dict[str, Any]]:
    """The `logprobs.content` entries of `pieces`, as OpenAI-compatible engines send them; `top` (the request's
    `top_logprobs`) candidates each: the sampled token, then runners-up sharing the rest of the probability evenly
    (so DeepConf's token confidence, the negative mean of the top logprobs, is higher for a surer token)."""
    k = min(top, 20) if isinstance(top, int) and not isinstance(top, bool) and top > 0 else 0
    rest = math.log(max(1e-12, -math.expm1(script.logprob)) / (k - 1)) if k > 1 else 0.0
    return [{"token": p, "logprob": script.logprob, "bytes": list(p.encode()),
             "top_logprobs": [{"token": p, "logprob": script.logprob, "bytes": list(p.encode())},
                              *({"token": f"<alt{j}>", "logprob": rest, "bytes": []} for j in range(1, k))][:k]}
            for p in pieces]


def batch_itl_ms(itl_ms: float, batch: int, slope: float) -> float:
    """One stream's time between tokens while `batch` streams decode together: `itl_ms` x (1 + `slope` x (batch - 1)).
    A decode step reads the weights once for the whole batch but its attention and sampling grow with it, so a
    real engine's per-token latency rises with its batch (slope 0: flat, the scripted `itl_ms` at any batch)."""
    return itl_ms * (1.0 + slope * max(0, batch - 1))


def tokens_before_break(script: FakeScript, pieces: list[str]) -> int:
    """How many tokens a truncated, stalled or killed response sends before it breaks."""
    return min(len(pieces), script.stall_after if script.stall_after >= 0 else len(pieces) // 2)
