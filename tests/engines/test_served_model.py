"""``served_model``: the one model a pool of upstreams lists, for ``--upstream``
without ``--upstream-model``."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable

import httpx
import pytest

from sluicegate.engines.upstream.file import served_model

A, B = "http://10.0.0.5:8000/v1", "http://10.0.0.6:8000/v1/"


def pool(answer: Callable[[httpx.Request], httpx.Response]) -> httpx.MockTransport:
    return httpx.MockTransport(answer)


def listing(*ids: str) -> httpx.Response:
    models = [{"id": i, "object": "model", "owned_by": "x"} for i in ids]
    return httpx.Response(200, json={"object": "list", "data": models})


def test_the_one_listed_model_is_served_under_its_name() -> None:
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(str(request.url))
        return listing("meta-llama/Llama-3.1-8B-Instruct")

    assert served_model([A], transport=pool(answer)) == (
        "meta-llama/Llama-3.1-8B-Instruct"
    )
    assert asked == [A + "/models"]


def test_the_next_upstream_is_asked_when_one_does_not_answer() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.host == "10.0.0.5":
            raise httpx.ConnectError("refused", request=request)
        assert request.url.path == "/v1/models"  # the trailing slash is dropped
        return listing("qwen")

    assert served_model([A, B], transport=pool(answer)) == "qwen"


def test_several_listed_models_are_named_and_refused() -> None:
    with pytest.raises(ValueError, match="lists 2 models") as raised:
        served_model([A], transport=pool(lambda _: listing("a", "b")))
    assert "'a', 'b'" in str(raised.value)
    assert "--upstream-model" in str(raised.value)


def test_an_empty_list_is_refused() -> None:
    with pytest.raises(ValueError, match=r"lists 0 models \(none\)"):
        served_model([A], transport=pool(lambda _: listing()))


@pytest.mark.parametrize(
    "response",
    [
        httpx.Response(401, json={"error": {"message": "no key"}}),
        httpx.Response(200, content=b"<html>"),
        httpx.Response(200, json={"models": []}),
        httpx.Response(200, json={"data": [{"name": "x"}]}),
    ],
    ids=["status", "not-json", "no-data", "no-id"],
)
def test_no_model_list_anywhere_says_why_for_each_upstream(
    response: httpx.Response,
) -> None:
    with pytest.raises(ValueError, match="could not ask") as raised:
        served_model([A, B], transport=pool(lambda _: response))
    message = str(raised.value)
    assert A + "/models" in message
    assert B.rstrip("/") + "/models" in message
    assert "--upstream-model" in message


def test_a_list_dripped_a_byte_a_second_is_cut_off_by_the_deadline() -> None:
    """A per-read timeout never fires on a drip; the one deadline does."""
    stop = threading.Event()

    def drip(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n" + b"x" * 100:
                if stop.wait(0.2):
                    return
                conn.sendall(bytes([byte]))

    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]

        def accept() -> None:
            with contextlib.suppress(OSError):
                drip(server.accept()[0])

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        started = time.monotonic()
        url = f"http://user:pw-secret@127.0.0.1:{port}/v1"
        try:
            with pytest.raises(ValueError, match="no model list within 1 s") as raised:
                served_model([url], timeout_s=1.0)
        finally:
            stop.set()
        elapsed = time.monotonic() - started
        thread.join(5)
    assert elapsed < 30  # the drip alone would take 28 s; measured ~1 s
    assert f"http://127.0.0.1:{port}/v1/models" in str(raised.value)
    assert "pw-secret" not in str(raised.value)


def test_failures_name_no_secret_and_quote_no_upstream_words() -> None:
    key = "sk-secret-key-123"

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(401, json={"error": {"message": f"bad key {key}"}})

    url = f"http://u:{key}@10.0.0.5:8000/v1?token={key}"
    with pytest.raises(ValueError, match="answered 401") as raised:
        served_model([url], transport=pool(answer))
    assert key not in str(raised.value)
    assert "http://10.0.0.5:8000/v1?[redacted]" in str(raised.value)


def test_a_redirect_is_not_followed() -> None:
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(str(request.url))
        return httpx.Response(307, headers={"location": "http://other/v1/models"})

    with pytest.raises(ValueError, match="answered 307"):
        served_model([A], transport=pool(answer))
    assert asked == [A + "/models"]


def test_a_base_without_v1_is_refused_with_the_base_to_pass() -> None:
    """A server's root has no ``/models`` (404): the refusal said only
    "answered 404"; it asks the base with ``/v1`` too and says to pass it,
    as ``sluicegate doctor --upstream`` does (one shared ``list_models``)."""
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(str(request.url))
        if request.url.path == "/v1/models":
            return listing("qwen")
        return httpx.Response(404)

    base = "http://10.0.0.5:8000"
    with pytest.raises(ValueError, match="could not ask") as raised:
        served_model([base], transport=pool(answer))
    assert (
        f"{base}/models: answered 404; {base}/v1/models lists 1 models: "
        f"use --upstream {base}/v1"
    ) in str(raised.value)
    assert "--upstream-model" not in str(raised.value)  # no discovery with it
    assert asked == [f"{base}/models", f"{base}/v1/models"]
    asked.clear()
    with pytest.raises(ValueError, match="answered 404") as raised:
        served_model([A], transport=pool(lambda _: httpx.Response(404)))
    assert "use --upstream" not in str(raised.value)  # it has /v1: no guess
    assert "pass --upstream-model NAME" in str(raised.value)
