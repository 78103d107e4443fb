"""Resumable streams: which streams are, their producers, and the resume endpoint.

``ResumableStreams`` is the app's one registry of resumable streams over one
``EventStore`` (``event_store.py``; ``MemoryEventStore`` by default):

- ``wanted(plan)``: a stream is resumable when its request says so
  (``stream_options.resumable``) or, when it does not say, when the server
  default (``ServerConfig.resumable_streams``) does;
- ``open``: before the engine is asked, the log is created in the store,
  bound to the caller's key id (and to its ``Idempotency-Key``, with a hash of
  the body): a retry with the same key and body attaches to the first log, one
  with another body is refused (409), a full store refuses (503);
- ``start``: the ``Producer`` task generates into the log; the first
  connection is only the log's first reader (``LogStreamResponse``);
- ``cancel``: ``POST .../{id}/cancel`` aborts a stream its client gave up on
  on purpose (the client's ``close()``), without waiting for the grace period;
- ``events``: ``GET /v1/chat/completions/{id}/events`` (and completions): the
  log after the cursor in ``Last-Event-ID`` (or ``?after=``), then the live
  tail. Unknown id, another key's log and an expired one answer the same 404;
  an evicted cursor 410 (``cursor_evicted``); a malformed cursor 400; a cursor
  at or past the end of a log that has ended 400 (``cursor_past_end``), which
  ends an ``EventSource`` instead of an empty 200 it would reconnect after.

Cursors: ``<response_id>.<seq>``, ``seq`` the frame's number in the log (0
first); a bare ``<seq>`` is accepted too. ``Last-Event-ID`` wins over
``?after=`` (an ``EventSource`` reconnects to the same URL with the header).

Spec: WHATWG HTML, "9.2 Server-sent events", "Last-Event-ID"; IETF draft
"The Idempotency-Key HTTP Header Field"; docs/resumable-streams.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from sluicegate.core.chunks import dumps, error_payload
from sluicegate.core.endstate import EndState
from sluicegate.core.errors import RequestError
from sluicegate.core.wire import Wire
from sluicegate.server.access import API_KEY
from sluicegate.server.admission import ANONYMOUS, Unavailable
from sluicegate.server.answers import json_answer
from sluicegate.server.buffer import LiveStreams
from sluicegate.server.config import ServerConfig
from sluicegate.server.event_store import (
    CursorEvicted,
    EventStore,
    IdempotencyConflict,
    LogNotFound,
    StoreError,
    store_error_code,
    store_refusal_message,
)
from sluicegate.server.event_store_memory import MemoryEventStore
from sluicegate.server.generation import Generation
from sluicegate.server.log_response import LogStreamResponse
from sluicegate.server.meter import Meter
from sluicegate.server.plan import Plan
from sluicegate.server.resumable_producer import Producer
from sluicegate.server.streaming import StreamLimits

__all__ = [
    "ANSWER_GRACE_S",
    "CURSOR_EVICTED",
    "CURSOR_PAST_END",
    "MAX_CURSOR_CHARS",
    "MAX_IDEMPOTENCY_KEY_CHARS",
    "AttachExisting",
    "IdempotencyConflict",
    "ResumableStreams",
    "body_hash",
    "open_store",
    "owner_of",
    "parse_cursor",
]

logger = logging.getLogger(__name__)

CURSOR_EVICTED = "cursor_evicted"
"""Error code of the 410 for a cursor whose frames were dropped."""

MAX_CURSOR_CHARS = 128
"""Longest cursor accepted (``Last-Event-ID`` or ``?after=``), in characters."""

MAX_IDEMPOTENCY_KEY_CHARS = 255
"""Longest ``Idempotency-Key`` accepted, in characters."""

_SEQ = re.compile(r"[0-9]{1,12}", re.ASCII)
_KEY = re.compile(r"[\x21-\x7e]+", re.ASCII)
_NOT_FOUND = error_payload(
    "No resumable stream with that id", "invalid_request_error", None, "not_found"
)


def open_store(config: ServerConfig) -> EventStore:
    """The store of ``config``'s resumable streams: in this process's memory,
    bounded by ``max_log_bytes``, ``max_store_bytes`` and ``resume_ttl_s``."""
    return MemoryEventStore(
        config.max_log_bytes, config.max_store_bytes, config.resume_ttl_s
    )


ANSWER_GRACE_S = 1.0
"""At shutdown, how long the ledger row of a whole plan whose stream ended
waits for the status of its answer (seconds)."""


class AttachExisting(Exception):
    """The ``Idempotency-Key`` names a kept log: answer with it, generate nothing.

    Attributes:
        response: the reader of that log, from its first frame.
    """

    def __init__(self, response: LogStreamResponse) -> None:
        super().__init__("attach to the kept log")
        self.response = response


CURSOR_PAST_END = "cursor_past_end"
"""Error code of the 400 for a cursor at or past the end of an ended log."""


def _past_end(response_id: str, after: int, param: str) -> dict[str, Any]:
    message = (
        f"The stream {response_id[:80]!r} has ended and nothing follows"
        f" event {after}: it was read to its end"
    )
    return error_payload(message, "invalid_request_error", param, CURSOR_PAST_END)


def parse_cursor(text: str, response_id: str) -> int:
    """The ``after`` sequence number a cursor names (``-1``: from the start).

    Args:
        text: ``<response_id>.<seq>``, ``<seq>``, or ``""`` (no cursor).
        response_id: the response the path names; a cursor must name it too.

    Raises:
        RequestError: longer than ``MAX_CURSOR_CHARS``, not of that shape, or
            naming another response (400, ``param="Last-Event-ID"``).
    """
    if not text:
        return -1
    prefix, dot, seq = text.rpartition(".")
    if (
        len(text) > MAX_CURSOR_CHARS
        or (dot and prefix != response_id)
        or _SEQ.fullmatch(seq) is None
    ):
        raise RequestError(
            "expected a cursor '<response id>.<seq>' of this response, or '<seq>'",
            param="Last-Event-ID",
            code="invalid_cursor",
        )
    return int(seq)


def owner_of(request: Request) -> str:
    """The key id a request's logs belong to (``ANONYMOUS`` without keys)."""
    key = request.scope.get(API_KEY)
    return key.key_id if key is not None else ANONYMOUS


def body_hash(body: dict[str, Any]) -> str:
    """A hash of a request body, the same for the same JSON object (keys sorted)."""
    return hashlib.sha256(dumps(_sorted(body))).hexdigest()


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


class ResumableStreams:
    """The app's resumable streams over one store (see the module doc).

    Args:
        store: where the logs are kept.
        config: the server default, the grace period, ``retry_after_s``.
        limits: each producer's and reader's limits.
        live: where producers' buffers are registered (graceful drain).
    """

    def __init__(
        self,
        store: EventStore,
        config: ServerConfig,
        limits: StreamLimits,
        live: LiveStreams,
    ) -> None:
        self.store = store
        self._config = config
        self._limits = limits
        self._live = live
        self._tasks: set[asyncio.Task[None]] = set()
        # id -> its owner, its producer, the producer's task
        self._producers: dict[str, tuple[str, Producer, asyncio.Task[None]]] = {}
        self.check_interval_s = min(1.0, max(config.resume_grace_s / 4, 0.05))
        """Seconds between a producer's checks of its readers."""
        self.resumes = 0
        """Reads of a log answered here other than its first connection's (a
        resume, or a stored Response streamed again), since the start."""
        self.given_up = 0
        """Resumable streams this server aborted on its own (no reader within
        the grace period, a full buffer), since the start."""
        # id -> the row of a whole plan whose answer's status is not known yet
        self._whole: dict[str, _WholeRow] = {}
        # id -> reads of its log made by the server itself (no resume)
        self._own_reads: dict[str, int] = {}
        on_cancel = getattr(store, "on_cancel", None)  # a RemoteCancel store
        if on_cancel is not None:
            on_cancel(self._cancel_here)

    def unavailable(self, exc: StoreError) -> Response:
        """The 503 (with ``Retry-After``) of a shared store that cannot be
        reached (``resume_store_unavailable``) or is full
        (``resume_store_full``)."""
        logger.warning("resumable-stream store failed, answering 503: %s", exc)
        message = store_refusal_message(exc)
        payload = error_payload(message, "server_error", None, store_error_code(exc))
        retry = {"Retry-After": str(self._config.retry_after_s)}
        return json_answer(payload, 503, retry)

    def refusal(self, exc: StoreError) -> Unavailable:
        """What a request is refused with before its first byte when the store
        failed: 503 with ``Retry-After`` and ``store_error_code(exc)``."""
        logger.warning("resumable-stream store failed, refusing with 503: %s", exc)
        return Unavailable(
            store_refusal_message(exc),
            store_error_code(exc),
            self._config.retry_after_s,
        )

    def wanted(self, plan: Plan) -> bool:
        """Whether ``plan``'s response is resumable (a stream that asked, or the
        server default when it did not say)."""
        if not plan.stream:
            return False
        asked = plan.resumable
        return self._config.resumable_streams if asked is None else asked

    async def open(
        self, plan: Plan, owner: str, idempotency_key: str | None, body: dict[str, Any]
    ) -> None:
        """Create ``plan``'s log, readable by ``owner`` only, before any generation.

        Raises:
            AttachExisting: ``owner``'s ``idempotency_key`` names a kept log made
                by the same body: answer with it.
            IdempotencyConflict: it names one made by another body (409).
            RequestError: the key is empty, too long or not visible ASCII (400).
            Unavailable: the store is full of live logs, or cannot be reached
                (503).
        """
        claim = None
        if idempotency_key is not None:
            if (
                len(idempotency_key) > MAX_IDEMPOTENCY_KEY_CHARS
                or _KEY.fullmatch(idempotency_key) is None
            ):
                raise RequestError(
                    f"expected an Idempotency-Key of 1 to {MAX_IDEMPOTENCY_KEY_CHARS}"
                    " visible ASCII characters",
                    param="Idempotency-Key",
                )
            claim = (idempotency_key, body_hash(body))
        response_id = plan.header.id
        try:
            bound = await self.store.create(response_id, owner, claim)
        except StoreError as exc:  # full, or a shared store that cannot be reached
            raise self.refusal(exc) from exc
        if bound is None:
            return
        assert claim is not None, "only a claim finds a bound log"
        if bound[1] != claim[1]:
            raise IdempotencyConflict(
                "This Idempotency-Key was used with another request body",
                param="Idempotency-Key",
                code="idempotency_key_reused",
            )
        reader = await self._reader(bound[0], owner, -1)
        if reader is None:  # forgotten between the two calls
            raise RequestError(
                "The stream this Idempotency-Key named is gone; use another key",
                param="Idempotency-Key",
            )
        raise AttachExisting(reader)

    async def close_unstarted(self, plan: Plan) -> None:
        """``open`` succeeded but the request went no further (the engine refused
        it, the client left): end the log with one error event, so that a retry
        its ``Idempotency-Key`` attaches sees why, never an empty stream (the key
        stays bound for the log's TTL: a retry after a refusal takes a new key).
        """
        payload = error_payload(
            "This request was not started (see the status of its first answer)",
            "server_error",
            None,
            "not_started",
        )
        response_id = plan.header.id
        try:
            await self.store.append(response_id, [b"data: " + dumps(payload) + b"\n\n"])
            await self.store.finish(response_id)
        except StoreError:  # the shared store failed too: the log lapses
            logger.warning(
                "log of unstarted %s not closed: the store failed", response_id
            )

    async def start(
        self,
        generation: Generation,
        plan: Plan,
        meter: Meter,
        ended: Callable[[Wire], Awaitable[None]] | None = None,
    ) -> LogStreamResponse:
        """Run the producer in a task; returns the first reader's response.

        Args:
            ended: awaited with the stream machine once it ended, before its
                log is finished (``Producer``'s ``ended``). A ``background``
                plan's producer never gives up for want of a reader.

        Raises:
            Unavailable: the store failed before the first reader could attach
                (Redis full or gone between ``open`` and now): the generation
                is aborted, the grant refunded and the log closed (best
                effort); the caller answers 503 and records the row.
        """

        async def on_end(state: EndState, given_up: bool) -> None:
            if given_up:
                self.given_up += 1
            own = self._own_reads.pop(plan.header.id, 0)
            try:
                resumed = await self.store.resumed(plan.header.id)
                meter.resumed = max(0, resumed - own)
            except StoreError:  # the shared store is gone: the row is kept
                logger.warning(
                    "resumes of %s unknown: the store failed", plan.header.id
                )
            whole = self._whole.get(plan.header.id)
            if whole is not None:
                whole.ended(state)  # recorded with the status its client got
                self._forget_whole(plan.header.id, whole)
            else:
                meter.record(state, 200)

        padded = plan.obfuscation  # the request's, else the server's default
        producer = Producer(
            self.store,
            generation,
            generation.header,
            self._limits,
            self._live,
            math.inf if plan.background else self._config.resume_grace_s,
            on_end,
            self.check_interval_s,
            padded=self._config.obfuscation if padded is None else padded,
            ended=ended,
        )
        response_id = plan.header.id
        try:
            reader = await self._reader(response_id, meter.key_id, -1)
        except StoreError as exc:  # before any byte: refused, nothing produced
            generation.abort_unfinished()
            if meter.grant is not None:
                meter.grant.refund()
            await self.close_unstarted(plan)
            raise self.refusal(exc) from exc
        assert reader is not None, "open() created the log"
        if plan.whole:
            whole = self._whole[response_id] = _WholeRow(meter)

            def answered(status: int) -> None:
                whole.answered(status)
                self._forget_whole(response_id, whole)

            reader.answered = answered
        task = asyncio.get_running_loop().create_task(producer.run())
        self._tasks.add(task)
        self._producers[response_id] = (meter.key_id, producer, task)

        def done(task: asyncio.Task[None]) -> None:
            self._tasks.discard(task)
            self._producers.pop(response_id, None)
            self._own_reads.pop(response_id, None)  # one made after on_end

        task.add_done_callback(done)
        return reader

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
        cursor = request.headers.get("last-event-id")
        if cursor is None:
            cursor = request.query_params.get("after", "")
        if not response_id.startswith(prefix or "chatcmpl-"):
            return json_answer(_NOT_FOUND, 404)
        try:
            after = parse_cursor(cursor, response_id)
        except RequestError as exc:
            payload = error_payload(exc.message, exc.error_type, exc.param, exc.code)
            return json_answer(payload, 400)
        return await self.resume(response_id, owner_of(request), after)

    def _forget_whole(self, response_id: str, whole: _WholeRow | None) -> None:
        recorded = whole is not None and whole.meter.recorded
        if recorded and self._whole.get(response_id) is whole:
            del self._whole[response_id]

    async def resume(
        self,
        response_id: str,
        owner: str,
        after: int,
        param: str = "Last-Event-ID",
        not_found: dict[str, Any] = _NOT_FOUND,
        *,
        own: bool = False,
    ) -> Response | LogStreamResponse:
        """A reader of ``owner``'s log after frame ``after`` (``-1``: all).

        Args:
            own: a read the server makes for itself (a whole answer following
                its log), counted in neither ``resumes`` nor the row's
                ``resumed``.

        Returns:
            The reader (200, event stream); ``not_found`` with 404 (unknown,
            another key's, expired); 410 ``cursor_evicted`` naming ``param``;
            400 ``cursor_past_end`` naming ``param`` when the log has ended and
            nothing follows the cursor (an empty 200 would make an
            ``EventSource`` reconnect for ever; any other status ends it);
            503 ``resume_store_unavailable``.
        """
        try:
            reader = await self._reader(response_id, owner, after)
        except CursorEvicted as exc:
            payload = error_payload(
                str(exc), "invalid_request_error", param, CURSOR_EVICTED
            )
            return json_answer(payload, 410)
        except StoreError as exc:  # the shared store cannot be reached
            return self.unavailable(exc)
        if reader is None:
            return json_answer(not_found, 404)
        if reader.past_end and not own:
            await reader.aclose()
            return json_answer(_past_end(response_id, after, param), 400)
        if not own:
            self.resumes += 1
        elif response_id in self._producers:  # its row is not written yet
            self._own_reads[response_id] = self._own_reads.get(response_id, 0) + 1
        return reader

    @property
    def producing(self) -> int:
        """Resumable streams whose producer runs on this server now."""
        return len(self._producers)

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
        producing = self._producers.get(response_id)
        if (
            not response_id.startswith(prefix or "chatcmpl-")
            or producing is None
            or producing[0] != owner_of(request)
            or not producing[1].cancel()
        ):
            return json_answer(_NOT_FOUND, 404)  # ended ones too, task or not
        return json_answer({"id": response_id, "cancelled": True})

    async def stop(self, response_id: str, owner: str, timeout_s: float = 5.0) -> bool:
        """Cancel the stream this server produces for ``owner`` (as ``cancel``),
        then wait up to ``timeout_s`` for its producer to end: its log finished,
        its ``ended`` hook run. Returns whether this server was producing it."""
        producing = self._producers.get(response_id)
        if producing is None or producing[0] != owner:
            return False
        _, producer, task = producing
        producer.cancel()
        await asyncio.wait([task], timeout=timeout_s)
        return True

    async def ask_cancel(self, response_id: str) -> bool:
        """Ask the replica that produces ``response_id`` to cancel it (a store
        shared by replicas, ``RemoteCancel``); whether the request went out.

        Raises:
            StoreError: the shared store cannot be reached.
        """
        request_cancel = getattr(self.store, "request_cancel", None)
        if request_cancel is None:
            return False
        sent: bool = await request_cancel(response_id)
        return sent

    def abort(self, response_id: str) -> None:
        """Cancel the producer of ``response_id`` if it runs here, as a cancel
        request does (end state aborted, error event ``cancelled``)."""
        producing = self._producers.get(response_id)
        if producing is not None:
            producing[1].cancel()

    def _cancel_here(self, response_id: str) -> None:
        """A cancel request from any replica: cancel the producer if it runs
        here (the requester checked the owner)."""
        self.abort(response_id)

    async def _reader(
        self, response_id: str, owner: str, after: int
    ) -> LogStreamResponse | None:
        """A reader of the log after ``after``; ``None`` when there is none to
        read (``LogNotFound``). Raises ``CursorEvicted``."""
        try:
            return await LogStreamResponse.open(
                self.store, response_id, owner, after, self._limits
            )
        except LogNotFound:
            return None

    async def aclose(self) -> None:
        """Cancel every producer (each finishes its log and records its row),
        then close the store. The row of a whole plan waits for its answer
        for at most ``ANSWER_GRACE_S``; one not sent by then is recorded with
        500 (what such an answer is when the server stops under it)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        waiting = [whole for whole in self._whole.values() if whole.state is not None]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(ANSWER_GRACE_S):
                for whole in waiting:
                    await whole.recorded.wait()
        for whole in waiting:
            whole.answered(500)  # nothing if its answer was reported
        self._whole.clear()
        await self.store.aclose()


class _WholeRow:
    """The ledger row of a whole plan: recorded once both its stream's end
    state and the status its client was answered are known (the first of
    each counts)."""

    __slots__ = ("meter", "recorded", "state", "status")

    def __init__(self, meter: Meter) -> None:
        self.meter = meter
        self.state: EndState | None = None
        self.status: int | None = None
        self.recorded = asyncio.Event()

    def ended(self, state: EndState) -> None:
        if self.state is None:
            self.state = state
            self._record()

    def answered(self, status: int) -> None:
        if self.status is None:
            self.status = status
            self._record()

    def _record(self) -> None:
        state, status = self.state, self.status
        if state is not None and status is not None and not self.meter.recorded:
            self.meter.record(state, status)
            self.recorded.set()
