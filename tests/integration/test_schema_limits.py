"""Hostile JSON schemas against the real server on the default model: the input
that crashed it (a ``$defs`` chain 1,000 deep) and tools nested 150 levels are
400s naming the limit, and a generated fuzz of deep, wide, chained and huge-enum
schemas never gets a 5xx, the process alive and serving after every case."""

from __future__ import annotations

import random
import time
from typing import Any

import httpx
import pytest

from .servers import ServerProcess

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]

HELLO = [{"role": "user", "content": "Hi"}]
FUZZ_CASES = 30
"""Schemas per fuzz run: under a minute on this project's 2-core machine when
idle; the timeout leaves room for a machine shared with other work."""


def chain(n: int) -> dict[str, Any]:
    defs: dict[str, Any] = {
        f"d{i}": {"type": "object", "properties": {"n": {"$ref": f"#/$defs/d{i + 1}"}}}
        for i in range(n)
    }
    defs[f"d{n}"] = {"type": "string"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


def nested(levels: int, key: str = "properties") -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        if key == "properties":
            schema = {"type": "object", "properties": {"a": schema}}
        elif key == "items":
            schema = {"type": "array", "items": schema}
        else:
            schema = {"anyOf": [schema, {"type": "null"}]}
    return schema


def alive(server: ServerProcess, http: httpx.Client) -> None:
    assert server.process.poll() is None, server.log_text()[-4000:]
    assert http.get("/health").status_code == 200


def serves(http: httpx.Client, model_id: str) -> None:
    body = {"model": model_id, "messages": HELLO, "max_tokens": 2}
    assert http.post("/v1/chat/completions", json=body).status_code == 200


def chat_format(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def test_the_thousand_deep_chain_is_a_400_on_chat_and_count_tokens(
    llama_server: ServerProcess, http: httpx.Client, model_id: str
) -> None:
    body: dict[str, Any] = {
        "model": model_id,
        "messages": HELLO,
        "max_tokens": 4,
        "response_format": chat_format(chain(1000)),
    }
    for stream in (False, True):
        response = http.post("/v1/chat/completions", json={**body, "stream": stream})
        assert response.status_code == 400, response.text[:2000]
        error = response.json()["error"]
        assert error["param"] == "response_format"
        assert "'ref_chain'" in error["message"]
        alive(llama_server, http)
    counting = {
        "model": model_id,
        "messages": HELLO,
        "tools": [{"name": "f", "input_schema": chain(1000)}],
    }
    response = http.post("/v1/messages/count_tokens", json=counting)
    assert response.status_code == 400, response.text[:2000]
    assert response.json()["type"] == "error"
    assert "tools[0].input_schema" in response.json()["error"]["message"]
    alive(llama_server, http)
    serves(http, model_id)


@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_tools_nested_150_levels_are_a_400(
    llama_server: ServerProcess, http: httpx.Client, model_id: str, tool_choice: str
) -> None:
    body = {
        "model": model_id,
        "messages": HELLO,
        "max_tokens": 4,
        "tool_choice": tool_choice,
        "tools": [
            {"type": "function", "function": {"name": "f", "parameters": nested(150)}}
        ],
    }
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text[:2000]
    error = response.json()["error"]
    assert error["param"] == "tools[0].function.parameters"
    assert "'depth'" in error["message"]
    alive(llama_server, http)
    serves(http, model_id)


def test_an_object_of_500_pattern_properties_is_a_400_and_blocks_no_one(
    llama_server: ServerProcess, http: httpx.Client, model_id: str
) -> None:
    """500 ``patternProperties`` (30 KB, within every other limit) took the
    compiler over a minute of native work no deadline stops; two of them held
    both schema threads, and every other client's schema got a 400
    ``schema_timeout`` for minutes. Refused before any compile, the next
    request's schema compiles as usual."""
    many = {f"^p{i}[a-z]*$": {"type": "string"} for i in range(500)}
    hostile = {"type": "object", "patternProperties": many}
    body: dict[str, Any] = {"model": model_id, "messages": HELLO, "max_tokens": 4}
    for _ in range(2):
        response = http.post(
            "/v1/chat/completions",
            json={**body, "response_format": chat_format(hostile)},
        )
        assert response.status_code == 400, response.text[:2000]
        error = response.json()["error"]
        assert error["code"] == "schema_limit_exceeded", error
        assert "--schema-max-pattern-properties" in error["message"]
    plain = {"type": "object", "properties": {"a": {"type": "integer"}}}
    response = http.post(
        "/v1/chat/completions", json={**body, "response_format": chat_format(plain)}
    )
    assert response.status_code == 200, response.text[:2000]
    alive(llama_server, http)


def _fuzz_schema(rng: random.Random) -> Any:
    kind = rng.choice(["deep", "wide", "chain", "enum", "cycle", "mixed", "bytes"])
    if kind == "deep":
        return nested(
            rng.choice([10, 40, 63, 64, 65, 200, 2000]),
            rng.choice(["properties", "items", "anyOf"]),
        )
    if kind == "wide":
        n = rng.choice([100, 1999, 2000, 2001, 10_000])
        return {
            "type": "object",
            "properties": {f"p{i}": {"type": "integer"} for i in range(n)},
        }
    if kind == "chain":
        return chain(rng.choice([5, 31, 32, 33, 900, 1000, 3000]))
    if kind == "enum":
        n = rng.choice([10, 2000, 2001, 100_000])
        return {"enum": [f"v{i}" for i in range(n)]}
    if kind == "cycle":
        n = rng.choice([2, 10, 40])
        cycle: dict[str, Any] = {
            f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{(i + 1) % n}"}, {"type": "null"}]}
            for i in range(n)
        }
        return {"$ref": "#/$defs/d0", "$defs": cycle}
    if kind == "mixed":
        # A chain whose definitions are deep each: depth through references.
        hops, levels = rng.choice([(3, 20), (10, 10), (30, 30), (64, 31)])
        defs: dict[str, Any] = {}
        for i in range(hops):
            inner: dict[str, Any] = {"$ref": f"#/$defs/d{i + 1}"}
            for _ in range(levels):
                inner = {"type": "object", "properties": {"a": inner}}
            defs[f"d{i}"] = inner
        defs[f"d{hops}"] = {"type": "string"}
        return {"$ref": "#/$defs/d0", "$defs": defs}
    return {"type": "string", "description": "x" * rng.choice([1000, 300_000])}


@pytest.mark.timeout(400)
def test_a_fuzz_of_hostile_schemas_gets_no_5xx_and_the_server_lives(
    llama_server: ServerProcess, http: httpx.Client, model_id: str
) -> None:
    rng = random.Random(20261205)
    statuses: dict[int, int] = {}
    took: list[tuple[float, int, str]] = []
    for case in range(FUZZ_CASES):
        schema = _fuzz_schema(rng)
        route = rng.choice(["format", "tools", "messages", "count"])
        if route == "format":
            path = "/v1/chat/completions"
            body: dict[str, Any] = {
                "model": model_id,
                "messages": HELLO,
                "max_tokens": 2,
                "response_format": chat_format(schema),
            }
        elif route == "tools":
            path = "/v1/chat/completions"
            tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
            choice = rng.choice(["auto", "required"])
            body = {
                "model": model_id,
                "messages": HELLO,
                "max_tokens": 2,
                "tools": [tool],
                "tool_choice": choice,
            }
        else:
            path = (
                "/v1/messages" if route == "messages" else "/v1/messages/count_tokens"
            )
            body = {
                "model": model_id,
                "messages": HELLO,
                "max_tokens": 2,
                "tools": [{"name": "f", "input_schema": schema}],
            }
        started = time.monotonic()
        response = http.post(path, json=body)
        took.append((time.monotonic() - started, case, route))
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        assert response.status_code < 500, (case, route, response.text[:2000])
        alive(llama_server, http)
    assert statuses.get(400, 0) > 0, statuses
    assert statuses.get(200, 0) > 0, statuses
    print(f"\nschema fuzz: statuses {statuses}; slowest {sorted(took)[-3:]}")
    serves(http, model_id)
