"""``serve --workers 2``: two real worker processes on one port, one Redis,
one SQLite ledger, driven over HTTP (two workers on one PostgreSQL ledger:
``test_engine_process.py``).

The scripted engine, paced, keeps streams running while a test resumes one on
the other worker, kills a worker, or drains the server. The tests of the
shared server run in order: the last one drains it.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path

import httpx
import pytest

from sluicegate.cli import main
from tests.redis_server import RedisServer
from tests.sse_lines import data_lines

from .servers import ServerProcess, free_port
from .workers import client_on, eventually, parent_of, worker_pids

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHAT = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4}
LONG = {**CHAT, "stream": True}
LOAD = 64
"""Concurrent requests of the ledger test."""


@pytest.fixture(scope="module")
def ledger_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ledger") / "ledger.sqlite3"


@pytest.fixture(scope="module")
def server(
    redis_server: RedisServer,
    ledger_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServerProcess]:
    """Two workers with the scripted engine, and a gateway model (``gw``) whose
    upstream is another (one-process) scripted server."""
    folder = tmp_path_factory.mktemp("workers")
    text = folder / "text.txt"
    text.write_text(" ".join(f"w{i}" for i in range(400)))
    with ServerProcess(
        "upstream", ["--engine", "scripted", "--no-ledger"], folder
    ) as up:
        up.wait_healthy()
        models = folder / "models.toml"
        models.write_text(
            f'[[models]]\nid = "gw"\n[[models.upstreams]]\n'
            f'url = "{up.base_url}/v1"\nmodel = "scripted"\n'
        )
        process = ServerProcess(
            "workers",
            [
                "--workers", "2", "--engine", "scripted", "--scripted-text", str(text),
                "--scripted-rate", "40", "--scripted-max-running", "128",
                "--scripted-max-queued", "128", "--redis", redis_server.url,
                "--ledger", str(ledger_path), "--grace-s", "30",
                "--upstreams", str(models),
            ],
            folder,
        )  # fmt: skip
        process.wait_healthy()
        yield process
        process.stop()


def test_two_workers_accept_on_one_port_under_one_parent(server: ServerProcess) -> None:
    pids = worker_pids(server.base_url)
    assert {parent_of(pid) for pid in pids} == {server.pid}
    assert server.pid not in pids


def test_each_worker_serves_the_gateway_model_through_its_own_pool(
    server: ServerProcess,
) -> None:
    first, first_pid = client_on(server.base_url)
    second, _ = client_on(server.base_url, not_pid=first_pid)
    body = {**CHAT, "model": "gw"}
    with closing(first), closing(second):
        answers = [c.post("/v1/chat/completions", json=body) for c in (first, second)]
    for answer in answers:
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == "gw"
        assert answer.json()["choices"][0]["message"]["content"]


def test_more_than_one_worker_without_redis_is_refused_naming_the_option() -> None:
    with pytest.raises(SystemExit, match="pass --redis redis://"):
        main(["serve", "--workers", "2", "--engine", "scripted", "--port", "0"])


def test_a_redis_url_that_is_no_redis_url_is_refused_before_any_worker() -> None:
    with pytest.raises(SystemExit, match="--redis 'http://x': Redis URL must"):
        main(["serve", "--workers", "2", "--engine", "scripted", "--port", "0",
              "--redis", "http://x"])  # fmt: skip


def test_an_unreachable_redis_is_warned_about_and_quotas_refuse_with_503(
    tmp_path: Path,
) -> None:
    # A free port nobody listens on: the Redis that is not there.
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    process = ServerProcess(
        "workers-no-redis",
        [
            "--workers", "2", "--engine", "scripted", "--redis", url,
            "--requests-per-minute", "5", "--api-key", "sk-a", "--no-ledger",
        ],
        tmp_path,
    )  # fmt: skip
    with process:
        process.wait_healthy()
        answer = httpx.post(
            f"{process.base_url}/v1/chat/completions",
            json=CHAT,
            headers={"Authorization": "Bearer sk-a"},
            timeout=30,
        )
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "quota_store_unavailable"
    assert process.log_path is not None
    log = process.log_path.read_text()
    warned = [line for line in log.splitlines() if "does not answer" in line]
    assert len(warned) == 1, log
    assert "WARNING" in warned[0]
    assert "redis://:***@127.0.0.1:" in warned[0]
    assert "hunter2" not in log


def test_a_reachable_redis_is_not_warned_about(server: ServerProcess) -> None:
    assert server.log_path is not None
    assert "does not answer" not in server.log_path.read_text()


def test_a_second_serve_workers_on_the_port_is_refused(
    server: ServerProcess, redis_server: RedisServer
) -> None:
    port = server.base_url.rsplit(":", 1)[1]
    argv = ["serve", "--workers", "2", "--engine", "scripted", "--port", port]
    with pytest.raises(SystemExit, match=f"cannot listen on 127.0.0.1:{port}"):
        main([*argv, "--redis", redis_server.url])


def test_a_stream_started_on_one_worker_resumes_on_the_other(
    server: ServerProcess,
) -> None:
    first, first_pid = client_on(server.base_url)
    other, _ = client_on(server.base_url, not_pid=first_pid)
    body = {**LONG, "max_tokens": 30, "stream_options": {"resumable": True}}
    with closing(first), closing(other):
        with first.stream("POST", "/v1/chat/completions", json=body) as started:
            assert started.status_code == 200
            last_id = ""
            for line in started.iter_lines():
                if line.startswith("id:"):
                    last_id = line[3:].strip()
                    if last_id.endswith(".3"):
                        break
        response_id = last_id.rsplit(".", 1)[0]
        url = f"/v1/chat/completions/{response_id}/events"
        with other.stream("GET", url, headers={"Last-Event-ID": last_id}) as resumed:
            assert resumed.status_code == 200
            rest = data_lines(resumed.iter_lines())
    assert rest[-1] == "[DONE]"
    finishes = [json.loads(d)["choices"][0]["finish_reason"] for d in rest[:-1]]
    assert finishes.count("length") == 1


def test_no_ledger_row_is_lost_when_both_workers_write_at_once(
    server: ServerProcess, ledger_path: Path
) -> None:
    url = f"{server.base_url}/v1/chat/completions"

    def ask(client: httpx.Client) -> str:
        answer = client.post(url, json=CHAT)
        assert answer.status_code == 200, answer.text
        return str(answer.json()["id"])

    # 16 connections, which the kernel spreads over the two workers
    with httpx.Client(timeout=60) as client, ThreadPoolExecutor(16) as pool:
        ids = set(pool.map(ask, [client] * LOAD))
    assert len(ids) == LOAD
    stored: dict[str, str] = {}
    listed: set[str] = set()

    def all_written() -> bool:  # each worker's writer thread commits on its own
        rows = httpx.get(f"{server.base_url}/engine/requests", params={"limit": 100})
        listed.update(row["request_id"] for row in rows.json()["data"])
        with closing(sqlite3.connect(ledger_path)) as db:
            stored.update(db.execute("SELECT request_id, server_id FROM requests"))
        return ids <= set(stored) and ids <= listed

    # every row, from whichever worker wrote it, and /engine/requests reads
    # them all, from either worker
    assert eventually(all_written), (ids - set(stored), ids - listed)
    assert len({stored[i] for i in ids}) == 2  # and both workers wrote


def test_metrics_sum_the_requests_of_both_workers(server: ServerProcess) -> None:
    def total() -> float:
        text = httpx.get(f"{server.base_url}/metrics").text
        lines = [
            line for line in text.splitlines()
            if line.startswith("sluicegate_requests_total{")
        ]  # fmt: skip
        return sum(float(line.rsplit(" ", 1)[1]) for line in lines)

    before = total()
    clients = [client_on(server.base_url)]
    clients.append(client_on(server.base_url, not_pid=clients[0][1]))
    for client, _ in clients:
        with closing(client):
            assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
    for client, _ in (client_on(server.base_url), client_on(server.base_url)):
        with closing(client):  # whichever worker answers the scrape sees both
            assert total() - before == 2


def _gauge(text: str, name: str) -> float:
    (line,) = [line for line in text.splitlines() if line.startswith(name + " ")]
    return float(line.rsplit(" ", 1)[1])


def test_engine_stats_and_metrics_count_the_streams_of_both_workers(
    server: ServerProcess,
) -> None:
    first, first_pid = client_on(server.base_url)
    second, _ = client_on(server.base_url, not_pid=first_pid)
    asker, _ = client_on(server.base_url)
    body = {**LONG, "max_tokens": 400}  # 10 s: ended by the test, long before
    with (
        closing(first),
        closing(second),
        closing(asker),
        first.stream("POST", "/v1/chat/completions", json=body) as one,
        second.stream("POST", "/v1/chat/completions", json=body) as two,
    ):
        # Kept: a line iterator dropped half-way closes its connection.
        lines = [one.iter_lines(), two.iter_lines()]
        assert all(data_lines(each, stop_after=2) for each in lines)
        seen: list[int] = []

        def both() -> bool:  # whichever worker answers sees the other's stream
            seen.append(asker.get("/engine/stats").json()["running"])
            return seen[-1] == 2

        assert eventually(both), seen
        # A scrape reads each worker's live series when it is asked: both
        # streams, whichever worker answers, with no wait.
        for client in (first, second, asker):
            text = client.get("/metrics").text
            assert _gauge(text, "sluicegate_scraped_workers") == 2
            assert _gauge(text, "sluicegate_active_streams") == 2
            assert _gauge(text, "sluicegate_engine_running") == 2


def _state(ledger_path: Path, request_id: str) -> str | None:
    db = sqlite3.connect(ledger_path)
    try:
        row = db.execute(
            "SELECT end_state FROM requests WHERE request_id = ?", (request_id,)
        ).fetchone()
    finally:
        db.close()
    return None if row is None else str(row[0])


def test_a_killed_worker_is_restarted_and_the_others_stream_is_untouched(
    server: ServerProcess, ledger_path: Path
) -> None:
    body = {**LONG, "max_tokens": 60}
    keep, keep_pid = client_on(server.base_url)
    doomed, doomed_pid = client_on(server.base_url, not_pid=keep_pid)
    with (
        closing(keep),
        closing(doomed),
        keep.stream("POST", "/v1/chat/completions", json=body) as kept,
    ):
        lines = kept.iter_lines()
        head = data_lines(lines, stop_after=3)
        kept_id = json.loads(head[0])["id"]
        with doomed.stream("POST", "/v1/chat/completions", json=body) as lost:
            lost_lines = lost.iter_lines()
            victim = data_lines(lost_lines, stop_after=3)
            request_id = json.loads(victim[0])["id"]
            os.kill(doomed_pid, signal.SIGKILL)
            with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
                data_lines(lost_lines)  # cut: no [DONE], no error event
        tail = data_lines(lines)
    assert head
    assert tail[-1] == "[DONE]"
    assert not [e for e in tail[:-1] if "error" in json.loads(e)]
    assert json.loads(tail[-2])["choices"][0]["finish_reason"] == "length"
    new_pids = worker_pids(server.base_url)  # the slot is served again
    assert keep_pid in new_pids
    assert doomed_pid not in new_pids
    # The new worker finds the dead one's open row and closes it as truncated;
    # the other worker's row is its own, finished.
    assert eventually(lambda: _state(ledger_path, request_id) == "truncated")
    assert eventually(lambda: _state(ledger_path, kept_id) == "finished")


def test_sigterm_drains_every_worker_and_lets_their_streams_finish(
    server: ServerProcess, ledger_path: Path
) -> None:
    first, first_pid = client_on(server.base_url)
    second, _ = client_on(server.base_url, not_pid=first_pid)
    body = {**LONG, "max_tokens": 40}
    with (
        closing(first),
        closing(second),
        first.stream("POST", "/v1/chat/completions", json=body) as one,
        second.stream("POST", "/v1/chat/completions", json=body) as two,
    ):
        streams = [one.iter_lines(), two.iter_lines()]
        heads = [data_lines(lines, stop_after=2) for lines in streams]
        server.process.send_signal(signal.SIGTERM)
        for client in (first, second):  # each worker got the signal

            def draining(client: httpx.Client = client) -> bool:
                return bool(client.get("/health").json()["status"] == "draining")

            assert eventually(draining)
        refused = first.post("/v1/chat/completions", json=CHAT)
        tails = [data_lines(lines) for lines in streams]
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "server_shutting_down"
    for head, tail in zip(heads, tails, strict=True):
        assert head
        assert tail[-1] == "[DONE]"
        assert json.loads(tail[-2])["choices"][0]["finish_reason"] == "length"
    assert server.process.wait(30) == 0
    # Each worker closed its stream's row before it exited.
    for head in heads:
        assert _state(ledger_path, json.loads(head[0])["id"]) == "finished"


def test_quotas_hold_across_workers(redis_url: str, tmp_path: Path) -> None:
    process = ServerProcess(
        "workers-quota",
        [
            "--workers", "2", "--engine", "scripted", "--redis", redis_url,
            "--requests-per-minute", "2", "--api-key", "sk-a", "--no-ledger",
        ],
        tmp_path,
    )  # fmt: skip
    with process:
        process.wait_healthy()
        # /health needs no key; the chat route does
        first, first_pid = client_on(process.base_url)
        second, _ = client_on(process.base_url, not_pid=first_pid)
        auth = {"Authorization": "Bearer sk-a"}
        with closing(first), closing(second):
            codes = [
                client.post("/v1/chat/completions", json=CHAT, headers=auth).status_code
                for client in (first, second, first, second)
            ]
    assert codes == [200, 200, 429, 429]
