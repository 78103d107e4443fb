"""One upstream's 200 stream read into its sequence: content, finish, metering, errors.

``read_stream`` feeds the body's bytes to an ``UpstreamReader``
(``core/upstream/reader.py``) and pushes a ``TextOutput`` for each text or tool-call
fragment of choice 0 (the upstream engine asks for ``n: 1``). The bytes come
from the connection's read callback (``HopResponse.pour``), one read at a time,
so a token costs no task switch; a burst longer than ``YIELD_BYTES`` or one
that meets a backlog of untaken outputs goes to the reading task instead.
The first content accepts the sequence; a failure before it is a
``BeforeContent`` refusal the engine may try on another upstream, one after it
the sequence's ``EngineError``.
Tool calls (``UpstreamToolCall``, normalized by the reader) go out as
``TextOutput.tool_calls``, one fragment per output.

The reader is bounded by the upstream's ``ReaderLimits``, knows the tools the
client offered and what the request's usage can be (its ``max_tokens``, the
model's context window): a stream past a bound, or calling a tool not
offered, fails with code ``upstream_protocol_error`` (a 502 before content,
``UpstreamProtocolError`` after), and the connection is closed. A usage that
cannot be true is dropped, logged and counted (``seq.usage_rejected``): the
sequence's own count stands, and its usage is an estimate.

Invariants:
    - The ``completion_tokens`` of a sequence's outputs add up to the
      upstream's usage when it reported one that can be true (each text counts
      1 until then; the last output corrects the sum, never below what was
      counted).
    - A read longer than ``YIELD_BYTES`` is fed in pieces of that size, the
      loop let go once after each, so a fast upstream neither holds
      the event loop nor outruns the client's writer (whose buffer would
      overflow); and while more than
      ``MAX_UNTAKEN`` outputs wait for a consumer (the response has not begun
      listening yet), nothing more is read: the client's buffer bound then
      never meets a backlog it had no chance to write.
    - Choice 0 cut at ``max_tokens`` output chunks (``UpstreamFinish.cut``)
      finishes the sequence at once, and the connection is closed, not
      drained: the upstream aborts its request and frees its cache.
    - After ``[DONE]`` the body's end is read for at most ``DRAIN_S``, so that
      the connection is kept alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from sluicegate.core.errors import EngineRefused
from sluicegate.core.events import FinishReason, TextOutput, Usage
from sluicegate.core.upstream.items import (
    ReaderState,
    UpstreamDelta,
    UpstreamDone,
    UpstreamError,
    UpstreamFinish,
    UpstreamItem,
    UpstreamReasoning,
    UpstreamToolCall,
    UpstreamUsageRejected,
)
from sluicegate.core.upstream.limits import UsageBounds
from sluicegate.core.upstream.reader import UpstreamReader
from sluicegate.engines.pool_values import Outcome
from sluicegate.engines.upstream.config import UpstreamConfig
from sluicegate.engines.upstream.estimate import most_prompt_tokens
from sluicegate.engines.upstream.http import HopError, HopResponse
from sluicegate.engines.upstream.limits import arm
from sluicegate.engines.upstream.pool import Lease
from sluicegate.engines.upstream.refusals import (
    failure_after_content,
    failure_before_content,
)
from sluicegate.engines.upstream.sequence import (
    LogprobsUnavailable,
    UpstreamSequence,
    accept,
    end,
    step_tokens,
)

__all__ = ["DRAIN_S", "YIELD_BYTES", "BeforeContent", "read_stream"]

logger = logging.getLogger(__name__)

DRAIN_S = 1.0
"""How long a finished stream's body may take to end after ``[DONE]`` (seconds)."""

YIELD_BYTES = 8192
"""Bytes fed to an upstream's reader after which the event loop runs once: a
read returns at once while bytes wait, so without it a fast upstream's whole
backlog (200,000 deltas) would be read before the client's writer ran; and
8 KiB of one-character events (about 80) is a short turn, so that the other
streams and a new request, which needs many turns, are not held up (64 KiB
turns delayed a new stream's first token by 1-4 s under such a burst)."""

MAX_UNTAKEN = 256
"""Outputs that may wait for the response to begin listening before the
upstream is read further."""

UNTAKEN_POLL_S = 0.002
"""How often a paused reader looks whether its outputs were taken (seconds)."""


class BeforeContent(Exception):
    """A 200 whose stream failed before any content: ``failure_before_content``'s
    refusal, outcome and whether to try another upstream."""

    def __init__(self, refusal: tuple[EngineRefused, Outcome, bool]) -> None:
        super().__init__(refusal[0])
        self.refusal = refusal


async def read_stream(
    seq: UpstreamSequence,
    response: HopResponse,
    lease: Lease,
    upstreams: Sequence[UpstreamConfig],
    counts: dict[str, int],
    context_tokens: int = 0,
) -> Outcome:
    """Read a 200's stream into ``seq``'s outputs; the upstream's outcome.

    ``counts`` gets the prompt and generated tokens of a finished sequence;
    a usage that cannot be true sets ``seq.usage_rejected``.
    ``context_tokens`` is the model's context window (0: not known).

    Raises:
        BeforeContent: the stream failed before any content.
    """
    prompt = seq.request.text_prompt
    assert prompt is not None, "an upstream sequence has a text prompt"
    upstream = upstreams[lease.member]
    reader = UpstreamReader(
        prompt.endpoint,
        limits=upstream.limits,
        tool_names=prompt.tool_names,
        usage_bounds=UsageBounds(
            prompt.max_tokens, context_tokens or None, most_prompt_tokens(prompt)
        ),
    )
    time = asyncio.get_running_loop().time
    ended: Outcome | None = None
    held = b""  # a piece the callback left to the loop below

    def feed(data: bytes) -> bool:
        # The steady state, from the connection's read callback: a piece is
        # one read's bytes, so no other stream waits behind it.
        nonlocal ended, held
        if len(data) > YIELD_BYTES or seq.outputs.queued > MAX_UNTAKEN:
            held = data
            return False
        items = reader.feed(data)
        if items:
            seq.last_at = time()
            ended = _apply(seq, items, lease, upstreams, counts)
        return ended is None

    try:
        while ended is None:
            if await response.pour(feed):
                ended = _apply(seq, reader.flush(), lease, upstreams, counts)
                break
            if held:
                data, held = held, b""
                ended = await _feed_slowly(seq, reader, data, lease, upstreams, counts)
    except HopError as exc:
        # The hop's message names the upstream (an internal address, for the
        # log); the client's names the failure only.
        why = type(exc.__cause__ or exc).__name__
        return _broken(seq, upstreams, f"the upstream stream broke ({why})")
    assert ended is not None, "flush() ends the stream"
    if ended is Outcome.SUCCESS and reader.state is ReaderState.DONE:
        # Read the body's end, so that the connection is kept alive; a peer
        # that keeps it open past [DONE] loses it.
        if seq.timer is not None:
            seq.timer.cancel()
            seq.timer = None
        with contextlib.suppress(TimeoutError, HopError):
            async with asyncio.timeout(DRAIN_S):
                async for _ in response:
                    pass
    return ended


async def _feed_slowly(
    seq: UpstreamSequence,
    reader: UpstreamReader,
    data: bytes,
    lease: Lease,
    upstreams: Sequence[UpstreamConfig],
    counts: dict[str, int],
) -> Outcome | None:
    """Feed a burst ``YIELD_BYTES`` at a time, the loop let go between two,
    and nothing more while the outputs wait to be taken; the upstream's
    outcome once the stream ended."""
    time = asyncio.get_running_loop().time
    for start in range(0, len(data), YIELD_BYTES):
        if start:
            await asyncio.sleep(0)
        # Rare (a burst before the response listens) and short: a poll
        # costs less than an event set on every output taken.
        while seq.outputs.queued > MAX_UNTAKEN:  # noqa: ASYNC110
            await asyncio.sleep(UNTAKEN_POLL_S)
        items = reader.feed(data[start : start + YIELD_BYTES])
        if items:
            seq.last_at = time()
            ended = _apply(seq, items, lease, upstreams, counts)
            if ended is not None:
                return ended
    await asyncio.sleep(0)
    return None


def _apply(
    seq: UpstreamSequence,
    items: list[UpstreamItem],
    lease: Lease,
    upstreams: Sequence[UpstreamConfig],
    counts: dict[str, int],
) -> Outcome | None:
    """Push what ``items`` say; the upstream's outcome once the stream ended."""
    outputs = seq.outputs
    for item in items:
        if type(item) is UpstreamDelta:
            if item.index != 0:
                continue  # n is 1; an upstream that sends more is ignored
            if seq.first_at is None:
                _first_token(seq, lease, upstreams)
            prompt, cached = _prompt_of(seq)
            tokens = step_tokens(seq)
            seq.saw_text = seq.saw_text or bool(item.text)
            seq.saw_logprobs = seq.saw_logprobs or bool(item.logprobs)
            output = TextOutput(
                item.text,
                None,
                tokens,
                prompt,
                cached_tokens=cached,
                logprobs=item.logprobs,
                token_texts=item.token_texts,
            )
            outputs.push(output)
        elif type(item) is UpstreamReasoning:
            if item.index != 0:
                continue
            if seq.first_at is None:
                _first_token(seq, lease, upstreams)
            tokens = step_tokens(seq)
            prompt, cached = _prompt_of(seq)
            output = TextOutput(
                "", None, tokens, prompt, reasoning=item.text, cached_tokens=cached
            )
            outputs.push(output)
        elif type(item) is UpstreamToolCall:
            if item.index != 0:
                continue
            if seq.first_at is None:
                _first_token(seq, lease, upstreams)
            fragment = (item.fragment,)
            prompt, cached = _prompt_of(seq)
            tokens = step_tokens(seq)
            output = TextOutput(
                "", None, tokens, prompt, fragment, cached_tokens=cached
            )
            outputs.push(output)
        elif type(item) is Usage:
            seq.usage = outputs.usage = item
        elif type(item) is UpstreamUsageRejected:
            seq.usage = outputs.usage = None  # the sequence's own count stands
            seq.usage_rejected = True
            logger.warning(
                "request %s: the upstream's usage was dropped: %s",
                seq.request.request_id,
                item.reason,
            )
        elif type(item) is UpstreamFinish:
            if item.index == 0:
                seq.finish = item.finish_reason
                seq.matched_stop = _asked_stop(seq, item.matched_stop)
                if seq.first_at is None:
                    _first_token(seq, lease, upstreams)
                if item.cut:  # n is 1: the stream is over; closing aborts it
                    return _finish(seq, upstreams, counts)
        elif type(item) is UpstreamDone:
            return _finish(seq, upstreams, counts)
        elif type(item) is UpstreamError:
            return _broken(
                seq,
                upstreams,
                item.message,
                item.code,
                item.type,
                "the upstream failed: ",
            )
        else:
            return _broken(seq, upstreams, "the upstream's stream ended without [DONE]")
    return None


def _broken(
    seq: UpstreamSequence,
    upstreams: Sequence[UpstreamConfig],
    message: str,
    code: str | None = None,
    kind: str | None = None,
    prefix: str = "",
) -> Outcome:
    """The stream failed: the sequence's error (``prefix + message``) once
    accepted; before any content, a refusal (``BeforeContent``) that
    the engine may fail over."""
    upstream = upstreams[0 if seq.lease is None else seq.lease.member]
    if not seq.accept.done() and seq.lease is not None:
        raise BeforeContent(failure_before_content(message, code, kind, upstream))
    end(seq, "failed", failure_after_content(prefix + message, code, upstream))
    return Outcome.FAILURE


def _first_token(
    seq: UpstreamSequence, lease: Lease, upstreams: Sequence[UpstreamConfig]
) -> None:
    """The first content: the sequence is accepted, the time to first token
    is over, idle time starts."""
    accept(seq)
    seq.first_at = seq.last_at
    lease.first_token()
    if seq.timer is not None:
        seq.timer.cancel()
    arm(seq, upstreams)


def _finish(
    seq: UpstreamSequence, upstreams: Sequence[UpstreamConfig], counts: dict[str, int]
) -> Outcome:
    if seq.finish is None:
        return _broken(seq, upstreams, "the upstream ended without a finish_reason")
    asked = seq.request.params.logprobs is not None
    if asked and seq.saw_text and not seq.saw_logprobs and seq.lease is not None:
        # Not passed off as an answer with logprobs; later requests get a 400.
        seq.no_logprobs = seq.lease.member
        name = upstreams[seq.lease.member].name
        end(seq, "failed", LogprobsUnavailable(f"the upstream {name} sent no logprobs"))
        return Outcome.SUCCESS  # it answered; it is not a failing upstream
    usage = seq.usage
    tokens = 0
    prompt, cached = (None, 0) if usage is None else _prompt_of(seq)
    if usage is None and (guess := _prompt_of(seq)[0]) is not None:
        # No count: the estimate, said before the end so that the usage is
        # marked estimated (as Messages' from its message_start).
        seq.outputs.push(TextOutput("", None, 0, guess))
    if usage is not None:
        tokens = max(0, usage.completion_tokens - seq.emitted)
        counts["prompt"] += usage.prompt_tokens
        if seq.estimate is not None and seq.request.text_prompt is not None:
            seq.estimate.learn(seq.request.text_prompt, usage.prompt_tokens)
    seq.emitted += tokens
    counts["generated"] += seq.emitted
    seq.result = "finished"
    reasoning = None if usage is None else usage.reasoning_tokens
    stop = seq.matched_stop if seq.finish is FinishReason.STOP else None
    seq.outputs.push(
        TextOutput(
            "",
            seq.finish,
            tokens,
            prompt,
            (),
            reasoning_tokens=reasoning,
            cached_tokens=cached,
            stop_sequence=stop,
        )
    )
    return Outcome.SUCCESS


def _asked_stop(seq: UpstreamSequence, matched: str | None) -> str | None:
    """``matched`` when it is one of the stop strings the request sent (a peer
    names no string of its own choosing), else ``None``."""
    prompt = seq.request.text_prompt
    if matched is None or prompt is None or matched not in prompt.stop:
        return None
    return matched


def _prompt_of(seq: UpstreamSequence) -> tuple[int | None, int]:
    """The prompt's tokens and their cached part, as the upstream's latest
    usage says (continuous usage: from the first content on); before it said
    any, the engine's estimate (``estimate.py``: a count said before,
    by the upstream's tokenizer, stays; the last output's usage replaces it),
    or ``(None, 0)`` without one."""
    usage, prompt = seq.usage, seq.request.text_prompt
    if usage is not None:
        return usage.prompt_tokens, usage.cached_tokens
    if seq.guess is None and seq.estimate is not None and prompt is not None:
        seq.guess = seq.estimate.estimate(prompt)
    return seq.guess, 0
