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

Spec: OpenAI API reference, "The chat completion chunk object"
(``choices[].logprobs``) and "The completion object" (``logprobs``).
"""

from __future__ import annotations

import math
from typing import Any

from sluicegate.core.logprobs import LogprobToken, TopLogprob

__all__ = ["MAX_TOP", "read_logprobs"]

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
