"""One end of the socket between a worker and the engine process: frames in and out.

``FrameLink`` is the asyncio protocol of both ends (``engine.py`` in a worker,
``host.py`` in the engine process), so the frame loop is written once: the
bytes received go through a ``FrameReader`` and each whole message, in order,
to ``receive``; the messages ``send`` is given during one pass of the event
loop leave as one frame (one pickle, one write) when that pass ends.

Invariants:
    - A frame that announces more than ``MAX_FRAME_BYTES`` aborts the link
      before it is buffered (the peer is not this package).
    - With ``max_unread_bytes``, a write buffer past it aborts the link: a
      peer that stopped reading (a worker whose loop is stuck) is let go
      rather than buffered for without end.
    - Nothing is sent once the link lost its connection.

Spec: docs/serving.md, "The engine process"; ``frames.py``.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from typing import cast

from sluicegate.engines.remote.frames import FrameReader, FrameTooLarge, encode_frames

__all__ = ["FrameLink"]

logger = logging.getLogger(__name__)


class FrameLink(asyncio.Protocol, abc.ABC):
    """A connection that reads and writes ``frames.py``'s frames.

    Args:
        peer: who is at the other end, for the log ("engine", "worker").
        max_unread_bytes: bytes the peer may leave unread before the link is
            aborted; ``None``: no bound.

    Attributes:
        transport: the connection, or ``None`` before it is made and once lost.
    """

    def __init__(self, peer: str, max_unread_bytes: int | None = None) -> None:
        self._peer = peer
        self._max_unread_bytes = max_unread_bytes
        self._reader = FrameReader()
        self._pending: list[tuple[object, ...]] = []
        self._flush_due = False
        self.transport: asyncio.Transport | None = None

    @abc.abstractmethod
    def receive(self, message: tuple[object, ...]) -> None:
        """One message from the peer, in the order sent (on the event loop)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._pending = []

    def data_received(self, data: bytes) -> None:
        try:
            messages = self._reader.feed(data)
        except FrameTooLarge as exc:
            logger.error("%s link closed: %s", self._peer, exc)
            assert self.transport is not None
            self.transport.abort()
            return
        for message in messages:
            self.receive(message)

    def send(self, message: tuple[object, ...]) -> None:
        """Queue ``message``; what is queued is written once this loop pass
        ends (dropped when the connection is gone)."""
        if self.transport is None:
            return
        self._pending.append(message)
        if not self._flush_due:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Write what is queued now, as one frame."""
        self._flush_due = False
        pending, self._pending = self._pending, []
        transport = self.transport
        if transport is None or not pending:
            return
        transport.write(encode_frames(pending))
        limit = self._max_unread_bytes
        if limit is not None and transport.get_write_buffer_size() > limit:
            logger.error("%s link closed: %d bytes unread", self._peer, limit)
            transport.abort()
