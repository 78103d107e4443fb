"""What the sync and async HTTP shells share: time limits, request bodies, and the
one place httpx exceptions become outcome values.

How the four limits are enforced (the same in both shells, so that they agree):

- ``connect_s``: httpx's connect (and pool and write) timeout.
- ``first_byte_s``: httpx's read timeout while waiting for the response head.
- ``idle_s``: httpx's read timeout for every body read after the head, set on
  the request's ``timeout`` extension before the body is read. Any bytes reset
  it, so SSE comments (heartbeats) count as activity.
- ``total_s``: checked whenever bytes arrive, and it caps the read timeouts
  computed when the head is sent and when the body starts. A silent server can
  therefore overrun ``total_s`` by at most ``idle_s``.

Resuming (``Resumption``): a stream whose events carry ``id:`` lines and whose
connection drops before its end is asked for again at
``<path>/<response id>/events`` with ``Last-Event-ID``, after a backoff, at most
``max_resumes`` times; ``total_s`` spans every attempt. A resumable stream the
caller closes (or interrupts) before its end is cancelled on the server
(``POST <path>/<response id>/cancel``, best effort), so that closing still
aborts the request there at once, as for any other stream.

Deliberate divergence: a time limit that fires is the client giving up, so an
unfinished stream then ends ``aborted`` (``classify(client_gone=True)``), with
``StreamResult.timeout`` naming the limit.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import httpx

from sluicegate.client.results import TimeoutKind

__all__ = [
    "Ending",
    "Resumption",
    "Timeouts",
    "api_url",
    "asleep",
    "capture",
    "chat_body",
    "completion_body",
    "resume_path",
    "sleep",
]


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Client-side time limits in seconds; ``None`` means no limit.

    Attributes:
        connect_s: to open the connection.
        first_byte_s: from sending the request to the response head.
        idle_s: the longest silence between body bytes (heartbeats reset it).
        total_s: the whole exchange.
    """

    connect_s: float | None = 10.0
    first_byte_s: float | None = 300.0
    idle_s: float | None = 60.0
    total_s: float | None = None

    def head(self) -> httpx.Timeout:
        """The httpx timeout for sending the request and reading its head."""
        return httpx.Timeout(
            connect=self.connect_s,
            read=_least(self.first_byte_s, self.total_s),
            write=self.connect_s,
            pool=self.connect_s,
        )

    def body_read_s(self, elapsed_s: float) -> float | None:
        """The read timeout for body reads, ``elapsed_s`` after the request."""
        left = None if self.total_s is None else max(self.total_s - elapsed_s, 0.001)
        return _least(self.idle_s, left)

    def over_total(self, elapsed_s: float) -> bool:
        """Whether ``elapsed_s`` is past ``total_s``."""
        return self.total_s is not None and elapsed_s > self.total_s


def _least(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


@dataclass(frozen=True, slots=True)
class Resumption:
    """How a client resumes a resumable stream after its connection dropped.

    Attributes:
        max_resumes: resumes per stream at most (0: never resume).
        backoff_s: seconds before the first resume; doubled for each next one.
        max_backoff_s: the longest wait between two resumes (seconds).
    """

    max_resumes: int = 5
    backoff_s: float = 0.1
    max_backoff_s: float = 2.0

    def delay_s(self, resumes: int) -> float:
        """Seconds to wait before resume number ``resumes`` (0 first)."""
        return min(self.backoff_s * float(1 << min(resumes, 30)), self.max_backoff_s)


def resume_path(path: str, cursor: str, action: str = "events") -> str:
    """The resume endpoint of the stream ``cursor`` names, under ``path``
    (``chat/completions`` or ``completions``): ``<path>/<response id>/events``
    (``action="cancel"``: its cancel endpoint)."""
    response_id = cursor.rpartition(".")[0] or cursor
    return f"{path}/{response_id}/{action}"


def sleep(seconds: float) -> None:
    """Wait ``seconds`` (the blocking client's twin of ``asleep``)."""
    time.sleep(seconds)


async def asleep(seconds: float) -> None:
    """Wait ``seconds`` on the running anyio backend."""
    await anyio.sleep(seconds)


class Ending:
    """How reading ended, filled in by ``capture`` and the shell loop."""

    __slots__ = ("client_gone", "headed", "timeout", "transport_error")

    def __init__(self) -> None:
        self.headed = False
        self.client_gone = False
        self.timeout: TimeoutKind | None = None
        self.transport_error: str | None = None


@contextmanager
def capture(ending: Ending) -> Iterator[None]:
    """Turn httpx's transport exceptions into fields of ``ending`` (most specific
    first); everything else propagates."""
    try:
        yield
    except httpx.ConnectTimeout:
        ending.timeout = TimeoutKind.CONNECT
    except httpx.ReadTimeout:
        ending.timeout = TimeoutKind.IDLE if ending.headed else TimeoutKind.FIRST_BYTE
    except httpx.TimeoutException:  # write and pool timeouts: still connecting
        ending.timeout = TimeoutKind.CONNECT
    except httpx.TransportError as exc:
        ending.transport_error = f"{type(exc).__name__}: {exc}"


def api_url(base_url: str) -> str:
    """``base_url`` ending in ``/v1/`` (``http://h:8000`` and ``.../v1`` alike)."""
    url = base_url.rstrip("/")
    return (url if url.endswith("/v1") else url + "/v1") + "/"


def chat_body(
    messages: Sequence[Mapping[str, Any]],
    model: str,
    include_usage: bool,
    params: Mapping[str, Any],
) -> dict[str, Any]:
    """A streaming ``/v1/chat/completions`` body; ``params`` are passed as is.

    Spec: OpenAI API reference, "Create chat completion".
    """
    body: dict[str, Any] = {"model": model, "messages": list(messages), "stream": True}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    body.update(params)
    return body


def completion_body(
    prompt: str, model: str, include_usage: bool, params: Mapping[str, Any]
) -> dict[str, Any]:
    """A streaming ``/v1/completions`` body; ``params`` are passed as is.

    Spec: OpenAI API reference, "Create completion" (legacy).
    """
    body: dict[str, Any] = {"model": model, "prompt": prompt, "stream": True}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    body.update(params)
    return body
