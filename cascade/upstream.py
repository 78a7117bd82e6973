"""What one answer sends upstream: a template request turned into one GenerationRequest per choice and
branch, each with its own seed and its own request id. Every caller that sends a tier's answer upstream
(the gateway, `cascade label`, `cascade bench`, through cascade/answer.py) gets its requests here, so
that the rules below hold everywhere.

Seeds (distinct samples, reproducible: `cascade label` labels exactly what the gateway serves):

* choice `c` of a single-branch answer sends `seed + c` (no seed: the engine picks);
* branch `b` of choice `c`, with `n` branches per choice, sends `base + c * n + b`, where `base` is the
  request's seed or a random one (branches must differ even when the client gave no seed).

Request ids (SGLang's `rid`): ``<base>-c<choice>-b<branch>``, e.g. ``cascade-3f2a...e1-c01-b07``,
readable in SGLang's logs. SGLang needs them distinct and prefix-free (srt/managers/tokenizer_manager.py):

* a rid already in flight is refused, ``400 Duplicate request ID detected: <rid>``;
* ``/abort_request`` aborts every request in flight whose rid *starts with* the given one (and so does
  SGLang's own abort of a request whose client went away).

Prefix-free by construction: `base` is ``cascade-`` and the 32 hex digits of a fresh uuid4 per answer,
and one answer pads its choice and branch numbers to widths fixed by its own counts, so all its rids have
the same length; two distinct strings of the same length are never prefixes of one another. Two answers'
rids differ within their bases. The bare base is never sent.
"""

from __future__ import annotations

import secrets
import uuid

import msgspec

from cascade.branches.backend import GenerationRequest

RID_PREFIX = "cascade-"
_MIN_WIDTH = 2  # `c00-b07`: aligned in logs for the usual counts, wider only when a count needs it


def new_base() -> str:
    """A fresh request-id base for one answer (its template's `request_id`)."""
    return f"{RID_PREFIX}{uuid.uuid4().hex}"


def rid(base: str, choice: int, branch: int, choices: int, branches: int) -> str:
    """The request id of `branch` of `choice`, in an answer of `choices` x `branches` upstream requests."""
    if not (0 <= choice < choices and 0 <= branch < branches):
        raise ValueError(f"choice {choice} / branch {branch} outside {choices} x {branches}")
    return f"{base}-c{choice:0{_width(choices)}d}-b{branch:0{_width(branches)}d}"


def _width(count: int) -> int:
    return max(_MIN_WIDTH, len(str(count - 1)))


def choice_requests(template: GenerationRequest, choices: int) -> list[GenerationRequest]:
    """A single-branch answer's upstream requests: one per choice."""
    base = template.request_id or new_base()
    return [
        msgspec.structs.replace(template, seed=None if template.seed is None else template.seed + c,
                                request_id=rid(base, c, 0, choices, 1))
        for c in range(choices)
    ]


def branch_requests(template: GenerationRequest, choices: int, branches: int,
                    temperature: float | None = None) -> list[list[GenerationRequest]]:
    """A branched answer's upstream requests: per choice, its `branches` requests, at `temperature` when
    given (else the template's)."""
    base = template.request_id or new_base()
    first = template.seed if template.seed is not None else secrets.randbelow(1 << 31)
    fields = {} if temperature is None else {"temperature": temperature}
    return [
        [msgspec.structs.replace(template, seed=first + c * branches + b,
                                 request_id=rid(base, c, b, choices, branches), **fields)
         for b in range(branches)]
        for c in range(choices)
    ]
