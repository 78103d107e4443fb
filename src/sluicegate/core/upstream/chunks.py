"""What an upstream reader does with one chunk object of the stream.

``ChunkReader`` is the half of ``UpstreamReader`` (``core/upstream/reader.py``) that
reads a parsed chunk: its in-band error, its usage and its choices (text,
reasoning, tool calls, logprobs, finish), each choice's state kept in an
``UpstreamChoice``; ``UpstreamReader`` gets the chunks out of the bytes (the SSE
decoder, or its fast twins in ``core/upstream/fast.py``) and ends the stream.
The quirks it absorbs and its invariants are ``UpstreamReader``'s docstring's.

Spec: OpenAI API reference, "The chat completion chunk object", "Create
completion" (streaming) and "Error codes".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sluicegate.core.errors import RemoteProtocolError, bounded_repr
from sluicegate.core.events import Usage
from sluicegate.core.upstream.choice import (
    CONTENT,
    NO_PART,
    REASONING,
    UpstreamChoice,
    finish_reason_of,
    settle_choice,
)
from sluicegate.core.upstream.items import (
    PROTOCOL_ERROR_CODE,
    ReaderState,
    UpstreamDelta,
    UpstreamError,
    UpstreamFinish,
    UpstreamItem,
    UpstreamReasoning,
    UpstreamToolCall,
    UpstreamUsageRejected,
)
from sluicegate.core.upstream.limits import (
    ReaderLimits,
    UsageBounds,
    cached_tokens,
    reported_reasoning_tokens,
    usage_problem,
)
from sluicegate.core.upstream.logprobs import TokenTexts
from sluicegate.core.upstream.tools import ToolCallNormalizer
from sluicegate.core.wire.chunks import Endpoint

__all__ = ["MAX_MATCHED_STOP_CHARS", "ChunkReader"]

_FAILED_REASONS = frozenset({"abort", "error"})


MAX_MATCHED_STOP_CHARS = 4096
"""The longest stop string an upstream's ``stop_reason`` is taken for."""


def _matched_stop(choice: dict[str, Any]) -> str | None:
    """The stop string a finished choice names: vLLM's ``stop_reason`` or
    SGLang's ``matched_stop`` when it is a string (a token id, ``null`` for an
    end of sequence, or one too long is none)."""
    for name in ("stop_reason", "matched_stop"):
        value = choice.get(name)
        if type(value) is str and 0 < len(value) <= MAX_MATCHED_STOP_CHARS:
            return value
    return None


class ChunkReader:
    """Chunk objects in, items out (``read``); the state of every choice.

    Args: as ``UpstreamReader``'s.

    Attributes:
        bytes: bytes of the body read so far (the reader that owns this counts
            them; the usage bounds use them).
        usage_rejected: why the upstream's usage was rejected, or ``None``.
    """

    __slots__ = (
        "_call_ids",
        "_choices",
        "_chunk_deltas",
        "_endpoint",
        "_limits",
        "_max_chunks",
        "_new_id",
        "_state",
        "_tool_names",
        "_usage",
        "_usage_bounds",
        "bytes",
        "usage_rejected",
    )

    def __init__(
        self,
        endpoint: Endpoint,
        new_id: Callable[[], str],
        limits: ReaderLimits,
        tool_names: frozenset[str] | None,
        usage_bounds: UsageBounds,
    ) -> None:
        self._endpoint = endpoint
        self._new_id = new_id
        self._call_ids: set[str] = set()  # every choice's, so ids are unique
        self._limits = limits
        self._tool_names = tool_names
        self._usage_bounds = usage_bounds
        # A choice is cut at its first output chunk counted past this many
        # (-1: never): an upstream sends at most one per token and part
        # (UpstreamChoice.count_output), so max_tokens of them are all it may.
        self._max_chunks = usage_bounds.max_completion_tokens or -1
        self._state = ReaderState.READING
        self._choices: dict[int, UpstreamChoice] = {}
        self._usage: Usage | None = None
        self._chunk_deltas = 0  # choices and tool-call entries of this chunk
        self.bytes = 0
        self.usage_rejected: str | None = None

    def _plain_delta(self, text: str, out: list[UpstreamItem]) -> None:
        """``_object`` of a chunk whose one choice, 0, carries ``text`` alone:
        one learned from (``upstream_fast.DeltaTemplate``), so choice 0 exists."""
        self._chunk_deltas = 1
        state = self._choices[0]
        if text and not state.finished:
            if state.counted_past(CONTENT, self._max_chunks):
                self._finish(0, state, "length", None, out)
                return
            new = state.feed(text)
            if new:
                out.append(UpstreamDelta(0, new, None))
            state.count_output(CONTENT)

    def _object(self, obj: dict[str, Any], out: list[UpstreamItem]) -> None:
        """Read one event's JSON object (not of an ``error`` event)."""
        if obj.get("error") is not None:
            self._error(obj, out)
            return
        if obj.get("object") == "error":  # vLLM's error object, not wrapped
            self._error({"error": obj}, out)
            return
        usage = obj.get("usage")
        if type(usage) is dict:  # before the deltas: they count in it already
            self._read_usage(usage, out)
        choices = obj.get("choices")
        if type(choices) is list:
            self._chunk_deltas = 0
            for choice in choices:
                if type(choice) is dict:
                    self._choice(choice, out)
                    if self._state is not ReaderState.READING:
                        return

    def _choice(self, choice: dict[str, Any], out: list[UpstreamItem]) -> None:
        self._chunk_deltas += 1
        if self._chunk_deltas > self._limits.max_deltas_per_chunk:
            self._too_many_deltas(out)
            return
        index = choice.get("index", 0)
        if type(index) is not int or index < 0:
            index = 0
        state = self._choices.get(index)
        if state is None:
            state = self._choices[index] = UpstreamChoice()
        if state.finished:
            return  # a repeated finish_reason, or text after it
        calls, reasoning = None, ""
        chat = self._endpoint is Endpoint.CHAT
        if chat:
            delta = choice.get("delta")
            if type(delta) is dict:
                text, calls = delta.get("content"), delta.get("tool_calls")
                reasoning = _reasoning_of(delta)
            else:
                text = None
        else:
            text = choice.get("text")
        if calls and state.tools is None:
            state.tools = ToolCallNormalizer(
                self._new_id,
                tool_names=self._tool_names,
                max_calls=self._limits.max_tool_calls,
                taken_ids=self._call_ids,
            )
        part = _part(state, reasoning, text, calls)
        if part != NO_PART and state.counted_past(part, self._max_chunks):
            self._finish(index, state, "length", None, out)  # cut: dropped
            return
        thought = bool(reasoning)
        if thought:
            out.append(UpstreamReasoning(index, reasoning))
        new = state.feed(text) if type(text) is str and text else ""
        raw = choice.get("logprobs")
        if raw is not None or state.token_texts is not None:
            texts = state.token_texts or TokenTexts(self._limits.max_deltas_per_chunk)
            state.token_texts = texts  # a reasoning chunk's tokens are not content's
            runs = texts.read(None if thought and not new else raw, chat, new, text)
            out.extend(UpstreamDelta(index, r.text, r.tokens, r.texts) for r in runs)
        elif new:
            out.append(UpstreamDelta(index, new))
        if calls:
            if type(calls) is list:
                self._chunk_deltas += len(calls)
                if self._chunk_deltas > self._limits.max_deltas_per_chunk:
                    self._too_many_deltas(out)
                    return
            assert state.tools is not None, "made above"
            try:
                fragments = state.tools.feed(calls)
            except RemoteProtocolError as exc:
                self._fail(out, str(exc), PROTOCOL_ERROR_CODE)
                return
            out.extend(UpstreamToolCall(index, f) for f in fragments)
        if part != NO_PART:
            state.count_output(part)
        reason = choice.get("finish_reason")
        if type(reason) is str and reason:
            if reason in _FAILED_REASONS:
                why = f"the upstream ended choice {index} with finish_reason {reason!r}"
                self._fail(out, why)
                return
            self._finish(index, state, reason, choice, out)

    def _finish(
        self,
        index: int,
        state: UpstreamChoice,
        reason: str,
        choice: dict[str, Any] | None,
        out: list[UpstreamItem],
    ) -> None:
        """End choice ``index`` with the upstream's ``reason`` (its ``choice``),
        or cut it at ``max_tokens`` output chunks (``choice`` ``None``)."""
        state.finished = True
        try:
            tools = settle_choice(index, state, out)
        except RemoteProtocolError as exc:
            self._fail(out, str(exc), PROTOCOL_ERROR_CODE)
            return
        finish = finish_reason_of(reason, tools)
        if choice is None:
            out.append(UpstreamFinish(index, finish, reason, None, True))
        else:
            out.append(UpstreamFinish(index, finish, reason, _matched_stop(choice)))

    def _too_many_deltas(self, out: list[UpstreamItem]) -> None:
        limit = self._limits.max_deltas_per_chunk
        why = f"the upstream sent a chunk of more than {limit} deltas"
        self._fail(out, why, PROTOCOL_ERROR_CODE)

    def _read_usage(self, usage: dict[str, Any], out: list[UpstreamItem]) -> None:
        if self.usage_rejected is not None:
            return  # once wrong, never trusted again
        why, prompt, completion = usage_problem(usage, self._usage_bounds, self.bytes)
        if why is not None:
            self.usage_rejected = why
            self._usage = None
            out.append(UpstreamUsageRejected(why))
            return
        reasoning = reported_reasoning_tokens(usage, completion)
        read = Usage(prompt, completion, cached_tokens(usage, prompt), reasoning)
        if read != self._usage:
            self._usage = read
            out.append(read)

    def _error(self, obj: dict[str, Any], out: list[UpstreamItem]) -> None:
        error = obj.get("error")
        if isinstance(error, str):  # TGI: {"error": "...", "error_type": "..."}
            kind = obj.get("error_type")
            self._fail(out, error, None, kind if isinstance(kind, str) else None)
            return
        if not isinstance(error, dict):
            error = obj
        message = error.get("message")
        if not isinstance(message, str) or not message:
            message = f"the upstream sent an error: {bounded_repr(error)}"
        kind = error.get("type")
        code = error.get("code")
        self._fail(
            out,
            message,
            None if code is None else str(code),
            kind if isinstance(kind, str) and kind else None,
        )

    def _fail(
        self,
        out: list[UpstreamItem],
        message: str,
        code: str | None = None,
        kind: str | None = None,
    ) -> None:
        self._settle_all(out)  # a call refused here is dropped: the stream failed
        out.append(UpstreamError(message, kind or "server_error", code))
        self._state = ReaderState.FAILED

    def _settle_all(self, out: list[UpstreamItem]) -> str | None:
        """End every open choice; the first refusal of a held tool call (its
        message), if any (the other choices still end)."""
        refused = None
        for index, state in self._choices.items():
            if not state.finished:
                state.finished = True
                try:
                    settle_choice(index, state, out)
                except RemoteProtocolError as exc:
                    refused = refused or str(exc)
        return refused


def _reasoning_of(delta: dict[str, Any]) -> str:
    """A delta's reasoning: ``reasoning_content`` (vLLM, SGLang, llama.cpp's
    server), else ``reasoning`` (newer vLLM, which for a while sent both with
    the same text: taken once); ``""`` for none."""
    reasoning = delta.get("reasoning_content")
    if type(reasoning) is not str or not reasoning:
        reasoning = delta.get("reasoning")
    return reasoning if type(reasoning) is str else ""


def _part(state: UpstreamChoice, reasoning: str, text: Any, calls: Any) -> int:
    """The part a chunk's output goes to (``NO_PART``: it has none): its
    calls' (the next call's when it begins one), else its text's, else its
    reasoning's."""
    tools = state.tools
    if calls and tools is not None:
        return CONTENT + tools.begun + tools.begins(calls)
    if type(text) is str and text:
        return CONTENT
    return REASONING if reasoning else NO_PART
