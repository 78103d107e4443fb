"""The ledger's one writer thread, and the backend protocol it writes through.

``WriterThread`` owns the queue, the batching, the retries and what is dropped
or logged; a ``LedgerBackend`` owns the database: its connection, its schema,
its transaction and its heartbeat, if it has one (SQLite: none;
PostgreSQL: renew the lease). ``LedgerWriter`` (``writer.py``) and
``PgLedgerWriter`` (``pg.py``) are this thread over each backend.

The event loop hands the thread statements with ``put`` (a
``queue.SimpleQueue``: never full, never blocks); the thread takes everything
queued (``max_batch`` statements at most), commits it in one transaction, and
retries while the backend refuses it for a reason that may pass.

Invariants:
    - The event loop never waits on the database, nor on this thread's lock:
      ``put`` appends to a queue.
    - A statement leaves the queue for good only once committed, in the order
      put. Retries back off from 10 ms to 1 s, for as long as the process lives;
      a warning is logged at the first failure and every 30 s after, and once
      the work is done. Only a statement that cannot be written whatever the
      retries (the backend's ``refused`` errors, or any error that is not its
      ``transient`` one) is dropped, alone (the batch is halved until it is
      found), logged in full and counted (``dropped``). No statement ends the
      thread.
    - ``close`` waits ``close_timeout_s``, then logs what it could not write,
      one JSON line per statement.
    - Its waits (the retries' back-off, ``close``'s limit, the backend's
      heartbeat) and the times it logs run on ``timers``: ``ThreadTimers``,
      or a ``ManualClock`` a test steps. A heartbeat falls due on that clock,
      whether or not rows come: its timer wakes the thread.

Spec: docs/DESIGN.md, "Metering".
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from sluicegate.engines.clocks import Deadline, ThreadTimers, Timers
from sluicegate.server.ledger.file import Statement
from sluicegate.server.ledger.values import plain

__all__ = ["LedgerBackend", "Retry", "WriterThread"]

logger = logging.getLogger(__name__)

_FIRST_DELAY_S = 0.01
_MAX_DELAY_S = 1.0
_LOG_EVERY_S = 30.0

_T = TypeVar("_T")


class Retry(Protocol):
    """Runs ``work()`` until the backend stops refusing it for a reason that may
    pass (``what`` names it in the log); raises what it cannot retry."""

    def __call__(self, work: Callable[[], _T], what: str) -> _T: ...


class LedgerBackend(Protocol):
    """One ledger database, as the writer thread sees it; used from that thread only.

    Attributes:
        where: the ledger in log lines (a path, a URL without its secrets).
        away: what kept rows out at shutdown, for the log ("stayed locked").
        max_batch: statements per transaction, at most.
        heartbeat_s: seconds between two ``beat()`` calls (None: no heartbeat).
        transient: the errors that may pass: retried.
        refused: the errors about a statement itself (among ``transient``'s
            subclasses): never retried.
    """

    where: str
    away: str
    max_batch: int
    heartbeat_s: float | None
    transient: type[Exception]
    refused: tuple[type[Exception], ...]

    def start(self, retry: Retry) -> None:
        """Before any row: open the database, make its schema, mark dead servers."""

    def beat(self, retry: Retry) -> None:
        """Before the first batch, then every ``heartbeat_s`` between batches."""

    def write(self, batch: Sequence[Statement]) -> None:
        """Commit ``batch`` in one transaction, or raise and commit none of it."""

    def recover(self) -> None:
        """After a transient error: drop what it broke (a connection)."""

    def close(self) -> None:
        """At the end, whatever came before: release what ``start`` took."""


class _Flush:
    def __init__(self) -> None:
        self.done = threading.Event()


class _Stop:
    pass


class _Wake:
    """The heartbeat fell due: the thread stops waiting for statements."""


_WAKE = _Wake()
_Item = Statement | _Flush | _Stop | _Wake


class _Abandoned(Exception):
    """``close`` stopped waiting: the thread logs what it holds and ends."""


class WriterThread:
    """The thread that commits ledger statements through ``backend``, in order.

    Args:
        backend: the database; the thread starts it at once.
        server_id: 32 hex digits naming this writer in its rows.
        close_timeout_s: how long ``close`` waits for the database (seconds).
        name: the thread's name.
        timers: the clock of its waits, heartbeat and logged times (default:
            ``ThreadTimers``; callbacks may come from any thread).
    """

    timers: Timers = ThreadTimers()

    def __init__(
        self,
        backend: LedgerBackend,
        server_id: str,
        close_timeout_s: float,
        name: str,
        timers: Timers | None = None,
    ) -> None:
        if timers is not None:
            self.timers = timers
        self.server_id = server_id
        self._backend = backend
        self._close_timeout_s = close_timeout_s
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._next_beat: Deadline | None = None
        self._woken_to_beat = False
        self._in_hand = 0  # statements taken off the queue, not committed yet
        self.dropped = 0
        """Statements that could not be written and were dropped (logged)."""
        self._abandon = threading.Event()
        self._woken = threading.Event()  # the back-off's wait, or close's end
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def backlog(self) -> int:
        """Statements put and not committed yet (approximate while it writes)."""
        return self._queue.qsize() + self._in_hand

    def put(self, sql: str, params: Sequence[object]) -> None:
        """Queue one statement (``?`` placeholders); committed after those before."""
        self._queue.put((sql, params))

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every statement put so far is committed.

        Blocks the calling thread (not for the event loop: see ``Ledger.aflush``).

        Returns:
            False if ``timeout_s`` seconds passed first (the database is away).
        """
        marker = _Flush()
        self._queue.put(marker)
        return marker.done.wait(timeout_s)

    def close(self) -> None:
        """Commit what is queued (``close_timeout_s`` at most), then stop.

        What the database kept out past that time is logged, one JSON line per
        statement. Blocks the calling thread; later calls do nothing.
        """
        if not self._thread.is_alive():
            return
        self._queue.put(_Stop())
        limit = Deadline(self.timers, self._close_timeout_s)
        limit.call(self._give_up)
        self._thread.join()
        limit.cancel()

    def _give_up(self) -> None:
        """``close`` waited long enough: the thread logs what it holds."""
        self._abandon.set()
        self._woken.set()

    # -- the thread ----------------------------------------------------------

    def _run(self) -> None:
        try:
            self._backend.start(self._retry)
            while self._serve():
                pass
        except _Abandoned:
            self._log_unwritten()
        finally:
            if self._next_beat is not None:
                self._next_beat.cancel()
            self._backend.close()

    def _serve(self) -> bool:
        """Beat if due, then commit one batch; False once told to stop."""
        self._beat_if_due()
        item = self._queue.get()
        batch: list[Statement] = []
        markers: list[_Flush | _Stop] = []
        while True:
            if isinstance(item, _Wake):
                self._woken_to_beat = True
                break  # the heartbeat before what was put after it
            if isinstance(item, _Flush | _Stop):
                markers.append(item)
            else:
                batch.append(item)
            if len(batch) >= self._backend.max_batch:
                break
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
        self._in_hand = len(batch)
        try:
            if batch:
                self._commit(batch)
        except _Abandoned:
            self._requeue(batch, markers)
            raise
        self._in_hand = 0
        for marker in markers:
            if isinstance(marker, _Flush):
                marker.done.set()
        return not any(isinstance(m, _Stop) for m in markers)

    def _beat_if_due(self) -> None:
        """The backend's heartbeat, when its time has come; then a timer that
        wakes the thread at the next."""
        every_s, last = self._backend.heartbeat_s, self._next_beat
        due = last is None or last.expired or self._woken_to_beat
        if every_s is None or not due:
            return
        self._woken_to_beat = False
        if last is not None:
            last.cancel()  # due by the clock before its timer ran
        self._backend.beat(self._retry)
        self._next_beat = Deadline(self.timers, every_s)
        self._next_beat.call(lambda: self._queue.put(_WAKE))

    def _requeue(self, batch: list[Statement], markers: list[_Flush | _Stop]) -> None:
        # What is in hand goes first among what _log_unwritten reads.
        rest: list[_Item] = [*batch, *markers]
        with contextlib.suppress(queue.Empty):
            while True:
                rest.append(self._queue.get_nowait())
        for item in rest:
            self._queue.put(item)

    def _commit(self, batch: Sequence[Statement]) -> None:
        try:
            self._retry(lambda: self._backend.write(batch), "write rows")
        except _Abandoned:
            raise
        except Exception as exc:  # the statement itself: see _drop
            if len(batch) > 1:  # find the statement it was (halves); keep the rest
                half = len(batch) // 2
                self._commit(batch[:half])
                self._commit(batch[half:])
                return
            self._drop(batch[0], exc)

    def _drop(self, statement: Statement, exc: Exception) -> None:
        """One statement that cannot be written, whatever retries: the database
        refuses it (a constraint, a type, a value out of range: a bug), or its
        values cannot be bound (an integer past 64 bits, a lone surrogate;
        ``Ledger`` repairs these first). It is logged in full and counted; the
        thread goes on with the rest. Any exception counts: a statement must
        never end the thread that writes every later row."""
        self.dropped += 1
        logger.error(
            "ledger: a row cannot be written (%s: %s); dropped: %s",
            type(exc).__name__,
            exc,
            _describe(statement),
        )

    def _retry(self, work: Callable[[], _T], what: str) -> _T:
        """``work()`` until the backend stops refusing it for a reason that may
        pass; what it broke is dropped (``recover``) before each wait."""
        backend = self._backend
        delay_s, failed_at, logged_at = _FIRST_DELAY_S, None, -math.inf
        while True:
            try:
                result = work()
            except backend.refused:
                raise
            except backend.transient as exc:
                now = self.timers.time()
                failed_at = now if failed_at is None else failed_at
                if now - logged_at >= _LOG_EVERY_S:
                    logged_at = now
                    logger.warning(
                        "ledger %s: could not %s for %.1f s (%s); %d rows wait, "
                        "retrying",
                        *(backend.where, what, now - failed_at, exc, self.backlog),
                    )
                backend.recover()
                if self._pause(delay_s):
                    raise _Abandoned from exc
                delay_s = min(delay_s * 2, _MAX_DELAY_S)
                continue
            if failed_at is not None:
                logger.warning(
                    "ledger %s: could %s again after %.1f s",
                    *(backend.where, what, self.timers.time() - failed_at),
                )
            return result

    def _pause(self, delay_s: float) -> bool:
        """Wait ``delay_s`` seconds on ``timers``; whether ``close`` gave up
        meanwhile (then at once)."""
        woken = self._woken = threading.Event()
        if self._abandon.is_set():  # after the swap: _give_up sets this one
            return True
        back_off = Deadline(self.timers, delay_s)
        back_off.call(woken.set)
        woken.wait()
        back_off.cancel()
        return self._abandon.is_set()

    def _log_unwritten(self) -> None:
        lost = 0
        with contextlib.suppress(queue.Empty):
            while True:
                item = self._queue.get_nowait()
                if isinstance(item, _Flush):
                    item.done.set()
                elif isinstance(item, tuple):  # a statement
                    lost += 1
                    logger.error("ledger: not written: %s", _describe(item))
        if lost:
            logger.error(
                "ledger %s: %s for %g s at shutdown; %d statements logged above "
                "instead",
                *(self._backend.where, self._backend.away, self._close_timeout_s),
                lost,
            )


def _describe(statement: Statement) -> str:
    """A statement as one JSON line: its first words and its values, each value
    that is not a plain JSON scalar (or is a long one) by its short ``repr``."""
    sql, params = statement
    return json.dumps({"sql": " ".join(sql.split()[:3]), "params": plain(params)})
