"""Stop strings on the real model: held back while they may match, never leaked.

Each test runs the request streamed, the same request with ``stream: false``, and the
request without ``stop`` (greedy, so the model writes the same tokens): the streamed
text must be that unstopped text cut before the earliest stop string.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import pytest

from .wire import (
    NO_END_TOKENS,
    assert_deltas_not_cumulative,
    collect,
    complete,
    engine_stats,
    outside_stop_reason,
    response_text,
    stop_reference,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]

COMPLETIONS = "/v1/completions"


def unstopped_text(http: httpx.Client, payload: dict[str, Any]) -> str:
    """What the model writes for ``payload`` when no stop string is set."""
    without_stop = {k: v for k, v in payload.items() if k != "stop"}
    return response_text(complete(http, COMPLETIONS, without_stop))


@pytest.mark.parametrize("source", ["fixed", "answer"])
def test_stop_string_is_held_back_and_never_leaks(
    http: httpx.Client, source: str
) -> None:
    """A stop string spread over several tokens never reaches the client.

    ``fixed`` sends the stop string ``DEFGHIJ`` after the prompt's ``ABC``, which
    the model need not write (whether it does depends on the machine: Gemma 3
    270M writes ``DE.`` on some). So ``answer`` cuts seven characters from the
    middle of the unstopped answer instead, and the stop string matches whatever
    this machine's model writes.
    """
    payload: dict[str, Any] = {
        "prompt": "Here is the English alphabet: ABC",
        "stop": ["DEFGHIJ"],
        "temperature": 0,
        "max_tokens": 32,
    }
    if source == "answer":
        payload["logit_bias"] = NO_END_TOKENS  # all 32 tokens: room to cut from
    unstopped = unstopped_text(http, payload)
    if source == "answer":
        third = len(unstopped) // 3
        payload["stop"] = [unstopped[third : third + 7]]
        assert len(payload["stop"][0]) == 7, unstopped
    (stop,) = payload["stop"]
    recorded, choices = collect(http, COMPLETIONS, payload)
    body = complete(http, COMPLETIONS, payload)
    text = choices[0].text
    reference = stop_reference(unstopped, [stop])

    assert text == response_text(body)
    assert choices[0].finish_reason == body["choices"][0]["finish_reason"]
    assert text == reference, unstopped
    assert stop not in outside_stop_reason(recorded.body, stop)
    if stop in unstopped:
        assert choices[0].finish_reason == "stop"
        leaked = [
            stop[:n]
            for n in range(1, len(stop))
            if text.endswith(stop[:n]) and not reference.endswith(stop[:n])
        ]
        assert not leaked, (text, unstopped)


def test_several_stop_strings_end_at_the_earliest_without_repeats(
    http: httpx.Client,
) -> None:
    """With several stop strings the text ends at the first that matches."""
    stops = ["\n", "Alice:"]
    payload = {
        "prompt": "Alice: Hi, Bob!\nBob: Hi,",
        "stop": stops,
        "max_tokens": 8,
        "temperature": 0,
    }
    _, choices = collect(http, COMPLETIONS, payload)
    body = complete(http, COMPLETIONS, payload)
    unstopped = unstopped_text(http, payload)
    text = choices[0].text

    assert text == response_text(body)
    assert_deltas_not_cumulative(choices[0].deltas, response_text(body))
    assert text == stop_reference(unstopped, stops), unstopped
    assert all(stop not in text for stop in stops)
    assert choices[0].finish_reason == body["choices"][0]["finish_reason"]


@pytest.mark.parametrize("max_tokens", [2, 3])
def test_held_back_tail_is_flushed_before_the_finish_chunk(
    http: httpx.Client, max_tokens: int
) -> None:
    """Text held back as a possible stop prefix is sent when generation ends.

    The default model writes ``?``, ``\\n``, ``Alice`` here: with ``max_tokens``
    3 the stop string matches (empty text, ``stop``); with 2 the
    held-back ``?\\n`` must be flushed at the length finish. ``collect`` checks
    that no text follows the finish chunk.
    """
    stop = "?\nAlice"
    payload = {
        "prompt": "Alice: Ask me any question.\nBob: What color is the sky on Mars",
        "stop": [stop],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    _, choices = collect(http, COMPLETIONS, payload)
    body = complete(http, COMPLETIONS, payload)
    unstopped = unstopped_text(http, payload)
    text = choices[0].text

    assert text == response_text(body)
    assert text == stop_reference(unstopped, [stop]), unstopped
    if stop not in unstopped:
        assert text == unstopped
        assert choices[0].finish_reason in ("length", "stop")


def test_engine_stats_count_a_stop_string_ending_as_finished(
    http: httpx.Client,
) -> None:
    payload: dict[str, Any] = {
        "prompt": "Here is the English alphabet: ABC",
        "temperature": 0,
        "max_tokens": 32,
        "logit_bias": NO_END_TOKENS,
    }
    unstopped = unstopped_text(http, payload)
    payload["stop"] = [unstopped[5:12]]
    before = engine_stats(http)
    _, choices = collect(http, COMPLETIONS, payload)
    assert choices[0].finish_reason == "stop"
    assert complete(http, COMPLETIONS, payload)["choices"][0]["finish_reason"] == (
        "stop"
    )
    after, _ = wait_until(
        http,
        lambda s: s["finished_requests"] >= before["finished_requests"] + 2,
        started_s=time.monotonic(),
        give_up_s=30,
    )
    assert after is not None
    assert after["finished_requests"] == before["finished_requests"] + 2
    assert after["aborted_requests"] == before["aborted_requests"]
    assert after["aborted_ids"] == before["aborted_ids"]


def test_a_stream_interval_sends_the_same_stopped_answer_every_n_tokens(
    sdk: openai.OpenAI, model_id: str
) -> None:
    """``stream_options.stream_interval`` on the real model, through the openai
    SDK: content every 4 tokens (counted by each chunk's logprobs), the same
    text cut before the stop string, the same finish reason and usage as the
    same request streamed token by token."""
    messages: list[Any] = [{"role": "user", "content": "Count from one to twenty."}]
    answer = (
        sdk.chat.completions.create(
            model=model_id,
            messages=messages,
            temperature=0,
            max_tokens=16,
            logit_bias=NO_END_TOKENS,
        )
        .choices[0]
        .message.content
    )
    assert answer is not None
    middle = len(answer) // 2
    stop = answer[middle : middle + 5]
    streamed: dict[int, tuple[str, list[int], list[str], Any]] = {}
    for every in (1, 4):
        options: Any = {"include_usage": True, "stream_interval": every}
        chunks = list(
            sdk.chat.completions.create(
                model=model_id,
                messages=messages,
                temperature=0,
                max_tokens=16,
                logit_bias=NO_END_TOKENS,
                stop=[stop],
                logprobs=True,
                stream=True,
                stream_options=options,
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        tokens = [
            len(c.choices[0].logprobs.content)
            for c in chunks
            if c.choices and c.choices[0].logprobs and c.choices[0].logprobs.content
        ]
        finish = [c.choices[0].finish_reason for c in chunks if c.choices]
        streamed[every] = (text, tokens, [f for f in finish if f], chunks[-1].usage)
    plain, batched = streamed[1], streamed[4]
    assert batched[0] == plain[0] == stop_reference(answer, [stop])
    assert stop not in batched[0]
    assert batched[2] == plain[2] == ["stop"]
    assert batched[3] == plain[3]  # the usage
    assert sum(batched[1]) == sum(plain[1])
    assert all(n >= 4 for n in batched[1][1:-1]), batched[1]
    assert len(batched[1]) < len(plain[1])
