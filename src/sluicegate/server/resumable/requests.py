"""What a resume or an idempotent request names, checked: cursors, owners, keys.

Cursors: ``<response_id>.<seq>``, ``seq`` the frame's number in the log (0
first); a bare ``<seq>`` is accepted too. ``Last-Event-ID`` wins over
``?after=`` (an ``EventSource`` reconnects to the same URL with the header).
An ``Idempotency-Key`` is 1 to ``MAX_IDEMPOTENCY_KEY_CHARS`` visible ASCII
characters, bound with a hash of the body it came with (``body_hash``).

Spec: WHATWG HTML, "9.2 Server-sent events", "Last-Event-ID"; IETF draft
"The Idempotency-Key HTTP Header Field"; docs/resumable-streams.md.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from starlette.requests import Request

from sluicegate.core.errors import RequestError
from sluicegate.core.wire.chunks import dumps
from sluicegate.server.admission.access import API_KEY
from sluicegate.server.admission.keys import ANONYMOUS

__all__ = [
    "CURSOR_PAST_END",
    "MAX_CURSOR_CHARS",
    "MAX_IDEMPOTENCY_KEY_CHARS",
    "NOT_FOUND",
    "body_hash",
    "idempotency_claim",
    "owner_of",
    "parse_cursor",
    "past_end",
]

CURSOR_PAST_END = "cursor_past_end"
"""Error code of the 400 for a cursor at or past the end of an ended log."""

MAX_CURSOR_CHARS = 128
"""Longest cursor accepted (``Last-Event-ID`` or ``?after=``), in characters."""

MAX_IDEMPOTENCY_KEY_CHARS = 255
"""Longest ``Idempotency-Key`` accepted, in characters."""

NOT_FOUND = "No resumable stream with that id"
"""The one 404 message of an unknown, another key's, or an expired stream."""

_SEQ = re.compile(r"[0-9]{1,12}", re.ASCII)
_KEY = re.compile(r"[\x21-\x7e]+", re.ASCII)


def past_end(response_id: str, after: int, param: str) -> RequestError:
    """The 400 (``cursor_past_end``, naming ``param``) of a cursor at or past
    the end of ``response_id``'s ended log."""
    message = (
        f"The stream {response_id[:80]!r} has ended and nothing follows"
        f" event {after}: it was read to its end"
    )
    return RequestError(message, param=param, code=CURSOR_PAST_END)


def parse_cursor(text: str, response_id: str, param: str = "Last-Event-ID") -> int:
    """The ``after`` sequence number a cursor names (``-1``: from the start).

    Args:
        text: ``<response_id>.<seq>``, ``<seq>``, or ``""`` (no cursor).
        response_id: the response the path names; a cursor must name it too.
        param: where the cursor came from (``Last-Event-ID`` or ``after``).

    Raises:
        RequestError: longer than ``MAX_CURSOR_CHARS``, not of that shape, or
            naming another response (400 ``invalid_cursor`` naming ``param``).
    """
    if not text:
        return -1
    prefix, dot, seq = text.rpartition(".")
    if (
        len(text) > MAX_CURSOR_CHARS
        or (dot and prefix != response_id)
        or _SEQ.fullmatch(seq) is None
    ):
        raise RequestError(
            "expected a cursor '<response id>.<seq>' of this response, or '<seq>'",
            param=param,
            code="invalid_cursor",
        )
    return int(seq)


def owner_of(request: Request) -> str:
    """The key id a request's logs belong to (``ANONYMOUS`` without keys)."""
    key = request.scope.get(API_KEY)
    return key.key_id if key is not None else ANONYMOUS


def idempotency_claim(
    idempotency_key: str | None, body: dict[str, Any]
) -> tuple[str, str] | None:
    """What a request's ``Idempotency-Key`` binds: ``(key, body_hash(body))``;
    ``None`` without a key.

    Raises:
        RequestError: the key is empty, longer than ``MAX_IDEMPOTENCY_KEY_CHARS``
            or not visible ASCII (400, ``param="Idempotency-Key"``).
    """
    if idempotency_key is None:
        return None
    if (
        len(idempotency_key) > MAX_IDEMPOTENCY_KEY_CHARS
        or _KEY.fullmatch(idempotency_key) is None
    ):
        raise RequestError(
            f"expected an Idempotency-Key of 1 to {MAX_IDEMPOTENCY_KEY_CHARS}"
            " visible ASCII characters",
            param="Idempotency-Key",
        )
    return (idempotency_key, body_hash(body))


def body_hash(body: dict[str, Any]) -> str:
    """A hash of a request body, the same for the same JSON object (keys sorted)."""
    return hashlib.sha256(dumps(_sorted(body))).hexdigest()


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value
