"""Probes of reasoning on chat streams: its place before the answer, its count.

A thinking model's reasoning streams in ``delta.reasoning_content`` (or
``delta.reasoning``) apart from its content. These probes grade whatever the
recorded chat streams carry; an endpoint whose model does not reason is
not observable, not failed.

Spec: docs/DESIGN.md, "Reasoning"; vLLM documentation, "Reasoning Outputs".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sluicegate.check.transcript import Transcript
from sluicegate.check.verdicts import (
    ProbeResult,
    choice_deltas,
    clip,
    fail,
    not_observable,
    passed,
    streams,
    text_of,
)

__all__ = ["END_MARKER", "START_MARKER", "boundary_problem", "reasoning_framing"]

START_MARKER = "<think>"
"""The start marker a ``<think>`` family of models writes (docs/DESIGN.md)."""
END_MARKER = "</think>"
"""Its end marker."""


def _reasoning_of(choice: Mapping[str, Any]) -> str:
    """A streamed choice object's reasoning text (``reasoning_content``, else
    ``reasoning``)."""
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return ""
    for name in ("reasoning_content", "reasoning"):
        value = delta.get(name)
        if isinstance(value, str) and value:
            return value
    return ""


def boundary_problem(reasoning: str, answer: str) -> str | None:
    """What a server left of the markers where it split a choice's reasoning
    from its answer, or ``None``: the reasoning begins with a start marker
    (``<think>``) or ends with an end marker (``</think>``), or the answer
    begins with an end marker (whitespace aside).

    Only that boundary is the server's: the first end marker ends the
    reasoning, and a marker the model writes anywhere else (a second
    ``<think>`` block opening its answer, a ``</think>`` it quotes) is text of
    its channel, as the server must pass it on.

    Spec: docs/DESIGN.md, "Reasoning" (one block at the start; later markers
    are text of the answer; markers reach neither channel).
    """
    if reasoning.lstrip().startswith(START_MARKER):
        return f"the reasoning begins with {START_MARKER}: {clip(reasoning)}"
    if reasoning.rstrip().endswith(END_MARKER):
        return f"the reasoning ends with {END_MARKER}: {clip(reasoning[-80:])}"
    if answer.lstrip().startswith(END_MARKER):
        return f"the answer begins with {END_MARKER}: {clip(answer)}"
    return None


def reasoning_framing(recording: Mapping[str, Transcript]) -> ProbeResult:
    """A choice's reasoning all comes before its first content, no reasoning
    marker is left where its reasoning and its content meet
    (``boundary_problem``), and a usage that counts ``reasoning_tokens``
    counts at least one and at most the completion tokens.

    Spec: docs/DESIGN.md, "Reasoning" (one block at the start, markers in
    neither channel); OpenAI API reference, "The chat completion object"
    (``usage.completion_tokens_details.reasoning_tokens``).
    """
    seen = 0
    for name, _, parsed in streams(recording):
        reasoned = False
        for index, items in choice_deltas(parsed).items():
            content = thoughts = ""
            for pos, choice in items:
                thought = _reasoning_of(choice)
                if thought and content:
                    return fail(
                        f"{name}: choice {index}, reasoning at #{pos} after content "
                        f"{clip(content)}"
                    )
                thoughts += thought
                seen += bool(thought)
                content += text_of(choice)
            problem = boundary_problem(thoughts, content) if thoughts else None
            if problem:
                return fail(f"{name}: choice {index}, {problem}")
            reasoned = reasoned or bool(thoughts)
        usage = next(
            (c["usage"] for _, c in parsed.chunks if isinstance(c.get("usage"), dict)),
            None,
        )
        details = usage.get("completion_tokens_details") if usage else None
        counted = details.get("reasoning_tokens") if isinstance(details, dict) else None
        if reasoned and isinstance(counted, int) and usage is not None:
            completion = usage.get("completion_tokens")
            if counted < 1 or (isinstance(completion, int) and counted > completion):
                return fail(
                    f"{name}: reasoning_tokens {counted} for {completion} "
                    "completion tokens, with reasoning streamed"
                )
    if not seen:
        return not_observable("no reasoning deltas (the model did not reason)")
    return passed(f"{seen} reasoning deltas")
