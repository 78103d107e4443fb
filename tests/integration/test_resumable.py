"""Resumable streams against real server processes (scripted engine: timing).

A stream cut anywhere (at every event boundary and inside every event) and then
resumed gives the client the same text, logprobs, finish reasons and usage as
the uninterrupted stream; a cut before the first whole event is retried with
the same ``Idempotency-Key`` and attaches to the first generation. The grace
period aborts an abandoned stream in the engine (KV cells freed), another key
gets the same 404 as an unknown id, an evicted cursor 410, an expired log 404,
and the client resumes by itself through a proxy that drops its connection.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from sluicegate.client import Client
from sluicegate.client.assemble import StreamAssembler
from sluicegate.client.results import StreamResult
from sluicegate.core.endstate import EndState
from sluicegate.server.ledger.ledger import LedgerRow, read_rows

from .servers import ServerProcess, StartServer

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"
KEY_A, KEY_B, ADMIN = "key-a", "key-b", "admin"
GIVE_UP_S = 20.0
"""A liveness deadline for what polls (the grace, the TTL): not a threshold."""


def chat_body(**extra: Any) -> dict[str, Any]:
    return {
        "model": "default",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True, "resumable": True},
        "logprobs": True,
        "top_logprobs": 2,
        **extra,
    }


@pytest.fixture(scope="module")
def ledger_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("resumable") / "ledger.sqlite"


@pytest.fixture(scope="module")
def server(start_server: StartServer, ledger_path: Path) -> ServerProcess:
    """Scripted, 200 tokens/s (a stream lasts about 0.1 s), two API keys."""
    return start_server(
        "resumable",
        "--engine",
        "scripted",
        "--scripted-rate",
        "200",
        "--api-key",
        KEY_A,
        "--api-key",
        KEY_B,
        "--admin-key",
        ADMIN,
        "--ledger",
        str(ledger_path),
    )


@pytest.fixture(scope="module")
def short_ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("resumable-short") / "ledger.sqlite"


@pytest.fixture(scope="module")
def short_server(start_server: StartServer, short_ledger: Path) -> ServerProcess:
    """Scripted, slow, with a short grace, a small log bound and a short TTL."""
    return start_server(
        "resumable-short",
        "--engine",
        "scripted",
        "--scripted-rate",
        "20",
        "--resume-grace-s",
        "0.3",
        "--max-log-bytes",
        "6000",
        "--resume-ttl-s",
        "0.5",
        "--ledger",
        str(short_ledger),
    )


def http(server: ServerProcess, key: str | None = KEY_A) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=server.base_url, headers=headers, timeout=30)


def read_prefix(
    client: httpx.Client, body: dict[str, Any], cut: int, idempotency_key: str
) -> bytes:
    """POST, read the first ``cut`` body bytes, then drop the connection."""
    headers = {"Idempotency-Key": idempotency_key}
    received = b""
    with client.stream("POST", CHAT, json=body, headers=headers) as response:
        assert response.status_code == 200, response.read()
        for chunk in response.iter_raw():
            received += chunk
            if len(received) >= cut:
                break
    return received[:cut]


def resumed(client: httpx.Client, body: dict[str, Any], cut: int) -> StreamResult:
    """The client's result for a stream cut after ``cut`` bytes, then resumed."""
    key = uuid.uuid4().hex
    assembler = StreamAssembler()
    assembler.head(200, {}, 0.0)
    assembler.feed(read_prefix(client, body, cut, key), 0.0)
    cursor = assembler.resume()
    if cursor is None:  # no whole event yet: the same POST and key attach
        assembler = StreamAssembler()
        with client.stream(
            "POST", CHAT, json=body, headers={"Idempotency-Key": key}
        ) as response:
            assembler.head(response.status_code, response.headers, 0.0)
            for chunk in response.iter_raw():
                assembler.feed(chunk, 0.0)
        return assembler.flush(0.0)
    response_id = cursor.rpartition(".")[0]
    with client.stream(
        "GET", f"{CHAT}/{response_id}/events", headers={"Last-Event-ID": cursor}
    ) as response:
        assert response.status_code == 200, response.read()
        for chunk in response.iter_raw():
            assembler.feed(chunk, 0.0)
    return assembler.flush(0.0)


def answer(result: StreamResult) -> tuple[object, ...]:
    """What a client makes of a stream, ids aside."""
    return (
        result.end_state,
        tuple(
            (c.text, c.finish_reason, c.logprobs, c.tool_calls) for c in result.choices
        ),
        result.usage,
    )


def event_cuts(body: bytes) -> list[int]:
    """Every event boundary of ``body``, and a point inside every event."""
    cuts: list[int] = []
    start = 0
    while (end := body.find(b"\n\n", start)) != -1:
        cuts += [start + (end - start) // 2, end + 2]
        start = end + 2
    return cuts


def test_a_stream_cut_anywhere_resumes_to_the_same_answer(
    server: ServerProcess,
) -> None:
    body = chat_body()
    with http(server) as client:
        with client.stream("POST", CHAT, json=body) as response:
            whole = response.read()
        reference = StreamAssembler()
        reference.head(200, {}, 0.0)
        reference.feed(whole, 0.0)
        expected = answer(reference.flush(0.0))
        assert expected[0] is EndState.FINISHED
        assert whole.startswith(b"id: chatcmpl-")
        cuts = [1, *event_cuts(whole)[:-1]]
        for cut in cuts:
            assert answer(resumed(client, body, cut)) == expected, cut


def test_a_non_resumable_stream_has_no_ids_and_cannot_be_resumed(
    server: ServerProcess,
) -> None:
    body = chat_body(stream_options={"include_usage": True})
    with http(server) as client:
        text = client.post(CHAT, json=body).text
        assert "\nid:" not in text
        assert not text.startswith("id:")
        response_id = text.split('"id":"', 1)[1].split('"', 1)[0]
        gone = client.get(f"{CHAT}/{response_id}/events")
    assert gone.status_code == 404


def test_another_key_gets_the_same_404_as_an_unknown_id(server: ServerProcess) -> None:
    with http(server, KEY_A) as mine, http(server, KEY_B) as theirs:
        text = mine.post(CHAT, json=chat_body()).text
        response_id = text.split('"id":"', 1)[1].split('"', 1)[0]
        assert mine.get(f"{CHAT}/{response_id}/events").status_code == 200
        other = theirs.get(f"{CHAT}/{response_id}/events")
        unknown = mine.get(f"{CHAT}/chatcmpl-{'0' * 32}/events")
        wrong_path = mine.get(f"/v1/completions/{response_id}/events")
    assert other.status_code == unknown.status_code == wrong_path.status_code == 404
    assert other.content == unknown.content == wrong_path.content
    assert other.json()["error"]["code"] == "not_found"


def test_a_malformed_cursor_gets_400(server: ServerProcess) -> None:
    with http(server) as client:
        text = client.post(CHAT, json=chat_body()).text
        response_id = text.split('"id":"', 1)[1].split('"', 1)[0]
        for cursor in ("x", "chatcmpl-other.3", "1" * 200, f"{response_id}.-1"):
            answer_ = client.get(f"{CHAT}/{response_id}/events?after={cursor}")
            assert answer_.status_code == 400, cursor
            assert answer_.json()["error"]["code"] == "invalid_cursor"
        assert (
            client.get(f"{CHAT}/{response_id}/events?after=3").text.count("id: ")
            == text.count("id: ") - 4
        )


def test_a_cursor_at_the_end_of_an_ended_stream_gets_400_not_an_empty_200(
    server: ServerProcess,
) -> None:
    with http(server) as client:
        text = client.post(CHAT, json=chat_body()).text
        response_id = text.split('"id":"', 1)[1].split('"', 1)[0]
        last = text.count("id: ") - 1  # [DONE]'s cursor: what EventSource resends
        for headers in (
            {"last-event-id": f"{response_id}.{last}"},
            {"last-event-id": f"{response_id}.{last + 10}"},
        ):
            answer_ = client.get(f"{CHAT}/{response_id}/events", headers=headers)
            assert answer_.status_code == 400, headers
            error = answer_.json()["error"]
            assert (error["code"], error["param"]) == (
                "cursor_past_end",
                "Last-Event-ID",
            )
        before = client.get(f"{CHAT}/{response_id}/events?after={last - 1}")
        assert before.status_code == 200
        assert before.text.endswith("data: [DONE]\n\n")


def ledger_row(path: Path, response_id: str) -> LedgerRow:
    deadline = time.monotonic() + GIVE_UP_S
    while time.monotonic() < deadline:
        for row in read_rows(path):
            if row.request_id == response_id:
                return row
        time.sleep(0.05)
    raise AssertionError(f"no ledger row for {response_id}")


def test_an_idempotency_key_retry_attaches_without_a_second_generation(
    server: ServerProcess, ledger_path: Path
) -> None:
    sdk = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=KEY_A, max_retries=0)
    key = {"Idempotency-Key": uuid.uuid4().hex}
    options = {"stream_options": {"include_usage": True, "resumable": True}}
    messages: Any = [{"role": "user", "content": "hi"}]
    with http(server, ADMIN) as admin:
        before = admin.get("/engine/stats").json()["finished_requests"]

    def create() -> Any:
        return sdk.chat.completions.create(
            model="default",
            messages=messages,
            stream=True,
            extra_headers=key,
            extra_body=options,
        )

    def answer_of(chunks: list[Any]) -> tuple[object, ...]:
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return chunks[0].id, text, chunks[-1].usage

    first = create()
    started = [next(first), next(first)]  # the retry comes while it generates
    runs = [answer_of(list(create())), answer_of(started + list(first))]
    assert runs[0] == runs[1]
    with http(server, ADMIN) as admin:
        after = admin.get("/engine/stats").json()["finished_requests"]
    assert after - before == 1
    row = ledger_row(ledger_path, str(runs[0][0]))
    assert (row.end_state, row.resumed) == (EndState.FINISHED, 1)
    with pytest.raises(openai.ConflictError) as conflict:
        sdk.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": "another body"}],
            stream=True,
            extra_headers=key,
            extra_body=options,
        )
    assert conflict.value.code == "idempotency_key_reused"
    sdk.close()


def test_the_grace_period_aborts_an_abandoned_stream_and_frees_its_cells(
    short_server: ServerProcess, short_ledger: Path
) -> None:
    with http(short_server, None) as client:
        body = chat_body(logprobs=False, top_logprobs=None)  # the log keeps it all
        prefix = read_prefix(client, body, 1, uuid.uuid4().hex)
        assert prefix == b"i"
        response_id = ""
        deadline = time.monotonic() + GIVE_UP_S
        while time.monotonic() < deadline:
            stats = client.get("/engine/stats").json()
            aborted = [i for i in stats["aborted_ids"] if i.startswith("chatcmpl-")]
            if aborted and stats["running"] == 0:
                response_id = aborted[-1].rsplit("-", 1)[0]
                break
            time.sleep(0.05)
        assert stats["running"] == 0, stats
        assert stats["kv_cells_used"] == 0, stats
        tail = client.get(f"{CHAT}/{response_id}/events").text
    assert '"code":"resume_grace_expired"' in tail
    assert "[DONE]" not in tail
    row = ledger_row(short_ledger, response_id)
    assert (row.end_state, row.status, row.resumed) == (EndState.ABORTED, 200, 0)


def test_an_evicted_cursor_gets_410_and_an_expired_log_404(
    short_server: ServerProcess,
) -> None:
    body = chat_body(max_tokens=40, logprobs=False, top_logprobs=None)
    with http(short_server, None) as client:
        text = client.post(CHAT, json=body).text
        response_id = text.split('"id":"', 1)[1].split('"', 1)[0]
        evicted = client.get(f"{CHAT}/{response_id}/events?after=0")
        cursor = {"Last-Event-ID": _last_id(text)}
        kept = client.get(f"{CHAT}/{response_id}/events", headers=cursor)
        deadline = time.monotonic() + GIVE_UP_S
        expired = kept
        while expired.status_code == 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
            expired = client.get(f"{CHAT}/{response_id}/events", headers=cursor)
    assert evicted.status_code == 410
    assert evicted.json()["error"]["code"] == "cursor_evicted"
    assert kept.status_code == 200
    assert expired.status_code == 404


def _last_id(text: str) -> str:
    return [line[4:] for line in text.splitlines() if line.startswith("id: ")][-2]


class DroppingProxy:
    """A TCP proxy to ``upstream`` that drops its first connection after
    ``drop_after`` bytes of the answer (a network hop that restarts)."""

    def __init__(self, upstream: tuple[str, int], drop_after: int) -> None:
        self._upstream = upstream
        self._drop_after = drop_after
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            limit = self._drop_after if self.connections == 1 else None
            upstream = socket.create_connection(self._upstream)
            for args in ((client, upstream, None), (upstream, client, limit)):
                threading.Thread(target=self._pipe, args=args, daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket, limit: int | None) -> None:
        sent = 0
        try:
            while data := source.recv(65536):
                if limit is not None and sent + len(data) >= limit:
                    sink.sendall(data[: limit - sent])
                    break
                sink.sendall(data)
                sent += len(data)
        except OSError:
            pass
        for end in (source, sink):
            with contextlib.suppress(OSError):  # the other side closed it
                end.shutdown(socket.SHUT_RDWR)
            end.close()

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def proxy(server: ServerProcess) -> Iterator[DroppingProxy]:
    dropping = DroppingProxy(("127.0.0.1", server.port), drop_after=1500)
    yield dropping
    dropping.close()


def test_the_client_resumes_by_itself_through_a_dropped_hop(
    server: ServerProcess, proxy: DroppingProxy
) -> None:
    messages = [{"role": "user", "content": "hi"}]
    with Client(server.base_url, api_key=KEY_A) as client:
        whole = client.chat(messages, model="default")
    with Client(f"http://127.0.0.1:{proxy.port}", api_key=KEY_A) as client:
        with client.stream_chat(messages, model="default", resumable=True) as stream:
            deltas = [d.text for d in stream]
        result = stream.result()
    assert proxy.connections == 2
    assert result.resumes == 1
    assert result.end_state is EndState.FINISHED
    assert "".join(deltas) == result.choices[0].text == whole.choices[0].text
    assert result.usage == whole.usage


def test_sluicegate_chat_survives_a_dropped_hop(
    server: ServerProcess, proxy: DroppingProxy
) -> None:
    with Client(server.base_url, api_key=KEY_A) as client:
        whole = client.chat([{"role": "user", "content": "hi"}], model="default")
    url = f"http://127.0.0.1:{proxy.port}"
    command = [sys.executable, "-m", "sluicegate", "chat", "hi", "--url", url]
    command += ["--api-key", KEY_A, "--model", "default"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert proxy.connections == 2
    assert whole.choices[0].text in done.stdout
    assert "finished" in done.stdout


def test_a_cancelled_stream_is_aborted_at_once_for_its_key_only(
    short_server: ServerProcess, server: ServerProcess
) -> None:
    with http(short_server, None) as client:
        body = chat_body(logprobs=False, top_logprobs=None)
        with client.stream("POST", CHAT, json=body) as response:
            first = next(response.iter_lines())
        response_id = first[4:].rpartition(".")[0]
        cancelled = client.post(f"{CHAT}/{response_id}/cancel")
        tail = client.get(f"{CHAT}/{response_id}/events").text
    assert cancelled.json() == {"id": response_id, "cancelled": True}
    assert '"code":"cancelled"' in tail
    with (
        http(server, KEY_A) as mine,
        http(server, KEY_B) as theirs,
    ):
        with mine.stream("POST", CHAT, json=chat_body()) as response:
            first = next(response.iter_lines())
            response_id = first[4:].rpartition(".")[0]
            refused = theirs.post(f"{CHAT}/{response_id}/cancel")
        whole = mine.get(f"{CHAT}/{response_id}/events")  # read to its end
        finished = mine.post(f"{CHAT}/{response_id}/cancel")
        again = mine.get(f"{CHAT}/{response_id}/events")
    assert refused.status_code == 404
    assert refused.json()["error"]["code"] == "not_found"
    # Ended and still kept: its events are read, and a cancel says it ended
    # (it was a 404, as for an unknown stream).
    assert whole.status_code == again.status_code == 200
    assert whole.text.rstrip().endswith("data: [DONE]")
    assert finished.status_code == 409, finished.text
    error = finished.json()["error"]
    assert (error["code"], error["type"]) == (
        "stream_finished",
        "invalid_request_error",
    )
    assert "has already finished" in error["message"]
