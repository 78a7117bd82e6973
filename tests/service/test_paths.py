"""Request paths in normal form (cascade/service/paths.py), as the gateway and the Envoy picker both route on them."""

from __future__ import annotations

import pytest

from cascade.service.paths import normalize_path


@pytest.mark.parametrize(("path", "normal"), [
    ("/v1/chat/completions", "/v1/chat/completions"),
    ("/v1/chat/%63ompletions", "/v1/chat/completions"),  # unreserved characters decoded (RFC 3986 6.2.2.2)
    ("/%76%31/%41-%5a_%7e%2D", "/v1/A-Z_~-"),
    ("//v1///models", "/v1/models"),  # slashes merged
    ("/v1/./models", "/v1/models"),  # dot segments removed (RFC 3986 5.2.4)
    ("/v1/x/y/../../models", "/v1/models"),
    ("/../../v1/models", "/v1/models"),
    ("/v1/%2e%2E/v1/models", "/v1/models"),  # encoded dots too
    ("/v1/models/.", "/v1/models/"),
    ("/v1/models/..", "/v1/"),
    ("/..", "/"),
    ("/v1/models/", "/v1/models/"),  # a trailing slash stays
    ("/V1/Models", "/V1/Models"),  # so does case
    ("/a%20b/%C3%A9", "/a b/\u00e9"),  # the other escapes decoded last, as ASGI's path is
    ("/a%2520b", "/a%20b"),  # once
    ("/.well-known/x", "/.well-known/x"),
    ("*", "*"),
])
def test_a_path_in_normal_form(path: str, normal: str) -> None:
    assert normalize_path(path) == normal
    assert normalize_path(normal) == normal or "%" in normal  # normal forms are fixed points (bar literal %)


@pytest.mark.parametrize("path", ["/v1/chat%2Fcompletions", "/v1%2fmodels", "/v1%5Cmodels", "/v1/%5c"])
def test_an_encoded_slash_or_backslash_has_no_normal_form(path: str) -> None:
    assert normalize_path(path) is None


@pytest.mark.parametrize(("path", "normal"), [
    ("/v1/models/Qwen%2FQwen3-8B", "/v1/models/Qwen/Qwen3-8B"),  # as OpenAI's SDK writes a model id with a slash
    ("/v1/models/..%2F..%2Fv1%2Fchat%2Fcompletions", "/v1/models/../../v1/chat/completions"),  # still a model id
    ("/v1/models/a%5Cb%25", "/v1/models/a\\b%"),
])
def test_the_model_routes_id_is_data_decoded_whole_and_names_no_other_route(path: str, normal: str) -> None:
    assert normalize_path(path) == normal
    assert normalize_path("/v1//models/a%2Fb") is None and normalize_path("/v1/models%2Fa") is None
