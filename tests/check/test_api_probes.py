"""The Responses and Messages probes on recorded good and bad transcripts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
import pytest

from sluicegate.check import messages_probes as mp
from sluicegate.check import names
from sluicegate.check import responses_probes as rp
from sluicegate.check.probes import MESSAGES_PROBES, RESPONSES_PROBES, run_probes
from sluicegate.check.transcript import Transcript, dump_recording, load_recording
from sluicegate.check.verdicts import Verdict

SSE = {"content-type": "text/event-stream; charset=utf-8"}
USAGE = {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7}
START_USAGE = {
    "input_tokens": 5,
    "cache_creation_input_tokens": None,
    "cache_read_input_tokens": 0,
    "output_tokens": 0,
}


def sse(events: list[dict[str, Any]], numbered: bool = False) -> bytes:
    out = b""
    for i, e in enumerate(events):
        e = {**e, "sequence_number": i} if numbered else e
        out += b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n"
    return out


def stream(body: bytes, **request: Any) -> Transcript:
    return Transcript(request={"stream": True, **request}, headers=SSE, body=body)


def plain(obj: object, status: int = 200) -> Transcript:
    return Transcript(request={}, status=status, body=orjson.dumps(obj))


def responses_events(
    texts: list[str], end: str = "response.completed", **final: Any
) -> list[dict[str, Any]]:
    resp = {"id": "resp_1", "status": "in_progress"}
    last = {**resp, "status": "completed", "usage": USAGE, **final}
    return [
        {"type": "response.created", "response": resp},
        {"type": "response.in_progress", "response": resp},
        {"type": "response.output_item.added", "output_index": 0, "item": {}},
        {"type": "response.content_part.added", "output_index": 0, "part": {}},
        *({"type": "response.output_text.delta", "delta": t} for t in texts),
        {"type": "response.output_text.done", "text": "".join(texts)},
        {"type": "response.content_part.done", "output_index": 0},
        {"type": "response.output_item.done", "output_index": 0},
        {"type": end, "response": last},
    ]


def good_responses() -> dict[str, Transcript]:
    incomplete = {
        "status": "incomplete",
        "incomplete_details": {"reason": "max_output_tokens"},
    }
    text = {
        "output": [
            {"type": "message", "content": [{"type": "output_text", "text": "ab"}]}
        ]
    }
    error = {"error": {"message": "bad", "type": "invalid_request_error", "param": "t"}}
    return {
        rp.STREAM: stream(sse(responses_events(["a", "b"]), numbered=True)),
        rp.PLAIN: plain(text),
        rp.MAX: stream(
            sse(responses_events(["a"], "response.incomplete", **incomplete), True)
        ),
        rp.INVALID: plain(error, 400),
        rp.ECHO: echo(ECHO_SENT),
        names.RESPONSES_RESUMABLE: stream(sse(responses_events(["a"]), True)),
        names.RESPONSES_RESUME_PAST_END: plain({"error": {"code": "past"}}, 400),
    }


ECHO_SENT: dict[str, Any] = {
    "tools": [rp.ECHO_TOOL],
    "tool_choice": "none",
    "parallel_tool_calls": False,
    "metadata": {"probe": "echo"},
}


def echo(repeated: dict[str, Any], status: int = 200) -> Transcript:
    """The ``responses_echo`` exchange: ``ECHO_SENT`` asked, ``repeated`` in
    the answer's response object."""
    body = orjson.dumps({"object": "response", "status": "completed", **repeated})
    return Transcript(request=ECHO_SENT, status=status, body=body)


def messages_events(
    texts: list[str], reason: str = "end_turn", stop: str | None = None
) -> list[dict[str, Any]]:
    return [
        {
            "type": "message_start",
            "message": {"id": "msg_1", "usage": START_USAGE},
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
        {"type": "ping"},
        *(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": t},
            }
            for t in texts
        ),
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": stop},
            "usage": {"output_tokens": len(texts)},
        },
        {"type": "message_stop"},
    ]


def good_messages() -> dict[str, Transcript]:
    body = {"type": "message", "content": [{"type": "text", "text": "ab"}],
            "stop_reason": "end_turn"}  # fmt: skip
    error = {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "x"},
    }
    return {
        mp.STREAM: stream(sse(messages_events(["a", "b"]))),
        mp.PLAIN: plain(body),
        mp.STOP: stream(
            sse(messages_events(["a"], "stop_sequence", "zz")), stop_sequences=["zz"]
        ),
        mp.MAX: stream(sse(messages_events(["a"], "max_tokens"))),
        mp.INVALID: plain(error, 400),
        mp.STOPS: stream(
            sse(messages_events(["a"], "stop_sequence", "b")),
            stop_sequences=["zz", "b"],
        ),
        mp.STOPS_PLAIN: plain(
            {
                **body,
                "content": [{"type": "text", "text": "a"}],
                "stop_reason": "stop_sequence",
                "stop_sequence": "b",
            }
        ),
    }


def verdicts(recording: Mapping[str, Transcript], probes: Any) -> dict[str, Verdict]:
    return {r.probe: r.verdict for r in run_probes(recording, probes)}


@pytest.mark.parametrize(
    ("recording", "probes"),
    [(good_responses(), RESPONSES_PROBES), (good_messages(), MESSAGES_PROBES)],
)
def test_good_transcripts_pass_every_probe(
    recording: dict[str, Transcript], probes: Any
) -> None:
    again = load_recording(dump_recording(recording))
    got = verdicts(again, probes)
    # Nothing in them reasons: the reasoning probe has nothing to grade
    # (tests/check/test_reasoning_probes.py grades streams that reason).
    unseen = {k for k, v in got.items() if v is Verdict.NOT_OBSERVABLE}
    assert len(unseen) == 1
    assert unseen.pop().endswith("-reasoning-framing")
    assert {v for v in got.values() if v is not Verdict.NOT_OBSERVABLE} == {
        Verdict.PASS
    }


@pytest.mark.parametrize(
    ("recording", "probes"),
    [
        ({rp.STREAM: Transcript({}, "responses", 404), rp.PLAIN: plain({}, 404)},
         RESPONSES_PROBES),
        ({mp.STREAM: Transcript({}, "messages", 404)}, MESSAGES_PROBES),
        ({}, RESPONSES_PROBES + MESSAGES_PROBES),
    ],
)  # fmt: skip
def test_a_server_without_the_api_is_not_observable(
    recording: dict[str, Transcript], probes: Any
) -> None:
    assert set(verdicts(recording, probes).values()) == {Verdict.NOT_OBSERVABLE}


GR, GM = good_responses, good_messages
PART = "response.content_part.added"


def _resp_with(name: str, events: list[dict[str, Any]], numbered: bool = True) -> Any:
    return {**good_responses(), name: stream(sse(events, numbered))}


BAD_RESPONSES = [
    ("responses-content-type", {**good_responses(), rp.STREAM: Transcript(
        {"stream": True}, headers={"content-type": "application/json"})}),
    ("responses-event-order", _resp_with(rp.STREAM, responses_events(["a"])[1:])),
    ("responses-event-order", _resp_with(
        rp.STREAM, [*responses_events(["a"]), {"type": "response.completed"}])),
    ("responses-event-order", _resp_with(rp.STREAM, [
        e for e in responses_events(["a"]) if e["type"] != PART])),
    ("responses-event-order", {**GR(), rp.STREAM: stream(b"data: {}\n\n")}),
    ("responses-event-order", {**GR(), rp.STREAM: stream(b"event: x\ndata")}),
    ("responses-sequence-numbers",
     _resp_with(rp.STREAM, responses_events(["a"]), numbered=False)),
    ("responses-usage", _resp_with(
        rp.STREAM, responses_events(["a"], usage={**USAGE, "total_tokens": 9}))),
    ("responses-usage", _resp_with(rp.STREAM, responses_events(["a"], usage=None))),
    ("responses-matches-plain", _resp_with(rp.STREAM, responses_events(["a", "c"]))),
    ("responses-matches-plain", {**good_responses(), rp.PLAIN: plain([])}),
    ("responses-max-tokens", _resp_with(rp.MAX, responses_events(["a"]))),
    ("responses-rejects-invalid", {**good_responses(), rp.INVALID: stream(b"")}),
    ("responses-echo", {**GR(), rp.ECHO: echo(
        {**ECHO_SENT, "tool_choice": "auto", "parallel_tool_calls": True})}),
    ("responses-echo", {**GR(), rp.ECHO: echo({**ECHO_SENT, "tools": []})}),
    ("responses-echo", {**GR(), rp.ECHO: echo({**ECHO_SENT, "metadata": {}})}),
    ("responses-echo", {**GR(), rp.ECHO: echo(ECHO_SENT, 400)}),
]  # fmt: skip


def _msg_with(name: str, events: list[dict[str, Any]], **request: Any) -> Any:
    return {**good_messages(), name: stream(sse(events), **request)}


def _drop(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] != kind]


BAD_MESSAGES = [
    ("messages-content-type", {**good_messages(), mp.STREAM: Transcript(
        {"stream": True}, headers={})}),
    ("messages-event-order", _msg_with(mp.STREAM, messages_events(["a"])[1:])),
    ("messages-event-order", _msg_with(
        mp.STREAM, [*messages_events(["a"])[:-1], *messages_events(["a"])[-2:]])),
    ("messages-event-order", _msg_with(
        mp.STREAM, _drop(messages_events(["a"]), "content_block_start"))),
    ("messages-event-order", _msg_with(
        mp.STREAM, _drop(messages_events(["a"]), "content_block_stop"))),
    ("messages-usage", _msg_with(mp.STREAM, messages_events([]))),
    ("messages-usage", _msg_with(mp.STREAM, [
        {"type": "message_start", "message": {}}, *messages_events(["a"])[1:]])),
    ("messages-usage", _msg_with(mp.STREAM, [  # no cache counts
        {"type": "message_start", "message": {"usage": {"input_tokens": 5}}},
        *messages_events(["a"])[1:]])),
    ("messages-usage", _msg_with(mp.STREAM, [  # a gateway's zero
        {"type": "message_start", "message": {"usage": {**START_USAGE,
                                                        "input_tokens": 0}}},
        *messages_events(["a"])[1:]])),
    ("messages-usage", _msg_with(mp.STREAM, [  # the cache read said only at the end
        *messages_events(["a"])[:-2],
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
         "usage": {**START_USAGE, "cache_read_input_tokens": 4, "output_tokens": 1}},
        {"type": "message_stop"}])),
    ("messages-matches-plain", _msg_with(mp.STREAM, messages_events(["a"]))),
    ("messages-matches-plain", {**good_messages(), mp.PLAIN: plain({})}),
    ("messages-stop-sequence", _msg_with(
        mp.STOP, messages_events(["a"]), stop_sequences=["zz"])),
    ("messages-stop-sequence", _msg_with(
        mp.STOP, messages_events(["azz"], "stop_sequence", "zz"), stop_sequences=["zz"]
    )),
    ("messages-max-tokens", _msg_with(mp.MAX, messages_events(["a"]))),
    ("messages-rejects-invalid", {**GM(), mp.INVALID: plain({"error": {}}, 400)}),
]  # fmt: skip


@pytest.mark.parametrize(("probe", "recording"), BAD_RESPONSES + BAD_MESSAGES)
def test_bad_transcripts_fail_their_probe(
    probe: str, recording: dict[str, Transcript]
) -> None:
    assert (
        verdicts(recording, RESPONSES_PROBES + MESSAGES_PROBES)[probe] is Verdict.FAIL
    )


def test_no_answer_is_not_observable() -> None:
    recording = {mp.STREAM: Transcript({"stream": True}, status=None)}
    assert (
        verdicts(recording, MESSAGES_PROBES)["messages-usage"] is Verdict.NOT_OBSERVABLE
    )
