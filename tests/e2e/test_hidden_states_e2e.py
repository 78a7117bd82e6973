"""The router's opt-in ``hidden`` block with the real Qwen2.5-Coder-0.5B weights: a prompt's state is a
deterministic 896-vector; `cascade router train --features hidden` computes each prompt's state once (a second
training reads them all from the feature cache), and the router it saves is served -- loaded, warmed up, asked --
without the training part, predicting what training predicted."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from cascade.cli import main
from cascade.router import feature_cache, hidden
from cascade.router.hidden import HIDDEN_STATES, prompt_states
from cascade.router.train.pipeline import HIDDEN_VIEW

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

MATH = "Sam buys {a} apples for {b} dollars each. How much does he pay?"
ANIMAL = "What does a {animal} eat in winter?"
ANIMALS = ["cat", "dog", "horse", "owl", "whale", "fox", "bee", "crow", "mole", "seal", "wolf", "hare"]


def _outcomes(path: Path) -> list[str]:
    """A CSV where the weak tier fails the word problems and answers the animal questions; returns its prompts."""
    prompts, rows = [], ["prompt,weak,strong"]
    for i, animal in enumerate(ANIMALS):
        math, other = MATH.format(a=3 + 7 * i, b=2 + i), ANIMAL.format(animal=animal)
        prompts += [math, other]
        rows += [f"{math},false,true", f"{other},true,true"]
    path.write_text("\n".join(rows) + "\n")
    return prompts


def test_a_prompt_state_is_a_deterministic_vector_of_the_views_width() -> None:
    states = prompt_states(HIDDEN_VIEW, [MATH.format(a=5, b=3), ANIMAL.format(animal="cat"), MATH.format(a=5, b=3)])
    assert states.shape == (3, HIDDEN_STATES[HIDDEN_VIEW].dims) and np.all(np.isfinite(states))
    assert np.array_equal(states[0], states[2]) and not np.allclose(states[0], states[1])
    assert prompt_states(HIDDEN_VIEW, []).shape == (0, HIDDEN_STATES[HIDDEN_VIEW].dims)


def test_training_caches_each_state_and_the_saved_router_serves_what_it_trained(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(feature_cache, "default_root", lambda: tmp_path / "features")
    prompts = _outcomes(tmp_path / "outcomes.csv")
    args = ["router", "train", "--outcomes", str(tmp_path / "outcomes.csv"), "--tiers", "weak,strong",
            "--features", "hidden,lexical", "--cv-folds", "3", "--null-draws", "0", "--domain-quantile", "0"]
    assert main([*args, "--out", str(tmp_path / "router")]) == 0
    assert len(list((tmp_path / "features").rglob("*.npy"))) == len(prompts)

    def no_prefill(name: str, batch: list[str]) -> np.ndarray:
        raise AssertionError(f"state of {len(batch)} prompts computed again")

    monkeypatch.setattr(hidden, "_compute", no_prefill)
    assert main([*args, "--out", str(tmp_path / "again")]) == 0
    monkeypatch.undo()  # serving computes the states: it never reads the training cache

    from cascade.router.artifact import load_router
    from cascade.router.learned import LearnedSignal

    trained, _ = load_router(tmp_path / "again")
    served = LearnedSignal.load(tmp_path / "router", ["weak", "strong"])
    assert served.card.feature_spec.hidden_states == HIDDEN_VIEW
    unseen = [MATH.format(a=61, b=4), ANIMAL.format(animal="badger")]
    p_fail = [served.assess(p).p_fail for p in unseen]
    assert np.allclose(p_fail, trained.predict_p_fail(unseen))
    assert p_fail[0][0] > p_fail[1][0]


def test_the_hidden_block_computes_without_the_training_part() -> None:
    """A fresh interpreter featurizes a prompt with the hidden block: nothing of cascade.router.train is imported."""
    import subprocess

    code = ("import sys; from cascade.router.features import FeatureSpec, Featurizer;"
            f"f = Featurizer(FeatureSpec(lexical=False, hidden_states={HIDDEN_VIEW!r}));"
            "print(f.transform(['What is 2 + 2?']).shape);"
            "print(any(m.startswith('cascade.router.train') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split() == ["(1,", f"{HIDDEN_STATES[HIDDEN_VIEW].dims})", "False"], out.stderr
