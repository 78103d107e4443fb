"""The reasoning markers of model families, and how a chat template or a
rendered prompt tells which family and where the output begins.

``REASONING_PARSERS`` is the table ``--reasoning-parser`` chooses from;
``detect_reasoning_parser`` recognizes a family from a chat template's source;
``opened_by_prompt`` reads a rendered prompt's tail. The splitter that uses
the markers is ``core/decoding/reasoning.py``'s ``ReasoningSplitter``.

Spec: DeepSeek-R1 model card ("enforce the model to initiate its response with
``<think>\\n``"); Qwen3 model card (``enable_thinking``); vLLM documentation,
"Reasoning Outputs" (``--reasoning-parser``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = [
    "REASONING_PARSERS",
    "ReasoningParser",
    "detect_reasoning_parser",
    "opened_by_prompt",
    "reasoning_parser",
]


@dataclass(frozen=True, slots=True)
class ReasoningParser:
    """The reasoning markers of one model family.

    Attributes:
        name: the name ``--reasoning-parser`` takes.
        start: the start marker; ``""`` when the model never writes one.
        end: the end marker; ``""`` for a family without reasoning.
        starts_inside: whether the output begins inside the reasoning (the chat
            template already wrote the start marker).

    Raises:
        ValueError: markers that cannot describe a reasoning block: a start
            without an end, or neither a start marker nor ``starts_inside``
            while there is an end marker (the reasoning could never open).
    """

    name: str
    start: str
    end: str
    starts_inside: bool

    def __post_init__(self) -> None:
        if not self.end and (self.start or self.starts_inside):
            raise ValueError(
                f"expected an end marker for reasoning parser {self.name!r}; got ''"
            )
        if self.end and not self.start and not self.starts_inside:
            raise ValueError(
                f"expected a start marker or starts_inside for reasoning parser "
                f"{self.name!r}; got neither"
            )

    @property
    def reasons(self) -> bool:
        """Whether this family writes reasoning at all."""
        return bool(self.end)


REASONING_PARSERS: Mapping[str, ReasoningParser] = MappingProxyType(
    {
        parser.name: parser
        for parser in (
            # DeepSeek-R1: recent chat templates end the prompt with "<think>\n";
            # older checkpoints write "<think>" themselves (dropped when they do).
            ReasoningParser("deepseek_r1", "<think>", "</think>", starts_inside=True),
            # Qwen3: the model opens the block itself; with enable_thinking off the
            # template writes an empty block and the output is all content.
            ReasoningParser("qwen3", "<think>", "</think>", starts_inside=False),
            ReasoningParser("none", "", "", starts_inside=False),
        )
    }
)
"""The reasoning parsers by name (the values ``--reasoning-parser`` accepts)."""


def reasoning_parser(name: str) -> ReasoningParser:
    """The parser named ``name`` in ``REASONING_PARSERS``.

    Raises:
        KeyError: an unknown name; the message lists the known ones.
    """
    parser = REASONING_PARSERS.get(name)
    if parser is None:
        known = ", ".join(sorted(REASONING_PARSERS))
        raise KeyError(f"expected a reasoning parser ({known}); got {name!r}")
    return parser


def detect_reasoning_parser(chat_template: str | None) -> ReasoningParser | None:
    """The parser whose markers a chat template's source spells out, if any.

    A template that names both markers of a family (to open the reasoning in the
    prompt, or to strip earlier reasoning from the history) is taken to be for
    that family. ``qwen3`` is returned for ``<think>`` templates: whether a
    given prompt opened the reasoning is then told by ``opened_by_prompt``.

    Args:
        chat_template: the Jinja source, or ``None`` (no template).

    Returns:
        The first matching parser of ``REASONING_PARSERS`` that has a start
        marker and does not start inside, or ``None``: no family recognized
        (serve without a splitter unless ``--reasoning-parser`` says otherwise).
    """
    if not chat_template:
        return None
    for parser in REASONING_PARSERS.values():
        if (
            parser.start
            and not parser.starts_inside
            and parser.start in chat_template
            and parser.end in chat_template
        ):
            return parser
    return None


def opened_by_prompt(prompt: str, parser: ReasoningParser) -> bool | None:
    """Whether a rendered prompt leaves the model inside the reasoning.

    A template that opens the reasoning ends the generation prompt with the
    start marker (DeepSeek-R1's ``"<think>\\n"``); one that switches it off
    writes an empty block (Qwen3's ``"<think>\\n\\n</think>\\n\\n"``). Only the
    prompt's tail is read, so a marker quoted in a message does not count.

    Args:
        prompt: the prompt text as rendered (generation prompt included).
        parser: the family's markers.

    Returns:
        ``True`` when the prompt ends with the start marker (trailing whitespace
        aside), ``False`` when it ends with the end marker, ``None`` otherwise
        (keep ``parser.starts_inside``); pass it as ``ReasoningSplitter``'s
        ``starts_inside``.
    """
    if not parser.reasons:
        return None
    tail = prompt.rstrip()
    if parser.start and tail.endswith(parser.start):
        return True
    if tail.endswith(parser.end):
        return False
    return None
