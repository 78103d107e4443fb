"""The upstream reader's fast path: plain events found, plain deltas read from bytes.

Almost every event an OpenAI-compatible upstream streams is one ``data:`` line
holding one choice's next piece of text, and nothing else that the reader acts
on (no finish, logprobs, tool calls or reasoning; at most a usage object, which
vLLM and sluicegate send on every chunk when asked). Two fast twins of the
reader's general path (``UpstreamReader``: ``SSEDecoder``, a full JSON parse,
the walk through the chunk) take those:

- ``plain_event`` finds such a line in the bytes without decoding text or
  building an ``Event``;
- ``DeltaTemplate`` is learned from one such event, fully parsed: every byte of
  it but its text's. A later event that is the same bytes around a different
  text (and, as OpenAI and sluicegate pad their events, a different
  ``obfuscation`` value last) is the same chunk with that text, so only the
  text's JSON string is parsed. A usage object after the choices is a second
  hole: parsed alone, and read as the full path reads it (before the text).

Why a match is exact: learning checks that the chunk's text is the only thing
the reader would act on, then finds the text's JSON string by position and
proves it by parsing the event again with another string there, and another
object where its usage is (it must give the same chunk with those two values:
no other value moved). A later line is
``head + body + tail`` with the learned ``head`` and ``tail``, and ``body`` a
whole JSON string's inside (``orjson`` parses ``"body"``: no unescaped quote,
valid escapes and UTF-8), so it is the learned chunk with that string as its
text (the usage's hole likewise: the text's end is the first place after the
head where the learned bytes between text and usage follow, since an earlier
one would leave the text ending in a backslash, which fails its parse). The
pad taken as varying is the object's last member, a string of
``[A-Za-z0-9_-]`` (no quote or escape can hide in it), which the reader never
reads.

Spec: WHATWG HTML, "9.2.6 Interpreting an event stream"; OpenAI API reference,
"The chat completion chunk object" (``obfuscation``).
"""

from __future__ import annotations

from typing import Any

import orjson

from sluicegate.core.upstream.limits import ReaderLimits
from sluicegate.core.wire.chunks import Endpoint

__all__ = ["MAX_LEARNS", "DeltaTemplate", "plain_event"]

MAX_LEARNS = 16
"""How many templates one reader learns at most: an upstream whose every event
differs in more than its text (a new id per chunk) stops paying for learning."""

_PAD_KEY = b',"obfuscation":"'
_USAGE_KEY = b'"usage":'
_PAD_CHARS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
_TEXT_KEYS = {Endpoint.CHAT: b'"content":"', Endpoint.COMPLETION: b'"text":"'}


def plain_event(data: bytes, start: int, limits: ReaderLimits) -> tuple[bytes, int]:
    """The data of the plain event at ``data[start:]`` and where the next begins.

    A plain event is one ``data: `` line (LF, no CR) and a blank line, within
    the line and event bounds of ``limits``.

    Returns:
        ``(line, next_start)``, or ``(b"", start)`` when what is at ``start``
        is not a whole plain event (incomplete, another field, a comment, a
        CR, past a bound): the general decoder takes it from there.
    """
    end = data.find(b"\n\n", start)
    if end < 0 or not data.startswith(b"data: ", start):
        return b"", start
    if end - start > limits.max_line_bytes or end - start - 6 > limits.max_event_bytes:
        return b"", start  # the decoder says which bound it passes
    line = data[start + 6 : end]
    if not line or b"\n" in line or b"\r" in line:
        return b"", start
    return line, end + 2


class DeltaTemplate:
    """The bytes of one upstream's plain delta events around their text.

    Learned with ``learn``; ``text(line)`` reads a later event.
    """

    __slots__ = ("_between", "_head", "_padded", "_tail")

    def __init__(
        self, head: bytes, tail: bytes, padded: bool, between: bytes = b""
    ) -> None:
        self._head = head
        self._tail = tail
        self._padded = padded
        self._between = between  # from the text's end to its usage, if any

    @classmethod
    def learn(
        cls, line: bytes, chunk: dict[str, Any], endpoint: Endpoint
    ) -> DeltaTemplate | None:
        """The template of ``line`` when it is a plain delta, else ``None``.

        Args:
            line: an event's data.
            chunk: ``line`` parsed.
            endpoint: chat (``delta.content``) or completions (``text``).
        """
        text = _plain_text(chunk, endpoint)
        if text is None:
            return None
        key = _TEXT_KEYS[endpoint]
        at = line.find(key)
        if at < 0 or line.find(key, at + 1) >= 0:
            return None
        start = at + len(key)
        end = _string_end(line, start)
        padded = False
        tail_end = len(line)
        pad_at = line.rfind(_PAD_KEY)
        if pad_at > end and line.endswith(b'"}'):
            padded = _clean(line[pad_at + len(_PAD_KEY) : -2])
            tail_end = pad_at if padded else tail_end
        other = "\x00a" if text != "\x00a" else "\x00b"
        expected = _with_text(chunk, endpoint, other)
        usage_at = usage_end = end
        if chunk.get("usage") is not None:
            usage_at = line.find(_USAGE_KEY, end) + len(_USAGE_KEY)
            usage_end = _object_end(line, usage_at)
            if usage_at < len(_USAGE_KEY) or line.find(_USAGE_KEY, usage_at) >= 0:
                return None
            expected["usage"] = {"\x00probe": 1}
        probe_line = line[:start] + orjson.dumps(other)[1:-1] + line[end:usage_at]
        if usage_at != end:
            probe_line += orjson.dumps(expected["usage"])
        try:
            probe = orjson.loads(probe_line + line[usage_end:])
        except orjson.JSONDecodeError:
            return None
        if probe != expected:
            return None
        between = line[end:usage_at]
        return cls(line[:start], line[usage_end:tail_end], padded, between)

    def text(self, line: bytes) -> str | None:
        """The text of ``line`` if it is this template's event (and has no
        usage), else ``None``."""
        read = self.read(line)
        if read is None or read[1] is not None:
            return None
        return read[0]

    def read(self, line: bytes) -> tuple[str, dict[str, Any] | None] | None:
        """``(text, usage)`` of ``line`` if it is this template's event, else
        ``None``; ``usage`` is the chunk's usage object when the template has
        one (``None`` when it has not)."""
        head = self._head
        if not line.startswith(head):
            return None
        tail = self._tail
        stop = len(line)
        if self._padded:
            stop = line.rfind(_PAD_KEY)
            if stop < 0 or not line.endswith(b'"}'):
                return None
            if not _clean(line[stop + len(_PAD_KEY) : -2]):
                return None
        end = stop - len(tail)
        if end < len(head) or line[end:stop] != tail:
            return None
        usage: dict[str, Any] | None = None
        between = self._between
        if between:
            # The first occurrence after the head is the text's end: one
            # inside the text leaves it ending in a backslash, which fails.
            usage_at = line.find(between, len(head), end)
            if usage_at < 0:
                return None
            try:
                usage = orjson.loads(line[usage_at + len(between) : end])
            except orjson.JSONDecodeError:
                return None
            if type(usage) is not dict:
                return None
            end = usage_at
        try:
            text: str = orjson.loads(b'"' + line[len(head) : end] + b'"')
        except orjson.JSONDecodeError:
            return None
        return text, usage


def _plain_text(chunk: dict[str, Any], endpoint: Endpoint) -> str | None:
    """The text of a chunk that carries one choice's text and nothing else the
    reader acts on (``UpstreamReader._object``), else ``None``."""
    if chunk.get("error") is not None or chunk.get("object") == "error":
        return None
    choices = chunk.get("choices")
    usage = chunk.get("usage")
    if (usage is not None and type(usage) is not dict) or type(choices) is not list:
        return None
    if len(choices) != 1 or type(choice := choices[0]) is not dict:
        return None
    index = choice.get("index", 0)
    if type(index) is int and index > 0:
        return None
    reason = choice.get("finish_reason")
    if choice.get("logprobs") is not None or (type(reason) is str and reason):
        return None
    if endpoint is Endpoint.COMPLETION:
        text = choice.get("text")
        return text if type(text) is str else None
    delta = choice.get("delta")
    if type(delta) is not dict or delta.get("tool_calls"):
        return None
    for name in ("reasoning_content", "reasoning"):
        value = delta.get(name)
        if type(value) is str and value:
            return None
    text = delta.get("content")
    return text if type(text) is str else None


def _with_text(chunk: dict[str, Any], endpoint: Endpoint, text: str) -> dict[str, Any]:
    """A copy of a plain chunk (``_plain_text``) with ``text`` as its text."""
    choice = chunk["choices"][0]
    if endpoint is Endpoint.COMPLETION:
        choice = {**choice, "text": text}
    else:
        choice = {**choice, "delta": {**choice["delta"], "content": text}}
    return {**chunk, "choices": [choice]}


def _string_end(line: bytes, start: int) -> int:
    """Where the JSON string whose inside begins at ``start`` ends (its closing
    quote); ``len(line)`` when it does not."""
    at = start
    while (at := line.find(b'"', at)) >= 0:
        backslashes = 0
        while line[at - 1 - backslashes] == 0x5C:  # "\\"
            backslashes += 1
        if not backslashes % 2:
            return at
        at += 1
    return len(line)


def _object_end(line: bytes, start: int) -> int:
    """Where the JSON object at ``start`` ends (just past its ``}``);
    ``start`` when none starts there, ``len(line)`` when it does not end."""
    if line[start : start + 1] != b"{":
        return start
    depth = 0
    quoted = escaped = False
    for at in range(start, len(line)):
        byte = line[at]
        if quoted:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # "\\"
                escaped = True
            elif byte == 0x22:  # '"'
                quoted = False
        elif byte == 0x22:
            quoted = True
        elif byte == 0x7B:  # "{"
            depth += 1
        elif byte == 0x7D:  # "}"
            depth -= 1
            if not depth:
                return at + 1
    return len(line)


def _clean(pad: bytes) -> bool:
    """Whether ``pad`` is a string inside that needs no escape and hides none."""
    return not pad.translate(None, _PAD_CHARS)
