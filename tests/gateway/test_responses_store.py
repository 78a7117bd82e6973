"""Stored responses through live gateways, driven by the official `openai` SDK: one API key never reads, continues nor
deletes another's; a conversation past its turns or bytes is a 400 naming the parameter; two gateways on one Redis
share the conversations; Redis away refuses a read with a 503 and answers a response it could not store, saying so.
The stores' own contract and limits: tests/service/test_response_store.py."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import httpx
import openai
import pytest

from cascade.testing.fakes.engine import FakeScript
from cascade.testing.servers import TIERS
from tests.gateway.gateway_setup import running_gateway
from tests.gateway.test_redis_limits import redis  # noqa: F401 (the `redis` fixture)
from tests.gateway.test_tenants import bearer, entry

KEY_A, KEY_B = "csk-team-a-" + "a" * 40, "csk-team-b-" + "b" * 40


@contextmanager
def sdk(base: str, key: str = "unused") -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=10)
    try:
        yield client
    finally:
        client.close()


def test_one_key_never_reads_continues_nor_deletes_another_keys_response() -> None:
    keys = entry("team-a", KEY_A) + entry("team-b", KEY_B)
    with running_gateway(FakeScript(tokens=4), extra=keys) as (base, _, _), sdk(base, KEY_A) as a, \
            sdk(base, KEY_B) as b:
        secret = a.responses.create(model=TIERS[0], input="my secret is 42")
        refusals = [lambda: b.responses.retrieve(secret.id), lambda: b.responses.delete(secret.id),
                    lambda: b.responses.create(model=TIERS[0], input="what is the secret?",
                                               previous_response_id=secret.id)]
        bodies = []
        for attempt in refusals:
            with pytest.raises(openai.NotFoundError) as info:
                attempt()
            bodies.append(info.value.body)
        assert [body["param"] for body in bodies] == ["response_id", "response_id", "previous_response_id"]
        # The same answer as for an id that never was: nothing tells B the id exists.
        assert all(body["message"] == f"Response with id '{secret.id}' not found." for body in bodies)
        assert a.responses.retrieve(secret.id).output_text == secret.output_text  # still there for A
        assert a.responses.create(model=TIERS[0], input="and?", previous_response_id=secret.id).status == "completed"
        assert httpx.get(f"{base}/v1/responses/{secret.id}", timeout=5).status_code == 401
        assert httpx.get(f"{base}/v1/responses/{secret.id}", headers=bearer("csk-nobody"), timeout=5).status_code == 401


LIMITS = "[gateway.responses]\nmax_conversation_turns = 2\nmax_conversation_bytes = 600\n"


def test_a_conversation_past_its_turns_is_a_400_naming_previous_response_id() -> None:
    with running_gateway(FakeScript(tokens=2), extra=LIMITS) as (base, _, _), sdk(base) as client:
        first = client.responses.create(model=TIERS[0], input="one")
        second = client.responses.create(model=TIERS[0], input="two", previous_response_id=first.id)
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(model=TIERS[0], input="three", previous_response_id=second.id)
        assert info.value.body["param"] == "previous_response_id"
        assert info.value.body["code"] == "conversation_too_long" and "max_conversation_turns" in info.value.body[
            "message"]
        # A branch from the first turn is still within the limit.
        assert client.responses.create(model=TIERS[0], input="2b", previous_response_id=first.id).status == "completed"


def test_a_conversation_past_its_bytes_is_a_400_naming_the_input_or_the_previous_response() -> None:
    with running_gateway(FakeScript(tokens=2), extra=LIMITS) as (base, _, _), sdk(base) as client:
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(model=TIERS[0], input="x" * 600)
        assert info.value.body["param"] == "input" and info.value.body["code"] == "conversation_too_large"
        first = client.responses.create(model=TIERS[0], input="y" * 400)
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(model=TIERS[0], input="z" * 200, previous_response_id=first.id)
        assert info.value.body["param"] == "previous_response_id"
        assert "max_conversation_bytes" in info.value.body["message"]


def test_two_gateways_on_one_redis_share_a_conversation(redis) -> None:  # noqa: F811
    shared = f'[gateway.redis]\nurl = "{redis.url}"\n'
    with ExitStack() as stack:
        one, _, engine_one = stack.enter_context(running_gateway(FakeScript(tokens=3), extra=shared))
        two, _, _ = stack.enter_context(running_gateway(FakeScript(tokens=3), extra=shared))
        first_client, second_client = stack.enter_context(sdk(one)), stack.enter_context(sdk(two))
        first = first_client.responses.create(model=TIERS[0], input="remember: blue")
        events = list(second_client.responses.create(model=TIERS[0], input="what colour?",
                                                     previous_response_id=first.id, stream=True))
        second = events[-1].response
        assert second.status == "completed" and second.previous_response_id == first.id
        assert first_client.responses.retrieve(second.id).output_text == second.output_text  # written on two
        third = first_client.responses.create(model=TIERS[0], input="and?", previous_response_id=second.id)
        assert third.status == "completed"
        second_client.responses.delete(first.id)
        with pytest.raises(openai.NotFoundError):
            first_client.responses.retrieve(first.id)
        assert first_client.responses.retrieve(second.id).id == second.id  # each response holds its own history
        assert engine_one.stats.requests == 2  # the first and the third turns


def test_redis_away_refuses_a_read_with_503_and_answers_a_write_it_could_not_keep(redis) -> None:  # noqa: F811
    shared = f'[gateway.redis]\nurl = "{redis.url}"\ntimeout_s = 0.25\n'
    with running_gateway(FakeScript(tokens=3), extra=shared) as (base, _, _), sdk(base) as client:
        first = client.responses.create(model=TIERS[0], input="hi")
        redis.kill()
        with pytest.raises(openai.InternalServerError) as info:
            client.responses.create(model=TIERS[0], input="again", previous_response_id=first.id)
        assert info.value.status_code == 503 and info.value.body["code"] == "responses_unavailable"
        assert info.value.response.headers["retry-after"] == "1"
        unkept = client.responses.create(model=TIERS[0], input="fresh")
        assert unkept.status == "completed" and unkept.output_text
        assert "not stored" in unkept.model_extra["cascade"]["note"]
