"""EventLog: the numbered frames of one response, between the decoder and the writer.

The stream side appends the SSE frames ``StreamMachine`` returns; the writer takes
them in order. Every frame gets a sequence number: 0 for the first frame of the
response, then one more per frame. Numbers are implicit (a frame's number is the
log's count of frames before it), so appending costs no per-frame object.

Invariants:

- ``taken_seq <= appended_seq``; the frames numbered ``taken_seq`` up to
  ``appended_seq - 1`` are the ones the writer has not taken yet, in order.
- With ``retain_frames == 0`` (the live path, today's only one) the log holds
  nothing but those untaken frames: ``take()`` hands them over and forgets them.
- With ``retain_frames > 0`` it also keeps up to that many of the latest taken
  frames, so that ``replay(seq)`` can return them again. This is the seam for
  resumable streams: a client that reconnects saying the last sequence number it
  received gets the frames after it replayed from the log, then the live ones.
  Nothing in the server configures retention yet.

Deliberate divergence: the log numbers frames, not SSE ``id:`` fields; no ``id:``
line is written, so the bytes on the wire are unchanged.

Spec: WHATWG HTML, "Server-sent events", "Last-Event-ID" (what a later resume
would carry).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from sluicegate.core.errors import LocalProtocolError

__all__ = ["EventLog"]


class EventLog:
    """Numbered SSE frames of one response; the writer ``take()``s them in order.

    Args:
        retain_frames: taken frames to keep for ``replay`` (frames, >= 0). 0, the
            default, keeps nothing the writer has taken.

    Raises:
        ValueError: ``retain_frames < 0``.
    """

    __slots__ = ("_pending", "_retain_frames", "_retained", "_taken_seq")

    def __init__(self, retain_frames: int = 0) -> None:
        if retain_frames < 0:
            raise ValueError(
                f"retain_frames must be >= 0, got retain_frames={retain_frames!r}"
            )
        self._retain_frames = retain_frames
        self._pending: list[bytes] = []
        self._retained: deque[bytes] = deque(maxlen=retain_frames)
        self._taken_seq = 0

    @property
    def retain_frames(self) -> int:
        """How many taken frames are kept for ``replay`` (frames)."""
        return self._retain_frames

    @property
    def taken_seq(self) -> int:
        """The sequence number of the next frame ``take()`` returns."""
        return self._taken_seq

    @property
    def appended_seq(self) -> int:
        """The sequence number the next appended frame gets (frames appended)."""
        return self._taken_seq + len(self._pending)

    def __len__(self) -> int:
        """Frames appended and not yet taken."""
        return len(self._pending)

    def append(self, frames: Iterable[bytes]) -> int:
        """Append ``frames`` (each one complete SSE frame), numbered in order.

        Returns:
            The sequence number of the first of them (``appended_seq`` before the
            call; for no frames, the number the next frame will get).
        """
        seq = self._taken_seq + len(self._pending)
        self._pending.extend(frames)
        return seq

    def take(self) -> list[bytes]:
        """Every frame not yet taken, in sequence order (``[]`` when none).

        Afterwards ``taken_seq == appended_seq``; the log keeps the frames only
        when ``retain_frames`` asks for it.
        """
        frames = self._pending
        if not frames:
            return []
        self._pending = []
        self._taken_seq += len(frames)
        if self._retain_frames:
            self._retained.extend(frames)
        return frames

    def through(self, frames: list[bytes]) -> list[bytes]:
        """``append(frames)`` then ``take()``, for a writer that writes at once.

        The per-token path of a live stream: with nothing untaken it only counts
        (and retains) ``frames`` and returns that same list.

        Returns:
            Every frame not yet taken, ``frames`` last.
        """
        if self._pending:
            self._pending.extend(frames)
            return self.take()
        self._taken_seq += len(frames)
        if self._retain_frames:
            self._retained.extend(frames)
        return frames

    def replay(self, from_seq: int) -> list[bytes]:
        """The frames numbered ``from_seq`` onwards that the writer has taken.

        Args:
            from_seq: a sequence number (>= 0); ``taken_seq`` returns ``[]``.

        Returns:
            Taken frames ``from_seq`` up to ``taken_seq - 1``, in order. The
            frames not yet taken come from ``take()``, as on the live path.

        Raises:
            LocalProtocolError: ``from_seq`` is beyond ``taken_seq``, or those
                frames are no longer retained (older than the last
                ``retain_frames``, or retention is 0). Nothing changes.
        """
        if not 0 <= from_seq <= self._taken_seq:
            raise LocalProtocolError(
                f"replay from frame {from_seq!r}, but frames 0..{self._taken_seq - 1}"
                " were taken"
            )
        first_retained = self._taken_seq - len(self._retained)
        if from_seq < first_retained:
            raise LocalProtocolError(
                f"replay from frame {from_seq!r}, but only frames from "
                f"{first_retained} on are retained (retain_frames="
                f"{self._retain_frames})"
            )
        retained = self._retained
        return [retained[i] for i in range(from_seq - first_retained, len(retained))]
