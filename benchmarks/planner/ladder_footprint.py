"""How long a ladder's workers take to start and how much memory they hold, all of them at once.

Why: the embedded ladder's budget (issue 31) is a later start within 60 s and the whole ladder within 12 GB. Resident
set sizes double-count: `transformers serve` maps the safetensors weights from the page cache, and two workers of
one model share those pages. So this reports, summed over every worker's process tree:

  * `rss_gb`: resident set size (what `ps` and `top` show; shared pages counted once per process);
  * `pss_gb`: proportional set size (each shared page split between the processes mapping it): what the ladder
    costs the machine, the number to budget;
  * `uss_gb`: pages only that process holds (its KV cache, activations, Python heap);
  * `system_used_gb`: MemTotal - MemAvailable after start minus before (noisy: other jobs move it).

Another process mapping the same weights (a second ladder, a benchmark's worker) takes its share of their PSS:
measure on a machine where nothing else runs these models.

Method: the config's workers (default: the embedded ladder; `--config` another cascade.toml, `--workers` a subset)
started by cascade's Supervisor exactly as `cascade serve` starts them (each ends its start-up with one generation,
which allocates its KV-cache pool), `start_s` from launch to every worker ready (models already converted: a later
start, not the first `make serve`); then one short chat per worker; then memory is read; then everything stops.

Output: one JSON object on stdout. Usage:
  .venv/bin/python -m benchmarks.planner.ladder_footprint [--config cascade.toml] [--workers a,b]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from cascade.config import CascadeConfig, load_config
from cascade.engines.embedded import embedded_config
from cascade.engines.models import load_card, prepare
from cascade.engines.supervisor import Supervisor, Worker
from cascade.testing.scripts import print_result


def tree(pid: int) -> list[psutil.Process]:
    process = psutil.Process(pid)
    return [process, *process.children(recursive=True)]


def memory(workers: list[Worker]) -> dict[str, Any]:
    per_worker = {}
    for worker in workers:
        assert worker.process is not None
        infos = [p.memory_full_info() for p in tree(worker.process.pid)]
        per_worker[worker.config.name] = {key: round(sum(getattr(i, key) for i in infos) / 1e9, 2)
                                          for key in ("rss", "pss", "uss")}
    totals = {f"{key}_gb": round(sum(w[key] for w in per_worker.values()), 2) for key in ("rss", "pss", "uss")}
    return {**totals, "per_worker": per_worker}


def used_gb() -> float:
    vm = psutil.virtual_memory()
    return (vm.total - vm.available) / 1e9


async def measure(config: CascadeConfig, names: list[str] | None) -> dict[str, Any]:
    chosen = [w for w in config.workers if names is None or w.name in names]
    before = used_gb()
    with tempfile.TemporaryDirectory() as logs:
        workers = [Worker(w, prepare(load_card(w.model)), Path(logs)) for w in chosen]
        started = time.perf_counter()
        async with Supervisor(workers):  # every worker stopped on the way out, whatever happens
            start_s = time.perf_counter() - started
            async with httpx.AsyncClient(trust_env=False, timeout=300) as client:
                for worker in workers:
                    if worker.config.role != "chat":
                        continue
                    body = {"model": str(worker.model_dir), "max_tokens": 16, "stream": False,
                            "messages": [{"role": "user", "content": "What is 17 * 23?"}]}
                    (await client.post(f"{worker.url}/v1/chat/completions", json=body)).raise_for_status()
            result = {"workers": [w.name for w in chosen], "start_s": round(start_s, 1), **memory(workers),
                      "system_used_gb": round(used_gb() - before, 2)}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="cascade.toml (default: the embedded ladder)")
    parser.add_argument("--workers", help="comma-separated subset of [[workers]] names")
    parser.add_argument("--json-out", help="also write the JSON here")
    args = parser.parse_args()
    config = load_config(args.config) if args.config else embedded_config()
    names = [n.strip() for n in args.workers.split(",")] if args.workers else None
    print_result(asyncio.run(measure(config, names)), args.json_out, indent=2)


if __name__ == "__main__":
    main()
