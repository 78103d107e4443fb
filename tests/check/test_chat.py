from __future__ import annotations

import contextlib
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from sluicegate.check.chat import status_line
from sluicegate.client import StreamAssembler
from sluicegate.core.events import Usage
from sluicegate.testing import free_port

from .live import serve


def test_status_line_shows_state_ttft_rate_and_usage() -> None:
    assembler = StreamAssembler()
    assembler.head(200, {}, 0.05)
    for t in (0.1, 0.2, 0.3):
        assembler.feed(
            b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n', t
        )
    assembler.feed(b'data: {"choices":[{"index":0,"finish_reason":"stop"}]}\n\n', 0.3)
    assembler.feed(
        b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":3}}\n\n',
        0.3,
    )
    assembler.feed(b"data: [DONE]\n\n", 0.3)
    result = assembler.flush(1.1)
    assert result.usage == Usage(4, 3)
    assert status_line(result) == (
        "[finished (stop) · TTFT 100 ms · 3.0 tokens/s · usage 4+3]"
    )


def test_status_line_of_a_request_with_no_response_says_so() -> None:
    refused = "ConnectError: [Errno 111] Connection refused"
    result = StreamAssembler().flush(0.01, transport_error=refused)
    assert status_line(result, "http://127.0.0.1:9") == (
        f"[no response from http://127.0.0.1:9 · {refused}]"
    )


def test_chat_without_a_server_says_it_cannot_connect() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    done = subprocess.run(
        [sys.executable, "-m", "sluicegate", "chat", "--url", url, "hi"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert f"cannot connect to {url}" in done.stderr
    assert "sluicegate serve" in done.stderr
    assert "truncated" not in done.stdout + done.stderr


def read_until(fd: int, marker: bytes, seen: bytearray, after: int = 0) -> None:
    """Read the pty into ``seen`` until ``marker`` shows up at or past ``after``."""
    deadline = time.monotonic() + 20
    while seen.find(marker, after) < 0:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise AssertionError(f"{marker!r} never came; got {bytes(seen)!r}")
        seen += os.read(fd, 4096)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_chat_in_a_pty_streams_and_ctrl_c_aborts_the_request(tmp_path: Path) -> None:
    # The answer never finishes, so Ctrl-C lands mid-stream however slowly this
    # machine runs the chat (the default script would end after about a second).
    args = ["--engine", "scripted", "--scripted-rate", "20"]
    args += ["--fault", "never-finishes"]
    with serve(args, tmp_path / "s.log") as url:
        pid, fd = pty.fork()
        if pid == 0:  # the child: the chat, on the pseudo-terminal
            # faulthandler: a hung chat prints every thread's stack on SIGABRT.
            os.execve(sys.executable, [sys.executable, "-m", "sluicegate", "chat",
                                       "--url", url, "--max-tokens", "400"],
                      {**os.environ, "PYTHONFAULTHANDLER": "1"})  # fmt: skip
        seen = bytearray()
        try:
            read_until(fd, b"you> ", seen)
            os.write(fd, b"tell me a story\r")
            read_until(fd, b"Hello", seen)
            first = len(seen)
            time.sleep(0.5)
            read_until(fd, b" ", seen, after=first)  # more text, still streaming
            assert b"aborted" not in seen
            os.write(fd, b"\x03")  # Ctrl-C while the answer streams
            try:
                read_until(fd, b"aborted", seen)
            except AssertionError as exc:
                os.kill(pid, signal.SIGABRT)  # show where the chat is stuck
                with contextlib.suppress(AssertionError, OSError):
                    read_until(fd, b"\x00never", seen)
                raise AssertionError(
                    f"no 'aborted' after Ctrl-C: {bytes(seen)!r}"
                ) from exc
            read_until(fd, b"you> ", seen, after=seen.index(b"aborted"))
            stats = httpx.get(f"{url}/engine/stats").json()
            deadline = time.monotonic() + 5
            while stats["aborted_requests"] < 1 and time.monotonic() < deadline:
                time.sleep(0.1)
                stats = httpx.get(f"{url}/engine/stats").json()
            assert stats["aborted_requests"] == 1
            os.write(fd, b"\x04")  # Ctrl-D quits
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
        finally:
            os.close(fd)


def test_chat_shows_the_reasoning_apart_from_the_answer() -> None:
    import argparse
    import io
    import json

    from sluicegate.check.chat import THINKING, _answer
    from sluicegate.client import Client

    def chunk(delta: dict[str, object], **extra: object) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": None, **extra}
        body = {"id": "c", "object": "chat.completion.chunk", "choices": [choice]}
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    usage = {
        "prompt_tokens": 4,
        "completion_tokens": 7,
        "completion_tokens_details": {"reasoning_tokens": 3},
    }
    body = b"".join(
        [
            chunk({"role": "assistant", "content": ""}),
            chunk({"reasoning_content": "plan"}),
            chunk({"reasoning_content": ": 2+2"}),
            chunk({"content": "The answer"}),
            chunk({"content": " is 4."}, finish_reason="stop"),
            b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n",
            b"data: [DONE]\n\n",
        ]
    )
    transport = httpx.MockTransport(
        lambda request: httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content=body
        )
    )
    args = argparse.Namespace(
        model="m", max_tokens=16, temperature=0.0, resumable=False, url="u"
    )
    out = io.StringIO()
    with Client("http://t", transport=transport) as client:
        result = _answer(client, [{"role": "user", "content": "2+2?"}], args, out)
    shown, status = out.getvalue().rsplit("\n", 2)[:2]
    assert shown == f"{THINKING}plan: 2+2\n\nThe answer is 4."
    assert status.endswith("usage 4+7 (3 reasoning)]")
    assert result.text == "The answer is 4."  # what the conversation keeps
