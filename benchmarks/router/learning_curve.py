"""Would more labelled rows make the router better? APGR on held-out prompts against the number of training rows.

For each repeat r (seeds 0..R-1) the outcomes are split as `cascade router train --train-fraction F --seed r`
splits them (`split_indices`: repeat 0 with F = 0.5 on RouteLLM's GSM8K is the fixed split of the issue's
target); the test part stays fixed while the router is trained on the first n rows of a seeded shuffle of the
training part, for each n of --sizes (default: 1/8, 1/4, 1/2 and all of it, so the largest size is the router
`cascade router train` would fit on that split). Features are computed once and sliced; each point is
`cascade.router.train.train_router` on those rows (the command's pipeline: C chosen by inner CV as in training;
without its cross-validated metrics and domain check, which do not change p_fail).

Reported per size: APGR mean and sd over repeats, and the tier prior's APGR on the same test parts. The
summary `gain_per_doubling` is the least-squares slope of APGR against log2(n) within each repeat, mean and
sd over repeats, and `gain_last_step` the same between the two largest sizes (with how many repeats rose):
if it is clearly above 0 there, more labels are a lever; near 0, features are. `--plot FILE.png` draws the
curve with its sd band.

Output: one JSON object on stdout. Usage:
  .venv/bin/python -m benchmarks.router.learning_curve --outcomes ../shared/data/routellm/gsm8k_responses.csv \
      --tiers mistralai/Mixtral-8x7B-Instruct-v0.1,gpt-4-1106-preview --features lexical,steps,restated \
      --train-fraction 0.5 --repeats 8
  .venv/bin/python -m benchmarks.router.learning_curve --outcomes models/outcomes/gsm8k-train-embedded-v6.jsonl \
      --tiers smollm2-135m,qwen2.5-coder-0.5b,qwen2.5-coder-0.5b-reason --features lexical,steps \
      --train-fraction 0.5 --repeats 16
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from cascade.errors import ConfigError
from cascade.repo_paths import recorded_path, recorded_value
from cascade.router import evaluate as ev
from cascade.router.outcomes import load_outcomes, parse_tiers, split_indices
from cascade.router.train import TrainOptions, train_router, training_featurizer
from cascade.router.train.pipeline import classifier_for
from cascade.testing.scripts import print_result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--outcomes", required=True, help="outcomes JSONL or CSV, as `cascade router train` reads them")
    p.add_argument("--tiers", required=True, help="tier names / CSV columns, cheapest first, comma-separated")
    p.add_argument("--features", default="lexical", help="feature blocks as `cascade router train --features`")
    p.add_argument("--train-fraction", type=float, default=0.5, help="training part of each split (default 0.5)")
    p.add_argument("--sizes", help="training rows per point, comma-separated (default: 1/8, 1/4, 1/2, all)")
    p.add_argument("--repeats", type=int, default=8, help="splits, seeds 0..R-1 (default 8)")
    p.add_argument("--plot", help="PNG of APGR against training rows")
    p.add_argument("--json-out", help="also write the JSON here")
    args = p.parse_args(argv)
    if not 0.0 < args.train_fraction < 1.0:
        p.error(f"--train-fraction must be in (0, 1): the test part is what is measured, got {args.train_fraction}")
    if args.repeats < 2:
        p.error(f"--repeats must be at least 2 (the sd is over repeats), got {args.repeats}")
    return args


def sizes_for(n_train: int, requested: str | None) -> list[int]:
    if requested is None:
        return sorted({max(20, n_train // 8), max(20, n_train // 4), n_train // 2, n_train})
    sizes = sorted({int(s) for s in requested.split(",") if s.strip()})
    if not sizes or sizes[0] < 20 or sizes[-1] > n_train:
        raise ValueError(f"--sizes must lie in 20..{n_train} (the training part), got {requested}")
    return sizes


def per_doubling(sizes: list[int], apgrs: np.ndarray) -> np.ndarray:
    """Least-squares slope of APGR against log2(rows), one per repeat (rows of ``apgrs``)."""
    x = np.log2(np.asarray(sizes, dtype=float))
    x = x - x.mean()
    return (apgrs - apgrs.mean(axis=1, keepdims=True)) @ x / (x @ x)


def plot(path: str, sizes: list[int], apgrs: np.ndarray, prior: np.ndarray, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mean, sd = apgrs.mean(axis=0), apgrs.std(axis=0)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(sizes, mean, "o-", label=f"router (mean of {len(apgrs)} splits)")
    ax.fill_between(sizes, mean - sd, mean + sd, alpha=0.2, label="± 1 sd over splits")
    ax.axhline(float(prior.mean()), color="grey", ls="--", label="tier prior")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.set_xlabel("training rows")
    ax.set_ylabel("APGR on the held-out part")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    tiers = parse_tiers(args.tiers)
    outcomes = load_outcomes(args.outcomes, tiers)
    blocks = [b.strip() for b in args.features.split(",") if b.strip()]
    n_train = len(split_indices(len(outcomes), args.train_fraction, 0)[0])
    try:  # bad input is refused before the features are computed
        sizes = sizes_for(n_train, args.sizes)
        options = TrainOptions(features=tuple(blocks), domain_quantile=0.0, cv_folds=0).validate()
        model = classifier_for(options)
    except (ValueError, ConfigError) as e:
        print(f"router_learning_curve: {e}", file=sys.stderr)
        return 2
    X = training_featurizer(model).transform(outcomes.prompts)
    apgrs = np.zeros((args.repeats, len(sizes)))
    prior = np.zeros(args.repeats)
    for r in range(args.repeats):
        train, test = split_indices(len(outcomes), args.train_fraction, r)
        order = np.random.default_rng(r).permutation(train)
        correct = outcomes.correct[test]
        prior[r] = ev.apgr(ev.routing_curve(ev.prior_scores(correct), correct))
        for k, n in enumerate(sizes):
            rows = np.sort(order[:n])
            fitted = train_router(outcomes.subset(rows), options, X=X[rows]).model
            apgrs[r, k] = ev.apgr(ev.routing_curve(fitted.predict_p_fail_features(X[test]), correct))
        points = "  ".join(f"{n}: {a:.3f}" for n, a in zip(sizes, apgrs[r], strict=True))
        print(f"split {r}: {points}", file=sys.stderr)
    slopes = per_doubling(sizes, apgrs)
    top = per_doubling(sizes[-2:], apgrs[:, -2:])
    result = {
        "outcomes": recorded_value(args.outcomes), "tiers": tiers, "features": blocks, "rows": len(outcomes),
        "test_rows": len(outcomes) - n_train, "train_fraction": args.train_fraction, "repeats": args.repeats,
        "sizes": sizes,
        "apgr_mean": [round(float(v), 4) for v in apgrs.mean(axis=0)],
        "apgr_sd": [round(float(v), 4) for v in apgrs.std(axis=0)],
        "apgr_by_split": [[round(float(v), 4) for v in row] for row in apgrs],
        "prior_apgr_mean": round(float(prior.mean()), 4),
        "gain_per_doubling": {"mean": round(float(slopes.mean()), 4), "sd": round(float(slopes.std()), 4)},
        "gain_last_step": {"mean": round(float(top.mean()), 4), "sd": round(float(top.std()), 4),
                           "higher_in": int((top > 0).sum())},
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
    if args.plot:
        plot(args.plot, sizes, apgrs, prior, f"{args.outcomes.split('/')[-1]}: {', '.join(blocks)}")
        result["plot"] = recorded_path(args.plot)
    print_result(result, args.json_out, indent=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
