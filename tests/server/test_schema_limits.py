"""A schema past a limit is a 400 on every route that takes one, in that API's
error shape, naming the limit and that API's parameter; the settings change
the bounds; schema work runs in threads of a known stack, with a deadline."""

from __future__ import annotations

import argparse
import asyncio
import math
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import httpx
import pytest

from sluicegate.core.errors import RequestError
from sluicegate.core.schema_limits import SchemaLimits
from sluicegate.engines.clocks import ManualClock
from sluicegate.engines.scripted.engine import ScriptedEngine
from sluicegate.server.app.factory import create_app
from sluicegate.server.app.options import add_serve_options, config_fields
from sluicegate.server.config import ServerConfig
from sluicegate.server.prepare.schema_worker import SchemaWorker

from .asgi import CHAT, HELLO

RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
COUNT = "/v1/messages/count_tokens"


def chain(n: int) -> dict[str, Any]:
    """A ``$defs`` chain ``n`` deep: the input class that overflows llguidance's
    stack (about 900 deep on an 8 MiB stack)."""
    defs: dict[str, Any] = {
        f"d{i}": {"type": "object", "properties": {"n": {"$ref": f"#/$defs/d{i + 1}"}}}
        for i in range(n)
    }
    defs[f"d{n}"] = {"type": "string"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


def nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def openai_error(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 400, response.text[:2000]
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    return error


def anthropic_error(response: httpx.Response) -> str:
    assert response.status_code == 400, response.text[:2000]
    body = response.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    message: str = body["error"]["message"]
    return message


def chat_format(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def chat_tools(schema: Any) -> list[dict[str, Any]]:
    ok = {"type": "function", "function": {"name": "ok", "parameters": {}}}
    bad = {"type": "function", "function": {"name": "f", "parameters": schema}}
    return [ok, bad]


async def serves(client: httpx.AsyncClient) -> None:
    response = await client.post(CHAT, json={"messages": HELLO, "max_tokens": 2})
    assert response.status_code == 200


@pytest.mark.anyio
@pytest.mark.parametrize("tool_choice", [None, "auto", "required"])
async def test_chat_refuses_a_deep_chain_or_nesting_naming_the_param(
    client: httpx.AsyncClient, tool_choice: str | None
) -> None:
    body: dict[str, Any] = {
        "messages": HELLO,
        "response_format": chat_format(chain(1000)),
    }
    error = openai_error(await client.post(CHAT, json=body))
    assert error["param"] == "response_format"
    assert error["code"] == "schema_limit_exceeded"
    assert "'ref_chain'" in error["message"]
    assert "--schema-max-ref-chain" in error["message"]
    body = {"messages": HELLO, "tools": chat_tools(nested(150))}
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    error = openai_error(await client.post(CHAT, json=body))
    assert error["param"] == "tools[1].function.parameters"
    assert "'depth'" in error["message"]
    await serves(client)


@pytest.mark.anyio
async def test_responses_names_text_format_and_tool_parameters(
    client: httpx.AsyncClient,
) -> None:
    fmt = {"type": "json_schema", "name": "x", "schema": chain(1000)}
    body: dict[str, Any] = {"model": "scripted", "input": "Hi", "text": {"format": fmt}}
    error = openai_error(await client.post(RESPONSES, json=body))
    assert error["param"] == "text.format"
    assert error["message"].startswith("text.format is a JSON schema")
    tools = [
        {"type": "function", "name": "ok", "parameters": {}},
        {"type": "function", "name": "f", "parameters": nested(150)},
    ]
    error = openai_error(
        await client.post(
            RESPONSES, json={"model": "scripted", "input": "Hi", "tools": tools}
        )
    )
    assert error["param"] == "tools[1].parameters"
    assert error["message"].startswith("tools[1].parameters is a JSON schema")
    await serves(client)


@pytest.mark.anyio
@pytest.mark.parametrize("path", [MESSAGES, COUNT])
async def test_messages_and_count_tokens_name_the_input_schema(
    client: httpx.AsyncClient, path: str
) -> None:
    for schema, limit in ((chain(1000), "'ref_chain'"), (nested(150), "'depth'")):
        body = {
            "model": "scripted",
            "max_tokens": 4,
            "messages": HELLO,
            "tools": [
                {"name": "ok", "input_schema": {"type": "object"}},
                {"name": "f", "input_schema": schema},
            ],
        }
        message = anthropic_error(await client.post(path, json=body))
        assert message.startswith("tools[1].input_schema is a JSON schema")
        assert limit in message
    body = {
        "model": "scripted",
        "max_tokens": 4,
        "messages": HELLO,
        "output_config": {"format": {"type": "json_schema", "schema": chain(1000)}},
    }
    message = anthropic_error(await client.post(path, json=body))
    assert message.startswith("output_config.format is a JSON schema")
    await serves(client)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("field", "at_bound", "past", "limit"),
    [
        (
            "max_properties",
            {"properties": {"a": {}, "b": {}}},
            {"properties": {"a": {}, "b": {}, "c": {}}},
            "'properties'",
        ),
        ("max_enum", {"enum": [1, 2]}, {"enum": [1, 2, 3]}, "'enum'"),
        ("max_depth", {"items": {}}, {"items": {"items": {}}}, "'depth'"),
        ("max_ref_chain", chain(1), chain(2), "'ref_chain'"),
        ("max_bytes", {"enum": ["a" * 20]}, {"enum": ["a" * 40]}, "'bytes'"),
    ],
)
async def test_each_limit_is_a_setting(
    field: str, at_bound: Any, past: Any, limit: str
) -> None:
    bound = {
        "max_properties": 2,
        "max_enum": 2,
        "max_depth": 2,
        "max_ref_chain": 2,
        "max_bytes": 40,
    }
    config = ServerConfig(schema_limits=SchemaLimits(**{field: bound[field]}))
    app = create_app(ScriptedEngine(tokens_per_s=5000), config)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        body = {
            "messages": HELLO,
            "max_tokens": 2,
            "response_format": chat_format(at_bound),
        }
        assert (await client.post(CHAT, json=body)).status_code == 200
        body["response_format"] = chat_format(past)
        error = openai_error(await client.post(CHAT, json=body))
        assert limit in error["message"]


@pytest.mark.anyio
async def test_an_unmeasurable_reference_is_an_unsupported_schema(
    client: httpx.AsyncClient,
) -> None:
    schema = {"type": "object", "properties": {"a": {"$ref": "#/properties/b"}}}
    body = {"messages": HELLO, "response_format": chat_format(schema)}
    error = openai_error(await client.post(CHAT, json=body))
    assert error["code"] == "unsupported_schema"
    assert "'#/properties/b'" in error["message"]


def test_the_serve_options_set_the_limits_and_refuse_zero() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    add_serve_options(parser)
    args = parser.parse_args(
        [
            "--schema-max-depth",
            "7",
            "--schema-max-enum",
            "9",
            "--schema-timeout-s",
            "2.5",
        ]
    )
    fields = config_fields(args)
    config = ServerConfig(**fields)
    assert config.schema_limits == SchemaLimits(max_depth=7, max_enum=9)
    assert config.schema_timeout_s == 2.5
    defaults = ServerConfig(**config_fields(parser.parse_args([])))
    assert defaults.schema_limits == SchemaLimits()
    assert defaults.schema_timeout_s == 10.0
    with pytest.raises(SystemExit, match="max_bytes"):
        config_fields(parser.parse_args(["--schema-max-bytes", "0"]))
    with pytest.raises(ValueError, match="schema_timeout_s"):
        ServerConfig(schema_timeout_s=0)


# --- the worker ---------------------------------------------------------------


@pytest.mark.anyio
async def test_the_worker_returns_results_and_reraises_errors() -> None:
    worker = SchemaWorker(threads=1, stack_bytes=4 * 1024 * 1024)
    assert await worker.run(lambda: threading.current_thread().name, 5, "x", None) == (
        "sluicegate-schemas"
    )

    def fail() -> None:
        raise RequestError("bad schema", param="tools")

    with pytest.raises(RequestError, match="bad schema"):
        await worker.run(fail, 5, "x", None)


@pytest.mark.anyio
async def test_the_worker_gives_up_at_its_deadline_and_goes_on() -> None:
    clock = ManualClock()
    worker = SchemaWorker(threads=1, stack_bytes=4 * 1024 * 1024, timers=clock)
    release = threading.Event()
    call = worker.run(lambda: release.wait(10), 5, "the schemas", "tools")
    waiting = asyncio.ensure_future(call)
    while clock.next_due == math.inf:  # noqa: ASYNC110 (until it waits on its deadline)
        await asyncio.sleep(0)
    clock.advance(4.5)
    await asyncio.sleep(0)
    assert not waiting.done()
    clock.advance(0.5)
    with pytest.raises(RequestError) as caught:
        await waiting
    assert caught.value.code == "schema_timeout"
    assert caught.value.param == "tools"
    assert "--schema-timeout-s" in caught.value.message
    release.set()
    # The thread finished the abandoned call and takes the next.
    assert await worker.run(lambda: 7, 10, "x", None) == 7


@pytest.mark.anyio
async def test_a_call_whose_waiter_gave_up_in_the_queue_is_never_run() -> None:
    """Behind a compile that outlives every deadline, the calls queued after it
    timed out for their clients; each then ran all the same, one after the
    other, so the backlog (and the CPU it burnt) outlived the attack."""
    clock = ManualClock()
    worker = SchemaWorker(threads=1, stack_bytes=4 * 1024 * 1024, timers=clock)
    release = threading.Event()
    ran: list[int] = []
    first = asyncio.ensure_future(worker.run(lambda: release.wait(10), 5, "x", None))
    queued = asyncio.ensure_future(worker.run(lambda: ran.append(1), 5, "x", None))
    while clock.next_due == math.inf:  # noqa: ASYNC110 (until both wait)
        await asyncio.sleep(0)
    await asyncio.sleep(0)
    clock.advance(5)
    for call in (first, queued):
        with pytest.raises(RequestError):
            await call
    release.set()
    assert await worker.run(lambda: 7, 10, "x", None) == 7
    assert ran == []


CRASH = textwrap.dedent(
    """
    import json, sys, threading
    import llguidance
    from sluicegate.server.prepare.schema_worker import SchemaWorker
    n = 1500
    defs = {f"d{i}": {"properties": {"n": {"$ref": f"#/$defs/d{i+1}"}}}
            for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    schema = {"$ref": "#/$defs/d0", "$defs": defs}
    text = "%llguidance {}\\nstart: %json " + json.dumps(schema)
    compile = lambda: llguidance.LLMatcher.validate_grammar_with_warnings(text, None)
    if sys.argv[1] == "worker":
        import anyio
        async def main():
            return await SchemaWorker(threads=1).run(compile, 60, "x", None)
        print(anyio.run(main)[0])
    else:
        threading.stack_size(8 * 1024 * 1024)
        t = threading.Thread(target=compile); t.start(); t.join()
    """
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("where", "status"), [("worker", 0), ("thread", -11)])
def test_the_worker_stack_holds_the_chain_an_8_mib_thread_dies_of(
    where: str, status: int
) -> None:
    """Past the limits (here skipped) the worker's stack is still a margin:
    a 1,500-deep chain compiles there, and kills a thread of glibc's default."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", CRASH, where], capture_output=True, timeout=110
    )
    assert done.returncode == status, done.stderr[-2000:]
    assert time.monotonic() - started < 110


@pytest.mark.anyio
async def test_a_schema_that_only_refers_to_itself_is_an_unsupported_schema(
    client: httpx.AsyncClient,
) -> None:
    """It compiles, and matched no text: the request failed at its first token
    (500, llguidance's state in the message) instead of a 400."""
    body: dict[str, Any] = {
        "messages": HELLO,
        "response_format": chat_format({"$ref": "#"}),
    }
    error = openai_error(await client.post(CHAT, json=body))
    assert (error["param"], error["code"]) == ("response_format", "unsupported_schema")
    assert "matches no JSON value" in error["message"]
    cycle = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"anyOf": [{"$ref": "#"}]}}}
    body = {"messages": HELLO, "tools": chat_tools({**cycle, "$ref": "#/$defs/a"})}
    error = openai_error(await client.post(CHAT, json=body))
    assert (error["param"], error["code"]) == ("tools", "unsupported_schema")
    recursive = {
        "anyOf": [{"type": "integer"}, {"type": "array", "items": {"$ref": "#"}}]
    }
    body = {
        "messages": HELLO,
        "response_format": chat_format(recursive),
        "max_tokens": 2,
    }
    assert (await client.post(CHAT, json=body)).status_code == 200
