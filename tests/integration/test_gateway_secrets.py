"""The upstream's key never leaves a real gateway, whatever path an error takes.

A real ``sluicegate serve --upstreams FILE`` process holds a key (Hypothesis
draws it) from ``api_key_env``; its upstream is a ``FakeUpstream`` that puts
that key everywhere an upstream might echo it: error bodies of every class of
status, a ``Retry-After``, a ``Location``, in-band errors before and after
content. The key must appear in none of the client's response bytes, the
gateway's log (its stdout and stderr, at ``--log-level info``), ``/metrics``
or the SQLite ledger file. The statuses are the table's (docs/security.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from sluicegate import testing

from .gateway import READ_TIMEOUT_S, FakeUpstream, Reply, chat_chunk
from .servers import free_port

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"
MODEL = "fake"

keys = st.text(
    st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters='"\\'),
    min_size=16,
    max_size=48,
)


def echo(key: str, path: str) -> Reply:
    """What the upstream answers for ``path``, the key echoed in it."""
    error = {"error": {"message": f"Incorrect API key provided: {key}", "code": key}}
    if path == "in-band before":
        inband = {"error": {"message": key, "type": key, "code": 400}}
        return Reply(events=[json.dumps(inband)])
    if path == "in-band after":
        inband = {"error": {"message": f"oom {key}", "code": key}}
        return Reply(events=[chat_chunk(0, "hi"), json.dumps(inband)])
    status, headers = {
        "400": (400, {}),
        "401": (401, {}),
        "404": (404, {}),
        "407": (407, {"Proxy-Authenticate": f"Basic realm={key}"}),
        "418": (418, {}),
        "429": (429, {"Retry-After": key}),
        "500": (500, {"X-Echo": key}),
        "503": (503, {"Retry-After": "1000000000"}),
        "307": (307, {"Location": f"http://127.0.0.1:9/{key}"}),
    }[path]
    return Reply(status=status, headers=headers, body=error)


EXPECTED = {
    "400": 400,
    "401": 502,
    "404": 502,
    "407": 502,
    "418": 502,
    "429": 503,
    "500": 502,
    "503": 503,
    "307": 502,
    "in-band before": 400,
    "in-band after": 200,
}


def start(tmp: Path, url: str, key: str) -> testing.ServerProcess:
    config = tmp / "upstreams.toml"
    config.write_text(
        f'[[models]]\nid = "{MODEL}"\nhealth_interval_s = 0\n'
        # every answer here is a failure: the one upstream must not be ejected
        "eject_after_failures = 1000\n"
        f'[[models.upstreams]]\nurl = "{url}"\napi_key_env = "HOP_KEY"\n',
        encoding="utf-8",
    )
    port = free_port()
    command = testing.serve_command(
        port,
        *("--upstreams", str(config), "--ledger", str(tmp / "ledger.db")),
        *("--log-level", "info"),
    )
    server = testing.ServerProcess(
        command, port, log_path=tmp / "gateway.log", env={"HOP_KEY": key}
    )
    try:
        server.wait_ready("/health", timeout_s=60)
    except testing.ServerNotReady as exc:
        server.stop()
        pytest.fail(str(exc), pytrace=False)
    return server


@settings(
    max_examples=3,
    deadline=None,
    phases=[Phase.generate],  # each example starts a gateway: no shrinking
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(key=keys)
def test_the_key_is_nowhere_a_client_or_an_operator_can_read(
    tmp_path_factory: pytest.TempPathFactory, key: str
) -> None:
    tmp = tmp_path_factory.mktemp("secrets")
    fake_path: dict[str, str] = {}

    def reply(body: dict[str, Any]) -> Reply:
        return echo(key, fake_path["now"])

    seen: list[bytes] = []
    with FakeUpstream(reply) as upstream:
        server = start(tmp, upstream.url, key)
        try:
            with httpx.Client(base_url=server.base_url, timeout=READ_TIMEOUT_S) as c:
                for path, status in EXPECTED.items():
                    fake_path["now"] = path
                    for stream in (False, True):
                        body = {
                            "model": MODEL,
                            "messages": [{"role": "user", "content": "hi"}],
                            "stream": stream,
                        }
                        response = c.post(CHAT, json=body)
                        seen.append(response.content + str(response.headers).encode())
                        # non-streamed, failed after content: the server's 500
                        expected = (
                            500 if path == "in-band after" and not stream else status
                        )
                        assert response.status_code == expected, (path, response.text)
                        if expected == 503:
                            assert int(response.headers["retry-after"]) <= 3600
                metrics = c.get("/metrics")
                seen.append(metrics.content)
        finally:
            server.stop()
    secret = key.encode()
    assert any(b"[redacted]" in content for content in seen)  # it was echoed
    for i, content in enumerate(seen):
        assert secret not in content, i
    assert key not in server.log_text()
    for ledger in tmp.rglob("ledger.db*"):  # the WAL and lock files too
        if ledger.is_file():
            assert secret not in ledger.read_bytes(), ledger
    assert "answered 401" in server.log_text()  # the log has the upstream's story


PASSWORD = "pw-in-the-url-7f3a9c"


def test_a_password_in_the_upstream_url_is_in_no_log_line(tmp_path: Path) -> None:
    """httpx logs every request's URL at INFO; the gateway's first requests (its
    upstreams' model lists and context windows, at start-up) went out before it
    was quieted, so ``--upstream http://user:PASSWORD@host/v1`` put the
    password in the log, as ``sluicegate doctor --upstream`` did on the
    terminal."""

    def reply(body: dict[str, Any]) -> Reply:
        return Reply(
            events=[chat_chunk(0, "hi"), chat_chunk(0, None, "stop"), "[DONE]"]
        )

    with FakeUpstream(reply) as upstream:
        url = upstream.url.replace("http://", f"http://alice:{PASSWORD}@")
        port = free_port()
        command = testing.serve_command(
            port,
            *("--upstream", url, "--upstream-model", MODEL, "--no-ledger"),
            *("--log-level", "info"),
        )
        with testing.ServerProcess(
            command, port, log_path=tmp_path / "gateway.log"
        ) as server:
            server.wait_ready("/health", timeout_s=60)
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
            response = httpx.post(f"{server.base_url}{CHAT}", json=body, timeout=30)
            assert response.status_code == 200, response.text
            assert "GET /v1/models" in upstream.calls  # it was asked at start-up
            log = server.log_text()
        assert PASSWORD not in log
        doctor = subprocess.run(
            [sys.executable, "-m", "sluicegate", "doctor", "--upstream", url],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert "127.0.0.1" in doctor.stdout + doctor.stderr
        assert PASSWORD not in doctor.stdout + doctor.stderr
