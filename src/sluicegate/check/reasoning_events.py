"""Probes of reasoning on Responses and Messages streams: its item or block
before the answer's, its events where they belong, no marker left where the
reasoning and the answer meet (``check.reasoning.boundary_problem``).

The chat probe is ``check.reasoning.reasoning_framing``. These grade the
recorded ``responses_*`` and ``messages_*`` streams that carry reasoning: the
exchanges that ask for it (``responses_reasoning`` with ``reasoning.effort``,
``messages_thinking`` with ``thinking`` enabled) and any other stream a model
reasons in. A stream without reasoning is not graded; when none has any (the
model does not reason, or the server refused the request), the verdict is
not-observable.

Spec: OpenAI API reference, "Responses: streaming events" (reasoning items,
``response.reasoning_text.delta``, ``output_tokens_details.reasoning_tokens``);
Anthropic API, "Extended thinking" (``thinking`` blocks, ``thinking_delta``,
``signature_delta``); docs/DESIGN.md, "Reasoning".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sluicegate.check.event_streams import Events, streams_of
from sluicegate.check.reasoning import boundary_problem
from sluicegate.check.transcript import Transcript
from sluicegate.check.verdicts import ProbeResult, clip, fail, not_observable, passed

__all__ = ["messages_reasoning_framing", "responses_reasoning_framing"]

RESPONSES_STREAMS = ("responses_reasoning", "responses_stream", "responses_max")
MESSAGES_STREAMS = ("messages_thinking", "messages_stream", "messages_stop")
_REASONING_DELTAS = frozenset(
    {"response.reasoning_text.delta", "response.reasoning_summary_text.delta"}
)
_THINKING = frozenset({"thinking", "redacted_thinking"})


def _responses_problem(events: Events) -> tuple[int, str | None]:
    """``(reasoning deltas, the first problem)`` of one Responses stream."""
    kinds: dict[Any, str] = {}  # output_index -> item type
    answer, deltas, thought = "", 0, ""
    for pos, (name, obj) in enumerate(events):
        index = obj.get("output_index")
        if name == "response.output_item.added":
            item = obj.get("item")
            kinds[index] = str(item.get("type")) if isinstance(item, dict) else ""
            if kinds[index] == "reasoning" and "message" in kinds.values():
                return deltas, f"a reasoning item added at #{pos} after a message item"
        elif name in _REASONING_DELTAS:
            if answer:
                return deltas, f"{name} at #{pos} after the answer {clip(answer)}"
            if kinds.get(index) != "reasoning":
                return deltas, f"{name} at #{pos} in a {kinds.get(index)!r} item"
            deltas += 1
            thought += str(obj.get("delta", ""))
        elif name == "response.reasoning_text.done" and obj.get("text") != thought:
            return deltas, f"reasoning_text.done {clip(obj.get('text'))} != deltas"
        elif name == "response.output_text.delta":
            answer += str(obj.get("delta", ""))
        elif name in ("response.completed", "response.incomplete") and deltas:
            problem = _count_problem(obj.get("response"))
            if problem:
                return deltas, problem
    return deltas, boundary_problem(thought, answer) if deltas else None


def _count_problem(response: Any) -> str | None:
    usage = response.get("usage") if isinstance(response, dict) else None
    if not isinstance(usage, dict):
        return None
    details = usage.get("output_tokens_details")
    counted = details.get("reasoning_tokens") if isinstance(details, dict) else None
    total = usage.get("output_tokens")
    if not isinstance(counted, int) or not isinstance(total, int):
        return None
    if counted < 1 or counted > total:
        return f"reasoning_tokens {counted} for {total} output tokens, with reasoning"
    return None


def _messages_problem(events: Events) -> tuple[int, str | None]:
    """``(thinking deltas, the first problem)`` of one Messages stream."""
    kinds: dict[Any, str] = {}  # block index -> block type
    signed: dict[Any, int] = {}  # thinking block index -> signature deltas
    answer, deltas, thought = "", 0, ""
    for pos, (name, obj) in enumerate(events):
        index = obj.get("index")
        if name == "content_block_start":
            block = obj.get("content_block")
            kinds[index] = str(block.get("type")) if isinstance(block, dict) else ""
            if kinds[index] in _THINKING and "text" in kinds.values():
                return deltas, f"a {kinds[index]} block at #{pos} after a text block"
        elif name == "content_block_delta":
            delta = obj.get("delta")
            kind = str(delta.get("type")) if isinstance(delta, dict) else ""
            block = kinds.get(index)
            if kind in ("thinking_delta", "signature_delta") and block != "thinking":
                return deltas, f"{kind} at #{pos} in a {block!r} block"
            if kind == "thinking_delta" and signed.get(index):
                return deltas, f"thinking_delta at #{pos} after the block's signature"
            if kind == "text_delta" and block != "text":
                return deltas, f"text_delta at #{pos} in a {block!r} block"
            deltas += kind == "thinking_delta"
            signed[index] = signed.get(index, 0) + (kind == "signature_delta")
            if kind == "text_delta" and isinstance(delta, dict):
                answer += str(delta.get("text", ""))
            if kind == "thinking_delta" and isinstance(delta, dict):
                thought += str(delta.get("thinking", ""))
        elif name == "content_block_stop" and kinds.get(index) == "thinking":
            count = signed.get(index, 0)
            if count != 1:
                return deltas, (
                    f"thinking block {index} ends with {count} signature_delta "
                    "events (one expected)"
                )
    return deltas, boundary_problem(thought, answer) if deltas else None


def _grade(
    recording: Mapping[str, Transcript],
    names: tuple[str, ...],
    judge: Callable[[Events], tuple[int, str | None]],
) -> ProbeResult:
    """Apply ``judge`` to each named 200 stream; graded on those that reason."""
    seen = 0
    for name, events, problem in streams_of(recording, names):
        if problem:
            return fail(f"{name}: {problem}")
        deltas, problem = judge(events)
        if problem:
            return fail(f"{name}: {problem}")
        seen += deltas
    if not seen:
        return not_observable("no reasoning in the recorded streams")
    return passed(f"{seen} reasoning deltas")


def responses_reasoning_framing(recording: Mapping[str, Transcript]) -> ProbeResult:
    """A Responses stream's reasoning is a ``reasoning`` item before the
    message item: its deltas come in that item, before any answer text; its
    ``reasoning_text.done`` holds the deltas' text; no reasoning marker is
    left where the reasoning and the answer meet; a usage that counts
    ``reasoning_tokens`` counts at least one and at most the output tokens.

    Spec: OpenAI API reference, "Responses: streaming events" and "The
    response object" (``output_tokens_details.reasoning_tokens``);
    docs/DESIGN.md, "Reasoning".
    """
    return _grade(recording, RESPONSES_STREAMS, _responses_problem)


def messages_reasoning_framing(recording: Mapping[str, Transcript]) -> ProbeResult:
    """A Messages stream's thinking is in ``thinking`` blocks before the first
    text block: ``thinking_delta`` and ``signature_delta`` only in a thinking
    block, one ``signature_delta`` per block after its last ``thinking_delta``,
    ``text_delta`` only in a text block, and no reasoning marker left where
    the thinking and the text meet.

    Spec: Anthropic API, "Extended thinking" and "Streaming Messages"
    (``thinking_delta``, ``signature_delta``); docs/DESIGN.md, "Reasoning".
    """
    return _grade(recording, MESSAGES_STREAMS, _messages_problem)
