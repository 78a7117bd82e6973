"""Where stored responses live: the `ResponseStore` protocol, its record, and the in-process store (the Redis one,
shared by every gateway on it, is cascade/service/redis/responses.py).

A record is one response with its whole conversation (every earlier turn's messages, this turn's input and its
answer), so that `previous_response_id` is one read, a response outlives the ones before it, and deleting one
leaves the others whole; the conversation's size and turns are bounded (`[gateway.responses]`), and so is each
record. A record is readable only under the owner it was written with (the API key that created it, as
`owner_of` derives it): a foreign or unknown id reads as absent, the same answer either way.

The in-process store keeps records for `ttl_s` after they were written, at most `max_entries` of them and
`max_bytes` of them together, dropping the least recently used first; it is this process's only (a restart, or
another gateway or `--processes` worker, does not see it: set `[gateway.redis] url` for those).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

import msgspec

from cascade.config import ResponsesConfig
from cascade.schemas import ChatMessage
from cascade.service.keys.tenant import Tenant


class StoredResponse(msgspec.Struct, kw_only=True):
    """What a stored response keeps: its conversation as chat messages (instructions excluded: they are the
    request's own), how many responses the conversation holds, and the response object as GET returns it."""

    messages: list[ChatMessage]
    turns: int
    response: msgspec.Raw


encode_record = msgspec.json.Encoder().encode
decode_record = msgspec.json.Decoder(StoredResponse).decode


class ResponseStore(Protocol):
    async def put(self, response_id: str, owner: str, record: bytes) -> None:
        """Keep `record` under `response_id` for `owner`; StoreFailed when it could not be written."""

    async def get(self, response_id: str, owner: str) -> bytes | None:
        """The record, or None: unknown, expired, deleted, or another owner's. StoreFailed when the store did
        not answer."""

    async def delete(self, response_id: str, owner: str) -> bool:
        """Whether `owner`'s record was there and is gone. StoreFailed when the store did not answer."""


class StoreFailed(Exception):
    """The store did not answer (Redis away or slow)."""


def owner_of(caller: Tenant | None) -> str:
    """The owner a caller's records are written with: derived from its key's digest (never the key, nor the digest
    the gateway authenticates with); "" when the gateway has no keys."""
    if caller is None:
        return ""
    return hashlib.sha256(b"cascade/v1/responses owner\x00" + caller.digest).hexdigest()[:32]


class LocalResponseStore:
    """This process's stored responses, bounded in count, bytes and age (the least recently used go first)."""

    def __init__(self, config: ResponsesConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = config.ttl_s
        self.max_entries = config.max_entries
        self.max_bytes = config.max_bytes
        self._clock = clock
        self._records: OrderedDict[str, tuple[str, bytes, float]] = OrderedDict()  # id -> (owner, record, expiry)
        self.bytes = 0
        self.evicted = 0  # dropped for room (not for age)

    def __len__(self) -> int:
        return len(self._records)

    async def put(self, response_id: str, owner: str, record: bytes) -> None:
        self._drop(response_id)
        if len(record) > self.max_bytes:  # could never fit: kept nowhere rather than emptying the store
            return
        self._records[response_id] = (owner, record, self._clock() + self.ttl_s)
        self.bytes += len(record)
        while len(self._records) > self.max_entries or self.bytes > self.max_bytes:
            oldest = next(iter(self._records))
            self._drop(oldest)
            self.evicted += 1

    async def get(self, response_id: str, owner: str) -> bytes | None:
        found = self._records.get(response_id)
        if found is None:
            return None
        stored_owner, record, expiry = found
        if self._clock() >= expiry:
            self._drop(response_id)
            return None
        if not hmac.compare_digest(stored_owner, owner):
            return None
        self._records.move_to_end(response_id)
        return record

    async def delete(self, response_id: str, owner: str) -> bool:
        if await self.get(response_id, owner) is None:
            return False
        self._drop(response_id)
        return True

    def _drop(self, response_id: str) -> None:
        found = self._records.pop(response_id, None)
        if found is not None:
            self.bytes -= len(found[1])
