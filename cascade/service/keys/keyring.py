"""Who is calling: the API key a request carries, as a `Tenant` (`Keyring.authenticate`).

Keys are known by their sha256 only (`[[gateway.keys]]`, made by `cascade keys add`); the digest of what a client
sends is compared with every configured one in constant time (hmac.compare_digest, no early exit). Plain
`[gateway] api_keys` still work: each is a tenant named `api_keys[i]` with no limits.
"""

from __future__ import annotations

import hashlib
import hmac

from cascade.config import ApiKey
from cascade.errors import ConfigError, Unauthorized
from cascade.service.keys.budget import Budget
from cascade.service.keys.tenant import Tenant

_NO_KEY = "missing or invalid API key: send `Authorization: Bearer <key>`"


class Keyring:
    def __init__(self, keys: tuple[ApiKey, ...] = (), plain: tuple[str, ...] = ()) -> None:
        """ConfigError when one key is configured twice (plain or hashed, in either list): which entry would it be?
        Its limits and permits would depend on the order (a key listed in `api_keys` and, with limits, in
        `[[gateway.keys]]` lost its limits)."""
        self.tenants = [Tenant(k.name, bytes.fromhex(k.sha256), k.requests_per_minute, k.tokens_per_minute,
                               frozenset(k.hints), frozenset(k.tiers), k.max_in_flight, Budget.of(k)) for k in keys]
        self.tenants += [Tenant(f"api_keys[{i}]", _digest(key)) for i, key in enumerate(plain)]
        first: dict[bytes, str] = {}
        for tenant in self.tenants:
            if (other := first.setdefault(tenant.digest, tenant.name)) != tenant.name:
                raise ConfigError(f"one API key is configured twice, as `{other}` and as `{tenant.name}`: keep one "
                                  "entry per key (a [[gateway.keys]] entry holds its limits and permits)")

    def __bool__(self) -> bool:
        return bool(self.tenants)

    def authenticate(self, authorization: str) -> Tenant | None:
        """The tenant whose key `authorization` (the header, "" if absent) carries as `Bearer <key>`; None when no
        keys are configured (every request passes); else Unauthorized."""
        if not self.tenants:
            return None
        scheme, _, token = authorization.partition(" ")
        digest = _digest(token)
        found = None
        for tenant in self.tenants:  # every one compared: the time does not tell which matched
            if hmac.compare_digest(tenant.digest, digest):
                found = tenant
        if scheme.lower() != "bearer" or not token or found is None:
            raise Unauthorized(_NO_KEY)
        return found


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


# A plain key a gateway reachable from the network refuses to start with (`cascade keys add` makes 47 characters).
MIN_KEY_CHARS = 24
MIN_KEY_DISTINCT = 8


def weak_plain_keys(plain: tuple[str, ...]) -> list[str]:
    """The `api_keys[i]` entries that are easy to guess: shorter than MIN_KEY_CHARS characters, or made of fewer
    than MIN_KEY_DISTINCT distinct ones."""
    return [f"api_keys[{i}]" for i, key in enumerate(plain)
            if len(key) < MIN_KEY_CHARS or len(set(key)) < MIN_KEY_DISTINCT]
