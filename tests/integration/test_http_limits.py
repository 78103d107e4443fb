"""HTTP limits of ``serve``, over raw sockets: head size, read deadlines, the
connection cap, HTTP/1.0 framing, and the access rules a browser meets.

The servers run the scripted engine with small limits set by their CLI flags.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import socket
import subprocess
import time
import zlib
from contextlib import ExitStack, closing

import httpx
import openai
import pytest

from sluicegate.server.http.connections import default_max_connections

from .servers import ServerProcess, StartServer

pytestmark = [pytest.mark.integration]

TIMEOUT_S = 1.0
"""``--header-timeout-s`` and ``--body-timeout-s`` of the ``limited`` server."""
GIVE_UP_S = 10.0
"""How long a test waits for a close that must come after ``TIMEOUT_S``."""
MAX_HEADER_BYTES = 32 * 1024
CHAT = "/v1/chat/completions"
CHAT_BODY = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}


@pytest.fixture(scope="module")
def limited(start_server: StartServer) -> ServerProcess:
    """No keys; 1 s to send a head and a body; 10 scripted tokens/s."""
    return start_server(
        "limited",
        "--engine",
        "scripted",
        "--scripted-rate",
        "10",
        "--log-level",
        "warning",
        "--no-ledger",
        "--header-timeout-s",
        str(TIMEOUT_S),
        "--body-timeout-s",
        str(TIMEOUT_S),
        "--max-header-bytes",
        str(MAX_HEADER_BYTES),
    )


def _connect(server: ServerProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=GIVE_UP_S)


def _read_to_close(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and when it closed (s)."""
    start = time.monotonic()
    data = b""
    while True:
        try:
            piece = sock.recv(65536)
        except ConnectionResetError:
            piece = b""
        if not piece:
            return data, time.monotonic() - start
        data += piece


def _head(data: bytes) -> tuple[bytes, list[tuple[bytes, bytes]], bytes]:
    """The status line, the headers (lower-case names) and the body of a reply."""
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = [
        (name.strip().lower(), value.strip())
        for name, _, value in (line.partition(b":") for line in lines)
    ]
    return status, headers, body


def _request(
    server: ServerProcess, body: bytes, version: str = "1.1", **extra: str
) -> bytes:
    lines = [
        f"POST {CHAT} HTTP/{version}",
        f"Host: 127.0.0.1:{server.port}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        *(f"{k.replace('_', '-')}: {v}" for k, v in extra.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _rss_bytes(server: ServerProcess) -> int:
    with open(f"/proc/{server.process.pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _healthy(server: ServerProcess) -> bool:
    return httpx.get(f"{server.base_url}/health", timeout=5).status_code == 200


def _refusals(server: ServerProcess, code: str) -> float:
    """``sluicegate_refused_requests_total`` of ``code`` (0 before the first)."""
    text = httpx.get(f"{server.base_url}/metrics", timeout=GIVE_UP_S).text
    prefix = f'sluicegate_refused_requests_total{{code="{code}"}} '
    counts = [
        float(line[len(prefix) :])
        for line in text.splitlines()
        if line.startswith(prefix)
    ]
    return counts[0] if counts else 0.0


def test_the_listen_queue_holds_as_many_connections_as_the_cap(
    limited: ServerProcess,
) -> None:
    """A ramp of new streams waits in the listen queue while the core is busy:
    it holds the connection cap (4,096 by default; as far as the kernel
    allows), not uvicorn's 2,048, past which a connection's handshake is
    dropped and retried a second later."""
    ss = shutil.which("ss")
    if ss is None or not os.path.exists("/proc/sys/net/core/somaxconn"):
        pytest.skip("needs Linux's ss to read a listening socket's backlog")
    with open("/proc/sys/net/core/somaxconn") as limit:
        somaxconn = int(limit.read())
    shown = subprocess.run(
        [ss, "-ltnH", f"sport = :{limited.port}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    backlog = max(2048, default_max_connections())  # the server's own rlimit
    assert int(shown[2]) == min(backlog, somaxconn)  # Send-Q: the backlog


# -- the request head --------------------------------------------------------------


def test_a_head_over_the_limit_gets_431_and_a_close(limited: ServerProcess) -> None:
    with closing(_connect(limited)) as sock:
        sock.sendall(
            b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: "
            + b"a" * (MAX_HEADER_BYTES + 1000)
        )
        data, _ = _read_to_close(sock)
    status, headers, body = _head(data)
    assert status.startswith(b"HTTP/1.1 431 "), data[:200]
    assert (b"connection", b"close") in headers
    assert json.loads(body)["error"]["code"] == "request_header_too_large"
    assert _refusals(limited, "request_header_too_large") >= 1


def test_a_whole_head_over_the_limit_sent_at_once_gets_431(
    limited: ServerProcess,
) -> None:
    head = (
        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: "
        + b"a" * (MAX_HEADER_BYTES + 1000)
        + b"\r\n\r\n"
    )
    with closing(_connect(limited)) as sock:
        sock.sendall(head)  # most likely one read on the server's side
        data, _ = _read_to_close(sock)
    status, _, body = _head(data)
    assert status.startswith(b"HTTP/1.1 431 "), data[:200]
    assert json.loads(body)["error"]["code"] == "request_header_too_large"


def test_a_1_mb_header_is_refused(limited: ServerProcess) -> None:
    head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 2**20
    with closing(_connect(limited)) as sock:
        # Closed while we send: the refusal may be lost with the reset.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(head + b"\r\n\r\n")
        data, _ = _read_to_close(sock)
    assert data == b"" or data.startswith(b"HTTP/1.1 431 "), data[:200]
    assert _healthy(limited)


def test_unfinished_huge_heads_do_not_grow_the_server(limited: ServerProcess) -> None:
    before = _rss_bytes(limited)
    with ExitStack() as stack:
        for _ in range(30):
            sock = stack.enter_context(closing(_connect(limited)))
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                # 4 MB of one header that never ends
                sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 2**22)
        grown = _rss_bytes(limited) - before
    assert grown < 40 * 2**20, f"the server grew by {grown / 2**20:.0f} MiB"
    assert _healthy(limited)


# -- read deadlines ----------------------------------------------------------------


def test_a_connection_that_sends_nothing_is_closed(limited: ServerProcess) -> None:
    with closing(_connect(limited)) as sock:
        data, closed_after_s = _read_to_close(sock)
    assert TIMEOUT_S * 0.8 <= closed_after_s < TIMEOUT_S + 3, closed_after_s
    status, _, body = _head(data)
    assert status.startswith(b"HTTP/1.1 408 "), data[:200]
    assert json.loads(body)["error"]["code"] == "request_timeout"
    assert _refusals(limited, "request_timeout") >= 1


def test_trickled_headers_do_not_extend_the_deadline(limited: ServerProcess) -> None:
    with closing(_connect(limited)) as sock:
        start = time.monotonic()
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        try:
            for i in range(int(GIVE_UP_S / 0.2)):  # one header line every 0.2 s
                sock.sendall(f"X-{i}: a\r\n".encode())
                time.sleep(0.2)
        except (BrokenPipeError, ConnectionResetError):
            pass
        data, _ = _read_to_close(sock)
        closed_after_s = time.monotonic() - start
    assert closed_after_s < TIMEOUT_S + 3, closed_after_s
    assert data == b"" or data.startswith(b"HTTP/1.1 408 "), data[:200]


def test_a_body_that_never_ends_is_closed(limited: ServerProcess) -> None:
    body = json.dumps(CHAT_BODY).encode()
    request = _request(limited, body)
    with closing(_connect(limited)) as sock:
        sock.sendall(request[: len(request) - len(body) // 2])  # half of the body
        data, closed_after_s = _read_to_close(sock)
    assert TIMEOUT_S * 0.8 <= closed_after_s < TIMEOUT_S + 3, closed_after_s
    assert data.startswith(b"HTTP/1.1 408 "), data[:200]


def test_a_stream_outlives_the_read_deadlines(limited: ServerProcess) -> None:
    """25 tokens at 10 per second: a response is never cut by a read deadline."""
    payload = {**CHAT_BODY, "max_tokens": 25, "stream": True}
    with closing(_connect(limited)) as sock:
        sock.sendall(
            _request(limited, json.dumps(payload).encode(), Connection="close")
        )
        data, took_s = _read_to_close(sock)
    assert took_s > TIMEOUT_S * 2
    assert data.startswith(b"HTTP/1.1 200 ")
    assert data.rstrip().endswith(b"0")  # the last chunk
    assert b"data: [DONE]" in data


def test_an_idle_keep_alive_connection_still_serves_its_next_request(
    limited: ServerProcess,
) -> None:
    """The head deadline starts with a request's first byte, not after the
    previous response: uvicorn's keep-alive timeout (5 s) governs the idle time."""
    with httpx.Client(base_url=limited.base_url, timeout=GIVE_UP_S) as client:
        assert client.get("/health").status_code == 200
        time.sleep(TIMEOUT_S * 2)
        assert client.get("/health").status_code == 200
        assert client.get("/health").headers.get("connection") is None


def test_a_body_drained_after_an_early_answer_leaves_a_bounded_idle_connection(
    limited: ServerProcess,
) -> None:
    """405 before the body was read; the body comes after. The connection is then
    idle: closed within the head deadline, with no stray 408 on it."""
    with closing(_connect(limited)) as sock:
        sock.sendall(
            f"POST /health HTTP/1.1\r\nHost: 127.0.0.1:{limited.port}\r\n"
            "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n".encode()
        )
        answer = b""
        while b"\r\n\r\n" not in answer:
            piece = sock.recv(65536)
            assert piece, answer
            answer += piece
        assert answer.startswith(b"HTTP/1.1 405 "), answer[:200]
        _, headers, body = _head(answer)
        length = int(dict(headers)[b"content-length"])
        while len(body) < length:
            body += sock.recv(65536)
        sock.sendall(b"{}")
        rest, closed_after_s = _read_to_close(sock)
    assert rest == b"", rest[:200]
    assert closed_after_s < TIMEOUT_S + 3, closed_after_s


# -- HTTP/1.0 ----------------------------------------------------------------------


def test_an_http_1_0_stream_is_delimited_by_the_close_not_chunked(
    limited: ServerProcess,
) -> None:
    payload = json.dumps({**CHAT_BODY, "stream": True}).encode()
    with closing(_connect(limited)) as sock:
        sock.sendall(_request(limited, payload, version="1.0"))
        data, _ = _read_to_close(sock)
    status, headers, body = _head(data)
    assert status.startswith(b"HTTP/1.1 200 "), data[:300]
    names = [name for name, _ in headers]
    assert b"transfer-encoding" not in names
    assert b"content-length" not in names
    assert [v for n, v in headers if n == b"connection"] == [b"close"]
    assert body.startswith(b"data: {"), body[:100]  # no chunk-size line
    assert body.endswith(b"data: [DONE]\n\n"), body[-100:]


def test_an_http_1_1_stream_is_chunked_with_no_connection_header(
    limited: ServerProcess,
) -> None:
    payload = json.dumps({**CHAT_BODY, "stream": True}).encode()
    with closing(_connect(limited)) as sock:
        sock.sendall(_request(limited, payload))
        data = b""
        while not data.endswith(b"0\r\n\r\n"):
            piece = sock.recv(65536)
            assert piece, data
            data += piece
    _, headers, _ = _head(data)
    assert (b"transfer-encoding", b"chunked") in headers
    assert b"connection" not in [name for name, _ in headers]


# -- what a web page can make a browser send ---------------------------------------


def test_a_text_plain_post_is_415(limited: ServerProcess) -> None:
    response = httpx.post(
        f"{limited.base_url}{CHAT}",
        content=json.dumps(CHAT_BODY),
        headers={"Content-Type": "text/plain"},
        timeout=GIVE_UP_S,
    )
    assert response.status_code == 415
    assert response.json()["error"]["code"] == "unsupported_media_type"


def test_a_compressed_body_is_decoded_within_the_body_limit(
    limited: ServerProcess,
) -> None:
    """``Content-Encoding`` was ignored: a gzip body was parsed as if plain. It
    is decoded now, bounded by the body limit (4 MiB) in decoded bytes too: a
    64 KiB body that inflates to 16 MiB is a 413, not 16 MiB of memory."""
    body = json.dumps({**CHAT_BODY, "max_tokens": 1}).encode()
    bomb = gzip.compress(b"[" + b" " * (16 * 1024 * 1024) + b"]")
    assert len(bomb) < 64 * 1024
    sent = [
        ("gzip", gzip.compress(body), CHAT, 200, None),
        ("deflate", zlib.compress(body), CHAT, 200, None),
        ("gzip", bomb, CHAT, 413, "request_too_large"),
        ("gzip", gzip.compress(body)[:-9], CHAT, 400, "invalid_encoding"),
        ("br", body, CHAT, 415, "unsupported_content_encoding"),
        ("gzip", bomb, "/v1/messages", 413, None),
    ]
    with httpx.Client(base_url=limited.base_url, timeout=GIVE_UP_S) as client:
        for coding, data, path, status, code in sent:
            headers = {"Content-Type": "application/json", "Content-Encoding": coding}
            answer = client.post(path, content=data, headers=headers)
            assert answer.status_code == status, (coding, path, answer.text)
            if status == 200:
                assert answer.json()["choices"][0]["finish_reason"] == "length"
            elif path == CHAT:
                assert answer.json()["error"]["code"] == code
            else:  # Anthropic's shape
                assert answer.json()["error"]["type"] == "request_too_large"
    assert "decodes (gzip) to more than 4194304 bytes" in answer.text


@pytest.mark.parametrize("path", ["/v1/models", "/engine/stats", "/metrics"])
def test_a_rebound_host_name_gets_421(limited: ServerProcess, path: str) -> None:
    response = httpx.get(
        f"{limited.base_url}{path}",
        headers={"Host": f"rebind.example:{limited.port}"},
        timeout=GIVE_UP_S,
    )
    assert response.status_code == 421
    assert response.json()["error"]["code"] == "host_not_allowed"
    local = httpx.get(
        f"{limited.base_url}{path}",
        headers={"Host": f"localhost:{limited.port}"},
        timeout=GIVE_UP_S,
    )
    assert local.status_code == 200


def test_the_openai_sdk_still_streams(limited: ServerProcess) -> None:
    with openai.OpenAI(
        base_url=f"{limited.base_url}/v1", api_key="unused", max_retries=0
    ) as client:
        chunks = list(
            client.chat.completions.create(
                model="default",
                messages=[{"role": "user", "content": "Hi"}],
                max_tokens=3,
                stream=True,
            )
        )
    assert chunks[-1].choices[0].finish_reason == "length"


# -- the connection cap and keys ---------------------------------------------------


@pytest.fixture(scope="module")
def capped(start_server: StartServer) -> ServerProcess:
    """At most 3 connections; idle ones may wait 30 s for their request."""
    return start_server(
        "capped",
        "--engine",
        "scripted",
        "--log-level",
        "warning",
        "--no-ledger",
        "--max-connections",
        "3",
        "--header-timeout-s",
        "30",
    )


def _get_health(server: ServerProcess) -> bytes:
    with closing(_connect(server)) as sock:
        sock.sendall(
            f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        data, _ = _read_to_close(sock)
    return data


def test_a_connection_over_the_cap_gets_503_not_a_reset(capped: ServerProcess) -> None:
    """In the OpenAI error shape, with ``Retry-After`` (uvicorn's own is plain
    text without it), and counted in the metrics."""
    idle = [_connect(capped) for _ in range(3)]
    try:
        time.sleep(0.3)  # accepted by now
        refused = _get_health(capped)
        status, headers, body = _head(refused)
        assert status.startswith(b"HTTP/1.1 503 "), refused[:200]
        assert (b"retry-after", b"1") in headers
        assert (b"connection", b"close") in headers
        assert (b"content-type", b"application/json") in headers
        error = json.loads(body)["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] == "too_many_connections"
        idle.pop().close()
        deadline = time.monotonic() + GIVE_UP_S
        while not (served := _get_health(capped)).startswith(b"HTTP/1.1 200 "):
            assert time.monotonic() < deadline, served[:200]
            time.sleep(0.1)
        assert _refusals(capped, "too_many_connections") >= 1
    finally:
        for sock in idle:
            sock.close()


@pytest.fixture(scope="module")
def keyed(start_server: StartServer) -> ServerProcess:
    """An API key and an admin key."""
    return start_server(
        "keyed-admin",
        "--engine",
        "scripted",
        "--log-level",
        "warning",
        "--no-ledger",
        "--api-key",
        "sk-api",
        "--admin-key",
        "sk-admin",
    )


def test_keys_guard_the_api_and_admin_keys_the_operator_routes(
    keyed: ServerProcess,
) -> None:
    def get(path: str, key: str | None) -> int:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        url = f"{keyed.base_url}{path}"
        return httpx.get(url, headers=headers, timeout=GIVE_UP_S).status_code

    assert [get("/v1/models", k) for k in (None, "sk-admin", "sk-api")] == [
        401,
        401,
        200,
    ]
    assert [get("/openapi.json", k) for k in (None, "sk-api")] == [401, 200]
    for path in ("/metrics", "/engine/stats"):
        assert [get(path, k) for k in (None, "sk-api", "sk-admin")] == [401, 401, 200]
    assert [get(p, None) for p in ("/health", "/ready")] == [200, 200]
    metrics = httpx.get(
        f"{keyed.base_url}/metrics",
        headers={"Authorization": "Bearer sk-admin"},
        timeout=GIVE_UP_S,
    ).text
    assert 'sluicegate_refused_requests_total{code="missing_api_key"} 2.0' in metrics
