"""Streams that survive the real world, end to end against server subprocesses.

Every test runs ``sluicegate serve --engine scripted`` with a fault where it needs
one, and an SQLite ledger in a temp dir where it reads rows:

- each end state (finished, errored, aborted, rejected, and truncated as the
  client sees a server killed mid-stream), reached through a real HTTP client,
  with the ledger row agreeing with the client's classification;
- a tokens-per-minute quota: 429 with ``Retry-After``, the refused request never
  reaches the engine, and after ``Retry-After`` seconds the same request passes;
- heartbeats through a 5 s prefill, comments about every second, the ``openai``
  SDK unaffected;
- behind real nginx with the shipped ``deploy/nginx/sluicegate.conf``
  (``proxy_read_timeout 3s``, default buffering): a 10 s prefill survives thanks
  to 1 s heartbeats (and, as a control, fails without them), and events arrive
  as they are written;
- a client that stops reading: server RSS stays bounded while the engine keeps
  generating, and the stream is aborted after the stuck timeout (the 60 s
  version is ``bench/chaos.py --stuck-reader 60``).

No test asserts a server timing beyond the contracts themselves (heartbeat
interval, stuck timeout, ``Retry-After``), and those generously.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pytest

from sluicegate.client import Client, StreamResult
from sluicegate.core.endstate import EndState
from sluicegate.engines.scripted.engine import DEFAULT_TEXT
from sluicegate.server.ledger.ledger import LedgerRow, read_rows

from .nginx import running_nginx
from .servers import ServerProcess, StartServer, free_port, load_bench
from .wire import SSEReader, check_chunks, engine_stats, stream_chunks, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HELLO = [{"role": "user", "content": "Hi"}]
CHAT = "/v1/chat/completions"
DEPLOY_CONF = (
    Path(__file__).resolve().parents[2] / "deploy" / "nginx" / "sluicegate.conf"
)
ROW_TIMEOUT_S = 10.0


def response_id(result: StreamResult) -> str:
    """The ``id`` of the first chunk of a stream read with ``record=True``."""
    first = result.raw.split(b"\n\n", 1)[0]
    assert first.startswith(b"data: {"), result.raw[:300]
    rid = json.loads(first.removeprefix(b"data: "))["id"]
    assert isinstance(rid, str)
    return rid


def ledger_row(ledger: Path, predicate: Callable[[LedgerRow], bool]) -> LedgerRow:
    """The one row of ``ledger`` that ``predicate`` picks, once it is written."""
    deadline = time.monotonic() + ROW_TIMEOUT_S
    while True:
        found = (
            [r for r in read_rows(ledger) if predicate(r)] if ledger.exists() else []
        )
        if found or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(found) == 1, found
    return found[0]


def row_of(ledger: Path, rid: str) -> LedgerRow:
    return ledger_row(ledger, lambda r: r.request_id == rid)


def new_row(ledger: Path, before: set[str]) -> LedgerRow:
    """The one row not among the ids of ``before`` (requests sent one at a time)."""
    return ledger_row(ledger, lambda r: r.request_id not in before)


def ids(ledger: Path) -> set[str]:
    return {r.request_id for r in read_rows(ledger)} if ledger.exists() else set()


def scripted(
    start_server: StartServer, name: str, ledger: Path, *args: str
) -> ServerProcess:
    return start_server(
        name,
        *("--engine", "scripted", "--log-level", "warning"),
        *("--ledger", str(ledger), *args),
    )


# -- each end state, client and ledger agreeing ------------------------------------


@pytest.fixture(scope="module")
def plain(
    start_server: StartServer, tmp_path_factory: pytest.TempPathFactory
) -> tuple[ServerProcess, Path]:
    """A scripted server at 50 tokens/s and its ledger."""
    ledger = tmp_path_factory.mktemp("plain") / "ledger.sqlite3"
    return scripted(start_server, "plain", ledger, "--scripted-rate", "50"), ledger


def test_finished_stream_and_its_ledger_row_agree(
    plain: tuple[ServerProcess, Path],
) -> None:
    server, ledger = plain
    with Client(server.base_url) as client:
        result = client.chat(HELLO, model="scripted", record=True)

    assert result.end_state is EndState.FINISHED, result
    assert result.text == DEFAULT_TEXT
    row = row_of(ledger, response_id(result))
    assert (row.end_state, row.status) == (EndState.FINISHED, 200)
    assert row.finish_reasons == ("stop",)
    assert result.usage is not None
    assert row.prompt_tokens == result.usage.prompt_tokens
    assert row.completion_tokens == result.usage.completion_tokens
    assert row.first_token_at is not None
    assert row.received_at <= row.first_token_at <= row.ended_at


def test_rejected_request_and_its_ledger_row_agree(
    plain: tuple[ServerProcess, Path],
) -> None:
    server, ledger = plain
    before = ids(ledger)
    with Client(server.base_url) as client:
        result = client.chat(HELLO, model="scripted", temperature=5)

    assert (result.end_state, result.status) == (EndState.REJECTED, 400)
    assert result.error is not None
    assert result.error["param"] == "temperature"
    row = new_row(ledger, before)
    assert (row.end_state, row.status) == (EndState.REJECTED, 400)
    assert (row.completion_tokens, row.first_token_at) == (0, None)


def test_aborted_stream_and_its_ledger_row_agree(
    plain: tuple[ServerProcess, Path],
) -> None:
    """The client closes after two deltas: both sides say ``aborted``."""
    server, ledger = plain
    with (
        Client(server.base_url) as client,
        client.stream_chat(HELLO, model="scripted", record=True) as stream,
    ):
        for number, _ in enumerate(stream, 1):
            if number == 2:
                break
    result = stream.result()

    assert result.end_state is EndState.ABORTED, result
    row = row_of(ledger, response_id(result))
    assert (row.end_state, row.status) == (EndState.ABORTED, 200)
    assert row.finish_reasons == (None,)
    assert 2 <= row.completion_tokens < 21  # the whole script is 21 tokens
    with httpx.Client(base_url=server.base_url, timeout=10) as http:
        idle, _ = wait_until(
            http,
            lambda s: s["running"] == 0 and s["kv_cells_used"] == 0,
            started_s=time.monotonic(),
            give_up_s=5,
        )
        assert idle is not None, engine_stats(http)


def test_errored_stream_and_its_ledger_row_agree(
    start_server: StartServer, tmp_path: Path
) -> None:
    """An engine failure after three steps: our client and the SDK both see it."""
    ledger = tmp_path / "ledger.sqlite3"
    server = scripted(start_server, "failing", ledger, "--fault", "error-after:3")
    with Client(server.base_url) as client:
        result = client.chat(HELLO, model="scripted", record=True)

    assert result.end_state is EndState.ERRORED, result
    assert result.error is not None
    assert result.error["message"]
    assert not result.saw_done
    row = row_of(ledger, response_id(result))
    assert (row.end_state, row.status) == (EndState.ERRORED, 200)
    assert row.completion_tokens == 3
    assert row.finish_reasons == (None,)

    before = ids(ledger)
    sdk = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)
    with sdk, pytest.raises(openai.APIError):
        for _ in sdk.chat.completions.create(
            model="scripted", messages=[{"role": "user", "content": "Hi"}], stream=True
        ):
            pass
    assert new_row(ledger, before).end_state is EndState.ERRORED


def test_server_killed_mid_stream_is_truncated_and_keeps_ended_rows(
    start_server: StartServer, tmp_path: Path
) -> None:
    """``kill -9`` mid-stream: the client says truncated, never finished; the
    row of the request that had ended survives, and the cut one has none."""
    ledger = tmp_path / "ledger.sqlite3"
    server = scripted(start_server, "killed", ledger, "--scripted-rate", "20")
    with Client(server.base_url) as client:
        ended = client.chat(HELLO, model="scripted", record=True)
        with client.stream_chat(HELLO, model="scripted", record=True) as stream:
            for number, _ in enumerate(stream, 1):
                if number == 2:
                    os.kill(server.process.pid, signal.SIGKILL)
                    server.process.wait(10)
    result = stream.result()

    assert ended.end_state is EndState.FINISHED
    assert result.end_state is EndState.TRUNCATED, result
    assert result.status == 200
    assert not result.saw_done
    assert result.finish_reason is None
    rows = read_rows(ledger)
    assert [(r.request_id, r.end_state) for r in rows] == [
        (response_id(ended), EndState.FINISHED)
    ]
    assert response_id(result) != response_id(ended)


# -- quotas -------------------------------------------------------------------------


def test_tokens_per_minute_quota_refuses_then_refills(
    start_server: StartServer, tmp_path: Path
) -> None:
    """600 tokens/min (10 per second): one request reserves and uses 592, the next
    (at least 11) is refused with ``Retry-After`` and never reaches the engine; after
    ``Retry-After`` seconds the same request passes."""
    ledger = tmp_path / "ledger.sqlite3"
    script = tmp_path / "script.txt"
    script.write_text("The quick brown fox streams tokens correctly. " * 80)
    server = scripted(
        start_server,
        "quota",
        ledger,
        *("--scripted-text", str(script), "--scripted-rate", "5000"),
        *("--tokens-per-minute", "600"),
    )
    big = {"messages": HELLO, "stream": True, "max_tokens": 582}  # 10 + 582
    small = {"messages": HELLO, "stream": True, "max_tokens": 10}  # 10 + 10
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        first = http.post(CHAT, json=big)
        assert first.status_code == 200, first.text
        assert b"data: [DONE]" in first.content
        before = engine_stats(http)

        refused = http.post(CHAT, json=small)
        after = engine_stats(http)
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        retry_after = int(refused.headers["retry-after"])
        assert 1 <= retry_after <= 3  # 12 missing tokens at 10 per second
        for key in ("prompt_tokens", "generated_tokens", "finished_requests"):
            assert after[key] == before[key], (key, before, after)

        time.sleep(retry_after)
        again = http.post(CHAT, json=small)
        assert again.status_code == 200, again.text
        assert b"data: [DONE]" in again.content

    # The ledger's writer thread commits a row just after its response ends.
    deadline = time.monotonic() + 30
    while len(rows := read_rows(ledger)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [(r.end_state, r.status) for r in rows] == [
        (EndState.FINISHED, 200),
        (EndState.REJECTED, 429),
        (EndState.FINISHED, 200),
    ]
    assert rows[0].prompt_tokens + rows[0].completion_tokens == 592
    # A small body short only of tokens is planned before it is refused, so that
    # its Retry-After counts its prompt: tokenized, nothing generated.
    assert rows[1].prompt_tokens == 10
    assert rows[1].completion_tokens == 0


# -- heartbeats ---------------------------------------------------------------------


@dataclass
class Timed:
    """A streamed response read as it arrived: events and comment arrival times."""

    status: int = 0
    events: list[str] = field(default_factory=list)
    event_times: list[float] = field(default_factory=list)
    event_reads: list[int] = field(default_factory=list)
    comment_times: list[float] = field(default_factory=list)
    comment_reads: list[int] = field(default_factory=list)
    body: bytes = b""
    started: float = 0.0


def read_timed(base_url: str, payload: dict[str, object]) -> Timed:
    timed = Timed(started=time.monotonic())
    reader = SSEReader()
    with (
        httpx.Client(base_url=base_url, timeout=60) as http,
        http.stream("POST", CHAT, json={**payload, "stream": True}) as response,
    ):
        timed.status = response.status_code
        for read, data in enumerate(response.iter_raw()):
            now = time.monotonic() - timed.started
            timed.body += data
            comments = reader.comments
            events = reader.feed(data)
            timed.events += events
            timed.event_times += [now] * len(events)
            timed.event_reads += [read] * len(events)
            timed.comment_times += [now] * (reader.comments - comments)
            timed.comment_reads += [read] * (reader.comments - comments)
    return timed


def content_indexes(timed: Timed) -> list[int]:
    return [
        i
        for i, event in enumerate(timed.events[:-1])
        if (chunk := json.loads(event))["choices"]
        and chunk["choices"][0]["delta"].get("content")
    ]


def sdk_text(base_url: str, out: list[object]) -> None:
    """Stream with the ``openai`` SDK; append (text, finish_reason) or the error."""
    try:
        with openai.OpenAI(
            base_url=f"{base_url}/v1", api_key="x", max_retries=0, timeout=60
        ) as sdk:
            text, reason = "", None
            for chunk in sdk.chat.completions.create(
                model="scripted",
                messages=[{"role": "user", "content": "Hi"}],
                stream=True,
            ):
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
                    reason = chunk.choices[0].finish_reason or reason
            out.append((text, reason))
    except Exception as exc:  # reported by the test, not lost in the thread
        out.append(exc)


def test_heartbeats_cover_a_five_second_prefill_and_the_sdk_is_unaffected(
    start_server: StartServer, tmp_path: Path
) -> None:
    server = scripted(
        start_server,
        "prefill5",
        tmp_path / "ledger.sqlite3",
        *("--fault", "prefill-delay:5", "--heartbeat-s", "1"),
    )
    from_sdk: list[object] = []
    sdk_thread = threading.Thread(target=sdk_text, args=(server.base_url, from_sdk))
    sdk_thread.start()
    timed = read_timed(server.base_url, {"messages": HELLO})
    sdk_thread.join(60)

    assert from_sdk == [(DEFAULT_TEXT, "stop")]
    recorded_chunks = check_chunks(_chunks(timed), chat=True)
    assert recorded_chunks[0].text == DEFAULT_TEXT
    # About one comment per second of the 5 s prefill: at least 3, no flood, in
    # separate reads, spread over the prefill rather than bunched.
    assert 3 <= len(timed.comment_times) <= 7, timed.comment_times
    assert len(set(timed.comment_reads)) == len(timed.comment_reads)
    assert timed.comment_times[-1] - timed.comment_times[0] >= 1.5, timed.comment_times
    first_content = timed.event_times[content_indexes(timed)[0]]
    assert timed.comment_times[-1] <= first_content


def _chunks(timed: Timed) -> list[dict[str, object]]:
    from .wire import RecordedStream

    recorded = RecordedStream(
        status=timed.status,
        headers=httpx.Headers({"content-type": "text/event-stream"}),
        body=timed.body,
        events=timed.events,
    )
    return stream_chunks(recorded)


# -- behind nginx -------------------------------------------------------------------


def render_deploy_conf(listen_port: int, upstream_port: int) -> str:
    """``deploy/nginx/sluicegate.conf`` with this test's ports."""
    text = DEPLOY_CONF.read_text()
    for shipped, ours in (
        ("listen 8080;", f"listen 127.0.0.1:{listen_port};"),
        (
            "proxy_pass http://127.0.0.1:8000;",
            f"proxy_pass http://127.0.0.1:{upstream_port};",
        ),
    ):
        assert text.count(shipped) == 1, f"{DEPLOY_CONF} no longer has {shipped!r}"
        text = text.replace(shipped, ours)
    return text


def chat_through(url: str) -> StreamResult:
    """A chat with our client at ``url``, whatever its end."""
    with Client(url) as client:
        return client.chat(HELLO, model="scripted")


def test_shipped_nginx_config_keeps_a_ten_second_prefill_alive_with_heartbeats(
    start_server: StartServer, tmp_path: Path
) -> None:
    """Through nginx with the shipped config: ``proxy_read_timeout 3s``, buffering on.

    With 1 s heartbeats a 10 s prefill survives, and the content events, written
    over about 2 s, arrive spread out over many reads, not at the end. A control
    server with the default 15 s heartbeats shows the timeout is real: nginx cuts
    its stream, which the client sees as truncated.
    """
    directives = [
        line.strip()
        for line in DEPLOY_CONF.read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    assert "proxy_read_timeout 3s;" in directives
    assert "proxy_http_version 1.1;" in directives
    assert not [d for d in directives if d.startswith("proxy_buffering")]
    beating = scripted(
        start_server,
        "nginx-heartbeats",
        tmp_path / "beating.sqlite3",
        *("--fault", "prefill-delay:10", "--heartbeat-s", "1", "--scripted-rate", "10"),
    )
    silent = scripted(
        start_server,
        "nginx-silent",
        tmp_path / "silent.sqlite3",
        *("--fault", "prefill-delay:5", "--scripted-rate", "10"),
    )
    ports = (free_port(), free_port())
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    blocks = [
        render_deploy_conf(port, server.port)
        for port, server in zip(ports, (beating, silent), strict=True)
    ]
    # The control waits out nginx's timeout while the heartbeat stream runs:
    # each has its own server and nginx block, and the control only waits.
    with (
        running_nginx(tmp_path, blocks, [f"{url}/health" for url in urls]),
        ThreadPoolExecutor(1) as control,
    ):
        cutting = control.submit(chat_through, urls[1])
        timed = read_timed(urls[0], {"messages": HELLO})
        cut = cutting.result(timeout=60)

    assert cut.end_state is EndState.TRUNCATED, cut
    assert cut.status == 200
    assert timed.status == 200
    choices = check_chunks(_chunks(timed), chat=True)
    assert choices[0].text == DEFAULT_TEXT
    assert len(timed.comment_times) >= 5, timed.comment_times
    content = content_indexes(timed)
    assert len(content) >= 10
    arrivals = [timed.event_times[i] for i in content]
    assert arrivals[-1] - arrivals[0] >= 1.0, arrivals  # written over ~2 s
    reads = {timed.event_reads[i] for i in content}
    assert len(reads) >= len(content) / 2, (
        f"{len(content)} events in {len(reads)} reads"
    )


# -- a client that stops reading ----------------------------------------------------


@pytest.mark.timeout(90)
def test_client_that_stops_reading_keeps_memory_bounded_and_is_aborted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four never-ending choices at 2000 tokens/s each; the client reads the head
    and then nothing. The server's RSS grows far less than the frames the engine
    generated would take if buffered, and once a write has waited 3 s (the stuck
    timeout) the stream is aborted: engine idle, ledger ``aborted``, and the
    client, reading again, finds the body cut without ``[DONE]``."""
    chaos = load_bench("chaos", monkeypatch)

    report = chaos.stuck_reader(
        0,
        tmp_path,
        rate=2000.0,
        n=4,
        stuck_timeout_s=3.0,
        # room for ~8 s of tokens (text plus buffer.EVENT_COST_BYTES each), so
        # that the stuck timeout, not the overflow, ends this stream
        buffer_bytes=8 * 1024 * 1024,
        give_up_s=45.0,
    )

    summary = {k: v for k, v in vars(report).items() if k not in ("log", "samples")}
    assert report.aborted_after_s is not None, summary
    assert report.aborted_after_s >= 3.0, summary
    assert "accepted no byte for 3 s; aborted" in report.log, report.log
    assert len(report.ledger) == 1, summary
    state, status, completion_tokens = report.ledger[0]
    assert (state, status) == ("aborted", 200)
    assert completion_tokens > 0
    assert report.slow_client_aborts == 1.0
    assert report.eof
    assert not report.tail_has_done
    # Unbounded buffering would hold every generated frame; the bound must be
    # large enough to tell (several MiB) and the growth well under it.
    assert report.unbounded_kib >= 4096, summary
    assert report.growth_kib < report.unbounded_kib / 2, summary
