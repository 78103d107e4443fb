"""An upstream's per-token logprobs in a chunk's choice, read as ``LogprobToken``s.

Two shapes, as OpenAI defines them and vLLM, SGLang and llama.cpp's server send
them:

::

    chat         choice.logprobs.content: [{token, logprob, bytes,
                 top_logprobs: [{token, logprob, bytes}]}]
    completions  choice.logprobs: {tokens, token_logprobs,
                 top_logprobs: [{token: logprob}], text_offset}

What comes back is checked like any peer's input: a token is a string, a
logprob a finite number, ``bytes`` a list of byte values (else the token's
UTF-8), at most ``max_tokens`` entries and ``MAX_TOP`` alternatives each; an
entry that is not so makes the whole chunk's logprobs ``None`` (its text still
goes on, without them). ``text_offset`` is left at 0: the server counts
offsets in its own text.

``TokenTexts`` (one per choice) matches the tokens to the choice's text by
their bytes, since the two do not line up chunk by chunk:

- a token that ends inside a character (byte-fallback pieces) comes in a
  chunk whose text is empty, or whose token string is not text at all (a
  replacement character, ``\\xNN`` escapes); the text of the character comes
  with the token that completes it;
- an upstream that repeats its text cumulatively may repeat its tokens too;
- an end-of-sequence or other special token has bytes the text never holds;
- an upstream that holds back text (its own stop-string holdback) sends
  tokens before their text.

Each token's text is what an incremental UTF-8 decoder makes of its bytes
(``""`` for one that ends inside a character, the whole character for the one
that completes it). ``feed`` takes a chunk's new text and tokens and returns
the text cut into ``TokenRun``s: pieces each carried by a token (``""`` pieces
go with the character after them), or text no token carries. A token whose
text the choice's text does not hold is dropped; one whose text the choice's
text has not reached yet waits for it; whatever waits when the choice ends is
dropped (as the local engine drops an end-of-sequence token).

Spec: OpenAI API reference, "The chat completion chunk object"
(``choices[].logprobs``) and "The completion object" (``logprobs``).
"""

from __future__ import annotations

import codecs
import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from sluicegate.core.logprobs import LogprobToken, TopLogprob

__all__ = ["MAX_TOP", "TokenRun", "TokenTexts", "read_logprobs"]

MAX_TOP = 20
"""Most alternatives per token kept (OpenAI's own ``top_logprobs`` bound)."""


def read_logprobs(
    logprobs: Any, chat: bool, max_tokens: int
) -> tuple[LogprobToken, ...] | None:
    """The tokens of one choice's ``logprobs`` object, or ``None`` when it has
    none or is not one of the two shapes (see the module docstring).

    Args:
        logprobs: the choice's ``logprobs`` value, as parsed.
        chat: the chat shape (``content``); else the completions shape.
        max_tokens: the most entries taken (the reader's per-chunk bound).
    """
    if type(logprobs) is not dict:
        return None
    try:
        if chat:
            return _chat(logprobs.get("content"), max_tokens)
        return _completion(logprobs, max_tokens)
    except (TypeError, ValueError):
        return None


def _chat(content: Any, max_tokens: int) -> tuple[LogprobToken, ...] | None:
    if type(content) is not list or len(content) > max_tokens:
        return None
    tokens = []
    for entry in content:
        token, data, value = _entry(entry)
        tops = entry.get("top_logprobs") or []
        if type(tops) is not list:
            raise TypeError("top_logprobs is not a list")
        top = tuple(TopLogprob(*_entry(alt)) for alt in tops[:MAX_TOP])
        tokens.append(LogprobToken(token, data, value, 0, top))
    return tuple(tokens)


def _completion(
    logprobs: dict[str, Any], max_tokens: int
) -> tuple[LogprobToken, ...] | None:
    texts, values = logprobs.get("tokens"), logprobs.get("token_logprobs")
    if type(texts) is not list or type(values) is not list:
        return None
    if len(texts) != len(values) or len(texts) > max_tokens:
        return None
    tops = logprobs.get("top_logprobs") or [None] * len(texts)
    if type(tops) is not list or len(tops) != len(texts):
        return None
    tokens = []
    for text, value, alternatives in zip(texts, values, tops, strict=True):
        token = _text(text)
        top: tuple[TopLogprob, ...] = ()
        if alternatives is not None:
            if type(alternatives) is not dict:
                raise TypeError("top_logprobs entry is not an object")
            top = tuple(
                TopLogprob(_text(t), t.encode(), _number(v))
                for t, v in list(alternatives.items())[:MAX_TOP]
            )
        tokens.append(LogprobToken(token, token.encode(), _number(value), 0, top))
    return tuple(tokens)


def _entry(entry: Any) -> tuple[str, bytes, float]:
    if type(entry) is not dict:
        raise TypeError("a logprob entry is not an object")
    token = _text(entry.get("token"))
    raw = entry.get("bytes")
    data = token.encode()
    if type(raw) is list and all(type(b) is int and 0 <= b < 256 for b in raw):
        data = bytes(raw)
    return token, data, _number(entry.get("logprob"))


def _text(value: Any) -> str:
    if type(value) is not str:
        raise TypeError("a token is not a string")
    return value


def _number(value: Any) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise ValueError("a logprob is not a finite number")
    return float(value)


@dataclass(frozen=True, slots=True)
class TokenRun:
    """A piece of a choice's new text and the tokens that carry it.

    Attributes:
        text: the text (chars; non-empty).
        tokens: the tokens, in order, or ``None`` for text no token carries.
        texts: each token's part of ``text`` (they join to it; ``""`` for a
            token that ends inside a character); ``None`` with ``tokens``.
    """

    text: str
    tokens: tuple[LogprobToken, ...] | None = None
    texts: tuple[str, ...] | None = None


class TokenTexts:
    """One choice's upstream tokens in, its text cut at their edges out (see
    the module docstring).

    Args:
        max_tokens: the most tokens held waiting for their text, and the most
            remembered to spot a cumulative repeat (a chunk holds no more:
            the reader's per-chunk bound); past it the oldest waiting token is
            dropped. So what is held stays bounded whatever the upstream sends.
    """

    __slots__ = ("_decoder", "_max_tokens", "_seen", "_taken", "_waiting")

    def __init__(self, max_tokens: int) -> None:
        self._max_tokens = max_tokens
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._seen: list[int] = []  # hashes of the bytes of the first tokens
        self._taken = 0  # tokens taken in all
        # (text, token): tokens whose text has not come yet; a token of None
        # is the rest of a token whose text came in part
        self._waiting: deque[tuple[str, LogprobToken | None]] = deque(maxlen=max_tokens)

    def read(self, raw: Any, chat: bool, new: str, text: Any) -> list[TokenRun]:
        """``feed`` of one chunk's choice as the reader has it.

        Args:
            raw: the choice's ``logprobs`` value (``read_logprobs`` reads it).
            chat: the chat shape, else the completions shape.
            new: what is new of the choice's text in this chunk.
            text: the chunk's text as sent (its tokens may repeat every
                token so far when it is not all new).
        """
        tokens = None if raw is None else read_logprobs(raw, chat, self._max_tokens)
        return self.feed(new, tokens, type(text) is str and new != text)

    def feed(
        self, text: str, tokens: tuple[LogprobToken, ...] | None, repeated: bool
    ) -> list[TokenRun]:
        """Take a chunk's new ``text`` and its ``tokens``; the text in runs.

        Args:
            text: the choice's new text from this chunk (may be empty).
            tokens: the chunk's tokens as ``read_logprobs`` read them, or
                ``None``.
            repeated: the chunk's text was not all new (a cumulative
                upstream): its tokens may repeat every token so far.

        Returns:
            Runs whose texts join to ``text`` (``[]`` for an empty text).
        """
        if tokens:
            if repeated and 0 < self._taken < len(tokens) and self._repeats(tokens):
                tokens = tokens[self._taken :]
            for token in tokens:
                self._taken += 1
                if len(self._seen) < self._max_tokens:
                    self._seen.append(hash(token.token_bytes))
                piece = self._decoder.decode(token.token_bytes)
                self._waiting.append((piece, token))
        return self._cut(text) if text else []

    def _repeats(self, tokens: tuple[LogprobToken, ...]) -> bool:
        """Whether ``tokens`` begin with every token taken so far."""
        if self._taken > len(self._seen):
            return False  # more than a chunk holds: no chunk repeats them all
        return all(
            hash(t.token_bytes) == h for t, h in zip(tokens, self._seen, strict=False)
        )

    def _cut(self, text: str) -> list[TokenRun]:
        pieces: list[tuple[str, LogprobToken | None]] = []
        at, size, waiting = 0, len(text), self._waiting
        while at < size and waiting:
            piece, token = waiting[0]
            if not piece and token is not None:
                pieces.append(waiting.popleft())  # goes with the next character
            elif text.startswith(piece, at):
                pieces.append(waiting.popleft())
                at += len(piece)
            elif piece.startswith(text[at:]):  # the text ends inside this token's
                pieces.append((text[at:], token))
                waiting[0] = (piece[size - at :], None)
                at = size
            else:  # a text the choice's text does not hold (a special token)
                waiting.popleft()
        if at < size:
            pieces.append((text[at:], None))
        return _runs(pieces)


def _runs(pieces: list[tuple[str, LogprobToken | None]]) -> list[TokenRun]:
    """Consecutive pieces with tokens as one run, those without as another;
    tokens with no text at the end of a run are dropped (nothing follows)."""
    runs: list[TokenRun] = []
    carried: list[tuple[str, LogprobToken]] = []

    def close() -> None:
        while carried and not carried[-1][0]:
            carried.pop()  # its character came with no token: nothing to carry
        if carried:
            texts = tuple(p for p, _ in carried)
            runs.append(TokenRun("".join(texts), tuple(t for _, t in carried), texts))
            carried.clear()

    for piece, token in pieces:
        if token is not None:
            carried.append((piece, token))
            continue
        close()
        if runs and runs[-1].tokens is None:
            runs[-1] = TokenRun(runs[-1].text + piece)
        else:
            runs.append(TokenRun(piece))
    close()
    return runs
