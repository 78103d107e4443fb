"""``served_model``: the one model a pool of upstreams lists, for ``--upstream``
without ``--upstream-model``."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from sluicegate.engines.upstream_file import served_model

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
