"""The strict base and the value types every config-like file is built from (`cascade.toml`, and the optimizer's
`problem.toml` and profiles).

Every Struct on `Strict` is frozen, keyword-only and forbids unknown fields, so that a typo fails when the file
is read, with the key's path (cascade/files.py), instead of being silently ignored.
"""

from __future__ import annotations

import sys
from typing import Annotated

import msgspec

Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]
# Floats are finite: TOML reads `inf` and `nan`, and an `inf` timeout is a timer that never fires (msgspec's bounds
# are finite, so the largest float is the bound; cascade/files.py words its message; `nan` fails every bound).
FINITE_MAX = sys.float_info.max
PositiveFloat = Annotated[float, msgspec.Meta(gt=0, le=FINITE_MAX)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
NonNegativeFloat = Annotated[float, msgspec.Meta(ge=0, le=FINITE_MAX)]
UnitFloat = Annotated[float, msgspec.Meta(ge=0, le=1)]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")]


class Strict(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every table read from a config-like file: frozen, keyword-only, unknown keys refused."""
