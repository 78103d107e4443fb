"""UpstreamReader: an upstream's quirky OpenAI event stream in, plain items out."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.core.errors import LocalProtocolError
from sluicegate.core.events import FinishReason, Usage
from sluicegate.core.upstream.items import (
    PROTOCOL_ERROR_CODE,
    ReaderState,
    UpstreamDelta,
    UpstreamDone,
    UpstreamError,
    UpstreamFinish,
    UpstreamItem,
    UpstreamReasoning,
    UpstreamTruncated,
    UpstreamUsageRejected,
)
from sluicegate.core.upstream.reader import UpstreamReader
from sluicegate.core.wire.chunks import Endpoint

CHAT = Endpoint.CHAT


def event(obj: object, *, name: str | None = None, end: str = "\n") -> bytes:
    head = f"event: {name}{end}" if name else ""
    body = obj if isinstance(obj, str) else orjson.dumps(obj).decode()
    return f"{head}data: {body}{end}{end}".encode()


def chat(
    text: str | None = None,
    finish: str | None = None,
    *,
    index: int = 0,
    usage: dict[str, int] | None = None,
    role: bool = False,
) -> dict[str, object]:
    delta: dict[str, object] = {}
    if role:
        delta["role"] = "assistant"
    if text is not None:
        delta["content"] = text
    chunk: dict[str, object] = {
        "object": "chat.completion.chunk",
        "choices": [{"index": index, "delta": delta, "finish_reason": finish}],
    }
    if usage is not None:
        chunk["usage"] = usage
    return chunk


def usage_chunk(prompt: int, completion: int) -> dict[str, object]:
    return {
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


def read_all(body: bytes, endpoint: Endpoint = CHAT) -> list[UpstreamItem]:
    reader = UpstreamReader(endpoint)
    return reader.feed(body) + reader.flush()


def read_split(parts: list[bytes], endpoint: Endpoint = CHAT) -> list[UpstreamItem]:
    reader = UpstreamReader(endpoint)
    items: list[UpstreamItem] = []
    for part in parts:
        items += reader.feed(part)
    return items + reader.flush()


def text_of(items: list[UpstreamItem], index: int = 0) -> str:
    return "".join(
        i.text for i in items if isinstance(i, UpstreamDelta) and i.index == index
    )


DONE = b"data: [DONE]\n\n"
PLAIN = (
    event(chat("", role=True))
    + event(chat("Hel"))
    + event(chat("lo"))
    + event(chat(None, "stop"))
    + event(usage_chunk(5, 2))
    + DONE
)


def test_a_plain_stream_gives_text_finish_usage_done() -> None:
    assert read_all(PLAIN) == [
        UpstreamDelta(0, "Hel"),
        UpstreamDelta(0, "lo"),
        UpstreamFinish(0, FinishReason.STOP, "stop"),
        Usage(5, 2),
        UpstreamDone(),
    ]


def test_every_split_of_a_plain_stream_gives_the_same_items() -> None:
    whole = read_all(PLAIN)
    for cut in range(len(PLAIN) + 1):
        assert read_split([PLAIN[:cut], PLAIN[cut:]]) == whole
    assert read_split([PLAIN[i : i + 1] for i in range(len(PLAIN))]) == whole


def state_of(reader: UpstreamReader) -> ReaderState:
    return reader.state  # a call: mypy does not narrow it from earlier asserts


def test_state_and_counters() -> None:
    reader = UpstreamReader(CHAT)
    assert reader.state is ReaderState.READING
    assert UpstreamReader(CHAT).usage is None
    reader.feed(b": keep-alive\n\n" + event(chat("a", usage={"prompt_tokens": 3})))
    assert reader.comments == 1
    assert reader.events == 1
    assert reader.usage == Usage(3, 0)
    reader.feed(DONE)
    assert state_of(reader) is ReaderState.DONE
    assert reader.feed(DONE + b"data: junk\n\n") == []
    assert reader.flush() == []
    assert state_of(reader) is ReaderState.CLOSED
    with pytest.raises(LocalProtocolError):
        reader.feed(b"")
    with pytest.raises(LocalProtocolError):
        reader.flush()


def test_completions_read_the_text_field() -> None:
    body = (
        event({"choices": [{"index": 0, "text": "one", "finish_reason": None}]})
        + event({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
        + DONE
    )
    assert read_all(body, Endpoint.COMPLETION) == [
        UpstreamDelta(0, "one"),
        UpstreamFinish(0, FinishReason.LENGTH, "length"),
        UpstreamDone(),
    ]


def test_continuous_usage_is_reported_only_when_it_changes() -> None:
    def u(c: int) -> dict[str, int]:
        return {"prompt_tokens": 4, "completion_tokens": c, "total_tokens": 4 + c}

    body = (
        event(chat("", role=True, usage=u(0)))
        + event(chat("a", usage=u(1)))
        + event(chat(None, "stop", usage=u(1)))
        + event(usage_chunk(4, 1))
        + DONE
    )
    assert read_all(body) == [
        Usage(4, 0),
        Usage(4, 1),  # before the delta it counts: the prompt is known first
        UpstreamDelta(0, "a"),
        UpstreamFinish(0, FinishReason.STOP, "stop"),
        UpstreamDone(),
    ]


@pytest.mark.parametrize(
    ("details", "cached"),
    [
        ({"cached_tokens": 3}, 3),
        ({"cached_tokens": 4}, 4),
        ({"cached_tokens": 5}, 0),  # more than the prompt: not true
        ({"cached_tokens": -1}, 0),
        ({"cached_tokens": 1.0}, 0),
        ({}, 0),
        (None, 0),
    ],
)
def test_cached_prompt_tokens_come_from_prompt_tokens_details(
    details: object, cached: int
) -> None:
    usage = {
        "prompt_tokens": 4,
        "completion_tokens": 1,
        "prompt_tokens_details": details,
    }
    body = event({**chat("a"), "usage": usage}) + DONE
    assert read_all(body)[0] == Usage(4, 1, cached_tokens=cached)


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": "4", "completion_tokens": 1},
        {"prompt_tokens": 4, "completion_tokens": 1.5},
        {"prompt_tokens": -1, "completion_tokens": 1},
        {"prompt_tokens": 1, "completion_tokens": -1},
        {"prompt_tokens": 1 << 63, "completion_tokens": 1},
        {"prompt_tokens": 1, "completion_tokens": True},
    ],
)
def test_a_usage_that_cannot_be_read_is_rejected(usage: dict[str, object]) -> None:
    body = event({"choices": [], "usage": usage}) + DONE
    items = read_all(body)
    assert len(items) == 2
    assert type(items[0]) is UpstreamUsageRejected
    assert "is not a token count" in items[0].reason
    assert items[1] == UpstreamDone()


def test_quirks_never_reach_the_items() -> None:
    body = (
        b"\xef\xbb\xbf: keep-alive\r\n\r\n"
        + event(chat("", role=True), end="\r\n")
        + event(chat("a", ""), name="message", end="\r")
        + event(chat(None))
        + event({"choices": [{"index": 0, "delta": None}]})
        + event({"choices": [{"index": 0, "delta": {"content": None}}]})
        + event({"choices": ["junk", {"delta": {"content": "b"}}]})
        + event({"choices": [{"index": -3, "delta": {"content": "c"}}]})
        + event({"id": "x", "object": "chat.completion.chunk"})
        + event(chat(None, "stop"))
        + event(chat(None, "stop"))
        + event(chat("late", None))
        + event(usage_chunk(1, 3))
        + DONE
        + DONE
        + event(chat("after"))
    )
    assert read_all(body) == [
        UpstreamDelta(0, "a"),
        UpstreamDelta(0, "b"),
        UpstreamDelta(0, "c"),
        UpstreamFinish(0, FinishReason.STOP, "stop"),
        Usage(1, 3),
        UpstreamDone(),
    ]


def test_other_finish_reasons_are_stop_and_keep_their_word() -> None:
    body = event(chat("x", "tool_calls")) + DONE
    assert read_all(body)[1] == UpstreamFinish(0, FinishReason.STOP, "tool_calls")
    body = event(chat("x", "max_tokens")) + DONE
    assert read_all(body)[1] == UpstreamFinish(0, FinishReason.LENGTH, "max_tokens")


@pytest.mark.parametrize(
    ("fields", "matched"),
    [
        ({"stop_reason": "\n\n"}, "\n\n"),  # vLLM: the stop string
        ({"matched_stop": "END"}, "END"),  # SGLang
        ({"stop_reason": 106}, None),  # a stop token's id
        ({"stop_reason": None, "matched_stop": None}, None),  # end of sequence
        ({"stop_reason": ""}, None),
        ({"stop_reason": "x" * 5000}, None),  # past MAX_MATCHED_STOP_CHARS
        ({}, None),
    ],
)
def test_a_finish_names_the_stop_string_the_upstream_matched(
    fields: dict[str, object], matched: str | None
) -> None:
    chunk = chat("x", "stop")
    choices = chunk["choices"]
    assert isinstance(choices, list)
    choices[0].update(fields)
    assert read_all(event(chunk) + DONE)[1] == UpstreamFinish(
        0, FinishReason.STOP, "stop", matched
    )


@pytest.mark.parametrize("reason", ["abort", "error"])
def test_an_aborted_finish_is_an_error(reason: str) -> None:
    items = read_all(event(chat("x", reason)) + event(chat("y")) + DONE)
    assert items[0] == UpstreamDelta(0, "x")
    assert isinstance(items[1], UpstreamError)
    assert reason in items[1].message
    assert len(items) == 2


def test_choices_are_kept_apart() -> None:
    body = (
        event(chat("a", index=0))
        + event(chat("b", index=1))
        + event(chat("c", "stop", index=1))
        + event(chat(None, "length", index=0))
        + DONE
    )
    items = read_all(body)
    assert text_of(items, 0) == "a"
    assert text_of(items, 1) == "bc"
    assert items[-1] == UpstreamDone()


CUMULATIVE = ["Hel", "Hello", "Hello, wor", "Hello, world", "Hello, world!"]


def test_cumulative_text_gives_only_the_new_suffix() -> None:
    body = b"".join(event(chat(t)) for t in CUMULATIVE)
    items = read_all(body + event(chat(None, "stop")) + DONE)
    assert text_of(items) == "Hello, world!"
    deltas = [i.text for i in items if isinstance(i, UpstreamDelta)]
    assert deltas == ["Hel", "lo, wor", "ld", "!"]


def test_a_cumulative_stream_that_repeats_itself_sends_nothing_new() -> None:
    texts = ["ab", "abc", "abc", "abcd"]
    body = b"".join(event(chat(t)) for t in texts) + DONE
    assert text_of(read_all(body)) == "abcd"


def test_a_cumulative_text_that_does_not_extend_is_sent_whole() -> None:
    texts = ["ab", "abc", "abcd", "xy"]
    body = b"".join(event(chat(t)) for t in texts) + DONE
    assert text_of(read_all(body)) == "abcdxy"


def test_a_plain_text_that_looks_cumulative_once_is_sent_whole() -> None:
    texts = ["=", "==", " x", "=="]
    body = b"".join(event(chat(t)) for t in texts) + DONE
    items = read_all(body)
    assert text_of(items) == "=== x=="
    assert [i.text for i in items if isinstance(i, UpstreamDelta)] == [
        "=",
        "== x",
        "==",
    ]


def test_a_plain_stream_is_never_held_back() -> None:
    reader = UpstreamReader(CHAT)
    assert reader.feed(event(chat("a"))) == [UpstreamDelta(0, "a")]
    assert reader.feed(event(chat("b"))) == [UpstreamDelta(0, "b")]
    assert reader.feed(event(chat("ab"))) == [UpstreamDelta(0, "ab")]


def test_a_held_text_is_settled_by_the_finish_or_the_end() -> None:
    two = event(chat("Hi")) + event(chat("Hi there"))
    assert read_all(two + event(chat(None, "stop")) + DONE)[:3] == [
        UpstreamDelta(0, "Hi"),
        UpstreamDelta(0, " there"),
        UpstreamFinish(0, FinishReason.STOP, "stop"),
    ]
    assert read_all(two + event(chat("Hi there!", "stop")) + DONE)[:3] == [
        UpstreamDelta(0, "Hi"),
        UpstreamDelta(0, " there!"),
        UpstreamFinish(0, FinishReason.STOP, "stop"),
    ]
    assert read_all(two + DONE) == [
        UpstreamDelta(0, "Hi"),
        UpstreamDelta(0, " there"),
        UpstreamDone(),
    ]
    assert read_all(two) == [
        UpstreamDelta(0, "Hi"),
        UpstreamDelta(0, " there"),
        UpstreamTruncated(),
    ]
    items = read_all(two + event({"error": {"message": "boom"}}))
    assert items[1] == UpstreamDelta(0, " there")
    assert isinstance(items[2], UpstreamError)


def test_a_stream_without_done_is_truncated() -> None:
    assert read_all(event(chat("a"))) == [UpstreamDelta(0, "a"), UpstreamTruncated()]
    assert read_all(event(chat("a")) + b"data: {") == [
        UpstreamDelta(0, "a"),
        UpstreamTruncated(partial=True),
    ]
    assert read_all(b"") == [UpstreamTruncated()]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            event(
                {
                    "error": {
                        "message": "too long",
                        "type": "BadRequestError",
                        "code": 400,
                    }
                }
            ),
            UpstreamError("too long", "BadRequestError", "400"),
        ),
        (
            event({"error": {"message": "m", "code": "overloaded"}}, name="error"),
            UpstreamError("m", "server_error", "overloaded"),
        ),
        (
            event({"object": "error", "message": "vllm", "type": "X", "code": 500}),
            UpstreamError("vllm", "X", "500"),
        ),
        (
            event({"error": "tgi says no", "error_type": "generation"}),
            UpstreamError("tgi says no", "generation", None),
        ),
        (
            event({"error": "tgi plain"}),
            UpstreamError("tgi plain", "server_error", None),
        ),
        (
            event({"message": "named only"}, name="error"),
            UpstreamError("named only", "server_error", None),
        ),
        (
            event("upstream melted", name="error"),
            UpstreamError("upstream melted", "server_error", None),
        ),
        (
            event("", name="error"),
            UpstreamError("the upstream sent an error event", "server_error", None),
        ),
        (
            event("[1, 2]", name="error"),
            UpstreamError("[1, 2]", "server_error", None),
        ),
    ],
)
def test_in_band_errors(body: bytes, expected: UpstreamError) -> None:
    reader = UpstreamReader(CHAT)
    items = reader.feed(event(chat("a")) + body + event(chat("b")) + DONE)
    assert items == [UpstreamDelta(0, "a"), expected]
    assert reader.state is ReaderState.FAILED
    assert reader.feed(DONE) == []
    assert reader.flush() == []


def test_an_error_without_a_message_says_what_came() -> None:
    (item,) = read_all(event({"error": {"code": 7, "type": ""}}))
    assert isinstance(item, UpstreamError)
    assert "{'code': 7" in item.message
    assert item.code == "7"
    assert item.type == "server_error"
    (item,) = read_all(event({"error": 5}))
    assert isinstance(item, UpstreamError)
    assert "the upstream sent an error" in item.message


@pytest.mark.parametrize(
    "body", [b"data: not json\n\n", b"data: [1]\n\n", b"data: \xff\n\n"]
)
def test_a_body_that_is_not_an_event_stream_is_a_protocol_error(body: bytes) -> None:
    reader = UpstreamReader(CHAT)
    (item,) = reader.feed(body)
    assert isinstance(item, UpstreamError)
    assert item.code == PROTOCOL_ERROR_CODE
    assert reader.feed(DONE) == []
    assert reader.flush() == []


# -- properties --------------------------------------------------------------

texts = st.text(
    alphabet=st.characters(codec="utf-8", categories=("L", "N", "P", "S", "Z", "Cc")),
    max_size=6,
)
quirks = st.sampled_from(
    [
        b": keep-alive\n\n",
        b"event: ping\ndata: {}\n\n",
        event(chat("", role=True)),
        event({"choices": []}),
        event(chat(None, "")),
        event(usage_chunk(3, 1)),
        b"\r\n",
    ]
)


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    parts: list[bytes] = [b"\xef\xbb\xbf"] if draw(st.booleans()) else []
    end = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    for text in draw(st.lists(texts, max_size=8)):
        if draw(st.booleans()):
            parts.append(draw(quirks))
        parts.append(event(chat(text, index=draw(st.integers(0, 1))), end=end))
    if draw(st.booleans()):
        parts.append(event(chat(None, "stop"), end=end))
    ending = draw(
        st.sampled_from([DONE, DONE + DONE, b"", b"data: {", event("x", name="error")])
    )
    return b"".join(parts) + ending


@given(bodies(), st.data())
def test_any_split_gives_the_same_items(body: bytes, data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=8)))
    parts = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    assert read_split(parts) == read_all(body)


@given(st.lists(texts.filter(bool), max_size=10))
def test_plain_token_texts_come_back_whole(pieces: list[str]) -> None:
    body = b"".join(event(chat(p)) for p in pieces) + DONE
    items = read_all(body)
    assert items[-1] == UpstreamDone()
    assert all(isinstance(i, UpstreamDelta) and i.text for i in items[:-1])
    if len(pieces) < 2 or not (
        len(pieces[1]) > len(pieces[0]) and pieces[1].startswith(pieces[0])
    ):
        assert text_of(items) == "".join(pieces)


@given(st.lists(texts.filter(bool), min_size=1, max_size=10))
def test_cumulative_texts_come_back_once(pieces: list[str]) -> None:
    grown = [pieces[0] + "".join(pieces[1 : i + 1]) for i in range(len(pieces))]
    body = b"".join(event(chat(g)) for g in grown) + event(chat(None, "stop")) + DONE
    assert text_of(read_all(body)) == grown[-1]


def _thought(**fields: object) -> dict[str, object]:
    return {"choices": [{"index": 0, "delta": fields, "finish_reason": None}]}


def test_reasoning_in_either_field_comes_before_the_content_once() -> None:
    body = b"".join(
        [
            event(_thought(reasoning_content="a", content="")),
            event(_thought(reasoning="b")),
            event(_thought(reasoning_content="c", reasoning="c", content="x")),
            event(_thought(reasoning_content="", reasoning=None, content="y")),
            event(chat(None, "stop")),
            event(
                {
                    "choices": [],
                    "usage": {
                        "prompt_tokens": 1,
                        "completion_tokens": 5,
                        "completion_tokens_details": {"reasoning_tokens": 3},
                    },
                }
            ),
            event(usage_chunk(1, 5)),  # the details gone: a change
            event("[DONE]"),
        ]
    )
    assert read_all(body) == [
        UpstreamReasoning(0, "a"),
        UpstreamReasoning(0, "b"),
        UpstreamReasoning(0, "c"),
        UpstreamDelta(0, "x"),
        UpstreamDelta(0, "y"),
        UpstreamFinish(0, FinishReason.STOP, "stop"),
        Usage(1, 5, reasoning_tokens=3),
        Usage(1, 5),
        UpstreamDone(),
    ]
