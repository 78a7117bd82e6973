"""The whole of `cascade.toml`: its root table, the checks that span its tables, and reading it.

A mistake anywhere is one ConfigError naming the file and the key (cascade/files.py):
`cascade.toml: invalid config: unknown key `prot` in `gateway``.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from cascade import files
from cascade.config.backends import SGLangBackendConfig
from cascade.config.base import Strict
from cascade.config.gateway import REDIS_SCHEMES, TRACING_SCHEMES, ApiKey, GatewayConfig
from cascade.config.moved import moved_key
from cascade.config.prices import check_prices
from cascade.config.routing import RoutingConfig, check_routing
from cascade.config.tiers import TierConfig, check_tier
from cascade.config.workers import WorkerConfig
from cascade.errors import ConfigError


class CascadeConfig(Strict, frozen=True):
    gateway: GatewayConfig = GatewayConfig()
    workers: list[WorkerConfig] = msgspec.field(default_factory=list)
    tiers: list[TierConfig] = msgspec.field(default_factory=list)
    routing: RoutingConfig = RoutingConfig()

    def __post_init__(self) -> None:
        _check(self)


def _check(config: CascadeConfig) -> None:
    if not config.tiers:
        raise ConfigError("`tiers` is empty: define at least one [[tiers]] entry")
    for i, key in enumerate(config.gateway.api_keys):
        if not key or any(c.isspace() for c in key):
            # An empty key would admit `Authorization: Bearer ` (no key at all).
            raise ConfigError(f"`gateway.api_keys[{i}]` is empty or contains whitespace: each key must be one "
                              "non-empty token")
    names = [t.name for t in config.tiers]
    if len(set(names)) != len(names):
        raise ConfigError(f"`tiers` names must be unique, got {names}")
    check_keys(config.gateway.keys, names)
    url = config.gateway.redis.url
    if url and not url.startswith(REDIS_SCHEMES):
        shown = url.rpartition("@")[2]  # never a password
        raise ConfigError(f"`gateway.redis.url` must start with {', '.join(REDIS_SCHEMES)} (e.g. "
                          f"\"redis://127.0.0.1:6379/0\"; empty: limits in each gateway process), got {shown!r}")
    endpoint = config.gateway.tracing.endpoint
    if endpoint and not endpoint.startswith(TRACING_SCHEMES):
        raise ConfigError("`gateway.tracing.endpoint` must be an OTLP/HTTP URL starting with http:// or https:// "
                          "(e.g. \"http://127.0.0.1:4318/v1/traces\"; empty: no tracing), got "
                          f"{endpoint.rpartition('@')[2]!r}")
    workers = {w.name: w for w in config.workers}
    if len(workers) != len(config.workers):
        raise ConfigError("`workers` names must be unique")
    for i, tier in enumerate(config.tiers):
        check_tier(tier, i, workers)
    check_prices(config.tiers, config.gateway.keys)
    check_routing(config.routing, names, any(t.branches.slots for t in config.tiers),
                  any(isinstance(b, SGLangBackendConfig) for t in config.tiers for b in t.backends))


KEY_HINTS = ("fast", "balanced", "best", "numeric")  # what `[[gateway.keys]] hints` may list


def check_keys(keys: tuple[ApiKey, ...], tiers: list[str]) -> None:
    seen: set[str] = set()
    for i, key in enumerate(keys):
        where = f"`gateway.keys[{i}]`"
        if not key.name or not key.name.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise ConfigError(f"{where}.name must be a non-empty name of letters, digits, '-', '_' or '.' (it labels "
                              f"metrics), got {key.name!r}")
        if key.name in seen:
            raise ConfigError(f"{where}.name `{key.name}` is used twice: names must be unique")
        seen.add(key.name)
        if len(key.sha256) != 64 or any(c not in "0123456789abcdef" for c in key.sha256):
            raise ConfigError(f"{where}.sha256 must be the 64 lowercase hex digits of the key's sha256 (`cascade keys "
                              "add` prints it), never the key itself")
        if unknown := sorted(set(key.hints) - set(KEY_HINTS)):
            raise ConfigError(f"{where}.hints: unknown {', '.join(unknown)}; choose from {', '.join(KEY_HINTS)}")
        if unknown := sorted(set(key.tiers) - set(tiers)):
            raise ConfigError(f"{where}.tiers: unknown {', '.join(unknown)}; the tiers are {', '.join(tiers)}")


def decode_config(data: bytes | str, source: str = "cascade.toml") -> CascadeConfig:
    """`data`, the text of `source`, as a config (relative paths left as they are)."""
    try:
        return files.decode(data, CascadeConfig, source, "toml", "config")
    except ConfigError as exc:
        raise _naming_moved_keys(exc, data, source) from None


def load_config(path: str | Path) -> CascadeConfig:
    """The config file at `path` (TOML whatever its name), its relative paths made relative to its folder."""
    try:
        config = files.load(path, CascadeConfig, "config", "toml")
    except ConfigError as exc:
        try:
            data = Path(path).read_bytes()
        except OSError:
            raise exc from None
        raise _naming_moved_keys(exc, data, str(Path(path))) from None
    return resolve_paths(config, Path(path).parent)


def _naming_moved_keys(error: ConfigError, data: bytes | str, source: str) -> ConfigError:
    """`error`, or where a key of the failed file moved when it has one (cascade/config/moved.py): the key's old name
    fails as unknown, or as the wrong type, and should say where it went instead."""
    moved = moved_key(data)
    return error if moved is None else ConfigError(f"{source}: invalid config: {moved}")


def resolve_paths(config: CascadeConfig, base: Path) -> CascadeConfig:
    """Make relative file paths in the config relative to `base` (the config file's folder)."""
    router = config.routing.router
    if router and not Path(router).is_absolute():
        routing = msgspec.structs.replace(config.routing, router=str((base / router).resolve()))
        config = msgspec.structs.replace(config, routing=routing)
    tiers = [t if t.price is None or not t.price.profile or Path(t.price.profile).is_absolute() else
             msgspec.structs.replace(t, price=msgspec.structs.replace(t.price, profile=str((base / t.price.profile)
                                                                                            .resolve())))
             for t in config.tiers]
    if tiers != config.tiers:
        config = msgspec.structs.replace(config, tiers=tiers)
    return config
