"""The fidelity probes on written good and bad transcripts: each one passes a
server that keeps its rule, fails one that breaks it, and is not-observable
where the server does not offer what it grades."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx
import orjson
import pytest

from sluicegate.check import fidelity, names
from sluicegate.check import messages_probes as mp
from sluicegate.check.probes import (
    MESSAGES_PROBES,
    PROBES,
    RESPONSES_PROBES,
    run_probes,
)
from sluicegate.check.record_events import record_responses
from sluicegate.check.record_fidelity import last_event_id
from sluicegate.check.transcript import Transcript, dump_recording, load_recording
from sluicegate.check.verdicts import Verdict
from sluicegate.client import Client

SSE = {"content-type": "text/event-stream"}


def chunk(text: str | None = None, usage: Any = None, **delta: Any) -> dict[str, Any]:
    if text is not None:
        delta["content"] = text
    choices = [] if text is None and not delta else [{"index": 0, "delta": delta}]
    return {"object": "chat.completion.chunk", "choices": choices, "usage": usage}


def sse(events: list[Any], ids: bool = False) -> bytes:
    out = b""
    for i, event in enumerate(events):
        data = event if isinstance(event, str) else orjson.dumps(event).decode()
        out += f"id: chatcmpl-1.{i}\n".encode() if ids else b""
        out += f"data: {data}\n\n".encode()
    return out


def stream(events: list[Any], ids: bool = False, **kw: Any) -> Transcript:
    return Transcript({"stream": True}, headers=SSE, body=sse(events, ids), **kw)


def usage(prompt: int, completion: int, cached: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cached is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    return out


def continuous(prompts: list[int]) -> Transcript:
    """A continuous-usage stream whose content chunks say ``prompts``."""
    texts = [
        chunk(t, usage(p, i + 1))
        for i, (t, p) in enumerate(zip("ab", prompts, strict=True))
    ]
    return stream([*texts, chunk(usage=usage(5, 2)), "[DONE]"])


def call(index: int, city: str) -> list[dict[str, Any]]:
    head = {"index": index, "id": f"call_{index}", "type": "function",
            "function": {"name": "get_weather", "arguments": ""}}  # fmt: skip
    arguments = {"index": index, "function": {"arguments": f'{{"city":"{city}"}}'}}
    return [chunk(tool_calls=[head]), chunk(tool_calls=[arguments])]


def calls(*cities: str) -> Transcript:
    made = [c for i, city in enumerate(cities) for c in call(i, city)]
    return stream([*made, chunk(usage=usage(9, 20)), "[DONE]"])


def cached(plain_cached: int | None, stream_cached: int | None) -> dict[str, Any]:
    body = {
        "choices": [{"message": {"content": "One"}}],
        "usage": usage(20, 1, plain_cached),
    }
    plain = Transcript({}, body=orjson.dumps(body))
    streamed = stream(
        [chunk("One"), chunk(usage=usage(20, 1, stream_cached)), "[DONE]"]
    )
    return {names.CACHED_PLAIN: plain, names.CACHED_STREAM: streamed}


def resumed(status: int, body: bytes = b"") -> dict[str, Any]:
    ended = stream([chunk("One"), chunk(usage=usage(5, 1)), "[DONE]"], ids=True)
    cursor = last_event_id(ended.body)
    assert cursor == "chatcmpl-1.2"
    resume = Transcript({"last_event_id": cursor}, "chat/completions/x/events",
                        status, SSE, body)  # fmt: skip
    return {names.RESUMABLE: ended, names.RESUME_PAST_END: resume}


GOOD: dict[str, Transcript] = {
    names.CONTINUOUS: continuous([5, 5]),
    names.TOOLS_SERIAL: calls("Paris"),
    names.SLOW_PREFILL: stream([chunk("OK"), "[DONE]"], head_s=0.05, ttft_s=3.0),
    **cached(16, 16),
    **resumed(400, b'{"error": {"code": "cursor_past_end"}}'),
}
PROBE = {
    "continuous-usage": fidelity.continuous_usage,
    "parallel-tool-calls": fidelity.parallel_tool_calls,
    "time-to-headers": fidelity.time_to_headers,
    "cached-tokens": fidelity.cached_tokens,
    "resume-past-end": fidelity.resume_past_end,
}


def verdict(probe: str, recording: Mapping[str, Transcript]) -> Verdict:
    return PROBE[probe](recording).verdict


def test_a_server_that_keeps_every_rule_passes_every_fidelity_probe() -> None:
    again = load_recording(dump_recording(GOOD))  # head_s survives a save
    assert again[names.SLOW_PREFILL].head_s == 0.05
    got = {r.probe: r.verdict for r in run_probes(again, PROBES) if r.probe in PROBE}
    assert got == dict.fromkeys(PROBE, Verdict.PASS)


def _with(**exchanges: Transcript) -> dict[str, Transcript]:
    return {**GOOD, **exchanges}


FAILING = [
    # a gateway that knows the prompt only at the end: 0 until the last chunk
    ("continuous-usage", _with(continuous_usage=continuous([0, 0]))),
    ("continuous-usage", _with(continuous_usage=continuous([5, 7]))),
    ("continuous-usage", _with(continuous_usage=stream([
        chunk("a", usage(5, 2)), chunk("b", usage(5, 1)),
        chunk(usage=usage(5, 2)), "[DONE]"]))),
    ("continuous-usage", _with(continuous_usage=stream([chunk("a"), "[DONE]"]))),
    # an upstream that ignored the flag, passed through as it came
    ("parallel-tool-calls", _with(tools_serial=calls("Paris", "Oslo"))),
    # a head held until the first content
    ("time-to-headers", _with(slow_prefill=stream(
        [chunk("OK"), "[DONE]"], head_s=2.99, ttft_s=3.0))),
    ("time-to-headers", _with(slow_prefill=Transcript(
        {"stream": True}, status=502, body=b"{}"))),
    # the streamed path drops what the whole answer says
    ("cached-tokens", _with(**cached(16, None))),
    ("cached-tokens", _with(**cached(16, 0))),
    ("cached-tokens", _with(**cached(None, 16))),
    ("cached-tokens", _with(**cached(21, 21))),  # more than the prompt
    # an empty 200: an EventSource reconnects to it for ever
    ("resume-past-end", _with(**resumed(200))),
    ("resume-past-end", _with(**resumed(200, b": keep-alive\n\n"))),
]  # fmt: skip


@pytest.mark.parametrize(("probe", "recording"), FAILING)
def test_a_server_that_breaks_the_rule_fails_its_probe(
    probe: str, recording: dict[str, Transcript]
) -> None:
    assert verdict(probe, recording) is Verdict.FAIL


NOT_OFFERED = [
    # usage only on the last chunk: the extension is off
    ("continuous-usage", _with(continuous_usage=stream([
        chunk("a"), chunk("b"), chunk(usage=usage(5, 2)), "[DONE]"]))),
    ("continuous-usage", _with(continuous_usage=Transcript(
        {"stream": True}, status=400, body=b"{}"))),
    ("parallel-tool-calls", _with(tools_serial=Transcript(
        {"stream": True}, status=400, body=b"{}"))),
    ("time-to-headers", _with(slow_prefill=stream(
        [chunk("OK"), "[DONE]"], head_s=0.5, ttft_s=0.5))),
    ("cached-tokens", _with(**cached(None, None))),
    ("cached-tokens", _with(**cached(0, 0))),
    ("resume-past-end", {names.RESUMABLE: GOOD[names.RESUMABLE]}),
    ("resume-past-end", {}),
]  # fmt: skip


@pytest.mark.parametrize(("probe", "recording"), NOT_OFFERED)
def test_what_a_server_does_not_offer_is_not_observable(
    probe: str, recording: dict[str, Transcript]
) -> None:
    assert verdict(probe, recording) is Verdict.NOT_OBSERVABLE


def test_a_terminal_event_after_a_200_resume_is_a_pass() -> None:
    recording = _with(**resumed(200, b"data: [DONE]\n\n"))
    assert verdict("resume-past-end", recording) is Verdict.PASS


# -- responses-resume-past-end ---------------------------------------------------


def responses_events(*kinds: str, first: int = 0) -> bytes:
    out = b""
    for n, kind in enumerate(kinds, first):
        event: dict[str, Any] = {"type": kind, "sequence_number": n}
        if kind == "response.created":
            event["response"] = {"id": "resp_1", "status": "in_progress"}
        out += f"id: resp_1.{n}\nevent: {kind}\n".encode()
        out += b"data: " + orjson.dumps(event) + b"\n\n"
    return out


STORED = Transcript(
    {"stream": True, "store": True}, "responses", 200, SSE,
    responses_events("response.created", "response.output_text.delta",
                     "response.completed"),
)  # fmt: skip


def responses_resumed(status: int | None, body: bytes = b"") -> dict[str, Transcript]:
    resume = Transcript({"stream": "true", "starting_after": "2"},
                        "responses/resp_1", status, SSE, body)  # fmt: skip
    return {
        names.RESPONSES_RESUMABLE: STORED,
        names.RESPONSES_RESUME_PAST_END: resume,
    }


@pytest.mark.parametrize(
    ("recording", "expected"),
    [
        (responses_resumed(400, b'{"error": {"code": "cursor_past_end"}}'), "pass"),
        (responses_resumed(200, responses_events("response.completed", first=2)),
         "pass"),
        (responses_resumed(200, responses_events("error", first=3)), "pass"),
        # an empty 200, or one with heartbeats only: reconnected to for ever
        (responses_resumed(200), "fail"),
        (responses_resumed(200, b": keep-alive\n\n"), "fail"),
        (responses_resumed(200, responses_events("response.output_text.delta")),
         "fail"),
        (responses_resumed(200, b"data: [DONE]\n\n"), "fail"),  # chat's, not this
        (responses_resumed(None), "not-observable"),
        ({names.RESPONSES_RESUMABLE: STORED}, "not-observable"),
        ({names.RESPONSES_RESUMABLE: Transcript(
            {"stream": True, "store": True}, "responses", 400, body=b"{}")},
         "not-observable"),  # store declined
        ({}, "not-observable"),
    ],
)  # fmt: skip
def test_responses_resume_past_end_grades_the_answer_after_the_last_event(
    recording: dict[str, Transcript], expected: str
) -> None:
    got = {r.probe: r.verdict for r in run_probes(recording, RESPONSES_PROBES)}
    assert got["responses-resume-past-end"] == expected


def _stored_server(resume: httpx.Response) -> httpx.MockTransport:
    """A Responses server that stores and streams, and answers the resume
    with ``resume``; every other request is a 400."""
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.method == "GET":
            return resume
        body = orjson.loads(request.content)
        if body.get("store") and body.get("stream"):
            return httpx.Response(200, headers=SSE, content=STORED.body)
        return httpx.Response(400, json={"error": {"message": "no"}})

    transport = httpx.MockTransport(answer)
    transport.seen = seen  # type: ignore[attr-defined]
    return transport


@pytest.mark.parametrize(
    ("resume", "expected"),
    [
        (httpx.Response(200, headers=SSE, content=b""), Verdict.FAIL),
        (httpx.Response(400, json={"error": {"code": "cursor_past_end"}}),
         Verdict.PASS),
    ],
)  # fmt: skip
def test_check_resumes_a_stored_response_after_its_last_event(
    resume: httpx.Response, expected: Verdict
) -> None:
    transport = _stored_server(resume)
    with Client("http://server", transport=transport) as client:
        recording = record_responses(client, "m")
    got = {r.probe: r.verdict for r in run_probes(recording, RESPONSES_PROBES)}
    assert got["responses-resume-past-end"] is expected
    get = transport.seen[-1]  # type: ignore[attr-defined]
    assert get.method == "GET"
    assert get.url.path == "/v1/responses/resp_1"
    assert dict(get.url.params) == {"stream": "true", "starting_after": "2"}


# -- messages-stop-sequences ------------------------------------------------------

STOPS = ["\u00a7never\u00a7", "four", "two"]
"""``two`` is met first in the reference, though given last."""
REFERENCE = "one, two, three, four"


def message(text: str, reason: str, stop: str | None) -> bytes:
    return orjson.dumps({"type": "message", "content": [{"type": "text", "text": text}],
                         "stop_reason": reason, "stop_sequence": stop})  # fmt: skip


def message_stream(text: str, reason: str, stop: str | None) -> bytes:
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {"id": "msg_1"}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "text_delta", "text": text}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": reason,
                                            "stop_sequence": stop}},
        {"type": "message_stop"},
    ]  # fmt: skip
    return b"".join(
        b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n"
        for e in events
    )


def stops(
    streamed: tuple[str, str, str | None], plain: tuple[str, str, str | None]
) -> dict[str, Transcript]:
    asked = {"stop_sequences": STOPS}
    return {
        mp.PLAIN: Transcript({}, "messages", body=message(REFERENCE, "end_turn", None)),
        mp.STOPS: Transcript({**asked, "stream": True}, "messages", headers=SSE,
                             body=message_stream(*streamed)),
        mp.STOPS_PLAIN: Transcript(asked, "messages", body=message(*plain)),
    }  # fmt: skip


MET = ("one, ", "stop_sequence", "two")


def stops_verdict(recording: dict[str, Transcript]) -> Verdict:
    got = {r.probe: r.verdict for r in run_probes(recording, MESSAGES_PROBES)}
    return got["messages-stop-sequences"]


def test_naming_the_stop_met_first_streamed_and_not_passes() -> None:
    assert stops_verdict(stops(MET, MET)) is Verdict.PASS


@pytest.mark.parametrize(
    ("streamed", "plain"),
    [
        (("one, ", "end_turn", None), MET),  # lost when the upstream stopped
        (MET, ("one, ", "end_turn", None)),
        (("one, ", "stop_sequence", "\u00a7never\u00a7"), MET),  # the first given
        (MET, ("one, two", "stop_sequence", "two")),  # the stop left in
    ],
)
def test_a_lost_or_wrong_stop_sequence_fails(
    streamed: tuple[str, str, str | None], plain: tuple[str, str, str | None]
) -> None:
    assert stops_verdict(stops(streamed, plain)) is Verdict.FAIL


def test_stops_that_never_occur_are_not_observable() -> None:
    recording = stops(MET, MET)
    recording[mp.PLAIN] = Transcript(
        {}, "messages", body=message("zzz", "end_turn", None)
    )
    assert stops_verdict(recording) is Verdict.NOT_OBSERVABLE
