"""Router artifacts: a directory with the fitted classifier (``router.skops``) and its card (``card.json``).

The card names everything the router depends on: tiers, feature spec, versions of cascade, scikit-learn,
numpy and skops, the training data's sha256 and split, the seed, the chosen hyper-parameters and the
metrics measured at training time. Loading refuses, with a one-line reason:

* a card that does not parse, or a model file whose sha256 is not the card's (tampered or swapped);
* a feature spec this code cannot reproduce (spec version or lexical feature names changed), or a model
  whose steps or topic block (auxiliary model) is missing or was fitted on other data than the card names;
* another cascade version, another scikit-learn minor version or another numpy major version;
* any type in the model file outside the allowlist below: the file is read by skops, never by pickle,
  so an untrusted file cannot run code.
"""

from __future__ import annotations

import hashlib
import platform
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import msgspec

from cascade import __version__ as cascade_version
from cascade import files
from cascade.errors import ConfigError
from cascade.repo_paths import recorded_path, recorded_value
from cascade.router.features import LEXICAL_NAMES, FeatureSpec
from cascade.router.operating import Calibration

MODEL_FILE = "router.skops"
CARD_FILE = "card.json"
CARD_FORMAT = 1
# Every type a DifficultyClassifier file may contain (besides skops' own builtins and numpy arrays).
TRUSTED_TYPES = ["cascade.router.classifier.DifficultyClassifier", "cascade.router.features.StepsModel",
                 "cascade.router.features.TopicModel", "cascade.router.domain.WordModel"]


class DataRef(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    path: str
    sha256: str
    n_rows: int
    train_rows: int
    split_seed: int | None = None
    train_fraction: float = 1.0


class AuxDataRef(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The data an auxiliary feature model was fitted on (GSM8K training questions and solutions): the steps
    block reports its regression's CV R^2, the topic block the variance share of its principal axes."""

    block: str
    path: str
    sha256: str
    n_rows: int
    cv_r2: float | None = None
    explained_variance: float | None = None


class RouterCard(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    format: int = CARD_FORMAT
    tiers: list[str]
    feature_spec: FeatureSpec
    lexical_names_sha256: str
    params: dict[str, Any]
    versions: dict[str, str]
    data: DataRef
    seed: int
    metrics: dict[str, Any]
    model_sha256: str
    created_with: str = "cascade router train"
    # Operating points calibrated on out-of-fold p_fail (cascade/router/train/calibration.py); the gateway
    # uses them unless a plan or the config gives thresholds.
    calibration: Calibration | None = None
    # Auxiliary feature models inside the router (the steps block), with the data they were fitted on.
    aux_data: list[AuxDataRef] = msgspec.field(default_factory=list)


def runtime_versions() -> dict[str, str]:
    versions = {"cascade": cascade_version, "python": platform.python_version()}
    for dist, key in (("scikit-learn", "sklearn"), ("numpy", "numpy"), ("skops", "skops")):
        try:
            versions[key] = version(dist)
        except PackageNotFoundError:
            versions[key] = "missing"
    return versions


def lexical_names_sha256() -> str:
    return hashlib.sha256("\n".join(LEXICAL_NAMES).encode()).hexdigest()


def save_router(model: Any, out_dir: str | Path, *, tiers: list[str], data: DataRef, metrics: dict[str, Any],
                calibration: Calibration | None = None) -> Path:
    """Write ``router.skops`` and ``card.json`` into ``out_dir`` (created if needed); returns the card path."""
    import skops.io as sio

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model_path = out / MODEL_FILE
    sio.dump(model, model_path)
    params = {k: (list(v) if isinstance(v, tuple) else v) for k, v in model.get_params().items()}
    if params.get("steps_data") is not None:  # --aux-data as given: recorded repo-relative
        params["steps_data"] = recorded_value(params["steps_data"])
    params["C_chosen"] = [float(c) for c in model.C_]
    if getattr(model, "knn_k_", None) is not None:  # the kNN estimator's per-tier choices
        params["knn_k_chosen"] = [int(k) for k in model.knn_k_]
        params["knn_m_chosen"] = [float(m) for m in model.knn_m_]
    threshold = getattr(model, "domain_threshold_", None)
    params["domain_threshold"] = None if threshold is None else round(float(threshold), 4)
    words = getattr(model, "domain_words_", None)
    params["domain_word_threshold"] = None if words is None else round(float(words.threshold), 4)
    residual = getattr(model, "domain_residual_threshold_", None)
    params["domain_residual_threshold"] = None if residual is None else round(float(residual), 4)
    card = RouterCard(
        tiers=list(tiers), feature_spec=model.spec, lexical_names_sha256=lexical_names_sha256(), params=params,
        versions=runtime_versions(), data=data, seed=int(model.random_state), metrics=metrics,
        model_sha256=hashlib.sha256(model_path.read_bytes()).hexdigest(), calibration=calibration,
        aux_data=_aux_data(model),
    )
    card_path = out / CARD_FILE
    card_path.write_bytes(msgspec.json.format(msgspec.json.encode(card), indent=2) + b"\n")
    return card_path


def _aux_data(model: Any) -> list[AuxDataRef]:
    refs = []
    steps = getattr(model, "steps_model_", None) if model.spec.steps else None
    if steps is not None:
        refs.append(AuxDataRef(block="steps", path=_recorded(steps.data_path), sha256=steps.data_sha256,
                               n_rows=steps.n_rows, cv_r2=steps.cv_r2))
    topic = getattr(model, "topic_model_", None) if model.spec.topic_components else None
    if topic is not None:
        refs.append(AuxDataRef(block="topic", path=_recorded(topic.data_path), sha256=topic.data_sha256,
                               n_rows=topic.n_rows, explained_variance=topic.explained_variance))
    return refs


def _recorded(data_path: str) -> str:
    # Models fitted before paths were recorded repo-relative hold the machine's absolute path.
    return recorded_path(data_path) if Path(data_path).is_absolute() else data_path


def _same_aux_data(a: list[AuxDataRef], b: list[AuxDataRef]) -> bool:
    """Whether two lists name the same auxiliary data: its sha256 (and rows, fit statistics) identify it; the path
    only says where it was read, which differs between machines."""
    return [msgspec.structs.replace(r, path="") for r in a] == [msgspec.structs.replace(r, path="") for r in b]


def read_card(router_dir: str | Path) -> RouterCard:
    path = Path(router_dir) / CARD_FILE
    if not path.is_file():
        raise ConfigError(f"{path} not found: is {router_dir} a directory from `cascade router train`?")
    return files.load(path, RouterCard, "router card")


def check_compatible(card: RouterCard, current: dict[str, str] | None = None) -> None:
    """Raise ConfigError if this code cannot reproduce the card's router."""
    current = current or runtime_versions()
    retrain = "retrain it with `cascade router train`"
    if card.format != CARD_FORMAT:
        raise ConfigError(f"router card format {card.format} is not supported (expected {CARD_FORMAT}); {retrain}")
    if card.feature_spec.version != FeatureSpec().version or card.lexical_names_sha256 != lexical_names_sha256():
        raise ConfigError(f"router was trained with feature spec version {card.feature_spec.version} and other "
                          f"lexical features than this cascade computes; {retrain}")
    rules = {"cascade": 3, "sklearn": 2, "numpy": 1}  # how many leading version parts must match
    for key, parts in rules.items():
        theirs, ours = card.versions.get(key, "?"), current.get(key, "?")
        if theirs.split(".")[:parts] != ours.split(".")[:parts]:
            raise ConfigError(f"router was trained with {key} {theirs} but {ours} is installed; {retrain} "
                              f"or install {key} {theirs}")


def load_router(router_dir: str | Path) -> tuple[Any, RouterCard]:
    """Load a router directory: (DifficultyClassifier, RouterCard). Never unpickles."""
    import skops.io as sio

    card = read_card(router_dir)
    check_compatible(card)
    model_path = Path(router_dir) / MODEL_FILE
    try:
        raw = model_path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{model_path} not found next to its card") from None
    if hashlib.sha256(raw).hexdigest() != card.model_sha256:
        raise ConfigError(f"{model_path} does not match the sha256 in its card: the file was changed or replaced")
    untrusted = [t for t in sio.get_untrusted_types(data=raw) if t not in TRUSTED_TYPES]
    if untrusted:
        raise ConfigError(f"{model_path} contains types outside the allowlist: {', '.join(untrusted)}")
    model = sio.loads(raw, trusted=TRUSTED_TYPES)
    from cascade.router.classifier import DifficultyClassifier

    if not isinstance(model, DifficultyClassifier):
        raise ConfigError(f"{model_path} holds a {type(model).__name__}, not a DifficultyClassifier")
    if model.spec != card.feature_spec or model.n_tiers_ != len(card.tiers):
        raise ConfigError(f"{model_path} does not match its card (feature spec or number of tiers differ)")
    from cascade.router.features import StepsModel, TopicModel

    if card.feature_spec.steps and not isinstance(getattr(model, "steps_model_", None), StepsModel):
        raise ConfigError(f"{model_path} has no steps model although its card's feature spec uses the steps block")
    topic = getattr(model, "topic_model_", None)
    if card.feature_spec.topic_components and not (
            isinstance(topic, TopicModel) and topic.components.shape[0] == card.feature_spec.topic_components):
        raise ConfigError(f"{model_path} has no topic model of {card.feature_spec.topic_components} components "
                          "although its card's feature spec uses the topic block")
    if not _same_aux_data(_aux_data(model), card.aux_data):
        raise ConfigError(f"{model_path} does not match its card (auxiliary model data differ)")
    return model, card
