"""A stored, non-streamed response answered whole once its log has ended.

A Responses request with ``stream: false`` that is stored (``store`` or
``background``) is generated as a resumable stream like any other; its client
is answered one JSON object: ``WholeFromLog`` reads the log to its end (waiting
on from the end when the log's bound drops frames under it), then answers the
final ``response`` object its record keeps (200), or its error (500). The
response's ledger row has the status of this answer.

Spec: OpenAI API reference, "Responses": "Create a model response";
docs/apis.md.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from starlette.types import Receive, Scope, Send

from sluicegate.server.apis.response_store import StoredResponses
from sluicegate.server.http.answers import error_answer, json_answer
from sluicegate.server.http.errors import (
    CLIENT_CLOSED,
    CursorEvicted,
    ResponseFailed,
    StoreError,
)
from sluicegate.server.resumable.log_response import LogStreamResponse
from sluicegate.server.streaming.disconnect import DisconnectRace

__all__ = ["WholeFromLog"]


class WholeFromLog:
    """An ASGI app: a stored, non-streamed response answered whole once its log
    ended: its final ``response`` object as kept in its record (200; a
    ``failed`` one as its error, 500). A client that leaves stops the reading;
    the response keeps running for the grace period (it is stored: it can be
    retrieved). The reader only waits for the log's end: when the log's bound
    drops frames under it, it follows the log from its end on instead. The
    response's ledger row has the status of this answer (499 when the client
    left first), recorded once both it and the stream ended.

    Args:
        reader: the log's first reader (from ``ResumableStreams.start``).
        stored: the store of the response's record.
        owner: the key id the response belongs to.
    """

    def __init__(
        self, reader: LogStreamResponse, stored: StoredResponses, owner: str
    ) -> None:
        self._reader = reader
        self._stored = stored
        self._owner = owner
        # The row of the response waits for this answer's status (499 when the
        # client leaves first), if this is its first request's answer.
        self._answered = reader.answered

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Read the log to its end, then answer."""
        status = CLIENT_CLOSED
        try:
            status = await self._answer(scope, receive, send)
        finally:
            if self._answered is not None:
                self._answered(status)

    async def _answer(self, scope: Scope, receive: Receive, send: Send) -> int:
        """The answer's status, or ``CLIENT_CLOSED`` when nothing was sent."""
        response_id, owner = self._reader.response_id, self._owner
        last: dict[str, Any] | None = None
        reader: LogStreamResponse | None = self._reader
        with DisconnectRace(receive) as race:
            while reader is not None:
                try:
                    async for frame in reader.frames():
                        if frame.startswith(_TERMINAL):
                            data = frame[frame.index(b"\ndata: ") + 7 :]
                            last = json.loads(data)["response"]
                    break
                except CursorEvicted:  # trimmed under it: wait on from the end
                    reader = await self._stored.follow(response_id, owner)
                except StoreError:  # the producer or the shared store is gone
                    break
        if race.reason is not None:
            return CLIENT_CLOSED
        try:
            record = await self._stored.record_of(response_id, owner)
        except StoreError:
            record = None
        final = record["response"] if record is not None else None
        final = final or (None if last is None else {**last, "background": False})
        if final is None or final["status"] == "failed":
            error = (final or {}).get("error") or {}
            failed = ResponseFailed(
                error.get("message", "The response ended without its last event"),
                error.get("code", "server_error"),
            )
            answer = error_answer(failed)
        else:
            answer = json_answer(final)
        with contextlib.suppress(OSError):  # the status went out (or not)
            await answer(scope, receive, send)
        return answer.status_code


_TERMINAL = (
    b"event: response.completed\n",
    b"event: response.incomplete\n",
    b"event: response.failed\n",
)
