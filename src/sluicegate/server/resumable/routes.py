"""The resume and cancel endpoints of chat and completions streams.

``GET /v1/chat/completions/{id}/events`` (and completions): the log after the
cursor in ``Last-Event-ID`` (or ``?after=``), then the live tail. Unknown id,
another key's log and an expired one answer the same 404; an evicted cursor
410 (``cursor_evicted``); a malformed cursor 400; a cursor at or past the end
of a log that has ended 400 (``cursor_past_end``). ``POST .../{id}/cancel``
aborts a stream its client gave up on on purpose (one that another replica
produces, with a shared store, through that store's cancel channel, as the
Responses API's cancel does); one that has ended while its log is kept is a
409 (``stream_finished``) that says so, as OpenAI's API
refuses to cancel a completed background response (a 400 there: a conflict
with the stream's state is what 409 says). Each reads the request and asks
``ResumableStreams``; the paths' prefix (``chatcmpl-`` or ``cmpl-``) must
match the id's.

Spec: WHATWG HTML, "9.2 Server-sent events", "Last-Event-ID"; OpenAI API
reference, "Cancel a response"; docs/resumable-streams.md.
"""

from __future__ import annotations

from typing import Literal

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sluicegate.core.errors import RequestError
from sluicegate.server.http.answers import error_answer, json_answer
from sluicegate.server.http.errors import Conflict, LogNotFound, NotFound, StoreError
from sluicegate.server.resumable.log_response import LogStreamResponse
from sluicegate.server.resumable.requests import NOT_FOUND, owner_of, parse_cursor
from sluicegate.server.resumable.streams import ResumableStreams
from sluicegate.server.stores.event_store import EventStore

__all__ = ["STREAM_FINISHED", "ResumableRoutes"]

STREAM_FINISHED = "stream_finished"
"""Error code of the 409 for a cancel of a stream that has ended."""

_PAST_ANY = 10**15  # past any frame (a seq has 12 digits at most): reads none


def _finished(response_id: str) -> Conflict:
    """The 409 of a cancel of a resumable stream that has ended (its log kept)."""
    return Conflict(
        f"The stream {response_id[:80]!r} has already finished: there is nothing"
        " to cancel (its events can still be read from its events endpoint until"
        " it expires)",
        code=STREAM_FINISHED,
    )


class ResumableRoutes:
    """The resume and cancel endpoints over one ``ResumableStreams``."""

    def __init__(self, streams: ResumableStreams) -> None:
        self._streams = streams

    def routes(self) -> list[Route]:
        """The four routes: events and cancel, of chat and of completions."""
        return [
            Route(f"{base}/{{response_id}}/{name}", endpoint, methods=[method])
            for name, endpoint, method in (
                ("events", self.events, "GET"),
                ("cancel", self.cancel, "POST"),
            )
            for base in ("/v1/chat/completions", "/v1/completions")
        ]

    async def events(self, request: Request) -> Response | LogStreamResponse:
        """``GET /v1/{chat/completions,completions}/{id}/events``: resume.

        Returns:
            The log after the cursor, then its live tail (200, event stream);
            404 (the same body for an unknown id, another key's, an expired
            one, a stream that was not resumable); 410 ``cursor_evicted``;
            400 for a malformed cursor.
        """
        response_id = request.path_params["response_id"]
        prefix = "cmpl-" if request.scope["path"].startswith("/v1/completions") else ""
        cursor, param = request.headers.get("last-event-id"), "Last-Event-ID"
        if cursor is None:
            cursor, param = request.query_params.get("after", ""), "after"
        if not response_id.startswith(prefix or "chatcmpl-"):
            return error_answer(NotFound(NOT_FOUND))
        try:
            after = parse_cursor(cursor, response_id, param)
        except RequestError as exc:
            return error_answer(exc)
        return await self._streams.resume(response_id, owner_of(request), after, param)

    async def cancel(self, request: Request) -> Response:
        """``POST /v1/{chat/completions,completions}/{id}/cancel``: stop a stream.

        Returns:
            200 ``{"id": ..., "cancelled": true}`` when this server produces
            that stream for this key (it is aborted now, as if its grace ran
            out), or another replica does and the shared store's cancel
            channel took the request (that replica aborts it when it gets it);
            409 ``stream_finished`` when this key's stream has ended (on its
            own or by an earlier cancel) and its log is kept; 503 when a shared
            store cannot be reached; the resume endpoint's 404 otherwise
            (unknown, another key's, expired).
        """
        response_id = request.path_params["response_id"]
        prefix = "cmpl-" if request.scope["path"].startswith("/v1/completions") else ""
        if not response_id.startswith(prefix or "chatcmpl-"):
            return error_answer(NotFound(NOT_FOUND))
        owner = owner_of(request)
        if self._streams.cancel_own(response_id, owner):
            return json_answer({"id": response_id, "cancelled": True})
        try:
            state = await _log_state(self._streams.store, response_id, owner)
            asked = state == "live" and await self._streams.ask_cancel(response_id)
        except StoreError as exc:
            return self._streams.unavailable(exc)
        if asked:  # produced by another replica: it got the request
            return json_answer({"id": response_id, "cancelled": True})
        if state == "ended":
            return error_answer(_finished(response_id))
        return error_answer(NotFound(NOT_FOUND))


async def _log_state(
    store: EventStore, response_id: str, owner: str
) -> Literal["live", "ended"] | None:
    """Whether ``owner``'s log of ``response_id`` is kept, and whether it has
    ended: a read past its last frame ends at once for a finished log, and
    gives a first (empty) batch for a live one (``EventStore.read``)."""
    reads = store.read(response_id, owner, _PAST_ANY)
    try:
        await anext(reads)
    except StopAsyncIteration:
        return "ended"
    except LogNotFound:
        return None
    finally:
        await reads.aclose()
    return "live"
