"""The hand-off of a worker thread's outputs to their requests' event loops.

The llama.cpp worker ``emit``s each sequence's item (an output, its failure,
or ``ABORTED``) under the engine's lock; ``flush`` sends everything emitted so
far with one ``loop.call_soon_threadsafe`` per event loop (one wake-up of the
loop per step, not per sequence), and on the loop ``deliver`` pushes each item
into its sequence's ``SequenceOutputs``, in order. The worker never waits on a
consumer. ``LlamaSequence`` is a sequence as the worker holds it (the loop its
items go to); ``after_current_callback`` lets a loop end the callback that is
submitting work before the worker admits it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from sluicegate.core.errors import EngineError
from sluicegate.core.events import EngineOutput
from sluicegate.core.scheduling import Scheduled
from sluicegate.engines.base import GenerateRequest
from sluicegate.engines.outputs import SequenceOutputs

__all__ = [
    "ABORTED",
    "Consumer",
    "Handoff",
    "Item",
    "LlamaSequence",
    "after_current_callback",
    "deliver",
]

ABORTED = None
"""The item delivered when the request was aborted: its outputs end."""

Item = EngineOutput | EngineError | None
"""What a sequence's outputs get: an output, its failure, or ``ABORTED``."""


class Consumer(Protocol):
    """A sequence as the hand-off sees it: where its items go."""

    loop: asyncio.AbstractEventLoop
    """The event loop that reads its outputs."""
    outputs: SequenceOutputs[EngineOutput]


_C = TypeVar("_C", bound=Consumer)


def deliver(items: list[tuple[_C, Item]]) -> None:
    """On the event loop: hand each item to its sequence's outputs, in order."""
    for seq, item in items:
        if item is None:
            seq.outputs.end()
        elif isinstance(item, EngineError):
            seq.outputs.fail(item)
        else:
            seq.outputs.push(item)


class Handoff(Generic[_C]):
    """Items emitted by a worker thread, waiting for the next ``flush``.

    Args:
        lock: the engine's lock; ``emit`` is called under it, ``flush`` takes it.
    """

    def __init__(self, lock: threading.Condition) -> None:
        self._lock = lock
        self._pending: list[tuple[_C, Item]] = []

    def emit(self, seq: _C, item: Item) -> None:
        """Queue ``item`` for ``seq``'s consumer (under the lock); see ``flush``."""
        self._pending.append((seq, item))

    def flush(self) -> None:
        """Send what ``emit`` queued: one loop callback per event loop.

        Scheduled under the lock (``call_soon_threadsafe`` never blocks): the
        worker and an ``abort()`` on the loop both flush, and a batch taken by
        one must reach the loop before a later step's batch taken by the other.
        """
        with self._lock:
            pending, self._pending = self._pending, []
            if not pending:
                return
            by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_C, Item]]] = {}
            for seq, item in pending:
                by_loop.setdefault(seq.loop, []).append((seq, item))
            for loop, items in by_loop.items():
                # A closed consumer loop raises RuntimeError: nobody is left.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(deliver, items)


@dataclass(eq=False, slots=True, kw_only=True)
class LlamaSequence(Scheduled):
    """One request's sequence in the worker: the scheduler's state, its loop and
    outputs, and its sampler and grammar constraint once made."""

    request: GenerateRequest
    loop: asyncio.AbstractEventLoop
    outputs: SequenceOutputs[EngineOutput]
    sampler: Any = None
    constraint: Any = None  # a TokenConstraint, made on the first draw
    budget: Any = None  # a BudgetForcer, for a request with a reasoning budget


def after_current_callback(loop: asyncio.AbstractEventLoop) -> None:
    """Wait until ``loop`` has ended the callback it is running (at most 50 ms).

    The worker calls this when work wakes it from idle: the choices of one
    request (``n`` > 1) are submitted one after another in one callback, and
    admitting the first before the others arrive would run them in different
    steps, hence different batches, and llama.cpp's arithmetic depends on a
    batch's size: a seeded request would not repeat itself. A loop that is
    closed or blocked past the bound is not waited for.
    """
    turn = threading.Event()
    try:
        loop.call_soon_threadsafe(turn.set)
    except RuntimeError:  # the loop is closed
        return
    turn.wait(0.05)
