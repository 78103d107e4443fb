"""Through a real nginx with default ``proxy_buffering on``, events still flow (S15).

A proxy that buffers an event stream delivers it in bursts of a buffer (4-8 KB,
~20-40 chunks) or all at the end; an unbuffered one delivers it event by event as
the model writes. The server also sends ``X-Accel-Buffering: no`` (checked directly
in ``test_headers.py``). Measured with nginx 1.22: to a client that keeps up, nginx
passed events one by one even when told to ignore that header, so this test guards
the end-to-end property, not the header's effect.

nginx comes from Debian (``scripts/install-system-deps``); it runs in the
foreground as one process, with a generated config and every path in a temp dir.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .servers import ServerProcess, free_port
from .wire import collect

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]

NGINX = Path("/usr/sbin/nginx")
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0

CONFIG = """\
daemon off;
master_process off;
pid {root}/nginx.pid;
error_log {root}/error.log info;
events {{
    worker_connections 64;
}}
http {{
    access_log off;
    client_body_temp_path {root}/client_body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    upstream sluicegate {{
        server 127.0.0.1:{upstream_port};
        keepalive 4;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://sluicegate;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_read_timeout 120s;
        }}
    }}
}}
"""


@pytest.fixture(scope="module")
def nginx_url(
    llama_server: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """nginx on a free port in front of the llama.cpp server."""
    if not NGINX.exists():
        pytest.fail(f"{NGINX} is missing: run scripts/install-system-deps")
    root = tmp_path_factory.mktemp("nginx")
    port = free_port()
    config = root / "nginx.conf"
    config.write_text(
        CONFIG.format(root=root, port=port, upstream_port=llama_server.port)
    )
    log_path = root / "nginx.out"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                str(NGINX),
                "-p",
                str(root),
                "-e",
                str(root / "error.log"),
                "-c",
                str(config),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_nginx(process, url, root)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_for_nginx(process: subprocess.Popen[bytes], url: str, root: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    with httpx.Client(base_url=url, timeout=5) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                break
            try:
                if client.get("/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
    logs = "\n".join(
        p.read_text(errors="replace")
        for p in (root / "nginx.out", root / "error.log")
        if p.exists()
    )
    pytest.fail(f"nginx did not proxy /health within {START_TIMEOUT_S} s:\n{logs}")


def test_events_pass_through_nginx_as_they_are_written(nginx_url: str) -> None:
    """S15: with nginx's default buffering, events still arrive one by one.

    Two checks, neither a timing threshold on the server: the first content event
    arrives in the first half of the stream's lifetime (not at the end), and the
    content events arrive over many separate socket reads (not in buffer-sized
    bursts, where one read would carry dozens of events).
    """
    payload = {
        "messages": [{"role": "user", "content": "Write a long story."}],
        "max_tokens": 96,
        "temperature": 0,
    }
    with httpx.Client(base_url=nginx_url, timeout=60) as client:
        recorded, choices = collect(client, "/v1/chat/completions", payload)

    assert recorded.headers["content-type"].startswith("text/event-stream")
    assert "content-encoding" not in recorded.headers
    content = [
        i
        for i, event in enumerate(recorded.events[:-1])
        if (chunk := json.loads(event))["choices"]
        and chunk["choices"][0]["delta"].get("content")
    ]
    assert len(content) >= 48, f"too few events to tell: {choices[0].text!r}"

    started_s = recorded.sent_at_s
    first_s = recorded.arrivals_s[content[0]]
    done_s = recorded.arrivals_s[-1]
    assert first_s - started_s < (done_s - started_s) / 2, (
        f"first content after {first_s - started_s:.2f} s "
        f"of a {done_s - started_s:.2f} s stream"
    )
    reads = {recorded.read_index[i] for i in content}
    assert len(reads) >= len(content) / 4, (
        f"{len(content)} content events arrived in only {len(reads)} reads"
    )
