"""Test-side wire helpers: a strict SSE reader, stream recorders and chunk checks.

These read what a real server sent, byte for byte, without the server's own code:
the SSE reader follows the WHATWG "event stream interpretation" rules (lines end in
CR, LF or CRLF; a blank line dispatches; ``:`` starts a comment) and decodes every
line as strict UTF-8, so a body that is not valid UTF-8 fails the test that read it.

Spec: https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import h11
import httpx

DONE = "[DONE]"
SSE_CONTENT_TYPE = "text/event-stream"
FINISH_REASONS = frozenset({"stop", "length"})
NO_END_TOKENS = {"1": -100, "106": -100, "212": -100}
"""``logit_bias`` that bans the default model's end tokens (Gemma 3's ``<eos>``,
``<end_of_turn>`` and ``</s>``). A test that needs an answer to run to
``max_tokens`` says so with it, instead of trusting the model to go on: where a
greedy model stops differs per machine, and where a sampled one stops per draw."""


class SSEReader:
    """Incremental, strict SSE parser: ``feed(bytes)`` returns the dispatched events.

    An event is returned as its data string (``data`` lines joined by ``\\n``);
    events without a ``data`` field are dropped, as WHATWG says. Comment lines are
    counted in ``comments``. ``flush()`` returns the text of an unterminated last
    event (``""`` when the stream ended on a blank line).
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []
        self._pending_line = False
        self.comments = 0

    def feed(self, data: bytes) -> list[str]:
        self._buffer += data
        events: list[str] = []
        while True:
            cut = _line_end(self._buffer)
            if cut is None:
                return events
            end, skip = cut
            raw_line = self._buffer[:end]
            self._buffer = self._buffer[end + skip :]
            # A line boundary (CR or LF) is never inside a UTF-8 sequence, so
            # decoding line by line checks the whole body.
            event = self._line(raw_line.decode("utf-8"))
            if event is not None:
                events.append(event)

    def flush(self) -> str:
        rest = self._buffer.decode("utf-8")
        self._buffer = b""
        pending = "\n".join(self._data)
        return rest or pending

    def _line(self, line: str) -> str | None:
        if line == "":
            if not self._data:
                return None
            event = "\n".join(self._data)
            self._data = []
            return event
        if line.startswith(":"):
            self.comments += 1
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        return None


def _line_end(buffer: bytes) -> tuple[int, int] | None:
    """Where the first line of ``buffer`` ends and how long its terminator is."""
    cr = buffer.find(b"\r")
    lf = buffer.find(b"\n")
    if cr == -1 and lf == -1:
        return None
    if cr == -1 or (lf != -1 and lf < cr):
        return lf, 1
    if cr + 1 == len(buffer):
        return None  # CR at the end: wait to see whether LF follows
    return cr, 2 if buffer[cr + 1 : cr + 2] == b"\n" else 1


@dataclass
class RecordedStream:
    """Everything one streamed response delivered, as the client saw it."""

    status: int
    headers: httpx.Headers
    body: bytes = b""
    events: list[str] = field(default_factory=list)
    arrivals_s: list[float] = field(default_factory=list)
    """``time.monotonic()`` when each event was complete at the client."""
    read_index: list[int] = field(default_factory=list)
    """Which socket read completed each event (0-based)."""
    sent_at_s: float = 0.0
    comments: int = 0
    tail: str = ""
    """An unterminated last event (a stream cut mid-event), else ``""``."""


def record_stream(
    client: httpx.Client,
    path: str,
    payload: Mapping[str, Any] | bytes,
    headers: Mapping[str, str] | None = None,
) -> RecordedStream:
    """POST ``payload`` and record the whole response, timing each SSE event."""
    content = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    all_headers = {"Content-Type": "application/json", **(headers or {})}
    sent_at_s = time.monotonic()
    with client.stream("POST", path, content=content, headers=all_headers) as response:
        recorded = RecordedStream(
            status=response.status_code, headers=response.headers, sent_at_s=sent_at_s
        )
        reader = SSEReader()
        body = bytearray()
        for read, data in enumerate(response.iter_raw()):
            body += data
            events = reader.feed(data)
            now = time.monotonic()
            recorded.events += events
            recorded.arrivals_s += [now] * len(events)
            recorded.read_index += [read] * len(events)
        recorded.body = bytes(body)
        recorded.tail = reader.flush()
        recorded.comments = reader.comments
    return recorded


def stream_chunks(recorded: RecordedStream) -> list[dict[str, Any]]:
    """Check the stream ends in exactly one ``[DONE]`` and parse the other events."""
    assert recorded.status == 200, recorded.body[:2000]
    assert recorded.headers["content-type"].startswith(SSE_CONTENT_TYPE)
    assert recorded.tail == "", f"stream ended mid-event: {recorded.tail!r}"
    assert recorded.events, "no event at all"
    assert recorded.events.count(DONE) == 1, recorded.events[-5:]
    assert recorded.events[-1] == DONE, recorded.events[-5:]
    chunks = [json.loads(event) for event in recorded.events[:-1]]
    for chunk in chunks:
        assert isinstance(chunk, dict), chunk
        assert "error" not in chunk, chunk
    return chunks


@dataclass
class ChoiceRecord:
    """What one choice of a streamed response carried, in order."""

    deltas: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    roles: int = 0

    @property
    def text(self) -> str:
        return "".join(self.deltas)


def check_chunks(
    chunks: Sequence[Mapping[str, Any]], *, chat: bool
) -> dict[int, ChoiceRecord]:
    """Check the OpenAI chunk invariants and return each choice's deltas.

    Invariants: ``id``, ``created`` and ``model`` are the same on every chunk; every
    choice object has the ``finish_reason`` key, non-null on exactly one chunk per
    choice and then ``stop`` or ``length``; no text for a choice after its finish
    chunk; for chat, ``role: assistant`` exactly once per choice, in its first chunk.
    """
    assert chunks, "no chunk before [DONE]"
    expected_object = "chat.completion.chunk" if chat else "text_completion"
    first = chunks[0]
    choices: dict[int, ChoiceRecord] = {}
    for position, chunk in enumerate(chunks):
        where = f"chunk {position}: {chunk!r}"
        assert chunk["object"] == expected_object, where
        for key in ("id", "created", "model"):
            assert chunk[key] == first[key], f"{key} changed; {where}"
        for choice in chunk["choices"]:
            index = choice["index"]
            record = choices.setdefault(index, ChoiceRecord())
            seen_before = bool(record.deltas) or record.roles > 0
            assert "finish_reason" in choice, where
            assert record.finish_reason is None, f"choice {index} after finish; {where}"
            if chat:
                delta = choice["delta"]
                if "role" in delta and delta["role"] is not None:
                    assert delta["role"] == "assistant", where
                    assert not seen_before, f"role not in first chunk; {where}"
                    record.roles += 1
                text = delta.get("content")
            else:
                text = choice["text"]
            if text:
                assert isinstance(text, str), where
                record.deltas.append(text)
            reason = choice["finish_reason"]
            if reason is not None:
                assert reason in FINISH_REASONS, where
                record.finish_reason = reason
    for index, record in choices.items():
        assert record.finish_reason is not None, f"choice {index} never finished"
        if chat:
            assert record.roles == 1, f"choice {index}: role sent {record.roles} times"
    return choices


def collect(
    client: httpx.Client,
    path: str,
    payload: Mapping[str, Any],
    headers: Mapping[str, str] | None = None,
) -> tuple[RecordedStream, dict[int, ChoiceRecord]]:
    """Stream ``payload`` and return the recording and the checked choices."""
    recorded = record_stream(client, path, {**payload, "stream": True}, headers)
    choices = check_chunks(
        stream_chunks(recorded), chat=path.endswith("/chat/completions")
    )
    return recorded, choices


def complete(
    client: httpx.Client, path: str, payload: Mapping[str, Any]
) -> dict[str, Any]:
    """The same request with ``stream: false``; returns the response body.

    ``stream_options`` is dropped: OpenAI accepts it only with ``stream: true``.
    """
    body = {k: v for k, v in payload.items() if k != "stream_options"}
    response = client.post(path, json={**body, "stream": False})
    assert response.status_code == 200, response.text
    result = response.json()
    assert isinstance(result, dict)
    return result


def response_text(body: Mapping[str, Any], index: int = 0) -> str:
    """The text of choice ``index`` of a non-streamed chat or completions body."""
    choice = next(c for c in body["choices"] if c["index"] == index)
    if "message" in choice:
        return str(choice["message"]["content"] or "")
    return str(choice["text"])


def assert_whole_characters(texts: Sequence[str]) -> None:
    """No text has U+FFFD or a lone surrogate; each encodes to UTF-8 on its own."""
    for position, text in enumerate(texts):
        assert "\ufffd" not in text, f"U+FFFD in delta {position}: {text!r}"
        lone = [c for c in text if 0xD800 <= ord(c) <= 0xDFFF]
        assert not lone, f"lone surrogate in delta {position}: {text!r}"
        text.encode("utf-8")  # raises on anything that is not whole characters


def assert_deltas_not_cumulative(deltas: Sequence[str], final_text: str) -> None:
    """The deltas add up to the final text exactly: nothing is sent twice."""
    assert sum(len(d) for d in deltas) == len(final_text), (deltas, final_text)
    assert "".join(deltas) == final_text


def stop_reference(text: str, stops: Sequence[str]) -> str:
    """OpenAI's stop semantics: ``text`` cut before the earliest stop string."""
    cuts = [text.find(stop) for stop in stops if stop in text]
    return text[: min(cuts)] if cuts else text


def outside_stop_reason(body: bytes, stop: str) -> str:
    """A stream's bytes as text, less the ``"stop_reason"`` that names ``stop``.

    The finish chunk of a choice a stop string ended names that string in
    ``stop_reason`` (vLLM's field); anywhere else the string is a leak.
    """
    named = '"stop_reason":' + json.dumps(
        stop, ensure_ascii=False, separators=(",", ":")
    )
    return body.decode("utf-8").replace(named, "")


# -- engine stats -----------------------------------------------------------------


def engine_stats(client: httpx.Client) -> dict[str, Any]:
    response = client.get("/engine/stats")
    assert response.status_code == 200, response.text
    stats = response.json()
    assert isinstance(stats, dict)
    return stats


def wait_until(
    client: httpx.Client,
    condition: Callable[[dict[str, Any]], bool],
    *,
    started_s: float,
    give_up_s: float,
    interval_s: float = 0.02,
) -> tuple[dict[str, Any] | None, float]:
    """Poll ``/engine/stats`` until ``condition`` holds.

    Returns the first stats that satisfy it and the time from ``started_s`` to the
    moment the poll that saw it was sent, or ``(None, elapsed)`` after ``give_up_s``.
    """
    while True:
        asked_s = time.monotonic()
        stats = engine_stats(client)
        if condition(stats):
            return stats, asked_s - started_s
        if asked_s - started_s > give_up_s:
            return None, asked_s - started_s
        time.sleep(interval_s)


# -- raw HTTP over a socket we can close at will ----------------------------------


class RawExchange:
    """One HTTP/1.1 request on its own socket, read with h11, closable mid-response."""

    def __init__(
        self,
        base_url: str,
        path: str,
        payload: Mapping[str, Any],
        headers: Mapping[str, str] | None = None,
    ) -> None:
        url = urlsplit(base_url)
        assert url.hostname is not None
        assert url.port is not None
        body = json.dumps(payload).encode()
        self.sock = socket.create_connection((url.hostname, url.port), timeout=60)
        self.conn = h11.Connection(h11.CLIENT)
        self.reader = SSEReader()
        self.events: list[str] = []
        self.response: h11.Response | None = None
        request_headers = [
            ("Host", url.netloc),
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
            ("Connection", "close"),
            *(headers or {}).items(),
        ]
        request = h11.Request(method="POST", target=path, headers=request_headers)
        for event in (request, h11.Data(data=body), h11.EndOfMessage()):
            data = self.conn.send(event)
            assert data is not None
            self.sock.sendall(data)
        self.sent_at_s = time.monotonic()

    def _next_event(self) -> Any:
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            self.conn.receive_data(self.sock.recv(65536))

    def read_response(self) -> h11.Response:
        """Block until the status line and headers have arrived."""
        while self.response is None:
            event = self._next_event()
            if isinstance(event, h11.Response):
                self.response = event
            else:
                assert isinstance(event, h11.InformationalResponse), event
        return self.response

    def iter_events(self) -> Iterator[str]:
        """Yield SSE data strings as they arrive, until the body ends."""
        self.read_response()
        while True:
            event = self._next_event()
            if isinstance(event, h11.Data):
                for sse in self.reader.feed(bytes(event.data)):
                    self.events.append(sse)
                    yield sse
            else:
                assert isinstance(event, h11.EndOfMessage | h11.ConnectionClosed), event
                return

    def close(self) -> float:
        """Drop the connection without reading further; returns when it was closed."""
        with contextlib.suppress(OSError):  # the server may have closed already
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        return time.monotonic()

    def __enter__(self) -> RawExchange:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.sock.close()
