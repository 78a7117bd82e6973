"""A shipped router's named operating points beside the random-route null, from its own card: prints JSON and, with
`--write-card`, records them in the card (metrics.cross_validated.random_null, as `cascade router train` now does)
without touching the model file or the calibration the gateway serves.

Method
  * The card names the outcomes it was trained on (data.path, data.sha256: a file with other bytes is refused),
    the split (data.train_fraction, data.split_seed), the feature blocks, the estimator's parameters and the seed.
    From them the out-of-fold p_fail `cascade router train` calibrated on is recomputed (`--cv-folds`, the command's
    default 5) and checked against the card: its cross-validated APGR and each operating point's accuracy must come
    back to the card's 4 decimals, else nothing is written (the card's numbers would not be this code's).
  * cascade/router/train/null.py on those p_fail: `--draws` uniform route scores (`--seed`, default the card's),
    each calibrated by the card's rule on the same rows, in sample and nested over the same number of folds.
Usage: .venv/bin/python -m benchmarks.router.null_card ROUTER_DIR [--cv-folds 5] [--draws 100] [--out out.json]
       [--write-card]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from cascade.router.artifact import CARD_FILE, RouterCard, read_card
from cascade.router.outcomes import load_outcomes, split_indices
from cascade.router.train.null import DEFAULT_DRAWS
from cascade.router.train.pipeline import TrainOptions, out_of_fold_p_fail
from cascade.router.train.report import metrics_report, null_report, operating_points


def options_from_card(card: RouterCard, cv_folds: int) -> TrainOptions:
    spec, params = card.feature_spec, card.params
    blocks = [name for name, used in (("lexical", spec.lexical), ("hash", spec.hash_features),
                                      ("minilm", spec.embeddings), ("steps", spec.steps),
                                      ("restated", spec.restated_number), ("topic", spec.topic_components),
                                      ("hidden", spec.hidden_states)) if used]
    return TrainOptions(
        features=tuple(blocks), aux_data=params.get("steps_data"), topic_components=spec.topic_components or 4,
        hash_features=spec.hash_features or 1024, estimator=params["estimator"], alpha=params["alpha"],
        C=params["C"], selection=params["selection"], domain_quantile=params["domain_quantile"],
        domain_words=params["domain_words"], domain_embeddings=params["domain_embeddings"], seed=card.seed,
        train_fraction=card.data.train_fraction, cv_folds=cv_folds, costs=tuple(card.calibration.costs)
        if card.calibration else None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("router")
    parser.add_argument("--cv-folds", type=int, default=5)
    parser.add_argument("--draws", type=int, default=DEFAULT_DRAWS)
    parser.add_argument("--seed", type=int, default=None, help="the null's seed (default: the card's)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--write-card", action="store_true")
    args = parser.parse_args(argv)
    card = read_card(args.router)
    options = options_from_card(card, args.cv_folds).validate()
    outcomes = load_outcomes(card.data.path, card.tiers)  # repo-relative: run from the root
    if outcomes.sha256 != card.data.sha256:
        sys.exit(f"{card.data.path} is not the data the card names (sha256 differs)")
    train_rows, _ = split_indices(len(outcomes), card.data.train_fraction, card.data.split_seed or card.seed)
    train = outcomes.subset(train_rows)
    p_fail = out_of_fold_p_fail(train, options)
    costs = None if options.costs is None else np.asarray(options.costs)
    recomputed = metrics_report(p_fail, train.correct, costs)
    recomputed["operating_points"] = operating_points(p_fail, train, card.calibration, costs)
    stated = card.metrics["cross_validated"]
    if _headline(recomputed) != _headline(stated):
        sys.exit(f"the card's cross-validated numbers do not come back: {_headline(stated)} stated, "
                 f"{_headline(recomputed)} recomputed; nothing written")
    report = null_report(p_fail, train, costs, draws=args.draws, folds=args.cv_folds,
                         seed=card.seed if args.seed is None else args.seed)
    text = json.dumps({"router": args.router, "cross_validated_apgr": stated["apgr"], "random_null": report},
                      indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    if args.write_card:
        metrics = card.metrics | {"cross_validated": stated | {"random_null": report}}
        recarded = msgspec.structs.replace(card, metrics=metrics)
        path = Path(args.router) / CARD_FILE
        path.write_bytes(msgspec.json.format(msgspec.json.encode(recarded), indent=2) + b"\n")
    return 0


def _headline(report: dict[str, Any]) -> tuple[Any, ...]:
    return report["apgr"], tuple((row["name"], row["accuracy"]) for row in report["operating_points"])


if __name__ == "__main__":
    sys.exit(main())
