"""`[tiers.replicas]` of `cascade.toml`: how a request picks one of its tier's replicas (cascade/branches/pool.py).

* `least_outstanding` (the default): the replica with the fewest requests in flight from this gateway.
* `prefix`: consistent hashing with bounded loads (Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing with
  Bounded Loads", SODA 2018) on the request's affinity key (cascade/branches/affinity.py): the client's
  `prompt_cache_key` or `x-session-id`, else a hash of the conversation's opening (its system messages and its
  first `prefix_messages` other messages, at most `prefix_chars` characters). The key's replica is the first on a
  hash ring whose requests in flight stay within `ceil(load_factor x average)`, so the turns of one conversation
  meet their engine's prefix cache, and N gateways behind Envoy pick the same replica with nothing shared.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from cascade.config.base import Strict

ReplicaChoice = Literal["least_outstanding", "prefix"]


class ReplicasConfig(Strict, frozen=True):
    """How a tier picks one of its replicas for a request (the bounds are SGLang model gateway's `prefix_hash`
    range: load factor 1.25, 256 prefix tokens, about 1,024 characters)."""

    choice: ReplicaChoice = "least_outstanding"
    # A replica takes a key while its requests in flight (this one included) are at most ceil(load_factor x the
    # average over the replicas that can take requests); 1.0 balances strictly (affinity only among equal loads).
    load_factor: Annotated[float, msgspec.Meta(ge=1.0, le=8.0)] = 1.25
    # Messages of the opening hashed after its leading system (and developer) messages: 1 is the first user turn,
    # which every later turn of the conversation repeats, so all its turns share one key.
    prefix_messages: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1
    # Characters hashed at most (roles, contents and a client's key alike): bounds the work of a hostile prompt.
    prefix_chars: Annotated[int, msgspec.Meta(ge=16, le=65_536)] = 1024
