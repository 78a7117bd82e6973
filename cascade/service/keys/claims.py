"""An admitted request's claims on its key: on its token buckets (`Pass`) and on its budget (`Charge`), each settled
when the request ends (cascade/service/lease.py)."""

from __future__ import annotations

from dataclasses import dataclass

from cascade.service.keys.budget import Standing
from cascade.service.keys.ratelimit import Allowance
from cascade.service.keys.tenant import Tenant


@dataclass(frozen=True)
class Pass:
    """An admitted request's claim on its tenant's buckets."""

    tenant: Tenant
    reserved: int
    allowance: Allowance


@dataclass(frozen=True)
class Charge:
    """An admitted request's claim on its key's budget, settled when the request ends."""

    tenant: Tenant
    reserved: float
    standing: Standing  # as the reservation left it
