"""``StreamMachine.outcome``: the end state from the shell's write reports.

The shell feeds events, then reports ``wrote()`` (everything so far reached the
connection) or ``write_failed()`` (writing stopped). ``outcome`` must be what
the client's ``StreamAssembler`` makes of exactly the bytes reported written.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.client.assemble import StreamAssembler
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
from sluicegate.core.wire.stream import StreamMachine

STOP = FinishReason.STOP


def header(n: int = 1, endpoint: Endpoint = Endpoint.CHAT) -> ResponseHeader:
    return ResponseHeader("id-1", 1700000000, "m", endpoint, n, True)


def outcome(machine: StreamMachine) -> EndState:
    return machine.outcome  # read through a call: mypy narrows a property


def test_a_stream_is_truncated_until_its_done_is_written() -> None:
    machine = StreamMachine(header())
    machine.start()
    machine.wrote()
    assert machine.outcome is EndState.TRUNCATED
    machine.feed(Delta(0, "hi"))
    machine.feed(Finish(0, STOP))
    machine.feed(End(Usage(1, 1)))
    assert (machine.end_state, machine.outcome) == (
        EndState.FINISHED,
        EndState.TRUNCATED,
    )
    machine.wrote()
    assert outcome(machine) is EndState.FINISHED
    machine.write_failed()  # the client leaves after [DONE]: still finished
    assert outcome(machine) is EndState.FINISHED


def test_a_failed_write_before_the_end_is_aborted() -> None:
    machine = StreamMachine(header())
    machine.start()
    machine.feed(Finish(0, STOP))
    machine.wrote()
    machine.feed(End(Usage(1, 1)))  # [DONE], never written
    machine.write_failed()
    machine.write_failed()  # idempotent
    assert machine.outcome is EndState.ABORTED


def test_an_error_event_written_is_errored_even_if_the_client_leaves() -> None:
    machine = StreamMachine(header())
    machine.start()
    machine.feed(Fail("boom", code="engine_error"))
    machine.wrote()
    machine.write_failed()
    assert machine.outcome is EndState.ERRORED


def test_wrote_after_write_failed_raises_and_changes_nothing() -> None:
    machine = StreamMachine(header())
    machine.start()
    machine.feed(Finish(0, STOP))
    machine.feed(End(Usage(1, 1)))
    machine.write_failed()
    with pytest.raises(LocalProtocolError, match="after write_failed"):
        machine.wrote()
    assert machine.outcome is EndState.ABORTED


def _legal_events(n: int, data: st.DataObject) -> list[StreamEvent]:
    """A well-formed stream of ``n`` choices, cut short or failed at random."""
    draw = data.draw
    events: list[StreamEvent] = []
    open_choices = list(range(n))
    while open_choices:
        index = draw(st.sampled_from(open_choices))
        kind = draw(st.sampled_from(["finish", "delta", "delta", "beat"]))
        if kind == "delta":
            events.append(Delta(index, draw(st.text(max_size=3))))
        elif kind == "finish":
            events.append(Finish(index, STOP))
            open_choices.remove(index)
        else:
            events.append(Heartbeat())
    events.append(End(Usage(1, 1)))
    cut = draw(st.integers(0, len(events)))
    events = events[:cut]
    ended = bool(events) and isinstance(events[-1], End)
    if not ended and draw(st.booleans()):
        events.append(Fail("boom", code="engine_error"))
    return events


@given(data=st.data())
def test_the_outcome_is_what_the_client_makes_of_the_bytes_written(
    data: st.DataObject,
) -> None:
    n = data.draw(st.integers(1, 3))
    endpoint = data.draw(st.sampled_from(list(Endpoint)))
    events = _legal_events(n, data)
    # Per step: feed the event, then report "wrote" (True), "failed" (False) or
    # nothing yet (None: the frames wait for a later report).
    reports = data.draw(
        st.lists(
            st.sampled_from([True, None, None, False]),
            min_size=len(events) + 1,
            max_size=len(events) + 1,
        )
    )
    machine = StreamMachine(header(n, endpoint))
    written: list[bytes] = []
    unreported = machine.start()
    gone = False
    for i in range(len(events) + 1):
        if i:
            unreported += machine.feed(events[i - 1])
        report = reports[i]
        if report is True:
            machine.wrote()
            written += unreported
            unreported = []
        elif report is False:
            machine.write_failed()
            gone = True
            break
    assembler = StreamAssembler(n)
    assembler.head(200, {}, 0.0)
    assembler.feed(b"".join(written), 0.0)
    seen = assembler.flush(0.0, client_gone=gone).end_state
    assert machine.outcome is seen
