"""A client that goes away aborts the upstream's request, in every phase, across hops.

The picture: client -> (nginx ->) sluicegate gateway -> sluicegate engine. Each
test opens its own socket, closes it while the upstream's request is queued,
in its prefill or decoding, and then polls the *upstream's* ``/engine/stats``:
within 1 s of the close the request counts as aborted there, nothing of it
runs or waits, and it holds no KV cell. The gateway learns of the close from
its server (or from nginx closing its upstream connection) and closes its own
upstream stream, which the upstream sees as its client going away.

One gateway serves three models from a ``--upstreams`` file: ``slot`` (a
scripted engine that decodes one sequence at a time, forever), ``slow`` (a
scripted engine with a 5 s prefill) and the default model on the session's
llama.cpp server.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from sluicegate.model import DEFAULT_MODEL_ID

from .gateway import (
    ABORT_WITHIN_S,
    api_base,
    is_idle,
    stats_of,
    wait_for_stats,
)
from .nginx import running_nginx
from .servers import ServerProcess, StartServer, free_port
from .wire import NO_END_TOKENS, RawExchange

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]

CHAT = "/v1/chat/completions"
PREFILL_DELAY_S = 5.0
STEPS_AFTER_CLOSE = 3
"""As in ``test_disconnect.py``: where one llama.cpp step takes longer than the
1 s contract allows (a busy 2-core machine), an abort at the step boundary right
after the close (the step in flight, one begun before the abort arrived, one of
slack) keeps it."""

UPSTREAMS_FILE = """\
[[models]]
id = "slot"
[[models.upstreams]]
url = "{slot}"
model = "scripted"

[[models]]
id = "slow"
[[models.upstreams]]
url = "{slow}"
model = "scripted"

[[models]]
id = "gemma"
[[models.upstreams]]
url = "{gemma}"
model = "{gemma_model}"
"""

NGINX_BLOCK = """\
upstream gateway {{
    server 127.0.0.1:{gateway_port};
    keepalive 4;
}}
server {{
    listen 127.0.0.1:{port};
    location / {{
        proxy_pass http://gateway;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_set_header Host $host;
        proxy_read_timeout 120s;
    }}
}}
"""

STORY = {
    "messages": [{"role": "user", "content": "Write a long story about a lighthouse."}],
    "max_tokens": 1024,
    "logit_bias": NO_END_TOKENS,
    "stream": True,
}


@pytest.fixture(scope="module")
def slot(start_server: StartServer) -> ServerProcess:
    return start_server(
        "scripted-slot",
        *("--engine", "scripted", "--log-level", "warning", "--no-ledger"),
        *("--scripted-max-running", "1", "--fault", "never-finishes"),
    )


@pytest.fixture(scope="module")
def slow(start_server: StartServer) -> ServerProcess:
    return start_server(
        "scripted-slow",
        *("--engine", "scripted", "--log-level", "warning", "--no-ledger"),
        *("--fault", f"prefill-delay:{PREFILL_DELAY_S}", "--fault", "never-finishes"),
    )


@pytest.fixture(scope="module")
def gateway(
    start_server: StartServer,
    slot: ServerProcess,
    slow: ServerProcess,
    llama_server: ServerProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> ServerProcess:
    config = tmp_path_factory.mktemp("gateway") / "upstreams.toml"
    config.write_text(
        UPSTREAMS_FILE.format(
            slot=api_base(slot),
            slow=api_base(slow),
            gemma=api_base(llama_server),
            gemma_model=DEFAULT_MODEL_ID,
        )
    )
    return start_server(
        "gateway-abort",
        *("--upstreams", str(config), "--log-level", "warning", "--no-ledger"),
    )


@pytest.fixture(scope="module")
def nginx_url(
    gateway: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """nginx on a free port in front of the gateway."""
    root = tmp_path_factory.mktemp("nginx-gateway")
    port = free_port()
    block = NGINX_BLOCK.format(port=port, gateway_port=gateway.port)
    url = f"http://127.0.0.1:{port}"
    with running_nginx(root, [block], [f"{url}/health"]):
        yield url


@pytest.fixture(params=["direct", "nginx"])
def entry(request: pytest.FixtureRequest, gateway: ServerProcess) -> str:
    """Where the client connects: the gateway itself, or nginx in front of it."""
    if request.param == "direct":
        return gateway.base_url
    url: str = request.getfixturevalue("nginx_url")
    return url


@pytest.fixture(autouse=True)
def everything_is_idle_after_the_test(
    gateway: ServerProcess, slot: ServerProcess, slow: ServerProcess
) -> Iterator[None]:
    yield
    for server in (gateway, slot, slow):
        wait_for_stats(server, is_idle)


def first_content(exchange: RawExchange) -> None:
    """Read the stream until its first content delta."""
    assert exchange.read_response().status_code == 200
    for event in exchange.iter_events():
        chunk = json.loads(event)
        if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
            return
    pytest.fail(f"the stream ended before any content: {exchange.events}")


def assert_aborted_within(
    upstream: ServerProcess,
    before: dict[str, Any],
    closed_at_s: float,
    *,
    still_running: int = 0,
) -> dict[str, Any]:
    """One more abort on ``upstream`` since ``before``, within 1 s of the close,
    with nothing of it left (``still_running``: other requests that run on)."""

    def gone(stats: dict[str, Any]) -> bool:
        return bool(
            stats["aborted_requests"] == before["aborted_requests"] + 1
            and stats["queued"] == 0
            and stats["running"] == still_running
        )

    stats, elapsed_s = wait_for_stats(upstream, gone, started_s=closed_at_s)
    assert elapsed_s <= ABORT_WITHIN_S, (
        f"{upstream.name} aborted {elapsed_s:.2f} s after the close "
        f"(contract: {ABORT_WITHIN_S} s): {stats}"
    )
    if still_running == 0:
        assert stats["kv_cells_used"] == 0, stats
    return stats


def test_closing_while_queued_at_the_upstream_aborts_there(
    entry: str, slot: ServerProcess
) -> None:
    """A stream holds the upstream's one slot; the next waits in its queue."""
    payload = {"model": "slot", "messages": [{"role": "user", "content": "Hi"}]}
    direct = {**payload, "model": "scripted", "stream": True}
    with RawExchange(slot.base_url, CHAT, direct) as holder:
        first_content(holder)
        before = stats_of(slot)
        with RawExchange(entry, CHAT, {**payload, "stream": True}) as waiting:
            wait_for_stats(slot, lambda s: s["queued"] == 1)
            closed_at_s = waiting.close()
        assert_aborted_within(slot, before, closed_at_s, still_running=1)
        holder.close()


def test_closing_during_the_upstreams_prefill_aborts_before_any_token(
    entry: str, slow: ServerProcess
) -> None:
    payload = {
        "model": "slow",
        "messages": [{"role": "user", "content": "Hi"}],
        "stream": True,
    }
    before = stats_of(slow)
    with RawExchange(entry, CHAT, payload) as exchange:
        seen, _ = wait_for_stats(slow, lambda s: s["running"] == 1)
        closed_at_s = exchange.close()
    assert seen["generated_tokens"] == before["generated_tokens"], (
        f"the {PREFILL_DELAY_S} s prefill ended before the close: {before} -> {seen}"
    )
    stats = assert_aborted_within(slow, before, closed_at_s)
    assert stats["generated_tokens"] == before["generated_tokens"], stats


def test_closing_while_the_upstream_decodes_aborts_it(
    entry: str, slot: ServerProcess
) -> None:
    payload = {
        "model": "slot",
        "messages": [{"role": "user", "content": "Hi"}],
        "stream": True,
    }
    before = stats_of(slot)
    with RawExchange(entry, CHAT, payload) as exchange:
        first_content(exchange)
        closed_at_s = exchange.close()
    stats = assert_aborted_within(slot, before, closed_at_s)
    time.sleep(0.3)
    assert stats_of(slot)["generated_tokens"] == stats["generated_tokens"]


def test_closing_while_llama_cpp_decodes_frees_its_kv_cells(
    entry: str, llama_server: ServerProcess
) -> None:
    """The default model behind the gateway: the abort frees every KV cell."""
    before = stats_of(llama_server)
    with RawExchange(entry, CHAT, {**STORY, "model": "gemma"}) as exchange:
        first_content(exchange)
        at_close = stats_of(llama_server)
        closed_at_s = exchange.close()

    def gone(stats: dict[str, Any]) -> bool:
        return stats["aborted_requests"] == before["aborted_requests"] + 1 and is_idle(
            stats
        )

    stats, elapsed_s = wait_for_stats(llama_server, gone, started_s=closed_at_s)
    steps = stats["steps"] - at_close["steps"]
    assert elapsed_s <= ABORT_WITHIN_S or steps <= STEPS_AFTER_CLOSE, (
        f"aborted {elapsed_s:.2f} s and {steps} steps after the close: {stats}"
    )
    assert stats["generated_tokens"] - before["generated_tokens"] < 1024


def test_a_non_streamed_request_closed_mid_answer_aborts_the_upstream(
    gateway: ServerProcess, slot: ServerProcess
) -> None:
    """``stream: false`` is streamed upstream too, so a close still reaches it."""
    payload = {
        "model": "slot",
        "messages": [{"role": "user", "content": "Hi"}],
        "stream": False,
    }
    before = stats_of(slot)
    with RawExchange(gateway.base_url, CHAT, payload) as exchange:
        wait_for_stats(
            slot, lambda s: s["generated_tokens"] > before["generated_tokens"]
        )
        closed_at_s = exchange.close()
    assert_aborted_within(slot, before, closed_at_s)


def test_the_upstreams_file_lists_every_model(gateway: ServerProcess) -> None:
    models = httpx.get(f"{gateway.base_url}/v1/models", timeout=10).json()
    assert sorted(m["id"] for m in models["data"]) == ["gemma", "slot", "slow"]
