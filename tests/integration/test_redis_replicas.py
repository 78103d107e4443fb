"""Two real server processes behind one real Redis: one quota, one set of logs.

The quota test runs the default model through llama.cpp on both replicas; the
resume tests use the scripted engine, paced, so that a stream is still running
when it is resumed on the other replica and when its replica is killed.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from sluicegate.testing import free_port
from tests.redis_server import RedisServer

from .servers import ServerProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHAT = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4}
Event = tuple[str | None, str]
"""One SSE event: its ``id:`` (``None``: none) and its ``data:``."""


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[list[ServerProcess]]:
    """Servers started by the test; each is stopped (or was killed) at its end."""
    started: list[ServerProcess] = []
    yield started
    for server in started:
        server.stop()


def start(started: list[ServerProcess], log_dir: Path, *args: str) -> ServerProcess:
    server = ServerProcess(f"replica{len(started)}", ["--no-ledger", *args], log_dir)
    started.append(server)
    return server


def test_the_second_replica_answers_429_once_the_first_spent_the_budget(
    redis_url: str, replicas: list[ServerProcess], tmp_path: Path
) -> None:
    # The budget is spent at admission, before any engine: a scripted one.
    args = ("--engine", "scripted")
    quota = ("--redis", redis_url, "--requests-per-minute", "1", "--api-key", "sk-a")
    first, second = (start(replicas, tmp_path, *args, *quota) for _ in range(2))
    for server in (first, second):
        server.wait_healthy()
    client = openai.OpenAI(
        base_url=f"{first.base_url}/v1", api_key="sk-a", max_retries=0
    )
    answer = client.chat.completions.create(model="default", **CHAT)  # type: ignore[call-overload]
    assert answer.choices[0].message.content
    refused = httpx.post(
        f"{second.base_url}/v1/chat/completions",
        json=CHAT,
        headers={"Authorization": "Bearer sk-a"},
        timeout=30,
    )
    assert refused.status_code == 429
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"


def test_redis_down_answers_503_with_retry_after(
    replicas: list[ServerProcess], tmp_path: Path
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    server = start(
        replicas, tmp_path, "--engine", "scripted", "--redis", dead,
        "--requests-per-minute", "10",
    )  # fmt: skip
    server.wait_healthy()
    for _ in range(2):  # and it keeps serving
        answer = httpx.post(
            f"{server.base_url}/v1/chat/completions", json=CHAT, timeout=30
        )
        assert answer.status_code == 503
        assert answer.headers["retry-after"] == "1"
        assert answer.json()["error"]["code"] == "quota_store_unavailable"
        assert answer.json()["error"]["type"] == "server_error"
    assert httpx.get(f"{server.base_url}/health").status_code == 200


def test_redis_down_refuses_resumable_streams_and_resumes_with_503(
    replicas: list[ServerProcess], tmp_path: Path
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    server = start(
        replicas, tmp_path, "--engine", "scripted", "--redis", dead, "--resumable"
    )
    server.wait_healthy()
    url = f"{server.base_url}/v1/chat/completions"
    answers = [
        httpx.post(url, json={**CHAT, "stream": True}, timeout=30),
        httpx.get(f"{url}/chatcmpl-{'0' * 32}/events", timeout=30),
    ]
    for answer in answers:
        assert answer.status_code == 503, answer.text
        assert answer.headers["retry-after"] == "1"
        assert answer.json()["error"]["code"] == "resume_store_unavailable"
    assert httpx.get(f"{server.base_url}/health").status_code == 200


def test_a_stream_resumed_on_another_replica_ends_in_one_error_when_its_own_dies(
    redis_server: RedisServer,
    redis_url: str,
    replicas: list[ServerProcess],
    tmp_path: Path,
) -> None:
    text = tmp_path / "text.txt"
    text.write_text(" ".join(f"w{i}" for i in range(400)))
    args = (
        "--engine", "scripted", "--scripted-text", str(text), "--scripted-rate", "40",
        "--redis", redis_url, "--resumable",
    )  # fmt: skip
    producer, other = start(replicas, tmp_path, *args), start(replicas, tmp_path, *args)
    for server in (producer, other):
        server.wait_healthy()
    body = {**CHAT, "max_tokens": 400, "stream": True}
    with httpx.Client(timeout=30) as http:
        with http.stream(
            "POST", f"{producer.base_url}/v1/chat/completions", json=body
        ) as first:
            assert first.status_code == 200
            seen = _events(first.iter_lines(), stop_after=5)
        last_id = seen[-1][0]
        assert last_id is not None
        response_id = last_id.rsplit(".", 1)[0]
        url = f"{other.base_url}/v1/chat/completions/{response_id}/events"
        with http.stream("GET", url, headers={"Last-Event-ID": last_id}) as resumed:
            assert resumed.status_code == 200
            lines = resumed.iter_lines()
            seen += _events(lines, stop_after=10)  # live, from the other replica
            producer.process.send_signal(signal.SIGKILL)
            producer.process.wait(10)
            seen += _events(lines)
    ids = [int(event_id.rsplit(".", 1)[1]) for event_id, _ in seen if event_id]
    assert ids == list(range(len(ids)))  # every frame once, in order, no gap
    kept = redis_server.command(
        b"HGET", f"sluicegate:meta:{response_id}".encode(), b"next"
    )
    assert kept.split(b"\r\n")[1] == str(len(ids)).encode()  # all A had written
    datas = [data for _, data in seen]
    assert "[DONE]" not in datas
    errors = [data for data in datas if '"error"' in data]
    assert len(errors) == 1, datas[-3:]
    assert datas[-1] == errors[0]
    assert json.loads(errors[0])["error"]


def _events(lines: Iterator[str], stop_after: int | None = None) -> list[Event]:
    """SSE events (``data:`` ones; comments skipped) until the stream ends, or
    until ``stop_after`` of them."""
    out: list[Event] = []
    event_id: str | None = None
    data: list[str] = []
    for line in lines:
        if line.startswith("id:"):
            event_id = line[3:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif not line and data:
            out.append((event_id, "\n".join(data)))
            event_id, data = None, []
            if stop_after is not None and len(out) >= stop_after:
                break
    return out


def test_a_background_response_is_read_resumed_and_deleted_on_another_replica(
    redis_url: str, replicas: list[ServerProcess], tmp_path: Path
) -> None:
    text = tmp_path / "text.txt"
    text.write_text(" ".join(f"w{i}" for i in range(60)))
    args = (
        "--engine", "scripted", "--scripted-text", str(text), "--scripted-rate", "40",
        "--redis", redis_url,
    )  # fmt: skip
    producer, other = start(replicas, tmp_path, *args), start(replicas, tmp_path, *args)
    for server in (producer, other):
        server.wait_healthy()
    body = {"model": "scripted", "input": "Say hi", "background": True}
    with httpx.Client(timeout=30) as http:
        created = http.post(f"{producer.base_url}/v1/responses", json=body).json()
        url = f"{other.base_url}/v1/responses/{created['id']}"
        assert http.get(url).json()["status"] == "in_progress"
        with http.stream("GET", url, params={"stream": "true"}) as live:
            assert live.status_code == 200
            seen = _events(live.iter_lines())  # live from the producer, to the end
        final = http.get(url).json()
        assert final["status"] == "completed"
        numbers = [json.loads(data)["sequence_number"] for _, data in seen]
        assert numbers == list(range(len(seen)))
        terminal = json.loads(seen[-1][1])["response"]
        assert {**terminal, "background": True} == final
        tail = http.get(url, params={"stream": "true", "starting_after": "3"})
        assert _events(tail.iter_lines()) == seen[4:]
        assert http.delete(url).json()["deleted"] is True
        gone = http.get(f"{producer.base_url}/v1/responses/{created['id']}")
        assert gone.status_code == 404


def test_cancel_and_delete_on_another_replica_abort_the_producers_engine(
    redis_url: str, replicas: list[ServerProcess], tmp_path: Path
) -> None:
    text = tmp_path / "text.txt"
    text.write_text(" ".join(f"w{i}" for i in range(2000)))
    args = (
        "--engine", "scripted", "--scripted-text", str(text), "--scripted-rate", "40",
        "--redis", redis_url,
    )  # fmt: skip
    producer, other = start(replicas, tmp_path, *args), start(replicas, tmp_path, *args)
    for server in (producer, other):
        server.wait_healthy()
    body = {"model": "scripted", "input": "Say hi", "background": True}
    with httpx.Client(timeout=30) as http:
        first = http.post(f"{producer.base_url}/v1/responses", json=body).json()
        second = http.post(f"{producer.base_url}/v1/responses", json=body).json()
        assert http.get(f"{producer.base_url}/engine/stats").json()["running"] == 2
        url = f"{other.base_url}/v1/responses"
        cancelled = http.post(f"{url}/{first['id']}/cancel")
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json()["status"] == "cancelled"
        deleted = http.delete(f"{url}/{second['id']}")
        assert deleted.status_code == 200, deleted.text
        assert http.get(f"{url}/{second['id']}").status_code == 404
        stats = http.get(f"{producer.base_url}/engine/stats").json()
        assert (stats["running"], stats["kv_cells_used"]) == (0, 0)
        assert stats["aborted_requests"] == 2
        # A resumable chat stream too (it was a 404 from the other replica).
        chat = {**CHAT, "model": "scripted", "max_tokens": 4000, "stream": True}
        chat["stream_options"] = {"resumable": True}
        path = "/v1/chat/completions"
        with http.stream("POST", f"{producer.base_url}{path}", json=chat) as stream:
            lines = stream.iter_lines()
            chat_id = next(lines)[4:].rpartition(".")[0]  # id: <response id>.0
            stopped = http.post(f"{other.base_url}{path}/{chat_id}/cancel")
            rest = "\n".join(lines)
        assert stopped.json() == {"id": chat_id, "cancelled": True}
        assert '"code":"cancelled"' in rest
        again = http.post(f"{other.base_url}{path}/{chat_id}/cancel")
        assert again.status_code == 409, again.text
        assert again.json()["error"]["code"] == "stream_finished"
        stats = http.get(f"{producer.base_url}/engine/stats").json()
        assert (stats["running"], stats["aborted_requests"]) == (0, 3)
