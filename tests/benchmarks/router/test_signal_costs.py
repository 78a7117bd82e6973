"""benchmarks/router/signal_costs.py: the prompts each signal's cost is timed at are a typical GSM8K question and one
exactly as long as the most the router reads."""

from __future__ import annotations

import pytest

from benchmarks.router.signal_costs import cpu_seconds, prompts_to_time
from cascade.config.routing import RoutingConfig


def test_the_timed_prompts_are_a_median_question_and_one_at_max_prompt_chars(monkeypatch: pytest.MonkeyPatch) -> None:
    from cascade.repo_paths import REPO_ROOT

    assert REPO_ROOT is not None
    monkeypatch.chdir(REPO_ROOT)  # the card names its outcomes repo-relative
    prompts = prompts_to_time()
    assert 100 < len(prompts["typical"]) < 400
    assert len(prompts["max"]) == RoutingConfig().max_prompt_chars
    assert prompts["max"].startswith(prompts["typical"])


def test_cpu_seconds_is_a_median_of_the_runs_after_the_first() -> None:
    calls = []
    assert cpu_seconds(lambda: calls.append(1), repeats=3) >= 0
    assert len(calls) == 4
