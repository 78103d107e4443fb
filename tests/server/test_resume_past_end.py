"""A resume past the end of an ended stream, alike in every API (scripted engine).

A browser's ``EventSource`` reconnects whenever its stream closes, with the last
``id:`` it saw, and stops only on a status other than 200 (WHATWG HTML, "9.2.3
Processing model"). So once a stream has ended, a resume after its last event
is answered 400 ``cursor_past_end`` by chat, completions and Responses, naming
the parameter the cursor came from; the header wins over the URL's cursor in
each (a reconnect resends the URL it opened). A Messages stream is not
resumable: it carries no ``id:`` for a reader to resend, and the URLs a reader
would resume at are not a 200.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from sluicegate.core.wire.sse import SSEDecoder
from sluicegate.engines.scripted.engine import ScriptedEngine
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig

pytestmark = pytest.mark.anyio

HELLO = [{"role": "user", "content": "Hi"}]


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    """An app whose streams are resumable and whose responses are stored
    unless a request says otherwise."""
    config = ServerConfig(resumable_streams=True, store_responses=True)
    app = create_app(ScriptedEngine(tokens_per_s=5000), config)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        yield client


def _ids(body: bytes) -> list[str]:
    decoder = SSEDecoder()
    return [e.id for e in decoder.feed(body) + decoder.flush() if e.id is not None]


def _refused(answer: httpx.Response, param: str) -> None:
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == ("cursor_past_end", param)


@pytest.mark.parametrize(
    ("path", "prompt"),
    [
        ("/v1/chat/completions", {"messages": HELLO}),
        ("/v1/completions", {"prompt": "Hi"}),
    ],
)
async def test_chat_and_completions_refuse_a_cursor_past_the_end(
    client: httpx.AsyncClient, path: str, prompt: dict[str, Any]
) -> None:
    body = {"model": "scripted", **prompt, "max_tokens": 4, "stream": True}
    ids = _ids((await client.post(path, json=body)).content)
    response_id, last = ids[-1].split(".")
    assert ids == [f"{response_id}.{n}" for n in range(int(last) + 1)]
    events = f"{path}/{response_id}/events"
    for cursor in (ids[-1], f"{response_id}.{int(last) + 5}"):
        _refused(
            await client.get(events, headers={"last-event-id": cursor}), "Last-Event-ID"
        )
        _refused(await client.get(events, params={"after": cursor}), "after")
        reconnect = await client.get(
            events, params={"after": "0"}, headers={"last-event-id": cursor}
        )
        _refused(reconnect, "Last-Event-ID")
    before = await client.get(
        events, params={"after": f"{response_id}.{int(last) - 1}"}
    )
    assert before.status_code == 200
    assert _ids(before.content) == ids[-1:]


async def test_a_stored_response_refuses_a_sequence_number_past_the_end(
    client: httpx.AsyncClient,
) -> None:
    body = {"model": "scripted", "input": "Hi", "max_output_tokens": 4, "stream": True}
    ids = _ids((await client.post("/v1/responses", json=body)).content)
    response_id, last = ids[-1].split(".")
    one = f"/v1/responses/{response_id}"
    for after in (int(last), int(last) + 5):
        query = {"stream": "true", "starting_after": str(after)}
        _refused(await client.get(one, params=query), "starting_after")
        # An EventSource reconnects to the URL it opened, starting_after and
        # all, with the last id it read: the header wins.
        header = {"last-event-id": f"{response_id}.{after}"}
        query = {"stream": "true", "starting_after": "0"}
        _refused(await client.get(one, params=query, headers=header), "Last-Event-ID")
    query = {"stream": "true", "starting_after": str(int(last) - 1)}
    before = await client.get(one, params=query)
    assert before.status_code == 200
    assert _ids(before.content) == ids[-1:]


async def test_a_messages_stream_has_no_cursor_and_no_resume_answers_200(
    client: httpx.AsyncClient,
) -> None:
    body = {"model": "scripted", "messages": HELLO, "max_tokens": 4, "stream": True}
    answer = await client.post("/v1/messages", json=body)
    assert answer.status_code == 200
    assert b"event: message_stop" in answer.content
    assert _ids(answer.content) == []  # nothing an EventSource would resend
    decoder = SSEDecoder()
    first = decoder.feed(answer.content)[0].data
    message_id = first.split('"id":"', 1)[1].split('"', 1)[0]
    again = await client.get("/v1/messages", headers={"last-event-id": "0"})
    assert again.status_code == 405
    for path in (f"/v1/messages/{message_id}", f"/v1/messages/{message_id}/events"):
        assert (await client.get(path)).status_code == 404
