"""A signal to every process of ``serve --engine-process --workers 2`` at once.

systemd's default ``KillMode=control-group`` sends SIGTERM to the parent, the
engine process and each worker together; Kubernetes and ``docker stop`` send it
to the parent only. Either way the streams drain as on SIGTERM to the parent:
the engine process keeps serving while the workers drain, and each stream ends
after the grace period with the in-band ``server_shutdown`` error, not
``engine_crashed``. SIGINT (``systemctl kill --signal=SIGINT``) is the same.

The scripted engine's sequences never finish, so every stream is still
running when the grace period ends, whatever the machine's speed.
"""

from __future__ import annotations

import json
import os
import signal
from contextlib import ExitStack, closing
from pathlib import Path

import pytest

from tests.redis_server import RedisServer
from tests.sse_lines import data_lines

from .servers import ServerProcess
from .workers import children_of, client_on, engine_pid

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STREAM = {
    "messages": [{"role": "user", "content": "Say hi"}],
    "stream": True,
}


@pytest.mark.parametrize(
    ("sig", "everyone"),
    [(signal.SIGTERM, True), (signal.SIGINT, True), (signal.SIGTERM, False)],
    ids=["sigterm-to-every-process", "sigint-to-every-process", "sigterm-to-parent"],
)
def test_a_signal_to_every_process_drains_as_one_to_the_parent(
    redis_server: RedisServer, tmp_path: Path, sig: signal.Signals, everyone: bool
) -> None:
    server = ServerProcess(
        "group-signal",
        [
            "--engine-process", "--workers", "2", "--redis", redis_server.url,
            "--engine", "scripted", "--fault", "never-finishes",
            "--scripted-rate", "50", "--grace-s", "2", "--no-ledger",
        ],
        tmp_path,
    )  # fmt: skip
    with server, ExitStack() as stack:
        server.wait_healthy()
        first, first_pid = client_on(server.base_url)
        second, _ = client_on(server.base_url, not_pid=first_pid)
        streams = []
        for client in (first, second):
            stack.enter_context(closing(client))
            live = stack.enter_context(
                client.stream("POST", "/v1/chat/completions", json=STREAM)
            )
            assert live.status_code == 200
            streams.append(live.iter_lines())
        heads = [data_lines(lines, stop_after=2) for lines in streams]
        engine = engine_pid(server.pid)
        assert engine is not None
        targets = [server.pid]
        if everyone:
            targets += list(children_of(server.pid))  # the engine and both workers
            assert len(targets) == 4
        for pid in targets:
            os.kill(pid, sig)
        tails = [data_lines(lines) for lines in streams]
        assert server.process.wait(60) == 0
    for head, tail in zip(heads, tails, strict=True):
        assert head
        chunks = [json.loads(d) for d in tail if d != "[DONE]"]
        errors = [c["error"]["code"] for c in chunks if "error" in c]
        assert errors == ["server_shutdown"], tail[-3:]
        assert "[DONE]" not in tail
