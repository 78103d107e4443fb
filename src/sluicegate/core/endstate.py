"""The end state of a stream, and the one rule that classifies it.

The server's ledger (through ``StreamMachine.outcome``, on the frames it wrote),
the client and the conformance checker (on the bytes they received) all call
``classify``, so they agree on every request's end. A non-streamed response
(one JSON body) has its own, shorter rule: ``classify_body``.

Spec: docs/DESIGN.md, "End states".
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

__all__ = ["EndState", "classify", "classify_body"]


class EndState(StrEnum):
    """Every stream ends in exactly one of these (docs/DESIGN.md, "End states")."""

    REJECTED = "rejected"
    """An error status was answered before any byte of the stream."""
    FINISHED = "finished"
    """Every choice had its ``finish_reason``, then ``[DONE]`` came."""
    ERRORED = "errored"
    """An in-band error event came after the first byte."""
    ABORTED = "aborted"
    """The client went away before the end; the engine was told to abort."""
    TRUNCATED = "truncated"
    """The connection ended without a finish for every choice and ``[DONE]``."""


def classify(
    status: int | None,
    finished_choices: int,
    n: int,
    saw_done: bool,
    error: Mapping[str, Any] | None,
    client_gone: bool = False,
) -> EndState:
    """Classify one stream from what was observed, first rule that holds wins.

    1. ``status`` is not ``None`` and not 200: ``REJECTED``.
    2. ``error`` (an in-band error object) was received: ``ERRORED``.
    3. ``finished_choices >= n`` and ``saw_done``: ``FINISHED``.
    4. ``client_gone``: ``ABORTED``.
    5. Otherwise: ``TRUNCATED`` (also when no status came at all).

    Args:
        status: the HTTP status, or ``None`` when the connection failed before one.
        finished_choices: choices whose ``finish_reason`` was seen (>= 0).
        n: choices requested (>= 1).
        saw_done: whether ``data: [DONE]`` was seen.
        error: the in-band ``error`` object, or ``None``.
        client_gone: the client disconnected (server side) or gave up (client
            side) before the end.

    Raises:
        ValueError: ``n < 1`` or ``finished_choices < 0``.
    """
    if n < 1 or finished_choices < 0:
        raise ValueError(
            f"expected n >= 1 and finished_choices >= 0, got n={n!r}, "
            f"finished_choices={finished_choices!r}"
        )
    if status is not None and status != 200:
        return EndState.REJECTED
    if error is not None:
        return EndState.ERRORED
    if finished_choices >= n and saw_done:
        return EndState.FINISHED
    if client_gone:
        return EndState.ABORTED
    return EndState.TRUNCATED


def classify_body(client_gone: bool, failed: bool, written: bool) -> EndState:
    """Classify one non-streamed response (one JSON body), first rule that holds.

    1. ``client_gone`` before the generation ended: ``ABORTED`` (nothing sent).
    2. not ``written`` (the connection broke under the body): ``ABORTED``.
    3. ``failed`` (the generation ended with an error, answered with its error
       status and body): ``ERRORED``.
    4. Otherwise: ``FINISHED`` (the whole body went out with status 200).

    A refusal before the generation started is ``REJECTED`` and never gets here.

    Args:
        client_gone: the client disconnected while the generation ran.
        failed: the generation ended with a failure instead of its ``End``.
        written: the body (a completion, or the error) was handed to the
            connection without an error.
    """
    if client_gone or not written:
        return EndState.ABORTED
    return EndState.ERRORED if failed else EndState.FINISHED
