"""benchmarks/reasoning/deepconf_replay.py: DeepConf replayed with the runner's own rules on scored branches (no text).

The invariants: without the learned stop and with the plain vote it is the served adaptive rule, which on a
question that reaches a second wave is self-consistency exactly; the learned stop spends fewer tokens, never
stops the last live branch, and the report chooses out of fold."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.reasoning import deepconf_replay as replay_module
from benchmarks.reasoning.deepconf_replay import Scored, Setting, replay, self_consistency

ROOT = Path(__file__).resolve().parents[3]
MODULE = "benchmarks.reasoning.deepconf_replay"


def branch(answer: str, tokens: int, value: float, correct: bool | None = None) -> Scored:
    values = [value] * tokens
    return Scored(answer=answer, correct=answer == "18" if correct is None else correct, tokens=tokens, capped=False,
                  values={"logprob": values, "certainty": [10 + v for v in values], "certainty5": [5 + v for v in values]})


# The first wave disagrees (18 vs 17); later: two sure 18s, four unsure 19s.
QUESTION = [branch("18", 100, -0.1), branch("17", 100, -0.2), branch("18", 120, -0.1), branch("18", 80, -0.15),
            *(branch("19", 200, -2.0) for _ in range(4))]
SERVED = Setting(0.0, 8, "logprob", "majority", 1.0)


def test_without_deepconf_a_second_wave_is_self_consistency() -> None:
    assert replay(QUESTION, SERVED) == self_consistency(QUESTION) == (False, 1200)  # the four 19s outvote


def test_the_learned_stop_cuts_the_unsure_branches_early_and_the_sure_answer_wins() -> None:
    correct, tokens = replay(QUESTION, Setting(0.9, 8, "logprob", "majority", 1.0))
    assert correct and tokens == 200 + 120 + 80 + 4 * 8  # each 19 stopped at its first full group of 8 tokens
    correct, tokens = replay(QUESTION, Setting(0.9, 8, "certainty", "majority", 1.0))  # the same on DeepConf's scale
    assert correct and tokens == 432


def test_the_last_live_branch_is_never_stopped() -> None:
    lone = [branch("18", 50, -0.1), branch("17", 50, -0.1), branch("19", 300, -3.0)]
    correct, tokens = replay(lone, Setting(0.9, 8, "logprob", "majority", 1.0))
    assert tokens == 400 and correct  # it ran to its end and voted (a three-way tie: the shorter, then the first)


def test_a_first_wave_that_agrees_stands() -> None:
    agreed = [branch("18", 90, -3.0), branch("18", 110, -3.0), *(branch("19", 200, -0.1) for _ in range(6))]
    assert replay(agreed, Setting(0.9, 8, "logprob", "confidence", 0.5)) == (True, 200)


def test_the_confidence_vote_and_filter_prefer_the_sure_minority() -> None:
    correct, _ = replay(QUESTION, Setting(0.0, 8, "logprob", "confidence", 1.0))
    filtered, _ = replay(QUESTION, Setting(0.0, 8, "logprob", "majority", 0.5))
    assert correct and filtered


def test_the_script_reports_out_of_fold_on_a_scored_file(tmp_path: Path) -> None:
    path = tmp_path / "scored.jsonl.gz"
    with gzip.open(path, "wt") as out:
        for q in range(12):
            for i, b in enumerate(QUESTION if q % 2 else QUESTION[:1] * 2 + QUESTION[2:]):
                out.write(json.dumps({"id": f"q{q}", "seed": 0, "branch": i, "tokens": b.tokens, "correct": b.correct,
                                      "answer": b.answer, **b.values}) + "\n")
    done = subprocess.run([sys.executable, "-m", MODULE, "--logprobs", str(path), "--group", "8", "--resamples", "200",
                           "--keep", "0,0.9"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["questions"] == {"scored": 12, "second_wave": 6, "first_wave_agreed": 6}
    oof = result["all"]["out_of_fold"]
    assert oof["accuracy"] == 1.0 and oof["tokens_vs_sc"] == 0.36  # 432 of SC's 1,200 tokens
    assert result["families"]["adaptive"]["out_of_fold"]["accuracy"] == 0.0
    assert replay_module.KINDS == ("logprob", "certainty", "certainty5")


def test_a_scored_file_cut_by_an_interrupted_run_reads_up_to_the_cut(tmp_path: Path) -> None:
    from cascade.bench.runs import json_rows

    path = tmp_path / "cut.jsonl.gz"
    with gzip.open(path, "wt") as out:
        out.writelines(json.dumps({"id": f"q{i}"}) + "\n" for i in range(500))
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])  # killed mid-write: no end-of-stream marker
    rows = list(json_rows(path))
    assert 0 < len(rows) < 500 and rows[0] == {"id": "q0"}
    assert list(json_rows(tmp_path / "missing.jsonl.gz")) == []


def test_all_questions_mixes_in_the_questions_whose_first_wave_agreed(tmp_path: Path) -> None:
    """12 second-wave questions (QUESTION: self-consistency wrong at 1,200 tokens, DeepConf right at 432) and 4 whose
    first wave agreed (right, 200 decode tokens each; self-consistency taken to cost 4x), one more not scored yet."""
    scored, outcomes, waves = tmp_path / "s.jsonl.gz", tmp_path / "o.jsonl", tmp_path / "w.jsonl"
    with gzip.open(scored, "wt") as out:
        for q in range(12):
            for i, b in enumerate(QUESTION):
                out.write(json.dumps({"id": f"q{q}", "seed": 0, "branch": i, "tokens": b.tokens, "correct": b.correct,
                                      "answer": b.answer, **b.values}) + "\n")
    tier = {"correct": True, "decode_tokens": 200}
    outcomes.write_text("".join(json.dumps({"id": f"a{q}", "tiers": {"t": tier}}) + "\n" for q in range(4)))
    waves.write_text("".join(json.dumps({"id": q, "seed": 0, "saved": n}) + "\n" for q, n in
                             [*((f"q{q}", 8) for q in range(12)), *((f"a{q}", 2) for q in range(4)), ("late", 8)]))
    done = subprocess.run([sys.executable, "-m", MODULE, "--logprobs", str(scored), "--group", "8", "--resamples",
                           "200", "--keep", "0,0.9", "--outcomes", str(outcomes), "--waves", str(waves), "--tier", "t"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    mixed = json.loads(done.stdout)["all_questions"]
    assert (mixed["questions"], mixed["first_wave_agreed"], mixed["second_wave"], mixed["second_wave_not_scored"]) \
        == (16, 4, 12, 1)
    assert mixed["self_consistency_estimate"] == {"accuracy": 0.25, "tokens_mean": (4 * 800 + 12 * 1200) / 16}
    assert mixed["served_adaptive"]["accuracy"] == 0.25 and mixed["served_adaptive"]["tokens_vs_sc"] == round(
        (4 * 200 + 12 * 1200) / (4 * 800 + 12 * 1200), 3)
    best = mixed["out_of_fold"]
    assert best["accuracy"] == 1.0 and best["tokens_mean"] == (4 * 200 + 12 * 432) / 16
    assert best["minus_sc"]["difference"] == 0.75  # +1 on the second wave's 12 of 16


def test_the_waves_file_merges_and_keeps_what_a_lost_branches_file_held(tmp_path: Path) -> None:
    from benchmarks.reasoning.branch_logprobs import write_waves

    branches, waves = tmp_path / "b.jsonl", tmp_path / "w.jsonl"
    branches.write_text("".join(json.dumps({"id": q, "seed": 0, "branch": i}) + "\n"
                                for q, n in (("x", 2), ("y", 8)) for i in range(n)))
    write_waves(branches, waves)
    # z was relabelled after a stop: its two branches saved twice still count as two launched
    branches.write_text("".join(json.dumps({"id": "z", "seed": 0, "branch": i}) + "\n" for i in (0, 1, 0, 1)))
    write_waves(branches, waves)
    rows = [json.loads(line) for line in waves.read_text().splitlines()]
    assert rows == [{"id": q, "seed": 0, "saved": n} for q, n in (("x", 2), ("y", 8), ("z", 2))]


def test_a_fixed_level_stops_what_falls_below_it_whatever_the_first_wave_says() -> None:
    # The first wave is sure (-0.1, -0.2): its own learned level would be high; a fixed level of -1 stops only the
    # unsure 19s (-2.0), at their first full group.
    correct, tokens = replay(QUESTION, Setting(0.0, 8, "logprob", "majority", 1.0, level=-1.0, level_quantile=0.1))
    assert correct and tokens == 200 + 120 + 80 + 4 * 8
    assert replay(QUESTION, Setting(0.0, 8, "logprob", "majority", 1.0, level=-5.0)) == self_consistency(QUESTION)
    levels = replay_module.fixed_levels([QUESTION, QUESTION], 8, "logprob", [0.0, 1.0])
    assert levels == pytest.approx([-0.2, -0.1])  # the weakest and strongest first-wave traces pooled
    described = Setting(0.0, 8, "logprob", "majority", 1.0, level=-1.0, level_quantile=0.1).describe()
    assert described["family"] == "deepconf" and described["fixed_level"] == -1.0


def write_scored(path: Path, questions: dict[str, list[Scored]], seed: int = 0) -> None:
    with gzip.open(path, "wt") as out:
        for qid, branches in questions.items():
            for i, b in enumerate(branches):
                out.write(json.dumps({"id": qid, "seed": seed, "branch": i, "tokens": b.tokens, "correct": b.correct,
                                      "answer": b.answer, **b.values}) + "\n")


def test_held_out_chooses_on_training_and_scores_every_held_out_question(tmp_path: Path) -> None:
    """Chosen on 10 training questions (QUESTION: the stop wins), replayed on 6 held-out ones: 3 like QUESTION,
    3 whose first wave agrees (18 twice, six 19s after): there adaptive answers from 2 branches, self-consistency
    votes all 8 (the 19s win). `--also` and `--greedy` read outcome rows paired on the same questions; a held-out
    question missing from them is left out and counted."""
    train, test = tmp_path / "train.jsonl.gz", tmp_path / "test.jsonl.gz"
    write_scored(train, {f"t{q}": QUESTION for q in range(10)})
    agreed = [branch("18", 90, -0.1), branch("18", 110, -0.1), *(branch("19", 200, -0.1) for _ in range(6))]
    write_scored(test, {**{f"h{q}": QUESTION for q in range(3)}, **{f"a{q}": agreed for q in range(3)},
                        "extra": QUESTION}, seed=1)
    ids = [*(f"h{q}" for q in range(3)), *(f"a{q}" for q in range(3))]
    sart = tmp_path / "sart.jsonl"
    sart.write_text("".join(json.dumps({"id": q, "tiers": {"r": {"correct": q.startswith("a"), "decode_tokens": 600}}})
                            + "\n" for q in ids))
    greedy = tmp_path / "greedy.jsonl"
    greedy.write_text("".join(json.dumps({"id": q, "correct": True, "decode_tokens": 150}) + "\n" for q in ids))
    done = subprocess.run([sys.executable, "-m", MODULE, "--logprobs", str(train), "--group", "8", "--resamples", "200",
                           "--keep", "0,0.9", "--held-out", str(test), "--also", f"sart={sart}:r", "--greedy",
                           str(greedy)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    held = json.loads(done.stdout)["held_out"]
    assert (held["questions"], held["scored_not_in_every_file"], held["second_wave"]) == (6, 1, 3)
    assert held["self_consistency"] == {"accuracy": 0.0, "tokens_mean": (3 * 1200 + 3 * 1400) / 6}  # 19 wins 8-votes
    chosen = held["chosen"]
    assert chosen["setting"]["family"] == "deepconf" and chosen["accuracy"] == 1.0
    assert chosen["tokens_mean"] == (3 * 432 + 3 * 200) / 6
    assert chosen["second_wave"]["accuracy"] == 1.0 and chosen["second_wave"]["tokens_vs_sc"] == 0.36
    assert held["served_adaptive"]["accuracy"] == 0.5  # right where the first wave agreed, wrong where all 8 voted
    assert held["sart"]["accuracy"] == 0.5 and held["sart"]["minus_greedy"]["difference"] == -0.5
    assert held["greedy"]["accuracy"] == 1.0
    assert "held out (6 questions) chosen: 1.0" in done.stderr


def test_also_and_greedy_need_held_out(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", MODULE, "--logprobs", str(tmp_path / "x.gz"), "--greedy", "g.jsonl"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2 and "--held-out" in done.stderr
