"""A 400's ``param`` is the client's parameter path: the labels pydantic puts in
an error's location for the union member it tried are not in it, and a
``tool_choice`` of a kind not served is named as such."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from sluicegate.server.schemas.param_errors import param_name

from .asgi import CHAT, HELLO

pytestmark = pytest.mark.anyio

TOOLS = [{"type": "function", "function": {"name": "ls", "parameters": {}}}]
ALLOWED: dict[str, Any] = {
    "type": "allowed_tools",
    "mode": "auto",
    "tools": [{"type": "function", "name": "ls"}],
}


async def _refusal(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    error: dict[str, Any] = response.json()["error"]
    return error


async def test_allowed_tools_is_refused_as_tool_choice_on_chat_and_responses(
    client: httpx.AsyncClient,
) -> None:
    chat = {
        "messages": HELLO,
        "tools": TOOLS,
        "tool_choice": {
            "type": "allowed_tools",
            "allowed_tools": {"mode": "auto", "tools": TOOLS},
        },
    }
    responses = {
        "model": "scripted",
        "input": "hi",
        "tools": [{"type": "function", "name": "ls", "parameters": {}}],
        "tool_choice": ALLOWED,
    }
    for path, body in ((CHAT, chat), ("/v1/responses", responses)):
        error = await _refusal(await client.post(path, json=body))
        assert error["param"] == "tool_choice", path
        assert "'allowed_tools' is not supported" in error["message"], path
        assert error["code"] == "unsupported_value"


@pytest.mark.parametrize(
    ("choice", "message"),
    [
        ("sometimes", "got 'sometimes'"),
        ({"function": {"name": "ls"}}, "got {'function'"),  # no type
    ],
)
async def test_a_bad_tool_choice_names_tool_choice_not_a_union_member(
    client: httpx.AsyncClient, choice: Any, message: str
) -> None:
    body = {"messages": HELLO, "tools": TOOLS, "tool_choice": choice}
    error = await _refusal(await client.post(CHAT, json=body))
    assert error["param"] == "tool_choice"
    assert message in error["message"]
    assert "literal[" not in error["message"]


@pytest.mark.parametrize(
    ("loc", "param"),
    [
        (("tool_choice", "literal['none','auto','required']"), "tool_choice"),
        (
            ("tool_choice", "NamedToolChoice", "function", "name"),
            "tool_choice.function.name",
        ),
        (
            ("messages", 2, "content", "function-after[_check(), list[Part]]", 0),
            "messages[2].content[0]",
        ),
        (("stop", "list[str]", 1), "stop[1]"),
        (("input", "str"), "input"),
        (("x", "tagged-union[A,B]", "y"), "x.y"),
        # A key the client chose is kept, whatever it looks like.
        (("chat_template_kwargs", "Mode", "bool"), "chat_template_kwargs.Mode"),
        (("metadata", "str"), "metadata.str"),
        (("logit_bias", "50256"), "logit_bias.50256"),
        (("metadata", "k" * 65, "[key]"), "metadata." + "k" * 61 + "..."),
    ],
)
def test_union_labels_are_left_out_of_the_parameter_path(
    loc: tuple[int | str, ...], param: str
) -> None:
    assert param_name(loc) == param


async def test_responses_metadata_is_bounded_as_openai_bounds_it(
    client: httpx.AsyncClient,
) -> None:
    """Every response object repeats it (three times in a stream, and in the
    store): it was unbounded up to the body limit."""
    bad = [
        ({str(i): "v" for i in range(17)}, "metadata"),
        ({"k" * 65: "v"}, "metadata." + "k" * 61 + "..."),
        ({"k": "v" * 513}, "metadata.k"),
    ]
    for metadata, param in bad:
        body = {"model": "m", "input": "Hi", "metadata": metadata}
        error = await _refusal(await client.post("/v1/responses", json=body))
        assert error["param"] == param
