"""Upstream faults, seen through a gateway: each one ends as the contract says.

The upstreams are scripted sluicegate processes (``--engine scripted``, with
``--fault`` where a test needs one) and, for answers no sluicegate gives, fake
upstreams of ``gateway.py``. Before any content an upstream's refusal is a
failover to another upstream or a status to the client; after it, one in-band
error event and no ``[DONE]``. Every read is bounded, so a stream that hangs
fails its test instead of the session.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from sluicegate.check import names, tools
from sluicegate.check.probes import describe
from sluicegate.core.endstate import EndState
from sluicegate.server.ledger.ledger import LedgerRow, read_rows

from .forced_calls import FORCED_CALL_MISSING, unfinished_streams
from .gateway import (
    READ_TIMEOUT_S,
    FakeUpstream,
    Reply,
    api_base,
    chat_chunk,
    dead_url,
    is_idle,
    start_gateway,
    stats_of,
    usage_chunk,
    wait_for_stats,
)
from .servers import ServerProcess, StartServer, free_port
from .wire import (
    RawExchange,
    SSEReader,
    collect,
    complete,
    outside_stop_reason,
    record_stream,
    response_text,
)

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MODEL = "scripted"
SCRIPTED = ("--engine", "scripted", "--log-level", "warning", "--no-ledger")
HELLO = {"messages": [{"role": "user", "content": "Hello"}], "model": MODEL}


def scripted(start_server: StartServer, name: str, *args: str) -> ServerProcess:
    return start_server(name, *SCRIPTED, *args)


SLOW_PROMPT_TOKENS = 1000
"""A prompt this long prefills slowly on the plain upstream: the one of the
check's time-to-headers exchange (about 3,900 scripted tokens), no other."""


@pytest.fixture(scope="module")
def plain(start_server: StartServer) -> ServerProcess:
    """A scripted upstream without faults but a slow prefill of long prompts."""
    slow = f"prefill-delay:2.5:{SLOW_PROMPT_TOKENS}"
    return scripted(start_server, "scripted-plain", "--fault", slow)


@pytest.fixture(scope="module")
def plain_gateway(start_server: StartServer, plain: ServerProcess) -> ServerProcess:
    return start_gateway(start_server, "gateway-plain", [api_base(plain)], MODEL)


def test_a_gateway_without_upstream_model_serves_the_one_model_its_pool_lists(
    start_server: StartServer, plain: ServerProcess
) -> None:
    gateway = start_server(
        "gateway-listed", "--upstream", api_base(plain), "--log-level", "warning"
    )
    listed = httpx.get(f"{gateway.base_url}/v1/models", timeout=10).json()
    assert [m["id"] for m in listed["data"]] == [MODEL]  # the upstream's own id
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4,
    }
    answer = httpx.post(f"{gateway.base_url}/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["finish_reason"] == "length"


def test_a_gateway_whose_pool_cannot_be_asked_for_its_model_does_not_start() -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    done = subprocess.run(
        [sys.executable, "-m", "sluicegate", "serve", "--upstream", dead],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert f"{dead}/models" in done.stderr, done.stderr
    assert "--upstream-model" in done.stderr


def test_a_gateway_given_a_base_without_v1_says_only_which_base_to_pass(
    plain: ServerProcess,
) -> None:
    """The refusal said "use --upstream BASE/v1" and then "pass --upstream-model
    NAME"; with that flag there is no discovery, so the wrong base would go
    unnoticed until the first request: only the base applies."""
    done = subprocess.run(
        [sys.executable, "-m", "sluicegate", "serve", "--upstream", plain.base_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert f"use --upstream {plain.base_url}/v1" in done.stderr, done.stderr
    assert "--upstream-model" not in done.stderr, done.stderr


def error_event(recorded_events: list[str]) -> dict[str, Any]:
    """The stream's one in-band error event (the last event); no ``[DONE]``."""
    assert "[DONE]" not in recorded_events, recorded_events[-5:]
    assert recorded_events, "no event at all"
    *before, last = recorded_events
    error: dict[str, Any] = json.loads(last)
    assert set(error) - {"obfuscation"} == {"error"}, last  # padded by default
    assert isinstance(error["error"]["message"], str)
    assert all("error" not in json.loads(event) for event in before), before
    return error


# -- the scripted upstream, plain and with faults ----------------------------------


def test_sluicegate_check_passes_through_a_gateway_to_a_scripted_upstream(
    plain_gateway: ServerProcess, tmp_path: Path
) -> None:
    report, saved = tmp_path / "check.json", tmp_path / "recording.json"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "sluicegate", "check", plain_gateway.base_url),
            *("--model", MODEL, "--json", str(report), "--save", str(saved)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert report.exists(), done.stdout + done.stderr
    probes = json.loads(report.read_text())["probes"]
    # The scripted engine writes its script whatever the request asks, so it
    # cannot make the forced call or the JSON the tool and schema probes ask for.
    tool_probes = {
        describe(probe)[0]
        for probe in (
            tools.tool_calls_agree,
            tools.tool_call_deltas,
            tools.tool_call_finish,
            tools.tool_arguments_valid,
            tools.structured_output,
        )
    }
    # The gateway holds it to tool_choice: the forced calls it cannot make end
    # in band as tool_call_missing (forced_calls.py), and end-states fails on
    # them; every other stream must still finish.
    unfinished = unfinished_streams(saved)
    assert unfinished, "the forced calls should end as tool_call_missing"
    assert set(unfinished.values()) == {("errored", FORCED_CALL_MISSING)}, unfinished
    assert set(unfinished) <= {names.TOOLS, names.TOOLS_SERIAL}, unfinished
    # Its script does not reason or reuse a cached prompt: nothing for those
    # probes to grade. Its long prompt prefills slowly: time-to-headers grades.
    unseen = {"reasoning-framing", "cached-tokens"}
    failed = [
        p
        for p in probes
        if p["verdict"] != "pass"
        and p["probe"] not in tool_probes | {"end-states"}
        and not (p["verdict"] == "not-observable" and p["probe"] in unseen)
    ]
    assert not failed, json.dumps(failed, indent=2, ensure_ascii=False)
    assert {p["probe"] for p in probes} >= tool_probes
    verdicts = {p["probe"]: p["verdict"] for p in probes}
    assert verdicts["time-to-headers"] == "pass"
    assert verdicts["end-states"] == "fail"  # on the forced calls alone, above
    assert done.returncode == 1


def test_the_scripted_text_arrives_whole_through_the_gateway(
    plain: ServerProcess, plain_gateway: ServerProcess
) -> None:
    """Streamed through the gateway, the text is the upstream's own answer."""
    with (
        httpx.Client(base_url=plain.base_url, timeout=READ_TIMEOUT_S) as direct,
        httpx.Client(base_url=plain_gateway.base_url, timeout=READ_TIMEOUT_S) as via,
    ):
        expected = response_text(complete(direct, CHAT, HELLO))
        _, choices = collect(via, CHAT, HELLO)
    assert choices[0].text == expected
    assert choices[0].finish_reason == "stop"


def test_an_upstream_error_after_the_first_byte_is_one_error_event(
    start_server: StartServer,
) -> None:
    """``--fault error-after:3``: three steps of content, then the upstream fails."""
    faulty = scripted(
        start_server, "scripted-error-after-3", "--fault", "error-after:3"
    )
    gateway = start_gateway(start_server, "gateway-error", [api_base(faulty)], MODEL)
    with httpx.Client(base_url=gateway.base_url, timeout=READ_TIMEOUT_S) as client:
        recorded = record_stream(client, CHAT, {**HELLO, "stream": True})
        direct = httpx.post(
            f"{faulty.base_url}{CHAT}", json=HELLO, timeout=READ_TIMEOUT_S
        )
        whole = client.post(CHAT, json=HELLO)

    assert recorded.status == 200
    assert recorded.tail == ""
    error_event(recorded.events)
    content = [
        json.loads(e)["choices"][0]["delta"].get("content")
        for e in recorded.events[:-1]
        if json.loads(e)["choices"]
    ]
    assert "".join(c for c in content if c), "content came before the error"
    # stream: false has no first byte before the failure: a status, as direct.
    assert whole.status_code == direct.status_code >= 500, whole.text
    assert "error" in whole.json()
    wait_for_stats(gateway, is_idle)
    wait_for_stats(faulty, is_idle)


def test_a_prompt_longer_than_the_scripted_window_is_a_400_before_any_byte(
    plain_gateway: ServerProcess,
) -> None:
    payload = {"model": MODEL, "prompt": "lighthouse " * 500, "max_tokens": 8}
    with httpx.Client(base_url=plain_gateway.base_url, timeout=READ_TIMEOUT_S) as c:
        for stream in (True, False):
            response = c.post(COMPLETIONS, json={**payload, "stream": stream})
            assert response.status_code == 400, response.text[:2000]
            assert response.json()["error"]["message"]


# -- an upstream that ignores stop strings -----------------------------------------


def leaky_reply(body: dict[str, Any]) -> Reply:
    """The answer ``Hello world! STOP here``, cut so the stop string spans chunks,
    whatever ``stop`` the request carried."""
    pieces = ["Hello", " wor", "ld! S", "TO", "P he", "re."]
    events = [chat_chunk(0, None)]
    events += [chat_chunk(0, piece) for piece in pieces]
    events += [chat_chunk(0, None, "length"), usage_chunk(5, len(pieces)), "[DONE]"]
    return Reply(events=events)


def test_a_stop_string_the_upstream_leaks_never_reaches_the_client(
    start_server: StartServer,
) -> None:
    with FakeUpstream(leaky_reply) as leaky:
        gateway = start_gateway(start_server, "gateway-leaky", [leaky.url], MODEL)
        payload = {**HELLO, "stop": ["STOP"], "stream_options": {"include_usage": True}}
        with httpx.Client(base_url=gateway.base_url, timeout=READ_TIMEOUT_S) as c:
            recorded, choices = collect(c, CHAT, payload)
            whole = complete(c, CHAT, payload)
        forwarded = leaky.requests[0]
        gateway.stop()

    assert choices[0].text == "Hello world! "
    assert choices[0].finish_reason == "stop"
    assert response_text(whole) == "Hello world! "
    assert whole["choices"][0]["finish_reason"] == "stop"
    body = outside_stop_reason(recorded.body, "STOP")
    assert "STOP" not in body
    assert '"S"' not in body  # no prefix of the stop string leaked either
    assert "! S" not in body
    assert forwarded["stream"] is True
    assert forwarded["stop"] == ["STOP"]
    assert forwarded["stream_options"]["include_usage"] is True


# -- two upstreams, one killed mid-stream ------------------------------------------


@dataclass
class StreamRun:
    """One stream read in a thread: its events, its id, whether it ended."""

    events: list[str] = field(default_factory=list)
    response_id: str | None = None
    contents: int = 0
    ended: bool = False
    failure: str | None = None


def read_stream(base_url: str, payload: dict[str, Any], run: StreamRun) -> None:
    reader = SSEReader()
    try:
        with (
            httpx.Client(base_url=base_url, timeout=READ_TIMEOUT_S) as client,
            client.stream("POST", CHAT, json={**payload, "stream": True}) as response,
        ):
            if response.status_code != 200:
                run.failure = f"status {response.status_code}"
                return
            for data in response.iter_raw():
                for event in reader.feed(data):
                    run.events.append(event)
                    if event == "[DONE]":
                        continue
                    chunk = json.loads(event)
                    run.response_id = chunk.get("id", run.response_id)
                    if chunk.get("choices") and chunk["choices"][0]["delta"].get(
                        "content"
                    ):
                        run.contents += 1
        run.ended = True
    except httpx.HTTPError as exc:
        run.failure = repr(exc)


def rows_for(ledger: Path, ids: set[str]) -> dict[str, LedgerRow]:
    """The ledger's ended rows of ``ids``, once all have been written."""
    deadline = time.monotonic() + READ_TIMEOUT_S
    while True:
        rows = {row.request_id: row for row in read_rows(ledger)}
        if ids <= set(rows) or time.monotonic() > deadline:
            return {i: rows[i] for i in ids if i in rows}
        time.sleep(0.05)


def test_killing_one_of_two_upstreams_errors_its_streams_and_spares_the_rest(
    start_server: StartServer, tmp_path: Path
) -> None:
    """``kill -9`` one upstream while four streams run, two on each.

    Its streams get one in-band error each (no ``[DONE]``) and the ledger says
    ``errored``; the other upstream's streams finish; new requests go to the
    survivor. No stream may hang: reads are bounded, threads joined with a limit.
    """
    script = tmp_path / "long.txt"
    script.write_text("word " * 400)
    args = (*SCRIPTED, "--scripted-text", str(script), "--scripted-rate", "50")
    doomed = ServerProcess("scripted-doomed", args, tmp_path)
    try:
        doomed.wait_healthy()
        survivor = start_server("scripted-survivor", *args)
        ledger = tmp_path / "gateway.sqlite3"
        gateway = start_gateway(
            start_server,
            "gateway-two",
            [api_base(doomed), api_base(survivor)],
            MODEL,
            "--ledger",
            str(ledger),
        )
        payload = {**HELLO, "max_tokens": 100}
        runs = [StreamRun() for _ in range(4)]
        threads = [
            threading.Thread(target=read_stream, args=(gateway.base_url, payload, r))
            for r in runs
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + READ_TIMEOUT_S
        while min(r.contents for r in runs) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert min(r.contents for r in runs) >= 3, runs
        on_doomed = stats_of(doomed)["running"]
        doomed.process.kill()
        doomed.process.wait(10)
        for thread in threads:
            thread.join(READ_TIMEOUT_S + 5)
        assert not any(t.is_alive() for t in threads), "a stream hung"
    finally:
        doomed.stop()

    assert on_doomed == 2, "the gateway spreads streams over its upstreams"
    assert all(r.failure is None for r in runs), [r.failure for r in runs]
    errored = [r for r in runs if "[DONE]" not in r.events]
    finished = [r for r in runs if "[DONE]" in r.events]
    assert len(errored) == on_doomed
    for run in errored:
        # the upstream's address is internal: the log names it, never the client
        message = error_event(run.events)["error"]["message"]
        assert f":{doomed.port}" not in message, message
    for run in finished:
        assert run.events[-1] == "[DONE]"
        assert run.contents == 100

    with httpx.Client(base_url=gateway.base_url, timeout=READ_TIMEOUT_S) as client:
        before = stats_of(survivor)["finished_requests"]
        for _ in range(3):
            _, choices = collect(client, CHAT, {**payload, "max_tokens": 5})
            assert choices[0].finish_reason == "length"
    assert stats_of(survivor)["finished_requests"] == before + 3

    rows = rows_for(ledger, {r.response_id for r in runs if r.response_id})
    assert len(rows) == 4, rows
    for run in errored:
        assert rows[str(run.response_id)].end_state is EndState.ERRORED
    for run in finished:
        assert rows[str(run.response_id)].end_state is EndState.FINISHED
    wait_for_stats(gateway, is_idle)


# -- failover before content, and refusals passed through -------------------------


def test_an_upstream_that_refuses_to_connect_is_skipped(
    start_server: StartServer, plain: ServerProcess
) -> None:
    """The first upstream's port has no listener; every client gets a normal stream."""
    gateway = start_gateway(
        start_server, "gateway-dead-first", [dead_url(), api_base(plain)], MODEL
    )
    before = stats_of(plain)["finished_requests"]
    with httpx.Client(base_url=gateway.base_url, timeout=READ_TIMEOUT_S) as client:
        for _ in range(3):
            _, choices = collect(client, CHAT, HELLO)
            assert choices[0].finish_reason == "stop"
            assert choices[0].text
    assert stats_of(plain)["finished_requests"] == before + 3


def test_an_upstream_with_a_full_queue_answers_503_and_the_other_serves(
    start_server: StartServer, plain: ServerProcess
) -> None:
    """One stream holds the only slot of an upstream with no queue: it answers 503.

    Through a gateway that lists it first, every request still gets a normal
    stream from the other upstream, and the full one serves none of them.
    """
    full = scripted(
        start_server,
        "scripted-full",
        *("--scripted-max-running", "1", "--scripted-max-queued", "0"),
        *("--fault", "never-finishes"),
    )
    gateway = start_gateway(
        start_server, "gateway-full-first", [api_base(full), api_base(plain)], MODEL
    )
    with RawExchange(full.base_url, CHAT, {**HELLO, "stream": True}) as holder:
        assert holder.read_response().status_code == 200
        next(holder.iter_events())
        refused = httpx.post(f"{full.base_url}{CHAT}", json=HELLO, timeout=10)
        assert refused.status_code == 503, refused.text
        full_before = stats_of(full)
        plain_before = stats_of(plain)["finished_requests"]
        with httpx.Client(base_url=gateway.base_url, timeout=READ_TIMEOUT_S) as c:
            for _ in range(3):
                _, choices = collect(c, CHAT, HELLO)
                assert choices[0].finish_reason == "stop"
        full_after = stats_of(full)
        holder.close()
    assert stats_of(plain)["finished_requests"] == plain_before + 3
    assert full_after["finished_requests"] == full_before["finished_requests"]
    assert full_after["running"] == 1  # only the holder
    wait_for_stats(full, is_idle)


def too_many_requests(body: dict[str, Any]) -> Reply:
    return Reply(
        status=429,
        headers={"Retry-After": "7"},
        body={
            "error": {
                "message": "rate limit reached for requests",
                "type": "requests",
                "code": "rate_limit_exceeded",
                "param": None,
            }
        },
    )


@pytest.fixture(scope="module")
def limited_gateway(start_server: StartServer) -> Iterator[ServerProcess]:
    """A gateway whose only upstream answers every POST with 429, ``Retry-After: 7``."""
    with FakeUpstream(too_many_requests) as limited:
        gateway = start_gateway(start_server, "gateway-429", [limited.url], MODEL)
        yield gateway
        gateway.stop()


@pytest.mark.parametrize("stream", [True, False])
def test_an_upstream_429_is_a_503_with_its_retry_after(
    limited_gateway: ServerProcess, stream: bool
) -> None:
    """The upstream's 429 is the gateway's own limit there: the client gets
    503, the wait, and a message of the gateway's (no upstream words)."""
    with httpx.Client(base_url=limited_gateway.base_url, timeout=READ_TIMEOUT_S) as c:
        response = c.post(CHAT, json={**HELLO, "stream": stream})

    assert response.status_code == 503, response.text
    assert response.headers["retry-after"] == "7"
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert error["message"] == "the upstream is overloaded (429); retry later"
    assert set(error) >= {"message", "type", "param", "code"}
    assert "rate limit reached" not in response.text


# -- a 200 that fails before any content --------------------------------------------


@pytest.fixture(scope="module")
def fails_at_once(start_server: StartServer) -> ServerProcess:
    """A scripted upstream whose every sequence fails at its first decode step:
    a 200 and the role chunk, then an in-band error, before any content."""
    return scripted(start_server, "scripted-error-after-0", "--fault", "error-after:0")


@pytest.mark.parametrize("stream", [True, False])
def test_an_upstream_that_fails_before_any_content_is_a_status(
    start_server: StartServer, fails_at_once: ServerProcess, stream: bool
) -> None:
    """The upstream's 200 is not the client's: its failure is a 502, no stream."""
    gateway = start_gateway(
        start_server,
        f"gateway-fails-at-once-{stream}",
        [api_base(fails_at_once)],
        MODEL,
    )
    with httpx.Client(base_url=gateway.base_url, timeout=READ_TIMEOUT_S) as client:
        direct = record_stream(
            client, f"{fails_at_once.base_url}{CHAT}", {**HELLO, "stream": True}
        )
        response = client.post(CHAT, json={**HELLO, "stream": stream})

    assert direct.status == 200  # asked directly: 200, then the error in band
    error_event(direct.events)
    assert response.status_code == 502, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert "before any content" in response.json()["error"]["message"]
    wait_for_stats(gateway, is_idle)
    wait_for_stats(fails_at_once, is_idle)


def test_an_upstream_that_fails_before_any_content_fails_over(
    start_server: StartServer, fails_at_once: ServerProcess, plain: ServerProcess
) -> None:
    """Listed first, it fails each request it takes; the other upstream answers
    every one with a normal stream."""
    gateway = start_gateway(
        start_server,
        "gateway-fails-at-once-first",
        [api_base(fails_at_once), api_base(plain)],
        MODEL,
    )
    failed_before = stats_of(fails_at_once)["failed_requests"]
    finished_before = stats_of(plain)["finished_requests"]
    with httpx.Client(base_url=gateway.base_url, timeout=READ_TIMEOUT_S) as client:
        for stream in (True, False, True):
            if stream:
                recorded, choices = collect(client, CHAT, HELLO)
                assert recorded.status == 200
                assert choices[0].finish_reason == "stop"
                assert choices[0].text
            else:
                body = complete(client, CHAT, HELLO)
                assert response_text(body)
    assert stats_of(plain)["finished_requests"] == finished_before + 3
    assert stats_of(fails_at_once)["failed_requests"] > failed_before


def empty_200(body: dict[str, Any]) -> Reply:
    """A 200 with event-stream headers, then the connection closes: no event."""
    return Reply(events=())


@pytest.mark.parametrize("stream", [True, False])
def test_a_200_that_closes_without_an_event_is_a_502(
    start_server: StartServer, stream: bool
) -> None:
    with FakeUpstream(empty_200) as silent:
        gateway = start_gateway(
            start_server, f"gateway-empty-200-{stream}", [silent.url], MODEL
        )
        with httpx.Client(base_url=gateway.base_url, timeout=READ_TIMEOUT_S) as c:
            response = c.post(CHAT, json={**HELLO, "stream": stream})
        gateway.stop()
    assert response.status_code == 502, response.text
    assert "before any content" in response.json()["error"]["message"]
    assert silent.requests, "the upstream was asked"
