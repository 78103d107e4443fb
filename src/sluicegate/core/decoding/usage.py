"""One response's token usage, counted while its choices are decoded (no I/O).

``UsageTally`` keeps what ``ResponseDecoder`` reports as the usage of ``End``
(and, with continuous usage, of every ``Delta`` and ``Finish``): the prompt's
tokens, given up front and as engines report them, and what the choices'
decoders have counted.

Invariants:
    - Each prompt is counted once; completion tokens are summed over choices.
    - A prompt's latest count and cached part, as an engine reports them
      (``TextOutput.prompt_tokens``, ``cached_tokens``; a token engine's
      ``EngineOutput.cached_tokens``), are added once, whichever choice
      reported them. A count reported before the engine's (``report_prompt``)
      stays until the engine's last output of a choice replaces it.
    - Reasoning tokens are counted only with a reasoning channel (a reasoning
      decoder, a splitter, or a text engine that said it reasoned); else
      ``Usage.reasoning_tokens`` is ``None``.
"""

from __future__ import annotations

from collections.abc import Sequence

from sluicegate.core.decoding.choice import ChoiceDecoder
from sluicegate.core.decoding.choice_setup import ChoiceState, TextChoiceDecoder
from sluicegate.core.decoding.reasoning_choice import ReasoningChoiceDecoder
from sluicegate.core.events import TextOutput, Usage

__all__ = ["UsageTally"]


class UsageTally:
    """The token counts of one response's choices.

    Args:
        choices: the response's choices, in index order; their decoders count
            the completion tokens (and a reasoning decoder or splitter its
            reasoning tokens).
        prompt_tokens: the response's prompt tokens, each prompt once (tokens);
            for a text engine, those it does not count itself (usually 0).
        prompt_of: the prompt index of each choice; ``None``: every choice
            continues one prompt.
        continuous: ``so_far()`` gives the usage (else ``None``).
    """

    __slots__ = (
        "_choices",
        "_counted",
        "_exact",
        "_prompt_of",
        "_prompt_tokens",
        "_reasoning",
        "_reported",
        "_text_reasoning",
        "_text_splitters",
        "continuous",
    )

    def __init__(
        self,
        choices: Sequence[ChoiceState],
        prompt_tokens: int,
        prompt_of: Sequence[int] | None,
        *,
        continuous: bool,
    ) -> None:
        self._choices = choices
        decoders = [c.decoder for c in choices]
        self._reasoning = [d for d in decoders if isinstance(d, ReasoningChoiceDecoder)]
        self._text_splitters = [
            d for d in decoders if isinstance(d, TextChoiceDecoder) and d.splits
        ]
        # A token engine counts every token itself: its usage is never estimated.
        self._exact = any(isinstance(d, ChoiceDecoder) for d in decoders)
        self._prompt_tokens = prompt_tokens
        self._prompt_of = prompt_of
        # prompt index -> (its tokens, those read from a cache)
        self._reported: dict[int, tuple[int, int]] = {}
        self._counted: set[int] = set()  # text choices the engine ended counting
        # text choice -> reasoning tokens (steps with reasoning, or the engine's count)
        self._text_reasoning: dict[int, int] = {}
        self.continuous = continuous

    @property
    def usage(self) -> Usage:
        """Prompt tokens once, completion tokens taken summed over choices; with
        a reasoning channel, the reasoning tokens among them."""
        completion = sum(c.decoder.completion_tokens for c in self._choices)
        reported = self._reported.values()
        prompt = self._prompt_tokens + sum(tokens for tokens, _ in reported)
        cached = sum(cached for _, cached in reported)
        if not (self._reasoning or self._text_reasoning or self._text_splitters):
            return Usage(prompt, completion, cached)
        reasoning = sum(d.reasoning_tokens for d in self._reasoning)
        reasoning += sum(self._text_reasoning.values())
        reasoning += sum(d.reasoning_tokens for d in self._text_splitters)
        return Usage(prompt, completion, cached, reasoning_tokens=reasoning)

    @property
    def estimated(self) -> bool:
        """Whether ``usage`` is an estimate: a text engine did not end every
        choice with its own counts (a choice cut short by the client, an error
        or a stop string matched here; or an engine that never reports the
        prompt's tokens). Token engines' usage is always exact."""
        return not self._exact and len(self._counted) < len(self._choices)

    def so_far(self) -> Usage | None:
        """The usage so far with continuous usage, else ``None``."""
        return self.usage if self.continuous else None

    def report_prompt(self, prompt: int, tokens: int) -> None:
        """Prompt ``prompt``'s tokens as counted before its engine said them
        (an upstream's tokenizer); the engine's last output's count replaces
        this, and one it already gave stays."""
        self._reported.setdefault(prompt, (tokens, 0))

    def add_cached(self, index: int, tokens: int) -> None:
        """Choice ``index``'s prompt had ``tokens`` read from a token engine's
        cache (its latest report counts)."""
        self._reported[self._prompt(index)] = (0, tokens)

    def count_prompt(self, index: int, item: TextOutput) -> None:
        """A text engine's prompt count and cached part, if choice ``index``'s
        output says them: the last output's replaces any count; an earlier
        output's only fills in a missing one."""
        if item.prompt_tokens is None:
            return
        said = (item.prompt_tokens, item.cached_tokens)
        if item.finish_reason is not None:  # the engine's last word
            self._counted.add(index)
            self._reported[self._prompt(index)] = said
        else:  # a count said before (a tokenizer's) stays
            self._reported.setdefault(self._prompt(index), said)

    def count_reasoning(self, index: int, item: TextOutput) -> None:
        """A text engine's step of choice ``index`` counted as reasoning: its
        own count when it gives one, else the step's tokens when it carries
        reasoning text (a step with neither is not counted)."""
        if item.reasoning or item.reasoning_tokens is not None:
            own = item.reasoning_tokens
            if own is None:
                own = self._text_reasoning.get(index, 0) + item.completion_tokens
            self._text_reasoning[index] = own

    def _prompt(self, index: int) -> int:
        return 0 if self._prompt_of is None else self._prompt_of[index]
