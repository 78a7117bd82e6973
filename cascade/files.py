"""Config-like files (TOML, JSON) decoded into msgspec Structs: every mistake is one ConfigError.

One place for the wording, so that a bad plan, profile, card or config reads the same everywhere:
`cannot read <what> <path>: <reason>` when the file cannot be read, and `<path>: [invalid <what>: ]<detail>`
when it can but is wrong (not valid JSON/TOML, a wrong or unknown key named by its path, or a
ConfigError raised by a Struct's own checks).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal, TypeVar

import msgspec

from cascade.errors import ConfigError

T = TypeVar("T")
Format = Literal["json", "toml"]
_FINITE = f"`float` <= {sys.float_info.max!r}"  # msgspec's words for the bound that refuses inf


def decode(data: bytes | str, kind: type[T], source: str, fmt: Format, what: str = "") -> T:
    """`data` (the text of `source`) as a `kind`, or a ConfigError naming `source` and the key."""
    lead = f"{source}: invalid {what}: " if what else f"{source}: "
    try:
        return msgspec.toml.decode(data, type=kind) if fmt == "toml" else msgspec.json.decode(data, type=kind)
    except msgspec.ValidationError as exc:
        raise ConfigError(lead + readable(str(exc))) from None
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{lead}not valid {fmt.upper()}: {exc}") from None
    except ConfigError as exc:  # raised by a Struct's __post_init__
        raise ConfigError(lead + exc.message) from None


def load(path: str | Path, kind: type[T], what: str, fmt: Format | None = None) -> T:
    """The file at `path` as a `kind`, in `fmt` (by default TOML if its name ends in .toml, else JSON)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {p}: {exc.strerror or exc}") from None
    return decode(data, kind, str(p), fmt or ("toml" if p.suffix == ".toml" else "json"), what)


def readable(msgspec_message: str) -> str:
    """'Object contains unknown field `x` - at `$.tiers[0]`' -> 'unknown key `x` in `tiers[0]`'."""
    message, _, where = msgspec_message.partition(" - at `$")
    where = where.rstrip("`").lstrip(".")
    message = message.replace("Object contains unknown field", "unknown key")
    message = message.replace("Object missing required field", "missing required key")
    message = message.replace(_FINITE, "a finite number (not inf or nan)")  # cascade/config/base.py: FINITE_MAX
    return f"{message} in `{where}`" if where else message
