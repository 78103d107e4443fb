"""Constrained decoding on llama.cpp: llguidance token masks over a GGUF vocabulary.

A ``Grammar`` (engines/base.py) is llguidance's Lark dialect. ``GrammarCompiler``
compiles one against the served vocabulary; each constrained sequence gets a
``TokenConstraint``, whose ``sample()`` replaces ``llama_sampler_sample`` for it.

Why llguidance and not llama.cpp's own grammar sampler: Gemma 3 has 262,144
tokens, and llama.cpp's sampler checks every candidate against the grammar's
stacks on each step (22-56 ms a step for JSON on this project's CPU, so 12-15
tokens/s where the model alone makes 70-78). llguidance computes the set of
allowed tokens from a token trie in 0.01-0.2 ms. ``bench/constrained.py``
measures both.

The cost per token is kept near zero by sampling first and checking after:

1. sample as usual (the sampler chain of the request);
2. if the grammar accepts that token (under a microsecond), it is the answer;
3. otherwise compute the mask of allowed tokens, set the logits of all others
   to minus infinity in llama.cpp's own logits row, and sample again.

For greedy and plain temperature sampling the result is exactly a draw from the
masked distribution (a rejected first draw is rejection sampling). Deliberate
divergences: with top-k, top-p or min-p the truncation of the first draw is of
the unmasked distribution (llama.cpp's common sampler does the same). Two cases
always mask first: a request for logprobs (so every reported logprob is of the
constrained distribution) and penalties (their sampler remembers every token it
is told of, and would count the rejected draw).

The tokenizer llguidance needs is built once per vocabulary (about 1.5 s for
Gemma 3): the llama.cpp engine starts building it in a thread of its own at
start-up, and a constrained request that comes earlier waits for it;
compiled grammars are cached by text, and each sequence starts from a copy.
"""

from __future__ import annotations

import functools
import re
import threading
from collections import OrderedDict
from typing import Any

import llama_cpp as llama
import llguidance
import numpy as np

from sluicegate.engines.base import Grammar, SamplingParams
from sluicegate.engines.llamacpp.vocab import LlamaTokenizer

__all__ = [
    "EMPTY_LANGUAGE",
    "GrammarCompiler",
    "GrammarError",
    "TokenConstraint",
    "grammar_errors",
    "unimplemented_keywords",
]

_CACHED_GRAMMARS = 64
_UNIMPLEMENTED = re.compile(r"Unimplemented keys: \[([^\]]*)\]")


class GrammarError(ValueError):
    """A grammar that does not compile, or a sequence that left its grammar."""


def grammar_errors(text: str) -> list[str]:
    """Compile ``text`` without a vocabulary; the errors, ``[]`` if it compiles.

    Cheap (about a millisecond for a tool or response schema): what the server
    checks before answering, so that a grammar the engine cannot build is a 400.

    Args:
        text: a grammar in llguidance's Lark dialect.

    Returns:
        One message per error (llguidance's own words; ``EMPTY_LANGUAGE`` for
        one that compiles and lets nothing start), or ``[]``.
    """
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text, None)
    if failed:
        return list(messages)
    if '"$ref"' in text and not _can_start(text):
        return [EMPTY_LANGUAGE]
    return []


EMPTY_LANGUAGE = (
    "the schema matches no JSON value (it refers to itself with no way out)"
)
"""Why a grammar that compiles but lets no text start is refused: a JSON schema
whose references only cycle (``{"$ref": "#"}``) compiles, and then failed the
request at its first token with llguidance's ``NoExtensionBias``."""


class _Bytes:
    """A vocabulary of the 256 bytes and an end token, for ``_can_start``."""

    def __init__(self) -> None:
        self.eos_token_id = 256
        self.bos_token_id = None
        self.tokens = [bytes([i]) for i in range(256)] + [b"</s>"]
        self.special_token_ids = [256]

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


@functools.cache
def _bytes_tokenizer() -> llguidance.LLTokenizer:
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()))


def _can_start(text: str) -> bool:
    """Whether the grammar ``text`` lets any byte (or the end) come first.

    Only for grammars with a ``$ref``: the only way past llguidance's own
    unsatisfiability checks is a reference cycle (compiling against bytes costs
    about 4x the check alone)."""
    tokenizer = _bytes_tokenizer()
    matcher = llguidance.LLMatcher(tokenizer, text)
    mask = np.zeros((tokenizer.vocab_size + 31) // 32, dtype=np.int32)
    if not matcher.is_error():
        matcher.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
    return not matcher.is_error()


def unimplemented_keywords(message: str) -> list[str]:
    """The JSON-schema keywords an llguidance error says it cannot express."""
    found: list[str] = []
    for match in _UNIMPLEMENTED.finditer(message):
        found.extend(k.strip().strip('"') for k in match.group(1).split(",") if k)
    return found


class _Vocabulary:
    """What ``llguidance.TokenizerWrapper`` reads from a tokenizer."""

    def __init__(self, tokenizer: LlamaTokenizer) -> None:
        self.eos_token_id = min(tokenizer.stop_ids)
        self.bos_token_id = None
        self.tokens = list(tokenizer.pieces)
        self.special_token_ids = sorted(tokenizer.special_ids)
        self._tokenizer = tokenizer

    def __call__(self, text: bytes) -> list[int]:
        decoded = text.decode("utf-8", "replace")
        return self._tokenizer.encode(decoded, add_special=False, parse_special=False)


class GrammarCompiler:
    """Compiles grammars against one llama.cpp vocabulary, for the worker thread.

    Args:
        tokenizer: the served model's vocabulary. Its end-of-generation tokens
            are the only ones a grammar allows once it is complete.
    """

    def __init__(self, tokenizer: LlamaTokenizer) -> None:
        self._tokenizer = tokenizer
        self._lltokenizer: llguidance.LLTokenizer | None = None
        self._cache: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    def lltokenizer(self) -> llguidance.LLTokenizer:
        """llguidance's view of the vocabulary, built on first use (seconds)."""
        with self._lock:
            if self._lltokenizer is None:
                wrapper = llguidance.TokenizerWrapper(_Vocabulary(self._tokenizer))
                self._lltokenizer = llguidance.LLTokenizer(
                    wrapper, eos_token=sorted(self._tokenizer.stop_ids)
                )
            return self._lltokenizer

    def compile(self, grammar: Grammar) -> None:
        """Compile ``grammar`` into the cache now, in the caller's thread.

        For the server's schema worker: compiled there (seconds for a large
        schema, the interpreter released), the engine's worker finds it cached
        and no other sequence waits for the compile. The compile runs outside
        the lock; a grammar that does not compile is left for ``constraint``
        to refuse.
        """
        lltokenizer = self.lltokenizer()
        with self._lock:
            if grammar.text in self._cache:
                return
        template = llguidance.LLMatcher(lltokenizer, grammar.text)
        if template.is_error():
            return
        with self._lock:
            self._cache[grammar.text] = template
            if len(self._cache) > _CACHED_GRAMMARS:
                self._cache.popitem(last=False)

    def constraint(self, grammar: Grammar, params: SamplingParams) -> TokenConstraint:
        """A fresh constraint for one sequence sampled with ``params``.

        Raises:
            GrammarError: ``grammar.text`` does not compile for this vocabulary.
        """
        lltokenizer = self.lltokenizer()
        with self._lock:
            template = self._cache.get(grammar.text)
            if template is None:
                template = llguidance.LLMatcher(lltokenizer, grammar.text)
                if template.is_error():
                    raise GrammarError(template.get_error())
                self._cache[grammar.text] = template
                if len(self._cache) > _CACHED_GRAMMARS:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(grammar.text)
            matcher = template.deep_copy()
        always_mask = params.logprobs is not None or bool(
            params.repetition_penalty != 1.0
            or params.frequency_penalty
            or params.presence_penalty
        )
        return TokenConstraint(matcher, lltokenizer.vocab_size, always_mask=always_mask)


class TokenConstraint:
    """One sequence's grammar state: samples only tokens the grammar allows.

    Args:
        matcher: an llguidance matcher at the start of the sequence's output.
        n_vocab: the width of llama.cpp's logits rows (tokens).
        always_mask: mask before every draw, never only after a rejection.

    Attributes:
        masks: steps that computed a mask (the slow path), for measurements.
    """

    def __init__(
        self, matcher: llguidance.LLMatcher, n_vocab: int, *, always_mask: bool
    ) -> None:
        self._matcher = matcher
        self._n_vocab = n_vocab
        self._always_mask = always_mask
        self._mask = np.zeros((n_vocab + 31) // 32, dtype=np.int32)
        self.masks = 0

    def sample(self, sampler: Any, ctx: Any, idx: int) -> int:
        """The next token: drawn with ``sampler`` from output row ``idx`` of ``ctx``.

        After a rejection (or always, see ``always_mask``) the logits of the
        tokens the grammar forbids are set to minus infinity in ``ctx``'s row,
        so a logprob read from it afterwards is of the constrained distribution.

        Raises:
            GrammarError: the grammar allows no token, or refused the one drawn.
        """
        matcher = self._matcher
        if not self._always_mask:
            token: int = llama.llama_sampler_sample(sampler, ctx, idx)
            if matcher.validate_tokens([token]) == 1:
                matcher.consume_token(token)
                return token
        self.masks += 1
        mask = self._mask
        matcher.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
        if matcher.is_error():  # its first line: the rest is llguidance's state
            raise GrammarError(matcher.get_error().strip().split("\n", 1)[0])
        allowed = np.unpackbits(
            mask.view(np.uint8), count=self._n_vocab, bitorder="little"
        )
        logits = np.ctypeslib.as_array(
            llama.llama_get_logits_ith(ctx, idx), shape=(self._n_vocab,)
        )
        np.putmask(logits, allowed == 0, -np.inf)
        token = llama.llama_sampler_sample(sampler, ctx, idx)
        if not matcher.consume_token(token):
            raise GrammarError(
                f"the grammar refused token {token}: {matcher.get_error()}"
            )
        return token
