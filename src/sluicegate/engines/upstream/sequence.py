"""One sequence of the upstream engine: its outputs, its acceptance, its counts.

``UpstreamSequence`` is what ``UpstreamEngine`` (``engines/upstream/engine.py``) keeps
per running request: the task that serves it, the lease it holds, its time
limit timer (``engines/upstream/limits.py``) and the tokens it has pushed. Its
``accept`` future settles at the stream's first content (or with the refusal
that came first); ``UpstreamOutputs.accepted()`` waits on it.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from sluicegate.core.errors import EngineError
from sluicegate.core.events import FinishReason, TextOutput, Usage
from sluicegate.engines.base import GenerateRequest
from sluicegate.engines.outputs import SequenceOutputs
from sluicegate.engines.upstream.estimate import PromptEstimate
from sluicegate.engines.upstream.pool import Lease

__all__ = [
    "LOGPROBS_UNAVAILABLE",
    "LogprobsUnavailable",
    "UpstreamOutputs",
    "UpstreamSequence",
    "accept",
    "end",
    "refuse",
    "step_tokens",
]


LOGPROBS_UNAVAILABLE = "logprobs_unavailable"
"""The error code of logprobs an upstream does not give: the 400 of a request
that asks them of one known not to, the in-band error of an answer that came
without them (after which the upstream is known not to)."""


class LogprobsUnavailable(EngineError):
    """An upstream answered a request for logprobs without any (in-band)."""

    code: ClassVar[str] = LOGPROBS_UNAVAILABLE


class UpstreamOutputs(SequenceOutputs[TextOutput]):
    """``SequenceOutputs`` of one upstream sequence, and ``AcceptingOutputs``."""

    __slots__ = ("_accept", "_responded", "usage")

    def __init__(
        self,
        on_close: Any,
        accept: asyncio.Future[None],
        responded: asyncio.Future[None],
    ) -> None:
        super().__init__(on_close)
        self._accept = accept
        self._responded = responded
        self.usage: Usage | None = None
        """The upstream's latest usage, or ``None``."""

    async def accepted(self) -> Usage | None:
        """Return once an upstream's stream brought its first content (a text,
        a tool call or a finish): the upstream's usage when it has said one by
        then (continuous usage: its prompt and cached tokens), else ``None``.

        Raises:
            EngineRefused: the upstream's status (429/503 with ``Retry-After``,
                a 4xx with its message; a 502 for a 200 whose stream failed
                before any content), or the pool's 503.
            EngineUnavailable: no upstream could be reached.
            EngineTimeout: the time to first token ran out first.
            EngineError: the sequence ended otherwise before it was accepted.
        """
        await asyncio.shield(self._accept)
        return self.usage

    async def responded(self) -> None:
        """Return once an upstream answered 200 (its stream may bring its
        first content much later: its prefill)."""
        await asyncio.shield(self._responded)


class UpstreamSequence:
    """One sequence's task, deadlines and counts."""

    __slots__ = (
        "accept",
        "emitted",
        "estimate",
        "finish",
        "first_at",
        "guess",
        "last_at",
        "lease",
        "matched_stop",
        "no_logprobs",
        "outputs",
        "request",
        "responded",
        "result",
        "saw_logprobs",
        "saw_text",
        "started",
        "stopped",
        "task",
        "timed_out",
        "timer",
        "usage",
        "usage_rejected",
    )

    def __init__(
        self,
        request: GenerateRequest,
        started: float,
        estimate: PromptEstimate | None = None,
    ) -> None:
        self.request = request
        self.started = started
        self.estimate = estimate  # the engine's, learned from final usages
        self.guess: int | None = None  # its estimate of this prompt, once made
        self.first_at: float | None = None
        self.last_at = started
        self.emitted = 0  # completion tokens pushed so far
        self.usage: Usage | None = None
        self.usage_rejected = False  # the upstream's usage could not be true
        self.finish: FinishReason | None = None
        self.matched_stop: str | None = None  # the upstream's, one asked for
        self.saw_text = self.saw_logprobs = False  # content, and its logprobs
        self.no_logprobs: int | None = None  # the member that sent none asked
        self.lease: Lease | None = None
        self.timed_out: str | None = None
        self.result: str | None = None  # finished, failed or aborted
        self.stopped = False  # closed by the server: a stop string matched
        self.timer: asyncio.TimerHandle | None = None
        self.task: asyncio.Task[None] | None = None
        self.accept: asyncio.Future[None]
        self.responded: asyncio.Future[None]  # set at an upstream's 200
        self.outputs: UpstreamOutputs


def end(seq: UpstreamSequence, result: str, error: EngineError | None) -> None:
    """The sequence's last item: its ``error``, or (aborted) its end."""
    seq.result = result
    if error is None:
        refuse(seq, EngineError("the request was aborted"))
        seq.outputs.end()
    else:
        refuse(seq, error)
        seq.outputs.fail(error)


def accept(seq: UpstreamSequence) -> None:
    """The sequence brought its first content: ``accepted()`` returns."""
    if not seq.accept.done():
        seq.accept.set_result(None)


def refuse(seq: UpstreamSequence, error: EngineError) -> None:
    """``accepted()`` raises ``error``, unless the sequence was accepted."""
    if not seq.accept.done():
        seq.accept.set_exception(error)
        seq.accept.exception()  # retrieved: nobody need await it


def step_tokens(seq: UpstreamSequence) -> int:
    """The completion tokens one output stands for: 1, or what the upstream's
    usage says was generated beyond what was counted."""
    usage = seq.usage
    tokens = 1
    if usage is not None and usage.completion_tokens > seq.emitted + 1:
        tokens = usage.completion_tokens - seq.emitted
    seq.emitted += tokens
    return tokens
