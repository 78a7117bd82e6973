"""The fake engines' per-request directives, read without a server (cascade/testing/fakes/script.py)."""

from __future__ import annotations

import pytest

from cascade.testing.fakes.script import FakeScript, script_for, token_pieces, tokens_before_break


def chat(text: str, **fields: object) -> dict[str, object]:
    return {"model": "small", "messages": [{"role": "user", "content": text}], **fields}


def test_a_directive_overrides_only_the_fields_it_names() -> None:
    base = FakeScript(tokens=6, itl_ms=5.0)
    script = script_for(base, chat("hi [fake status=503 ttft_ms=40]"))
    assert (script.status, script.ttft_ms, script.tokens, script.itl_ms) == (503, 40.0, 6, 5.0)


def test_a_model_scoped_directive_wins_over_an_unscoped_one_for_its_model_only() -> None:
    text = "[fake@small tokens=3] [fake tokens=9]"
    assert script_for(FakeScript(), chat(text, model="small")).tokens == 3
    assert script_for(FakeScript(), chat(text, model="large")).tokens == 9


def test_a_seed_scoped_directive_applies_to_requests_with_that_seed() -> None:
    text = "[fake@seed=7 fault=truncated]"
    assert script_for(FakeScript(), chat(text, seed=7)).fault == "truncated"
    assert script_for(FakeScript(), chat(text, seed=8)).fault == ""


def test_answer_spells_spaces_and_paragraph_breaks() -> None:
    script = script_for(FakeScript(), chat("[fake answer=step_one|so_42]"))
    assert script.answer == "step one\n\nso 42"
    assert token_pieces(script, 100) == ["step", " one\n\nso", " 42"]


def test_only_the_last_message_is_read() -> None:
    body = {"messages": [{"role": "user", "content": "[fake status=500]"}, {"role": "user", "content": "hi"}]}
    assert script_for(FakeScript(), body).status == 200


def test_an_unknown_fault_is_refused() -> None:
    with pytest.raises(ValueError, match="fault must be one of"):
        script_for(FakeScript(), chat("[fake fault=meltdown]"))


def test_numbered_tokens_stop_at_max_tokens() -> None:
    assert token_pieces(FakeScript(tokens=5), 3) == ["t0 ", "t1 ", "t2 "]


@pytest.mark.parametrize(("stall_after", "expected"), [(-1, 3), (2, 2), (0, 0), (99, 6)])
def test_a_broken_response_sends_stall_after_tokens_else_half(stall_after: int, expected: int) -> None:
    script = FakeScript(tokens=6, stall_after=stall_after)
    assert tokens_before_break(script, token_pieces(script, 100)) == expected


def test_a_usage_directive_is_the_usage_object_reported_as_given() -> None:
    script = script_for(FakeScript(), chat('[fake usage={"prompt_tokens":1000000000000,"completion_tokens":2.5}]'))
    assert script.usage == {"prompt_tokens": 10**12, "completion_tokens": 2.5}
    assert script_for(FakeScript(), chat("hi")).usage is None


@pytest.mark.parametrize("usage", ["5", "{oops", '"text"'])
def test_a_usage_directive_that_is_not_a_json_object_is_refused(usage: str) -> None:
    with pytest.raises(ValueError, match="usage must be a JSON object"):
        script_for(FakeScript(), chat(f"[fake usage={usage}]"))
