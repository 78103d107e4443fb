"""Padded streams and streams on a clock, through the app (scripted engine)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import anyio
import pytest
from starlette.applications import Starlette

from sluicegate.core.endstate import EndState
from sluicegate.core.wire.padding import PAD_FIELD
from sluicegate.engines.clocks import ManualClock
from sluicegate.engines.scripted.engine import DEFAULT_TEXT, ScriptedEngine
from sluicegate.engines.scripted.vocab import ScriptedTokenizer
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig
from sluicegate.server.ledger.ledger import Ledger

from .asgi import CHAT, COMPLETIONS, HELLO, Exchange, exchange, on_clock

pytestmark = pytest.mark.anyio

TWELVE = b"abcdefghijkl"


class _TwelveTokenizer(ScriptedTokenizer):
    """The toy vocabulary plus one 12-character piece (the last id)."""

    @property
    def pieces(self) -> Sequence[bytes]:
        return (*super().pieces, TWELVE)


def _frames(body: bytes) -> list[bytes]:
    return [f + b"\n\n" for f in body.split(b"\n\n") if f]


def _content_sizes(body: bytes) -> dict[int, set[int]]:
    """Content frame sizes (bytes) by the length of their text (chars)."""
    sizes: dict[int, set[int]] = {}
    for frame in _frames(body):
        if not frame.startswith(b"data: {"):
            continue
        choices = json.loads(frame[6:])["choices"]
        text = choices[0]["delta"].get("content") if choices else None
        if text:
            sizes.setdefault(len(text), set()).add(len(frame))
    return sizes


def _row_state(app: Any) -> EndState:
    ledger: Ledger = app.state.ledger
    return ledger.rows[-1].end_state


async def test_one_and_twelve_character_deltas_have_the_same_sizes() -> None:
    tokenizer = _TwelveTokenizer()
    twelve = len(tokenizer.pieces) - 1
    one = tokenizer.encode("x", add_special=False, parse_special=False)[0]
    script = [one, twelve, one, one, twelve] * 8
    engine = ScriptedEngine(script, tokenizer=tokenizer, tokens_per_s=5000)
    app = create_app(engine, ServerConfig())
    sizes: dict[int, set[int]] = {}
    for _ in range(3):
        ex = await exchange(app, CHAT, {"messages": HELLO, "stream": True})
        for length, seen in _content_sizes(ex.body).items():
            sizes.setdefault(length, set()).update(seen)
        # Role, finish and [DONE]-less frames all take the same one size.
        frames = [f for f in _frames(ex.body) if f != b"data: [DONE]\n\n"]
        assert len({len(f) for f in frames}) == 1
    assert set(sizes) == {1, 12}
    assert sizes[1] == sizes[12]
    assert len(sizes[1]) == 1


async def _clocked(
    clock: ManualClock, app: Starlette, path: str, body: dict[str, Any]
) -> Exchange:
    ex = Exchange(app, path, body)
    await on_clock(clock, ex.run, 0.005)
    return ex


async def test_include_obfuscation_false_sends_the_plain_stream() -> None:
    clock = ManualClock()
    engine = ScriptedEngine(prefill_delay_s=0.2, clock=clock)
    app = create_app(engine, ServerConfig(heartbeat_interval_s=0.05), clock=clock)
    body = {
        "messages": HELLO,
        "stream": True,
        "stream_options": {"include_obfuscation": False, "include_usage": True},
    }
    ex = await _clocked(clock, app, CHAT, body)
    assert all(PAD_FIELD not in p for p in ex.payloads())
    assert b": keep-alive\n\n" in ex.body
    assert "".join(ex.contents()) == DEFAULT_TEXT
    padded = await _clocked(clock, app, CHAT, {"messages": HELLO, "stream": True})
    assert all(PAD_FIELD in p for p in padded.payloads())
    assert b": keep-alive\n\n" not in padded.body  # padded comments only


async def test_the_server_setting_turns_the_default_off_and_a_request_on() -> None:
    app = create_app(ScriptedEngine(), ServerConfig(obfuscation=False))
    plain = await exchange(app, COMPLETIONS, {"prompt": "Hi", "stream": True})
    assert all(PAD_FIELD not in p for p in plain.payloads())
    body = {
        "prompt": "Hi",
        "stream": True,
        "stream_options": {"include_obfuscation": True},
    }
    padded = await exchange(app, COMPLETIONS, body)
    assert all(PAD_FIELD in p for p in padded.payloads())
    assert "".join(padded.contents()) == "".join(plain.contents())


async def test_answers_that_are_not_streamed_are_not_padded() -> None:
    app = create_app(ScriptedEngine(), ServerConfig())
    ex = await exchange(app, CHAT, {"messages": HELLO})
    (answer,) = [json.loads(ex.body)]
    assert PAD_FIELD not in answer
    assert answer["choices"][0]["message"]["content"] == DEFAULT_TEXT


@pytest.mark.parametrize("padded", [True, False])
async def test_a_stream_on_a_clock_keeps_text_usage_and_its_end(padded: bool) -> None:
    clock = ManualClock()
    engine = ScriptedEngine(prefill_delay_s=0.1, clock=clock)
    app = create_app(engine, ServerConfig(), clock=clock)
    body = {
        "messages": HELLO,
        "stream": True,
        "stream_options": {
            "include_usage": True,
            "cadence_ms": 20,
            "include_obfuscation": padded,
        },
    }
    ex = await _clocked(clock, app, CHAT, body)
    assert "".join(ex.contents()) == DEFAULT_TEXT
    usage = ex.payloads()[-1]
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] > 0
    assert ex.events()[-1].data == "[DONE]"
    assert ex.done_count() == 1
    assert _row_state(app) is EndState.FINISHED
    # The prefill's ticks went out as heartbeats, before any content.
    assert ex.body.split(b'"content"')[0].count(b": keep-alive") >= 1
    if padded:
        frames = [f for f in _frames(ex.body) if f != b"data: [DONE]\n\n"]
        comments = {len(f) for f in frames if f.startswith(b":")}
        assert len(comments) == 1
        assert comments <= {len(f) for f in frames if f.startswith(b"data: {")}


async def test_a_stream_on_a_clock_holds_back_a_stop_string() -> None:
    clock = ManualClock()
    engine = ScriptedEngine("Here: ABCDEFGHIJKLMNOP", never_finishes=True, clock=clock)
    app = create_app(engine, ServerConfig(cadence_s=0.01), clock=clock)
    body = {"prompt": "Hi", "stop": ["DEFGHIJ"], "stream": True}
    ex = await _clocked(clock, app, COMPLETIONS, body)
    assert "".join(ex.contents()) == "Here: ABC"
    assert ex.done_count() == 1
    stats = engine.stats()  # stopped in the engine, counted as finished
    assert (stats.running, stats.finished_requests, stats.aborted_ids) == (0, 1, ())


async def test_a_stream_on_a_clock_ends_in_band_on_an_engine_error() -> None:
    clock = ManualClock()
    engine = ScriptedEngine(fail_at_step=3, clock=clock)
    app = create_app(engine, ServerConfig(cadence_s=0.01), clock=clock)
    ex = await _clocked(clock, app, CHAT, {"messages": HELLO, "stream": True})
    assert ex.only_error()["type"]
    assert ex.done_count() == 0
    assert _row_state(app) is EndState.ERRORED


async def test_a_client_that_leaves_a_stream_on_a_clock_aborts_it() -> None:
    clock = ManualClock()
    engine = ScriptedEngine(never_finishes=True, tokens_per_s=200, clock=clock)
    app = create_app(engine, ServerConfig(cadence_s=0.02), clock=clock)
    ex = Exchange(app, CHAT, {"messages": HELLO, "stream": True})
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ex.run)
            await on_clock(clock, anyio.sleep_forever, 0.005, ex.has_content)
            ex.leave()
    assert _row_state(app) is EndState.ABORTED
    assert engine.stats().running == 0
    assert len(engine.stats().aborted_ids) == 1


@pytest.mark.parametrize("cadence_ms", [-1, 1001, "50"])
async def test_a_cadence_out_of_range_is_refused(cadence_ms: Any) -> None:
    app = create_app(ScriptedEngine(), ServerConfig())
    body = {"messages": HELLO, "stream": True,
            "stream_options": {"cadence_ms": cadence_ms}}  # fmt: skip
    ex = await exchange(app, CHAT, body)
    assert ex.status == 400
    assert "cadence_ms" in ex.body.decode()


def test_the_server_refuses_a_cadence_over_a_second() -> None:
    with pytest.raises(ValueError, match="cadence_s"):
        ServerConfig(cadence_s=1.5)
