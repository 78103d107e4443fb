"""The reasoning budget in the llama.cpp engine: the end marker forced into a
sequence at its budget (``core/decoding/reasoning_budget.py`` decides when).

``budget_forcer`` makes a sequence's ``BudgetForcer`` from its request (the
end marker tokenized by the model's own vocabulary, special-token text parsed,
so a marker that is one control token is forced as that token);
``draw_within_budget`` wraps one draw: when a token is forced, every other
logit of the row is set to minus infinity before the sampler chain draws (so
the chain, its penalties and a grammar see the token as drawn), and the drawn
token's bytes are fed to the forcer. Runs in the engine's worker thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import llama_cpp as llama
import numpy as np

from sluicegate.core.decoding.reasoning_budget import BudgetForcer
from sluicegate.engines.base import SamplingParams
from sluicegate.engines.llamacpp.vocab import LlamaTokenizer

__all__ = ["budget_forcer", "draw_within_budget"]

_D = TypeVar("_D", bound=tuple[int, Any])


def budget_forcer(
    params: SamplingParams, tokenizer: LlamaTokenizer
) -> BudgetForcer | None:
    """The forcer of a sequence with ``params``, or ``None`` (no budget)."""
    budget = params.reasoning_budget
    if budget is None:
        return None
    end = tokenizer.encode(budget.parser.end, add_special=False, parse_special=True)
    return BudgetForcer(budget, end)


def draw_within_budget(
    forcer: BudgetForcer,
    ctx: Any,
    idx: int,
    tokenizer: LlamaTokenizer,
    draw: Callable[[], _D],
) -> _D:
    """``draw()`` (a token id first, then what the draw gives with it) from
    output row ``idx`` of ``ctx``, with the forced token the only one possible
    when the budget forces one; a logprob read after is of that row (0 for the
    forced token)."""
    forced = forcer.forced
    if forced is not None:
        logits = np.ctypeslib.as_array(
            llama.llama_get_logits_ith(ctx, idx), shape=(tokenizer.vocab_size,)
        )
        logits.fill(-np.inf)
        logits[forced] = 0.0
    drawn = draw()
    forcer.feed(tokenizer.pieces[drawn[0]])
    return drawn
