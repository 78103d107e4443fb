"""Through a real nginx with default ``proxy_buffering on``, events still flow.

A proxy that buffers an event stream delivers it in bursts of a buffer (4-8 KB,
~20-40 chunks) or all at the end; an unbuffered one delivers it event by event as
the model writes. The server also sends ``X-Accel-Buffering: no`` (checked directly
in ``test_headers.py``). Measured with nginx 1.22: to a client that keeps up, nginx
passed events one by one even when told to ignore that header, so this test guards
the end-to-end property, not the header's effect.

nginx comes from Debian (``scripts/install-system-deps``); see ``nginx.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from .nginx import running_nginx
from .servers import ServerProcess, free_port
from .wire import NO_END_TOKENS, collect

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]

SERVER_BLOCK = """\
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
        # As the shipped config does: a keyless server checks Host, and without
        # this nginx would send the upstream's name ("sluicegate").
        proxy_set_header Host $host;
        proxy_read_timeout 120s;
    }}
}}
"""


@pytest.fixture(scope="module")
def nginx_url(
    llama_server: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """nginx on a free port in front of the llama.cpp server."""
    root = tmp_path_factory.mktemp("nginx")
    port = free_port()
    block = SERVER_BLOCK.format(port=port, upstream_port=llama_server.port)
    url = f"http://127.0.0.1:{port}"
    with running_nginx(root, [block], [f"{url}/health"]):
        yield url


def test_events_pass_through_nginx_as_they_are_written(nginx_url: str) -> None:
    """With nginx's default buffering, events still arrive one by one.

    Two checks, neither a timing threshold on the server: the first content event
    arrives in the first half of the stream's lifetime (not at the end), and the
    content events arrive over many separate socket reads (not in buffer-sized
    bursts, where one read would carry dozens of events). The end tokens are
    banned, so that the answer runs to ``max_tokens`` whatever this machine's
    model would rather write.
    """
    payload = {
        "messages": [{"role": "user", "content": "Write a long story."}],
        "max_tokens": 96,
        "temperature": 0,
        "logit_bias": NO_END_TOKENS,
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
