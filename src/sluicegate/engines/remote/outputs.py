"""Outputs that await the engine's acceptance; blocking reads of its socket.

``RemoteOutputs`` is what ``RemoteEngine.generate`` returns: the outputs of one
sequence (``SequenceOutputs``) that are also ``AcceptingOutputs``. ``hello``
reads what an engine process says to a new connection, and ``FrameStream``
the messages of a blocking socket (``connect`` and ``compile_grammar`` run off
the event loop).

Spec: docs/serving.md, "The engine process".
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from pathlib import Path

from sluicegate.core.events import EngineOutput, Usage
from sluicegate.engines.outputs import SequenceOutputs
from sluicegate.engines.remote.frames import HELLO, STATS, FrameReader

__all__ = ["FrameStream", "RemoteOutputs", "hello"]

_READ_BYTES = 1 << 16


class RemoteOutputs(SequenceOutputs[EngineOutput]):
    """``SequenceOutputs`` that are also ``AcceptingOutputs``: ``accepted()``
    returns once the engine process queued the request."""

    __slots__ = ("_accepted",)

    def __init__(self, on_close: Callable[[], None]) -> None:
        super().__init__(on_close)
        self._accepted: asyncio.Future[None] = (
            asyncio.get_running_loop().create_future()
        )

    async def accepted(self) -> Usage | None:
        """Return once the engine queued the request (no usage known then).

        Raises:
            EngineUnavailable: its queue is full, or the engine is away.
            RequestError: it can never serve the request.
            EngineError: it failed otherwise.
        """
        await asyncio.shield(self._accepted)
        return None

    async def responded(self) -> None:
        """As ``accepted()``: the engine answers in one step."""
        await asyncio.shield(self._accepted)

    @property
    def usage(self) -> Usage | None:
        """``None``: the engine process says no usage before its outputs."""
        return None

    def settle(self, error: BaseException | None) -> None:
        """Resolve ``accepted()``: with ``error``, or accepted."""
        if self._accepted.done():
            return
        if error is None:
            self._accepted.set_result(None)
        else:
            self._accepted.set_exception(error)
            self._accepted.exception()  # the server reads it, or not at all


def hello(path: Path) -> tuple[tuple[object, ...], object]:
    """``HELLO`` and the first ``STATS`` of the engine at ``path``.

    Raises:
        OSError: nothing listens there, or it closed first.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30.0)
        sock.connect(str(path))
        hello: tuple[object, ...] | None = None
        for message in FrameStream(sock):
            if message[0] == HELLO:
                hello = message
            elif message[0] == STATS and hello is not None:
                return hello, message[1]
    raise ConnectionError("the engine process closed before it said hello")


class FrameStream:
    """The messages of a blocking socket, until it closes."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._reader = FrameReader()
        self._queued: list[tuple[object, ...]] = []

    def __iter__(self) -> FrameStream:
        return self

    def __next__(self) -> tuple[object, ...]:
        while not self._queued:
            data = self._sock.recv(_READ_BYTES)
            if not data:
                raise StopIteration
            self._queued = self._reader.feed(data)
        return self._queued.pop(0)
