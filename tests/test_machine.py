"""cascade/machine.py: the fingerprint that tells benchmark latencies from different CPUs apart."""

from __future__ import annotations

import re

from cascade.machine import SPEED_FLAGS, fingerprint


def test_fingerprint_names_the_cpu_its_cores_and_the_speed_flags_it_has() -> None:
    model, cores, flags = fingerprint().split("; ")
    assert model and re.fullmatch(r"\d+ cores", cores)
    assert flags == "-" or set(flags.split(",")) <= set(SPEED_FLAGS)
    assert fingerprint() is fingerprint()  # read once per process
