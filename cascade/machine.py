"""What machine measured a number: CPU model, cores and the instruction sets the CPU engine's speed hangs on.

Why: the embedded engine computes in bfloat16, fast on CPUs with AMX or AVX512-BF16 and emulated elsewhere. The
Qwen2.5-Coder-1.5B worker decoded 6.6 tok/s alone and 35 tok/s at 8 in flight on one 2-core machine and 2.1 and
4.1 tok/s on another (Xeon @ 2.50GHz, AVX512 without BF16; 2026-11-27). Latencies from two such machines are not
comparable, so benchmark records carry this fingerprint and `benchmarks/reasoning/bench_compare.py` says when runs
differ.
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

# The flags that move the CPU engine's speed most (bf16 matrix units, then the vector widths).
SPEED_FLAGS = ("amx_bf16", "avx512_bf16", "avx512f", "avx2")


@functools.cache
def fingerprint() -> str:
    """`CPU model; N cores; flag,flag` (the SPEED_FLAGS the CPU has), e.g.
    "Intel(R) Xeon(R) Processor @ 2.50GHz; 2 cores; avx512f,avx2"."""
    model, flags = platform.processor() or platform.machine(), set[str]()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    have = ",".join(f for f in SPEED_FLAGS if f in flags) or "-"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model}; {cores} cores; {have}"
