"""Every frame of an event stream goes through its numbered ``EventLog``.

With frames retained, ``replay(0)`` of the log is exactly the body that went on
the wire (after the status line), frame for frame, whichever writer wrote it.
"""

from __future__ import annotations

from typing import Any

import pytest

from sluicegate.engines.scripted import ScriptedEngine
from sluicegate.server.app import create_app
from sluicegate.server.config import ServerConfig
from sluicegate.server.sse_response import EventStreamResponse

from .asgi import CHAT, COMPLETIONS, HELLO, exchange

pytestmark = pytest.mark.anyio


@pytest.fixture
def responses(monkeypatch: pytest.MonkeyPatch) -> list[EventStreamResponse]:
    """Every ``EventStreamResponse`` made while the test runs."""
    made: list[EventStreamResponse] = []
    init = EventStreamResponse.__init__

    def recording(self: EventStreamResponse, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(EventStreamResponse, "__init__", recording)
    return made


@pytest.mark.parametrize(
    ("engine_options", "path", "body"),
    [
        ({}, CHAT, {"messages": HELLO, "n": 2}),
        ({}, COMPLETIONS, {"prompt": "Hi", "stream_options": {"include_usage": True}}),
        ({"fail_at_step": 3}, CHAT, {"messages": HELLO}),
    ],
)
async def test_the_retained_log_is_the_body_on_the_wire(
    responses: list[EventStreamResponse],
    engine_options: dict[str, Any],
    path: str,
    body: dict[str, Any],
) -> None:
    engine = ScriptedEngine(tokens_per_s=5000, **engine_options)
    app = create_app(engine, ServerConfig(stream_retain_frames=10_000))
    ex = await exchange(app, path, {**body, "stream": True})
    (response,) = responses
    log = response.log
    frames = log.replay(0)
    assert b"".join(frames) == ex.body
    assert len(frames) == log.taken_seq == log.appended_seq  # nothing left untaken
    assert all(frame.endswith(b"\n\n") for frame in frames)


async def test_without_retention_the_log_keeps_nothing_but_counts_every_frame(
    responses: list[EventStreamResponse],
) -> None:
    app = create_app(ScriptedEngine(tokens_per_s=5000), ServerConfig())
    ex = await exchange(app, CHAT, {"messages": HELLO, "stream": True})
    log = responses[0].log
    assert log.taken_seq == len(ex.events()) > 3
    assert log.replay(log.taken_seq) == []
