"""An upstream's ``delta.tool_calls`` in, the server's own tool-call fragments out.

``ToolCallNormalizer`` reads the ``tool_calls`` list of each chat chunk of one
upstream choice (the JSON values as they came) and returns ``ToolCallFragment``s
in the shape the local engine's calls have (``core/decoding/toolcalls.py``), so that a
client sees the same stream whatever engine answered:

- the first fragment of a call carries its ``index``, ``id`` and ``name``, with
  ``arguments == ""``; every later one only more of its ``arguments``;
- indexes count from 0 in the order the calls begin; each ``id`` and ``name``
  comes exactly once.

Quirks absorbed (upstreams differ here more than anywhere else):

- ``id``, ``type`` and ``function.name`` repeated on every chunk of a call: a
  name that comes with the call's id again, or with arguments, and starts with
  the name so far replaces it (a repeat, or a name sent cumulatively); once a
  call's start is out, later names and ids are dropped;
- the name in pieces (entries with a name and neither the id again nor
  arguments): a call's start is held until its arguments begin, another call
  begins, or the choice ends (``flush()``), so the name is whole;
- no ``id``: one is made (``new_id``); an ``id`` of ``""`` counts as none;
- an ``id`` another call of the response has already (upstreams that number
  every call ``call_0``, or repeat one): the later call gets a made one, on
  its start fragment (the only one that carries an id), so ids are distinct
  in chat, Responses (``call_id``) and Messages (``tool_use.id``) alike;
- no ``index`` (older servers): a new ``id`` begins a new call, anything else
  continues the latest call; the same ``index`` with another upstream ``id``
  is a new call too (servers that number every call 0);
- the upstream's indexes in any order or with gaps: renumbered from 0;
- ``arguments`` as a JSON object instead of its text: encoded once (compact);
- a call that never gets a name is dropped, its arguments with it (a call
  without a name is nothing a client can run).

Refused (``RemoteProtocolError``, which ends the stream): a call whose whole
name is not one of ``tool_names`` (the tools the client offered), a name
longer than ``MAX_TOOL_NAME_CHARS``, more than ``max_calls`` calls. A refused
call's start never goes out.

Cost: linear in the entries fed; per entry, constant work besides its own
text (a name's pieces are joined once it is whole).

Invariants (property-tested through ``UpstreamReader``):
    - Whatever way a call's pieces are split over chunks, its fragments joined
      (``join_parts``) are the same: the upstream's id (or the made one), the
      whole name, the arguments' text concatenated.
    - A fragment with an ``id`` has a ``name`` and ``arguments == ""``; its
      index is one more than the last start's; no two such fragments of a
      response have the same ``id``.

Spec: OpenAI API reference, "The chat completion chunk object",
``choices[].delta.tool_calls``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from sluicegate.core.decoding.toolcalls import new_call_id
from sluicegate.core.errors import LocalProtocolError, RemoteProtocolError, bounded_repr
from sluicegate.core.events import ToolCallFragment
from sluicegate.core.upstream.limits import MAX_TOOL_NAME_CHARS

__all__ = ["ToolCallNormalizer"]

_DROPPED = -1  # the index of a call released without a name


class _Call:
    """One upstream call: what is known of it, and whether its start is out."""

    __slots__ = ("arguments", "index", "name", "sent", "upstream_id")

    def __init__(self, upstream_id: str | None) -> None:
        self.upstream_id = upstream_id
        self.name = ""
        self.arguments: list[str] = []  # held until the start goes out
        self.sent: list[str] = []  # the arguments sent so far
        self.index: int | None = None  # ours, once the start is out


class ToolCallNormalizer:
    """One choice's upstream tool-call entries in, normalized fragments out.

    Args:
        new_id: makes the id of a call the upstream sent none for
            (``new_call_id`` by default).
        tool_names: the names a call may have (the tools offered); ``None``:
            any name.
        max_calls: the most calls that may begin (named or not, >= 1).
        taken_ids: the ids given out so far, shared by the normalizers of a
            response's choices; each id this one gives out is added. ``None``:
            a set of its own.

    Attributes:
        calls: calls whose start fragment was returned (the next index).
    """

    __slots__ = (
        "_begun",
        "_by_index",
        "_closed",
        "_held",
        "_ids",
        "_latest",
        "_max_calls",
        "_new_id",
        "_started",
        "_tool_names",
        "calls",
    )

    def __init__(
        self,
        new_id: Callable[[], str] = new_call_id,
        *,
        tool_names: frozenset[str] | None = None,
        max_calls: int = 128,
        taken_ids: set[str] | None = None,
    ) -> None:
        self._new_id = new_id
        self._ids: set[str] = set() if taken_ids is None else taken_ids
        self._tool_names = tool_names
        self._max_calls = max_calls
        self._begun = 0
        self._by_index: dict[int, _Call] = {}  # the upstream's index -> call
        self._latest: _Call | None = None  # the call an entry without index continues
        self._held: _Call | None = None  # the one call whose start is held
        self._started: list[_Call] = []
        self._closed = False
        self.calls = 0

    @property
    def begun(self) -> int:
        """Calls the upstream began in this choice (named or not), each
        counted at its first entry."""
        return self._begun

    def begins(self, tool_calls: Any) -> bool:
        """Whether one chunk's ``delta.tool_calls`` (as ``feed`` takes it)
        begins a call with its first entry, as ``feed`` would read it; changes
        nothing."""
        if type(tool_calls) is not list:
            return False
        for entry in tool_calls:
            if type(entry) is dict:
                upstream_id = entry.get("id")
                if type(upstream_id) is not str or not upstream_id:
                    upstream_id = None
                index = entry.get("index")
                call = self._by_index.get(index) if type(index) is int else self._latest
                return call is None or _another(call, upstream_id)
        return False

    @property
    def open_call(self) -> bool:
        """Whether a started call's arguments, joined, are not one whole JSON
        value (a call cut short); a call that sent no arguments is whole."""
        for call in self._started:
            if call.sent:
                try:
                    orjson.loads("".join(call.sent))
                except orjson.JSONDecodeError:
                    return True
        return False

    def feed(self, tool_calls: Any) -> list[ToolCallFragment]:
        """Read one chunk's ``delta.tool_calls``.

        Args:
            tool_calls: the JSON value as the upstream sent it; anything but a
                list of objects is ignored (entries that are not objects too).

        Returns:
            The fragments it completes, in order (often one, maybe none).

        Raises:
            RemoteProtocolError: a call refused (see the module); the fragments
                of entries before it are lost with it.
            LocalProtocolError: after ``flush()``.
        """
        if self._closed:
            raise LocalProtocolError("ToolCallNormalizer.feed() after flush()")
        out: list[ToolCallFragment] = []
        if type(tool_calls) is not list:
            return out
        for entry in tool_calls:
            if type(entry) is dict:
                self._entry(entry, out)
        return out

    def flush(self) -> list[ToolCallFragment]:
        """The choice ended: the held call's start (and its arguments), if any.

        Raises:
            RemoteProtocolError: the held call names a tool not offered.
            LocalProtocolError: called twice.
        """
        if self._closed:
            raise LocalProtocolError("ToolCallNormalizer.flush() called twice")
        self._closed = True
        out: list[ToolCallFragment] = []
        self._release(out)
        return out

    def _entry(self, entry: dict[str, Any], out: list[ToolCallFragment]) -> None:
        upstream_id = entry.get("id")
        if type(upstream_id) is not str or not upstream_id:
            upstream_id = None
        call = self._call_of(entry.get("index"), upstream_id, out)
        function = entry.get("function")
        if type(function) is not dict or call.index == _DROPPED:
            return
        arguments = function.get("arguments")
        if arguments is not None and type(arguments) is not str:
            arguments = orjson.dumps(arguments).decode()
        name = function.get("name")
        if call.index is None and type(name) is str and name:
            # A name beside the call's own id again, or beside arguments, is the
            # whole name (repeated, or sent cumulatively); a bare one, a piece.
            repeated = bool(arguments) or (
                upstream_id is not None and upstream_id == call.upstream_id
            )
            whole = repeated and name.startswith(call.name)
            name = name if whole else call.name + name
            if len(name) > MAX_TOOL_NAME_CHARS:
                call.index = _DROPPED  # never released, whatever comes next
                self._held = None
                raise RemoteProtocolError(
                    f"the upstream named a tool call with more than "
                    f"{MAX_TOOL_NAME_CHARS} characters: {bounded_repr(name, 80)}"
                )
            call.name = name
        if call.upstream_id is None and call.index is None:
            call.upstream_id = upstream_id
        if not arguments:
            return
        if call.index is not None:
            call.sent.append(arguments)
            out.append(ToolCallFragment(call.index, arguments=arguments))
            return
        call.arguments.append(arguments)
        if call.name:
            self._release(out)

    def _call_of(
        self, index: Any, upstream_id: str | None, out: list[ToolCallFragment]
    ) -> _Call:
        """The call an entry continues, or a new one (the held one released)."""
        if type(index) is int:
            call = self._by_index.get(index)
            if call is not None and not _another(call, upstream_id):
                return call
        else:
            call = self._latest
            if call is not None and not _another(call, upstream_id):
                return call
            index = None
        self._release(out)
        self._begun += 1
        if self._begun > self._max_calls:
            raise RemoteProtocolError(
                f"the upstream began more than {self._max_calls} tool calls "
                "in one choice"
            )
        call = self._held = self._latest = _Call(upstream_id)
        if index is not None:
            self._by_index[index] = call
        return call

    def _release(self, out: list[ToolCallFragment]) -> None:
        """The held call is whole: its start, then what it held of its arguments.
        A call without a name is dropped."""
        call = self._held
        if call is None:
            return
        self._held = None
        if not call.name:
            call.index = _DROPPED  # what comes later for it drops too
            call.arguments = []
            return
        names = self._tool_names
        if names is not None and call.name not in names:
            call.index = _DROPPED
            raise RemoteProtocolError(
                f"the upstream called the tool {call.name!r}, which the request "
                "did not offer"
            )
        call.index = self.calls
        self.calls += 1
        self._started.append(call)
        call_id = call.upstream_id
        if call_id is None or call_id in self._ids:
            call_id = self._new_id()
        self._ids.add(call_id)
        out.append(ToolCallFragment(call.index, call_id, call.name))
        if call.arguments:
            arguments = "".join(call.arguments)
            call.sent.append(arguments)
            out.append(ToolCallFragment(call.index, arguments=arguments))
            call.arguments = []


def _another(call: _Call, upstream_id: str | None) -> bool:
    """An entry whose id differs from the call's own begins another call."""
    return (
        upstream_id is not None
        and call.upstream_id is not None
        and upstream_id != call.upstream_id
    )
