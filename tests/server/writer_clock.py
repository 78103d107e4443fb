"""A ``ManualClock`` that a ledger's writer thread waits on, for tests that step
its retries and its ``close()`` limit instead of sleeping past them."""

from __future__ import annotations

import threading
from collections.abc import Callable

from sluicegate.engines.clocks import ManualClock, Timer
from sluicegate.server.ledger.ledger import Ledger


class WriterClock(ManualClock):
    """A ``ManualClock`` for a ledger's writer thread, and its ``close()`` run
    in a thread of its own: ``settle()`` waits until that writer set a timer
    on it (its back-off after a refusal) or the close ended."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__()
        writer = ledger._writer
        assert writer is not None
        writer.timers = self
        self._ledger = ledger
        self._writer_thread = writer._thread.name
        self._moved = threading.Event()
        self.closed = threading.Event()

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        if threading.current_thread().name == self._writer_thread:
            self._moved.set()
        return super().call_at(when, callback)

    def settle(self) -> None:
        assert self._moved.wait(10), "the writer neither backed off nor closed"
        self._moved.clear()

    def close(self) -> None:
        """Start ``ledger.close()`` (as the app's shutdown does)."""

        def run() -> None:
            self._ledger.close()
            self.closed.set()
            self._moved.set()

        threading.Thread(target=run).start()

    def step_until_closed(self, step_s: float) -> None:
        for _ in range(1000):
            if self.closed.is_set():
                return
            self.advance(step_s)
            self.settle()
        raise AssertionError("the ledger did not close")
