"""What a stream machine's closing frames said, and how much of it was written.

Every stream machine (chat and completions, Responses, Messages) keeps one
``WriteRecord``. It adds what its closing frames say (a choice's finish, the
terminator, the error event) as it returns them; the server reports what
became of the frames (h11's ``send_failed()``): ``wrote()`` when every frame
returned so far reached the connection, ``write_failed()`` when writing stopped
first (the connection broke, the client left, or the server gave up on a slow
client). ``outcome(n)`` is ``classify()`` (``endstate.py``) of what was
written, the same rule the client applies to the bytes it received, so the
server's ledger and the client agree.

Only closing frames move the outcome: a writer may leave out the report after
content frames alone (the eager writer does, once per token), as long as it
reports each write that holds one of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sluicegate.core.endstate import EndState, classify
from sluicegate.core.errors import LocalProtocolError

__all__ = ["Closing", "WriteRecord"]


@dataclass(frozen=True, slots=True)
class Closing:
    """What some closing frames say: finish chunks, the terminator, the error."""

    finishes: int = 0
    done: bool = False
    error: Mapping[str, Any] | None = None

    def plus(self, later: Closing) -> Closing:
        """Both together (the first error kept)."""
        return Closing(
            self.finishes + later.finishes,
            self.done or later.done,
            self.error if self.error is not None else later.error,
        )


_NOTHING = Closing()


class WriteRecord:
    """The closing frames returned (``add``) and those reported written."""

    __slots__ = ("_gone", "_pending", "_written")

    def __init__(self) -> None:
        self._pending = _NOTHING  # returned since the last ``wrote()``
        self._written = _NOTHING
        self._gone = False

    def add(
        self,
        finishes: int = 0,
        done: bool = False,
        error: Mapping[str, Any] | None = None,
    ) -> None:
        """Closing frames were returned: ``finishes`` choices' finishes, the
        terminator (``done``), the in-band ``error`` object."""
        self._pending = self._pending.plus(Closing(finishes, done, error))

    def wrote(self) -> None:
        """Every frame returned so far was written to the connection.

        Raises:
            LocalProtocolError: after ``write_failed()``; nothing changes.
        """
        if self._gone:
            raise LocalProtocolError("wrote() after write_failed()")
        pending = self._pending
        if pending is not _NOTHING:
            self._written = self._written.plus(pending)
            self._pending = _NOTHING

    def write_failed(self) -> None:
        """Writing stopped before the frames since the last ``wrote()`` went
        out. Idempotent; the outcome is final from here on."""
        self._gone = True
        self._pending = _NOTHING

    def outcome(self, n: int) -> EndState:
        """``classify(200, finishes written, n, terminator written, error
        written, client_gone=write_failed() was reported)``: ``FINISHED`` once
        the terminator was written after ``n`` finishes, ``ERRORED`` once the
        error event was, ``ABORTED`` when the writing failed before either,
        ``TRUNCATED`` while the stream runs (or when its last frames were never
        reported written)."""
        w = self._written
        return classify(200, w.finishes, n, w.done, w.error, client_gone=self._gone)
