"""Recorded exchanges: what ``sluicegate check`` grades, as plain values.

A ``Transcript`` is one request and everything observed of its answer (status,
headers, raw body bytes, a few times). A recording is a ``Mapping[str,
Transcript]`` keyed by the names in ``check.record`` (``"stream"``, ``"plain"``,
...). Probes are pure functions over a recording, so a recording saved with
``dump_recording`` can be graded again anywhere, without a network.

The body is parsed here, once, with ``core.sse.SSEDecoder``: ``parse`` gives the
event data strings, the JSON chunks, and the decoding error if there was one.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from sluicegate.core.errors import RemoteProtocolError
from sluicegate.core.wire.sse import SSEDecoder

__all__ = [
    "Parsed",
    "Transcript",
    "dump_recording",
    "json_body",
    "load_recording",
    "parse",
]


@dataclass(frozen=True, slots=True)
class Transcript:
    """One request and what came back.

    Attributes:
        request: the JSON body sent.
        path: the path under ``/v1/`` (``"chat/completions"``).
        status: the HTTP status, or ``None`` when none came.
        headers: response headers, names lowercased.
        body: the raw body bytes, as received.
        ttft_s: seconds from sending to the first text, or ``None``.
        head_s: seconds from sending to the response head (status and
            headers), or ``None`` when not measured.
        elapsed_s: seconds from sending to the end of reading.
        closed_early: the recorder closed the connection on purpose.
    """

    request: Mapping[str, Any]
    path: str = "chat/completions"
    status: int | None = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
    ttft_s: float | None = None
    elapsed_s: float = 0.0
    closed_early: bool = False
    head_s: float | None = None

    @property
    def streamed(self) -> bool:
        """Whether the request asked for a stream."""
        return bool(self.request.get("stream"))


@dataclass(frozen=True, slots=True)
class Parsed:
    """A streamed body, decoded.

    Attributes:
        data: every event's data string, in order (``"[DONE]"`` included).
        chunks: ``(position in data, object)`` for every data that is a JSON
            object.
        decode_error: why the SSE decoder gave up (bad UTF-8), else ``None``.
        cut: the body ended inside an event (no blank line after it).
        event_types: the ``event`` field of each event (``"message"`` when none).
    """

    data: tuple[str, ...]
    chunks: tuple[tuple[int, Mapping[str, Any]], ...]
    decode_error: str | None
    cut: bool
    event_types: tuple[str, ...]


def parse(transcript: Transcript) -> Parsed:
    """Decode ``transcript.body`` as an event stream (strict WHATWG rules).

    Spec: WHATWG HTML, "9.2.6 Interpreting an event stream".
    """
    decoder = SSEDecoder()
    try:
        events = decoder.feed(transcript.body)
        decoder.flush()
        error = None
    except RemoteProtocolError as exc:
        events, error = [], str(exc)
    chunks: list[tuple[int, Mapping[str, Any]]] = []
    for i, event in enumerate(events):
        try:
            obj = orjson.loads(event.data)
        except orjson.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            chunks.append((i, obj))
    return Parsed(
        tuple(e.data for e in events),
        tuple(chunks),
        error,
        error is None and decoder.discarded,
        tuple(e.event for e in events),
    )


def json_body(transcript: Transcript) -> Any:
    """The body parsed as one JSON value, or ``None`` if it is not JSON."""
    try:
        return orjson.loads(transcript.body)
    except orjson.JSONDecodeError:
        return None


def dump_recording(recording: Mapping[str, Transcript]) -> bytes:
    """A recording as indented JSON (bodies as text, or base64 if not UTF-8)."""
    out: dict[str, Any] = {}
    for name, t in recording.items():
        item: dict[str, Any] = {
            "request": t.request, "path": t.path, "status": t.status,
            "headers": dict(t.headers), "ttft_s": t.ttft_s,
            "elapsed_s": t.elapsed_s, "closed_early": t.closed_early,
            "head_s": t.head_s,
        }  # fmt: skip
        try:
            item["body"] = t.body.decode("utf-8")
        except UnicodeDecodeError:
            item["body_b64"] = base64.b64encode(t.body).decode("ascii")
        out[name] = item
    return orjson.dumps(out, option=orjson.OPT_INDENT_2)


def load_recording(data: bytes) -> dict[str, Transcript]:
    """The inverse of ``dump_recording``.

    Raises:
        orjson.JSONDecodeError: ``data`` is not JSON.
        KeyError: an entry lacks ``request``.
    """
    recording: dict[str, Transcript] = {}
    for name, item in orjson.loads(data).items():
        if "body_b64" in item:
            body = base64.b64decode(item["body_b64"])
        else:
            body = item.get("body", "").encode("utf-8")
        recording[name] = Transcript(
            request=item["request"],
            path=item.get("path", "chat/completions"),
            status=item.get("status", 200),
            headers=item.get("headers", {}),
            body=body,
            ttft_s=item.get("ttft_s"),
            elapsed_s=item.get("elapsed_s", 0.0),
            closed_early=item.get("closed_early", False),
            head_s=item.get("head_s"),
        )
    return recording
