"""The least a Python streaming server can do per token: the floor of ``streams.py``.

One uvloop process, no HTTP framework, no JSON parsing or encoding, no engine:
each connection's request is read up to its ``Content-Length``, ``max_tokens`` is
found with a regular expression, and then one loop timer per stream writes one
prebuilt SSE frame (a ``chat.completion.chunk`` with one word of content, the
same fields and size as sluicegate's, in one HTTP chunk) every ``1/rate``
seconds, then a usage chunk, ``data: [DONE]`` and the last chunk. It keeps the
wire shape and schedule of the scripted engine behind ``sluicegate serve``, so
what it costs per token on a core is what the machine charges for the write and
the event loop alone: no Python server here does a token for less.

Not a server to use: no validation, no errors, no abort. Serves
``POST /v1/chat/completions`` (streaming, whatever the body says besides
``max_tokens``) and ``GET /health``.

Run: ``.venv/bin/python bench/raw_server.py --port 8002 --rate 20``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from collections.abc import Sequence

MAX_TOKENS = re.compile(rb'"max_tokens"\s*:\s*(\d+)')
CONTENT_LENGTH = re.compile(rb"(?i)\r\ncontent-length:\s*(\d+)")
HEAD_END = b"\r\n\r\n"

RESPONSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
    b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
)
HEALTH = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: text/plain\r\n\r\nok"


def _chunk(data: bytes) -> bytes:
    """``data`` as one HTTP/1.1 chunk (RFC 9112, 7.1)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(payload: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def _frames(words: int) -> tuple[bytes, list[bytes]]:
    """(the role frame, one content frame per word), each one HTTP chunk."""
    base = {
        "id": "chatcmpl-" + "0" * 24,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": "scripted",
        "system_fingerprint": "fp_" + "0" * 12,
    }

    def chunk(delta: dict[str, str]) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        return _chunk(_event({**base, "choices": [choice], "usage": None}))

    sentence = " The quick brown fox streams tokens correctly, once upon a time."
    pieces = sentence.split(" ")[1:]
    role = chunk({"role": "assistant", "content": ""})
    return role, [
        chunk({"content": " " + pieces[i % len(pieces)]}) for i in range(words)
    ]


class _Stream(asyncio.Protocol):
    """One connection: read the request, then write a frame per step."""

    def __init__(self, server: _Raw) -> None:
        self.server = server
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.left = 0
        self.sent = 0
        self.next_at = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer + data
        end = buffer.find(HEAD_END)
        if end < 0:
            self.buffer = buffer
            return
        head = buffer[:end]
        found = CONTENT_LENGTH.search(head)
        body_length = int(found[1]) if found else 0
        if len(buffer) < end + 4 + body_length:
            self.buffer = buffer
            return
        self.buffer = b""
        assert self.transport is not None
        if head.startswith(b"GET /health"):
            self.transport.write(HEALTH)
            return
        tokens = MAX_TOKENS.search(buffer[end + 4 : end + 4 + body_length])
        self.left = int(tokens[1]) if tokens else 16
        self.transport.write(RESPONSE_HEAD + self.server.role)
        loop = self.server.loop
        self.next_at = loop.time() + self.server.step_s
        self.timer = loop.call_at(self.next_at, self.step)

    def step(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        server = self.server
        if self.left == 0:
            usage = {"prompt_tokens": 5, "completion_tokens": self.sent}
            end = _event(
                {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
            )
            end += _event({"choices": [], "usage": usage}) + b"data: [DONE]\n\n"
            transport.write(_chunk(end) + b"0\r\n\r\n")
            return
        transport.write(server.frames[self.sent % len(server.frames)])
        self.sent += 1
        self.left -= 1
        self.next_at += server.step_s
        self.timer = server.loop.call_at(self.next_at, self.step)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.timer is not None:
            self.timer.cancel()


class _Raw:
    def __init__(self, loop: asyncio.AbstractEventLoop, rate: float) -> None:
        self.loop = loop
        self.step_s = 1.0 / rate
        self.role, self.frames = _frames(64)


async def _serve(port: int, rate: float) -> None:
    loop = asyncio.get_running_loop()
    raw = _Raw(loop, rate)
    server = await loop.create_server(
        lambda: _Stream(raw), "127.0.0.1", port, backlog=4096
    )
    async with server:
        await server.serve_forever()


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until killed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--rate", type=float, default=20.0, help="tokens/s per stream")
    args = parser.parse_args(argv)
    import uvloop

    uvloop.run(_serve(args.port, args.rate))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
