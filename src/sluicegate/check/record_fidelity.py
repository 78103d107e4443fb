"""Record the exchanges of ``check.fidelity``'s probes (the I/O half).

Sent after the other chat exchanges, one at a time: continuous usage, a
two-city tool request with ``parallel_tool_calls: false``, a long prompt (its
time to headers), a prompt sent three times (its cached tokens), and a resumable
stream followed by a resume at its last event id.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import httpx

from sluicegate.check import names
from sluicegate.check.transcript import Transcript
from sluicegate.core.errors import RemoteProtocolError
from sluicegate.core.wire.sse import SSEDecoder

__all__ = ["PREFILL_TOKENS", "record_fidelity"]

PREFILL_TOKENS = 1500
"""About how many tokens the slow-prefill prompt has by default (it fits a
2,048-token window with room for the answer)."""
FILLER = "The quick brown fox jumps over the lazy dog. "
"""One sentence of the long prompt: about ten tokens in common tokenizers."""
SERIAL_PROMPT = "What is the weather in Paris and in Oslo? Look up each city."

Run = Callable[[str, Callable[[], Transcript]], Transcript]
Send = Callable[[dict[str, Any]], Transcript]


def record_fidelity(
    client: Any,
    model: str,
    run: Run,
    stream: Send,
    plain: Send,
    *,
    prompt: str,
    tool: Any,
    prefill_tokens: int = PREFILL_TOKENS,
) -> None:
    """Send the fidelity exchanges through ``run`` (which records each).

    Args:
        client: the ``sluicegate.client.Client`` of the server.
        model: the model name.
        run: records ``(name, send)``; returns the ``Transcript``.
        stream: sends a streamed chat body; plain: a non-streamed one.
        prompt: the ordinary prompt (``PLAIN``'s, just sent).
        tool: the one function offered (``record.WEATHER_TOOL``).
        prefill_tokens: about how many tokens the long prompt has.
    """

    def chat(text: str, **params: Any) -> dict[str, Any]:
        messages = [{"role": "user", "content": text}]
        return {"model": model, "messages": messages, "temperature": 0, **params}

    usage = {"stream": True, "stream_options": {"include_usage": True}}
    every = {"include_usage": True, "continuous_usage_stats": True}
    body = chat(prompt, max_tokens=8, stream=True, stream_options=every)
    run(names.CONTINUOUS, partial(stream, body))
    serial = chat(
        SERIAL_PROMPT, tools=[tool], tool_choice="required",
        parallel_tool_calls=False, max_tokens=64, **usage,
    )  # fmt: skip
    run(names.TOOLS_SERIAL, partial(stream, serial))
    sentences = FILLER * max(1, prefill_tokens // 10)
    long = chat(sentences + "\nSay OK.", max_tokens=1, **usage)
    run(names.SLOW_PREFILL, partial(stream, long))
    again = chat(prompt, max_tokens=1)
    # Sent three times in a row: the first may find the cache holding the long
    # prompt just sent (one slot), the next two must find this one there.
    run(names.CACHED_PRIME, partial(plain, again))
    run(names.CACHED_PLAIN, partial(plain, again))
    run(names.CACHED_STREAM, partial(stream, {**again, **usage}))
    options = {"include_usage": True, "resumable": True}
    resumable = chat(prompt, max_tokens=8, stream=True, stream_options=options)
    ended = run(names.RESUMABLE, partial(stream, resumable))
    cursor = last_event_id(ended.body)
    if ended.status == 200 and cursor:
        run(names.RESUME_PAST_END, partial(_resume, client, cursor))


def last_event_id(body: bytes) -> str | None:
    """The id of a stream's last event (its ``id:`` field), or ``None``."""
    decoder = SSEDecoder()
    try:
        events = decoder.feed(body)
    except RemoteProtocolError:
        return None
    return events[-1].id if events else None


def _resume(client: Any, cursor: str) -> Transcript:
    response_id = cursor.rsplit(".", 1)[0]
    path = f"chat/completions/{response_id}/events"
    request = {"last_event_id": cursor}
    try:
        answer = client.http.get(path, headers={"Last-Event-ID": cursor})
    except httpx.HTTPError as exc:
        return Transcript(request, path, status=None, body=str(exc).encode())
    return Transcript(
        request, path, answer.status_code, dict(answer.headers), answer.content
    )
