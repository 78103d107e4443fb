"""An upstream model's context window, read from each dialect's answer."""

from __future__ import annotations

import json

import httpx
import pytest

from sluicegate.engines.upstream.config import UpstreamConfig
from sluicegate.engines.upstream.context import (
    UpstreamFacts,
    context_of_models,
    context_of_props,
    upstream_facts,
)
from sluicegate.engines.upstream.file import list_models


def test_a_model_list_tells_max_model_len_or_context_length() -> None:
    vllm = {
        "data": [
            {"id": "other", "max_model_len": 1},
            {"id": "m", "max_model_len": 8192},
        ]
    }
    assert context_of_models(vllm, "m") == 8192
    sluicegate = {"data": [{"id": "m", "context_length": 2048}]}
    assert context_of_models(sluicegate, "m") == 2048
    unknown: list[object] = [
        {"data": [{"id": "m"}]},
        {"data": [{"id": "m", "max_model_len": "8"}]},
        {"data": [{"id": "m", "max_model_len": 0}]},
        {"data": "x"},
        [],
        None,
    ]
    for told in unknown:
        assert context_of_models(told, "m") is None, told


def test_llama_server_props_tell_one_slots_window() -> None:
    assert context_of_props({"default_generation_settings": {"n_ctx": 4096}}) == 4096
    props: list[object] = [{"default_generation_settings": {}}, {"n_ctx": 5}, None]
    for told in props:
        assert context_of_props(told) is None


@pytest.mark.parametrize(
    ("answers", "facts"),
    [
        (
            {
                "/v1/models": {
                    "data": [{"id": "m", "max_model_len": 512, "owned_by": "vllm"}]
                }
            },
            UpstreamFacts(512, "vllm"),
        ),
        (
            {
                "/v1/models": {"data": []},
                "/props": {"default_generation_settings": {"n_ctx": 64}},
            },
            UpstreamFacts(64, None),
        ),
        (
            {"/v1/models": {"data": [{"id": "m", "owned_by": "library"}]}},
            UpstreamFacts(None, "library"),  # Ollama: no window told
        ),
        ({}, UpstreamFacts()),  # every path a 404
    ],
)
def test_upstream_facts_ask_the_models_then_the_props(
    answers: dict[str, object], facts: UpstreamFacts
) -> None:
    seen: list[tuple[str, str | None]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, request.headers.get("authorization")))
        if request.url.path not in answers:
            return httpx.Response(404)
        return httpx.Response(200, content=json.dumps(answers[request.url.path]))

    upstream = UpstreamConfig("http://up/v1", api_key="k")
    found = upstream_facts([(upstream, "m")], 5.0, httpx.MockTransport(handler))
    assert found == [facts]
    assert all(auth == "Bearer k" for _, auth in seen)


def test_json_nested_too_deep_is_no_answer() -> None:
    """An answer of 200,000 open brackets (within MAX_BYTES) tells nothing: the
    standard library's decoder raised RecursionError out of the look-up."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b"[" * 200_000)

    transport = httpx.MockTransport(handler)
    upstream = UpstreamConfig("http://up/v1")
    assert upstream_facts([(upstream, "m")], 5.0, transport) == [UpstreamFacts()]
    listed = list_models(["http://up/v1"], 5.0, transport)
    assert listed == [("http://up/v1/models", "not an OpenAI model list")]
