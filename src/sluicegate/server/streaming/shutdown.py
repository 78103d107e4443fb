"""Graceful shutdown: stop admitting, let running streams finish, then end them.

``Drain.run(grace_s)`` is the whole sequence: readiness turns 503 and new
requests get 503 with ``Retry-After`` (``draining``), running responses may finish
for ``grace_s`` seconds, then each one still running gets one ``Fail`` with code
``server_shutdown`` (an in-band error event; the response aborts its engine
request), and ``done`` is set once they have all ended (or after
``settle_s`` more seconds).

``DrainingServer`` is uvicorn's ``Server`` with SIGTERM/SIGINT wired to the drain:
the first signal starts it, uvicorn's own shutdown (close the sockets, run the
app's lifespan shutdown, which closes the engine and the ledger) starts when it is
done, and a second signal exits at once. A worker of ``serve --workers`` takes
its second order from its supervisor only (SIGQUIT): a signal sent to every
process of the service at once reaches it twice, directly and forwarded by
the supervisor, and is one drain.

Deliberate divergence from plain uvicorn: uvicorn stops accepting connections on
the first signal; here the listening socket stays open during the drain so that a
load balancer sees 503s and readiness failures rather than refused connections.

Spec: docs/DESIGN.md, "Graceful shutdown" and "Status first, errors in band".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Iterator
from types import FrameType

import anyio
import uvicorn

from sluicegate.core.events import Fail
from sluicegate.engines.base import Engine
from sluicegate.engines.clocks import Deadline, Timers
from sluicegate.server.http.errors import SERVER_SHUTDOWN
from sluicegate.server.streaming.buffer import LiveStreams

__all__ = ["Drain", "DrainingServer"]

logger = logging.getLogger(__name__)

_POLL_S = 0.05
_ENGINE_CHECK_TICKS = 5  # uvicorn ticks every 0.1 s: look at the engine twice a second


class Drain:
    """The shutdown state of one server.

    Args:
        live: the running responses' buffers.
        settle_s: seconds the ended-by-error responses get to write their error
            event and close, after the grace period.

    Attributes:
        draining: set by ``run``: refuse new requests with 503.
        done: every response has ended (or ``settle_s`` ran out).
        timers: the clock of the grace and settle periods (``None``: the loop).
    """

    timers: Timers | None = None

    def __init__(self, live: LiveStreams, settle_s: float = 5.0) -> None:
        self.live = live
        self.settle_s = settle_s
        self.draining = False
        self.done = False

    async def run(self, grace_s: float) -> None:
        """Drain: refuse new work, wait ``grace_s`` seconds, end the rest in band.

        Safe to call twice: a second call only waits like the first.
        """
        self.draining = True
        logger.info("draining: %d responses running", len(self.live))
        await self._wait_idle(grace_s)
        fail = Fail("The server is shutting down", code=SERVER_SHUTDOWN)
        left = self.live.buffers
        for buffer in left:
            buffer.put(fail)
        if left:
            logger.warning("grace period over: ended %d responses", len(left))
        await self._wait_idle(self.settle_s)
        self.done = True

    async def _wait_idle(self, timeout_s: float) -> None:
        timers = self.timers or asyncio.get_running_loop()
        with contextlib.suppress(TimeoutError):
            async with Deadline(timers, timeout_s):
                # Polled: responses end in many tasks, none of which knows it is last.
                while len(self.live):  # noqa: ASYNC110
                    await anyio.sleep(_POLL_S)


class DrainingServer(uvicorn.Server):
    """``uvicorn.Server`` whose first SIGTERM/SIGINT runs ``drain`` first.

    It also watches ``engine``: once ``engine.stats().failure`` is set (the
    engine stopped for good; its requests have had their in-band errors), the
    server shuts down at once and ``exit_code`` turns 1.

    Args:
        config: the uvicorn config.
        drain: the app's ``Drain`` (``app.state.drain``).
        grace_s: seconds running responses may take to finish.
        engine: the served engine, or ``None`` not to watch one.
        parent_pid: a worker's parent (``workers.py``): once this process has
            another parent (it died), drain as on SIGTERM. With one, a
            SIGTERM or SIGINT during the drain is ignored and SIGQUIT (the
            supervisor's second signal) exits at once.

    Attributes:
        exit_code: 0, or 1 after the engine failed.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        drain: Drain,
        grace_s: float,
        engine: Engine | None = None,
        *,
        parent_pid: int | None = None,
    ) -> None:
        super().__init__(config)
        self.parent_pid = parent_pid
        self.drain = drain
        self.grace_s = grace_s
        self.engine = engine
        self.exit_code = 0
        self._drain_task: asyncio.Task[None] | None = None
        self._signalled = False
        self._supervised = parent_pid is not None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's SIGTERM and SIGINT, and a worker's SIGQUIT (exit now)."""
        if not self._supervised:
            with super().capture_signals():
                yield
            return
        previous = signal.signal(signal.SIGQUIT, self._exit_now)
        try:
            with super().capture_signals():
                yield
        finally:
            signal.signal(signal.SIGQUIT, previous)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """First signal: drain (started on the next tick); second: exit now
        (a worker's: ignored, its supervisor says when)."""
        if self._signalled:
            if self._supervised:
                logger.info("signal %d while draining: the drain goes on", sig)
                return
            super().handle_exit(sig, frame)
            return
        self._signalled = True
        self._captured_signals.append(sig)

    def _exit_now(self, sig: int, frame: FrameType | None) -> None:
        """The supervisor's second signal: uvicorn's shutdown, not waiting for
        the drain."""
        self._signalled = True
        self.should_exit = True

    async def on_tick(self, counter: int) -> bool:
        """uvicorn's tick, plus: start the drain; exit once it is done."""
        if self.parent_pid is not None and os.getppid() != self.parent_pid:
            logger.error("the parent process %d is gone: draining", self.parent_pid)
            self.parent_pid = None
            self._signalled = True
        if self._signalled and self._drain_task is None:
            self._drain_task = asyncio.create_task(self.drain.run(self.grace_s))
        if self.drain.done:
            return True
        if self.engine is not None and counter % _ENGINE_CHECK_TICKS == 0:
            failure = self.engine.stats().failure
            if failure is not None:
                logger.critical("the engine stopped (%s): shutting down", failure)
                self.exit_code = 1
                return True
        return await super().on_tick(counter)
