"""Raw ASGI fakes: drive one request through the app and watch every message.

``httpx.ASGITransport`` buffers whole bodies and never disconnects, so streaming
and disconnect tests use ``Exchange``: its ``receive`` hands over the body, then
blocks until the test calls ``leave()`` and answers ``http.disconnect``; its
``send`` records every message as it comes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
from starlette.types import ASGIApp, Message

from sluicegate.core.wire.sse import DONE, Event, SSEDecoder
from sluicegate.engines.clocks import ManualClock

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HELLO = [{"role": "user", "content": "Hi"}]


class Exchange:
    """One HTTP request through ``app`` with fake ``receive``/``send``.

    Args:
        app: the ASGI app.
        path: the URL path.
        payload: a JSON-able body, or raw bytes.
        chunks: send the body in these pieces instead (no Content-Length).
        fail_send_after: raise ``OSError`` from ``send`` once this many body
            messages went through (a connection that breaks).
    """

    def __init__(
        self,
        app: ASGIApp,
        path: str,
        payload: Any = None,
        *,
        chunks: Sequence[bytes] | None = None,
        method: str = "POST",
        extra_headers: Sequence[tuple[bytes, bytes]] = (),
        fail_send_after: int | None = None,
    ) -> None:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self._chunks = list(chunks) if chunks is not None else [body]
        headers = [(b"content-type", b"application/json"), *extra_headers]
        if chunks is None:
            headers.append((b"content-length", str(len(body)).encode()))
        self.app = app
        self.scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 50000),
            "server": ("testserver", 80),
        }
        self.messages: list[Message] = []
        self._gone = anyio.Event()
        self._fail_send_after = fail_send_after
        self.returned = False

    async def run(self) -> None:
        """Call the app; returns when the app returns."""
        await self.app(self.scope, self._receive, self._send)
        self.returned = True

    def leave(self) -> None:
        """The client disconnects: ``receive`` answers ``http.disconnect``."""
        self._gone.set()

    async def wait_for(
        self, condition: Callable[[], bool], timeout_s: float = 5
    ) -> None:
        """Wait until ``condition()`` holds (polled every millisecond)."""
        with anyio.fail_after(timeout_s):
            while True:
                if condition():
                    return
                await anyio.sleep(0.001)

    async def _receive(self) -> Message:
        if self._chunks and not self._gone.is_set():
            chunk = self._chunks.pop(0)
            return {
                "type": "http.request",
                "body": chunk,
                "more_body": bool(self._chunks),
            }
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: Message) -> None:
        if self._gone.is_set():
            raise OSError("the client is gone")
        bodies = sum(m["type"] == "http.response.body" for m in self.messages)
        if message["type"] == "http.response.body" and bodies == self._fail_send_after:
            raise OSError("connection reset by peer")
        self.messages.append(message)

    @property
    def status(self) -> int | None:
        """The status sent, or ``None`` before ``http.response.start``."""
        starts = [m for m in self.messages if m["type"] == "http.response.start"]
        return int(starts[0]["status"]) if starts else None

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        """The response headers, as sent."""
        starts = [m for m in self.messages if m["type"] == "http.response.start"]
        return list(starts[0]["headers"]) if starts else []

    @property
    def body(self) -> bytes:
        """Every body byte sent so far."""
        return b"".join(
            m.get("body", b"")
            for m in self.messages
            if m["type"] == "http.response.body"
        )

    @property
    def completed(self) -> bool:
        """Whether the final body message (``more_body`` false) was sent."""
        last = self.messages[-1] if self.messages else None
        return (
            last is not None
            and last["type"] == "http.response.body"
            and not last.get("more_body", False)
        )

    def events(self) -> list[Event]:
        """The body decoded by the core's strict SSE decoder."""
        return SSEDecoder().feed(self.body)

    def payloads(self) -> list[dict[str, Any]]:
        """Each event's JSON, ``[DONE]`` left out."""
        return [json.loads(e.data) for e in self.events() if e.data != "[DONE]"]

    def only_error(self) -> dict[str, Any]:
        """The ``error`` object of the stream's one error event, which must be its
        last event (the in-band error contract: one error event, then nothing)."""
        payloads = self.payloads()
        assert [p for p in payloads if "error" in p] == payloads[-1:], payloads
        assert "error" in payloads[-1], payloads
        error: dict[str, Any] = payloads[-1]["error"]
        return error

    def contents(self) -> list[str]:
        """The content (chat) or text (completions) of each non-empty delta."""
        texts = []
        for payload in self.payloads():
            for choice in payload.get("choices", []):
                text = (
                    choice["delta"].get("content")
                    if "delta" in choice
                    else choice["text"]
                )
                if text:
                    texts.append(text)
        return texts

    def has_content(self) -> bool:
        """Whether any content delta was sent yet."""
        return bool(self.contents())

    def done_count(self) -> int:
        """How many ``data: [DONE]`` events were sent."""
        return self.body.count(DONE)


async def exchange(
    app: ASGIApp, path: str, payload: Any, timeout_s: float = 5
) -> Exchange:
    """Run one request to its end (the client never leaves) and return it."""
    ex = Exchange(app, path, payload)
    with anyio.fail_after(timeout_s):
        await ex.run()
    return ex


async def on_clock(
    clock: ManualClock,
    run: Callable[[], Awaitable[object]],
    step_s: float,
    until: Callable[[], bool] | None = None,
    *,
    max_clock_s: float = 600.0,
) -> None:
    """Run ``run()`` while ``clock`` moves on ``step_s`` seconds at a time (the
    loop runs its ready callbacks between steps), until it returns or
    ``until()`` holds; then cancel it. No test sleeps for a stream's timers.

    Raises:
        AssertionError: ``clock`` passed ``max_clock_s`` first.
    """
    async with anyio.create_task_group() as tg:
        done = anyio.Event()

        async def body() -> None:
            try:
                await run()
            finally:
                done.set()

        tg.start_soon(body)
        with anyio.fail_after(30):  # a liveness bound in real time only
            while not done.is_set() and not (until is not None and until()):
                for _ in range(8):  # let what the last step started run
                    await asyncio.sleep(0)
                if done.is_set() or (until is not None and until()):
                    break
                assert clock.time() < max_clock_s, "the clock ran out"
                clock.advance(step_s)
        tg.cancel_scope.cancel()
