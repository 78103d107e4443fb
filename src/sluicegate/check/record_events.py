"""Record the Responses and Messages exchanges ``check --api`` grades.

The I/O half for ``check.responses_probes`` and ``check.messages_probes``: each
request is sent once, the whole body read, and kept as a ``Transcript`` under
the name the probes look up.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from sluicegate.check import names
from sluicegate.check.messages_probes import plain_text
from sluicegate.check.responses_probes import ECHO_TOOL
from sluicegate.check.transcript import Transcript, json_body, parse
from sluicegate.client import Client

__all__ = ["record_messages", "record_responses"]

PROMPT = "List the numbers from one to twelve in words, separated by commas."
MAX_SMALL = 16
"""The smallest ``max_output_tokens`` OpenAI accepts; the prompt needs more."""
THINKING_BUDGET = 1024
"""The smallest ``thinking.budget_tokens`` the Messages API accepts."""


def _post(client: Client, path: str, body: dict[str, Any]) -> Transcript:
    start = time.monotonic()
    try:
        response = client.http.post(path, json=body)
    except httpx.HTTPError as exc:
        return Transcript(request=body, path=path, status=None, body=str(exc).encode())
    return Transcript(
        request=body, path=path, status=response.status_code,
        headers=dict(response.headers), body=response.content,
        elapsed_s=time.monotonic() - start,
    )  # fmt: skip


def record_responses(
    client: Client, model: str, *, max_tokens: int = 24,
    progress: Callable[[str], None] = lambda name: None,
) -> dict[str, Transcript]:  # fmt: skip
    """Send the ``responses_*`` exchanges (stops after a 404: no such API).

    Returns:
        ``{name: Transcript}`` with the names ``check.responses_probes`` reads.
    """
    base = {"model": model, "input": PROMPT, "temperature": 0}
    bodies = {
        "responses_stream": {**base, "max_output_tokens": max_tokens, "stream": True},
        "responses_plain": {**base, "max_output_tokens": max_tokens},
        "responses_max": {**base, "max_output_tokens": MAX_SMALL, "stream": True},
        "responses_invalid": {**base, "temperature": 5, "stream": True},
        "responses_echo": {
            **base,
            "max_output_tokens": MAX_SMALL,
            "tools": [ECHO_TOOL],
            "tool_choice": "none",
            "parallel_tool_calls": False,
            "metadata": {"probe": "echo"},
        },
        # Reasoning asked for (a model that cannot reason may refuse: a 400).
        "responses_reasoning": {
            **base,
            "max_output_tokens": max_tokens,
            "reasoning": {"effort": "low"},
            "stream": True,
        },
    }
    out = _send(client, "responses", bodies, progress)
    if len(out) == len(bodies):  # not stopped by a 404: resume a stored stream
        stored = {**base, "max_output_tokens": MAX_SMALL, "store": True}
        out.update(_resume_past_end(client, {**stored, "stream": True}, progress))
    return out


def _resume_past_end(
    client: Client, body: dict[str, Any], progress: Callable[[str], None]
) -> dict[str, Transcript]:
    """A stored response streamed to its end, then resumed after its last event."""
    progress(names.RESPONSES_RESUMABLE)
    ended = _post(client, "responses", body)
    out = {names.RESPONSES_RESUMABLE: ended}
    cursor = _last_event(ended) if ended.status == 200 else None
    if cursor is not None:
        response_id, after = cursor
        progress(names.RESPONSES_RESUME_PAST_END)
        path = f"responses/{response_id}"
        query = {"stream": "true", "starting_after": str(after)}
        out[names.RESPONSES_RESUME_PAST_END] = _get(client, path, query)
    return out


def _last_event(t: Transcript) -> tuple[str, int] | None:
    """``(response id, the last event's sequence_number)`` of a Responses
    stream, or ``None`` when it says either not."""
    events = [obj for _, obj in parse(t).chunks]
    first = events[0].get("response") if events else None
    response_id = first.get("id") if isinstance(first, dict) else None
    after = events[-1].get("sequence_number") if events else None
    if not isinstance(response_id, str) or type(after) is not int:
        return None
    return response_id, after


def _get(client: Client, path: str, query: dict[str, str]) -> Transcript:
    start = time.monotonic()
    try:
        response = client.http.get(path, params=query)
    except httpx.HTTPError as exc:
        return Transcript(request=query, path=path, status=None, body=str(exc).encode())
    return Transcript(
        request=query, path=path, status=response.status_code,
        headers=dict(response.headers), body=response.content,
        elapsed_s=time.monotonic() - start,
    )  # fmt: skip


def record_messages(
    client: Client, model: str, *, max_tokens: int = 24,
    progress: Callable[[str], None] = lambda name: None,
) -> dict[str, Transcript]:  # fmt: skip
    """Send the ``messages_*`` exchanges (stops after a 404: no such API).

    Returns:
        ``{name: Transcript}`` with the names ``check.messages_probes`` reads.
    """
    base = {
        "model": model, "temperature": 0, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": PROMPT}],
    }  # fmt: skip
    first = {"messages_stream": {**base, "stream": True}, "messages_plain": dict(base)}
    out = _send(client, "messages", first, progress)
    if out.get("messages_plain") is None or out["messages_plain"].status != 200:
        return out
    several = _stops(out)
    bodies = {
        "messages_stop": {**base, "stream": True, "stop_sequences": _stop(out)},
        "messages_max": {**base, "max_tokens": 1, "stream": True},
        "messages_invalid": {**base, "max_tokens": -1, "stream": True},
        # Thinking asked for, with the smallest budget the API takes (and so
        # room for it), sampling as the API requires with thinking on, and the
        # answer stopped at its first line: the probe needs only its start.
        "messages_thinking": {
            **{k: v for k, v in base.items() if k != "temperature"},
            "max_tokens": THINKING_BUDGET + max_tokens,
            "thinking": {"type": "enabled", "budget_tokens": THINKING_BUDGET},
            "stop_sequences": ["\n"],
            "stream": True,
        },
        "messages_stops": {**base, "stream": True, "stop_sequences": several},
        "messages_stops_plain": {**base, "stop_sequences": several},
    }
    return {**out, **_send(client, "messages", bodies, progress)}


def _stops(out: dict[str, Transcript]) -> list[str]:
    # Several, so that naming the first one given is not naming the one met:
    # one never met, one past the middle, one from the middle (met first).
    text = _plain_text(out)
    third = max(1, len(text) // 3)
    later = text[2 * third : 2 * third + 3] or "\n"
    return ["\u00a7never\u00a7", later, text[third : third + 4] or "\n\n"]


def _plain_text(out: dict[str, Transcript]) -> str:
    return plain_text(json_body(out["messages_plain"]))


def _stop(out: dict[str, Transcript]) -> list[str]:
    # A piece from the middle of the reference text, so the stop spans tokens.
    text = _plain_text(out)
    third = max(1, len(text) // 3)
    return [text[third : third + 4] or "\n\n"]


def _send(
    client: Client, path: str, bodies: dict[str, dict[str, Any]],
    progress: Callable[[str], None],
) -> dict[str, Transcript]:  # fmt: skip
    out: dict[str, Transcript] = {}
    for name, body in bodies.items():
        progress(name)
        out[name] = _post(client, path, body)
        if out[name].status in (404, None):
            break
    return out
