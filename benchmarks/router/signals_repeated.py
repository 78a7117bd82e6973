"""Router signals over repeated fold assignments (issue 63 item 2, second part): is the hidden-state probe's lead over
the text router (+0.024 APGR on one fold assignment, one seed) more than split luck? Writes the keys
`embedded_ladder_repeated` and `routellm_gsm8k_repeated` of benchmarks/results/router_signals.json (other keys
kept).

Families (benchmarks/router/signals.py says how each is fitted): text, knn, hidden (the probe chooses among the 6
views, layer x pooling, by CV inside each training split: nested), one probe per fixed view reported without any
choice among them (last L18, the view last session's CV preferred; last Lfinal and mean Lfinal, what an engine
returns), and hidden+text (6 views with the text columns, chosen nested). Hard labels only.

(a) Embedded ladder, 384 questions: repeat r (seeds 0..R-1) draws the 5 outer folds with seed r (`outer_splits`,
    stratified as `cascade router train` draws them) and seeds every inner CV (the text router's C, kNN's k and m,
    the probe's view and C) with r; seed 0 is the single run in `embedded_ladder`. `best` is calibrated nested on
    the out-of-fold p_fail and set beside the random null with seed r (its own 5 calibration folds, >= 100 draws).
(b) RouteLLM GSM8K: the fixed 50/50 split of seed 0 (659 train, 660 test) in every repeat; only the inner CV seeds
    vary (r), and the bootstrap resamples of the 660 test questions. `best` and the null are calibrated nested over
    5 folds of the test rows (no token counts: cost is the share of prompts sent to GPT-4).
Intervals: benchmarks/router/repeated_cv.py (per repeat a paired bootstrap over questions, the repeats' samples
pooled).

Usage: .venv/bin/python -m benchmarks.router.signals_repeated [--repeats 5] [--draws 100] [--skip-embedded]
       [--skip-routellm] [--json-out benchmarks/results/router_signals.json]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from typing import Any

import msgspec
import numpy as np
from threadpoolctl import threadpool_limits

from benchmarks.router.hidden_states import PromptStates
from benchmarks.router.repeated_cv import check_repeats, repeated_apgr, repeated_difference, repeated_versus_null
from benchmarks.router.signals import (
    RESULT,
    ROUTELLM_TEXT,
    Signals,
    chosen,
    embedded_inputs,
    log,
    routellm_outcomes,
    write_sections,
)
from cascade.router.outcomes import split_indices
from cascade.router.train.estimator import outer_splits
from cascade.router.train.null import DEFAULT_FOLDS, check_draws
from cascade.router.train.pipeline import out_of_fold_p_fail, train_router

FAMILIES = ("knn", "hidden", "hidden last L18", "hidden last Lfinal", "hidden mean Lfinal", "hidden+text")
INTERVAL = ("per repeat a paired percentile bootstrap over questions (1,000 resamples, seed r), the repeats' samples "
            "pooled; 2.5-97.5 percentiles")


def family_summary(p_fail: list[np.ndarray], text: list[np.ndarray], correct: np.ndarray, costs: np.ndarray | None,
                   tokens: np.ndarray | None, draws: int, picks: list[dict[str, Any]]) -> dict[str, Any]:
    """APGR over repeats, the pooled difference to the text router and `best` out of fold beside the null."""
    entry: dict[str, Any] = {"apgr": repeated_apgr(p_fail, correct, costs),
                             "apgr_minus_text": repeated_difference(p_fail, text, correct)}
    if draws:
        entry["best_out_of_fold"] = repeated_versus_null(p_fail, correct, costs=costs, tokens=tokens, draws=draws)
    views = view_counts(picks)
    if views:
        entry["views_chosen"] = views
    return entry


def view_counts(picks: list[dict[str, Any]]) -> dict[str, int]:
    """How often each view was chosen over tiers x folds x repeats (a constant tier chooses none)."""
    counts = Counter(view for pick in picks for view in pick.get("view", []) if view is not None)
    return dict(counts.most_common())


def embedded_repeated(states: PromptStates, repeats: int, draws: int, families: tuple[str, ...]) -> dict[str, Any]:
    card, options, outcomes, costs = embedded_inputs()
    signals = Signals(outcomes, options, states)
    failed = ~outcomes.correct
    p_fail: dict[str, list[np.ndarray]] = {name: [] for name in ("text", *families)}
    picks: dict[str, list[dict[str, Any]]] = {name: [] for name in families}
    for seed in range(repeats):
        log(f"embedded ladder, repeat {seed + 1}/{repeats}: text router")
        p_fail["text"].append(out_of_fold_p_fail(outcomes, msgspec.structs.replace(options, seed=seed)))
        splits = outer_splits(outcomes.correct, outcomes.groups, options.cv_folds, seed)
        for family in families:
            log(f"embedded ladder, repeat {seed + 1}/{repeats}: {family}")
            out_of_fold = np.zeros(failed.shape)
            for train, test in splits:
                model, X = signals.fitted(family, train, failed[train], None, seed)
                out_of_fold[test] = model.predict_p_fail(X[test])
                picks[family].append(chosen(model))
            p_fail[family].append(out_of_fold)
    result: dict[str, Any] = {
        "data": card.data.path, "n": len(outcomes), "folds": options.cv_folds, "repeats": repeats,
        "seeds": list(range(repeats)), "varies": "outer folds (StratifiedKFold, seed r) and every inner CV's seed",
        "interval": INTERVAL, "null": f"seed r, {draws} draws, thresholds calibrated nested over 5 folds"}
    for family, values in p_fail.items():
        log(f"embedded ladder: {family}: pooled intervals and the null")
        result[family] = family_summary(values, p_fail["text"], outcomes.correct, costs, outcomes.tokens, draws,
                                        picks.get(family, []))
    return result


def routellm_repeated(states: PromptStates, repeats: int, draws: int, families: tuple[str, ...]) -> dict[str, Any]:
    outcomes = routellm_outcomes()
    train_rows, test_rows = split_indices(len(outcomes), 0.5, 0)
    signals = Signals(outcomes, ROUTELLM_TEXT, states)
    train, test = outcomes.subset(train_rows), outcomes.subset(test_rows)
    failed = ~outcomes.correct
    p_fail: dict[str, list[np.ndarray]] = {name: [] for name in ("text", *families)}
    picks: dict[str, list[dict[str, Any]]] = {name: [] for name in families}
    for seed in range(repeats):
        log(f"RouteLLM GSM8K, repeat {seed + 1}/{repeats}")
        model = train_router(train, msgspec.structs.replace(ROUTELLM_TEXT, seed=seed), X=signals.text[train_rows]).model
        p_fail["text"].append(model.predict_p_fail_features(signals.text[test_rows]))
        for family in families:
            fitted, X = signals.fitted(family, train_rows, failed[train_rows], None, seed)
            p_fail[family].append(fitted.predict_p_fail(X[test_rows]))
            picks[family].append(chosen(fitted))
    result: dict[str, Any] = {
        "split": {"seed": 0, "train_rows": len(train_rows), "test_rows": len(test_rows)}, "repeats": repeats,
        "seeds": list(range(repeats)), "varies": "every inner CV's seed (the split is fixed)", "interval": INTERVAL,
        "null": f"seed r, {draws} draws, thresholds calibrated nested over 5 folds of the test rows"}
    for family, values in p_fail.items():
        result[family] = family_summary(values, p_fail["text"], test.correct, None, test.tokens, draws,
                                        picks.get(family, []))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="fold assignments / seeds 0..R-1")
    parser.add_argument("--draws", type=int, default=100, help="random-route null draws per repeat (0 skips it)")
    parser.add_argument("--families", default=",".join(FAMILIES), help="families beside the text router")
    parser.add_argument("--skip-embedded", action="store_true")
    parser.add_argument("--skip-routellm", action="store_true")
    parser.add_argument("--json-out", default=RESULT)
    args = parser.parse_args(argv)
    check_repeats(args.repeats)
    if args.draws:
        check_draws(args.draws, DEFAULT_FOLDS)
    families = tuple(args.families.split(","))
    start = time.perf_counter()
    states = PromptStates()
    result: dict[str, Any] = {}
    with threadpool_limits(limits=1):
        if not args.skip_embedded:
            result["embedded_ladder_repeated"] = embedded_repeated(states, args.repeats, args.draws, families)
        if not args.skip_routellm:
            result["routellm_gsm8k_repeated"] = routellm_repeated(states, args.repeats, args.draws, families)
    write_sections(result, args.json_out, "python -m benchmarks.router.signals_repeated " + " ".join(
        argv or sys.argv[1:]), start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
