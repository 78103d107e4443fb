"""``Stream.interrupt()`` on a real socket: a read blocked in the kernel returns at
once, and the server sees the client leave (what Ctrl-C in ``sluicegate chat``
relies on)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from sluicegate.client import Client, Timeouts
from sluicegate.core.endstate import EndState

from ..check.live import serve

MESSAGES = [{"role": "user", "content": "tell me a story"}]


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_interrupt_from_another_thread_ends_a_blocked_read(tmp_path: Path) -> None:
    # After two steps the engine stalls for ten minutes: the reader is blocked in
    # recv, and only the shut-down socket can end the read before the test's limit.
    args = ["--engine", "scripted", "--fault", "stall:2:600", "--heartbeat-s", "3600"]
    # No client-side limit may end the read either.
    timeouts = Timeouts(idle_s=3600.0, total_s=3600.0)
    with (
        serve(args, tmp_path / "s.log") as url,
        Client(url, timeouts=timeouts) as client,
    ):
        stream = client.stream_chat(MESSAGES, model="scripted", max_tokens=400)
        texts: list[str] = []
        timer: threading.Timer | None = None
        for delta in stream:
            texts.append(delta.text)
            if timer is None:  # after the first token, before the stall
                timer = threading.Timer(0.1, stream.interrupt)
                timer.start()
        assert timer is not None
        timer.join()
        result = stream.result()
        assert result.end_state is EndState.ABORTED
        assert result.transport_error is None
        assert result.timeout is None
        assert result.text == "".join(texts) != ""
        assert len(texts) < 400
        stats = httpx.get(f"{url}/engine/stats").json()
        deadline = time.monotonic() + 10
        while stats["aborted_requests"] < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
            stats = httpx.get(f"{url}/engine/stats").json()
        assert stats["aborted_requests"] == 1
