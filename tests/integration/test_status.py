"""Status codes are decided before the first byte.

Every rejected request here asks for a stream; the answer must still be a plain
JSON error with the right status, in the OpenAI error shape, and no event stream.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import openai
import pytest

from .servers import N_CTX, ServerProcess, StartServer

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "Hello!"}]


def post_stream(
    client: httpx.Client, payload: dict[str, Any] | bytes, **headers: str
) -> tuple[httpx.Response, bytes]:
    """POST a streaming request and read the whole answer, whatever it is."""
    content = payload if isinstance(payload, bytes) else None
    json_body = None if isinstance(payload, bytes) else {**payload, "stream": True}
    all_headers = {"Content-Type": "application/json", **headers}
    with client.stream(
        "POST", CHAT, content=content, json=json_body, headers=all_headers
    ) as response:
        return response, response.read()


def assert_error(response: httpx.Response, body: bytes, status: int) -> dict[str, Any]:
    """``status`` with a JSON body ``{"error": {message, type, param, code}}``."""
    assert response.status_code == status, body[:2000]
    content_type = response.headers["content-type"]
    assert content_type.startswith("application/json"), content_type
    assert not body.startswith(b"data:"), body[:200]
    error = json.loads(body)["error"]
    assert isinstance(error, dict), error
    assert set(error) >= {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str), error
    assert error["message"].strip(), error
    assert isinstance(error["type"], str), error
    return error


def test_prompt_longer_than_the_context_is_a_400_before_streaming(
    http: httpx.Client,
) -> None:
    """The message names the context limit and the prompt's length."""
    too_long = "lighthouse " * (N_CTX + 500)
    response, body = post_stream(
        http, {"messages": [{"role": "user", "content": too_long}]}
    )
    error = assert_error(response, body, 400)

    numbers = [int(n) for n in re.findall(r"\d+", error["message"].replace(",", ""))]
    assert N_CTX in numbers, error
    assert any(n > N_CTX for n in numbers), f"no prompt length in {error}"


def test_sdk_raises_bad_request_for_a_prompt_longer_than_the_context(
    sdk: openai.OpenAI, model_id: str
) -> None:
    """Seen through the official client: an exception before any chunk."""
    too_long = "lighthouse " * (N_CTX + 500)
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(
            model=model_id,
            messages=[{"role": "user", "content": too_long}],
            stream=True,
        )
    assert caught.value.status_code == 400


@pytest.mark.parametrize(
    ("param", "value"),
    [("n", 0), ("max_tokens", -1), ("temperature", 5)],
)
def test_invalid_parameter_is_a_400_naming_it(
    http: httpx.Client, param: str, value: int
) -> None:
    """``n=0``, negative max_tokens and temperature 5 are rejected up front."""
    response, body = post_stream(http, {"messages": HELLO, param: value})
    error = assert_error(response, body, 400)

    assert error["param"] == param, error
    assert str(value) in error["message"], error


def test_invalid_json_is_a_400(http: httpx.Client) -> None:
    """A body that is not JSON never reaches the engine."""
    response, body = post_stream(http, b'{"messages": [{"role": "user", "content": ')
    assert_error(response, body, 400)


def test_unknown_model_is_a_404(http: httpx.Client, sdk: openai.OpenAI) -> None:
    """A model the server does not serve is not found."""
    response, body = post_stream(http, {"model": "no-such-model", "messages": HELLO})
    assert_error(response, body, 404)
    with pytest.raises(openai.NotFoundError):
        sdk.chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "Hello!"}]
        )


@pytest.fixture(scope="module")
def keyed_server(start_server: StartServer) -> ServerProcess:
    """A server that requires ``Authorization: Bearer sk-test`` (scripted engine)."""
    return start_server("keyed", "--engine", "scripted", "--api-key", "sk-test")


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer sk-wrong"}],
    ids=["missing", "wrong"],
)
def test_missing_or_wrong_api_key_is_a_401(
    keyed_server: ServerProcess, headers: dict[str, str]
) -> None:
    """With keys set, a request without the right key is refused first."""
    with httpx.Client(base_url=keyed_server.base_url, timeout=30) as client:
        response, body = post_stream(
            client, {"model": "default", "messages": HELLO}, **headers
        )
        assert_error(response, body, 401)
        ok, ok_body = post_stream(
            client,
            {"model": "default", "messages": HELLO, "max_tokens": 4},
            Authorization="Bearer sk-test",
        )
        assert ok.status_code == 200, ok_body


def test_sdk_raises_authentication_error_for_a_wrong_key(
    keyed_server: ServerProcess,
) -> None:
    """Seen through the official client: 401 is ``AuthenticationError``."""
    with (
        openai.OpenAI(
            base_url=f"{keyed_server.base_url}/v1", api_key="sk-wrong", max_retries=0
        ) as client,
        pytest.raises(openai.AuthenticationError),
    ):
        client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": "Hello!"}],
            stream=True,
        )
