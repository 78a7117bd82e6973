"""Every figure in README's Measured table is a committed result's value (issue 60 item 6: one source for each number).

SOURCES maps each headline row (by its docs/measured.md anchor) to its figures, each figure to the file and JSON
path it is read from and how it is rounded: a figure changed in the README, or a value changed in its file, fails
here until the other follows. A row whose numbers have no committed result says so in the README and in its
docs/measured.md section, and is listed as NO_RESULT. The docs/measured.md section of each row names the files its
figures are read from. The two vote-vs-greedy results replay from the committed records.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MEASURED = ROOT / "docs" / "measured.md"
RESULTS = "benchmarks/results/"
# A figure as tests/test_readme_headlines.py reads one: signed decimals, intervals, ratios.
FIGURE = re.compile(r"[+-]?\d[\d,]*\.\d+(?:(?:-|\.\.)[+-]?\d[\d,]*\.\d+)?x?")
NO_RESULT = "measured once, no committed result"


@cache
def _json(path: str) -> Any:
    return json.loads((ROOT / path).read_text())


def _at(path: str, keys: str) -> Any:
    """The value at a /-separated path; a list element by index, or by `name=VALUE` for a list of named objects."""
    value = _json(path)
    for key in keys.split("/"):
        if isinstance(value, list):
            if "=" in key:
                field, _, wanted = key.partition("=")
                value = next(item for item in value if item[field] == wanted)
            else:
                value = value[int(key)]
        else:
            value = value[key]
    return value


def num(path: str, keys: str, places: int, sign: bool = False, suffix: str = "") -> tuple[str, Callable[[], str]]:
    """A number as written: rounded to `places`, with its sign (`sign`: a difference) and a suffix ("x")."""
    return path, lambda: f"{_at(path, keys):{'+' if sign else ''}.{places}f}{suffix}"


def interval(path: str, keys: str, places: int, sep: str = "-", sign: bool = False) -> tuple[str, Callable[[], str]]:
    def text() -> str:
        low, high = _at(path, keys)
        return f"{low:{'+' if sign else ''}.{places}f}{sep}{high:{'+' if sign else ''}.{places}f}"
    return path, text


def ratio(path: str, numerator: str, denominator: str, places: int) -> tuple[str, Callable[[], str]]:
    return path, lambda: f"{_at(path, numerator) / _at(path, denominator):.{places}f}x"


def count(path: str, keys: str) -> tuple[str, Callable[[], str]]:
    return path, lambda: f"{_at(path, keys):,}"


PEER = RESULTS + "peer_gateways.json"
LOAD = RESULTS + "load_reactive_fair.json"
LOAD_2X = "ladders/qwen15/by_load/2x/reactive_vs/"
ROUTELLM = RESULTS + "router_quality_routellm.json"
CARD = "models/routers/embedded-gsm8k/card.json"
SIGNALS = RESULTS + "router_signals.json"
REPEATED_BEST = "embedded_ladder_repeated/text/best_out_of_fold/"  # the shipped features, 5 fold assignments
POINTS = "metrics/cross_validated/operating_points/"
BEST_OUT_OF_FOLD = "metrics/cross_validated/random_null/points/name=best/out_of_fold/"
ITEM3 = RESULTS + "item3_qwen15_test.json"
ADAPTIVE = RESULTS + "adaptive_qwen15_test.json"
VOTE = RESULTS + "vote_vs_greedy_qwen15.json"
UNTOUCHED = RESULTS + "vote_vs_greedy_qwen15_untouched.json"

# anchor -> figure as written in the README -> (file, its value as written), or NO_RESULT.
SOURCES: dict[str, dict[str, tuple[str, Callable[[], str]]] | str] = {
    "gateway-overhead": NO_RESULT,
    "beside-the-rust-gateways": {
        "+0.91": num(PEER, "added_ttft_ms/cascade/c1/p50", 2, sign=True),
        "+0.56": num(PEER, "added_ttft_ms/cascade/c16/p50", 2, sign=True),
        "+0.81": num(PEER, "added_ttft_ms/cascade/c64/p50", 2, sign=True),
        "+0.68": num(PEER, "added_ttft_ms/smg/c1/p50", 2, sign=True),
        "+0.37": num(PEER, "added_ttft_ms/smg/c16/p50", 2, sign=True),
        "+0.44": num(PEER, "added_ttft_ms/smg/c64/p50", 2, sign=True),
        "1.21": num(PEER, "cpu_s_per_1000_requests/cascade", 2),
        "0.88": num(PEER, "cpu_s_per_1000_requests/smg", 2),
    },
    "fault-soak": NO_RESULT,
    "one-stalled-tier": NO_RESULT,
    "load-reactive-operating-points": {
        "1.10": num(LOAD, LOAD_2X + "static_capped/ratio_of_means", 2),
        "1.00-1.21": interval(LOAD, LOAD_2X + "static_capped/t95", 2),
        "0.98": num(LOAD, LOAD_2X + "static_best/ratio_of_means", 2),
        "0.87-1.09": interval(LOAD, LOAD_2X + "static_best/t95", 2),
    },
    "router-on-routellm-gsm8k": {
        "0.680": num(ROUTELLM, "targets/gsm8k_router_apgr", 3),
        "0.611-0.760": interval(ROUTELLM, "targets/gsm8k_router_apgr_ci95", 3),
        "0.644": num(ROUTELLM, "gsm8k/length", 3),
    },
    "router-on-the-embedded-ladder": {
        "384": count(SIGNALS, "embedded_ladder_repeated/n"),
        "0.719": num(SIGNALS, REPEATED_BEST + "accuracy/router/mean", 3),
        "0.72x": num(SIGNALS, REPEATED_BEST + "token_share/router/mean", 2, suffix="x"),
        "0.73x": num(SIGNALS, REPEATED_BEST + "token_share/null_mean", 2, suffix="x"),
        "-0.22..+0.20": interval(SIGNALS, REPEATED_BEST + "token_share/router_minus_null/ci95", 2, sep="..",
                                 sign=True),
    },
    "sart-vs-self-consistency": {
        "0.65": num(ADAPTIVE, "runs/adaptive/accuracy", 2),
        "0.56-0.74": interval(ADAPTIVE, "runs/adaptive/accuracy_ci95", 2),
        "0.63": num(ITEM3, "runs/sc/accuracy", 2),
        "0.54-0.72": interval(ITEM3, "runs/sc/accuracy_ci95", 2),
        "0.60": num(ITEM3, "runs/greedy/accuracy", 2),
        "0.50-0.69": interval(ITEM3, "runs/greedy/accuracy_ci95", 2),
        "0.57": num(ITEM3, "runs/sart/accuracy", 2),
        "0.47-0.66": interval(ITEM3, "runs/sart/accuracy_ci95", 2),
    },
    "choosing-the-reasoning-tiers-setting-out-of-sample": {
        "384": count(VOTE, "pooled/questions"),
        "+0.099": num(VOTE, "pooled/difference", 3, sign=True),
        "+0.057..+0.142": interval(VOTE, "pooled/ci95", 3, sep="..", sign=True),
        "217": count(UNTOUCHED, "sets/train/questions"),
        "+0.092": num(UNTOUCHED, "sets/train/difference", 3, sign=True),
        "+0.032..+0.152": interval(UNTOUCHED, "sets/train/ci95", 3, sep="..", sign=True),
    },
}


def _headline_table() -> list[tuple[str, str, str]]:
    """(what, anchor, number) per row of README's Measured table."""
    text = README.read_text()
    section = text[text.index("## Measured"):]
    section = section[:section.index("\n## ", 1)]
    rows = re.findall(r"^\| \[([^\]]+)\]\(docs/measured\.md#([a-z0-9-]+)\) \| (.+) \|$", section, re.M)
    assert rows, "README's Measured table moved: update this parser"
    return rows


def _headline_rows() -> dict[str, str]:
    return {anchor: cell for _, anchor, cell in _headline_table()}


def _measured_section(anchor: str) -> str:
    """The docs/measured.md section under the heading with this anchor, to the next heading of its level or above."""
    text = MEASURED.read_text()
    for match in re.finditer(r"^(#+) (.+)$", text, re.M):
        if re.sub(r"[^\w\- ]", "", match[2].strip().lower()).replace(" ", "-") == anchor:
            rest = text[match.end():]
            end = re.search(rf"^#{{1,{len(match[1])}}} ", rest, re.M)
            return rest[:end.start()] if end else rest
    raise AssertionError(f"docs/measured.md has no heading for #{anchor}")


def test_every_headline_row_has_its_sources() -> None:
    assert set(_headline_rows()) == set(SOURCES), "README's Measured table and SOURCES name different rows"


def test_each_headline_figure_is_its_result_files_value() -> None:
    wrong = []
    for what, anchor, cell in _headline_table():
        sources = SOURCES[anchor]
        if isinstance(sources, str):
            continue
        decimals = Counter(figure for figure in sources if FIGURE.fullmatch(figure))
        assert Counter(FIGURE.findall(cell)) == decimals, f"#{anchor}: the figures in README and in SOURCES differ"
        for figure, (path, value) in sources.items():
            row = f"{what} | {cell}"
            assert re.search(rf"(?<![\d.]){re.escape(figure)}(?![\d])", row), f"#{anchor}: {figure} not in README"
            if value() != figure:
                wrong.append(f"#{anchor}: README {figure}, {path} {value()}")
    assert not wrong, f"README figures and their result files disagree: {wrong}"


def test_rows_without_a_result_file_say_so_in_the_readme_and_in_docs_measured() -> None:
    for anchor, cell in _headline_rows().items():
        if SOURCES[anchor] == NO_RESULT:
            assert NO_RESULT in cell, f"README #{anchor}: say '{NO_RESULT}'"
            assert NO_RESULT in _measured_section(anchor), f"docs/measured.md #{anchor}: say '{NO_RESULT}'"


def test_docs_measured_names_the_file_each_headline_figure_is_read_from() -> None:
    for anchor, sources in SOURCES.items():
        if isinstance(sources, str):
            continue
        section = _measured_section(anchor)
        for path in {path for path, _ in sources.values()}:
            named = path in section or path.removeprefix(RESULTS) in section
            assert named, f"docs/measured.md #{anchor} quotes {path} without naming it"


T, R = "models/outcomes/qwen15-test-bench", "models/outcomes"
VOTE_SETS = ["--set", f"test={T}/adaptive/requests.jsonl,{T}/vanilla/requests.jsonl",
             "--set", f"train={R}/gsm8k-train-embedded-reason-adaptive.jsonl:qwen2.5-coder-1.5b-reason,"
                      f"{R}/qwen15-train-label/qwen15-greedy.jsonl:qwen2.5-coder-1.5b",
             "--set", f"test-s1={T}/sc-s1/adaptive-rows.jsonl:qwen2.5-coder-1.5b-reason,{T}/vanilla/requests.jsonl",
             "--exclude", f"{R}/qwen15-train-bench/sc-t07/branches.jsonl"]


def test_the_vote_against_greedy_replays_from_committed_records() -> None:
    """vote_vs_greedy_qwen15.json (every question outside the cross-validation's 100) and _untouched.json (also
    without the 67 more of the replay that first chose adaptive: adaptive-replay-ids.jsonl) by their commands."""
    for extra, result in (([], VOTE), (["--exclude", f"{R}/qwen15-train-bench/adaptive-replay-ids.jsonl"], UNTOUCHED)):
        done = subprocess.run([sys.executable, "-m", "benchmarks.reasoning.vote_vs_greedy", *VOTE_SETS, *extra],
                              capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == _json(result), f"{result} does not replay"
