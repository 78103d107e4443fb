"""The per-token fast paths give the same bytes and text as the plain ones.

``StreamMachine`` builds a content frame from prebuilt bytes around the JSON of
the text; these tests rebuild every frame the straightforward way (the full chunk
dict from ``chunks``, ``dumps``, ``encode_event``) and compare bytes. The
detokenizer's ASCII path and its table of piece texts, the stop matcher's
no-stop-can-start path and the decoder's one-token path are checked against their
general paths, on toy pieces and on real vocabularies. ``Delta`` and
``ChoiceStep`` write their own ``__init__``; it must match the generated one.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Sequence
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluicegate.core.decoding import choice as choice_module
from sluicegate.core.decoding.choice import ChoiceDecoder, ChoiceStep
from sluicegate.core.decoding.detokenize import (
    IncrementalDetokenizer,
    WindowedDetokenizer,
)
from sluicegate.core.decoding.stops import StopMatcher
from sluicegate.core.errors import LocalProtocolError
from sluicegate.core.events import (
    Delta,
    End,
    EngineOutput,
    Finish,
    FinishReason,
    Usage,
)
from sluicegate.core.wire.chunks import (
    Endpoint,
    ResponseHeader,
    chat_chunk,
    completion_chunk,
    dumps,
    usage_chunk,
)
from sluicegate.core.wire.sse import DONE, SSEDecoder, encode_event
from sluicegate.core.wire.stream import StreamMachine
from tests.core.strategies import tricky_text
from tests.core.toys import SP_PIECES, SP_SPECIAL, sp_decode

# Text a JSON encoder must escape or keep: quotes, backslashes, control
# characters, line and paragraph separators, emoji; and the marker the machine
# splits its frames on.
wire_text = st.one_of(
    tricky_text,
    st.text(st.characters(exclude_categories=["Cs"]), max_size=20),
    st.lists(
        st.sampled_from(
            [
                *['"', "\\", "\\u", "\x00", "\x1f", "\x7f", "\u2028", "\u2029"],
                *["👩\u200d💻", "é", "\x00sluicegate:text\x00", "content", "null", "}"],
            ]
        ),
        max_size=12,
    ).map("".join),
)

headers = st.builds(
    ResponseHeader,
    id=wire_text,
    created=st.integers(0, 2**40),
    model=wire_text,
    endpoint=st.sampled_from(Endpoint),
    n=st.integers(1, 4),
    include_usage=st.booleans(),
    system_fingerprint=st.none() | wire_text,
)


def reference_frames(
    header: ResponseHeader, event: Delta | Finish | End
) -> list[bytes]:
    """What the machine must write, built from whole chunk dicts."""
    chat = header.endpoint is Endpoint.CHAT
    payload: dict[str, Any]
    match event:
        case Delta(index=index, text=text):
            if not text:
                return []
            if chat:
                payload = chat_chunk(header, index, {"content": text})
            else:
                payload = completion_chunk(header, index, text)
        case Finish(index=index, finish_reason=reason):
            if chat:
                payload = chat_chunk(header, index, {}, reason)
            else:
                payload = completion_chunk(header, index, "", reason)
        case End(usage=usage):
            if not header.include_usage:
                return [DONE]
            return [encode_event(dumps(usage_chunk(header, usage))), DONE]
    return [encode_event(dumps(payload))]


@st.composite
def streams(draw: st.DrawFn) -> tuple[ResponseHeader, list[Delta | Finish | End]]:
    """A header and a legal event sequence: deltas, one finish per choice, End."""
    header = draw(headers)
    events: list[Delta | Finish | End] = []
    open_choices = list(range(header.n))
    while open_choices:
        index = draw(st.sampled_from(open_choices))
        if draw(st.integers(0, 4)) == 0:
            events.append(Finish(index, draw(st.sampled_from(FinishReason))))
            open_choices.remove(index)
        else:
            events.append(Delta(index, draw(wire_text)))
    usage = Usage(draw(st.integers(0, 10**6)), draw(st.integers(0, 10**6)))
    events.append(End(usage))
    return header, events


@given(streams())
def test_frames_are_byte_identical_to_whole_chunk_encoding(
    stream: tuple[ResponseHeader, list[Delta | Finish | End]],
) -> None:
    header, events = stream
    machine = StreamMachine(header)
    machine.start()
    for event in events:
        assert machine.feed(event) == reference_frames(header, event)


@pytest.mark.parametrize("endpoint", list(Endpoint))
def test_marker_in_id_and_model_does_not_move_the_text(endpoint: Endpoint) -> None:
    marker = "\x00sluicegate:text\x00"
    header = ResponseHeader(marker, 1, marker, endpoint, 2, True, marker)
    machine = StreamMachine(header)
    machine.start()
    for index in (1, 0):
        event = Delta(index, f"say {marker}")
        assert machine.feed(event) == reference_frames(header, event)


@pytest.mark.parametrize("endpoint", list(Endpoint))
def test_a_delta_with_usage_carries_its_text(endpoint: Endpoint) -> None:
    header = ResponseHeader("id", 1, "m", endpoint, 1, True)
    machine = StreamMachine(header)
    machine.start()
    for text, frame_count in (("", 0), ('a "b"\n', 1)):
        frames = machine.feed(Delta(0, text, usage=Usage(3, 1)))
        assert len(frames) == frame_count
        for frame in frames:
            (event,) = SSEDecoder().feed(frame)
            choice = orjson.loads(event.data)["choices"][0]
            assert choice.get("text", choice.get("delta", {}).get("content")) == text


def test_a_lone_surrogate_in_a_delta_raises_and_changes_nothing() -> None:
    machine = StreamMachine(ResponseHeader("id", 1, "m", Endpoint.CHAT))
    machine.start()
    with pytest.raises(TypeError):
        machine.feed(Delta(0, "a\ud800"))
    assert machine.feed(Delta(0, "ok")) == reference_frames(
        machine.header, Delta(0, "ok")
    )


# -- detokenizer and decoder ----------------------------------------------------

PIECES = [b"a", b" b", b"\xc3", b"\xa9", b"\xe6\x97", b"\xa5", b"\xed\xa0", b"\xff"]
PIECES += [b"\n", b"<", b"/x>", b"", b"\xf0\x9f", b"\xa4\x96"]
SKIP = frozenset({11})


@given(st.lists(st.integers(0, len(PIECES) - 1), max_size=40))
def test_one_token_steps_give_the_text_of_one_whole_step(ids: list[int]) -> None:
    one_by_one = IncrementalDetokenizer(PIECES, SKIP)
    text = "".join(one_by_one.feed((i,)) for i in ids) + one_by_one.flush()
    whole = IncrementalDetokenizer(PIECES, SKIP)
    assert text == whole.feed(ids) + whole.flush()
    expected = b"".join(PIECES[i] for i in ids if i not in SKIP).decode(
        "utf-8", "replace"
    )
    assert text == expected


def test_ascii_after_a_dead_lead_byte_replaces_it_at_once() -> None:
    detokenizer = IncrementalDetokenizer(PIECES)
    assert detokenizer.feed([2]) == ""  # b"\xc3": may still complete
    assert detokenizer.pending_bytes == b"\xc3"
    assert detokenizer.feed([0]) == "\ufffda"
    assert detokenizer.pending_bytes == b""
    assert detokenizer.feed([0]) == "a"


@given(
    st.lists(st.integers(0, len(PIECES) - 1), max_size=40),
    st.lists(st.integers(1, 3), max_size=20),
)
def test_decoder_steps_of_any_size_agree_with_one_token_steps(
    ids: list[int], sizes: list[int]
) -> None:
    stops = ["</x>", "\n\n"]

    def decode(steps: list[list[int]]) -> tuple[str, FinishReason | None, int]:
        decoder = ChoiceDecoder(
            IncrementalDetokenizer(PIECES, SKIP), StopMatcher(stops)
        )
        text, reason = "", None
        for step in steps:
            result = decoder.feed(step)
            text += result.text
            reason = reason or result.finish_reason
        tail = decoder.flush()
        return text + tail.text, reason or tail.finish_reason, decoder.completion_tokens

    steps, rest = [], list(ids)
    for size in sizes:
        steps.append(rest[:size])
        rest = rest[size:]
    steps.append(rest)
    assert decode(steps) == decode([[i] for i in ids])


@given(st.lists(st.integers(0, len(SP_PIECES) - 1), max_size=20))
def test_windowed_decoder_one_token_steps_agree_with_one_whole_step(
    ids: list[int],
) -> None:
    def decoder() -> ChoiceDecoder:
        detokenizer = WindowedDetokenizer(sp_decode, SP_SPECIAL)
        return ChoiceDecoder(detokenizer, StopMatcher(["o!", "\ufffd"]))

    one_by_one, whole = decoder(), decoder()
    steps = [one_by_one.feed([token_id]) for token_id in ids]
    steps.append(one_by_one.flush())
    text = "".join(step.text for step in steps)
    reason = next((s.finish_reason for s in steps if s.finish_reason), None)
    step, tail = whole.feed(ids), whole.flush()
    assert (text, reason) == (
        step.text + tail.text,
        step.finish_reason or tail.finish_reason,
    )
    assert one_by_one.completion_tokens == whole.completion_tokens


def test_steps_are_shared_by_text_in_a_bounded_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(choice_module, "_TEXT_STEPS", {"": choice_module._NOTHING})
    monkeypatch.setattr(choice_module, "_MAX_TEXT_STEPS", 3)
    long_text = "x" * (choice_module._MAX_SHARED_CHARS + 1)
    pieces = [b"a", b"b", b"c", long_text.encode()]
    decoder = ChoiceDecoder(IncrementalDetokenizer(pieces), StopMatcher([]))
    for token_id in [0, 1, 2, 0, 3, 3, 1]:
        step = decoder.feed([token_id])
        assert step == ChoiceStep(pieces[token_id].decode())
        assert len(choice_module._TEXT_STEPS) <= 3
        assert choice_module._TEXT_STEPS[""] is choice_module._NOTHING
        assert long_text not in choice_module._TEXT_STEPS
    other = ChoiceDecoder(IncrementalDetokenizer(pieces), StopMatcher([]))
    assert other.feed([1]) is step


@settings(max_examples=50)  # one comparison each: cheap, but wire_text is not
@given(
    wire_text,
    st.integers(0, 3),
    st.none() | st.builds(Usage, st.integers(0, 99), st.integers(0, 99)),
)
def test_a_steps_events_are_its_text_as_a_delta_shared_or_not(
    text: str, index: int, usage: Usage | None
) -> None:
    # Shared steps (short texts) share choice 0's Delta; every step's events
    # are the Delta the plain path builds, or none for empty text.
    expected = (Delta(index, text, None, usage),) if text else ()
    shared = choice_module._new_text_step(text)
    assert shared.events(index, usage) == expected
    assert ChoiceStep(text).events(index, usage) == expected
    assert ChoiceStep(text, FinishReason.STOP).events(index, usage) == expected


def test_a_step_without_text_is_the_shared_empty_step() -> None:
    decoder = ChoiceDecoder(IncrementalDetokenizer(PIECES), StopMatcher(["<x"]))
    assert decoder.feed([2]) == ChoiceStep("")  # half a character
    assert decoder.feed([3]) == ChoiceStep("é")
    assert decoder.feed([9]) == ChoiceStep("")  # "<" held back
    assert decoder.feed([0]) == ChoiceStep("<a")


@given(
    st.lists(st.integers(0, len(PIECES) - 1), max_size=30),
    st.sets(st.integers(0, len(PIECES) - 1), max_size=2).map(frozenset),
)
def test_one_token_feeds_from_the_table_agree_with_plain_feeds(
    ids: list[int], skip: frozenset[int]
) -> None:
    # Twice: the second time round the ids' texts come from the shared table,
    # filled by detokenizers with other skip ids.
    for skip_ids in (skip, SKIP, skip):
        fast = IncrementalDetokenizer(PIECES, skip_ids)
        plain = IncrementalDetokenizer(PIECES, skip_ids)
        for token_id in ids:
            assert fast._feed_one(token_id) == plain.feed((token_id,))
            assert fast.pending_bytes == plain.pending_bytes
        assert fast.flush() == plain.flush()


def test_one_token_feed_checks_like_feed() -> None:
    detokenizer = IncrementalDetokenizer(PIECES)
    assert detokenizer._feed_one(0) == "a"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        detokenizer._feed_one(len(PIECES))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        detokenizer._feed_one(-1)
    detokenizer.flush()
    with pytest.raises(LocalProtocolError):
        detokenizer._feed_one(0)  # its text is in the table by now


def test_vocabularies_share_a_few_text_tables() -> None:
    vocabularies = [[b"a", f"{i}".encode()] for i in range(20)]
    for pieces in vocabularies:
        assert IncrementalDetokenizer(pieces)._feed_one(1) == pieces[1].decode()
    first, last = vocabularies[0], vocabularies[-1]
    assert IncrementalDetokenizer(last)._texts is IncrementalDetokenizer(last)._texts
    assert IncrementalDetokenizer(first)._texts == {}  # evicted, then made anew


# -- on real vocabularies ---------------------------------------------------------

REAL_VOCAB = settings(
    max_examples=40, suppress_health_check=[HealthCheck.too_slow], deadline=None
)
STOPS = ["\n\n", "</", "é.", ", and"]


def real_ids(
    data: st.DataObject, pieces: Sequence[bytes], text_ids: list[int]
) -> list[int]:
    """Random ids, lone high bytes (split characters) and runs of real text."""
    byte_ids = [i for i, p in enumerate(pieces) if len(p) == 1 and p[0] >= 0x80]
    runs = data.draw(
        st.lists(
            st.one_of(
                st.lists(st.integers(0, len(pieces) - 1), max_size=3),
                st.lists(st.sampled_from(byte_ids), max_size=3),
                st.integers(0, len(text_ids)).map(lambda i: text_ids[i : i + 12]),
            ),
            max_size=5,
        )
    )
    return [token for run in runs for token in run]


def check_one_token_paths(
    pieces: Sequence[bytes], special: frozenset[int], ids: list[int]
) -> None:
    """Detokenizer and decoder, one id at a time, against their plain paths."""
    for skip in (special, frozenset()):
        fast = IncrementalDetokenizer(pieces, skip)
        plain = IncrementalDetokenizer(pieces, skip)
        for token_id in ids:
            assert fast._feed_one(token_id) == plain.feed((token_id,))
            assert fast.pending_bytes == plain.pending_bytes
        assert fast.flush() == plain.flush()

    def decoder() -> ChoiceDecoder:
        return ChoiceDecoder(
            IncrementalDetokenizer(pieces, special), StopMatcher(STOPS)
        )

    one_by_one, whole = decoder(), decoder()
    steps = [one_by_one.feed((token_id,)) for token_id in ids]
    steps.append(one_by_one.flush())
    text = "".join(step.text for step in steps)
    reason = next((s.finish_reason for s in steps if s.finish_reason), None)
    # The reference: decode everything, then cut at the first stop string.
    full = b"".join(pieces[i] for i in ids if i not in special)
    matcher = StopMatcher(STOPS)
    cut = matcher.feed(full.decode("utf-8", "replace"))
    expected = cut.text if cut.stop else cut.text + matcher.flush()
    assert (text, reason) == (expected, FinishReason.STOP if cut.stop else None)
    step, tail = whole.feed(ids), whole.flush()
    assert (step.text + tail.text, step.finish_reason or tail.finish_reason) == (
        text,
        reason,
    )
    assert one_by_one.completion_tokens == whole.completion_tokens


@REAL_VOCAB
@given(data=st.data())
def test_one_token_paths_agree_with_plain_paths_on_gemma(
    gemma_tokenizer: Any, data: st.DataObject
) -> None:
    pieces: Sequence[bytes] = gemma_tokenizer.pieces
    text_ids = gemma_tokenizer.encode(
        "Café, and 日本語 </b> 🤖👩‍💻 é.\n\n" * 2,
        add_special=False,
        parse_special=False,
    )
    ids = real_ids(data, pieces, text_ids)
    check_one_token_paths(pieces, gemma_tokenizer.special_ids, ids)


@REAL_VOCAB
@given(data=st.data())
def test_one_token_paths_agree_with_plain_paths_on_tekken(
    tekken: Any, data: st.DataObject
) -> None:
    text_ids = tekken.encode("Café, and 日本語 </b> 🤖👩‍💻 é.\n\n" * 2)
    ids = real_ids(data, tekken.pieces, text_ids)
    check_one_token_paths(tekken.pieces, tekken.special_ids, ids)


# -- values with their own __init__ --------------------------------------------------


@pytest.mark.parametrize("cls", [Delta, ChoiceStep, EngineOutput])
def test_own_init_takes_the_fields_in_order_with_their_defaults(
    cls: type[Delta] | type[ChoiceStep] | type[EngineOutput],
) -> None:
    fields = [
        (
            f.name,
            inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default,
        )
        for f in dataclasses.fields(cls)
        if f.init  # a private cache (ChoiceStep's shared events) is no argument
    ]
    parameters = inspect.signature(cls).parameters.values()
    assert [(p.name, p.default) for p in parameters] == fields
    assert cls.__match_args__ == tuple(name for name, _ in fields)


def test_own_init_values_stay_frozen_dataclasses() -> None:
    usage = Usage(1, 2)
    delta = Delta(1, "a", usage=usage)
    assert (delta.index, delta.text, delta.logprobs, delta.usage) == (
        1,
        "a",
        None,
        usage,
    )
    assert delta == Delta(index=1, text="a", logprobs=None, usage=usage)
    assert hash(delta) == hash(Delta(1, "a", None, usage))
    assert dataclasses.replace(delta, text="b") == Delta(1, "b", usage=usage)
    assert repr(Delta(0, "x")) == (
        "Delta(index=0, text='x', logprobs=None, usage=None, parts=None)"
    )
    step = ChoiceStep("a", FinishReason.STOP)
    assert step == ChoiceStep(text="a", finish_reason=FinishReason.STOP)
    output = EngineOutput((7,), FinishReason.LENGTH)
    assert output == EngineOutput(token_ids=(7,), finish_reason=FinishReason.LENGTH)
    assert (output.token_ids, output.finish_reason, output.logprobs) == (
        (7,),
        FinishReason.LENGTH,
        None,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        output.token_ids = ()  # type: ignore[misc]
    assert ChoiceStep("a").finish_reason is None
    for value, name in ((delta, "text"), (step, "finish_reason")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, name, None)
