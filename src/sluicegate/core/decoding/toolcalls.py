"""A model's text in, content text and tool-call fragments out (sans-IO).

``ToolCallParser`` reads one choice's text piece by piece, as the detokenizer
releases it, and splits it into content text and the tool calls written in the
block format of ``docs/tools.md``::

    <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>

Each call comes out as ``ToolCallFragment``s of one index: first its start
(``id``, ``name`` and ``arguments == ""``), then pieces of its arguments: the JSON
text of the ``"arguments"`` value exactly as the model wrote it, whitespace kept.

Invariants (property-tested):

- Whatever the split of the text into ``feed`` calls, the parts joined (content
  concatenated; fragments joined per index) equal those of one ``feed`` of the
  whole text: so a streamed response and a non-streamed one say the same.
- Markup never reaches the content of a well-formed turn: a possible start of
  ``<tool_call>`` at the end of a piece is held back until the next text rules it
  in or out, and the whitespace between blocks, or before the first block at the
  start of the turn, is dropped.
- A call ends where its arguments' JSON value closes (the parser tracks JSON
  strings and escapes), so a ``</tool_call>`` inside a JSON string never ends
  it; a ``</tool_call>`` outside a string always ends the block.
- Indexes count from 0 in order; each call's ``id`` and ``name`` come exactly
  once, on its first fragment; the server makes the ids (``new_call_id``).

Deliberate choices where the text breaks the format (the grammar that
constrains the model rules these out; without it a small model writes them):

- A block whose head is not ``{"name": <a requested tool>, "arguments": {`` is
  content, ``<tool_call>`` included: the parser never makes a call the request
  did not offer. A head still unfinished when the text ends is dropped.
- After the arguments, anything but ``}`` and whitespace up to ``</tool_call>``
  is dropped; a ``<tool_call>`` there (outside a string) also ends the block.
- Text after a block is content unless it is only whitespace.
- Past ``max_calls`` calls, the rest of the text is dropped.

Costs: a piece of content without ``<`` is returned as it is after one ``in``
test; a piece of arguments costs one regex search per JSON string or bracket in
it. A block's head is held (at most ``MAX_HEAD_CHARS``) until it is complete.

Spec: docs/tools.md; OpenAI API reference, "The chat completion chunk object",
``choices[].delta.tool_calls``.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Iterable
from enum import Enum

import orjson

from sluicegate.core.errors import LocalProtocolError
from sluicegate.core.events import ToolCallFragment

__all__ = [
    "CLOSE_TAG",
    "MAX_HEAD_CHARS",
    "OPEN_TAG",
    "Part",
    "ToolCallParser",
    "new_call_id",
]

OPEN_TAG = "<tool_call>"
"""What starts a tool-call block (and triggers a lazy grammar)."""
CLOSE_TAG = "</tool_call>"
"""What ends a tool-call block."""

MAX_HEAD_CHARS = 1024
"""Most characters held between ``<tool_call>`` and the arguments' ``{``; a
longer head is not a call (it is content)."""

Part = str | ToolCallFragment
"""One piece of parsed text: content text, or a fragment of a tool call."""


def new_call_id() -> str:
    """A fresh tool-call id: ``call_`` and 24 hex digits."""
    return f"call_{secrets.token_hex(12)}"


class _State(Enum):
    TEXT = "text"  # content, looking for <tool_call>
    AFTER = "after"  # after a block: whitespace is held, then content or a block
    HEAD = "head"  # after <tool_call>, before the arguments' "{"
    ARGUMENTS = "arguments"  # inside the arguments value (emitted)
    TAIL = "tail"  # after the arguments, up to </tool_call> (dropped)
    DONE = "done"  # max_calls reached: the rest is dropped
    CLOSED = "closed"  # flushed


_WS = " \t\n\r"
_OUTSIDE = re.compile(r'["{}\[\]<]')  # what matters outside a JSON string
_INSIDE = re.compile(r'["\\]')  # what matters inside one
_STRING = re.compile(r'"(?:[^"\\\x00-\x1f]|\\.)*"', re.DOTALL)
_STRING_START = re.compile(r'"(?:[^"\\\x00-\x1f]|\\.)*\\?', re.DOTALL)
_MORE = "more"  # the head is incomplete (a prefix of a valid head)
_BAD = "bad"  # it cannot become a valid head
_OK = "ok"  # a whole head


class ToolCallParser:
    """One choice's text in, content text and tool-call fragments out.

    Args:
        tool_names: the functions the request offers; a block naming another
            is content.
        max_calls: the most calls to make (1 when parallel calls are off), or
            ``None`` for no limit; text after the last allowed call is dropped.
        calls_only: the turn may hold calls only (``tool_choice`` ``required``
            or a named function, under a grammar that writes nothing else): text
            held at the end, such as a block's opening cut short by
            ``max_tokens``, is markup and is dropped, never sent as content.
        new_id: makes each call's id (``new_call_id`` by default).

    Attributes:
        calls: calls started so far (their start fragments were returned).
        completed: calls whose arguments' JSON value closed.
    """

    __slots__ = (
        "_calls_only",
        "_depth",
        "_escape",
        "_held",
        "_in_string",
        "_max_calls",
        "_names",
        "_new_id",
        "_started",
        "_state",
        "calls",
        "completed",
    )

    def __init__(
        self,
        tool_names: Iterable[str],
        *,
        max_calls: int | None = None,
        calls_only: bool = False,
        new_id: Callable[[], str] = new_call_id,
    ) -> None:
        self._names = frozenset(tool_names)
        self._max_calls = max_calls
        self._calls_only = calls_only
        self._new_id = new_id
        self._state = _State.TEXT
        self._held = ""  # text not decided yet, to be read again with the next
        self._started = False  # content or a call went out: whitespace counts
        self._depth = 0  # open JSON brackets in the arguments
        self._in_string = False
        self._escape = False  # a backslash ended the last piece, inside a string
        self.calls = 0
        self.completed = 0

    @property
    def open_call(self) -> bool:
        """Whether a call has started whose arguments have not closed."""
        return self.calls > self.completed

    def feed(self, text: str) -> list[Part]:
        """Take the next piece of the choice's text.

        Args:
            text: any piece (``""`` included), split anywhere.

        Returns:
            The parts now decided, in order: content strings (consecutive ones
            joined) and ``ToolCallFragment``s (a call's start always alone, with
            ``arguments == ""``; its argument pieces of one feed joined).

        Raises:
            LocalProtocolError: after ``flush()``.
        """
        state = self._state
        if state is _State.TEXT and not self._held and self._started:
            if "<" not in text:
                return [text] if text else []  # the per-token path of content
        elif state is _State.ARGUMENTS and self._in_string and not self._escape:
            if '"' not in text and "\\" not in text:  # inside a JSON string
                return (
                    [ToolCallFragment(self.calls - 1, None, None, text)] if text else []
                )
        elif state is _State.CLOSED:
            raise LocalProtocolError("ToolCallParser.feed() after flush()")
        out: list[Part] = []
        self._run(self._held + text, out)
        return out

    def flush(self) -> list[Part]:
        """End of the choice's text: what was held, decided. Ends the object.

        Returns:
            Content that was held (a possible ``<tool_call>`` prefix, or
            whitespace at the start of a turn without calls); nothing for an
            unfinished block head, for whitespace after a block, inside a call,
            or with ``calls_only``.

        Raises:
            LocalProtocolError: called twice.
        """
        state, held = self._state, self._held
        if state is _State.CLOSED:
            raise LocalProtocolError("ToolCallParser.flush() called twice")
        self._state, self._held = _State.CLOSED, ""
        if self._calls_only:
            return []
        keep = state is _State.TEXT or (state is _State.AFTER and held.strip(_WS))
        return [held] if keep and held else []

    # The states' readers: each takes ``buf`` from ``i``, appends to ``out``,
    # and returns where the next state reads on, or -1 when ``buf`` is used up
    # (with ``_held`` set to what must be read again).

    def _run(self, buf: str, out: list[Part]) -> None:
        self._held = ""
        i = 0
        while i >= 0:
            state = self._state
            if state is _State.TEXT:
                i = self._text(buf, i, out)
            elif state is _State.AFTER:
                i = self._after(buf, i)
            elif state is _State.HEAD:
                i = self._head(buf, i, out)
            elif state is _State.DONE:
                return
            else:
                i = self._json(buf, i, out)

    def _text(self, buf: str, i: int, out: list[Part]) -> int:
        at = buf.find(OPEN_TAG, i)
        if at >= 0:
            self._content(buf[i:at], out, before_call=True)
            self._state = _State.HEAD
            return at + len(OPEN_TAG)
        # Only the last "<" can start a held prefix: the tag has one "<".
        cut = buf.rfind("<", max(i, len(buf) - len(OPEN_TAG) + 1))
        if cut < 0 or not OPEN_TAG.startswith(buf[cut:]):
            cut = len(buf)
        self._content(buf[i:cut], out, before_call=False)
        self._held += buf[cut:]
        return -1

    def _content(self, text: str, out: list[Part], *, before_call: bool) -> None:
        if not self._started:
            if not text.strip(_WS):
                # Whitespace at the start of the turn: dropped before a call,
                # held otherwise (content if nothing else ever comes).
                if not before_call:
                    self._held = text
                return
            self._started = True
        if not text:
            return
        if out and isinstance(out[-1], str):
            out[-1] += text
        else:
            out.append(text)

    def _after(self, buf: str, i: int) -> int:
        j = i
        while j < len(buf) and buf[j] in _WS:
            j += 1
        if buf.startswith(OPEN_TAG, j):
            self._state = _State.HEAD  # the whitespace between blocks drops
            return j + len(OPEN_TAG)
        if j == len(buf) or OPEN_TAG.startswith(buf[j:]):
            self._held = buf[i:]  # whitespace, maybe a tag's start: undecided
            return -1
        self._state = _State.TEXT  # content after a block, whitespace and all
        self._started = True
        return i

    def _head(self, buf: str, i: int, out: list[Part]) -> int:
        verdict, name, end = _read_head(buf, i)
        if verdict is _MORE and len(buf) - i <= MAX_HEAD_CHARS:
            self._held = buf[i:]
            return -1
        if verdict is _OK and end - i <= MAX_HEAD_CHARS and name in self._names:
            out.append(ToolCallFragment(self.calls, self._new_id(), name, ""))
            self.calls += 1
            self._started = True
            self._state = _State.ARGUMENTS
            self._depth, self._in_string, self._escape = 0, False, False
            return end
        # Not a call: the tag is content, and what followed is read as text.
        self._state = _State.TEXT
        self._content(OPEN_TAG, out, before_call=False)
        return i

    def _json(self, buf: str, i: int, out: list[Part]) -> int:
        """Arguments (emitted) or the block's tail (dropped): JSON-aware up to
        where the value closes, ``</tool_call>`` or another ``<tool_call>``."""
        emit = self._state is _State.ARGUMENTS
        start, n = i, len(buf)
        if self._escape and i < n:
            self._escape = False
            i += 1
        next_i = -1
        while i < n:
            if self._in_string:
                m = _INSIDE.search(buf, i)
                if m is None:
                    i = n
                    break
                j = m.start()
                if buf[j] == "\\":
                    if j + 1 == n:
                        self._escape = True
                        i = n
                        break
                    i = j + 2
                else:
                    self._in_string = False
                    i = j + 1
                continue
            m = _OUTSIDE.search(buf, i)
            if m is None:
                i = n
                break
            j = m.start()
            c = buf[j]
            i = j + 1
            if c == '"':
                self._in_string = True
            elif c == "{" or c == "[":
                self._depth += 1
            elif c == "}" or c == "]":
                self._depth -= 1
                if emit and self._depth == 0:
                    self.completed += 1
                    self._emit_arguments(buf[start:i], out)
                    self._state = _State.TAIL
                    return i
            elif buf.startswith(CLOSE_TAG, j):
                next_i = self._end_block(_State.AFTER, j + len(CLOSE_TAG))
                i = j
                break
            elif buf.startswith(OPEN_TAG, j):
                next_i = self._end_block(_State.HEAD, j + len(OPEN_TAG))
                i = j
                break
            elif CLOSE_TAG.startswith(buf[j:]) or OPEN_TAG.startswith(buf[j:]):
                self._held = buf[j:]  # a tag may be starting: read it again
                i = j
                break
        if emit:
            self._emit_arguments(buf[start:i], out)
        return next_i

    def _emit_arguments(self, text: str, out: list[Part]) -> None:
        if text:
            out.append(ToolCallFragment(self.calls - 1, arguments=text))

    def _end_block(self, state: _State, at: int) -> int:
        self._in_string = self._escape = False
        limit = self._max_calls
        self._state = (
            _State.DONE if limit is not None and self.calls >= limit else state
        )
        return at


def _read_head(buf: str, i: int) -> tuple[str, str | None, int]:
    """``buf[i:]`` read as ``{"name": "<name>", "arguments": {``.

    Returns ``(_MORE, None, 0)`` for an incomplete head, ``(_BAD, None, 0)`` for
    one that cannot be completed, else ``(_OK, name, index of the "{")``.
    """
    n = len(buf)
    name: str | None = None
    for expected in ("{", '"name"', ":", None, ",", '"arguments"', ":", "{"):
        while i < n and buf[i] in _WS:
            i += 1
        if i == n:
            return _MORE, None, 0
        if expected is None:  # the name: one JSON string
            m = _STRING.match(buf, i)
            if m is None:
                partial = _STRING_START.match(buf, i)
                if partial is not None and partial.end() == n:
                    return _MORE, None, 0
                return _BAD, None, 0
            name = orjson.loads(m.group())
            i = m.end()
            continue
        piece = buf[i : i + len(expected)]
        if not expected.startswith(piece):
            return _BAD, None, 0
        if len(piece) < len(expected):
            return _MORE, None, 0
        i += len(expected)
    return _OK, name, i - 1
