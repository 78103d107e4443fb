"""The frames between the workers and the engine process: length, then a pickle.

One frame is a 4-byte big-endian length and that many bytes of a pickled
list of messages, each a tuple whose first item names it (``GENERATE``,
``ABORT``, ...; see ``host.py`` and ``engine.py`` for who sends which).
A sender gathers what one pass of its event loop produced (the outputs of one
engine step, for the engine) into one frame: one pickle, one write.
``encode_frames`` packs messages; ``FrameReader.feed(data)`` returns every
message that the bytes so far complete, in order, keeping a partial frame for
the next call.

Why pickle: both ends are this package, in processes of one user, over a Unix
socket in a folder only that user may open (``host.py``); the messages
are the engine protocol's own frozen dataclasses (``GenerateRequest``,
``EngineOutput``, ``EngineStats``), which pickle in about a microsecond each
with no schema to keep in step. A peer that is not this package is not
expected, but a frame past ``MAX_FRAME_BYTES`` still ends the connection
(``FrameTooLarge``) before it is buffered.

Why this and not pyzmq: ``bench/ipc.py`` (docs/performance.md, "The engine
process") measured the worker's CPU per token frame lower here (2.3-2.9 us
against 2.7-3.4 us for pyzmq with a step in one message, 16-25 us with a
message per frame) and round trips no longer; and this needs no dependency.
One connection per worker keeps each worker's frames in order.
"""

from __future__ import annotations

import pickle
import struct
from typing import Final

from sluicegate.core.errors import RemoteProtocolError

__all__ = [
    "ABORT",
    "ACCEPTED",
    "END",
    "FAIL",
    "GENERATE",
    "GRAMMAR",
    "GRAMMAR_CHECK",
    "GRAMMAR_DONE",
    "HELLO",
    "MAX_FRAME_BYTES",
    "OUTPUT",
    "REFUSED",
    "STATS",
    "FrameReader",
    "FrameTooLarge",
    "encode_frames",
]

HELLO: Final = "hello"
"""engine -> worker, first: ``(HELLO, ModelInfo, Capabilities, model path)``."""
GENERATE: Final = "generate"
"""worker -> engine: ``(GENERATE, GenerateRequest)``."""
ABORT: Final = "abort"
"""worker -> engine: ``(ABORT, request_id, stopped)``."""
GRAMMAR: Final = "grammar"
"""worker -> engine: ``(GRAMMAR, ask_id, Grammar)``: compile it ahead."""
GRAMMAR_CHECK: Final = "grammar_check"
"""worker -> engine: ``(GRAMMAR_CHECK, ask_id, text)``: compile the grammar
``text`` without a vocabulary; ``GRAMMAR_DONE`` carries its errors."""
ACCEPTED: Final = "accepted"
"""engine -> worker: ``(ACCEPTED, request_id)``: queued."""
REFUSED: Final = "refused"
"""engine -> worker: ``(REFUSED, request_id, kind, message, param)``; ``kind``
is ``unavailable``, ``request`` or ``engine``."""
OUTPUT: Final = "output"
"""engine -> worker: ``(OUTPUT, request_id, EngineOutput)``."""
FAIL: Final = "fail"
"""engine -> worker: ``(FAIL, request_id, message)``: an ``EngineError``."""
END: Final = "end"
"""engine -> worker: ``(END, request_id)``: ended without a finish (aborted)."""
STATS: Final = "stats"
"""engine -> worker: ``(STATS, EngineStats)``, whenever they changed."""
GRAMMAR_DONE: Final = "grammar_done"
"""engine -> worker: ``(GRAMMAR_DONE, ask_id, errors)``: ``errors`` is the list
of llguidance's messages for a ``GRAMMAR_CHECK`` (``[]``: it compiles), and
``[]`` for a ``GRAMMAR``."""

MAX_FRAME_BYTES = 64 * 1024 * 1024
"""The largest frame accepted (a prompt of a million token ids pickles to
about 5 MB)."""

_LENGTH = struct.Struct(">I")


class FrameTooLarge(RemoteProtocolError):
    """A frame announced more than ``MAX_FRAME_BYTES``: the peer is not ours."""


def encode_frames(messages: list[tuple[object, ...]]) -> bytes:
    """``messages``, in order, as one frame (``b""`` for none).

    Raises:
        FrameTooLarge: they pickle past ``MAX_FRAME_BYTES``.
    """
    if not messages:
        return b""
    body = pickle.dumps(messages, protocol=pickle.HIGHEST_PROTOCOL)
    if len(body) > MAX_FRAME_BYTES:
        raise FrameTooLarge(
            f"expected a frame of at most {MAX_FRAME_BYTES} bytes, got {len(body)}"
        )
    return _LENGTH.pack(len(body)) + body


class FrameReader:
    """Bytes in, whole messages out; a partial frame waits for the rest."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[object, ...]]:
        """Every message ``data`` completes, in order (``[]`` for none).

        Raises:
            FrameTooLarge: a frame announces more than ``MAX_FRAME_BYTES``;
                the reader is then unusable.
        """
        buffer = self._buffer
        buffer += data
        messages: list[tuple[object, ...]] = []
        start = 0
        size = len(buffer)
        while size - start >= 4:
            (length,) = _LENGTH.unpack_from(buffer, start)
            if length > MAX_FRAME_BYTES:
                raise FrameTooLarge(
                    f"expected a frame of at most {MAX_FRAME_BYTES} bytes, "
                    f"got a length of {length}"
                )
            end = start + 4 + length
            if end > size:
                break
            messages.extend(pickle.loads(buffer[start + 4 : end]))
            start = end
        del buffer[:start]
        return messages
