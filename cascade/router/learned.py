"""The learned router as the gateway's routing signal.

Loaded once at start (`load_router`: card checks, skops, never pickle). On the request path it is
featurize + a matrix product + a sigmoid in numpy (benchmarks/router/latency.py measures it).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from cascade.errors import ConfigError
from cascade.router.artifact import RouterCard, load_router
from cascade.router.classifier import DifficultyClassifier
from cascade.router.operating import Calibration, route_score
from cascade.router.policy import Assessment


class LearnedSignal:
    name = "learned"

    def __init__(self, model: DifficultyClassifier, card: RouterCard) -> None:
        self.model = model
        self.card = card
        self._featurizer = model.featurizer()
        self.calibration: Calibration | None = card.calibration

    @classmethod
    def load(cls, router_dir: str | Path, tiers: Sequence[str]) -> LearnedSignal:
        model, card = load_router(router_dir)
        if list(card.tiers) != list(tiers):
            raise ConfigError(f"router {router_dir} was trained for tiers {', '.join(card.tiers)}; the config's "
                              f"tiers are {', '.join(tiers)} (retrain it on outcomes of these tiers)")
        signal = cls(model, card)
        # One decision at load: a router whose features need a missing package (MiniLM) fails at start, with
        # the install command, not on its first request; and the first request does not pay the model load.
        signal.assess("How many apples are left?")
        return signal

    def assess(self, text: str) -> Assessment:
        X = self._featurizer.transform([text])
        p_fail = self.model.predict_p_fail_features(X)[0]
        return Assessment(difficulty=float(p_fail[0]), score=float(route_score(p_fail)),
                          p_fail=tuple(float(p) for p in p_fail),
                          out_of_domain=bool(self.model.out_of_domain([text], X)[0]))

    def operating_points(self) -> dict[str, list[float]]:
        return dict(self.calibration.named) if self.calibration else {}

    def thresholds_for_target(self, target: float) -> list[float] | None:
        return self.calibration.thresholds_for_target(target) if self.calibration else None
