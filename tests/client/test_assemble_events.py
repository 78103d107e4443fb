"""``EventStreamAssembler``: Responses and Messages streams to end states."""

from __future__ import annotations

import httpx
import orjson
import pytest

from sluicegate.client import AsyncClient
from sluicegate.client.assemble_events import EventApi, EventStreamAssembler
from sluicegate.client.results import StreamResult
from sluicegate.core.endstate import EndState
from sluicegate.core.events import Delta, DeltaParts, End, Finish, FinishReason, Usage
from sluicegate.core.wire.chunks import Endpoint, ResponseHeader
from sluicegate.core.wire.contracts import stream_machine
from tests.check.test_api_probes import messages_events, responses_events, sse

SSE = {"Content-Type": "text/event-stream"}


def run(
    api: EventApi, body: bytes, status: int = 200, gone: bool = False, step: int = 7
) -> tuple[EventStreamAssembler, list[str], StreamResult]:
    a = EventStreamAssembler(api)
    a.head(status, SSE, 0.1)
    texts = []
    for i in range(0, len(body), step):  # split events across reads
        texts += [d.text for d in a.feed(body[i : i + step], 0.2)]
    return a, texts, a.flush(0.3, client_gone=gone)


@pytest.mark.parametrize(
    ("api", "body", "finish"),
    [
        ("responses", sse(responses_events(["a", "b"]), True), "stop"),
        ("messages", sse(messages_events(["a", "b"])), "end_turn"),
        (
            "responses",
            sse(responses_events(["a", "b"], "response.incomplete",
                incomplete_details={"reason": "max_output_tokens"})),
            "max_output_tokens",
        ),
    ],
)  # fmt: skip
def test_a_whole_stream_is_finished(api: EventApi, body: bytes, finish: str) -> None:
    _, texts, result = run(api, body)
    assert texts == ["a", "b"]
    assert result.end_state is EndState.FINISHED
    assert result.text == "ab"
    assert result.finish_reason == finish
    assert result.usage is not None
    assert result.timing.first_token_s == 0.2


@pytest.mark.parametrize(
    ("api", "body", "gone", "state"),
    [
        ("responses", sse(responses_events(["a"])[:-1]), False, EndState.TRUNCATED),
        ("messages", sse(messages_events(["a"])[:-1]), True, EndState.ABORTED),
        ("messages", sse([*messages_events(["a"])[:2],
            {"type": "error", "error": {"type": "overloaded_error", "message": "x"}}]),
            False, EndState.ERRORED),
        ("messages", sse([{"type": "error", "error": "x"}]), False, EndState.ERRORED),
        ("responses", sse(responses_events(["a"], "response.failed",
            error={"code": "server_error", "message": "x"})), False, EndState.ERRORED),
        ("responses", sse(responses_events(["a"], "response.failed")),
            False, EndState.ERRORED),
        ("responses", sse(responses_events(["a"])) + b"data: {}\n\n",
            False, EndState.TRUNCATED),
        ("messages", b"event: ping\ndata: [x\n\n", False, EndState.TRUNCATED),
        ("messages", b"data: \xff\n\n", False, EndState.TRUNCATED),
    ],
)  # fmt: skip
def test_broken_streams(
    api: EventApi, body: bytes, gone: bool, state: EndState
) -> None:
    _, _, result = run(api, body, gone=gone)
    assert result.end_state is state
    if state is EndState.ERRORED:
        assert result.error


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (orjson.dumps({"type": "error", "error": {"message": "bad"}}), "bad"),
        (b"not json", "not json"),
    ],
)
def test_a_rejection_keeps_its_error(body: bytes, message: str) -> None:
    _, texts, result = run("messages", body, status=400)
    assert texts == []
    assert result.end_state is EndState.REJECTED
    assert result.error == {"message": message}


@pytest.mark.anyio
async def test_the_async_client_streams_both_apis() -> None:
    bodies = {
        "/v1/responses": sse(responses_events(["a", "b"]), True),
        "/v1/messages": sse(messages_events(["a", "b"])),
    }
    sent: list[dict[str, object]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(orjson.loads(request.content))
        return httpx.Response(200, headers=SSE, content=bodies[request.url.path])

    transport = httpx.MockTransport(answer)
    async with AsyncClient("http://test", transport=transport) as client:
        async with client.astream_responses("hi", model="m", record=True) as stream:
            responses = await stream.aresult()
        hi = [{"role": "user", "content": "hi"}]
        async with client.astream_messages(hi, model="m", max_tokens=3) as stream:
            messages = await stream.aresult()
    assert (responses.text, messages.text) == ("ab", "ab")
    assert responses.raw == bodies["/v1/responses"]
    assert [s["stream"] for s in sent] == [True, True]
    assert sent[1]["max_tokens"] == 3


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_reasoning_is_assembled_apart_from_the_text(api: EventApi) -> None:
    endpoint = Endpoint.RESPONSES if api == "responses" else Endpoint.MESSAGES
    header = ResponseHeader("resp_1", 1, "m", endpoint, prompt_tokens=3)
    machine = stream_machine(header)
    frames = machine.start()
    for event in (
        Delta(0, "", parts=DeltaParts(reasoning="plan")),
        Delta(0, "", parts=DeltaParts(reasoning=": 4")),
        Delta(0, "Four."),
        Finish(0, FinishReason.STOP),
        End(Usage(3, 5, reasoning_tokens=2)),
    ):
        frames += machine.feed(event)
    a = EventStreamAssembler(api)
    a.head(200, SSE, 0.1)
    deltas = a.feed(b"".join(frames), 0.2)
    result = a.flush(0.3)
    assert [(d.text, d.reasoning) for d in deltas] == [
        ("", "plan"),
        ("", ": 4"),
        ("Four.", ""),
    ]
    assert result.choices[0].reasoning == "plan: 4"
    assert result.text == "Four."
    assert result.usage is not None
    # Messages has no reasoning count of its own.
    expected = 2 if api == "responses" else None
    assert result.usage.reasoning_tokens == expected
