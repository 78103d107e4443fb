"""Values that cross the core's boundary: engine outputs in, stream events in.

Engine side: an engine reports each decode step of one sequence as an
``EngineOutput`` (new token ids, and a ``finish_reason`` on the last one), or as
a ``TextOutput`` when it yields text instead of token ids.

Stream side: the server feeds ``StreamMachine`` (``core/wire/stream.py``) one of
``Delta``, ``Finish``, ``End``, ``Fail`` or ``Heartbeat`` and writes the bytes it
returns. A ``Delta`` is made of parts: content text, and optionally
(``DeltaParts``) tool-call fragments keyed by tool-call index and reasoning text;
``join_parts`` joins them part by part. All are frozen, slotted dataclasses;
the closed sets are ``StrEnum`` whose values are the OpenAI wire strings.

Spec: OpenAI API reference, "The chat completion chunk object" and "Completions".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from sluicegate.core.logprobs import LogprobToken, TokenLogprob
from sluicegate.core.slot_init import slot_init

__all__ = [
    "CANCELLED",
    "Delta",
    "DeltaParts",
    "End",
    "EngineOutput",
    "Fail",
    "Finish",
    "FinishReason",
    "Heartbeat",
    "StreamEvent",
    "TextOutput",
    "TokenLogprob",
    "ToolCallFragment",
    "Usage",
    "join_all_parts",
    "join_parts",
]


class FinishReason(StrEnum):
    """Why a choice ended, as OpenAI spells it on the wire."""

    STOP = "stop"
    """An end-of-sequence or stop token, or a stop string matched."""
    LENGTH = "length"
    """``max_tokens`` or the context window was reached."""
    TOOL_CALLS = "tool_calls"
    """The turn ended with tool calls (chat with ``tools``; never for a cut call)."""
    CONTENT_FILTER = "content_filter"
    """An upstream's content filter cut the output (the gateway only: no local
    engine filters). Responses: ``incomplete`` with reason ``content_filter``;
    Messages: ``refusal``."""


@slot_init
@dataclass(frozen=True, slots=True)
class EngineOutput:
    """One decode step of one sequence, as an engine reports it.

    Attributes:
        token_ids: the token ids sampled in this step (usually one; zero on a
            final output that only carries ``finish_reason``).
        finish_reason: set on the sequence's last output, else ``None``. A stop
            token (EOS, end of turn, a requested stop token id) that ended the
            sequence *is* the last of ``token_ids``, so that it counts as a
            completion token; detokenizers skip it by id, so it never reaches
            the text.
        logprobs: one ``TokenLogprob`` per token id when the request asked for
            logprobs, else ``None``.
        cached_tokens: on a sequence's first output, the part of its prompt the
            engine reused from its KV cache instead of reading it (tokens); 0 on
            every other output, and when nothing was reused.
    """

    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None = None
    logprobs: tuple[TokenLogprob, ...] | None = None
    cached_tokens: int = 0


@slot_init
@dataclass(frozen=True, slots=True)
class TextOutput:
    """One step of a sequence from an engine that yields text, not token ids.

    An upstream OpenAI-compatible server is such an engine: its chunks carry
    text, already detokenized. The server then skips all token work (no
    detokenizer, no logprob alignment) and only matches stop strings.

    Attributes:
        text: the new text (may be empty on a final output).
        finish_reason: set on the sequence's last output, else ``None``.
        completion_tokens: the tokens this step stands for, as the engine
            counts them (tokens, >= 0); they add up to the choice's usage (an
            engine that learns the exact count late corrects it on the last
            output).
        prompt_tokens: the prompt's tokens as the engine counted them (tokens),
            once it knows (at the latest on the last output); ``None`` before.
        tool_calls: tool-call fragments of this step, already in the shape the
            client gets (``ToolCallFragment``: a call's start, then pieces of
            its arguments); ``()`` for none. They skip the stop matcher: stop
            strings are matched on content only.
        reasoning: reasoning text of this step, before ``text`` (an upstream's
            ``reasoning_content`` or ``reasoning``); it skips the stop matcher
            too. ``""`` for none.
        reasoning_tokens: the choice's reasoning tokens as the engine counted
            them, on the last output when it knows (tokens); ``None`` before or
            when unknown (the steps that carried reasoning are counted then).
        cached_tokens: the part of ``prompt_tokens`` the engine read from its
            cache (tokens); read only with ``prompt_tokens``.
        logprobs: the tokens ``text`` is made of, with their logprobs, when
            the request asked for them and the engine gave them; ``None``
            otherwise.
        token_texts: each of ``logprobs``' part of ``text`` (they join to it;
            ``""`` for a token that ends inside a character), or ``None`` when
            their ``token`` strings join to ``text``.
        stop_sequence: on the last output, the request's stop string the
            engine itself stopped on (an upstream that matched it before the
            server's own matcher could), else ``None``.
    """

    text: str
    finish_reason: FinishReason | None = None
    completion_tokens: int = 1
    prompt_tokens: int | None = None
    tool_calls: tuple[ToolCallFragment, ...] = ()
    reasoning: str = ""
    reasoning_tokens: int | None = None
    stop_sequence: str | None = None
    logprobs: tuple[LogprobToken, ...] | None = None
    cached_tokens: int = 0
    token_texts: tuple[str, ...] | None = None


@slot_init
@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one response (OpenAI ``usage``), in tokens.

    Attributes:
        prompt_tokens: the prompt's tokens, each prompt once.
        completion_tokens: generated tokens, reasoning included.
        cached_tokens: the part of ``prompt_tokens`` the engine read from a
            cache instead of computing (OpenAI's
            ``prompt_tokens_details.cached_tokens``); 0 when none or unknown.
        reasoning_tokens: the part of ``completion_tokens`` spent inside the
            reasoning (``completion_tokens_details.reasoning_tokens``); ``None``
            when the response has no reasoning channel (no reasoning parser):
            the detail is then not sent.
    """

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int | None = None

    @property
    def total_tokens(self) -> int:
        """``prompt_tokens + completion_tokens``."""
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class ToolCallFragment:
    """A piece of tool call ``index`` of one choice, as OpenAI streams it.

    A tool call arrives as fragments with the same ``index``: the first names it
    (``id``, ``name``), the later ones carry more of its JSON ``arguments``. The
    call's arguments are the concatenation of its fragments' ``arguments``, in
    order; fragments of different indexes never join.

    Attributes:
        index: the tool call's index within its choice (>= 0).
        id: the call's id (``call_...``), on its first fragment only, else ``None``.
        name: the function's name, on its first fragment only, else ``None``.
        arguments: the next piece of the arguments' JSON text (may be ``""``).

    Spec: OpenAI API reference, "The chat completion chunk object",
    ``choices[].delta.tool_calls``.
    """

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True, slots=True)
class DeltaParts:
    """What a ``Delta`` says besides its content text (tool calls, reasoning).

    Attributes:
        tool_calls: tool-call fragments, at most one per tool-call index, in the
            order their indexes first appeared.
        reasoning: the next piece of the model's reasoning text (chat
            ``delta.reasoning_content``); ``""`` for none.
    """

    tool_calls: tuple[ToolCallFragment, ...] = ()
    reasoning: str = ""

    def __bool__(self) -> bool:
        """Whether there is anything to send."""
        return bool(self.tool_calls or self.reasoning)


def join_parts(
    first: DeltaParts | None, second: DeltaParts | None
) -> DeltaParts | None:
    """What ``first`` then ``second`` say, as one ``DeltaParts`` (one choice).

    Reasoning texts concatenate. Tool-call fragments of the same index join into
    one: arguments concatenate, ``id`` and ``name`` are the first non-``None``
    of the two; fragments of different indexes stay apart, in the order their
    indexes first appeared. ``None`` is the empty parts: joining it returns the
    other side unchanged (so text-only deltas join without allocating parts).
    """
    if first is None:
        return second
    if second is None:
        return first
    calls = list(first.tool_calls)
    at = {fragment.index: i for i, fragment in enumerate(calls)}
    for later in second.tool_calls:
        i = at.get(later.index)
        if i is None:
            at[later.index] = len(calls)
            calls.append(later)
            continue
        earlier = calls[i]
        calls[i] = ToolCallFragment(
            earlier.index,
            earlier.id if earlier.id is not None else later.id,
            earlier.name if earlier.name is not None else later.name,
            earlier.arguments + later.arguments,
        )
    return DeltaParts(tuple(calls), first.reasoning + second.reasoning)


def join_all_parts(parts: Sequence[DeltaParts | None]) -> DeltaParts | None:
    """What ``parts`` say in order, as one ``DeltaParts``: ``join_parts`` folded
    over them, in time linear in their fragments and text (folding pairwise
    copies the calls so far at every step: quadratic in the fragments).
    """
    present = [p for p in parts if p is not None]
    if len(present) < 2:
        return present[0] if present else None
    first: dict[int, ToolCallFragment] = {}  # index -> its first fragment
    arguments: dict[int, list[str]] = {}
    ids: dict[int, str | None] = {}
    names: dict[int, str | None] = {}
    for p in present:
        for fragment in p.tool_calls:
            index = fragment.index
            if index not in first:
                first[index] = fragment
                arguments[index] = [fragment.arguments]
                ids[index] = fragment.id
                names[index] = fragment.name
                continue
            arguments[index].append(fragment.arguments)
            if ids[index] is None:
                ids[index] = fragment.id
            if names[index] is None:
                names[index] = fragment.name
    calls = tuple(
        ToolCallFragment(i, ids[i], names[i], "".join(arguments[i])) for i in first
    )
    return DeltaParts(calls, "".join(p.reasoning for p in present))


@slot_init
@dataclass(frozen=True, slots=True)
class Delta:
    """New text for choice ``index`` (already detokenized and stop-checked).

    Attributes:
        index: the choice.
        text: the new text.
        logprobs: the tokens whose text ``text`` holds, when the request asked
            for logprobs (then ``Delta``s of one choice join by concatenating
            ``text`` and ``logprobs``); ``None`` otherwise.
        usage: the response's usage so far, when every chunk carries it
            (``continuous_usage_stats``); ``None`` otherwise.
        parts: tool-call fragments and reasoning text, or ``None`` for a delta
            of content text only (the common case, which the stream's per-token
            path checks once). Only chat chunks carry parts; the completions
            endpoint sends ``text`` only.
    """

    index: int
    text: str
    logprobs: tuple[LogprobToken, ...] | None = None
    usage: Usage | None = None
    parts: DeltaParts | None = None


@dataclass(frozen=True, slots=True)
class Finish:
    """Choice ``index`` ended with ``finish_reason`` (``usage`` as on ``Delta``);
    ``stop_sequence`` is the stop string that ended it, when one did (Anthropic's
    Messages API names it; the OpenAI chunks do not)."""

    index: int
    finish_reason: FinishReason
    usage: Usage | None = None
    stop_sequence: str | None = None


@dataclass(frozen=True, slots=True)
class End:
    """Every choice has finished; close the stream with usage and ``[DONE]``."""

    usage: Usage


@dataclass(frozen=True, slots=True)
class Fail:
    """A failure after the first byte: one in-band error event, then close.

    Attributes:
        message: human-readable, non-empty.
        type: OpenAI error type (e.g. ``"server_error"``).
        code: short machine-readable code (e.g. ``"engine_error"``), or ``None``.
    """

    message: str
    type: str = "server_error"
    code: str | None = None


CANCELLED = "cancelled"
"""``Fail.code`` of a stream its client cancelled on purpose (``.../cancel``)."""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Nothing was written for the heartbeat interval: send an SSE comment."""


StreamEvent = Delta | Finish | End | Fail | Heartbeat
