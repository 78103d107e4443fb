"""A reasoning budget enforced inside the sequence: at the budget the end
marker's tokens are forced, so the model itself closes its reasoning and
writes its answer after it.

``ReasoningBudget`` is what an engine that enforces budgets receives with a
request (``SamplingParams.reasoning_budget``); ``BudgetForcer`` is one
sequence's state: ``feed`` takes the bytes of each token drawn and returns the
token the next draw must take (``None``: draw freely). The engine makes every
other token impossible at that draw, as it does for a grammar.

Rules:

- The count is the tokens drawn while the reasoning is open, from the first
  (a start marker the model writes itself included): the count the server
  reports as ``reasoning_tokens``. An output that begins inside the reasoning
  counts from its first token, even while what it writes could still be a
  start marker (which would be dropped, and counted, as reasoning). Once the
  count reaches ``budget_tokens`` with the reasoning open, the end marker's
  tokens (the marker as the model's vocabulary spells it) are forced, one per
  draw; the reasoning then ends at ``budget_tokens`` plus those tokens, and
  what the model writes next is its answer.
- Not in the middle of a character: when the budget is reached on a token that
  ends inside a UTF-8 sequence, forcing waits until the character is complete
  (llama.cpp's sampler does the same), so the count may pass the budget by the
  few tokens of that character.
- A model that ends its reasoning first (its own end marker), or an output
  that is content from the start, is never forced. Budget 0 with an output that
  begins inside the reasoning forces the end marker on the first draw.
- One reasoning block: after the end marker nothing is forced again
  (llama.cpp re-arms on a later start marker; a later marker is text of the
  answer here, as ``ReasoningSplitter`` reads it).

What others do (read, not copied): llama.cpp's reasoning-budget sampler
matches start and end token sequences, counts tokens after the start, waits
for a complete UTF-8 character, then sets every logit but the forced token's
to minus infinity until its forced sequence (an optional message, then the end
marker) is written. vLLM's thinking-budget logits processor finds the
start and end token ids in the prompt and the output, counts the tokens after
the start, and at the budget raises the next end-marker token's logit to 1e9,
one token per step. Both match token ids; this one matches characters, so a
marker spelled in several tokens is found too.

Spec: Anthropic Messages API, extended thinking (``thinking.budget_tokens``);
vLLM's ``thinking_token_budget``; docs/DESIGN.md, "Reasoning".
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from dataclasses import dataclass

from sluicegate.core.decoding.reasoning import ReasoningPhase, ReasoningSplitter
from sluicegate.core.decoding.reasoning_parsers import ReasoningParser

__all__ = ["BudgetForcer", "ReasoningBudget"]


@dataclass(frozen=True, slots=True)
class ReasoningBudget:
    """One request's reasoning budget, as an engine that enforces it sees it.

    Attributes:
        parser: the request's markers, with its ``starts_inside`` decided
            (``core.reasoning_choice.request_reasoning``).
        budget_tokens: reasoning tokens before the end marker is forced (>= 0).
    """

    parser: ReasoningParser
    budget_tokens: int


class BudgetForcer:
    """One sequence's reasoning budget: which token the next draw must take.

    Args:
        budget: the request's budget and markers.
        end_token_ids: the end marker in the model's tokens (what is forced).

    Raises:
        ValueError: no end marker tokens, or a parser without reasoning.
    """

    __slots__ = (
        "_at",
        "_budget",
        "_done",
        "_end",
        "_fed",
        "_inside",
        "_pending",
        "_splitter",
    )

    def __init__(self, budget: ReasoningBudget, end_token_ids: Sequence[int]) -> None:
        if not end_token_ids or not budget.parser.reasons:
            raise ValueError(
                f"expected a reasoning parser and its end marker's tokens; got "
                f"{budget.parser.name!r} and {list(end_token_ids)!r}"
            )
        self._splitter = ReasoningSplitter(budget.parser)
        self._pending = codecs.getincrementaldecoder("utf-8")("replace")
        self._budget = budget.budget_tokens
        self._end = tuple(end_token_ids)
        # Position in ``_end`` of the next forced token; -1: not forcing.
        self._at = (
            0 if budget.budget_tokens <= 0 and budget.parser.starts_inside else -1
        )
        self._done = False
        self._inside = budget.parser.starts_inside
        self._fed = 0  # tokens drawn before forcing began

    @property
    def forced(self) -> int | None:
        """The token the next draw must take, or ``None`` (draw freely)."""
        return self._end[self._at] if self._at >= 0 else None

    @property
    def done(self) -> bool:
        """Whether the reasoning has ended (by the model, by forcing, or because
        the output is content): nothing is forced any more."""
        return self._done

    def feed(self, piece: bytes) -> int | None:
        """Take the bytes of the token just drawn.

        Args:
            piece: the token's bytes (a control token's text for one).

        Returns:
            ``forced`` after this token: the token the next draw must take, or
            ``None``.
        """
        if self._done:
            return None
        splitter = self._splitter
        splitter.feed(self._pending.decode(piece))
        if self._at >= 0:
            self._at += 1
            if self._at == len(self._end):
                self._at, self._done = -1, True
                return None
            return self._end[self._at]
        self._fed += 1
        phase = splitter.phase
        if phase is ReasoningPhase.CONTENT:
            self._done = True
            return None
        # Every token so far is reasoning once it opened, or while the output
        # begins inside it (a start marker it may still be writing included).
        reasoning = phase is ReasoningPhase.REASONING or self._inside
        spent = reasoning and self._fed >= self._budget
        if spent and not self._pending.getstate()[0]:  # not inside a character
            self._at = 0
            return self._end[0]
        return None
