"""The ledger's end state is what the client's ``classify()`` makes of its bytes.

Random streams (endpoint, choices, usage, script, stop string, ``max_tokens``, an
engine failure at some step) meet random faults at some body message: the client
leaves, its connection breaks, ``send`` has a bug, or a timeout or the shutdown
puts its ``Fail`` into the stream. Whatever happens, the ledger row's end state
equals the client's ``StreamAssembler`` result on the body bytes it received,
with either writer, and no engine sequence is left running.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.types import Message

from sluicegate.client.assemble import StreamAssembler
from sluicegate.core.endstate import EndState
from sluicegate.core.events import Fail
from sluicegate.engines.scripted.engine import ScriptedEngine
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig
from sluicegate.server.http.errors import REQUEST_TIMEOUT, SERVER_SHUTDOWN
from sluicegate.server.ledger.ledger import Ledger
from sluicegate.server.streaming.buffer import LiveStreams
from sluicegate.server.streaming.sse_response import EventStreamResponse

from .asgi import CHAT, COMPLETIONS, HELLO, Exchange

WRITERS = {"eager": True, "task": False}


@contextlib.contextmanager
def writing_with(eager: bool) -> Iterator[None]:
    """``EventStreamResponse`` writes unpaced streams eagerly or not inside."""
    before = EventStreamResponse.eager
    EventStreamResponse.eager = eager
    try:
        yield
    finally:
        EventStreamResponse.eager = before


@dataclass(frozen=True)
class Fault:
    """What happens at body message ``at`` (0: the role chunk, or the first
    frame of a completions stream)."""

    kind: str  # leave | reset | bug | timeout | shutdown
    at: int


_FAIL_OF_KIND = {
    "timeout": Fail("The request did not complete within 1 s", code=REQUEST_TIMEOUT),
    "shutdown": Fail("The server is shutting down", code=SERVER_SHUTDOWN),
}


class FaultyExchange(Exchange):
    """An ``Exchange`` whose ``send`` meets ``fault`` at its body message."""

    def __init__(
        self, app: Starlette, path: str, payload: Any, fault: Fault | None
    ) -> None:
        super().__init__(app, path, payload)
        self.fault = fault
        self.attempts = 0
        self.client_gone = False
        self._live: LiveStreams = app.state.live

    async def _send(self, message: Message) -> None:
        fault = self.fault
        if message["type"] != "http.response.body" or fault is None:
            await super()._send(message)
            return
        n, self.attempts = self.attempts, self.attempts + 1
        if n != fault.at:
            await super()._send(message)
        elif fault.kind == "leave":  # after this message: the watcher wakes
            await super()._send(message)
            self.client_gone = True
            self.leave()
        elif fault.kind == "reset":
            self.client_gone = True
            self.leave()
            raise OSError("connection reset by peer")
        elif fault.kind == "bug":
            raise RuntimeError("a bug in send")
        else:  # a timer's Fail, as the deadlines and the drain put it
            await super()._send(message)
            loop = asyncio.get_running_loop()
            for buffer in self._live.buffers:
                loop.call_soon(buffer.put, _FAIL_OF_KIND[fault.kind])


@st.composite
def streams(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any], Fault | None]:
    """(engine keyword arguments, request body, fault)."""
    chat = draw(st.booleans())
    text = draw(st.text(alphabet="ab cé😀\n", max_size=10))
    engine: dict[str, Any] = {
        "script": text + draw(st.sampled_from(["<end_of_turn>", ""])),
        "tokens_per_s": 20_000,
    }
    if draw(st.booleans()):
        engine["fail_at_step"] = draw(st.integers(0, 6))
    body: dict[str, Any] = {"stream": True, "n": draw(st.integers(1, 2))}
    if chat:
        body["messages"] = HELLO
    else:
        body["prompt"] = "Hi"
    if draw(st.booleans()):
        body["stream_options"] = {"include_usage": True}
    if draw(st.booleans()):
        body["max_tokens"] = draw(st.integers(1, 8))
    if draw(st.booleans()):
        body["stop"] = [draw(st.text(alphabet="ab c", min_size=1, max_size=2))]
    fault = draw(
        st.none()
        | st.builds(
            Fault,
            st.sampled_from(["leave", "reset", "bug", "timeout", "shutdown"]),
            st.integers(0, 8),
        )
    )
    return engine, body, fault


async def _run(
    engine_kwargs: dict[str, Any], body: dict[str, Any], fault: Fault | None
) -> None:
    engine = ScriptedEngine(**engine_kwargs)
    app = create_app(engine, ServerConfig())
    path = CHAT if "messages" in body else COMPLETIONS
    ex = FaultyExchange(app, path, body, fault)
    await asyncio.wait_for(ex.run(), 5)
    assert ex.status == 200
    assembler = StreamAssembler(body["n"])
    assembler.head(200, {}, 0.0)
    assembler.feed(ex.body, 0.0)
    seen = assembler.flush(0.0, client_gone=ex.client_gone).end_state
    ledger: Ledger = app.state.ledger
    assert ledger.rows[-1].end_state is seen, (ex.body, fault)
    assert seen is not EndState.REJECTED
    stats = engine.stats()
    assert (stats.running, stats.kv_cells_used) == (0, 0)


@pytest.mark.parametrize("writer", sorted(WRITERS))
@settings(max_examples=60)
@given(stream=streams())
def test_the_ledger_end_state_is_what_the_client_classifies(
    writer: str, stream: tuple[dict[str, Any], dict[str, Any], Fault | None]
) -> None:
    engine_kwargs, body, fault = stream
    with writing_with(WRITERS[writer]):
        asyncio.run(_run(engine_kwargs, body, fault))
