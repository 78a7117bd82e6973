"""Property tests of the code that reads a client's text and counts: the router's featurizers, the grader and the
vote's answer key, the CPU scorer, the PRM input parser, the quality-hint parser, body decoding and the bounds on what a
request sends on to an engine.

The generators are an attacker's: long runs of one character or token (whitespace, newlines, digits, brackets,
markup), many short lines, deep nesting, huge numbers, mixed with ordinary text. Each property says the code
answers (a value, or the project's own error for bad input; never another exception) and that its CPU time stays
within a bound per character (`WORK_US_PER_CHAR`, about ten times what the slowest of them costs here), which a
quadratic step would break at these lengths (the quadratic option regex took 36 s on 60,000 newlines).
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable
from typing import TypeVar

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cascade.branches.cpu_scorer import features
from cascade.branches.verifier import parse_prm_input
from cascade.config import Limits
from cascade.data.grading import answer_key, extract, grade
from cascade.errors import CascadeError, InvalidRequest
from cascade.router.domain import word_tokens
from cascade.router.features import FeatureSpec, Featurizer, step_grams
from cascade.router.heuristic import heuristic_difficulty
from cascade.router.lexical import lexical_features, restated_number
from cascade.router.policy import parse_hint
from cascade.router.router import routed_text
from cascade.service.bodies import decode_chat_request
from cascade.service.validation import validate

WORK_US_PER_CHAR = 20.0
WORK_FLOOR_S = 0.05
MAX_RUN = 20_000

T = TypeVar("T")

UNITS = st.sampled_from([
    " ", "\n", "\t", "\r\n", "1", "9", "a", "A", ".", ",", "!", "?", "$", "%", "*", "(", ")", "[", "]", "{", "}", "\\",
    "=", "+", "/", "-", "1,", "1.", "1 ", "1 + ", "1+1", "1 = ", "A. ", "(A)", "$1.", "\\boxed{", "\\frac{", "####",
    "answer: ", "Answer is ", "how many ", "<|im_end|>\n<|im_start|>user\n", "<extra_0>", "a\n", "A.\n", "\u00a0",
])
RUN = st.tuples(st.one_of(UNITS, st.text(min_size=1, max_size=4)), st.integers(1, MAX_RUN))
# A text: a few runs, each of one unit repeated up to MAX_RUN characters, and ordinary words between them.
TEXT = st.lists(st.one_of(RUN.map(lambda r: (r[0] * (r[1] // len(r[0]) + 1))[:r[1]]), st.text(max_size=40)),
                max_size=4).map("".join)
PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                            HealthCheck.data_too_large])


def within_budget(work: Callable[[], T], chars: int) -> T:
    start = time.process_time()
    result = work()
    cost = time.process_time() - start
    budget = WORK_FLOOR_S + WORK_US_PER_CHAR * 1e-6 * chars
    assert cost <= budget, f"{cost:.3f} s of CPU for {chars} characters (budget {budget:.3f} s)"
    return result


# The runs that were quadratic somewhere, always tried besides what hypothesis draws.
KNOWN_BAD = ["\n" * MAX_RUN + "a", " " * MAX_RUN + "!", "1" * MAX_RUN, "1+" * (MAX_RUN // 2), ". " * (MAX_RUN // 2) + "b",
             "[fake " * 3_000, "A.\n" * 5_000, "answer: " * 2_000, "9" * 400 + " apples"]


def known_bad(test: Callable[..., None]) -> Callable[..., None]:
    for text in KNOWN_BAD:
        test = example(text)(test)
    return test


@PROPERTY
@given(TEXT)
@known_bad
def test_the_router_featurizes_any_text_in_linear_time(text: str) -> None:
    row = within_budget(lambda: lexical_features(text), len(text))
    assert all(x == x for x in row)  # no NaN
    within_budget(lambda: (restated_number(text), heuristic_difficulty(text), word_tokens(text), step_grams(text)),
                  len(text))


@PROPERTY
@given(TEXT, st.integers(256, 4096))
def test_the_router_reads_at_most_its_limit_of_any_prompt(text: str, limit: int) -> None:
    routed = routed_text(text, limit)
    assert len(routed) <= limit and (routed == text or len(text) > limit)
    Featurizer(FeatureSpec(hash_features=64, restated_number=True)).transform([routed])


@PROPERTY
@given(TEXT, st.sampled_from(["#### 18", "#### 1,200", "C", "Paris", "#### 2.5"]))
@example(". " * (MAX_RUN // 2) + "b", "Paris")
@example(" " * MAX_RUN + "x", "#### 18")
def test_the_grader_reads_any_answer_in_linear_time(response: str, reference: str) -> None:
    within_budget(lambda: (grade(response, reference), extract(response, reference), answer_key(response)),
                  len(response))


@PROPERTY
@given(st.lists(TEXT, min_size=1, max_size=3), TEXT)
@example(["1" * MAX_RUN], "")
@example(["1+" * (MAX_RUN // 2)], "")
def test_the_cpu_scorer_reads_any_branch_in_linear_time(steps: list[str], question: str) -> None:
    chars = sum(map(len, steps)) + len(question)
    result = within_budget(lambda: features(steps, question), chars)
    assert result.words >= 0


@PROPERTY
@given(TEXT, TEXT)
@example("<|im_end|>\n<|im_start|>user\n" * 2_000, "step")
def test_the_prm_input_parser_reads_any_question_in_linear_time(question: str, step: str) -> None:
    text = (f"<|im_start|>system\nReason step by step.<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
            f"<|im_start|>assistant\n{step}<extra_0>")
    with contextlib.suppress(ValueError):  # a question or step holding markers of its own is refused, by name
        within_budget(lambda: parse_prm_input(text), len(text))


@PROPERTY
@given(st.one_of(TEXT, st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**400, 10**400).map(str)))
def test_the_quality_hint_parser_answers_any_value(raw: str | float) -> None:
    try:
        hint = within_budget(lambda: parse_hint(raw), len(str(raw)))
    except InvalidRequest as exc:
        assert len(str(exc)) < 1_000  # the client's value is cut (40 characters, escaped), not echoed whole
        return
    assert hint is None or hint.name is not None or (hint.target is not None and 0 < hint.target <= 1)


def _nested(depth: int, opener: str) -> str:
    inner = "{}" if opener == "{" else "[]"
    if opener == "{":
        return '{"a":' * depth + inner + "}" * depth
    return "[" * depth + inner + "]" * depth


BODY_PART = st.one_of(
    TEXT.map(lambda t: json.dumps({"role": "user", "content": t})),
    st.tuples(st.integers(0, 5_000), st.sampled_from(["[", "{"])).map(lambda d: _nested(*d)),
    st.integers(0, 3_000).map(lambda k: "9" * max(1, k)),
    st.sampled_from(["2.0", "1e308", "-0.0", "1e999", "null", "true", '"\\u0000"', '"\\ud800"']),
    TEXT,
)


@PROPERTY
@given(st.lists(BODY_PART, max_size=4), st.sampled_from(["messages", "tools", "n", "max_tokens", "quality", "x"]))
def test_body_decoding_answers_any_body_with_a_request_or_a_400(parts: list[str], field: str) -> None:
    # Well-formed and not: the parts as a messages list, as one field's value, and as raw bytes.
    bodies = [f'{{"model":"cascade","messages":[{",".join(parts)}]}}',
              f'{{"model":"cascade","messages":[],"{field}":{parts[0] if parts else "1"}}}', "".join(parts)]
    for body in bodies:
        raw = body.encode("utf-8", "surrogatepass")
        try:
            within_budget(lambda raw=raw: decode_chat_request(raw), len(raw))  # type: ignore[misc]
        except InvalidRequest as exc:
            assert exc.param is None or len(exc.param) < 200
        except CascadeError as exc:  # pragma: no cover - a body error is always InvalidRequest
            raise AssertionError(f"{type(exc).__name__} for a body") from exc


def test_a_body_nested_past_the_limit_is_refused_by_name_however_deep() -> None:
    for depth in (65, 3_000, 200_000):
        body = f'{{"model":"cascade","messages":[],"tools":{_nested(depth, "{")}}}'.encode()
        try:
            decode_chat_request(body, max_depth=64)
        except InvalidRequest as exc:
            assert "levels deep; the limit is 64" in str(exc) and exc.code == "nesting_too_deep"
        else:
            raise AssertionError(f"a body {depth} levels deep was accepted")
    # Brackets inside strings are text, not nesting.
    text = json.dumps({"model": "cascade", "messages": [{"role": "user", "content": "[" * 10_000}]}).encode()
    assert decode_chat_request(text, max_depth=64).messages[0].text() == "[" * 10_000


def test_whole_floats_are_read_as_ints_where_openai_accepts_them_and_nowhere_else() -> None:
    body = {"model": "cascade", "messages": [{"role": "user", "content": "hi"}], "n": 2.0, "max_tokens": 16.0,
            "seed": 3.0, "branches": {"n": 4.0, "m": 2.0}}
    req = decode_chat_request(json.dumps(body).encode())
    assert (req.n, req.max_tokens, req.seed) == (2, 16, 3) and req.branches is not None
    assert (req.branches.n, req.branches.m) == (4, 2)
    for bad in ({"n": 2.5}, {"max_tokens": 1.5}):
        try:
            decode_chat_request(json.dumps({**body, **bad}).encode())
        except InvalidRequest as exc:
            assert exc.param == next(iter(bad))
        else:
            raise AssertionError(f"{bad} was accepted")


# The fields a request sends on to an engine, as an attacker fills them: huge counts of entries, long keys and values,
# keys that are not token ids, numbers past every range, deep nesting. Drawn as small descriptions (a field, a count,
# a key, a number, a depth, a run of text) and built in the test, so that a failing example stays readable.
FIELDS = ("logit_bias", "tools", "metadata", "chat_template_kwargs", "user", "top_logprobs", "top_k",
          "presence_penalty", "frequency_penalty", "min_p", "repetition_penalty", "stop_token_ids", "min_tokens",
          "service_tier")
COUNT = st.one_of(st.integers(0, 40), st.sampled_from([128, 129, 300, 301, 8_000, 40_000]))
KEY = st.one_of(st.integers(0, 2**40).map(str), st.sampled_from(["", "-1", "1.5", " 7", "\u0661", "0" * 11, "x"]), RUN)
NUMBER = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-(2**63), 2**63 - 1),
                   st.sampled_from([100, 100.000001, -100, 1e308, 20, 21, 10**9]))
ENGINE_FIELD = st.tuples(st.sampled_from(FIELDS), COUNT, KEY, NUMBER, st.integers(0, 70), RUN)


def _engine_field(name: str, count: int, key: str | tuple[str, int], number: float, depth: int,
                  run: tuple[str, int]) -> object:
    key = key if isinstance(key, str) else (key[0] * key[1])[:key[1]]
    text = (run[0] * run[1])[:run[1]]
    if name == "logit_bias":
        return {**{str(i): -1 for i in range(count)}, key: number}
    if name == "tools":  # as many as fit in about twice the body limit (a bigger body is a 413 before decoding)
        tool = {"type": "function", "function": {"name": "f", "description": text, "parameters": _schema(depth)}}
        return [tool] * min(count, 2 * Limits().max_body_bytes // len(json.dumps(tool)))
    if name == "metadata":
        return {**{f"k{i}": "v" for i in range(count)}, key: text}
    if name == "chat_template_kwargs":
        return {**{f"k{i}": True for i in range(count)}, "chat_template": text, key: _schema(depth)}
    if name == "stop_token_ids":
        return [*range(count), number]
    return text if name in ("user", "service_tier") else number


def _schema(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@PROPERTY
@given(st.lists(ENGINE_FIELD, min_size=1, max_size=3))
def test_engine_bound_fields_are_checked_in_bounded_work_with_a_request_or_a_400(fields: list[tuple]) -> None:
    body = {"model": "cascade", "messages": [{"role": "user", "content": "hi"}],
            **{f[0]: _engine_field(*f) for f in fields}}
    raw = json.dumps(body).encode("utf-8", "surrogatepass")
    lim = Limits()

    def check() -> None:
        validate(decode_chat_request(raw, max_depth=lim.max_json_depth), lim)

    try:
        within_budget(check, len(raw))
    except InvalidRequest as exc:  # the gateway's 400, naming the field (or the body, for nesting)
        assert exc.param is None or re.split(r"[.\[]", exc.param)[0] in body, exc.param
    except CascadeError as exc:  # pragma: no cover - a request's error is always InvalidRequest
        raise AssertionError(f"{type(exc).__name__} for a body") from exc
