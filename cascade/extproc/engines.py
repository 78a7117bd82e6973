"""Each tier's engines as Envoy reaches them: one cluster per tier, its replicas the tier's backends.

Envoy balances a tier's replicas as one cluster and relays the rewritten body to whichever it picks, so the
replicas must be interchangeable on the wire: the same model name in the body, the same scheme, path prefix and
credentials. A tier whose backends differ in one of these is a config error, as is an embedded worker (`cascade
serve` starts those on ports only it knows).
"""

from __future__ import annotations

from urllib.parse import urlsplit

import msgspec

from cascade.branches.openai_client import split_credentials
from cascade.config import CascadeConfig, OpenAIBackendConfig, SGLangBackendConfig, TierConfig
from cascade.errors import ConfigError


class Endpoint(msgspec.Struct, frozen=True):
    host: str
    port: int


class TierEngine(msgspec.Struct, frozen=True, kw_only=True):
    """One tier as Envoy sees it: its cluster's endpoints, and what the rewritten request carries."""

    tier: str
    index: int
    model: str  # the body's `model`: what `cascade serve` sends this tier's engines
    endpoints: tuple[Endpoint, ...]
    tls: bool = False
    prefix: str = ""  # the engines' path prefix ("" for the server root)
    authorization: str | None = None  # the engines' Authorization header (None: the client's is removed)

    @property
    def cluster(self) -> str:
        """The Envoy cluster's name (tier names may hold characters Envoy's stats would mangle)."""
        return f"cascade_tier_{self.index}"


def tier_engines(config: CascadeConfig) -> list[TierEngine]:
    return [_tier_engine(tier, i) for i, tier in enumerate(config.tiers)]


def _tier_engine(tier: TierConfig, index: int) -> TierEngine:
    seen: set[tuple[str, bool, str, str | None]] = set()
    endpoints = []
    for backend in tier.backends:
        if not isinstance(backend, OpenAIBackendConfig | SGLangBackendConfig):
            raise ConfigError(f"tier `{tier.name}` runs on an embedded worker, which only `cascade serve` starts: "
                              "cascade extproc routes to engines Envoy reaches, so give the tier backends of kind "
                              "\"openai\" or \"sglang\" with a URL")
        url, basic = split_credentials(backend.url.rstrip("/"))
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"tier `{tier.name}`: backend url {url!r} is not an http(s)://host[:port] URL")
        tls = parts.scheme == "https"
        authorization = f"Bearer {backend.api_key}" if backend.api_key else f"Basic {basic}" if basic else None
        seen.add((backend.model, tls, parts.path, authorization))
        endpoints.append(Endpoint(parts.hostname, parts.port or (443 if tls else 80)))
    if len(seen) > 1:
        raise ConfigError(f"tier `{tier.name}`'s backends differ in model name, scheme, path prefix or credentials: "
                          "Envoy balances a tier's replicas as one cluster and sends each the same request, so they "
                          "must be interchangeable")
    model, tls, prefix, authorization = seen.pop()
    return TierEngine(tier=tier.name, index=index, model=model, endpoints=tuple(dict.fromkeys(endpoints)), tls=tls,
                      prefix=prefix, authorization=authorization)
