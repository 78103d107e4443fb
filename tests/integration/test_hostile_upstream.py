"""A hostile upstream behind a real gateway: each attack ends clearly, nothing stalls.

One gateway process serves a ``hostile`` model from ``hostile_upstream.py`` (its
own process, misbehaving on command) and a ``scripted`` model from a paced
scripted sluicegate. Each test runs one attack under ``Harness.attack`` and
asserts four things:

- the client's answer: a status before any content (OpenAI's error shape), or
  exactly one in-band error event and no ``[DONE]`` after it;
- no secret: the upstream's key is in none of the gateway's log, ledger file
  or metrics after any attack (``Harness.assert_no_secret``);
- the ledger row: closed, and its status and end state are the client's;
- the gateway's memory: its peak RSS grew at most ``MEMORY_BOUND_BYTES``
  during the attack (``/proc/PID/clear_refs`` resets the peak first);
- its liveness: ordinary streams of the scripted model, run back to back by
  another process during the attack, all finished with no gap, time to first
  token or ``/health`` answer past ``WEDGED_S`` (1 s; a wedged loop). The
  issue's own bounds (no gap over 50 ms caused by the attack, ``/health``
  within 100 ms) are measured, not asserted: with
  ``SLUICEGATE_LIVENESS_REPORT=FILE`` the figures of every attack, and of a
  window without one, are written there (docs/security.md, "Liveness under
  attack", quotes them).
"""

from __future__ import annotations

import json
import string
import time
from typing import Any

import anthropic
import openai
import pytest

from sluicegate.core.endstate import EndState

from . import hostile_upstream as fake
from .hostile import (
    ANSWERED_WITHIN_S,
    BRIEF_FIRST_TOKEN_LIMIT_S,
    COUNT_LIMIT_S,
    DISCOVERY_GIVE_UP_S,
    GET_WEATHER,
    HOSTILE,
    HOSTILE_BRIEF,
    answered_in_time,
    finishes,
    refused,
    send,
)
from .hostile_harness import DrippingStartUp, Harness, dripping_start_up, harness

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(120),
    # started with the module: it waits out its deadline while the attacks run
    pytest.mark.usefixtures("dripping_start_up"),
]
__all__ = ["dripping_start_up", "harness"]  # the module's fixtures


def test_without_an_attack_the_probe_streams_are_live(harness: Harness) -> None:
    """The window every attack is compared with (figures: ``no attack``)."""
    with harness.attack("no attack", expected_rows=0) as measured:
        time.sleep(0.6)
    measured.assert_live()
    measured.assert_memory_bounded()
    assert measured.rows == []


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_valid_stream_cut_in_random_pieces_arrives_whole(
    harness: Harness, seed: int
) -> None:
    with harness.client() as client, harness.attack(f"splits:{seed}") as measured:
        seen = send(client, f"attack:splits:{seed}")
    finishes(seen)
    assert seen.events[-1] == "[DONE]", seen.events[-3:]
    assert seen.text == "".join(
        word + " " for word in fake.SPLIT_TEXT.split(" ") if word
    )
    row = measured.assert_row_matches(seen)
    assert row.completion_tokens == len(fake.SPLIT_TEXT.split())
    measured.assert_memory_bounded()
    measured.assert_live()


@pytest.mark.parametrize(
    "number",
    ["9000000000000000000", "100000000000000000000", "-5", "1.5", '"7"', "1e300"],
)
def test_usage_an_upstream_cannot_mean_is_replaced_by_the_gateways_count(
    harness: Harness, number: str
) -> None:
    """Past 64 bits, past the context, negative, fractional, a string: the row and
    the client's usage are sluicegate's own count, marked estimated, and the
    ledger's writer lives on (the probe's rows after it are written)."""
    with harness.client() as client, harness.attack(f"usage:{number}") as measured:
        seen = send(client, f"attack:usage:{number}", usage=True)
    finishes(seen)
    assert seen.text == "Counted wrong."
    usage = seen.usage
    assert usage is not None, seen.events[-3:]
    assert 0 < usage["completion_tokens"] <= 10, usage
    assert 0 <= usage["prompt_tokens"] <= 8192, usage
    row = measured.assert_row_matches(seen)
    assert 0 < row.completion_tokens <= 10, row
    assert 0 <= row.prompt_tokens <= 8192, row
    assert row.usage_estimated, row
    measured.assert_memory_bounded()
    measured.assert_live()


@pytest.mark.parametrize("kind", ["content", "reasoning"])
def test_an_upstream_past_max_tokens_is_cut_at_max_tokens(
    harness: Harness, kind: str
) -> None:
    """50 chunks when 5 tokens were asked for: the client (the openai SDK) gets
    the first 5, finish_reason length, and a usage (and a ledger row) of the 5
    it got, not the upstream's 50."""
    client = openai.OpenAI(
        base_url=f"{harness.gateway.base_url}/v1", api_key="unused", max_retries=0
    )
    with harness.attack(f"overrun:{kind}") as measured:
        stream = client.chat.completions.create(
            model=HOSTILE,
            messages=[{"role": "user", "content": f"attack:overrun:50:{kind}"}],
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    field = "content" if kind == "content" else "reasoning_content"
    assert "".join(getattr(d, field, None) or "" for d in deltas) == "w " * 5
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert [r for r in reasons if r] == ["length"]
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.completion_tokens == 5, usage
    assert [row.completion_tokens for row in measured.rows] == [5]
    measured.assert_live()


@pytest.mark.parametrize("interval", [None, 16])
def test_reasoning_and_content_in_one_write_stay_in_chunks_of_their_own(
    harness: Harness, interval: int | None
) -> None:
    """Two reasoning chunks then two content chunks in one write, read faster
    than the client takes them (``stream_interval`` 16: always): no chunk the
    client gets (the openai SDK) has both, and all the reasoning comes first."""
    client = openai.OpenAI(
        base_url=f"{harness.gateway.base_url}/v1", api_key="unused", max_retries=0
    )
    options: Any = {"include_usage": True}  # stream_interval: not in the SDK's type
    if interval is not None:
        options["stream_interval"] = interval
    name = f"reasoning_then_content, interval {interval}"
    with harness.attack(name, expected_rows=5) as measured:
        for _ in range(5):  # a lagging writer is likely, not certain, without one
            stream = client.chat.completions.create(
                model=HOSTILE,
                messages=[{"role": "user", "content": "attack:reasoning_then_content"}],
                stream=True,
                stream_options=options,
            )
            kinds: list[str] = []
            texts: dict[str, str] = {"reasoning_content": "", "content": ""}
            for c in stream:
                for choice in c.choices:
                    delta = choice.delta.model_dump()
                    present = [k for k in texts if delta.get(k)]
                    assert len(present) <= 1, delta
                    for k in present:
                        kinds.append(k)
                        texts[k] += delta[k]
            assert texts == {
                "reasoning_content": "".join(fake.REASONING),
                "content": "".join(fake.CONTENT),
            }
            assert kinds == sorted(kinds, key=["reasoning_content", "content"].index)
    assert len(measured.rows) == 5
    measured.assert_live()


def test_two_calls_with_one_id_reach_every_api_with_distinct_ids(
    harness: Harness,
) -> None:
    """The upstream gives both its calls the id ``same``: chat (streamed, the
    openai SDK), Responses (``call_id``) and Messages (``tool_use.id``, the
    anthropic SDK) each get two calls with two ids (S20)."""
    base = harness.gateway.base_url
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    claude = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
    ask = "attack:same_call_ids"
    chat_tool: Any = GET_WEATHER
    function: Any = GET_WEATHER["function"]
    response_tool: Any = {"type": "function", **function}
    with harness.attack("same_call_ids", expected_rows=3) as measured:
        stream = client.chat.completions.create(
            model=HOSTILE,
            messages=[{"role": "user", "content": ask}],
            tools=[chat_tool],
            stream=True,
        )
        chat = [
            call.id
            for c in stream
            for choice in c.choices
            for call in choice.delta.tool_calls or []
            if call.id is not None
        ]
        response = client.responses.create(
            model=HOSTILE,
            input=ask,
            tools=[response_tool],
        )
        responses = [i.call_id for i in response.output if i.type == "function_call"]
        item_ids = [i.id for i in response.output if i.type == "function_call"]
        message = claude.messages.create(
            model=HOSTILE,
            max_tokens=64,
            messages=[{"role": "user", "content": ask}],
            tools=[
                {
                    "name": "get_weather",
                    "input_schema": function["parameters"],
                }
            ],
        )
        messages = [b.id for b in message.content if b.type == "tool_use"]
    for ids in (chat, responses, item_ids, messages):
        assert len(set(ids)) == len(ids) == 2, ids
    assert len(measured.rows) == 3
    measured.assert_live()


def test_an_upstreams_content_filter_finish_reaches_every_api(
    harness: Harness,
) -> None:
    """``finish_reason: content_filter`` is chat's as it came (the openai SDK),
    Responses' ``incomplete`` with reason ``content_filter``, and Messages'
    ``refusal`` (the anthropic SDK); never ``stop``."""
    base = harness.gateway.base_url
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    claude = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
    ask = "attack:finish:content_filter"
    with harness.attack("finish:content_filter", expected_rows=4) as measured:
        stream = client.chat.completions.create(
            model=HOSTILE, messages=[{"role": "user", "content": ask}], stream=True
        )
        reasons = [ch.finish_reason for c in stream for ch in c.choices]
        whole = client.chat.completions.create(
            model=HOSTILE, messages=[{"role": "user", "content": ask}]
        )
        response = client.responses.create(model=HOSTILE, input=ask)
        message = claude.messages.create(
            model=HOSTILE, max_tokens=64, messages=[{"role": "user", "content": ask}]
        )
    assert [r for r in reasons if r] == ["content_filter"]
    assert whole.choices[0].finish_reason == "content_filter"
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "content_filter"
    assert message.stop_reason == "refusal"
    assert len(measured.rows) == 4
    measured.assert_live()


def test_an_upstream_cut_at_max_tokens_sees_its_connection_closed(
    harness: Harness,
) -> None:
    """After the cut the gateway closes the upstream request (the upstream
    aborts it and frees its cache) instead of reading on: an upstream that
    writes chunks until its peer leaves sees it leave, not its own limit."""
    client = openai.OpenAI(
        base_url=f"{harness.gateway.base_url}/v1", api_key="unused", max_retries=0
    )
    with harness.attack("overrun:endless") as measured:
        chunks = list(
            client.chat.completions.create(
                model=HOSTILE,
                messages=[
                    {"role": "user", "content": "attack:overrun:endless:content"}
                ],
                max_tokens=5,
                stream=True,
            )
        )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "w " * 5
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    deadline = time.monotonic() + 10  # the upstream writes for 60 s otherwise
    while (stats := harness.upstream_stats())["endless_ended"] != "peer closed":
        assert time.monotonic() < deadline, stats
        time.sleep(0.1)
    measured.assert_live()


@pytest.mark.parametrize(
    ("count", "shape"),
    [(4000, "same"), (4000, "many"), (100_000, "same"), (100_000, "many")],
)
def test_a_chunk_of_thousands_of_tool_call_deltas_never_stalls_the_gateway(
    harness: Harness, count: int, shape: str
) -> None:
    """``same``: every delta adds to one call's arguments; ``many``: each is a
    call. Under the reader's limits the calls arrive whole; past them, a 502."""
    name = f"tool_deltas:{count}:{shape}"
    with harness.client() as client, harness.attack(name) as measured:
        seen = send(client, f"attack:{name}", tools=[GET_WEATHER])
    answered_in_time(seen)
    if seen.status == 200:
        finishes(seen)
        calls = 1 if shape == "same" else count
        assert seen.tool_names == ["get_weather"] * calls
    else:
        refused(seen)
    measured.assert_row_matches(seen)
    measured.assert_memory_bounded()
    measured.assert_live()


@pytest.mark.parametrize(
    ("code", "when"),
    [
        ("⁵⁰³", "before"),  # superscript digits: str.isdigit() is true, int() fails
        ("⁵⁰³", "after"),
        ("٥٠٣", "before"),  # Arabic-Indic digits: int() reads 503
        ("99999999999999999999", "before"),
        ("503", "before"),
    ],
)
def test_an_error_event_with_any_code_gets_the_client_a_clear_answer(
    harness: Harness, code: str, when: str
) -> None:
    name = f"error_code:{code}:{when}"
    with harness.client() as client, harness.attack(name) as measured:
        seen = send(client, f"attack:{name}")
    answered_in_time(seen)
    if when == "after":
        seen.in_band_error()
    else:
        refused(seen, {502, 503})
    measured.assert_row_matches(seen)
    measured.assert_live()


@pytest.mark.parametrize("when", ["before", "after"])
def test_an_sse_line_that_never_ends_is_cut_at_the_line_limit(
    harness: Harness, when: str
) -> None:
    """The gateway ends the stream and closes the upstream's connection: the
    upstream saw its peer leave after a few MiB, not after its own limit."""
    with harness.client() as client, harness.attack(f"endless:{when}") as measured:
        seen = send(client, f"attack:endless_line:{when}")
    answered_in_time(seen)
    if when == "after":
        seen.in_band_error()
    else:
        refused(seen)
    deadline = time.monotonic() + 5
    while (stats := harness.upstream_stats())["endless_ended"] != "peer closed":
        assert time.monotonic() < deadline, stats
        time.sleep(0.1)
    assert stats["endless_bytes"] <= 32 << 20, stats
    measured.assert_row_matches(seen)
    measured.assert_memory_bounded()
    measured.assert_live()


def test_two_hundred_thousand_one_character_deltas_reach_a_fast_reader(
    harness: Harness,
) -> None:
    """200,000 deltas in one write: the gateway reads them faster than it
    writes them one by one, yet a client that reads its socket as fast as it
    can gets them all (coalesced) and ``[DONE]``, and the row says finished
    with every token counted, not aborted; and the other streams and new
    requests go on meanwhile (the reader feeds a long read in pieces, letting
    the loop run between them)."""
    count = 200_000
    with harness.client() as client, harness.attack("many_deltas") as measured:
        # Asked for them all: past max_tokens the gateway would cut the stream.
        seen = send(client, f"attack:many_deltas:{count}", max_tokens=count)
    finishes(seen)
    assert seen.events[-1] == "[DONE]", seen.events[-3:]
    assert seen.text == "".join(string.ascii_lowercase[i % 26] for i in range(count))
    row = measured.assert_row_matches(seen)
    assert row.end_state is EndState.FINISHED
    assert row.completion_tokens == count
    measured.assert_memory_bounded()
    measured.assert_live()


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_50_mib_delta_ends_the_stream_with_an_error(
    harness: Harness, when: str
) -> None:
    with harness.client() as client, harness.attack(f"huge_delta:{when}") as measured:
        seen = send(client, f"attack:huge_delta:50:{when}")
    answered_in_time(seen)
    if when == "after":
        seen.in_band_error()
    else:
        refused(seen)
    assert len(seen.body) < 2 << 20
    measured.assert_row_matches(seen)
    measured.assert_memory_bounded()
    measured.assert_live()


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_call_of_a_tool_never_offered_is_an_error_not_a_forwarded_call(
    harness: Harness, when: str
) -> None:
    name = f"unoffered_tool:{when}"
    with harness.client() as client, harness.attack(name) as measured:
        seen = send(client, f"attack:{name}", tools=[GET_WEATHER])
    assert "delete_everything" not in seen.tool_names
    if when == "after":
        seen.in_band_error()
    else:
        refused(seen)
    measured.assert_row_matches(seen)
    measured.assert_live()


SECRET_PATHS = [
    ("echo_key:400", {400}),
    ("echo_key:401", {502}),
    ("echo_key:403", {502}),
    ("echo_key:404", {502}),
    ("echo_key:429", {503}),
    ("echo_key:500", {502}),
    ("echo_key:503", {503}),
    ("bad_status_line", {502}),
    ("bad_header_line", {502}),
    ("inband_key:before", {502}),
    ("inband_key:after", {200}),
]


@pytest.mark.parametrize(("attack", "statuses"), SECRET_PATHS)
def test_the_upstreams_key_never_reaches_a_client_a_log_or_the_ledger(
    harness: Harness, attack: str, statuses: set[int]
) -> None:
    """Each error path that quotes the key it was sent (as OpenAI's own 401
    does): the client gets the status of the upstreams table, and the key is in
    no body, header, log line, metric or ledger byte."""
    with harness.client() as client, harness.attack(attack) as measured:
        seen = send(client, f"attack:{attack}")
    if seen.status == 200:
        assert statuses == {200}, seen.events
        seen.in_band_error()
    else:
        refused(seen, statuses)
    harness.assert_no_secret(seen.body, json.dumps(dict(seen.headers)))
    measured.assert_row_matches(seen)
    measured.assert_memory_bounded()
    measured.assert_live()


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_an_upstream_redirect_is_never_followed(harness: Harness, status: int) -> None:
    before = harness.upstream_stats()["other_host_hits"]
    with harness.client() as client, harness.attack(f"redirect:{status}") as measured:
        seen = send(client, f"attack:redirect:{status}")
    refused(seen)
    assert fake.OTHER_HOST_MARK.encode() not in seen.body
    assert harness.upstream_stats()["other_host_hits"] == before
    measured.assert_row_matches(seen)
    measured.assert_live()


@pytest.mark.parametrize("status", [429, 503])
def test_an_upstreams_retry_after_is_clamped_to_an_hour(
    harness: Harness, status: int
) -> None:
    with (
        harness.client() as client,
        harness.attack(f"retry_after:{status}") as measured,
    ):
        seen = send(client, f"attack:retry_after:{status}")
    refused(seen, {503})  # the upstream's overload, not the client's quota
    assert 0 <= float(seen.headers["retry-after"]) <= 3600, seen.headers
    measured.assert_row_matches(seen)
    measured.assert_live()


@pytest.mark.parametrize("status", [407, 408, 418])
def test_an_upstream_status_outside_the_table_is_normalized(
    harness: Harness, status: int
) -> None:
    with harness.client() as client, harness.attack(f"status:{status}") as measured:
        seen = send(client, f"attack:status:{status}")
    refused(seen, {502, 504})
    measured.assert_row_matches(seen)
    measured.assert_live()


def test_a_flood_of_empty_chunks_never_stalls_the_gateway(harness: Harness) -> None:
    """Chunks with nothing in them, as fast as loopback goes: no content, so the
    stream ends by the brief model's time to first token limit (4 s) or the
    reader's bound on a body's bytes (256 MiB), whichever comes first; the
    other streams stay live the whole time (the attack that costs the gateway
    most CPU per second). The upstream answered 200, so the client's head may
    go before the end (a heartbeat's worth after the upstream's 200): then the
    end is one in-band error, not a status."""
    with harness.client() as client, harness.attack("flood:empty") as measured:
        seen = send(client, "attack:flood:empty", model=HOSTILE_BRIEF)
    assert seen.elapsed_s < BRIEF_FIRST_TOKEN_LIMIT_S + ANSWERED_WITHIN_S, (
        seen.elapsed_s
    )
    if seen.status == 200:
        assert seen.text == ""
        assert seen.in_band_error()["code"], seen.events[-3:]
    else:
        refused(seen, {502, 504})
    measured.assert_row_matches(seen)
    measured.assert_memory_bounded()
    measured.assert_live()


def test_a_token_counter_slower_than_its_limit_is_said_to_be_slow(
    harness: Harness,
) -> None:
    """count_tokens said "offers no token counter" of one that answered after
    the gateway's wait; it now says it was too slow (a 504), keeps serving,
    and asks again next time (where every counter answers 404: none)."""
    asked = {"model": HOSTILE, "max_tokens": 8}
    before = harness.upstream_stats()["attacks"].get("slow_count", 0)
    with harness.client() as client, harness.attack("slow_count", 0) as measured:
        messages = [{"role": "user", "content": "attack:slow_count"}]
        slow = client.post(
            "/v1/messages/count_tokens", json={**asked, "messages": messages}
        )
        messages = [{"role": "user", "content": "Hi"}]
        none = client.post(
            "/v1/messages/count_tokens", json={**asked, "messages": messages}
        )
    assert slow.status_code == 504, slow.text
    error = slow.json()["error"]
    assert f"did not answer within {COUNT_LIMIT_S:g} s" in error["message"], error
    assert "offers no token counter" not in error["message"]
    assert none.status_code == 400, none.text
    assert "offers no token counter" in none.json()["error"]["message"]
    assert harness.upstream_stats()["attacks"]["slow_count"] == before + 1
    assert measured.rows == []
    measured.assert_live()


@pytest.mark.parametrize(
    "attack", ["garbage:1", "garbage:2", "garbage:3", "garbage_raw:1", "garbage_raw:2"]
)
def test_random_garbage_from_the_upstream_is_a_502(
    harness: Harness, attack: str
) -> None:
    with harness.client() as client, harness.attack(attack) as measured:
        seen = send(client, f"attack:{attack}")
    answered_in_time(seen)
    refused(seen)
    measured.assert_row_matches(seen)
    measured.assert_memory_bounded()
    measured.assert_live()


def test_discovery_from_an_upstream_that_drips_fails_with_its_name(
    dripping_start_up: DrippingStartUp,
) -> None:
    """``/v1/models`` one byte a second: start-up gives up by its deadline,
    with a message naming the upstream (a per-read timeout never fires). The
    start-up began with the module (``dripping_start_up``)."""
    start_up = dripping_start_up
    start_up.wait(DISCOVERY_GIVE_UP_S)
    if start_up.elapsed_s is None:
        pytest.fail(f"start-up still waiting after {DISCOVERY_GIVE_UP_S} s")
    assert start_up.process.returncode != 0, start_up.stderr
    assert start_up.url in start_up.stderr, start_up.stderr
    assert start_up.elapsed_s < DISCOVERY_GIVE_UP_S, start_up.elapsed_s
