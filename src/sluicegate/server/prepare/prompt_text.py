"""A prompt's text, checked to fit before it is tokenized, tokenized off the loop
when long.

``check_prompt_size`` refuses a text that cannot leave room in the context window
without tokenizing it, from a bound that holds for every text: no token stands
for more bytes than the longest piece of the vocabulary. ``PromptText`` is a
prompt that passed it; ``tokenize`` runs its ``encode()`` on the event loop when
it is short and in a worker thread otherwise.

Why both: at Gemma 3's 48-byte longest piece and an 8,192-token window, the
bound lets through up to 393,216 bytes, and llama.cpp's tokenizer grows faster
than linearly (measured on this project's 2-core machine, Gemma 3 vocabulary,
special tokens parsed: 10 KB in 30 ms, 100 KB in 0.3-0.75 s, 400 KB in 2 s,
4 MB in 480 s). llama.cpp tokenizes in C with the GIL released (ctypes), so the
event loop keeps serving every other stream meanwhile.

Spec: docs/DESIGN.md, "Status first, errors in band" and "Admission and limits".
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import anyio.to_thread

from sluicegate.core.errors import RequestError
from sluicegate.engines.base import Tokenizer
from sluicegate.server.prepare.control_text import ControlText

__all__ = [
    "OFF_LOOP_CHARS",
    "PromptText",
    "check_prompt_size",
    "longest_piece_bytes",
    "tokenize",
]

OFF_LOOP_CHARS = 4096
"""Prompts of at least this many characters are tokenized in a worker thread
(about 10 ms of llama.cpp tokenizing, on the event loop, below it)."""


@dataclass(frozen=True, slots=True)
class PromptText:
    """A prompt's text, checked to fit, that ``encode()`` tokenizes.

    Attributes:
        tokenizer: the served model's tokenizer.
        parts: with ``control`` ``None``, one text, tokenized with special tokens
            parsed; otherwise ``ControlText.split``'s parts (control tokens at odd
            indices, plain text between them).
        add_special: prepend what the tokenizer adds to a text (BOS).
        control: the ``ControlText`` that split the text, if it was split.
    """

    tokenizer: Tokenizer
    parts: tuple[str, ...]
    add_special: bool
    control: ControlText | None = None

    @property
    def chars(self) -> int:
        """Length of the text (characters)."""
        return sum(map(len, self.parts))

    def encode(self) -> list[int]:
        """The token ids of the prompt (may take long: see ``tokenize``)."""
        if self.control is not None:
            return self.control.encode(list(self.parts), add_special=self.add_special)
        (text,) = self.parts
        return self.tokenizer.encode(
            text, add_special=self.add_special, parse_special=True
        )


async def tokenize(prompt: PromptText) -> list[int]:
    """``prompt.encode()``: inline under ``OFF_LOOP_CHARS``, else in a worker thread.

    Cancelling the caller does not stop a tokenization under way; its result is
    dropped when it ends.
    """
    if prompt.chars < OFF_LOOP_CHARS:
        return prompt.encode()
    return await anyio.to_thread.run_sync(prompt.encode)


def check_prompt_size(
    tokenizer: Tokenizer, texts: Sequence[str], context_length: int, *, param: str
) -> None:
    """Refuse, without tokenizing it, a prompt that cannot leave room in the
    context window.

    Sound because the tokens of a text spell out its bytes, each with its piece:
    no token stands for more bytes than the longest piece of the vocabulary
    (``K`` bytes), so ``B`` bytes of text take at least ``B / K`` tokens.
    (SentencePiece's added space only adds bytes; a vocabulary whose one unknown
    token stands for a whole run of text, as BERT's WordPiece does, would break
    this; GGUF chat models use byte-level BPE or byte-fallback SentencePiece.)
    The check costs ``O(1)`` for a prompt under ``context_length * K / 4``
    characters (a character is at most 4 bytes), one UTF-8 length count above.

    Args:
        tokenizer: the served model's tokenizer (its pieces give ``K``).
        texts: the prompt, in parts (their joined text is what is tokenized).
        context_length: the model's context window (tokens).
        param: the ``param`` of the refusal.

    Raises:
        RequestError: 400 ``context_length_exceeded`` when ``B / K`` tokens leave
            no room for one completion token; the message gives the window, the
            bytes, ``K`` and that least number of tokens.
    """
    longest = longest_piece_bytes(tokenizer)
    limit_bytes = context_length * longest  # this many bytes or more cannot fit
    if sum(map(len, texts)) * 4 < limit_bytes:
        return
    size = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
    if size < limit_bytes:
        return
    raise RequestError(
        f"This model's context window is {context_length} tokens; the prompt has "
        f"{size} bytes, so at least {-(-size // longest)} tokens (no token is "
        f"more than {longest} bytes), which leaves no room for a completion",
        param=param,
        code="context_length_exceeded",
    )


_longest_pieces: weakref.WeakKeyDictionary[Tokenizer, int] = weakref.WeakKeyDictionary()


def longest_piece_bytes(tokenizer: Tokenizer) -> int:
    """Bytes of the longest piece of ``tokenizer``'s vocabulary (at least 1).

    Computed once per tokenizer (262,144 pieces for Gemma 3: about 25 ms).
    """
    try:
        cached = _longest_pieces.get(tokenizer)
    except TypeError:  # no weak references to it: computed each time
        cached = None
    if cached is not None:
        return cached
    longest = max(max(map(len, tokenizer.pieces), default=1), 1)
    with contextlib.suppress(TypeError):
        _longest_pieces[tokenizer] = longest
    return longest
