"""An upstream's token logprobs, read from both OpenAI shapes, bounded."""

from __future__ import annotations

import codecs

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.core.logprobs import LogprobToken, TopLogprob
from sluicegate.core.upstream.items import UpstreamDelta
from sluicegate.core.upstream.logprobs import (
    MAX_TOP,
    TokenRun,
    TokenTexts,
    read_logprobs,
)
from sluicegate.core.upstream.reader import UpstreamReader
from sluicegate.core.wire.chunks import Endpoint


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


def _deltas(body: bytes, endpoint: Endpoint = Endpoint.CHAT) -> list[UpstreamDelta]:
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


def test_text_no_token_carries_goes_on_without_logprobs() -> None:
    one = _chunk("Hello", {"content": [_entry("Hel")]})  # a token missing
    hel = LogprobToken("Hel", b"Hel", -1.0, 0)
    assert _deltas(one) == [
        UpstreamDelta(0, "Hel", (hel,), ("Hel",)),
        UpstreamDelta(0, "lo"),
    ]
    assert _deltas(_chunk("Hi", None)) == [UpstreamDelta(0, "Hi")]


def _token(data: bytes, logprob: float = -1.0) -> LogprobToken:
    return LogprobToken(data.decode(errors="backslashreplace"), data, logprob, 0)


CAT = "\u732b".encode()  # three bytes: a token may end after any of them


def test_tokens_that_split_a_character_go_with_the_character() -> None:
    """vLLM and llama-server send a token that ends inside a character in a
    chunk of its own with empty content: its logprob waits for the text."""
    first, second = _token(CAT[:2]), _token(CAT[2:] + b"!")
    texts = TokenTexts(8)
    assert texts.feed("", (first,), repeated=False) == []
    assert texts.feed("\u732b!", (second,), repeated=False) == [
        TokenRun("\u732b!", (first, second), ("", "\u732b!"))
    ]
    body = _chunk("", {"content": [_entry(first.token, bytes=list(CAT[:2]))]})
    body += _chunk(
        "\u732b!", {"content": [_entry(second.token, bytes=list(CAT[2:] + b"!"))]}
    )
    (delta,) = _deltas(body)
    assert (delta.text, delta.token_texts) == ("\u732b!", ("", "\u732b!"))
    assert delta.logprobs is not None
    assert [t.token_bytes for t in delta.logprobs] == [CAT[:2], CAT[2:] + b"!"]


def test_tokens_repeated_cumulatively_are_taken_once() -> None:
    hel, lo, world = _token(b"Hel"), _token(b"lo"), _token(b" world")
    texts = TokenTexts(8)
    assert texts.feed("Hel", (hel,), repeated=False) == [
        TokenRun("Hel", (hel,), ("Hel",))
    ]
    assert texts.feed("lo", (hel, lo), repeated=True) == [
        TokenRun("lo", (lo,), ("lo",))
    ]
    assert texts.feed(" world", (hel, lo, world), repeated=True) == [
        TokenRun(" world", (world,), (" world",))
    ]


def test_the_reader_aligns_a_cumulative_upstreams_tokens() -> None:
    body = b"".join(
        _chunk(text, {"content": [_entry(t) for t in tokens]})
        for text, tokens in [
            ("He", ["He"]),
            ("Hel", ["He", "l"]),
            ("Hello", ["He", "l", "lo"]),
        ]
    )
    deltas = [d for d in _deltas(body) if isinstance(d, UpstreamDelta)]
    assert "".join(d.text for d in deltas) == "Hello"
    tokens = [t.token for d in deltas for t in d.logprobs or ()]
    assert tokens == ["He", "l", "lo"]


def test_a_token_whose_character_ends_in_text_without_tokens_is_dropped() -> None:
    """A token that ends inside a character, whose character then comes in a
    chunk with no logprobs (a last chunk without them): its text never comes
    with a token, so it is dropped and the text goes on without logprobs."""
    texts = TokenTexts(8)
    assert texts.feed("", (_token(CAT[:2]),), repeated=False) == []
    assert texts.feed("\u732b!", None, repeated=False) == [TokenRun("\u732b!")]


def test_a_special_token_the_text_does_not_hold_is_dropped() -> None:
    marker, hi, end = _token(b"<x>"), _token(b"Hi"), _token(b"</s>")
    texts = TokenTexts(8)
    assert texts.feed("Hi", (marker, hi), repeated=False) == [
        TokenRun("Hi", (hi,), ("Hi",))
    ]
    assert texts.feed("", (end,), repeated=False) == []  # waits, for nothing


def test_text_held_back_upstream_cuts_a_token_and_the_rest_has_none() -> None:
    """An upstream holding back text for its own stop strings sends a token
    before all of its text."""
    hello = _token(b"Hello")
    texts = TokenTexts(8)
    assert texts.feed("Hel", (hello,), repeated=False) == [
        TokenRun("Hel", (hello,), ("Hel",))
    ]
    assert texts.feed("lo!", None, repeated=False) == [TokenRun("lo!")]


def test_tokens_waiting_for_text_are_bounded() -> None:
    texts = TokenTexts(4)
    for _ in range(10):
        texts.feed("", (_token(CAT[:1]),), repeated=False)
    assert len(texts._waiting) == 4
    assert len(texts._seen) == 4


_PIECES = [b"a", b"bc", b" ", CAT[:1], CAT[1:2], CAT[2:], "\u00e9".encode()[:1],
           "\u00e9".encode()[1:]]  # fmt: skip


@settings(max_examples=60)
@given(
    st.lists(st.sampled_from(range(len(_PIECES))), max_size=24),
    st.lists(st.integers(min_value=1, max_value=4), max_size=24),
)
def test_any_chunking_gives_back_the_text_and_every_token_once(
    picks: list[int], sizes: list[int]
) -> None:
    """However an upstream groups tokens into chunks (each chunk's text what
    a UTF-8 decoder releases, as vLLM's and llama-server's detokenizers do),
    the runs give back its text, and every token, once, in order."""
    tokens = [_token(_PIECES[p], -float(i)) for i, p in enumerate(picks)]
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    texts, runs, at = TokenTexts(64), [], 0
    whole = ""
    for size in [*sizes, len(tokens)]:
        chunk = tuple(tokens[at : at + size])
        at += len(chunk)
        text = "".join(decoder.decode(t.token_bytes) for t in chunk)
        whole += text
        runs += texts.feed(text, chunk, repeated=False)
        if at >= len(tokens):
            break
    assert "".join(r.text for r in runs) == whole
    for run in runs:
        if run.tokens is not None:
            assert run.texts is not None
            assert "".join(run.texts) == run.text
    # Only tokens that end inside a character at the very end still wait.
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    pieces = [decoder.decode(t.token_bytes) for t in tokens]
    while pieces and not pieces[-1]:
        pieces.pop()
    assert [t for r in runs for t in r.tokens or ()] == tokens[: len(pieces)]
