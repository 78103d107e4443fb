"""Random request bodies never get a 5xx, and a refusal comes before any byte.

Hypothesis draws bodies from the documented parameters with values of every JSON
type (and some well-formed ones), posts them to both endpoints, and checks the
status is 200, 400 or 404; a 400/404 has the OpenAI error shape and a 200 stream
ends with ``[DONE]``.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluicegate.engines.scripted import ScriptedEngine
from sluicegate.server.app import create_app
from sluicegate.server.config import ServerConfig

from .asgi import CHAT, COMPLETIONS

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=6,
)

COMMON: dict[str, st.SearchStrategy[Any]] = {
    "model": st.sampled_from(["scripted", "default", "other"]),
    "n": st.integers(-1, 4),
    "stop": st.lists(st.text(max_size=3), max_size=3),
    "max_tokens": st.integers(-1, 5000),
    "temperature": st.floats(-1, 3),
    "top_p": st.floats(-0.5, 1.5),
    "seed": st.integers(-(2**63), 2**63),
    "logit_bias": st.dictionaries(
        st.integers(-5, 400).map(str), st.floats(-150, 150), max_size=3
    ),
    "stream_options": st.fixed_dictionaries(
        {},
        optional={
            "include_usage": st.booleans(),
            "continuous_usage_stats": st.booleans(),
        },
    ),
    "top_k": st.integers(-3, 50),
    "min_p": st.floats(-1, 2),
    "repetition_penalty": st.floats(-1, 3),
    "stop_token_ids": st.lists(st.integers(-2, 400), max_size=3),
    "ignore_eos": st.booleans(),
    "include_stop_str_in_output": st.booleans(),
    "skip_special_tokens": st.booleans(),
    "user": st.text(max_size=5),
    "presence_penalty": st.floats(-3, 3),
    "frequency_penalty": st.floats(-3, 3),
    "continuous_usage_stats": st.booleans(),
}
CHAT_FIELDS = {
    **COMMON,
    "messages": st.lists(
        st.fixed_dictionaries(
            {
                "role": st.sampled_from(["system", "user", "assistant", "tool"]),
                "content": st.text(max_size=10),
            }
        ),
        max_size=3,
    ),
    "logprobs": st.booleans(),
    "top_logprobs": st.integers(-1, 25),
    "max_completion_tokens": st.integers(-1, 5000),
    "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"}]),
    "tools": st.sampled_from([[], [{"type": "function"}]]),
    "add_generation_prompt": st.booleans(),
}
COMPLETION_FIELDS = {
    **COMMON,
    "prompt": st.text(max_size=10)
    | st.lists(st.integers(-1, 400), max_size=4)
    | st.lists(st.text(max_size=4), max_size=3)
    | st.lists(st.lists(st.integers(0, 300), max_size=3), max_size=3),
    "echo": st.booleans(),
    "logprobs": st.integers(-1, 25),
    "suffix": st.sampled_from(["", "end"]),
}


REQUIRED = {CHAT: "messages", COMPLETIONS: "prompt"}


@st.composite
def _bodies(
    draw: st.DrawFn, path: str, fields: dict[str, st.SearchStrategy[Any]]
) -> Any:
    """Mostly well-typed bodies; sometimes one field (or the body) is any JSON."""
    required = REQUIRED[path]
    body = draw(
        st.fixed_dictionaries(
            {required: fields[required], "stream": st.booleans()},
            optional={k: v for k, v in fields.items() if k != required},
        )
    )
    mutation = draw(st.sampled_from(["none", "field", "body"]))
    if mutation == "field":
        body[draw(st.sampled_from(sorted(fields)))] = draw(JSON)
    elif mutation == "body":
        return draw(JSON)
    return body


async def _post(path: str, body: Any) -> httpx.Response:
    engine = ScriptedEngine("Hi there<end_of_turn>", tokens_per_s=float("inf"))
    app = create_app(engine, ServerConfig(default_max_tokens=8))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        headers = {"content-type": "application/json"}
        return await client.post(path, content=json.dumps(body), headers=headers)


def _check(response: httpx.Response) -> None:
    assert response.status_code in (200, 400, 404), response.text
    if response.status_code != 200:
        assert response.headers["content-type"] == "application/json"
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    elif response.headers["content-type"].startswith("text/event-stream"):
        assert response.text.endswith("data: [DONE]\n\n"), response.text[-300:]
        assert '"error"' not in response.text
    else:
        assert response.json()["choices"]


@pytest.mark.parametrize(
    ("path", "fields"), [(CHAT, CHAT_FIELDS), (COMPLETIONS, COMPLETION_FIELDS)]
)
def test_random_bodies_never_get_a_server_error(
    path: str, fields: dict[str, st.SearchStrategy[Any]]
) -> None:
    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
    @given(_bodies(path, fields))
    def run(body: Any) -> None:
        _check(anyio.run(_post, path, body))

    run()


@pytest.mark.anyio
async def test_the_fuzzer_draws_every_field_of_the_served_openapi_schema() -> None:
    """The bodies above cover what ``GET /openapi.json`` says each endpoint takes."""
    engine = ScriptedEngine()
    app = create_app(engine, ServerConfig())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        response = await client.get("/openapi.json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    for path, fields in ((CHAT, CHAT_FIELDS), (COMPLETIONS, COMPLETION_FIELDS)):
        schema = paths[path]["post"]["requestBody"]["content"]["application/json"]
        served = set(schema["schema"]["properties"])
        drawn = {*fields, "stream"}  # _bodies always draws ``stream``
        assert served <= drawn, sorted(served - drawn)
        assert REQUIRED[path] in schema["schema"]["required"]
