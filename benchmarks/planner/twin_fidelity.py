"""The GPU twin answers what the ladder answered (issue 62 item 2), on every recorded question. Prints JSON.

Every question of models/outcomes/gsm8k-train-embedded-v8.jsonl (or the first `--n`) answered by the embedded ladder
(examples/embedded-1.5b-ladder.toml) on emulated H200s replaying its records (cascade/testing/twin.py), labelled as
`cascade label` labels (the real SGLang client, branch runner and grader), against the recorded rows: per tier the
recorded and the twin's accuracy, how many rows are identical (correctness, answer, output tokens) and, for the
reasoning tier, how many have the recorded decode tokens.

Usage: .venv/bin/python -m benchmarks.planner.twin_fidelity [--n N] [--time-scale 0.25] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import sys
import time

from cascade.config.load import load_config
from cascade.data.outcomes import read_rows
from cascade.repo_paths import recorded_path
from cascade.testing.scripts import print_result
from cascade.testing.twin import EMBEDDED_LADDER, V8, V8_TWIN, label_on_twin, twin_ladder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=0, help="only the first N questions in id order (0: all)")
    parser.add_argument("--time-scale", type=float, default=0.25, help="wall seconds per emulated second")
    parser.add_argument("--json-out", help="also write the JSON here")
    args = parser.parse_args(argv)
    recorded = {row.id: row.tiers for _, row in read_rows(V8) if row.id is not None}
    ids = sorted(recorded)[:args.n or None]
    started = time.perf_counter()
    with twin_ladder(load_config(EMBEDDED_LADDER), time_scale=args.time_scale) as config:
        served = label_on_twin(config, ids)
    result: dict[str, object] = {"questions": len(ids), "outcomes_file": recorded_path(V8),
                                 "records": {t.tier: [recorded_path(p) for p in t.records] for t in V8_TWIN},
                                 "wall_s": round(time.perf_counter() - started, 1)}
    for twin in V8_TWIN:
        tier = twin.tier
        pairs = [(recorded[q][tier], served[q][tier]) for q in ids]
        result[tier] = {
            "recorded_accuracy": sum(bool(w.correct) for w, _ in pairs) / len(ids),
            "twin_accuracy": sum(bool(g.correct) for _, g in pairs) / len(ids),
            "rows_identical": sum((w.correct, w.answer, w.output_tokens) == (g.correct, g.answer, g.output_tokens)
                                  for w, g in pairs),
            **({"decode_tokens_equal": sum(w.decode_tokens == g.decode_tokens for w, g in pairs)}
               if any(w.decode_tokens is not None for w, _ in pairs) else {}),
        }
    print_result(result, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
