"""What a request asked for that its engines are not sent, said once, in `cascade.note` and in the
`x-cascade-dropped-params` header (LiteLLM's `drop_params`, with a word), and what a greedy tier does not do as asked.

* OpenAI's own fields that no engine takes (schemas.OPENAI_ONLY: `store`, `service_tier`, `verbosity`,
  `stream_options.include_obfuscation`) are never sent; a value cascade does not serve as asked (`store: true`:
  nothing is stored) is dropped.
* The length and rendering extras (schemas.DROPPED_WHERE_UNTAKEN: `ignore_eos`, `min_tokens`, `skip_special_tokens`)
  go to every tier whose engines take them (SGLang, vLLM); on a tier that may serve the request whose engines do not
  (`TierConfig.untaken`: the embedded engine) one is dropped, unless its value is what every engine does anyway.
* A greedy tier (an embedded worker at temperature 0, `Tier.greedy_only`) applies no `temperature` and needs no
  `seed`, and its `n` choices are one answer repeated: the note says so (those fields are sent; nothing is dropped).

The list is known before anything is sent, so a stream's headers carry it too. A field whose absence would change the
answer's meaning is refused instead (cascade/service/validation.py `check_tier`).
"""

from __future__ import annotations

import msgspec

from cascade.schemas import DROPPED_WHERE_UNTAKEN, OPENAI_ONLY, ChatCompletionRequest
from cascade.tiers.build import Tier

DROPPED_HEADER = b"x-cascade-dropped-params"
# Why each of OpenAI's own is dropped, in the note.
_WHY = {"store": "cascade stores no chat completions", "service_tier": "cascade has one service tier",
        "verbosity": "no engine takes it", "stream_options.include_obfuscation": "cascade's chunks carry no padding"}


class Dropped(msgspec.Struct, frozen=True):
    """The request's dropped fields (`names`, as the header lists them) and the note that says why (None: none)."""

    names: tuple[str, ...] = ()
    note: str | None = None


def dropped_headers(names: tuple[str, ...]) -> list[tuple[bytes, bytes]]:
    """The response header naming the dropped fields (`Decision.dropped`), or none."""
    return [(DROPPED_HEADER, ",".join(names).encode())] if names else []


def dropped(req: ChatCompletionRequest, tiers: list[Tier]) -> Dropped:
    """What `req` asked for that is not sent to the `tiers` that may serve it."""
    names: list[str] = []
    why: list[str] = []
    for name, served in OPENAI_ONLY.items():
        value = _value(req, name)
        if value is not None and value not in served:
            names.append(name)
            why.append(f"`{name}` ({_WHY[name]})")
    for name, default in DROPPED_WHERE_UNTAKEN.items():
        value = getattr(req, name)
        left = [t.name for t in tiers if name in t.config.untaken]
        if value is not None and value != default and left:
            names.append(name)
            why.append(f"`{name}` (not taken by the engines of {_listed(left)})")
    return Dropped(tuple(names), f"dropped: {', '.join(why)}" if why else None)


def greedy_note(req: ChatCompletionRequest, tiers: list[Tier]) -> str | None:
    """What `cascade.note` says when some of the `tiers` that may serve `req` decode greedily whatever it asks and it
    set `temperature` (but 0), `seed` or `n` > 1; None: nothing to say."""
    greedy = [t.name for t in tiers if t.greedy_only]
    if not greedy:
        return None
    where = f"{_listed(greedy)} decode{'s' if len(greedy) == 1 else ''} greedily"
    notes = [f"`temperature` not applied: {where}"] if req.temperature else []
    if req.seed is not None:
        notes.append(f"`seed` has no effect: {where}")
    if req.n > 1:
        notes.append(f"`n` = {req.n} gives identical choices: {where}")
    return "; ".join(notes) or None


def _value(req: ChatCompletionRequest, path: str) -> object:
    holder: object = req
    for key in path.split("."):
        holder = getattr(holder, key, None)
    return holder


def _listed(names: list[str]) -> str:
    return ("tier " if len(names) == 1 else "tiers ") + ", ".join(f"`{n}`" for n in names)
