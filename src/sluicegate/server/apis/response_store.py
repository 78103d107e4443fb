"""Stored Responses: what the Responses API keeps of a response, and reads back.

A stored response (``store: true``, or ``background: true``, or the server's
``store_responses`` default) is generated as a resumable stream
(``server/resumable/streams.py``): its events go to the log, whoever reads them. With
the log, the store keeps one record (``EventStore.set_record``), a JSON object:

::

    {"input": [items...],        the whole input: the previous response's
                                 input and output, then this request's own
     "created_at": s, "model": m, "background": bool,
     "echo": {...},              the request fields its object repeats
     "response": {...} | null}   the final response object, once it ended

so that a record is bounded by what one request may send plus what one
response may write, and a ``previous_response_id`` is one read, however long
the chain. The record lives, expires and is deleted with the log: the same
TTL, the same owner check, the same bound on the whole store.

``StoredResponses`` serves the routes over it: ``retrieve`` (the object, or
``?stream=true&starting_after=N``: the log after event ``N``, then the live
tail; the Responses stream numbers its events from 0, as the log numbers its
frames), ``cancel`` (the producer is aborted; the response ends ``cancelled``;
one that ended otherwise is a 400, as OpenAI's API answers), ``delete``.
Unknown ids, another key's and expired ones get the same 404. A
stored response not streamed to its client is answered whole by
``whole_from_log.py``.

Deliberate divergences: a response is stored only when asked (``store``
defaults to the server's ``store_responses``, off: nothing is kept for a
request that did not ask), and only for the store's TTL (``resume_ttl_s``).
While a response runs, ``retrieve`` answers ``in_progress`` with no output
items (the items so far are in its event stream). ``cancel`` (and ``delete``
of a running response) stops it on the replica that produces it, over the
store (``RemoteCancel``, Redis pub/sub), and waits up to ``CANCEL_WAIT_S`` for
its end; a response that does not end in time answers 409.

Spec: OpenAI API reference, "Responses": "Get a model response", "Cancel a
response", "Delete a model response", "Background mode"; docs/apis.md.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from sluicegate.core.errors import RequestError
from sluicegate.core.wire.chunks import Endpoint, ResponseHeader, dumps
from sluicegate.core.wire.contracts import Wire
from sluicegate.core.wire.responses import ResponsesStream, response_object
from sluicegate.engines.clocks import Deadline, Timers
from sluicegate.server.http.answers import error_answer, json_answer
from sluicegate.server.http.errors import NotFound, ProducedElsewhere, StoreError
from sluicegate.server.resumable.log_response import LogStreamResponse
from sluicegate.server.resumable.requests import owner_of
from sluicegate.server.resumable.streams import ResumableStreams

__all__ = [
    "CANCEL_WAIT_S",
    "Record",
    "StoredResponses",
    "final_snapshot",
]

PAST_END = 1 << 62
"""A cursor past any log's last frame: a reader from there reads only its end."""

CANCEL_WAIT_S = 5.0
"""Longest a cancel (or a delete) of a running response waits for its end."""

_ENDED = ("completed", "incomplete", "failed", "cancelled")
_NOT_FOUND_MESSAGE = "No response found with id '{}'"


def _not_found(response_id: str) -> str:
    return _NOT_FOUND_MESSAGE.format(response_id[:80])


class Record:
    """A stored response's record (see the module doc), as JSON bytes."""

    @staticmethod
    def new(
        header: ResponseHeader, items: Sequence[dict[str, Any]], background: bool
    ) -> dict[str, Any]:
        """The record of a response that has just started."""
        return {
            "input": list(items),
            "created_at": header.created,
            "model": header.model,
            "background": background,
            "echo": dict(header.echo or {}),
            "response": None,
        }

    @staticmethod
    def parse(raw: bytes) -> dict[str, Any]:
        """The record kept as ``raw``."""
        record: dict[str, Any] = json.loads(raw)
        return record


def final_snapshot(machine: Wire) -> dict[str, Any] | None:
    """The ``response`` object the Responses machine wrote last, when that one
    ended the response (``None`` otherwise: the writing stopped before)."""
    if not isinstance(machine, ResponsesStream):
        return None
    snapshot = machine.snapshot
    if snapshot is None or snapshot.get("status") not in _ENDED:
        return None
    return snapshot


class StoredResponses:
    """The stored-response routes over the app's resumable streams.

    Args:
        resumable: the registry of resumable streams and their store.

    Attributes:
        timers: the clock of a cancel's wait (``None``: the running loop).
    """

    timers: Timers | None = None

    def __init__(self, resumable: ResumableStreams) -> None:
        self._resumable = resumable

    async def keep(
        self,
        header: ResponseHeader,
        items: Sequence[dict[str, Any]],
        background: bool,
    ) -> dict[str, Any]:
        """Keep the record of a response whose log was just created; returns it
        (``ended`` fills in its final ``response``)."""
        record = Record.new(header, items, background)
        await self._resumable.store.set_record(header.id, dumps(record))
        return record

    async def ended(self, record: dict[str, Any], machine: Wire) -> None:
        """The response's log is finished: keep its final ``response`` object."""
        snapshot = final_snapshot(machine)
        if snapshot is None:  # the server stopped under it: in_progress forever
            header = machine.header
            error = {"code": "server_error", "message": "The server stopped"}
            snapshot = response_object(header, "failed", [], error=error)
        record["response"] = {**snapshot, "background": record["background"]}
        await self._resumable.store.set_record(machine.header.id, dumps(record))

    async def history(self, previous_id: str, owner: str) -> list[dict[str, Any]]:
        """The items a request with ``previous_response_id`` continues: that
        response's whole input, then its output.

        Raises:
            RequestError: 400 (``previous_response_id``): not found (unknown,
                another key's, expired, never stored) or not ended yet.
        """
        record = await self.record_of(previous_id, owner)
        if record is None:
            raise RequestError(
                f"Previous response with id '{previous_id[:80]}' not found"
                " (responses are kept only when stored, for a limited time)",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        final = record["response"]
        if final is None:
            raise RequestError(
                f"Previous response with id '{previous_id[:80]}' is still in"
                " progress; continue it once it ended",
                param="previous_response_id",
                code="previous_response_in_progress",
            )
        return [*record["input"], *final["output"]]

    async def retrieve(self, request: Request) -> Response | LogStreamResponse:
        """``GET /v1/responses/{id}``: the response object; with
        ``?stream=true``, its events after ``starting_after`` (or the cursor in
        ``Last-Event-ID``), then the live tail.

        Returns:
            200; 404 (unknown, another key's, expired, not stored); 400 for a
            malformed ``starting_after``; 410 when those events were dropped
            (the log's bound); 503 when the shared store cannot be reached.
        """
        response_id = request.path_params["response_id"]
        owner = owner_of(request)
        query = request.query_params
        if query.get("stream", "false").lower() == "true":
            try:
                after, param = _starting_after(request, response_id)
            except RequestError as exc:
                return error_answer(exc)
            if not response_id.startswith("resp_"):
                return error_answer(NotFound(_not_found(response_id)))
            return await self._resumable.resume(
                response_id, owner, after, param, _not_found(response_id)
            )
        return await self.current(response_id, owner)

    async def current(self, response_id: str, owner: str) -> Response:
        """The response object as it stands (200), or the 404 (503: the shared
        store cannot be reached)."""
        try:
            record = await self.record_of(response_id, owner)
        except StoreError as exc:
            return self._resumable.unavailable(exc)
        if record is None:
            return error_answer(NotFound(_not_found(response_id)))
        return json_answer(_current(response_id, record))

    async def cancel(self, request: Request) -> Response:
        """``POST /v1/responses/{id}/cancel``: abort a running response.

        Returns:
            200 with the response object, ``cancelled`` (by this call, or by an
            earlier one: cancelling twice answers the same object, as OpenAI's
            background mode does); 400 ``invalid_request_error`` for one that
            ended otherwise (completed, incomplete, failed), as OpenAI's API
            answers ("Cannot cancel a completed response.", or "... a
            synchronous response." for one not created with ``background``);
            404 as for ``retrieve``; 409 when another replica produces it and
            it did not end within ``CANCEL_WAIT_S``.
        """
        response_id = request.path_params["response_id"]
        try:
            ended = await self._ended(response_id, owner_of(request))
        except StoreError as exc:
            return self._resumable.unavailable(exc)
        if isinstance(ended, Response):
            return ended
        final = _current(response_id, ended)
        if final["status"] != "cancelled":
            refusal = RequestError(_cannot_cancel(ended["background"], final["status"]))
            return error_answer(refusal, endpoint=Endpoint.RESPONSES)
        return json_answer(final)

    async def delete(self, request: Request) -> Response:
        """``DELETE /v1/responses/{id}``: forget a response (a running one is
        cancelled first).

        Returns:
            200 ``{"id", "object": "response", "deleted": true}``; 404 and 409
            as for ``cancel``.
        """
        response_id = request.path_params["response_id"]
        owner = owner_of(request)
        try:
            ended = await self._ended(response_id, owner)
            if isinstance(ended, Response):
                return ended
            deleted = await self._resumable.store.delete(response_id, owner)
        except StoreError as exc:
            return self._resumable.unavailable(exc)
        if not deleted:
            return error_answer(NotFound(_not_found(response_id)))
        return json_answer({"id": response_id, "object": "response", "deleted": True})

    async def _ended(self, response_id: str, owner: str) -> dict[str, Any] | Response:
        """The record of ``owner``'s response once it ended (a running one is
        stopped first, ``_stopped``), or the answer that says why there is none:
        404, or 409 when it did not end in time.

        Raises:
            StoreError: the shared store cannot be reached.
        """
        record = await self.record_of(response_id, owner)
        if record is not None and record["response"] is None:
            record = await self._stopped(response_id, owner)
        if record is None:  # unknown, another key's, expired, or deleted meanwhile
            return error_answer(NotFound(_not_found(response_id)))
        if record["response"] is None:
            return error_answer(ProducedElsewhere(response_id))
        return record

    async def _stopped(self, response_id: str, owner: str) -> dict[str, Any] | None:
        """Cancel a running response, here or on the replica that produces it,
        and wait up to ``CANCEL_WAIT_S`` for its end; its record then (still
        without a final ``response`` when it did not end in time)."""
        resumable = self._resumable
        if not await resumable.stop(response_id, owner):
            if not await resumable.ask_cancel(response_id):
                return await self.record_of(response_id, owner)
            timers = self.timers or asyncio.get_running_loop()
            deadline = Deadline(timers, CANCEL_WAIT_S)
            while not deadline.expired:
                record = await self.record_of(response_id, owner)
                if record is None or record["response"] is not None:
                    return record
                await asyncio.sleep(0.02)
        return await self.record_of(response_id, owner)

    async def follow(self, response_id: str, owner: str) -> LogStreamResponse | None:
        """A reader of ``owner``'s log from its end on (it reads no frame: it
        ends with the log); ``None`` when the log cannot be read."""
        answer = await self._resumable.resume(response_id, owner, PAST_END, own=True)
        return answer if isinstance(answer, LogStreamResponse) else None

    async def record_of(self, response_id: str, owner: str) -> dict[str, Any] | None:
        """``owner``'s record of ``response_id``, or ``None``.

        Raises:
            StoreError: the shared store cannot be reached.
        """
        raw = await self._resumable.store.record(response_id, owner)
        return None if raw is None else Record.parse(raw)


def _current(response_id: str, record: dict[str, Any]) -> dict[str, Any]:
    """The response object as it stands: the final one, or ``in_progress``."""
    final = record["response"]
    if final is not None:
        return dict(final)
    header = ResponseHeader(
        response_id,
        record["created_at"],
        record["model"],
        Endpoint.RESPONSES,
        echo=record.get("echo"),
    )
    return {
        **response_object(header, "in_progress", []),
        "background": record["background"],
    }


def _cannot_cancel(background: bool, status: str) -> str:
    """Why a response that ended without a cancel cannot be cancelled, in
    OpenAI's words where they are known (only background ones can be)."""
    if not background:
        return "Cannot cancel a synchronous response."
    if status == "completed":
        return "Cannot cancel a completed response."
    return f"Cannot cancel a response that has ended ({status})."


def _starting_after(request: Request, response_id: str) -> tuple[int, str]:
    """The sequence number to resume after and the parameter that named it:
    the cursor of ``Last-Event-ID`` (``<id>.<seq>``), else ``starting_after``,
    else ``-1`` (from the first event). The header wins, as for chat: an
    ``EventSource`` reconnects to the URL it opened, ``starting_after`` and
    all, with the last id it read.

    Raises:
        RequestError: not a non-negative integer, or a cursor of another id.
    """
    cursor = request.headers.get("last-event-id")
    if cursor:
        prefix, _, text = cursor.rpartition(".")
        param = "Last-Event-ID"
        if prefix not in ("", response_id):
            raise RequestError("Last-Event-ID names another response", param=param)
    else:
        param, after = "starting_after", request.query_params.get("starting_after")
        if after is None:
            return -1, param
        text = after
    if not text.isascii() or not text.isdigit() or len(text) > 12:
        raise RequestError(
            f"Invalid {param!r}: expected a sequence number, got {text[:40]!r}",
            param=param,
        )
    return int(text), param
