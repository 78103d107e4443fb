"""The eager writer and its plain twin give the same bytes, ledger rows and metrics.

Each case runs once written eagerly (``EventStreamResponse.eager``) and once by
the pump's task only, on a fresh app. Bytes are compared frame by frame with the
per-response ``id`` and ``created`` masked, and each choice's content chunks
joined (how many tokens one write carries, and how choices interleave, depends
on how late the loop wakes the writer; the frames' bytes otherwise do not).
"""

from __future__ import annotations

import json
import re
from typing import Any

import anyio
import pytest

from sluicegate.engines.scripted.engine import ScriptedEngine
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig
from sluicegate.server.ledger.ledger import Ledger
from sluicegate.server.metering.metrics import Metrics
from sluicegate.server.streaming.sse_response import EventStreamResponse

from .asgi import CHAT, COMPLETIONS, HELLO, Exchange

pytestmark = pytest.mark.anyio

USAGE = {"include_usage": True}
CASES: dict[str, tuple[dict[str, Any], str, dict[str, Any]]] = {
    "chat": ({}, CHAT, {"messages": HELLO, "stream_options": USAGE}),
    "completions-n2": ({}, COMPLETIONS, {"prompt": "Hi", "n": 2}),
    "stop-string": (
        {"script": "Here: ABCDEFGHIJ", "never_finishes": True},
        COMPLETIONS,
        {"prompt": "Hi", "stop": ["DEF"], "stream_options": USAGE},
    ),
    "length": ({}, CHAT, {"messages": HELLO, "max_tokens": 5}),
    "engine-error": ({"fail_at_step": 3}, CHAT, {"messages": HELLO}),
    "continuous-usage": (
        {},
        CHAT,
        {
            "messages": HELLO,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
    ),
}

# Counters and gauges that do not depend on timing (coalescing and the tokens an
# abort wastes do; histograms hold durations).
_STABLE_METRICS = re.compile(
    rb"^sluicegate_(requests_total|tokens_total|heartbeats_sent_total|"
    rb"slow_client_aborts_total|active_streams|stream_buffer_bytes|"
    rb"engine_running|kv_cells_used|engine_aborted_requests_total)\b.*$",
    re.MULTILINE,
)


def _frames(body: bytes) -> list[Any]:
    """The body's frames, ``id``/``created`` masked, content runs joined, the
    random pad (``obfuscation``, a comment's) dropped. How several choices'
    content chunks interleave depends on timing too, so each choice's content is
    joined whole, and the joined texts come last."""
    shape: list[Any] = []
    texts: dict[int, str] = {}
    for frame in body.split(b"\n\n"):
        if frame.startswith(b": keep-alive"):
            shape.append(b": keep-alive")
            continue
        if not frame.startswith(b"data: {"):
            shape.append(frame)  # [DONE], the empty tail
            continue
        payload = json.loads(frame[len(b"data: ") :])
        payload.update(id="-", created=0)
        payload.pop("obfuscation")  # every event is padded
        choices = payload.get("choices") or [{}]
        text = choices[0].get("delta", {}).get("content", choices[0].get("text"))
        plain = len(choices) == 1 and choices[0].get("finish_reason") is None
        if text and plain and payload.get("usage") is None:
            index = choices[0]["index"]
            texts[index] = texts.get(index, "") + text
            continue
        shape.append(payload)
    return [*shape, texts]


def _row(ledger: Ledger) -> tuple[Any, ...]:
    row = ledger.rows[-1]
    return (
        row.endpoint,
        row.model,
        row.status,
        row.end_state,
        row.prompt_tokens,
        row.completion_tokens,
        row.finish_reasons,
        row.key_id,
    )


async def _run(
    eager: bool,
    monkeypatch: pytest.MonkeyPatch,
    engine_kwargs: dict[str, Any],
    path: str,
    body: dict[str, Any],
) -> tuple[list[Any], tuple[Any, ...], list[bytes]]:
    monkeypatch.setattr(EventStreamResponse, "eager", eager)
    app = create_app(ScriptedEngine(tokens_per_s=2000, **engine_kwargs), ServerConfig())
    ex = Exchange(app, path, {**body, "stream": True})
    with anyio.fail_after(5):
        await ex.run()
    metrics: Metrics = app.state.metrics
    stable = [m.group(0) for m in _STABLE_METRICS.finditer(metrics.render())]
    return _frames(ex.body), _row(app.state.ledger), stable


@pytest.mark.parametrize("case", sorted(CASES))
async def test_both_writers_write_the_same_stream(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine_kwargs, path, body = CASES[case]
    eager = await _run(True, monkeypatch, engine_kwargs, path, body)
    task = await _run(False, monkeypatch, engine_kwargs, path, body)
    assert eager[0] == task[0]  # the bytes
    assert eager[1] == task[1]  # the ledger row
    assert eager[2] == task[2]  # the metrics
    assert eager[2]  # and there were some
