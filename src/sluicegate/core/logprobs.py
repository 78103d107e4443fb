"""Token logprobs aligned with the text of each delta, and their wire shapes.

A delta's text and the tokens behind it do not line up by themselves: a token may
end inside a character (byte-fallback pieces), and the stop matcher may hold back
the end of a token's text. ``LogprobAligner`` takes, per token, the text released
so far and where that token's text ends, and gives back deltas cut at token
boundaries, each with the tokens whose text it holds. So the ``bytes`` of a
delta's tokens join to that delta's content, and their ``token`` strings do too
whenever no token splits a character.

``chat_logprobs`` and ``completion_logprobs`` build the two OpenAI shapes from
``LogprobToken`` values (``describe_token`` gives a token's text and bytes,
``describe_logprob`` an engine's ``TokenLogprob`` as a ``LogprobToken``).

Invariants (tested):

- The concatenated text of everything ``feed`` and ``flush`` return equals the
  concatenated text given to them: alignment delays text, it never drops it.
- Every token is returned once, in order, with a ``start`` (chars) that does not
  decrease; only tokens that start at or after the end of all text are dropped at
  ``flush`` (an end-of-sequence token, or tokens inside a cut stop string).

Deliberate divergence: when a stop string cuts a token in two, the token is
reported whole, so its text runs past the delta's content.

Spec: OpenAI API reference, "The chat completion object" (``logprobs.content``:
``token``, ``logprob``, ``bytes``, ``top_logprobs``) and "The completion object"
(``logprobs``: ``tokens``, ``token_logprobs``, ``top_logprobs``,
``text_offset``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sluicegate.core.errors import LocalProtocolError

__all__ = [
    "AlignedStep",
    "LogprobAligner",
    "LogprobToken",
    "TokenLogprob",
    "TopLogprob",
    "chat_logprobs",
    "completion_logprobs",
    "describe_logprob",
    "describe_token",
]

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """The log probability of one sampled token and its top alternatives.

    Attributes:
        token_id: the sampled token.
        logprob: natural log of its probability under the model (raw logits,
            before temperature and other sampling transforms).
        top: up to k ``(token_id, logprob)`` pairs, most likely first.
        skip_bytes: leading bytes of the token's piece that are not reported
            (> 0 only for the token that ended the reasoning and began the
            answer: its reasoning and end-marker bytes; docs/DESIGN.md,
            "Reasoning").
    """

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    skip_bytes: int = 0


@dataclass(frozen=True, slots=True)
class TopLogprob:
    """One alternative for a token position: its text, bytes and logprob."""

    token: str
    token_bytes: bytes
    logprob: float


@dataclass(frozen=True, slots=True)
class LogprobToken:
    """A sampled token as reported to the client.

    Attributes:
        token: the token's text (bytes that are not whole UTF-8 characters are
            written as ``\\xNN`` escapes).
        token_bytes: the token's raw bytes.
        logprob: natural log of its probability.
        text_offset: where its text starts in the choice's text (chars, echoed
            prompt included).
        top: the most likely alternatives, most likely first.
    """

    token: str
    token_bytes: bytes
    logprob: float
    text_offset: int
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class AlignedStep(Generic[_T]):
    """Text to send now and the tokens whose text it holds.

    Attributes:
        text: the text (may be empty: then ``tokens`` is empty too, unless it is
            the last step of a choice whose text ended before these tokens).
        tokens: ``(token, start)`` pairs, ``start`` in chars from the first text
            given to the aligner.
    """

    text: str
    tokens: tuple[tuple[_T, int], ...] = ()


class LogprobAligner(Generic[_T]):
    """Released text and per-token text ends in; deltas cut at token ends out.

    Each ``feed`` takes the text newly released for the client and one token with
    the offset (chars) where that token's text ends in the choice's full text (the
    text released so far plus what a stop matcher holds back), or ``None`` while
    that text is incomplete. Ends never decrease, and the released text never
    runs past the last end.
    """

    __slots__ = ("_closed", "_last_end", "_pending", "_sent_chars", "_text")

    def __init__(self) -> None:
        self._text = ""  # released, not yet returned
        self._sent_chars = 0
        self._pending: list[tuple[_T, int, int | None]] = []  # token, start, end
        self._last_end = 0
        self._closed = False

    def feed(self, text: str, token: _T, end: int | None) -> AlignedStep[_T]:
        """Take ``text`` and ``token``; return what ends at a token boundary.

        Args:
            text: newly released text (may be empty).
            token: the token just decoded.
            end: where the token's text ends in the full text (chars, >= the
                previous end), or ``None`` when its text is not complete yet (it
                ends inside a character, or it completed a stop string): the
                token then goes out with a later one, or at ``flush``.

        Returns:
            The released text up to the end of the last token it covers whole,
            with the tokens up to that one; ``AlignedStep("")`` when no token is
            covered whole yet, or when the covered tokens add no text (control
            tokens wait for the next text, or are dropped at ``flush``).

        Raises:
            LocalProtocolError: after ``flush()``, or ``end`` smaller than the
                previous one.
        """
        if self._closed:
            raise LocalProtocolError("LogprobAligner.feed() after flush()")
        start = self._last_end
        if end is not None:
            if end < start:
                raise LocalProtocolError(
                    f"token ends must not decrease; got {end!r} after {start!r}"
                )
            self._last_end = end
        self._text += text
        self._pending.append((token, start, end))
        available = self._sent_chars + len(self._text)
        for cut in range(len(self._pending), 0, -1):
            cut_end = self._pending[cut - 1][2]
            # Never a step without text: a token that adds none (a control
            # token) waits for the next text, or is dropped at the end.
            if cut_end is not None and self._sent_chars < cut_end <= available:
                return self._take(cut, cut_end)
        return AlignedStep("")

    def flush(self, text: str = "") -> AlignedStep[_T]:
        """The last text, with every pending token that starts before its end.

        Tokens that start at or after the end of all text (an end-of-sequence
        token, tokens inside a stop string that was cut) are dropped.

        Raises:
            LocalProtocolError: called twice.
        """
        if self._closed:
            raise LocalProtocolError("LogprobAligner.flush() called twice")
        self._closed = True
        self._text += text
        total = self._sent_chars + len(self._text)
        kept = sum(1 for _, start, _ in self._pending if start < total)
        return self._take(kept, total)

    def _take(self, count: int, cut: int) -> AlignedStep[_T]:
        size = cut - self._sent_chars
        text, self._text = self._text[:size], self._text[size:]
        tokens = tuple((token, start) for token, start, _ in self._pending[:count])
        del self._pending[:count]
        self._sent_chars = cut
        return AlignedStep(text, tokens)


def describe_token(pieces: Sequence[bytes], token_id: int) -> tuple[str, bytes]:
    """``(text, bytes)`` of ``token_id``: its piece, decoded with ``\\xNN`` escapes.

    Raises:
        IndexError: ``token_id`` outside ``pieces``.
    """
    data = pieces[token_id]
    return data.decode("utf-8", errors="backslashreplace"), data


def describe_logprob(
    pieces: Sequence[bytes], logprob: TokenLogprob, text_offset: int
) -> LogprobToken:
    """An engine's ``TokenLogprob`` as wire values: text, bytes, logprob, offset
    (``text_offset``, chars) and the alternatives, each described by
    ``describe_token`` (the token's own text and bytes without its
    ``skip_bytes``).

    Raises:
        IndexError: a token id outside ``pieces``.
    """
    token, data = describe_token(pieces, logprob.token_id)
    if logprob.skip_bytes:
        data = data[logprob.skip_bytes :]
        token = data.decode("utf-8", errors="backslashreplace")
    top = tuple(
        TopLogprob(*describe_token(pieces, token_id), value)
        for token_id, value in logprob.top
    )
    return LogprobToken(token, data, logprob.logprob, text_offset, top)


def chat_logprobs(tokens: Sequence[LogprobToken]) -> dict[str, Any]:
    """A chat choice's ``logprobs``: ``{"content": [...], "refusal": None}``.

    Each entry is ``{"token", "logprob", "bytes": [ints], "top_logprobs":
    [{"token", "logprob", "bytes"}]}``.

    Spec: OpenAI API reference, "The chat completion object", ``logprobs``.
    """
    return {
        "content": [
            {
                "token": t.token,
                "logprob": t.logprob,
                "bytes": list(t.token_bytes),
                "top_logprobs": [
                    {
                        "token": a.token,
                        "logprob": a.logprob,
                        "bytes": list(a.token_bytes),
                    }
                    for a in t.top
                ],
            }
            for t in tokens
        ],
        "refusal": None,
    }


def completion_logprobs(tokens: Sequence[LogprobToken]) -> dict[str, Any]:
    """A completions choice's ``logprobs``: four parallel lists.

    ``top_logprobs`` maps token text to logprob: the alternatives, plus the
    sampled token (so up to k + 1 entries, as the reference API says).

    Spec: OpenAI API reference, "The completion object", ``logprobs``.
    """
    tops: list[dict[str, float]] = []
    for t in tokens:
        top = {a.token: a.logprob for a in t.top}
        top.setdefault(t.token, t.logprob)
        tops.append(top)
    return {
        "tokens": [t.token for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": tops,
        "text_offset": [t.text_offset for t in tokens],
    }
