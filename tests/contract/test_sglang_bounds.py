"""What cascade sends on to an engine against the pinned SGLang (tests/contract/sglang_protocol.py): every forwarded
field (schemas.PASSTHROUGH) is one SGLang's `ChatCompletionRequest` declares, the chat-template key SGLang reads from
a request is one cascade drops (and the template variables it reads are kept), and every request cascade lets through
(cascade/service/validation.py, `[gateway.limits]`) passes SGLang's own checks: its request model, `to_sampling_params`
and `SamplingParams.verify`. So cascade's bounds are never looser than SGLang's where SGLang has one; where it has none
(top_logprobs, the number of logit_bias entries and tools, metadata) cascade's are OpenAI's."""

from __future__ import annotations

import copy
import json
import re
import types
import warnings
from typing import Any

import msgspec
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cascade.config import Limits, TierConfig
from cascade.errors import InvalidRequest
from cascade.schemas import PASSTHROUGH, TOKEN_ID_DIGITS
from cascade.service.bodies import decode_chat_request
from cascade.service.validation import check_min_tokens, validate
from cascade.tiers.upstream import engine_request, template_keys
from tests.contract.sglang_protocol import SGLangProtocol, install_dir

# Forwarded fields SGLang's model does not declare: SGLangBackend leaves them out of its bodies
# (cascade/branches/sglang_client.py), which test_sglang_contract.py checks on every body it records.
SGLANG_UNDECLARED = {"metadata"}
# cascade knows no engine's vocabulary: a logit_bias key is a token id of at most 9 digits, and an id past the model's
# own vocabulary is the engine's 400 (SGLang's verify), relayed to the client.
VOCAB = 10**TOKEN_ID_DIGITS


def test_every_forwarded_field_is_one_sglangs_request_model_declares(sglang: SGLangProtocol) -> None:
    declared = set(sglang.protocol.ChatCompletionRequest.model_fields)
    assert set(PASSTHROUGH) - declared == SGLANG_UNDECLARED


def test_the_template_key_sglang_reads_from_a_request_is_dropped_and_its_template_variables_kept() -> None:
    srt = install_dir() / "sglang" / "srt"
    source = "".join(path.read_text() for folder in ("entrypoints/openai", "parser") for path in (srt / folder).glob("*.py"))
    read = set(re.findall(r"""(?:chat_template_kwargs|ctk)(?:\.get\(\s*|\[)["'](\w+)["']""", source))
    read |= set(re.findall(r"""["'](\w+)["']\s+in\s+request\.chat_template_kwargs""", source))
    assert "chat_template" in read and "enable_thinking" in read, read  # what this test reads SGLang for
    assert template_keys(dict.fromkeys(read)) == ["chat_template"]


def test_cascade_allows_no_more_stop_sequences_than_sglang(sampling_params: types.ModuleType) -> None:
    assert Limits().max_stop_sequences <= sampling_params.MAX_STOP_COUNT


def _sglang_accepts(sglang: SGLangProtocol, sampling_params: types.ModuleType, body: dict[str, Any]) -> None:
    """SGLang's own checks of `body`, as its chat route makes them (pydantic's, then the sampling parameters')."""
    request = sglang.protocol.ChatCompletionRequest.model_validate(copy.deepcopy(body))
    stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    with warnings.catch_warnings():  # SGLang's own: it reads its deprecated `max_tokens` field
        warnings.simplefilter("ignore", DeprecationWarning)
        params = request.to_sampling_params(stop=stop, model_generation_config={})
    sampling_params.SamplingParams(**params).verify(VOCAB)


FIELDS = st.fixed_dictionaries({}, optional={
    "presence_penalty": st.floats(-3, 3), "frequency_penalty": st.floats(-3, 3), "min_p": st.floats(-0.5, 1.5),
    "repetition_penalty": st.floats(-0.5, 2.5), "top_k": st.integers(-3, 2**32), "temperature": st.floats(-1, 3),
    "top_p": st.floats(-0.5, 1.5), "top_logprobs": st.integers(-1, 200), "logprobs": st.booleans(),
    "logit_bias": st.dictionaries(st.one_of(st.integers(-5, 2**32).map(str), st.sampled_from(["x", "1.0", ""])),
                                  st.floats(-150, 150), max_size=4),
    "stop": st.lists(st.text(min_size=1, max_size=4), max_size=6),
    "chat_template_kwargs": st.dictionaries(st.sampled_from(["enable_thinking", "thinking", "chat_template"]),
                                            st.booleans(), max_size=3),
    # Issue 65: the engine extras, and OpenAI's own (never sent: SGLang's model would not know them).
    "min_tokens": st.one_of(st.integers(-3, 600), st.integers(-3, 2**34)), "max_completion_tokens": st.integers(-1, 600),
    "stop_token_ids": st.lists(st.integers(-3, 2**33), max_size=70), "ignore_eos": st.booleans(),
    "skip_special_tokens": st.booleans(), "store": st.booleans(), "service_tier": st.sampled_from(["auto", "flex"]),
    "verbosity": st.sampled_from(["low", "high"]),
})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(FIELDS)
@example({"presence_penalty": -2.0, "frequency_penalty": 2.0, "min_p": 1.0, "repetition_penalty": 2.0, "top_k": -1,
          "top_logprobs": 20, "logprobs": True, "logit_bias": {"0": -100.0, "9" * TOKEN_ID_DIGITS: 100.0},
          "stop": ["a", "b", "c", "d"]})
@example({"min_p": 0.0, "repetition_penalty": 1e-9, "top_k": 1, "presence_penalty": 2.0, "frequency_penalty": -2.0})
@example({"min_tokens": 512, "stop_token_ids": list(range(2**31 - 64, 2**31)), "ignore_eos": True,
          "skip_special_tokens": False, "store": True, "service_tier": "flex", "verbosity": "low"})
@example({"min_tokens": 600, "max_completion_tokens": 600})
def test_every_request_cascade_forwards_passes_sglangs_own_checks(
        sglang: SGLangProtocol, sampling_params: types.ModuleType, fields: dict[str, Any]) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    tier = TierConfig(name="t", backends=[])
    try:
        req = decode_chat_request(json.dumps(body).encode())
        validate(req, Limits())
        check_min_tokens(req, tier)
    except InvalidRequest:
        return  # refused by cascade: no engine sees it
    # What the tier's engine gets (the picker's body; the gateway's goes through SGLangBackend, test_sglang_contract).
    sent = json.loads(msgspec.json.encode(engine_request(req, tier, "m")))
    assert "chat_template" not in (sent.get("chat_template_kwargs") or {})
    assert not {"store", "service_tier", "verbosity"} & set(sent)
    assert set(sent) <= set(sglang.protocol.ChatCompletionRequest.model_fields)
    _sglang_accepts(sglang, sampling_params, sent)
