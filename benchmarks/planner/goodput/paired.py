"""One arm against another at one rate, paired: the same arrival seeds and questions, resampled together. Prints
JSON (and writes it with --out).

Why: two arms' own intervals overlap whenever either is wide, even when one is ahead on every seed; the paired
difference cancels what the two runs share (which questions were drawn, when requests arrived) and says whether the
gap excludes zero. The SLOs are those of the goodput run that measured the points (its --json-out summary).

    .venv/bin/python -m benchmarks.planner.goodput.paired SUMMARY.json FIRST_FOLDER SECOND_FOLDER --rate 75
        [--seeds 0,1,2] [--resamples 1000] [--out FILE]

FIRST_FOLDER and SECOND_FOLDER hold `rate-R-seed-S.json` points (runs/goodput_per_gpu/points/<run>/<arm>).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.planner.goodput.scores import paired_difference
from cascade.testing.scripts import print_result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("summary", type=Path, help="the goodput run's --json-out (its SLOs)")
    p.add_argument("first", type=Path)
    p.add_argument("second", type=Path)
    p.add_argument("--rate", type=float, required=True)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--resamples", type=int, default=1000)
    p.add_argument("--out")
    args = p.parse_args(argv)
    setting = json.loads(args.summary.read_text())["setting"]
    points = []
    for folder in (args.first, args.second):
        paths = [folder / f"rate-{args.rate:g}-seed-{int(s)}.json" for s in args.seeds.split(",")]
        missing = [str(path) for path in paths if not path.exists()]
        if missing:
            print(f"paired: no such point: {', '.join(missing)}", file=sys.stderr)
            return 2
        points.append([json.loads(path.read_text()) for path in paths])
    result = {"first": args.first.name, "second": args.second.name, "rate": args.rate, "seeds": args.seeds,
              "ttft_slo_s": setting["ttft_slo_s"], "e2e_slo_s": setting["e2e_slo_s"],
              "first_minus_second": paired_difference(points[0], points[1], setting["ttft_slo_s"],
                                                      setting["e2e_slo_s"], args.resamples)}
    print_result(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
