from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from sluicegate.core.endstate import EndState
from sluicegate.core.errors import LocalProtocolError
from sluicegate.core.events import (
    Delta,
    End,
    Fail,
    Finish,
    FinishReason,
    Heartbeat,
    StreamEvent,
    Usage,
)
from sluicegate.core.wire.chunks import Endpoint, ResponseHeader
from sluicegate.core.wire.sse import DONE, SSEDecoder
from sluicegate.core.wire.stream import TRANSITIONS, Start, StreamMachine, StreamState

STOP, LENGTH = FinishReason.STOP, FinishReason.LENGTH


def header(
    endpoint: Endpoint = Endpoint.CHAT, n: int = 1, include_usage: bool = False
) -> ResponseHeader:
    return ResponseHeader("id-1", 1700000000, "m", endpoint, n, include_usage)


def payloads(frames: list[bytes]) -> list[Any]:
    """Each frame parsed: JSON objects, ``"[DONE]"``, or ``":"`` for a comment."""
    out: list[Any] = []
    for frame in frames:
        if frame.startswith(b":"):
            out.append(":")
            continue
        assert frame.startswith(b"data: ")
        assert frame.endswith(b"\n\n")
        assert frame.count(b"\n") == 2, "one data line per frame"
        body = frame[len(b"data: ") : -2]
        out.append("[DONE]" if body == b"[DONE]" else orjson.loads(body))
    return out


def send(machine: StreamMachine, event: StreamEvent | Start) -> list[bytes]:
    """``start()`` for ``Start``, else ``feed(event)``."""
    if isinstance(event, Start):
        return machine.start()
    return machine.feed(event)


def snapshot(machine: StreamMachine) -> tuple[object, ...]:
    return (machine.state, machine.end_state, machine.finish_reasons)


def machine_in(state: StreamState, n: int = 1) -> StreamMachine:
    machine = StreamMachine(header(n=n))
    if state is StreamState.NEW:
        return machine
    machine.start()
    if state is StreamState.STREAMING:
        return machine
    if state is StreamState.ERRORED:
        machine.feed(Fail("boom"))
        return machine
    for index in range(n):
        machine.feed(Finish(index, STOP))
    if state is StreamState.FINISHED:
        machine.feed(End(Usage(1, 1)))
    return machine


# --- examples ---------------------------------------------------------------------


def test_chat_stream_frames_in_order() -> None:
    machine = StreamMachine(header(include_usage=True))
    frames = machine.start()
    frames += machine.feed(Delta(0, "Café"))
    frames += machine.feed(Heartbeat())
    frames += machine.feed(Finish(0, STOP))
    frames += machine.feed(End(Usage(9, 11)))
    common = {"id": "id-1", "object": "chat.completion.chunk", "created": 1700000000}
    common["model"] = "m"

    def choice(delta: dict[str, str], reason: str | None) -> dict[str, Any]:
        item = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        return {**common, "choices": [item], "usage": None}

    assert payloads(frames) == [
        choice({"role": "assistant"}, None),
        choice({"content": "Café"}, None),
        ":",
        choice({}, "stop"),
        {
            **common,
            "choices": [],
            "usage": {"prompt_tokens": 9, "completion_tokens": 11, "total_tokens": 20},
        },
        "[DONE]",
    ]
    assert frames[-1] == DONE
    assert machine.state is StreamState.FINISHED
    assert machine.end_state is EndState.FINISHED
    assert machine.finish_reasons == (STOP,)


def test_completion_stream_has_no_role_chunk_and_text_choices() -> None:
    machine = StreamMachine(header(Endpoint.COMPLETION))
    assert machine.start() == []
    frames = machine.feed(Delta(0, "a"))
    frames += machine.feed(Finish(0, LENGTH))
    frames += machine.feed(End(Usage(1, 1)))
    chunks = payloads(frames)
    assert [c["choices"][0] for c in chunks[:2]] == [
        {"index": 0, "text": "a", "logprobs": None, "finish_reason": None},
        {"index": 0, "text": "", "logprobs": None, "finish_reason": "length"},
    ]
    assert chunks[0]["object"] == "text_completion"
    assert "usage" not in chunks[0]
    assert chunks[2] == "[DONE]"


def test_start_sends_one_role_chunk_per_choice() -> None:
    machine = StreamMachine(header(n=3))
    chunks = payloads(machine.start())
    assert [c["choices"][0]["index"] for c in chunks] == [0, 1, 2]
    assert all(c["choices"][0]["delta"] == {"role": "assistant"} for c in chunks)
    assert machine.state is StreamState.STREAMING


def test_empty_delta_sends_nothing() -> None:
    machine = machine_in(StreamState.STREAMING)
    assert machine.feed(Delta(0, "")) == []
    assert machine.state is StreamState.STREAMING


def test_choices_finish_independently_then_end_is_allowed() -> None:
    machine = machine_in(StreamState.STREAMING, n=2)
    machine.feed(Finish(1, LENGTH))
    assert snapshot(machine) == (StreamState.STREAMING, None, (None, LENGTH))
    machine.feed(Delta(0, "x"))
    machine.feed(Finish(0, STOP))
    assert machine.state is StreamState.AWAITING_END
    assert machine.end_state is None
    assert machine.feed(End(Usage(1, 2))) == [DONE]


def test_usage_chunk_comes_only_with_include_usage() -> None:
    machine = StreamMachine(header(include_usage=False))
    machine.start()
    machine.feed(Finish(0, STOP))
    assert machine.feed(End(Usage(1, 1))) == [DONE]


@pytest.mark.parametrize(
    "state", [StreamState.NEW, StreamState.STREAMING, StreamState.AWAITING_END]
)
def test_fail_sends_one_error_event_and_no_done(state: StreamState) -> None:
    machine = machine_in(state)
    frames = machine.feed(Fail("engine died", "server_error", "engine_error"))
    assert payloads(frames) == [
        {
            "error": {
                "message": "engine died",
                "type": "server_error",
                "param": None,
                "code": "engine_error",
            }
        }
    ]
    assert machine.state is StreamState.ERRORED
    assert machine.end_state is EndState.ERRORED


@pytest.mark.parametrize(
    "state", [StreamState.NEW, StreamState.STREAMING, StreamState.AWAITING_END]
)
def test_heartbeat_is_a_comment_in_every_open_state(state: StreamState) -> None:
    machine = machine_in(state)
    assert machine.feed(Heartbeat()) == [b": keep-alive\n\n"]
    assert machine.state is state


EVENTS: list[StreamEvent | Start] = [
    Start(),
    Delta(0, "x"),
    Finish(0, STOP),
    End(Usage(1, 1)),
    Fail("boom"),
    Heartbeat(),
]


ILLEGAL = [
    (state, event)
    for state in StreamState
    for event in EVENTS
    if (state, type(event)) not in TRANSITIONS
]


@pytest.mark.parametrize(
    ("state", "event"), ILLEGAL, ids=lambda x: getattr(x, "name", type(x).__name__)
)
def test_pairs_outside_the_table_raise_and_change_nothing(
    state: StreamState, event: StreamEvent | Start
) -> None:
    machine = machine_in(state)
    before = snapshot(machine)
    with pytest.raises(
        LocalProtocolError, match=f"{type(event).__name__}.*{state.name}"
    ):
        send(machine, event)
    assert snapshot(machine) == before


def test_table_allows_exactly_the_documented_pairs() -> None:
    assert len(TRANSITIONS) == 10
    terminal = {StreamState.FINISHED, StreamState.ERRORED}
    assert not any(state in terminal for state, _ in TRANSITIONS)


@pytest.mark.parametrize("index", [-1, 2, 99])
@pytest.mark.parametrize("make", [lambda i: Delta(i, "x"), lambda i: Finish(i, STOP)])
def test_choice_index_out_of_range_raises_and_changes_nothing(
    index: int, make: Callable[[int], StreamEvent]
) -> None:
    machine = machine_in(StreamState.STREAMING, n=2)
    before = snapshot(machine)
    with pytest.raises(LocalProtocolError, match="n=2"):
        machine.feed(make(index))
    assert snapshot(machine) == before


def test_second_finish_for_a_choice_raises_and_changes_nothing() -> None:
    machine = machine_in(StreamState.STREAMING, n=2)
    machine.feed(Finish(0, LENGTH))
    before = snapshot(machine)
    with pytest.raises(LocalProtocolError, match="already finished with 'length'"):
        machine.feed(Finish(0, STOP))
    assert snapshot(machine) == before


def test_delta_after_its_choice_finished_raises_and_changes_nothing() -> None:
    machine = machine_in(StreamState.STREAMING, n=2)
    machine.feed(Finish(0, STOP))
    before = snapshot(machine)
    with pytest.raises(LocalProtocolError, match="choice 0"):
        machine.feed(Delta(0, "late"))
    assert snapshot(machine) == before
    assert payloads(machine.feed(Delta(1, "ok")))[0]["choices"][0]["index"] == 1


def test_unencodable_text_raises_and_changes_nothing() -> None:
    machine = machine_in(StreamState.STREAMING)
    before = snapshot(machine)
    with pytest.raises(TypeError):
        machine.feed(Delta(0, "\ud800"))
    assert snapshot(machine) == before


def test_response_needs_at_least_one_choice() -> None:
    with pytest.raises(ValueError, match="n=0"):
        StreamMachine(header(n=0))


def test_header_is_kept() -> None:
    h = header(n=2)
    assert StreamMachine(h).header is h


# --- stateful property ------------------------------------------------------------


class StreamMachineRules(RuleBasedStateMachine):
    """Random event sequences, legal or not, against an independent model."""

    machine: StreamMachine
    frames: list[bytes]

    @initialize(
        endpoint=st.sampled_from(Endpoint),
        n=st.integers(1, 3),
        include_usage=st.booleans(),
    )
    def setup(self, endpoint: Endpoint, n: int, include_usage: bool) -> None:
        self.header = header(endpoint, n, include_usage)
        self.machine = StreamMachine(self.header)
        self.frames = []
        self.started = False
        self.terminal: str | None = None
        self.finished: set[int] = set()

    def _open(self, index: int) -> bool:
        return (
            self.started
            and self.terminal is None
            and 0 <= index < self.header.n
            and index not in self.finished
        )

    def _apply(self, event: StreamEvent | Start, legal: bool) -> None:
        before = snapshot(self.machine)
        if not legal:
            with pytest.raises(LocalProtocolError):
                send(self.machine, event)
            assert snapshot(self.machine) == before
            return
        self.frames += send(self.machine, event)

    @rule()
    def start(self) -> None:
        legal = not self.started and self.terminal is None
        self._apply(Start(), legal)
        if legal:
            self.started = True

    @rule(index=st.integers(-1, 3), text=st.sampled_from(["", "a", "é\n", "[DONE]"]))
    def delta(self, index: int, text: str) -> None:
        self._apply(Delta(index, text), self._open(index))

    @rule(index=st.integers(-1, 3), reason=st.sampled_from(FinishReason))
    def finish(self, index: int, reason: FinishReason) -> None:
        legal = self._open(index)
        self._apply(Finish(index, reason), legal)
        if legal:
            self.finished.add(index)

    @rule(prompt=st.integers(0, 5), completion=st.integers(0, 5))
    def end(self, prompt: int, completion: int) -> None:
        legal = (
            self.started
            and self.terminal is None
            and len(self.finished) == self.header.n
        )
        self._apply(End(Usage(prompt, completion)), legal)
        if legal:
            self.terminal = "finished"

    @rule()
    def fail(self) -> None:
        legal = self.terminal is None
        self._apply(Fail("boom", code="engine_error"), legal)
        if legal:
            self.terminal = "errored"

    @rule()
    def heartbeat(self) -> None:
        self._apply(Heartbeat(), self.terminal is None)

    @invariant()
    def end_state_matches_the_model(self) -> None:
        expected = {None: None, "finished": EndState.FINISHED}
        expected["errored"] = EndState.ERRORED
        assert self.machine.end_state == expected[self.terminal]

    @invariant()
    def frames_keep_the_wire_rules(self) -> None:
        decoder = SSEDecoder()
        events = decoder.feed(b"".join(self.frames))
        assert not decoder.pending
        data = [event.data for event in events]
        # [DONE] at most once, and last; an error event is last and has no [DONE].
        assert data.count("[DONE]") <= 1
        if "[DONE]" in data:
            assert data[-1] == "[DONE]"
        objects = [orjson.loads(d) for d in data if d != "[DONE]"]
        errors = [i for i, obj in enumerate(objects) if "error" in obj]
        assert len(errors) <= 1
        if errors:
            assert errors[0] == len(objects) - 1
            assert "[DONE]" not in data
        chunks = [obj for obj in objects if "error" not in obj]
        finished: set[int] = set()
        for position, chunk in enumerate(chunks):
            assert (chunk["id"], chunk["created"], chunk["model"]) == (
                "id-1",
                1700000000,
                "m",
            )
            assert ("usage" in chunk) == (
                self.header.include_usage or chunk["choices"] == []
            )
            if chunk["choices"] == []:
                # The usage chunk: last chunk, right before [DONE].
                assert position == len(chunks) - 1
                assert data[-1] == "[DONE]"
                continue
            (choice,) = chunk["choices"]
            assert choice["index"] not in finished, "nothing after a finish_reason"
            if choice["finish_reason"] is not None:
                finished.add(choice["index"])
        if "[DONE]" in data:
            assert len(finished) == self.header.n


TestStreamMachineRules = StreamMachineRules.TestCase
TestStreamMachineRules.settings = settings(max_examples=150, stateful_step_count=30)
