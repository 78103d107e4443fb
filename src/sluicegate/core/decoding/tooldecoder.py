"""A ``ResponseDecoder`` whose choices' text goes through a tool-call parser each.

``ToolCallDecoder`` is what a chat request with ``tools`` (and a ``tool_choice`` other
than ``none``) decodes with: each choice's released text is fed to its own
``ToolCallParser`` (``core/decoding/toolcalls.py``); content stays content, and each
call becomes ``Delta``s whose ``parts`` hold its fragments. ``new_response_decoder``
picks the plain decoder or this one from ``ToolCallOptions``.

Invariants (besides ``ResponseDecoder``'s):
    - One ``Delta`` per parsed part: content text, a call's start (``id``,
      ``name``, ``arguments == ""``), or a piece of a call's arguments; so the
      first chunk of each call carries no arguments unless a slow reader's
      deltas were coalesced (``join_parts``).
    - A choice's held text (a possible ``<tool_call>`` prefix) goes out before
      its ``Finish``; that ``Finish`` says ``tool_calls`` when the choice made
      calls, none is left open, and it ended on a stop (``length`` stays
      ``length``: a call cut short is never reported as made).
    - Reasoning ``Delta``s pass through unparsed: calls are parsed from the
      content only, which begins after the reasoning.
    - Logprobs stay with the text they belong to as far as parts allow: a
      step's tokens ride on the first ``Delta`` the step produced, or on the
      next one when the parser held its text.

Spec: docs/tools.md; OpenAI API reference, "The chat completion object"
(``finish_reason: "tool_calls"``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from typing_extensions import override

from sluicegate.core.decoding.response import (
    ChoiceOptions,
    OutputItem,
    ResponseDecoder,
    Vocabulary,
)
from sluicegate.core.decoding.toolcalls import Part, ToolCallParser, new_call_id
from sluicegate.core.events import (
    Delta,
    DeltaParts,
    Finish,
    FinishReason,
    StreamEvent,
)
from sluicegate.core.logprobs import LogprobToken

__all__ = ["ToolCallDecoder", "ToolCallOptions", "new_response_decoder"]


@dataclass(frozen=True, slots=True)
class ToolCallOptions:
    """What the parser of each choice needs to know of the request.

    Attributes:
        names: the functions the request offers (and ``tool_choice`` allows).
        max_calls: the most calls per choice (1 without parallel calls), or
            ``None`` for no limit.
        calls_only: the turn holds calls only (``required`` or a named
            function): see ``ToolCallParser``.
    """

    names: tuple[str, ...]
    max_calls: int | None = None
    calls_only: bool = False


class ToolCallDecoder(ResponseDecoder):
    """``ResponseDecoder`` with one ``ToolCallParser`` per choice.

    Args:
        choices, vocabulary: as ``ResponseDecoder``'s.
        tools: the functions offered and the call limit.
        new_id: makes each call's id (``new_call_id`` by default).
        **options: ``ResponseDecoder``'s keyword arguments.
    """

    __slots__ = ("_parsers", "_pending")

    def __init__(
        self,
        choices: Sequence[ChoiceOptions],
        vocabulary: Vocabulary | None,
        *,
        tools: ToolCallOptions,
        new_id: Callable[[], str] = new_call_id,
        **options: Any,
    ) -> None:
        super().__init__(choices, vocabulary, **options)
        self._parsers = [
            ToolCallParser(
                tools.names,
                max_calls=tools.max_calls,
                calls_only=tools.calls_only,
                new_id=new_id,
            )
            for _ in choices
        ]
        self._pending: list[tuple[LogprobToken, ...]] = [() for _ in choices]

    @override
    def feed(self, index: int, item: OutputItem) -> Sequence[StreamEvent]:
        """As ``ResponseDecoder.feed``, with the choice's text parsed into parts."""
        events = super().feed(index, item)
        if not events:
            return events
        out: list[StreamEvent] = []
        for event in events:
            if type(event) is Delta:
                if event.parts is not None and event.parts.reasoning:
                    out.append(event)  # reasoning: the parser reads content only
                    continue
                self._parsed(event, self._parsers[event.index].feed(event.text), out)
            elif type(event) is Finish:
                self._finished(event, out)
            else:
                out.append(event)
        return out

    def _parsed(self, source: Delta, parts: list[Part], out: list[StreamEvent]) -> None:
        """One ``Delta`` per part; ``source``'s logprobs and usage ride along."""
        index = source.index
        logprobs = source.logprobs
        pending = self._pending[index]
        if pending:
            logprobs = pending + (logprobs or ())
            self._pending[index] = ()
        if not parts:
            if logprobs:
                self._pending[index] = logprobs
            return
        if len(parts) == 1 and parts[0] is source.text and logprobs is source.logprobs:
            out.append(source)  # content passed through unchanged
            return
        for part in parts:
            if isinstance(part, str):
                out.append(Delta(index, part, logprobs, source.usage))
            else:  # logprobs are of content tokens only, as OpenAI gives them
                one = DeltaParts((part,))
                out.append(Delta(index, "", None, source.usage, one))
            logprobs = None

    def _finished(self, finish: Finish, out: list[StreamEvent]) -> None:
        index = finish.index
        parser = self._parsers[index]
        tail = parser.flush()
        last = Delta(index, "", None, finish.usage)
        self._parsed(last, tail, out)
        self._pending[index] = ()  # held text never sent: no content, no logprobs
        reason = finish.finish_reason
        if reason is FinishReason.STOP and parser.calls and not parser.open_call:
            reason = FinishReason.TOOL_CALLS
            self._choices[index].finish_reason = reason
            finish = Finish(index, reason, finish.usage)
        out.append(finish)


def new_response_decoder(
    tools: ToolCallOptions | None,
    choices: Sequence[ChoiceOptions],
    vocabulary: Vocabulary | None,
    **options: Any,
) -> ResponseDecoder:
    """The decoder of one response: ``ToolCallDecoder`` when ``tools`` is given,
    else the plain ``ResponseDecoder`` (no cost per token for tool calls)."""
    if tools is None:
        return ResponseDecoder(choices, vocabulary, **options)
    return ToolCallDecoder(choices, vocabulary, tools=tools, **options)
