"""An upstream's token logprobs, read from both OpenAI shapes, bounded."""

from __future__ import annotations

import orjson
import pytest

from sluicegate.core.chunks import Endpoint
from sluicegate.core.logprobs import LogprobToken, TopLogprob
from sluicegate.core.upstream import UpstreamReader
from sluicegate.core.upstream_items import UpstreamDelta
from sluicegate.core.upstream_logprobs import MAX_TOP, read_logprobs


def _entry(token: str, logprob: object = -1.0, **more: object) -> dict[str, object]:
    return {"token": token, "logprob": logprob, **more}


def test_chat_entries_keep_token_bytes_logprob_and_top() -> None:
    content = [
        _entry("Hi", -0.25, bytes=[72, 105], top_logprobs=[_entry("Ho", -2)]),
        _entry("!", -1, bytes=None),
    ]
    assert read_logprobs({"content": content}, True, 8) == (
        LogprobToken("Hi", b"Hi", -0.25, 0, (TopLogprob("Ho", b"Ho", -2.0),)),
        LogprobToken("!", b"!", -1.0, 0),
    )


def test_completion_entries_become_the_same_tokens() -> None:
    logprobs = {
        "tokens": ["Hi", "!"],
        "token_logprobs": [-0.25, -1],
        "top_logprobs": [{"Ho": -2}, None],
        "text_offset": [0, 2],
    }
    assert read_logprobs(logprobs, False, 8) == (
        LogprobToken("Hi", b"Hi", -0.25, 0, (TopLogprob("Ho", b"Ho", -2.0),)),
        LogprobToken("!", b"!", -1.0, 0),
    )
    plain = {"tokens": ["a"], "token_logprobs": [-1.0]}
    assert read_logprobs(plain, False, 8) == (LogprobToken("a", b"a", -1.0, 0),)


def test_alternatives_past_max_top_are_dropped() -> None:
    tops = [_entry(str(i)) for i in range(MAX_TOP + 5)]
    (token,) = (
        read_logprobs({"content": [_entry("a", top_logprobs=tops)]}, True, 8) or ()
    )
    assert len(token.top) == MAX_TOP


@pytest.mark.parametrize(
    ("logprobs", "chat"),
    [
        (None, True),
        ([], True),
        ({"content": None}, True),
        ({"content": [_entry("a")] * 9}, True),  # past max_tokens
        ({"content": ["a"]}, True),
        ({"content": [_entry(1)]}, True),  # type: ignore[arg-type]
        ({"content": [_entry("a", "x")]}, True),
        ({"content": [_entry("a", float("nan"))]}, True),
        ({"content": [_entry("a", True)]}, True),
        ({"content": [_entry("a", top_logprobs={"b": 1})]}, True),
        ({"content": [_entry("\ud800")]}, True),  # not UTF-8 encodable
        ({"tokens": ["a"]}, False),
        ({"tokens": ["a", "b"], "token_logprobs": [-1.0]}, False),
        ({"tokens": ["a"] * 9, "token_logprobs": [-1.0] * 9}, False),
        ({"tokens": ["a"], "token_logprobs": [-1.0], "top_logprobs": "x"}, False),
        ({"tokens": ["a"], "token_logprobs": [-1.0], "top_logprobs": [{}, {}]}, False),
        ({"tokens": ["a"], "token_logprobs": [-1.0], "top_logprobs": [["b"]]}, False),
        ({"tokens": [1], "token_logprobs": [-1.0]}, False),
    ],
)
def test_anything_else_is_no_logprobs(logprobs: object, chat: bool) -> None:
    assert read_logprobs(logprobs, chat, 8) is None


def _chunk(text: str, logprobs: object, chat: bool = True) -> bytes:
    choice: dict[str, object] = {
        "index": 0,
        "finish_reason": None,
        "logprobs": logprobs,
    }
    if chat:
        choice["delta"] = {"content": text}
    else:
        choice["text"] = text
    return b"data: " + orjson.dumps({"choices": [choice]}) + b"\n\n"


def _deltas(body: bytes, endpoint: Endpoint = Endpoint.CHAT) -> list[object]:
    reader = UpstreamReader(endpoint)
    return [i for i in reader.feed(body) if type(i) is UpstreamDelta]


def test_the_reader_attaches_logprobs_that_join_to_the_chunks_text() -> None:
    tokens = {"content": [_entry("Hel"), _entry("lo")]}
    (delta,) = _deltas(_chunk("Hello", tokens))
    assert isinstance(delta, UpstreamDelta)
    assert delta.logprobs is not None
    assert [t.token for t in delta.logprobs] == ["Hel", "lo"]
    completion = {"tokens": ["Hi"], "token_logprobs": [-1.0]}
    (plain,) = _deltas(_chunk("Hi", completion, chat=False), Endpoint.COMPLETION)
    assert isinstance(plain, UpstreamDelta)
    assert plain.logprobs == (LogprobToken("Hi", b"Hi", -1.0, 0),)


def test_the_reader_drops_logprobs_that_do_not_match_the_text() -> None:
    one = _chunk("Hello", {"content": [_entry("Hel")]})  # a token missing
    assert _deltas(one) == [UpstreamDelta(0, "Hello")]
    assert _deltas(_chunk("Hi", None)) == [UpstreamDelta(0, "Hi")]
    # Cumulative text (each chunk the whole text so far): only the new part is
    # text, and the chunk's tokens are not its tokens.
    body = b"".join(_chunk(t, {"content": [_entry(t)]}) for t in ("He", "Hel", "Hello"))
    assert [d.logprobs for d in _deltas(body) if isinstance(d, UpstreamDelta)][
        -1
    ] is None
