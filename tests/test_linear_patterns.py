"""Every regular expression cascade and loadgen keep runs in time linear in its input, on hostile text too.

A backtracking regex can be quadratic in a run of one character: `^\\s*\\(?([A-J])[.)]\\s+(.*)$` (MULTILINE) took 36 s
on 60,000 newlines, on the event loop, and froze a gateway. This test finds every compiled pattern at module level
in every module of both packages (a new one is covered without being listed; a pattern compiled inside a function
is not, so keep them at module level), and runs `search`, `findall` and `fullmatch` on runs of hostile units at
growing lengths, each four times the last. The verdict is a ratio measured in this process, so that it holds on any
CPU: a linear pattern's cost grows about 4x from one length to the next, a quadratic one's about 16x, and a cost that
grows more than GROWTH times (beyond the FLOOR_S of timer noise) fails. A bounded repetition such as `x{0,255}` tried
at every start is linear with a large constant: about 12 us per character on a CPU without AVX-512 (and 3 with it),
which an absolute budget per character had failed on the slower CPU; BUDGET_US_PER_CHAR stays as a backstop with room
for it. CPU time of this process is measured, not wall time; the sizes grow so that a bad pattern fails early.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import time

import pytest

import cascade
import loadgen

# Runs of one unit: whitespace and line breaks, digits and separators, markup and the starts of what patterns look for.
UNITS = [
    " ", "\n", "\t", "\r\n", " \n", "1", "a", "A", "Z", ".", ",", "!", "?", "$", "%", "*", "_", "`", "#", "-", "+",
    "=", "/", "\\", "(", ")", "[", "]", "{", "}", "<", ">", "'", '"', ":", ";", "|", "1,", "1.", "1 ", "1/", "1 /",
    "1 + ", "1+1", "1 = ", "1=", "a ", "A. ", "(A", "A)", "$1.", "\\boxed{", "{{", "\\frac{", "\\text{", "####",
    "answer ", "answer: ", "Answer is ", "option ", "[fake ", "[fake@", "![", "](", "**", "<|im_end|>\n",
    "<|im_end|>\n<|im_start|>user\n", "Statement 1", "NOT ", "how many ", "1\n", "a\n", "A.\n", " .", "\u00a0", "٣",
]
SIZES = (1_000, 4_000, 16_000)  # each 4x the last
GROWTH = 8.0  # from one size to the next: linear ~4x, quadratic ~16x
BUDGET_US_PER_CHAR = 50.0  # a backstop: the slowest linear pattern costs ~12 us per character on an AVX2-only CPU
FLOOR_S = 0.01  # what a few calls cost at any size (timer and allocation noise)


def _patterns() -> dict[str, re.Pattern[str] | re.Pattern[bytes]]:
    found: dict[str, re.Pattern[str] | re.Pattern[bytes]] = {}
    for package in (cascade, loadgen):
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            module = importlib.import_module(info.name)
            for name, value in vars(module).items():
                values = value.values() if isinstance(value, dict) else [value]
                for i, item in enumerate(values):
                    if isinstance(item, re.Pattern):
                        key = f"{info.name}.{name}" + (f"[{i}]" if isinstance(value, dict) else "")
                        found.setdefault(key, item)
    return found


PATTERNS = _patterns()


def test_the_patterns_under_test_include_the_ones_that_read_client_text() -> None:
    names = set(PATTERNS)
    for expected in ("cascade.router.lexical._OPTION", "cascade.data.grading._ANSWER_RE",
                     "cascade.branches.cpu_scorer._CLAIM", "cascade.router.heuristic._OPERATOR",
                     "cascade.service.bodies._JSON_STRING"):
        assert expected in names
    assert len(names) >= 40


def _cost_s(pattern: re.Pattern[str] | re.Pattern[bytes], text: str) -> float:
    subject: str | bytes = text.encode() if isinstance(pattern.pattern, bytes) else text
    start = time.process_time()
    pattern.search(subject)  # type: ignore[arg-type]
    pattern.findall(subject)  # type: ignore[arg-type]
    pattern.fullmatch(subject)  # type: ignore[arg-type]
    return time.process_time() - start


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_a_pattern_runs_in_linear_time_on_runs_of_hostile_units(name: str) -> None:
    pattern = PATTERNS[name]
    for unit in UNITS:
        # The run ends on a character no pattern expects, so that a pattern that needs more fails at the end (the
        # worst case for backtracking), and once more on a plain end.
        for end in ("\x00", ""):
            before: tuple[int, float] | None = None
            for size in SIZES:
                text = (unit * (size // len(unit) + 1))[:size] + end
                cost = min(_cost_s(pattern, text), _cost_s(pattern, text))  # the lower of two: noise only adds
                where = f"{name} ({pattern.pattern!r}) took {cost:.3f} s on {len(text)} characters of {unit!r}"
                if before is not None:
                    size_before, cost_before = before
                    assert cost <= FLOOR_S + GROWTH * cost_before, (
                        f"{where}, {cost / max(cost_before, 1e-9):.0f}x its cost on {size_before}: it backtracks on "
                        "that run")
                budget = FLOOR_S + BUDGET_US_PER_CHAR * 1e-6 * len(text)
                assert cost <= budget, f"{where} (budget {budget:.3f} s): it backtracks on that run"
                before = (len(text), cost)
