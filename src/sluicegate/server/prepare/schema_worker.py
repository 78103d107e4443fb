"""Schema work off the event loop: threads of a known stack size, with a deadline.

Compiling a schema into a grammar (``constraints.grammar_for``) runs native code
that recurses with the schema and takes up to seconds on a large one. Run on the
event loop it stalls every other stream for that long; run in a thread whose
stack the platform chooses (8 MiB on glibc, 128 KiB on musl) its depth budget
is not known. ``SchemaWorker`` runs such calls in its own threads, each started
with ``STACK_BYTES`` of stack (address space; pages are touched only as used),
and gives up waiting after a deadline: the caller gets a 400 naming the
setting, and the thread finishes the call on its own (native code cannot be
interrupted) before it takes the next one; a call whose waiter gave up while
it was still queued is dropped unrun.

The schema limits (``core/schema_limits.py``) keep native recursion to a few
hundred KiB of stack; the large stack here is the margin, not the defence.

Spec: docs/security.md, "Schema limits".
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel

from sluicegate.core.errors import RequestError
from sluicegate.engines.clocks import Deadline, Timers

__all__ = ["STACK_BYTES", "SchemaWorker"]

STACK_BYTES = 256 * 1024 * 1024
"""Stack of each worker thread (bytes of address space)."""

T = TypeVar("T")

_stack_lock = threading.Lock()  # threading.stack_size is process-wide


class _Job:
    __slots__ = ("done", "error", "fn", "result", "token")

    def __init__(self, fn: Callable[[], Any], token: Any) -> None:
        self.fn = fn
        self.token = token
        self.done = anyio.Event()
        self.result: Any = None
        self.error: BaseException | None = None


class SchemaWorker:
    """Runs calls in ``threads`` daemon threads of ``stack_bytes`` of stack.

    Args:
        threads: how many calls run at once; more wait their turn.
        stack_bytes: each thread's stack.
        timers: the clock of each call's deadline; ``None``: the running loop.
    """

    def __init__(
        self,
        threads: int = 2,
        stack_bytes: int = STACK_BYTES,
        timers: Timers | None = None,
    ) -> None:
        self._timers = timers
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._threads = threads
        self._stack_bytes = stack_bytes
        self._started: list[threading.Thread] = []

    async def run(
        self, fn: Callable[[], T], timeout_s: float, what: str, param: str | None
    ) -> T:
        """``fn()`` in a worker thread; its result, or its exception re-raised.

        Args:
            fn: the call; it must not touch the event loop.
            timeout_s: seconds to wait for it (queueing included).
            what: names the work in the timeout's message.
            param: the request parameter the timeout's 400 names.

        Raises:
            RequestError: 400 (code ``schema_timeout``) when ``timeout_s`` ran
                out; the call goes on in its thread and its result is dropped.
            BaseException: what ``fn`` raised.
        """
        self._start()
        job = _Job(fn, anyio.lowlevel.current_token())
        self._jobs.put(job)
        timers = self._timers or asyncio.get_running_loop()
        with contextlib.suppress(TimeoutError):
            async with Deadline(timers, timeout_s):
                await job.done.wait()
        if not job.done.is_set():
            job.token = None  # nobody waits: the thread drops the result
            raise RequestError(
                f"{what} did not compile within {timeout_s:g} s "
                f"(set by --schema-timeout-s)",
                param=param,
                code="schema_timeout",
            )
        if job.error is not None:
            raise job.error
        result: T = job.result
        return result

    def _start(self) -> None:
        if len(self._started) >= self._threads:
            return
        with _stack_lock:
            old = threading.stack_size(self._stack_bytes)
            try:
                while len(self._started) < self._threads:
                    thread = threading.Thread(
                        target=self._serve, name="sluicegate-schemas", daemon=True
                    )
                    thread.start()
                    self._started.append(thread)
            finally:
                threading.stack_size(old)

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job.token is None:  # its waiter gave up while it was queued
                continue
            try:
                job.result = job.fn()
            except Exception as exc:  # not handled here: re-raised by run()
                job.error = exc
            token = job.token
            if token is not None:
                with contextlib.suppress(RuntimeError):  # the loop is gone
                    anyio.from_thread.run_sync(job.done.set, token=token)
