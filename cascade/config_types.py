"""The value types every `cascade.toml` table is built from (cascade/config.py, cascade/config_routing.py)."""

from __future__ import annotations

from typing import Annotated

import msgspec

Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]
PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
NonNegativeFloat = Annotated[float, msgspec.Meta(ge=0)]
UnitFloat = Annotated[float, msgspec.Meta(ge=0, le=1)]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")]


class _Strict(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass
