"""WorkerSupervisor: starts the children of ``serve --workers``, restarts, stops.

The children are the engine process (when there is one) and one worker per
listening socket (``workers.py``). A child that exits while nothing asked it
to is started again after its ``RestartBudget``'s delay (``core/restarts.py``);
past the budget's limit the supervisor stops every child and exits 1, having
logged which child and the limit. On SIGTERM or SIGINT it signals every worker
once per signal (the first, SIGTERM, drains; a later one, SIGQUIT, ends them),
and the engine process only once every worker has exited, so that draining
streams keep their engine. The children may get the same signal directly
(systemd's ``KillMode=control-group`` signals every process of the service):
a worker's first drains and a repeat is ignored, and the engine process
serves until no worker is connected (``host.py``), so that is the same drain.

The engine process may also be alive and not working: stopped, its loop
blocked, or in a step that never returns. It writes a beat every 50 ms
(``engines/remote/host.py``); a ``StuckWatch`` (``core/restarts.py``) reads
them every ``BEAT_READ_S``, and an engine process with no beat for
``heartbeat_s`` seconds, or busy with no progress for ``step_deadline_s``, is
killed with SIGKILL: its workers' streams end with the in-band
``engine_crashed`` error, and it is restarted as after any other exit.

The parent sleeps until something happens: a child's exit (a pidfd per child
becomes readable), a signal (its wake-up fd), a restart that is due, or the
next read of the beat. It used to wake every 50 ms to poll; on a machine whose
cores llama.cpp's threads keep busy, each wake-up of another process takes a
core from one of them while the other waits for it at the step's barrier
(docs/performance.md, "The engine process"). Without pidfds (not Linux) it
polls every ``POLL_S``.

Each child runs in a process group of its own, in the parent's session: a
terminal's Ctrl-C reaches only the parent, which forwards it once. Not a
session of its own: the kernel's autogroup scheduling makes each session a
group with a whole group's share of a core, so that a worker's wake-up
competes with the engine process's threads unlike one process's threads
with each other (measured in two rounds, not settled: docs/performance.md,
"The real model's split").

Spec: docs/serving.md, "Workers" and "The engine process".
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from sluicegate.core.restarts import RestartBudget, StuckWatch
from sluicegate.engines.remote.host import read_beat

__all__ = ["BEAT_READ_S", "POLL_S", "WorkerSupervisor"]

logger = logging.getLogger(__name__)

POLL_S = 0.05
"""Seconds between two looks at the children where a child's exit cannot be
waited for (no ``os.pidfd_open``)."""
BEAT_READ_S = 0.5
"""Seconds between two reads of the engine process's beat: a stuck engine is
killed at most this long after its limit."""

_STOPPED = (0, -signal.SIGTERM, -signal.SIGINT, 128 + signal.SIGINT)
"""The exit codes of a child that stopped as told: a worker drained on SIGINT
(had directly) exits as ``serve`` does on Ctrl-C, 130."""


@dataclass(slots=True)
class _Slot:
    name: str  # "worker 0", "engine process"
    command: Sequence[str]
    fds: tuple[int, ...]
    budget: RestartBudget
    process: subprocess.Popen[bytes] | None = None
    started_s: float = 0.0
    restart_at_s: float | None = None
    exits: list[int] = field(default_factory=list)
    signalled: bool = False
    beat: Path | None = None  # the engine process's beat file
    watch: StuckWatch | None = None
    kills: list[str] = field(default_factory=list)  # why each stuck one was
    exited: int | None = None  # a pidfd readable once the process exits


class WorkerSupervisor:
    """Start the engine process (if any) and a worker per listening socket,
    restart those that exit, stop them on a signal.

    Args:
        worker_command: the command line of a worker (it gets ``--listen-fd``
            with its own descriptor after it).
        fds: the descriptor each worker inherits (its listening socket); one
            worker per descriptor.
        env: the children's environment.
        engine_command: the engine process's command line; ``None``: none.
        budget: a fresh ``RestartBudget`` per child.
        clock: a monotonic clock in seconds.
        engine_beat: the engine process's beat file (``None``: not watched).
        watch: a fresh ``StuckWatch`` per start of the engine process.
    """

    def __init__(
        self,
        worker_command: Sequence[str],
        fds: Sequence[int],
        env: Mapping[str, str],
        engine_command: Sequence[str] | None = None,
        budget: Callable[[], RestartBudget] = RestartBudget,
        clock: Callable[[], float] = time.monotonic,
        engine_beat: Path | None = None,
        watch: Callable[[], StuckWatch] = StuckWatch,
    ) -> None:
        self._new_watch = watch
        self._env = dict(env)
        self._clock = clock
        self.workers = [
            _Slot(
                f"worker {i}",
                [*worker_command, "--listen-fd", str(fd)],
                (fd,),
                budget(),
            )
            for i, fd in enumerate(fds)
        ]
        self.engine = (
            None
            if engine_command is None
            else _Slot("engine process", engine_command, (), budget(), beat=engine_beat)
        )
        self._signals = 0
        self._forwarded = 0
        self.exit_code = 0

    def run(self) -> int:
        """Run until every child has exited after a signal, or a child gave up
        (its restart limit); returns the exit code: 0, or 1 when a child gave
        up or stopped with an error.

        On a signal the workers drain first (their streams may still need the
        engine); the engine process is stopped once they have all exited.
        """
        previous = {
            sig: signal.signal(sig, self._on_signal)
            for sig in (signal.SIGTERM, signal.SIGINT)
        }
        woken, wake = os.pipe()
        os.set_blocking(woken, False)
        os.set_blocking(wake, False)
        previous_wake = signal.set_wakeup_fd(wake, warn_on_full_buffer=False)
        try:
            for slot in self._children():
                self._start(slot)
            while not self._finished():
                self._forward_signals()
                for slot in self._children():
                    self._watch(slot)
                self._sleep(woken)
        finally:
            signal.set_wakeup_fd(previous_wake)
            os.close(woken)
            os.close(wake)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._kill_all()
            for slot in self._children():
                self._close_pidfd(slot)
        return self.exit_code

    def _sleep(self, woken: int) -> None:
        """Until a child exits, a signal comes (``woken`` is the signals'
        wake-up fd), a restart is due or the beat is to be read."""
        timeout_s = BEAT_READ_S
        now = self._clock()
        for slot in self._children():
            if slot.process is None and slot.restart_at_s is not None:
                timeout_s = min(timeout_s, max(0.0, slot.restart_at_s - now))
            elif slot.process is not None and slot.exited is None:
                timeout_s = min(timeout_s, POLL_S)  # no pidfd: poll
        poller = select.poll()
        poller.register(woken, select.POLLIN)
        for slot in self._children():
            if slot.exited is not None:
                poller.register(slot.exited, select.POLLIN)
        if any(fd == woken for fd, _ in poller.poll(timeout_s * 1000)):
            os.read(woken, 512)  # the signal's handler has run

    def _children(self) -> list[_Slot]:
        return self.workers if self.engine is None else [self.engine, *self.workers]

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        self._signals += 1

    def _stopping(self) -> bool:
        return self._signals > 0

    def _finished(self) -> bool:
        return self._stopping() and all(s.process is None for s in self._children())

    def _forward_signals(self) -> None:
        if self._stopping() and all(s.process is None for s in self.workers):
            engine = self.engine  # every worker is gone: the engine may go
            if engine is not None and engine.process and not engine.signalled:
                engine.process.send_signal(signal.SIGTERM)
                engine.signalled = True
        if self._forwarded == self._signals:
            return
        # The first drains; a worker ignores a repeated SIGTERM (it may have
        # had one directly), so a later one is SIGQUIT: end now.
        order = signal.SIGTERM if self._forwarded == 0 else signal.SIGQUIT
        self._forwarded = self._signals
        logger.info("stopping %d workers", sum(1 for s in self.workers if s.process))
        for slot in self.workers:
            slot.restart_at_s = None
            if slot.process is not None and slot.process.poll() is None:
                slot.process.send_signal(order)
        if self.engine is not None:
            self.engine.restart_at_s = None  # no restart while stopping

    def _watch(self, slot: _Slot) -> None:
        now = self._clock()
        if slot.process is None:
            due = slot.restart_at_s
            if due is not None and now >= due and not self._stopping():
                self._start(slot)
            return
        code = slot.process.poll()
        if code is None:
            self._watch_beat(slot, now)
            return
        slot.process = None
        self._close_pidfd(slot)
        slot.exits.append(code)
        if self._stopping():
            if code not in _STOPPED:
                self.exit_code = 1
            return
        delay = slot.budget.after_exit(now, now - slot.started_s)
        if delay is None:
            logger.critical(
                "%s exited with %d; restart limit reached (%d in %g s): "
                "stopping everything",
                slot.name,
                code,
                slot.budget.limit,
                slot.budget.window_s,
            )
            self.exit_code = 1
            self._signals += 1
            return
        logger.error(
            "%s exited with %d; restarting it in %.1f s (limit: %d restarts in %g s)",
            slot.name,
            code,
            delay,
            slot.budget.limit,
            slot.budget.window_s,
        )
        slot.restart_at_s = now + delay

    def _watch_beat(self, slot: _Slot, now: float) -> None:
        if slot.watch is None or slot.beat is None or slot.process is None:
            return
        stuck = slot.watch.feed(now, read_beat(slot.beat))
        if stuck is None:
            return
        logger.critical("%s is stuck (%s): killing it", slot.name, stuck)
        slot.kills.append(stuck)
        slot.watch = None  # one kill; its exit restarts it as any other
        slot.process.kill()

    def _start(self, slot: _Slot) -> None:
        slot.restart_at_s = None
        slot.started_s = self._clock()
        if slot.beat is not None:  # a beat of the last one is no beat of this one
            with contextlib.suppress(FileNotFoundError):
                slot.beat.unlink()
            slot.watch = self._new_watch()
        slot.process = subprocess.Popen(
            slot.command,
            pass_fds=slot.fds,
            env=self._env,
            # Its own process group: a terminal's Ctrl-C reaches the parent
            # only, which forwards it once (two would end the drain). The
            # parent's session: one scheduling autogroup with it.
            process_group=0,
        )
        pidfd_open = getattr(os, "pidfd_open", None)
        if pidfd_open is not None:
            with contextlib.suppress(OSError):  # a kernel before 5.3: polled
                slot.exited = pidfd_open(slot.process.pid)
        logger.info("%s started (pid %d)", slot.name, slot.process.pid)

    @staticmethod
    def _close_pidfd(slot: _Slot) -> None:
        if slot.exited is not None:
            os.close(slot.exited)
            slot.exited = None

    def _kill_all(self) -> None:
        """On the way out (a bug here, or ``run`` interrupted): no orphans."""
        for slot in self._children():
            if slot.process is not None and slot.process.poll() is None:
                slot.process.kill()
                slot.process.wait()
