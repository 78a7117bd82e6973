"""Accept-by-confidence against accept-by-prior on labelled outcomes: APGR of a two-tier cascade. Prints JSON.

Method
  * Input: outcomes from `cascade label --logprobs` (cascade/data/outcomes.py); the cheap tier A and the strong
    tier B are `--tiers A,B` (default: the first two tiers of the file's first row). Rows used: both tiers graded,
    A's answer with `token_confidence` (B's statistics are reported where B has them on every row). An answer
    cut off (finish_reason not `stop`/`tool_calls`) has confidence 0, as cascade/router/acceptance.py reads it.
  * Each way of choosing which prompts to escalate from A to B is a score (higher: escalate first), read as a
    router by cascade/router/evaluate.py (`routing_curve`, `apgr`; `apgr_interval`: seeded percentile bootstrap,
    1000 resamples, the scores held fixed):
      - `prior`: the learned router's out-of-fold p_fail (`cascade router train` defaults, 5 folds, `--seed`),
        by expected gain p_fail[A] - p_fail[B]; `prior_difficulty`: p_fail[A] alone. Needs the prompt texts
        (stored with `--with-text`, else looked up by `dataset`/`id` in ../shared/data); `--no-prior` skips it;
      - `mean`, `lowest_group`, `tail`: 1 - that statistic of A's answer (cascade/branches/confidence.py);
      - `combined`: out-of-fold logistic regression (same seeded 5 folds, stratified on A correct when each
        class has 5 rows) of A correct on [p_fail[A], logit lowest_group, logit mean]; 1 - P(A correct);
      - `router` (with `--router DIR`): a trained router's p_fail[A], e.g. the embedded ladder's own router,
        trained on other prompts: the prior the gateway would really use; `combined_router`: the out-of-fold
        logistic mix with that p_fail in place of the out-of-fold prior;
      - `oracle` (RouteLLM's) and `random` (0.5) for reference.
  * Calibration per tier: logistic regression (L2, C=1) of correct on logit(`--statistic`) over the tier's
    complete answers, the map `[routing.confidence] calibration` takes: P = sigmoid(slope * logit(c) + intercept).

Reported: n, each tier's accuracy; per score APGR and its 95% interval; each token statistic's APGR minus each
prior's (`prior`, `router`) with a paired bootstrap interval (the same resamples for both); per tier the ROC AUC
of each statistic (1 - stat) and of the prior's p_fail for "this tier's answer is wrong"; the calibration and a
ready-to-paste TOML line; at the operating point "accept A's answer when P(correct) >= 0.5" the share escalated
and the accuracy, for calibrated confidence and for the prior (1 - p_fail[A]); the calibration is fitted and
scored on the same rows (in-sample). `--plot FILE.png`: PGR against the share escalated.
Usage: .venv/bin/python -m benchmarks.router.answer_confidence OUTCOMES.jsonl [--tiers A,B] [--statistic lowest_group]
       [--seed 0] [--no-prior] [--router DIR] [--plot out.png] [--out out.json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from cascade.branches.confidence import STATISTICS
from cascade.data.datasets import DatasetError
from cascade.data.outcomes import OutcomeRow, read_rows, write_row
from cascade.errors import ConfigError
from cascade.repo_paths import recorded_path
from cascade.router import evaluate as ev
from cascade.testing.scripts import fail, print_result

MIN_ROWS = 20
FOLDS = 5
COMPLETE = ("stop", "tool_calls")


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return np.asarray(np.log(p / (1 - p)))


def confidence(rows: list[OutcomeRow], tier: str, statistic: str) -> np.ndarray:
    """A tier's answer confidence per row; 0 for an answer cut off."""
    out = []
    for row in rows:
        t = row.tiers[tier]
        assert t.token_confidence is not None
        out.append(t.token_confidence.read(statistic) if t.finish_reason in COMPLETE else 0.0)
    return np.array(out)


def prior_p_fail(rows: list[OutcomeRow], tiers: list[str], seed: int) -> np.ndarray:
    """Out-of-fold p_fail (n, 2) of the router `cascade router train` builds, on exactly these rows."""
    from cascade.router.outcomes import load_outcomes
    from cascade.router.train.pipeline import TrainOptions, out_of_fold_p_fail

    with tempfile.TemporaryDirectory(prefix="answer-confidence-") as tmp:
        path = Path(tmp) / "rows.jsonl"
        with path.open("wb") as sink:
            for row in rows:
                write_row(sink, row)
        try:
            outcomes = load_outcomes(path, tiers)
        except ConfigError as exc:  # name the row by its place among the rows used, not the temporary file
            raise ConfigError(str(exc).replace(f"{path}:", "used row ")) from None
    return out_of_fold_p_fail(outcomes, TrainOptions(seed=seed, cv_folds=FOLDS))


def router_p_fail(rows: list[OutcomeRow], router_dir: str, tier: str) -> np.ndarray:
    """p_fail of `tier` from a trained router artifact (what the gateway's prior is), per row's prompt."""
    from cascade.data.datasets import prompts_by_id
    from cascade.router.artifact import load_router

    model, card = load_router(router_dir)
    if tier not in card.tiers:
        raise ConfigError(f"router {router_dir} has no tier {tier!r}; it has {', '.join(card.tiers)}")
    texts = {r.id: r.prompt for r in rows if r.prompt and r.id}
    missing = {r.id for r in rows if r.id and r.id not in texts}
    texts |= prompts_by_id(missing)
    prompts = [r.prompt or texts[r.id or ""] for r in rows]
    return np.asarray(model.predict_p_fail(prompts)[:, list(card.tiers).index(tier)])


def paired_difference(first: np.ndarray, second: np.ndarray, correct: np.ndarray, seed: int) -> dict[str, Any]:
    """APGR(first) - APGR(second) with a paired percentile bootstrap (cascade/router/evaluate.py)."""
    point, values = ev.apgr_difference(first, second, correct, n_resamples=1000, seed=seed)
    low, high = np.percentile(values, [2.5, 97.5]) if values.size else (np.nan, np.nan)
    return {"difference": ev.finite(float(point)), "ci95": [ev.finite(float(low)), ev.finite(float(high))],
            "share_above_0": ev.finite(float((values > 0).mean())) if values.size else None}


def out_of_fold_combined(features: np.ndarray, correct_a: np.ndarray, seed: int) -> np.ndarray:
    """1 - out-of-fold P(A correct) from a logistic regression on `features`."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import KFold, StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    stratify = min(correct_a.sum(), (~correct_a).sum()) >= FOLDS
    folds = (StratifiedKFold if stratify else KFold)(FOLDS, shuffle=True, random_state=seed)
    score = np.full(len(correct_a), 0.5)
    for train, test in folds.split(features, correct_a):
        if len(set(correct_a[train])) < 2:
            score[test] = 1.0 - correct_a[train].mean()
            continue
        model = make_pipeline(StandardScaler(), LogisticRegression()).fit(features[train], correct_a[train])
        score[test] = 1.0 - model.predict_proba(features[test])[:, 1]
    return score


def calibration(conf: np.ndarray, correct: np.ndarray, complete: np.ndarray) -> list[float] | None:
    """[slope, intercept] of P(correct) = sigmoid(slope * logit(c) + intercept) over complete answers."""
    from sklearn.linear_model import LogisticRegression

    y = correct[complete]
    if len(set(y)) < 2:
        return None
    fit = LogisticRegression().fit(logit(conf[complete])[:, None], y)
    return [round(float(fit.coef_[0, 0]), 4), round(float(fit.intercept_[0]), 4)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outcomes", help="outcomes JSONL from `cascade label --logprobs`")
    parser.add_argument("--tiers", help="cheap,strong tier names (default: the first two of the first row)")
    parser.add_argument("--statistic", choices=STATISTICS, default="lowest_group", help="the one to calibrate")
    parser.add_argument("--seed", type=int, default=0, help="CV folds and bootstrap (default 0)")
    parser.add_argument("--no-prior", action="store_true", help="skip the learned router (no prompt texts)")
    parser.add_argument("--router", default="", help="also score by a trained router's p_fail of tier A "
                        "(e.g. models/routers/embedded-gsm8k: the gateway's own prior, trained on other prompts)")
    parser.add_argument("--plot", default="")
    parser.add_argument("--out", "--json-out", dest="out", default="")
    args = parser.parse_args(argv)
    try:
        all_rows = [row for _, row in read_rows(args.outcomes)]
    except DatasetError as exc:
        return fail(str(exc))
    if not all_rows:
        return fail(f"{args.outcomes} holds no rows")
    tiers = [t.strip() for t in args.tiers.split(",")] if args.tiers else list(all_rows[0].tiers)[:2]
    if len(tiers) != 2 or tiers[0] == tiers[1]:
        return fail(f"--tiers needs two distinct tier names, cheap first; got {tiers}")
    unknown = [t for t in tiers if not any(t in row.tiers for row in all_rows)]
    if unknown:
        return fail(f"unknown tier(s) {', '.join(unknown)}; {args.outcomes} has {', '.join(all_rows[0].tiers)}")
    rows = [r for r in all_rows if all(t in r.tiers and r.tiers[t].correct is not None for t in tiers)
            and r.tiers[tiers[0]].token_confidence is not None]
    if len(rows) < MIN_ROWS:
        return fail(f"{len(rows)} rows have graded answers on {' and '.join(tiers)} with token_confidence on "
                    f"{tiers[0]}; need {MIN_ROWS} (label with `cascade label --logprobs`)")
    correct = np.array([[bool(r.tiers[t].correct) for t in tiers] for r in rows])
    # B's statistics only where every row has them (B may be a recorded model without logprobs).
    scored = [t for t in tiers if all(r.tiers[t].token_confidence is not None for r in rows)]
    conf = {t: {s: confidence(rows, t, s) for s in STATISTICS} for t in scored}
    complete = {t: np.array([r.tiers[t].finish_reason in COMPLETE for r in rows]) for t in scored}
    oof = None
    if not args.no_prior:
        try:
            oof = prior_p_fail(rows, tiers, args.seed)
        except ConfigError as exc:
            return fail(f"the prior needs the prompt texts: {exc} (or run with --no-prior)")

    a = tiers[0]
    scores: dict[str, np.ndarray] = {s: 1.0 - conf[a][s] for s in STATISTICS}
    features = [logit(conf[a]["lowest_group"]), logit(conf[a]["mean"])]
    if oof is not None:
        scores = {"prior": oof[:, 0] - oof[:, 1], "prior_difficulty": oof[:, 0], **scores}
        features.insert(0, oof[:, 0])
    scores["combined"] = out_of_fold_combined(np.column_stack(features), correct[:, 0], args.seed)
    trained = None
    if args.router:
        try:
            trained = router_p_fail(rows, args.router, a)
        except (ConfigError, DatasetError) as exc:
            return fail(f"--router: {exc}")
        scores["router"] = trained
        mixed = np.column_stack([trained, logit(conf[a]["lowest_group"]), logit(conf[a]["mean"])])
        scores["combined_router"] = out_of_fold_combined(mixed, correct[:, 0], args.seed)
    scores["oracle"] = ev.oracle_scores(correct)
    curves = {name: ev.routing_curve(score, correct) for name, score in scores.items()}
    apgr: dict[str, Any] = {name: {"apgr": ev.finite(ev.apgr(curve)), "ci95": [
        ev.finite(v) for v in ev.apgr_interval(scores[name], correct, n_resamples=1000, seed=args.seed)]}
        for name, curve in curves.items()}
    apgr["random"] = {"apgr": 0.5, "ci95": None}
    priors = [name for name in ("prior", "router") if name in scores]
    paired = {f"{stat}_minus_{prior}": paired_difference(scores[stat], scores[prior], correct, args.seed)
              for stat in STATISTICS for prior in priors}

    auc_wrong = {t: {**({s: ev.finite(ev.roc_auc(1.0 - conf[t][s], ~correct[:, i])) for s in STATISTICS}
                        if t in conf else {}),
                     **({} if oof is None else {"prior": ev.finite(ev.roc_auc(oof[:, i], ~correct[:, i]))}),
                     **({"router": ev.finite(ev.roc_auc(trained, ~correct[:, 0]))}
                        if trained is not None and i == 0 else {})}
                 for i, t in enumerate(tiers)}
    cal = {t: calibration(conf[t][args.statistic], correct[:, i], complete[t]) for i, t in enumerate(tiers)
           if t in conf}
    fitted = {t: c for t, c in cal.items() if c is not None}
    toml = "calibration = { " + ", ".join(f'"{t}" = [{s}, {i}]' for t, (s, i) in fitted.items()) + " }"

    def operating(escalate: np.ndarray) -> dict[str, float | None]:
        accuracy = np.where(escalate, correct[:, 1], correct[:, 0]).mean()
        return {"escalated": ev.finite(float(escalate.mean())), "accuracy": ev.finite(float(accuracy))}

    point: dict[str, Any] = {"rule": f"accept {a}'s answer when P(correct) >= 0.5 (in-sample calibration)"}
    cal_a = cal.get(a)
    if cal_a is not None:
        slope, intercept = cal_a
        p_right = 1.0 / (1.0 + np.exp(-(slope * logit(conf[a][args.statistic]) + intercept)))
        point["confidence"] = operating(~complete[a] | (p_right < 0.5))
    if oof is not None:
        point["prior"] = operating(1.0 - oof[:, 0] < 0.5)
    result = {
        "outcomes": recorded_path(args.outcomes), "tiers": tiers, "statistic": args.statistic, "seed": args.seed,
        "n": len(rows), "rows_in_file": len(all_rows),
        "accuracy": {t: ev.finite(float(correct[:, i].mean())) for i, t in enumerate(tiers)},
        "apgr": apgr, "paired_apgr_difference": paired, "auc_wrong": auc_wrong, "calibration": cal,
        "calibration_toml": toml,
        "operating_point": point,
    }
    print_result(result, args.out, indent=1)
    if args.plot:
        plot(curves, tiers, args.plot)
    return 0


def plot(curves: dict[str, ev.Curve], tiers: list[str], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5), dpi=110)
    for name, style in (("prior", "-"), ("lowest_group", "-"), ("mean", "-."), ("combined", "-"), ("oracle", ":")):
        if name in curves:
            curve = curves[name]
            ax.plot(curve.x, curve.pgr, style, label=f"{name} (APGR {ev.apgr(curve):.2f})")
    ax.plot([0, 1], [0, 1], "--", color="grey", label="random (APGR 0.50)")
    ax.set_xlabel(f"share escalated from {tiers[0]} to {tiers[1]}")
    ax.set_ylabel("PGR (performance gap recovered)")
    ax.set_title("accept by answer confidence vs by prior", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
