"""The one race of a response's task against the client leaving, or being given up on.

``DisconnectRace`` is a context manager used by both responses of a generation:
inside it, one more task awaits ``receive()``, and when the client disconnects,
or when ``stop(reason)`` is called (a full buffer, a stuck write), the
response's own task is cancelled with that reason. The cancellation ends at the
``with``, which then goes on normally with ``reason`` set; anyone else's
cancellation of the task passes through (``asyncio.timeout``'s pattern:
``uncancel()`` tells ours from theirs).

Invariants:
    - The task is cancelled at most once by the race, and only while it waits
      inside the ``with``; a ``stop`` after the ``with`` ended is ignored
      instead of cancelling whatever the task does next.
    - The watcher task ends with the ``with``, which lets go of it (no
      reference cycle outlives a response: it is freed when it ends).

Spec: docs/DESIGN.md, "End states" (``aborted``);
ASGI HTTP spec, ``http.disconnect``.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any

from starlette.types import Message, Receive

__all__ = ["CLIENT_GONE", "DisconnectRace"]

CLIENT_GONE = "the client disconnected"
"""``DisconnectRace.reason`` when the client disconnected."""


class DisconnectRace:
    """Cancels the current task when the client leaves or ``stop()`` is called.

    Args:
        receive: the request's ASGI ``receive``; only the race reads it while
            the ``with`` runs (the request body was read before).

    Attributes:
        reason: why the task was stopped (``CLIENT_GONE`` or the ``stop``
            reason), or ``None`` while it was not.

    Raises:
        RuntimeError: entered outside a task.
    """

    __slots__ = ("_receive", "_task", "_watcher", "reason")

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._task: asyncio.Task[Any] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self.reason: str | None = None

    def __enter__(self) -> DisconnectRace:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("DisconnectRace runs in a task")
        self._task = task
        self._watcher = asyncio.get_running_loop().create_task(self._watch())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        task, self._task = self._task, None  # disarmed: later stops are ignored
        # Let go of the watcher: cancelled, it keeps a traceback whose frame
        # holds this race, a cycle only the garbage collector would free.
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
        return (
            exc_type is not None
            and issubclass(exc_type, asyncio.CancelledError)
            and self.reason is not None
            and task is not None
            and task.uncancel() == 0
        )

    def stop(self, reason: str) -> None:
        """Cancel the task for ``reason``, once; ignored after the ``with``.

        Called from the task itself (a buffer that overflows while the task
        fills it), the cancellation waits for the task's next pause: a
        cancellation asked of a running task stays pending until its next
        ``await`` that suspends, and one that the ``with`` ended before would
        hit whatever the task awaits next (the body's last chunk). Should the
        ``with`` end first, the stop never happened: ``reason`` stays ``None``.
        """
        if self.reason is not None or self._task is None:
            return
        if asyncio.current_task() is self._task:
            asyncio.get_running_loop().call_soon(self._stop_later, reason)
            return
        self.reason = reason
        self._task.cancel()

    def _stop_later(self, reason: str) -> None:
        if self.reason is None and self._task is not None:
            self.reason = reason
            self._task.cancel()

    async def _watch(self) -> None:
        while True:
            message: Message = await self._receive()
            if message["type"] == "http.disconnect":
                self.stop(CLIENT_GONE)
                return
