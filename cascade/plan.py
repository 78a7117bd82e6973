"""The plan file: the hand-off from `cascade optimize` to `cascade serve`.

It carries operating points (thresholds and branch settings per quality hint) and, optionally,
the deployment (GPUs and parallelism per tier). The gateway reads only the operating points.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from cascade.errors import ConfigError


class BranchSetting(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    n: int = 1
    m: int = 1


class OperatingPoint(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    hint: str
    thresholds: list[float]
    branches: dict[str, BranchSetting] = msgspec.field(default_factory=dict)
    predicted_quality: float | None = None
    predicted_p95_latency_s: float | None = None


class TierDeployment(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    tier: str
    gpus: int
    replicas: int
    tp: int = 1
    pp: int = 1


class Plan(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    version: int = 1
    tiers: list[str]
    operating_points: list[OperatingPoint]
    deployment: list[TierDeployment] = msgspec.field(default_factory=list)

    def thresholds_by_hint(self, n_tiers: int) -> dict[str, list[float]]:
        if len(self.tiers) != n_tiers:
            tiers = ", ".join(self.tiers)
            raise ConfigError(f"plan is for {len(self.tiers)} tiers ({tiers}); the config has {n_tiers}")
        points = {}
        for point in self.operating_points:
            if len(point.thresholds) != n_tiers - 1:
                raise ConfigError(f"plan operating point `{point.hint}` needs {n_tiers - 1} thresholds")
            points[point.hint] = list(point.thresholds)
        return points


def load_plan(path: str | Path) -> Plan:
    p = Path(path)
    try:
        return msgspec.json.decode(p.read_bytes(), type=Plan)
    except OSError as exc:
        raise ConfigError(f"cannot read plan {p}: {exc.strerror}") from None
    except msgspec.MsgspecError as exc:
        raise ConfigError(f"{p}: invalid plan: {exc}") from None
