"""End states of a ``sluicegate check`` recording made through a gateway in front
of an upstream that cannot call a tool when asked to (the scripted engine writes
its script, the peer answers empty).

The gateway holds such an upstream to ``tool_choice``: a named or ``"required"``
choice that ends with no call is one in-band ``tool_call_missing`` error
(docs/upstreams.md, "Tool calls"). The check's ``end-states`` probe then fails on
the first of those exchanges; ``unfinished_streams`` lists every stream of the
recording that did not finish, so a test can tell those errors from any other.
"""

from __future__ import annotations

from pathlib import Path

from sluicegate.check.transcript import load_recording
from sluicegate.check.verdicts import streams
from sluicegate.client.assemble import StreamAssembler

__all__ = ["FORCED_CALL_MISSING", "unfinished_streams"]

FORCED_CALL_MISSING = "tool_call_missing"


def unfinished_streams(saved: Path) -> dict[str, tuple[str, str | None]]:
    """``{exchange: (end state, error code)}`` for each streamed 200 of the
    recording at ``saved`` (``check --save``) that did not end ``finished``, by
    the classification ``end-states`` uses."""
    out: dict[str, tuple[str, str | None]] = {}
    for name, t, _ in streams(load_recording(saved.read_bytes())):
        assembler = StreamAssembler(int(t.request.get("n") or 1))
        assembler.head(t.status or 0, t.headers, 0.0)
        assembler.feed(t.body, 0.0)
        result = assembler.flush(t.elapsed_s)
        if result.end_state != "finished":
            code = (result.error or {}).get("code")
            out[name] = (result.end_state, code if isinstance(code, str) else None)
    return out
