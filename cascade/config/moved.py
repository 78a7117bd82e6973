"""Keys that moved in `cascade.toml`, and where each went.

A tier's reasoning-branch settings moved into `[tiers.branches]` (cascade/config/branches.py) and the gateway's Redis
keys into `[gateway.redis]`. msgspec would call an old key unknown, or `branches = 4` an integer where a table belongs;
after a decode fails, `moved_key` reads the raw file to say where the key is now.
"""

from __future__ import annotations

import msgspec

TIER_KEYS = {  # old key of [[tiers]] -> its name in [tiers.branches]
    "branches_to_finish": "m", "prune_alpha": "alpha", "prune_beta": "beta", "score_every_steps": "k",
    "aggregation": "aggregation", "first_wave": "first_wave", "wave_margin": "wave_margin",
    "prune_confidence": "prune_confidence", "confidence_group": "confidence_group",
    "branch_temperature": "temperature", "branch_slots": "slots",
}
GATEWAY_KEYS = {"redis_url": "url", "redis_timeout_s": "timeout_s", "redis_failure": "failure"}  # -> [gateway.redis]


def moved_key(data: bytes | str) -> str | None:
    """Where the first moved key in the TOML text `data` went, as an error's detail (None: no moved key, or not
    TOML at all)."""
    try:
        raw = msgspec.toml.decode(data)
    except msgspec.DecodeError:
        return None
    if not isinstance(raw, dict):
        return None
    gateway = raw.get("gateway")
    for old, new in GATEWAY_KEYS.items():
        if isinstance(gateway, dict) and old in gateway:
            return f"`gateway.{old}` moved: write `{new}` in [gateway.redis]"
    tiers = raw.get("tiers")
    for i, tier in enumerate(tiers if isinstance(tiers, list) else []):
        if not isinstance(tier, dict):
            continue
        if "branches" in tier and not isinstance(tier["branches"], dict):
            return (f"`tiers[{i}].branches` is a table now: write `n = {tier['branches']!r}` in [tiers.branches] "
                    f"(or `branches = {{ n = {tier['branches']!r} }}`)")
        for old, new in TIER_KEYS.items():
            if old in tier:
                return f"`tiers[{i}].{old}` moved: write `{new}` in [tiers.branches]"
    return None
