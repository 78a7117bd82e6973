"""Replica choice by a request's prefix (`[tiers.replicas] choice = "prefix"`): consistent hashing with bounded loads.

An engine's prefix cache (SGLang's radix cache, vLLM's automatic prefix caching) only helps a request whose prefix
it has seen, so the turns of one conversation should reach the same replica. The request's affinity key is

* the client's own key where it sent one (`prompt_cache_key` in the body, OpenAI's field, or an `x-session-id`
  header: `GenerationRequest.affinity_key`), else
* the conversation's opening: its system (and developer) messages and its first `prefix_messages` other messages
  (the first user turn), which every later turn repeats unchanged. A key over the whole prompt but its last
  message would move every turn to another replica, since each turn's prompt is longer than the last.

The key hashes to a point on a ring where every replica has `VIRTUAL_NODES` points; the replica is the first
clockwise that can take requests and whose requests in flight, this one included, stay within
ceil(load_factor x (requests in flight + 1) / replicas that can take requests) (Mirrokni, Thorup and
Zadimoghaddam, SODA 2018). The replica with the fewest always fits, so the walk always ends; a key moves only when
its replica is full, benched or down, and then to the next replicas on the ring, never elsewhere.

Deterministic across processes: points are BLAKE2b digests of the replicas' ids (their URLs, the same in every
gateway's config) and of the key's bytes, never Python's per-process salted `hash()`, so N gateways behind Envoy
send one conversation to one replica with nothing shared between them (each bounds the loads it sees itself).

Work per request is bounded whatever the prompt: at most `prefix_chars` characters are hashed, and each message
and content part visited costs one character of that budget, so neither a huge message nor a million tiny ones
costs more than `prefix_chars` steps.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Iterator, Mapping, Sequence

from cascade.branches.backend import GenerationRequest
from cascade.schemas import ChatMessage

# Points per replica on the ring: with 160 (SGLang model gateway's consistent_hashing) the replicas' shares of the
# keys are within about +-10% of even at 2-16 replicas.
VIRTUAL_NODES = 160
_SYSTEM_ROLES = frozenset({"system", "developer"})
# The ceiling of load_factor x average, less float error: 1.1 x 10 / 11 must be 1, not 2.
_EPSILON = 1e-9


def _point(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")  # a lone surrogate from JSON hashes as its bytes, never raises


def affinity_point(request: GenerationRequest, prefix_messages: int, prefix_chars: int) -> int:
    """The request's point on the ring: its client's key, else its opening (module docstring)."""
    digest = hashlib.blake2b(digest_size=8)
    if request.affinity_key:
        digest.update(b"key\x00" + _utf8(request.affinity_key[:prefix_chars]))
    else:
        digest.update(b"opening\x00")
        _hash_opening(digest, request.messages, prefix_messages, prefix_chars)
    return int.from_bytes(digest.digest(), "big")


def _hash_opening(digest: hashlib.blake2b, messages: Sequence[ChatMessage], prefix_messages: int, budget: int) -> None:
    others = 0
    for message in messages:
        if budget <= 0:
            return
        if message.role not in _SYSTEM_ROLES:
            if others == prefix_messages:
                return
            others += 1
        budget -= 1
        digest.update(_utf8(message.role) + b"\x00")
        content = message.content
        if isinstance(content, str):
            piece = content[:budget]
            digest.update(_utf8(piece))
            budget -= len(piece)
        elif content is not None:
            for part in content:
                if budget <= 0:
                    return
                budget -= 1
                piece = part.text[:budget]
                digest.update(_utf8(piece) + b"\x02")
                budget -= len(piece)
        digest.update(b"\x01")


class Ring:
    """The replicas' points on the hash ring: `ids` (one per replica, in the pool's order) name them the same way
    in every gateway; a repeated id is told apart by its occurrence."""

    def __init__(self, ids: Sequence[str], vnodes: int = VIRTUAL_NODES) -> None:
        if not ids:
            raise ValueError("a ring needs at least one replica")
        seen: dict[str, int] = {}
        names = []
        for replica_id in ids:
            count = seen.get(replica_id, 0)
            seen[replica_id] = count + 1
            names.append(replica_id if not count else f"{replica_id}\x00{count}")
        points = sorted((_point(_utf8(f"{name}#{v}")), index) for index, name in enumerate(names)
                        for v in range(vnodes))
        self._points = [p for p, _ in points]
        self._owners = [i for _, i in points]
        self.size = len(ids)

    def walk(self, point: int) -> Iterator[int]:
        """Replica indices clockwise from `point`, each once."""
        n = len(self._owners)
        start = bisect.bisect_left(self._points, point)
        seen: set[int] = set()
        for k in range(n):
            owner = self._owners[(start + k) % n]
            if owner not in seen:
                seen.add(owner)
                yield owner
                if len(seen) == self.size:
                    return


def load_bound(outstanding: int, replicas: int, load_factor: float) -> int:
    """Requests in flight a replica may hold with the next one: ceil(load_factor x (outstanding + 1) / replicas)."""
    return math.ceil(load_factor * (outstanding + 1) / replicas - _EPSILON)


def bounded_choice(order: Iterator[int], loads: Mapping[int, int], load_factor: float) -> tuple[int, bool]:
    """The first replica in `order` among `loads` (index -> requests in flight: those that can take a request)
    within the load bound, and whether a replica before it on the ring was passed over for its load."""
    bound = load_bound(sum(loads.values()), len(loads), load_factor)
    spilled = False
    for index in order:
        if index not in loads:
            continue
        if loads[index] + 1 <= bound:
            return index, spilled
        spilled = True
    # Unreachable for load_factor >= 1 (the least-loaded replica is within the bound); kept total for safety.
    return min(loads, key=lambda i: loads[i]), True
