"""Sampling on llama.cpp: each sequence's sampler chain, its grammar, and logprobs.

``Sampling`` belongs to one engine's context. ``start`` builds a sequence's
sampler chain from its ``SamplingParams`` (logit bias, penalties, then greedy, or
top-k, top-p, min-p, temperature and a seeded draw); ``sample`` draws the next
token from the logits of one batch position, through the sequence's grammar when
it has one (a plain greedy draw is the row's argmax, without the chain), and
with its logprob when the request asks for logprobs; ``stop`` frees what
``start`` and ``sample`` made.

All of it runs in the engine's worker thread, which owns the context.
"""

from __future__ import annotations

from typing import Any, Protocol

import llama_cpp as llama
import numpy as np

from sluicegate.core.events import TokenLogprob
from sluicegate.engines.base import GenerateRequest, SamplingParams
from sluicegate.engines.llamacpp.budget import budget_forcer, draw_within_budget
from sluicegate.engines.llamacpp.grammar import GrammarCompiler
from sluicegate.engines.llamacpp.vocab import LlamaTokenizer

__all__ = ["Sampled", "Sampling"]

_RANDOM_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: llama.cpp picks a random seed


class Sampled(Protocol):
    """A sequence as sampling sees it: its request and what sampling made."""

    request: GenerateRequest
    sampler: Any
    """The llama.cpp sampler chain, from ``start`` to ``stop``."""
    constraint: Any
    """A ``TokenConstraint``, made on the first draw of a constrained request."""
    budget: Any
    """A ``BudgetForcer`` for a request with a reasoning budget, from ``start``."""


class Sampling:
    """The samplers of one llama.cpp context's sequences.

    Args:
        ctx: the llama.cpp context whose logits are sampled.
        tokenizer: the model's vocabulary.
        grammars: compiles a request's grammar into a token constraint.
    """

    def __init__(
        self, ctx: Any, tokenizer: LlamaTokenizer, grammars: GrammarCompiler
    ) -> None:
        self._ctx = ctx
        self._tokenizer = tokenizer
        self._grammars = grammars

    def start(self, seq: Sampled) -> None:
        """Give ``seq`` the sampler chain its parameters ask for."""
        seq.sampler = _make_sampler(seq.request.params, self._tokenizer.vocab_size)
        seq.budget = budget_forcer(seq.request.params, self._tokenizer)

    def sample(self, seq: Sampled, idx: int) -> tuple[int, TokenLogprob | None]:
        """The token drawn for ``seq`` from batch position ``idx``'s logits.

        Returns:
            The token id, and its logprob (with ``params.logprobs`` best
            alternatives) when the request asks for logprobs, else ``None``.

        Raises:
            GrammarError: the sequence's grammar failed.
        """
        if seq.budget is not None:  # its reasoning may have to be closed now
            draw = lambda: self._draw(seq, idx)  # noqa: E731
            return draw_within_budget(seq.budget, self._ctx, idx, self._tokenizer, draw)
        return self._draw(seq, idx)

    def _draw(self, seq: Sampled, idx: int) -> tuple[int, TokenLogprob | None]:
        params = seq.request.params
        logits = None
        if _plain_greedy(params):
            # llama.cpp's greedy chain copies the whole vocabulary into a
            # candidate array first (about 5% of a 16-stream step on the default
            # model); argmax picks the same token, the first of equal best.
            logits = self._logits(idx)
            token = int(logits.argmax())
        elif params.grammar is None:
            token = llama.llama_sampler_sample(seq.sampler, self._ctx, idx)
        else:
            if seq.constraint is None:
                seq.constraint = self._grammars.constraint(params.grammar, params)
            token = seq.constraint.sample(seq.sampler, self._ctx, idx)
        if params.logprobs is None:
            return token, None
        logits = self._logits(idx) if logits is None else logits
        return token, _logprob_of(logits, token, params.logprobs)

    def _logits(self, idx: int) -> Any:
        return np.ctypeslib.as_array(
            llama.llama_get_logits_ith(self._ctx, idx),
            shape=(self._tokenizer.vocab_size,),
        )

    def stop(self, seq: Sampled) -> None:
        """Free ``seq``'s sampler chain and constraint."""
        llama.llama_sampler_free(seq.sampler)
        seq.sampler = None
        seq.constraint = None
        seq.budget = None


def _plain_greedy(params: SamplingParams) -> bool:
    """Whether the chain ``_make_sampler`` builds is greedy alone."""
    return (
        params.temperature <= 0.0
        and params.grammar is None
        and not params.logit_bias
        and not _penalised(params)
    )


def _penalised(params: SamplingParams) -> bool:
    return bool(
        params.repetition_penalty != 1.0
        or params.frequency_penalty
        or params.presence_penalty
    )


def _logprob_of(logits: Any, token: int, k: int) -> TokenLogprob:
    """Log-softmax of raw logits: the sampled token and its k best alternatives."""
    shifted = logits.astype(np.float64) - float(logits.max())
    log_z = float(np.log(np.exp(shifted).sum()))
    top: tuple[tuple[int, float], ...] = ()
    if k > 0:
        best = np.argpartition(-shifted, k)[:k]
        best = best[np.argsort(-shifted[best], kind="stable")]
        top = tuple((int(t), float(shifted[t]) - log_z) for t in best)
    return TokenLogprob(token, float(shifted[token]) - log_z, top)


def _make_sampler(params: SamplingParams, n_vocab: int) -> Any:
    chain = llama.llama_sampler_chain_init(llama.llama_sampler_chain_default_params())
    add = llama.llama_sampler_chain_add
    if params.logit_bias:
        biases = (llama.llama_logit_bias * len(params.logit_bias))()
        for i, (token, bias) in enumerate(params.logit_bias):
            biases[i] = llama.llama_logit_bias(token, bias)
        add(
            chain,
            llama.llama_sampler_init_logit_bias(
                n_vocab, len(params.logit_bias), biases
            ),
        )
    if _penalised(params):
        add(
            chain,
            llama.llama_sampler_init_penalties(
                n_vocab,
                64,
                params.repetition_penalty,
                params.frequency_penalty,
                params.presence_penalty,
            ),
        )
    if params.temperature <= 0.0:
        add(chain, llama.llama_sampler_init_greedy())
        return chain
    if params.top_k > 0:
        add(chain, llama.llama_sampler_init_top_k(params.top_k))
    if params.top_p < 1.0:
        add(chain, llama.llama_sampler_init_top_p(params.top_p, 1))
    if params.min_p > 0.0:
        add(chain, llama.llama_sampler_init_min_p(params.min_p, 1))
    add(chain, llama.llama_sampler_init_temp(params.temperature))
    seed = _RANDOM_SEED if params.seed is None else params.seed & 0xFFFFFFFF
    add(chain, llama.llama_sampler_init_dist(seed))
    return chain
