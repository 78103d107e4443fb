"""What a scripted sequence says: its token ids, and the logprobs made up for them.

``Scripts`` turns a ``Script`` (text, token ids, or a function of the request)
into the ids one sequence replays; ``scripted_logprob`` is the logprob each of
them carries when a request asks for logprobs.

Deliberate divergence: with ``never_finishes`` a script is cycled forever (its
first million ids, or a space when it has none).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence

from sluicegate.core.events import TokenLogprob
from sluicegate.engines.base import GenerateRequest
from sluicegate.engines.scripted.vocab import BYTES_START, ScriptedTokenizer

__all__ = ["DEFAULT_TEXT", "Script", "Scripts", "scripted_logprob"]

DEFAULT_TEXT = "Hello! Café 日本語 😀 — the quick brown fox streams tokens correctly."
"""What the default script says (then it ends with ``<end_of_turn>``)."""

Script = str | Sequence[int] | Callable[[GenerateRequest], Iterable[int]]
"""Text (encoded with special tokens parsed), token ids, or ids per request."""


class Scripts:
    """The token ids every sequence of one scripted engine replays.

    Args:
        script: the engine's script; ``None``: ``DEFAULT_TEXT`` then
            ``<end_of_turn>``.
        tokenizer: encodes a text script (special tokens parsed).
        never_finishes: cycle each sequence's ids forever.
    """

    def __init__(
        self,
        script: Script | None,
        tokenizer: ScriptedTokenizer,
        *,
        never_finishes: bool,
    ) -> None:
        self._script = f"{DEFAULT_TEXT}<end_of_turn>" if script is None else script
        self._tokenizer = tokenizer
        self._never_finishes = never_finishes
        self._text_ids: tuple[int, ...] | None = None

    def for_request(self, request: GenerateRequest) -> Iterator[int]:
        """The ids ``request``'s sequence replays (maybe endless)."""
        script = self._script
        if isinstance(script, str):
            ids: Iterable[int] = self._encoded_text(script)
        elif callable(script):
            ids = script(request)
        else:
            ids = script
        if self._never_finishes:
            return _endless(ids)
        return iter(ids)

    def _encoded_text(self, text: str) -> tuple[int, ...]:
        # Encoded once: the toy tokenizer is pure Python and a long script would
        # otherwise cost more per request than serving its tokens.
        if self._text_ids is None:
            self._text_ids = tuple(
                self._tokenizer.encode(text, add_special=False, parse_special=True)
            )
        return self._text_ids


def scripted_logprob(token_id: int, k: int, vocab_size: int) -> TokenLogprob:
    """The made-up logprob of a scripted token: ``-(token_id % 7 + 1) / 8``.

    Its ``k`` alternatives are the token itself, then the next ids (wrapping
    around the vocabulary), each ``0.5`` less likely than the one before.
    """
    logprob = -(token_id % 7 + 1) / 8
    top = tuple(((token_id + i) % vocab_size, logprob - 0.5 * i) for i in range(k))
    return TokenLogprob(token_id, logprob, top)


def _endless(ids: Iterable[int]) -> Iterator[int]:
    cached = list(itertools.islice(ids, 1_000_000))
    return itertools.cycle(cached or [BYTES_START + ord(" ")])
