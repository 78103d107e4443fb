"""Resumable streams: which streams are, their producers, and their logs' readers.

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
- ``cancel_own``: aborts a stream its client gave up on on purpose (the
  client's ``close()``), without waiting for the grace period;
- ``resume``: a reader of the log after a cursor, then the live tail; a cursor
  at or past the end of a log that has ended answers 400 (``cursor_past_end``),
  which ends an ``EventSource`` instead of an empty 200 it would reconnect after.

The endpoints are in ``routes.py``, cursors and idempotency keys are
read in ``requests.py``, and the rows of whole plans wait in
``whole_rows.py``.

Spec: WHATWG HTML, "9.2 Server-sent events", "Last-Event-ID"; IETF draft
"The Idempotency-Key HTTP Header Field"; docs/resumable-streams.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.responses import Response

from sluicegate.core.endstate import EndState
from sluicegate.core.errors import RequestError
from sluicegate.core.wire.chunks import dumps, error_payload
from sluicegate.core.wire.contracts import Wire
from sluicegate.server.config import ServerConfig
from sluicegate.server.http import answers
from sluicegate.server.http.answers import error_answer
from sluicegate.server.http.errors import (
    CursorEvicted,
    IdempotencyConflict,
    LogNotFound,
    NotFound,
    StoreError,
    Unavailable,
)
from sluicegate.server.metering.meter import Meter
from sluicegate.server.metering.whole_rows import WholeRows
from sluicegate.server.prepare.plan import Plan
from sluicegate.server.resumable.log_response import LogStreamResponse
from sluicegate.server.resumable.producer import Producer
from sluicegate.server.resumable.requests import (
    NOT_FOUND,
    idempotency_claim,
    past_end,
)
from sluicegate.server.stores.event_store import EventStore
from sluicegate.server.streaming.buffer import LiveStreams
from sluicegate.server.streaming.generation import Generation
from sluicegate.server.streaming.shared import StreamLimits

__all__ = [
    "ANSWER_GRACE_S",
    "AttachExisting",
    "IdempotencyConflict",
    "ResumableStreams",
]

logger = logging.getLogger(__name__)


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
        # the rows of whole plans whose answer's status is not known yet
        self._whole = WholeRows()
        # id -> reads of its log made by the server itself (no resume)
        self._own_reads: dict[str, int] = {}
        remote = store.capabilities.remote_cancel
        if remote is not None:  # from any replica (the requester checked the owner)
            remote.on_cancel(self.abort)

    def unavailable(self, exc: StoreError) -> Response:
        """The 503 of a store that failed (``Retry-After``), logged."""
        logger.warning("resumable-stream store failed, answering 503: %s", exc)
        return error_answer(exc, self._config.retry_after_s)

    def refusal(self, exc: StoreError) -> Unavailable:
        """``store_refusal``: what a request is refused with before its first
        byte when the store failed, logged."""
        logger.warning("resumable-stream store failed, refusing with 503: %s", exc)
        return answers.store_refusal(exc, self._config.retry_after_s)

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
        claim = idempotency_claim(idempotency_key, body)
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
            if not self._whole.ended(plan.header.id, state):
                meter.record(state, 200)

        padded = plan.obfuscation  # the request's, else the server's default
        limits = self._limits
        if plan.stream_interval is not None:  # the request's, as for a live one
            limits = dataclasses.replace(limits, interval_tokens=plan.stream_interval)
        producer = Producer(
            self.store,
            generation,
            generation.header,
            limits,
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
            reader.answered = self._whole.track(response_id, meter)
        task = asyncio.get_running_loop().create_task(producer.run())
        self._tasks.add(task)
        self._producers[response_id] = (meter.key_id, producer, task)

        def done(task: asyncio.Task[None]) -> None:
            self._tasks.discard(task)
            self._producers.pop(response_id, None)
            self._own_reads.pop(response_id, None)  # one made after on_end

        task.add_done_callback(done)
        return reader

    async def resume(
        self,
        response_id: str,
        owner: str,
        after: int,
        param: str = "Last-Event-ID",
        not_found: str = NOT_FOUND,
        *,
        own: bool = False,
    ) -> Response | LogStreamResponse:
        """A reader of ``owner``'s log after frame ``after`` (``-1``: all).

        Args:
            own: a read the server makes for itself (a whole answer following
                its log), counted in neither ``resumes`` nor the row's
                ``resumed``.

        Returns:
            The reader (200, event stream); 404 ``not_found`` (unknown,
            another key's, expired); 410 ``cursor_evicted`` naming ``param``;
            400 ``cursor_past_end`` naming ``param`` when the log has ended and
            nothing follows the cursor (an empty 200 would make an
            ``EventSource`` reconnect for ever; any other status ends it);
            503 ``resume_store_unavailable``.
        """
        try:
            reader = await self._reader(response_id, owner, after)
        except CursorEvicted as exc:
            return error_answer(exc, param=param)
        except StoreError as exc:  # the shared store cannot be reached
            return self.unavailable(exc)
        if reader is None:
            return error_answer(NotFound(not_found))
        if reader.past_end and not own:
            await reader.aclose()
            return error_answer(past_end(response_id, after, param))
        if not own:
            self.resumes += 1
        elif response_id in self._producers:  # its row is not written yet
            self._own_reads[response_id] = self._own_reads.get(response_id, 0) + 1
        return reader

    @property
    def producing(self) -> int:
        """Resumable streams whose producer runs on this server now."""
        return len(self._producers)

    def cancel_own(self, response_id: str, owner: str) -> bool:
        """Abort the stream this server produces for ``owner`` now, as if its
        grace ran out; whether it did (not when another key's, ended, unknown
        or produced by another replica)."""
        producing = self._producers.get(response_id)
        return producing is not None and producing[0] == owner and producing[1].cancel()

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
        remote = self.store.capabilities.remote_cancel
        return remote is not None and await remote.request_cancel(response_id)

    def abort(self, response_id: str) -> None:
        """Cancel the producer of ``response_id`` if it runs here, as a cancel
        request does (end state aborted, error event ``cancelled``)."""
        producing = self._producers.get(response_id)
        if producing is not None:
            producing[1].cancel()

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
        await self._whole.aclose(ANSWER_GRACE_S)
        await self.store.aclose()
