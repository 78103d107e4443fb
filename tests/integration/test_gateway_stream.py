"""The streaming contract holds through a gateway, whatever the upstream behind it.

Each test runs against two gateways (``sluicegate serve --upstream``): one in
front of sluicegate itself on the default model (the session's llama.cpp
server), one in front of the ``llama-cpp-python`` server on the same GGUF file
(the peer; skipped when ``make peer`` has not made ``bench/.peer-venv``). What
the client receives is built by the gateway's own core from the upstream's
deltas, so each case must hold even where the peer, asked directly, breaks it.

Text is compared at temperature 0: greedy decoding writes the same tokens for
the same request, streamed or not, with or without a stop string.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from sluicegate.check import names
from sluicegate.model import DEFAULT_MODEL_ID, default_model_path

from .forced_calls import FORCED_CALL_MISSING, unfinished_streams
from .gateway import (
    PEER_MODEL,
    READ_TIMEOUT_S,
    api_base,
    is_idle,
    peer_missing,
    running_peer,
    start_gateway,
    wait_for_stats,
)
from .servers import ServerProcess, StartServer
from .wire import (
    NO_END_TOKENS,
    assert_deltas_not_cumulative,
    assert_whole_characters,
    collect,
    complete,
    outside_stop_reason,
    record_stream,
    response_text,
    stop_reference,
    stream_chunks,
)

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
CHECK_TIMEOUT_S = 600
PEER_UNOBSERVABLE = frozenset({"not-cumulative", "multibyte-text", "stop-strings"})
"""Probes that read a chat answer's text: the peer's chat format for the default
model ends every answer at once (``""``, 0 completion tokens, asked directly
too), so through any gateway they have nothing to grade."""
NO_REASONING = frozenset({"reasoning-framing"})
"""The default model does not reason, direct or through a gateway: the probe that
reads reasoning deltas has nothing to grade."""
UNGRADED_HERE = frozenset({"cached-tokens", "time-to-headers"})
"""Probes with nothing to grade on these upstreams: neither reuses a cached
prompt (sluicegate's engine only under ``--prefix-cache``), and the default
model's prefill is too quick for a head-before-content margin to show."""
PEER_FAILS = {
    "structured-output": "the peer refuses a json_schema response_format with a "
    "500 (its request model knows only text and json_object), which the gateway "
    "passes on as a 502",
}
"""Probes the peer fails through any gateway, and why: the gateway passes the
request on as it came, so only the peer could change these."""
PEER_WINDOW_REFUSAL = pytest.mark.xfail(
    strict=True,
    reason="asked to stream a prompt over its window, the peer answers 200 and "
    "an empty body (its error is raised after the headers, so its message never "
    "reaches the gateway): the gateway fails the request before any content, "
    "a 502, not the 400 the peer gives a non-streamed request",
)


@dataclass(frozen=True)
class Route:
    """A gateway, what it serves, and the upstream behind it."""

    name: str
    gateway: ServerProcess
    model: str
    upstream: ServerProcess | None
    """The upstream when it is a sluicegate process (it has ``/engine/stats``)."""
    upstream_url: str


PEER_UPSTREAMS = """\
[[models]]
id = "{model}"
[[models.upstreams]]
url = "{url}"
max_streams = 1
health_path = ""
"""
"""The peer behind the gateway, as it must be served: it runs one request at a
time and stops a running stream (``[DONE]`` without a finish) whenever another
request arrives, a ``GET /v1/models`` included (its ``interrupt_requests``). So
the gateway sends it one stream at a time (``n`` choices queue in the pool) and
no active health check."""


ROUTES = ["sluicegate", "peer"]
"""Both routes run in ``make test`` (which makes bench/.peer-venv first); the
peer's is skipped only where ``make peer`` has not run."""


@pytest.fixture(scope="module", params=ROUTES)
def route(
    request: pytest.FixtureRequest,
    start_server: StartServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Route]:
    """A gateway in front of sluicegate, then one in front of the peer."""
    if request.param == "sluicegate":
        upstream: ServerProcess = request.getfixturevalue("llama_server")
        gateway = start_gateway(
            start_server, "gateway-sluicegate", [api_base(upstream)], DEFAULT_MODEL_ID
        )
        yield Route(
            "sluicegate", gateway, DEFAULT_MODEL_ID, upstream, upstream.base_url
        )
        return
    missing = peer_missing()
    if missing is not None:
        pytest.skip(missing)
    root = tmp_path_factory.mktemp("peer")
    with running_peer(default_model_path(), root) as peer:
        config = root / "upstreams.toml"
        config.write_text(
            PEER_UPSTREAMS.format(model=PEER_MODEL, url=f"{peer.base_url}/v1")
        )
        gateway = start_server(
            "gateway-peer",
            *("--upstreams", str(config), "--log-level", "warning", "--no-ledger"),
        )
        yield Route("peer", gateway, PEER_MODEL, None, peer.base_url)
        gateway.stop()


@pytest.fixture
def http(route: Route) -> Iterator[httpx.Client]:
    """Raw HTTP to the gateway; every read bounded."""
    with httpx.Client(
        base_url=route.gateway.base_url, timeout=READ_TIMEOUT_S
    ) as client:
        yield client


@pytest.fixture(autouse=True)
def nothing_runs_after_the_test(route: Route) -> Iterator[None]:
    """After each test the gateway holds no stream, nor does a sluicegate upstream."""
    yield
    wait_for_stats(route.gateway, is_idle)
    if route.upstream is not None:
        wait_for_stats(route.upstream, is_idle)


def with_model(route: Route, payload: dict[str, Any]) -> dict[str, Any]:
    return {"model": route.model, **payload}


def prepared(
    route: Route, http: httpx.Client, payload: dict[str, Any]
) -> dict[str, Any]:
    """``payload`` for the route's model, its prompt already seen by the peer.

    The peer's greedy answer depends on the request before it: after another
    prompt it decodes the new prompt's tail in one batch; after the same prompt
    (and a generated token) it keeps the prompt's cells and decodes its last
    token again, alone, which moves the logits enough for another greedy answer
    (asked directly: "DEFGH..." first, "DE." on every later request). One
    request with the prompt and two tokens first makes every later one alike.
    """
    payload = with_model(route, payload)
    if route.upstream is None:
        path = CHAT if "messages" in payload else COMPLETIONS
        priming = {k: v for k, v in payload.items() if k not in ("n", "stop")}
        complete(http, path, {**priming, "max_tokens": 2})
    return payload


def unstopped_text(http: httpx.Client, payload: dict[str, Any]) -> str:
    """What the model writes for the completions ``payload`` without ``stop``."""
    without_stop = {k: v for k, v in payload.items() if k != "stop"}
    return response_text(complete(http, COMPLETIONS, without_stop))


def test_a_stop_string_is_held_back_and_never_leaks(
    route: Route, http: httpx.Client
) -> None:
    """Seven characters from the middle of the answer, as a stop string.

    The end tokens are banned so that the answer runs to ``max_tokens`` and
    there is room to cut from, whatever this machine's model writes.
    """
    payload = prepared(
        route,
        http,
        {
            "prompt": "Here is the English alphabet: ABC",
            "temperature": 0,
            "max_tokens": 32,
            "logit_bias": NO_END_TOKENS,
        },
    )
    unstopped = unstopped_text(http, payload)
    third = len(unstopped) // 3
    stop = unstopped[third : third + 7]
    assert len(stop) == 7, unstopped
    payload["stop"] = [stop]
    recorded, choices = collect(http, COMPLETIONS, payload)
    body = complete(http, COMPLETIONS, payload)
    text = choices[0].text

    assert text == stop_reference(unstopped, [stop]), unstopped
    assert text == response_text(body)
    assert stop not in outside_stop_reason(recorded.body, stop)
    assert choices[0].finish_reason == "stop"
    assert body["choices"][0]["finish_reason"] == "stop"


def test_several_stop_strings_end_at_the_earliest(
    route: Route, http: httpx.Client
) -> None:
    stops = ["\n", "Alice:"]
    payload = prepared(
        route,
        http,
        {
            "prompt": "Alice: Hi, Bob!\nBob: Hi,",
            "stop": stops,
            "max_tokens": 8,
            "temperature": 0,
        },
    )
    _, choices = collect(http, COMPLETIONS, payload)
    body = complete(http, COMPLETIONS, payload)
    unstopped = unstopped_text(http, payload)
    text = choices[0].text

    assert text == stop_reference(unstopped, stops), unstopped
    assert text == response_text(body)
    assert all(stop not in text for stop in stops)
    assert choices[0].finish_reason == body["choices"][0]["finish_reason"]


def test_a_held_back_tail_is_flushed_at_the_length_limit(
    route: Route, http: httpx.Client
) -> None:
    """The answer's last characters begin a stop string that never completes.

    They are held back while the stop string may still match, and must be sent
    when the length limit ends the choice: the text is the whole answer.
    """
    payload = prepared(
        route,
        http,
        {
            "prompt": "The quick brown fox",
            "temperature": 0,
            "max_tokens": 12,
            "logit_bias": NO_END_TOKENS,
        },
    )
    unstopped = unstopped_text(http, payload)
    tail = unstopped.rstrip()[-3:]
    assert len(tail) == 3, unstopped
    stop = f"{tail}\u2603\u2603"  # the answer never writes snowmen
    payload["stop"] = [stop]
    _, choices = collect(http, COMPLETIONS, payload)
    body = complete(http, COMPLETIONS, payload)

    assert choices[0].text == unstopped
    assert response_text(body) == unstopped
    assert choices[0].finish_reason == "length"


def test_multi_byte_text_streams_whole_and_equals_the_json_answer(
    route: Route, http: httpx.Client
) -> None:
    payload = prepared(
        route,
        http,
        {
            "messages": [
                {
                    "role": "user",
                    "content": "Reply with exactly these characters and nothing "
                    "else: 😀🔥👍 café 日本語",
                }
            ],
            "temperature": 0,
            "max_tokens": 32,
        },
    )
    recorded, choices = collect(http, CHAT, payload)
    body = complete(http, CHAT, payload)

    recorded.body.decode("utf-8")
    assert_whole_characters(choices[0].deltas)
    assert choices[0].text == response_text(body)


@pytest.mark.parametrize(
    "max_tokens",
    [
        pytest.param(24, id="ends-inside-a-character"),
        pytest.param(22, id="ends-on-a-whole-character"),
    ],
)
def test_emoji_split_across_byte_tokens_stream_whole(
    route: Route, http: httpx.Client, max_tokens: int
) -> None:
    """The default model writes these emoji one byte token at a time.

    In a 9-token period (``🪼``, space, ``🦩``): 22 tokens end on a whole
    character, 24 inside one, which the length limit cuts off.
    """
    payload = prepared(
        route,
        http,
        {
            "prompt": "🦩🪼 🦩🪼 🦩🪼 🦩🪼 🦩",
            "max_tokens": max_tokens,
            "temperature": 0,
        },
    )
    recorded, choices = collect(http, COMPLETIONS, payload)
    whole = response_text(complete(http, COMPLETIONS, payload))

    recorded.body.decode("utf-8")
    assert_whole_characters(choices[0].deltas)
    assert_whole_characters([whole])
    assert choices[0].text == whole
    assert "🪼" in whole or "🦩" in whole, whole


def test_spaces_are_kept_and_deltas_are_not_cumulative(
    route: Route, http: httpx.Client
) -> None:
    payload = prepared(
        route,
        http,
        {"prompt": "The quick brown fox", "max_tokens": 24, "temperature": 0},
    )
    _, choices = collect(http, COMPLETIONS, payload)
    whole = response_text(complete(http, COMPLETIONS, payload))

    assert " " in whole, whole
    assert len(choices[0].deltas) > 1, choices[0].deltas
    assert_deltas_not_cumulative(choices[0].deltas, whole)


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_usage_comes_once_on_a_last_chunk_with_no_choices(
    route: Route, http: httpx.Client, path: str
) -> None:
    prompt = (
        {"messages": [{"role": "user", "content": "Name three colors."}]}
        if path == CHAT
        else {"prompt": "Three colors:"}
    )
    payload = prepared(
        route,
        http,
        {
            **prompt,
            "max_tokens": 10,
            "temperature": 0,
            "stream_options": {"include_usage": True},
        },
    )
    recorded = record_stream(http, path, {**payload, "stream": True})
    chunks = stream_chunks(recorded)
    body = complete(http, path, payload)

    *content, last = chunks
    assert last["choices"] == [], last
    assert all(chunk.get("usage") is None for chunk in content), content
    usage = last["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage == body["usage"]
    # The peer's chat answers end at once (see PEER_UNOBSERVABLE): 0 tokens.
    least = 0 if route.upstream is None and path == CHAT else 1
    assert least <= usage["completion_tokens"] <= 10


def test_finish_reasons_are_stop_and_length(route: Route, http: httpx.Client) -> None:
    """A matched stop string ends with ``stop``, the length limit with ``length``."""
    base = prepared(
        route,
        http,
        {
            "prompt": "The quick brown fox",
            "temperature": 0,
            "logit_bias": NO_END_TOKENS,
        },
    )
    at_length = {**base, "max_tokens": 6}
    unstopped = unstopped_text(http, at_length)
    word = unstopped.split()[1] if len(unstopped.split()) > 1 else unstopped.strip()
    at_stop = {**base, "max_tokens": 6, "stop": [word]}

    _, length_choices = collect(http, COMPLETIONS, at_length)
    _, stop_choices = collect(http, COMPLETIONS, at_stop)

    assert length_choices[0].finish_reason == "length"
    assert complete(http, COMPLETIONS, at_length)["choices"][0]["finish_reason"] == (
        "length"
    )
    assert stop_choices[0].finish_reason == "stop", unstopped
    assert word not in stop_choices[0].text


def test_max_tokens_1_streams_one_token(route: Route, http: httpx.Client) -> None:
    payload = prepared(
        route,
        http,
        {
            "prompt": "The quick brown fox",
            "max_tokens": 1,
            "temperature": 0,
            "logit_bias": NO_END_TOKENS,
            "stream_options": {"include_usage": True},
        },
    )
    recorded = record_stream(http, COMPLETIONS, {**payload, "stream": True})
    chunks = stream_chunks(recorded)
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
    whole = response_text(complete(http, COMPLETIONS, payload))

    assert "".join(texts) == whole
    assert whole, "one token, and it has text"
    assert chunks[-1]["usage"]["completion_tokens"] == 1
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert [f for f in finishes if f is not None] == ["length"]


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_n_2_fans_out_and_sends_done_once(
    route: Route, http: httpx.Client, path: str
) -> None:
    """Two choices from an upstream asked for one at a time; ``[DONE]`` once."""
    prompt = (
        {"messages": [{"role": "user", "content": "Say something."}]}
        if path == CHAT
        else {"prompt": "Once upon a time"}
    )
    payload = prepared(
        route,
        http,
        {
            **prompt,
            "n": 2,
            "max_tokens": 8,
            "temperature": 0,
            "stream_options": {"include_usage": True},
        },
    )
    recorded, choices = collect(http, path, payload)
    body = complete(http, path, payload)

    assert recorded.events.count("[DONE]") == 1
    assert sorted(choices) == [0, 1]
    # Greedy: both choices write the same text, streamed or not.
    assert choices[0].text == choices[1].text == response_text(body, 0)
    assert response_text(body, 1) == response_text(body, 0)
    usage = json.loads(recorded.events[-2])["usage"]
    assert usage["completion_tokens"] == body["usage"]["completion_tokens"]
    assert usage["prompt_tokens"] == body["usage"]["prompt_tokens"]


@pytest.mark.parametrize("stream", [True, False])
def test_a_prompt_longer_than_the_upstreams_window_is_a_400_before_any_byte(
    route: Route, http: httpx.Client, stream: bool, request: pytest.FixtureRequest
) -> None:
    """The gateway does not know the window; the upstream's refusal is its status."""
    if route.upstream is None:
        request.applymarker(PEER_WINDOW_REFUSAL)
    payload = with_model(
        route, {"prompt": "lighthouse " * 3000, "max_tokens": 8, "stream": stream}
    )
    response = http.post(COMPLETIONS, json=payload)

    assert response.status_code == 400, response.text[:2000]
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert isinstance(error["message"], str)
    assert error["message"]
    assert "type" in error


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_stream_headers_are_proxy_safe(
    route: Route, http: httpx.Client, path: str
) -> None:
    prompt = (
        {"messages": [{"role": "user", "content": "Hi."}]}
        if path == CHAT
        else {"prompt": "Hi."}
    )
    recorded, _ = collect(
        http,
        path,
        with_model(route, {**prompt, "max_tokens": 4}),
        {"Accept-Encoding": "gzip"},
    )
    headers = recorded.headers

    assert headers["content-type"].split(";")[0].strip() == "text/event-stream"
    assert "no-cache" in headers["cache-control"]
    assert headers["x-accel-buffering"] == "no"
    assert "content-length" not in headers
    assert "content-encoding" not in headers


def test_sluicegate_check_passes_through_the_gateway(
    route: Route, tmp_path: Path
) -> None:
    """Every probe of ``sluicegate check`` passes against the gateway in
    front of the peer, but those the peer itself fails. In front of
    sluicegate the check runs beside the direct one, every API and verdict
    compared (test_check_live.py). The peer's chat answers are empty
    (``PEER_UNOBSERVABLE``), so its route grades chat only, and the forced
    calls it cannot make end in band as ``tool_call_missing``
    (forced_calls.py), the one reason ``end-states`` may fail here."""
    if route.upstream is not None:
        pytest.skip("graded beside the direct run: test_check_live.py")
    report, saved = tmp_path / "check.json", tmp_path / "recording.json"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "sluicegate", "check", route.gateway.base_url),
            *("--model", route.model, "--max-tokens", "12", "--json", str(report)),
            *("--save", str(saved)),
            # time-to-headers is not graded here (UNGRADED_HERE): a short prompt
            # spares the route a long prefill that grades nothing
            *("--prefill-tokens", "20"),
        ],
        capture_output=True,
        text=True,
        timeout=CHECK_TIMEOUT_S,
        check=False,
    )
    assert report.exists(), done.stdout + done.stderr
    probes = json.loads(report.read_text())["probes"]
    unfinished = unfinished_streams(saved)
    assert unfinished, "the peer's forced calls should end as tool_call_missing"
    assert set(unfinished.values()) == {("errored", FORCED_CALL_MISSING)}, unfinished
    assert set(unfinished) <= {names.TOOLS, names.TOOLS_SERIAL}, unfinished
    unseen = NO_REASONING | UNGRADED_HERE | PEER_UNOBSERVABLE
    unseen |= {"responses-reasoning-framing", "messages-reasoning-framing"}
    expected = set(PEER_FAILS) | {"end-states"}
    failed = [
        p
        for p in probes
        if p["verdict"] != "pass"
        and not (p["verdict"] == "not-observable" and p["probe"] in unseen)
        and not (p["verdict"] == "fail" and p["probe"] in expected)
    ]
    assert not failed, json.dumps(failed, indent=2, ensure_ascii=False)
    # Strict, as an xfail: a peer that starts passing one must be noticed.
    still = {p["probe"] for p in probes if p["verdict"] == "fail"}
    assert still == expected, f"expected the peer to fail {sorted(expected)}"
    assert done.returncode == 1, done.stdout[-4000:]
    assert len(probes) >= 17
