"""The resume and cancel endpoints of chat and completions streams.

``GET /v1/chat/completions/{id}/events`` (and completions): the log after the
cursor in ``Last-Event-ID`` (or ``?after=``), then the live tail. Unknown id,
another key's log and an expired one answer the same 404; an evicted cursor
410 (``cursor_evicted``); a malformed cursor 400; a cursor at or past the end
of a log that has ended 400 (``cursor_past_end``). ``POST .../{id}/cancel``
aborts a stream its client gave up on on purpose. Each reads the request and
asks ``ResumableStreams``; the paths' prefix (``chatcmpl-`` or ``cmpl-``) must
match the id's.

Spec: WHATWG HTML, "9.2 Server-sent events", "Last-Event-ID";
docs/resumable-streams.md.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sluicegate.core.errors import RequestError
from sluicegate.server.http.answers import error_answer, json_answer
from sluicegate.server.http.errors import NotFound
from sluicegate.server.resumable.log_response import LogStreamResponse
from sluicegate.server.resumable.requests import NOT_FOUND, owner_of, parse_cursor
from sluicegate.server.resumable.streams import ResumableStreams

__all__ = ["ResumableRoutes"]


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
            out); the resume endpoint's 404 otherwise (unknown, another key's,
            ended, or produced by another replica).
        """
        response_id = request.path_params["response_id"]
        prefix = "cmpl-" if request.scope["path"].startswith("/v1/completions") else ""
        if not response_id.startswith(
            prefix or "chatcmpl-"
        ) or not self._streams.cancel_own(response_id, owner_of(request)):
            return error_answer(NotFound(NOT_FOUND))  # ended ones too, task or not
        return json_answer({"id": response_id, "cancelled": True})
