"""Router signals beyond the text (issue 63 item 2), each measured out of fold on fixed splits, beside the text
router and the random-route null, with what it costs per request. Prints JSON and writes
benchmarks/results/router_signals.json.

Families (cascade/router/knn.py, benchmarks/router/probe.py, hidden_states.py; none tuned on an evaluation split:
k, m, the probe's view and C are chosen per tier by cross-validation inside each training split):
  * text: the shipped feature blocks (the embedded router's card: lexical,steps; RouteLLM: lexical,steps,restated,
    the committed routellm-gsm8k router), the pipeline of `cascade router train`;
  * knn: kNN p_fail over MiniLM embeddings (the baseline each new family must beat);
  * hidden: a logistic probe per tier on Qwen2.5-Coder-0.5B's prompt states (prefill, chat template applied;
    layers 12, 18 and the final norm's output, mean-pooled and last token: 6 candidate views);
  * hidden <view> (e.g. "hidden last L18"): the probe on that one view, no choice among views;
  * hidden+text: the same with the text blocks' columns appended to every view;
  * hidden_soft, knn_soft (embedded ladder only): the reasoning tier trained on its failure rate over the sampled
    branches recorded for 379 of the 384 questions (cascade/testing/twin.py names the files) instead of one bit.

(a) The embedded ladder's 384 GSM8K questions (the card of models/routers/embedded-gsm8k): every family on the
    5 folds `cascade router train` cross-validates on (`outer_splits`), scored as the card is: APGR with its
    bootstrap interval, the paired APGR difference to the text router (`apgr_difference`), and the `best` operating
    point calibrated nested out of fold beside the random-route null (cascade/router/train/null.py).
(b) RouteLLM GSM8K, the fixed 50/50 split of seed 0 (benchmarks/router/quality.py): trained on 659, scored on 660.
    The answering models are Mixtral and GPT-4, so the 0.5B model is only a small local encoder here.
(c) --mmlu: RouteLLM MMLU, 5-fold GroupKFold by subject: kNN beside the text router (lexical, 1-SE; pooled
    out-of-fold APGR, and kNN - text with a paired bootstrap interval over prompts).
The same families over repeated fold assignments, intervals pooled: benchmarks/router/signals_repeated.py.
Costs: process CPU seconds per request for each family's features at a typical (median) GSM8K prompt and at
`max_prompt_chars` (8,192: the most the router reads), one thread.

Usage: .venv/bin/python -m benchmarks.router.signals [--skip-routellm] [--mmlu] [--draws 100]
       [--json-out benchmarks/results/router_signals.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import cached_property
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from threadpoolctl import threadpool_limits

from benchmarks.router.hidden_states import PromptStates, view_columns
from benchmarks.router.null_card import options_from_card
from benchmarks.router.probe import ProbeFailure
from benchmarks.router.signal_costs import costs
from benchmarks.router.signal_features import minilm, reasoning_fail_rates
from cascade.router import evaluate as ev
from cascade.router.artifact import RouterCard, read_card
from cascade.router.outcomes import Outcomes, load_outcomes, shared_data_dir, split_indices
from cascade.router.train.aux_models import training_featurizer
from cascade.router.train.estimator import outer_splits
from cascade.router.train.knn import KnnFailure
from cascade.router.train.pipeline import TrainOptions, classifier_for, out_of_fold_p_fail, train_router
from cascade.router.train.report import metrics_report, null_report
from cascade.testing.scripts import print_result

EMBEDDED_ROUTER = "models/routers/embedded-gsm8k"
EMBEDDED_OUTCOMES = "models/outcomes/gsm8k-train-embedded-v8.jsonl"  # the card's data (checked by sha256 below)
ROUTELLM_TIERS = ["mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview"]
ROUTELLM_TEXT = TrainOptions(features=("lexical", "steps", "restated"), cv_folds=0, domain_quantile=0.0)
# MMLU's text router: the lexical block alone (no GSM8K step counts), as benchmarks/router/quality.py fits it there
MMLU_TEXT = TrainOptions(features=("lexical",), cv_folds=0, domain_quantile=0.0)
RESULT = "benchmarks/results/router_signals.json"


def log(message: str) -> None:
    print(f"[signals {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# A family named "hidden <view>" (e.g. "hidden last L18") is the probe on that one view of hidden_states.view_columns;
# "hidden" alone chooses among all of them by the training rows' CV.
FIXED_VIEW = "hidden "


def family_views(family: str, views: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The views a hidden-state family's probe chooses among: the one it names after FIXED_VIEW, else all."""
    if not family.startswith(FIXED_VIEW):
        return views
    view = family.removeprefix(FIXED_VIEW)
    if view not in views:
        raise ValueError(f"{family!r}: no view {view!r}; the views are {', '.join(views)}")
    return {view: views[view]}


class Signals:
    """Each family's features for one set of prompts, computed (or read from the cache) once."""

    def __init__(self, outcomes: Outcomes, text_options: TrainOptions, states: PromptStates) -> None:
        self.outcomes = outcomes
        self.text_options = text_options
        self.states = states

    @cached_property
    def text(self) -> np.ndarray:
        return training_featurizer(classifier_for(self.text_options)).transform(self.outcomes.prompts)

    @cached_property
    def minilm(self) -> np.ndarray:
        log(f"MiniLM embeddings of {len(self.outcomes)} prompts")
        return minilm(self.outcomes.prompts)

    @cached_property
    def hidden(self) -> np.ndarray:
        log(f"hidden states of {len(self.outcomes)} prompts ({self.states.namespace})")
        return self.states.cache().vectors(self.outcomes.prompts, self.states.states, batch=16,
                                           on_batch=lambda done, todo: log(f"  hidden states {done}/{todo}"))

    @property
    def views(self) -> dict[str, np.ndarray]:
        return view_columns(self.hidden.shape[1] // len(view_columns(1)))

    @cached_property
    def with_text(self) -> np.ndarray:
        return np.hstack([self.hidden, self.text])

    @property
    def views_with_text(self) -> dict[str, np.ndarray]:
        text_columns = np.arange(self.hidden.shape[1], self.hidden.shape[1] + self.text.shape[1])
        return {f"{name} + text": np.r_[columns, text_columns] for name, columns in self.views.items()}

    def fitted(self, family: str, rows: np.ndarray, failed: np.ndarray, soft: np.ndarray | None,
               seed: int) -> tuple[Any, np.ndarray]:
        """(fitted model, feature matrix it predicts from) of `family` trained on `rows`."""
        if family.startswith("knn"):
            target = failed if soft is None else np.where(np.isnan(soft), failed, soft)
            return KnnFailure(random_state=seed).fit(self.minilm[rows], target), self.minilm
        if family.startswith("hidden+text"):
            probe = ProbeFailure(self.views_with_text, random_state=seed)
            return probe.fit(self.with_text[rows], failed, soft), self.with_text
        probe = ProbeFailure(family_views(family, self.views), random_state=seed)
        return probe.fit(self.hidden[rows], failed, soft), self.hidden


def chosen(model: Any) -> dict[str, Any]:
    if isinstance(model, KnnFailure):
        return {"k": model.k_.tolist(), "m": model.m_.tolist()}
    return {"view": model.view_, "C": [None if np.isnan(c) else float(c) for c in model.C_]}


def family_report(p_fail: np.ndarray, text: np.ndarray, outcomes: Outcomes, costs_: np.ndarray | None,
                  draws: int, folds: int, seed: int) -> dict[str, Any]:
    report = metrics_report(p_fail, outcomes.correct, costs_)
    entry: dict[str, Any] = {"apgr": report["apgr"], "apgr_ci95": report["apgr_ci95"],
                             "prior_apgr": report["prior_apgr"], "auc": report["auc"]}
    entry["apgr_minus_text"] = _difference(p_fail, text, outcomes.correct)
    if draws:
        null = null_report(p_fail, outcomes, costs_, draws=draws, folds=folds, seed=seed)
        entry["best"] = next(p for p in null["points"] if p["name"] == "best")
    return entry


def _difference(p_fail: np.ndarray, text: np.ndarray, correct: np.ndarray) -> dict[str, Any]:
    point, samples = ev.apgr_difference(p_fail, text, correct)
    low, high = np.percentile(samples, [2.5, 97.5])
    return {"mean": round(point, 4), "ci95": [round(float(low), 4), round(float(high), 4)]}


EMBEDDED_FAMILIES = ("knn", "knn_soft", "hidden", "hidden_soft", "hidden+text")


def embedded_inputs() -> tuple[RouterCard, TrainOptions, Outcomes, np.ndarray | None]:
    """The embedded router's card, its training options (5 folds), the outcomes it names (checked) and its costs."""
    card = read_card(EMBEDDED_ROUTER)
    options = options_from_card(card, cv_folds=5).validate()
    outcomes = load_outcomes(card.data.path, card.tiers)
    if outcomes.sha256 != card.data.sha256 or card.data.train_fraction != 1.0:
        raise SystemExit(f"{card.data.path} is not the data the card names, or the card holds rows out")
    return card, options, outcomes, None if options.costs is None else np.asarray(options.costs)


def embedded(states: PromptStates, draws: int, families: tuple[str, ...] = EMBEDDED_FAMILIES) -> dict[str, Any]:
    card, options, outcomes, costs_ = embedded_inputs()
    failed = ~outcomes.correct
    soft = np.full(failed.shape, np.nan)
    soft[:, -1], coverage = reasoning_fail_rates(outcomes.ids)
    signals = Signals(outcomes, options, states)
    log("text router, out of fold (the card's pipeline)")
    p_fail = {"text": out_of_fold_p_fail(outcomes, options)}
    splits = outer_splits(outcomes.correct, outcomes.groups, options.cv_folds, options.seed)
    picks: dict[str, list[dict[str, Any]]] = {}
    for family in families:
        log(f"{family}, out of fold")
        p_fail[family] = np.zeros(failed.shape)
        # Soft labels change only the reasoning tier's fit (the probe's tiers are independent): the other tiers'
        # out-of-fold p_fail are the hard family's.
        tiers = slice(-1, None) if family == "hidden_soft" else slice(None)
        if family == "hidden_soft":
            p_fail[family][:] = p_fail["hidden"]
        for train, test in splits:
            model, X = signals.fitted(family, train, failed[train][:, tiers],
                                      soft[train][:, tiers] if family.endswith("_soft") else None, options.seed)
            p_fail[family][test, tiers] = model.predict_p_fail(X[test])
            picks.setdefault(family, []).append(chosen(model))
    result: dict[str, Any] = {
        "data": card.data.path, "n": len(outcomes), "tiers": outcomes.tiers, "folds": options.cv_folds,
        "text_features": list(options.features), "card_cross_validated_apgr": card.metrics["cross_validated"]["apgr"],
        "soft_labels": {"tier": outcomes.tiers[-1], "rows_with_branches": coverage,
                        "target": "failure rate over the recorded branches (8, or the first wave of 2)"}}
    for family, values in p_fail.items():
        log(f"{family}: metrics and the random null ({draws} draws)")
        result[family] = family_report(values, p_fail["text"], outcomes, costs_, draws, options.cv_folds,
                                       options.seed)
        result[family]["chosen_per_fold"] = picks.get(family)
    return result


def routellm_outcomes() -> Outcomes:
    return load_outcomes(shared_data_dir() / "routellm" / "gsm8k_responses.csv", ROUTELLM_TIERS)


def routellm(states: PromptStates, families: tuple[str, ...]) -> dict[str, Any]:
    outcomes = routellm_outcomes()
    train_rows, test_rows = split_indices(len(outcomes), 0.5, 0)
    signals = Signals(outcomes, ROUTELLM_TEXT, states)
    test = outcomes.subset(test_rows)
    log("RouteLLM GSM8K: text router (lexical,steps,restated)")
    model = train_router(outcomes.subset(train_rows), ROUTELLM_TEXT, X=signals.text[train_rows]).model
    p_fail = {"text": model.predict_p_fail_features(signals.text[test_rows])}
    picks = {}
    failed = ~outcomes.correct
    for family in families:
        log(f"RouteLLM GSM8K: {family}")
        fitted, X = signals.fitted(family, train_rows, failed[train_rows], None, 0)
        p_fail[family] = fitted.predict_p_fail(X[test_rows])
        picks[family] = chosen(fitted)
    random = [ev.apgr(ev.routing_curve(np.random.default_rng(s).random(len(test)), test.correct)) for s in range(10)]
    result: dict[str, Any] = {"split": {"seed": 0, "train_rows": len(train_rows), "test_rows": len(test_rows)},
                              "random_mean_10_seeds": round(float(np.mean(random)), 4)}
    for family, values in p_fail.items():
        result[family] = family_report(values, p_fail["text"], test, None, 0, 0, 0) | {"chosen": picks.get(family)}
    return result


def mmlu() -> dict[str, Any]:
    from sklearn.model_selection import GroupKFold

    outcomes = load_outcomes(shared_data_dir() / "routellm" / "mmlu", ROUTELLM_TIERS)
    log(f"MMLU: MiniLM embeddings of {len(outcomes)} prompts")
    E = minilm(outcomes.prompts)
    folds = list(GroupKFold(5).split(E, groups=outcomes.groups))
    # Beside kNN, on the same folds: the text router as `cascade router train` fits it by default (lexical, C by the
    # 1-SE rule), benchmarks/router/quality.py's `cascade_lexical_1se` (0.594 there)
    text_options = msgspec.structs.replace(MMLU_TEXT, selection="log_loss_1se")
    X = training_featurizer(classifier_for(text_options)).transform(outcomes.prompts)
    p_fail = {"knn": np.zeros(outcomes.correct.shape), "text": np.zeros(outcomes.correct.shape)}
    for train, test in folds:
        log(f"  MMLU fold: {len(train)} train, {len(test)} unseen-subject prompts")
        p_fail["knn"][test] = KnnFailure().fit(E[train], ~outcomes.correct[train]).predict_p_fail(E[test])
        router = train_router(outcomes.subset(train), text_options, X=X[train]).model
        p_fail["text"][test] = router.predict_p_fail_features(X[test])
    result: dict[str, Any] = {"n": len(outcomes), "folds": "GroupKFold(5) by subject"}
    for family, values in p_fail.items():
        fold_mean = np.mean([ev.apgr(ev.routing_curve(values[te], outcomes.correct[te])) for _, te in folds])
        result[family] = {"pooled_apgr": round(ev.apgr(ev.routing_curve(values, outcomes.correct)), 4),
                          "fold_mean_apgr": round(float(fold_mean), 4)}
    point, samples = ev.apgr_difference(p_fail["knn"], p_fail["text"], outcomes.correct, 1000, seed=0)
    result["knn"]["minus_text"] = {"pooled_apgr": round(point, 4),
                                   "ci95": [round(float(v), 4) for v in np.percentile(samples, [2.5, 97.5])]}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-embedded", action="store_true")
    parser.add_argument("--skip-routellm", action="store_true")
    parser.add_argument("--skip-costs", action="store_true")
    parser.add_argument("--mmlu", action="store_true", help="kNN on RouteLLM MMLU (~12k MiniLM embeddings)")
    parser.add_argument("--draws", type=int, default=100, help="random-route null draws (0 skips the null)")
    parser.add_argument("--families", default=",".join(EMBEDDED_FAMILIES),
                        help="families beside the text router on the embedded ladder (hidden_soft needs hidden)")
    parser.add_argument("--routellm-families", default="knn,hidden,hidden+text",
                        help="families beside the text router on RouteLLM GSM8K (hidden states: ~1 s CPU a prompt)")
    parser.add_argument("--cache-only", choices=("embedded", "routellm"), default=None,
                        help="compute and cache one data set's MiniLM and hidden-state features, and stop")
    parser.add_argument("--json-out", default=RESULT)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    states = PromptStates()
    if args.cache_only:
        outcomes = (load_outcomes(EMBEDDED_OUTCOMES, read_card(EMBEDDED_ROUTER).tiers) if args.cache_only == "embedded"
                    else routellm_outcomes())
        signals = Signals(outcomes, ROUTELLM_TEXT, states)
        _ = signals.minilm, signals.hidden
        return 0
    # Each section records the command that wrote it: a run that skips a section keeps the one written before.
    command = "python -m benchmarks.router.signals " + " ".join(argv or sys.argv[1:])
    result: dict[str, Any] = {}
    with threadpool_limits(limits=1):
        if not args.skip_embedded:
            result["embedded_ladder"] = embedded(states, args.draws, tuple(args.families.split(",")))
        if not args.skip_routellm:
            result["routellm_gsm8k"] = routellm(states, tuple(args.routellm_families.split(",")))
        if args.mmlu:
            result["routellm_mmlu"] = mmlu()
        if not args.skip_costs:
            result["cost_per_request"] = costs(states)
    write_sections(result, args.json_out, command, start)
    return 0


def write_sections(result: dict[str, Any], json_out: str, command: str, start: float) -> None:
    """Print ``result`` and write it over the same keys of ``json_out`` (other keys kept), each section recording
    the command that wrote it and the seconds since ``start`` (perf_counter)."""
    for section in result.values():
        section["command"] = command
        section["elapsed_s"] = round(time.perf_counter() - start, 1)  # since the run started
    previous = Path(json_out)
    if previous.is_file():
        result = json.loads(previous.read_text()) | result
    print_result(result, json_out, indent=1)


if __name__ == "__main__":
    sys.exit(main())
