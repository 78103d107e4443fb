"""A client that goes away aborts its request in the engine.

Each test opens its own socket, closes it at a chosen moment, and then polls
``/engine/stats`` on another connection. The contract: within 1 s of the close the
engine lists the request in ``aborted_ids``, no longer runs it, holds no KV cell,
and its generated-token counter stops. A machine too slow for 1 s (one engine step
can take longer) is held to the next step boundary instead: see
``STEPS_AFTER_CLOSE``.

The requests ask for 1024 tokens: they must fit the test server's 2048-token
context with their prompt (or the engine rejects them up front), and 1024 is still
about 15 s of generation, far past any deadline here. They sample (no
temperature, no seed), so a draw could end the story early; the model's end
tokens are banned so that none can.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from .wire import NO_END_TOKENS, RawExchange, engine_stats, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]

CHAT = "/v1/chat/completions"
ABORT_WITHIN_S = 1.0
"""How soon the engine stops after its client goes (docs/DESIGN.md, "Engine
protocol")."""
STEPS_AFTER_CLOSE = 3
"""The contract's 1 s assumes engine steps far shorter than that (tens of ms on
2 cores). Where one step takes longer (a slow or busy machine: a 128-token
prefill step can take seconds there), a late abort is judged in steps instead: it
came at a step boundary right after the close (the step in flight, one that
began before the disconnect reached the engine, and one of slack)."""
GIVE_UP_S = 60.0
"""How long to keep polling after the deadline, to tell late aborts from none
(and to wait for what earlier requests left): one 512-token prefill step took
12 s on 2 cores at load average 15."""
SETTLE_S = 0.5
MAX_TOKENS = 1024

STORY = {
    "messages": [
        {
            "role": "user",
            "content": "Write a 2000-word story about a lighthouse keeper.",
        }
    ],
    "max_tokens": MAX_TOKENS,
    "logit_bias": NO_END_TOKENS,
}

# 12 tokens a sentence: ~1500 prompt tokens (about 3 s of prefill on 2 cores), and
# the prompt plus max_tokens still fits the 2048-token context of the test server.
LONG_PROMPT_SENTENCES = 125
LONG_PROMPT_MAX_TOKENS = 32


def assert_aborted(
    http: httpx.Client, request_id: str, closed_at_s: float, before: dict[str, Any]
) -> dict[str, Any]:
    """The engine aborted ``request_id`` within 1 s of ``closed_at_s`` (or within
    ``STEPS_AFTER_CLOSE`` engine steps, where those are slow), for good."""
    at_close = engine_stats(http)

    def gone(stats: dict[str, Any]) -> bool:
        return (
            request_id in stats["aborted_ids"]
            and request_id not in stats["running_ids"]
            and stats["kv_cells_used"] == 0
        )

    stats, elapsed_s = wait_until(
        http, gone, started_s=closed_at_s, give_up_s=GIVE_UP_S
    )
    assert stats is not None, (
        f"{request_id} not aborted {GIVE_UP_S} s after the close: {engine_stats(http)}"
    )
    steps = stats["steps"] - at_close["steps"]
    assert elapsed_s <= ABORT_WITHIN_S or steps <= STEPS_AFTER_CLOSE, (
        f"{request_id} aborted {elapsed_s:.2f} s and {steps} engine steps after "
        f"the close (contract: {ABORT_WITHIN_S} s): {stats}"
    )
    assert stats["aborted_requests"] == before["aborted_requests"] + 1
    time.sleep(SETTLE_S)
    later = engine_stats(http)
    assert later["generated_tokens"] == stats["generated_tokens"], (stats, later)
    assert later["running"] == 0
    assert later["kv_cells_used"] == 0
    return stats


def idle(stats: dict[str, Any]) -> bool:
    """Whether the engine holds no request and no KV cell."""
    return bool(stats["running"] == stats["queued"] == stats["kv_cells_used"] == 0)


def new_running_id(
    http: httpx.Client, before: dict[str, Any], started_s: float
) -> tuple[str, dict[str, Any]]:
    """The id of the one request that started running after ``before``."""
    old = set(before["running_ids"]) | set(before["aborted_ids"])
    stats, _ = wait_until(
        http,
        lambda s: bool(set(s["running_ids"]) - old),
        started_s=started_s,
        give_up_s=GIVE_UP_S,
        interval_s=0.01,
    )
    assert stats is not None, "the request never started running"
    (request_id,) = set(stats["running_ids"]) - old
    return request_id, stats


def test_closing_a_stream_after_the_first_token_aborts_the_engine(
    base_url: str, http: httpx.Client
) -> None:
    """Read until the first content chunk, close, and the engine stops."""
    before = engine_stats(http)
    with RawExchange(base_url, CHAT, {**STORY, "stream": True}) as exchange:
        assert exchange.read_response().status_code == 200
        response_id = None
        for event in exchange.iter_events():
            chunk = json.loads(event)
            response_id = chunk["id"]
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                break
        else:
            pytest.fail(f"stream ended before any content: {exchange.events}")
        closed_at_s = exchange.close()
    request_id = f"{response_id}-0"
    known = engine_stats(http)
    assert request_id in (*known["running_ids"], *known["aborted_ids"]), (
        f"no engine request {request_id!r} (response id + choice index): {known}"
    )

    stats = assert_aborted(http, request_id, closed_at_s, before)
    generated = stats["generated_tokens"] - before["generated_tokens"]
    assert generated < MAX_TOKENS, "the request ran to its end: nothing was aborted"


def test_closing_a_non_streamed_request_aborts_the_engine(
    base_url: str, http: httpx.Client
) -> None:
    """``stream: false``, the socket closed 1 s after sending: the engine stops.

    No machine is assumed fast enough to have sampled a token by then: the close
    waits, after the second, for the first token as well.
    """
    before = engine_stats(http)
    with RawExchange(base_url, CHAT, {**STORY, "stream": False}) as exchange:
        request_id, _ = new_running_id(http, before, exchange.sent_at_s)
        time.sleep(max(0.0, exchange.sent_at_s + 1.0 - time.monotonic()))
        sampled, _ = wait_until(
            http,
            lambda s: s["generated_tokens"] > before["generated_tokens"],
            started_s=exchange.sent_at_s,
            give_up_s=GIVE_UP_S,
        )
        assert sampled is not None, f"no token sampled: {engine_stats(http)}"
        closed_at_s = exchange.close()

    stats = assert_aborted(http, request_id, closed_at_s, before)
    generated = stats["generated_tokens"] - before["generated_tokens"]
    assert 0 < generated < MAX_TOKENS, stats


def test_closing_during_a_long_prefill_aborts_before_any_token(
    base_url: str, http: httpx.Client
) -> None:
    """The client leaves while a ~1500-token prompt is being prefilled."""
    sentence = "The keeper climbed the stairs and lit the great lamp again. "
    payload = {
        "messages": [
            {
                "role": "user",
                "content": sentence * LONG_PROMPT_SENTENCES + "Summarize this.",
            }
        ],
        "max_tokens": LONG_PROMPT_MAX_TOKENS,
        "temperature": 0,
    }
    # Counted through the same chat template, without a prefill of its own (the
    # model's id asked here: the engine-process module runs this test on its
    # own module-scoped server, which the session's model_id cannot see).
    model_id = http.get("/v1/models").json()["data"][0]["id"]
    counted = http.post(
        "/v1/messages/count_tokens",
        json={"model": model_id, "messages": payload["messages"]},
    )
    assert counted.status_code == 200, counted.text
    prompt_tokens = counted.json()["input_tokens"]
    assert 1200 <= prompt_tokens <= 1900, prompt_tokens

    # An engine in a process of its own pushes its stats between steps: the
    # answer can come before the stats that count its last step.
    before, _ = wait_until(http, idle, started_s=time.monotonic(), give_up_s=GIVE_UP_S)
    assert before is not None, engine_stats(http)
    with RawExchange(base_url, CHAT, {**payload, "stream": True}) as exchange:
        request_id, seen = new_running_id(http, before, exchange.sent_at_s)
        closed_at_s = exchange.close()
    assert seen["generated_tokens"] == before["generated_tokens"], (
        "the prefill ended before the test could close the connection: "
        f"{before} -> {seen}"
    )

    stats = assert_aborted(http, request_id, closed_at_s, before)
    prefilled = stats["prompt_tokens"] - before["prompt_tokens"]
    assert prefilled < prompt_tokens, (
        f"all {prompt_tokens} prompt tokens were prefilled after the close: {stats}"
    )
    # A step already running when the abort came may sample one token (waste).
    assert stats["generated_tokens"] - before["generated_tokens"] <= 1, stats
