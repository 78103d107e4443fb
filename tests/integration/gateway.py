"""Test-side parts of the gateway tests: the peer server, fake upstreams, stats polls.

A gateway is ``sluicegate serve --upstream URL`` in front of a real upstream:
another sluicegate process (llama.cpp or scripted), the ``llama-cpp-python``
server on the same GGUF file (the *peer*, in ``bench/.peer-venv``, made by
``make peer``), or a fake of this module's own: a threaded HTTP server whose
answers a test writes by hand (a 429 with ``Retry-After``, a stream that
ignores the stop strings it was sent).
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from sluicegate import testing

from .servers import BENCH, ServerProcess, StartServer, free_port
from .wire import engine_stats, wait_until

PEER_PYTHON = BENCH / ".peer-venv" / "bin" / "python"
PEER_N_CTX = 2048
"""The peer's context window, the same as the llama.cpp test server's."""
PEER_MODEL = "peer"
"""The model alias the peer serves (``--model_alias``)."""
READ_TIMEOUT_S = 30.0
"""Every read of a test's stream is bounded: a stream that hangs fails the test."""
ABORT_WITHIN_S = 1.0
"""How soon an upstream aborts after the client's close (docs/DESIGN.md)."""
GIVE_UP_S = 10.0
"""How long to keep polling after that, to tell a late abort from none."""


def start_gateway(
    start_server: StartServer,
    name: str,
    upstream_urls: Sequence[str],
    model: str,
    *extra_args: str,
) -> ServerProcess:
    """A sluicegate gateway serving ``model`` from ``upstream_urls`` (API bases).

    ``model`` is both the model's name on the upstreams and its id at the
    gateway. Without ``--ledger`` in ``extra_args`` the ledger is kept in memory.
    """
    upstreams = [arg for url in upstream_urls for arg in ("--upstream", url)]
    ledger = () if "--ledger" in extra_args else ("--no-ledger",)
    return start_server(
        name,
        *upstreams,
        *("--upstream-model", model, "--log-level", "warning", *ledger),
        *extra_args,
    )


def api_base(server: ServerProcess) -> str:
    """The OpenAI API base of a server process: ``http://host:port/v1``."""
    return f"{server.base_url}/v1"


# -- the peer ---------------------------------------------------------------------


def peer_missing() -> str | None:
    """Why the peer cannot run here (``None`` when it can)."""
    if not PEER_PYTHON.exists():
        return f"no peer virtual environment at {PEER_PYTHON}: run `make peer`"
    found = subprocess.run(
        [str(PEER_PYTHON), "-c", "import llama_cpp.server"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    if found.returncode != 0:
        return f"{PEER_PYTHON} cannot import llama_cpp.server: run `make peer`"
    return None


@contextlib.contextmanager
def running_peer(model_path: Path, log_dir: Path) -> Iterator[testing.ServerProcess]:
    """The ``llama-cpp-python`` server on ``model_path``, until the block exits."""
    port = free_port()
    command = [
        str(PEER_PYTHON),
        *("-m", "llama_cpp.server", "--model", str(model_path)),
        *("--host", "127.0.0.1", "--port", str(port)),
        *("--n_ctx", str(PEER_N_CTX), "--model_alias", PEER_MODEL),
        # Its default cuts the running stream short when any other request
        # comes (the gateway's health checks too): docs/upstreams.md.
        *("--interrupt_requests", "False"),
    ]
    log_path = log_dir / f"peer-{port}.log"
    with testing.ServerProcess(command, port, log_path=log_path, name="peer") as peer:
        try:
            peer.wait_ready("/v1/models")
        except testing.ServerNotReady as exc:
            pytest.fail(str(exc), pytrace=False)
        yield peer


# -- fake upstreams ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reply:
    """What a fake upstream answers a POST with.

    ``events`` are SSE data strings, each sent in its own write; with
    ``status`` other than 200 the ``body`` is sent instead, as JSON.
    ``hold_s``: after the events, keep the stream open that long (a test
    that closes its client mid-stream). ``delay_s``: after the 200's head,
    wait that long before the first event (a long prefill). ``gap_s``: and
    that long between two events.
    """

    status: int = 200
    headers: Mapping[str, str] | None = None
    body: Mapping[str, Any] | None = None
    events: Sequence[str] = ()
    hold_s: float = 0.0
    delay_s: float = 0.0
    gap_s: float = 0.0


class FakeUpstream:
    """An OpenAI-shaped HTTP server in a thread: ``GET /v1/models`` and canned POSTs.

    Args:
        reply: the answer to each POST to the generation routes, from its
            JSON body.
        routes: JSON answers of other paths, by ``"GET /path"`` or
            ``"POST /path"`` (``GET /v1/models`` answers an empty list
            unless given): each from the request's JSON body (``{}`` for a
            GET), as ``(status, body)``.
    """

    def __init__(
        self,
        reply: Callable[[dict[str, Any]], Reply],
        routes: Mapping[str, Callable[[dict[str, Any]], tuple[int, Any]]] = {},
    ) -> None:
        self.requests: list[dict[str, Any]] = []
        self.calls: list[str] = []
        """Every route called, as ``"GET /path"``."""
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # bodies end with the connection

            def _routed(self, method: str, body: dict[str, Any]) -> bool:
                name = f"{method} {self.path.split('?')[0]}"
                fake.calls.append(name)
                route = routes.get(name)
                if route is None:
                    return False
                status, answer = route(body)
                fake._send_json(self, status, answer, {})
                return True

            def do_GET(self) -> None:
                if not self._routed("GET", {}):
                    fake._send_json(self, 200, {"object": "list", "data": []}, {})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                if self._routed("POST", body):
                    return
                fake.requests.append(body)
                answer = reply(body)
                if answer.status != 200:
                    headers = answer.headers or {}
                    fake._send_json(self, answer.status, answer.body or {}, headers)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                with contextlib.suppress(OSError):  # the gateway left
                    self.wfile.flush()
                    time.sleep(answer.delay_s)
                    for i, event in enumerate(answer.events):
                        if i and answer.gap_s:
                            time.sleep(answer.gap_s)
                        self.wfile.write(f"data: {event}\n\n".encode())
                        self.wfile.flush()
                    held_until = time.monotonic() + answer.hold_s
                    while time.monotonic() < held_until:  # comments find a close
                        time.sleep(0.05)
                        self.wfile.write(b": held\n\n")
                        self.wfile.flush()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        host, port = self._server.server_address[:2]
        self.url = f"http://{host!s}:{port}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @staticmethod
    def _send_json(
        handler: BaseHTTPRequestHandler,
        status: int,
        body: Mapping[str, Any],
        headers: Mapping[str, str],
    ) -> None:
        data = json.dumps(body).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(data)

    def close(self) -> None:
        """Stop serving and free the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> FakeUpstream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def chat_chunk(
    index: int,
    content: str | None,
    finish_reason: str | None = None,
    *,
    usage: Mapping[str, Any] | None = None,
    **choice_fields: Any,
) -> str:
    """One ``chat.completion.chunk`` as an upstream writes it (JSON text);
    ``usage`` (continuous usage) and a dialect's extra choice fields
    (``stop_reason``, ``matched_stop``) when given."""
    delta = {} if content is None else {"content": content}
    choice = {"index": index, "delta": delta, "finish_reason": finish_reason}
    chunk: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "fake",
        "choices": [{**choice, **choice_fields}],
    }
    if usage is not None:
        chunk["usage"] = usage
    return json.dumps(chunk)


def usage_chunk(prompt_tokens: int, completion_tokens: int) -> str:
    """The usage chunk an upstream sends last (``choices: []``)."""
    return json.dumps(
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": "fake",
            "choices": [],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
    )


def dead_url() -> str:
    """An API base on a loopback port where nothing listens (connect refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


# -- the upstream's stats -----------------------------------------------------------


def wait_for_stats(
    server: ServerProcess,
    condition: Callable[[dict[str, Any]], bool],
    *,
    started_s: float | None = None,
    give_up_s: float = GIVE_UP_S,
) -> tuple[dict[str, Any], float]:
    """Poll ``server``'s ``/engine/stats`` until ``condition`` holds; fail if never.

    Returns the stats and the seconds from ``started_s`` (default: now) to the
    poll that saw them.
    """
    started = time.monotonic() if started_s is None else started_s
    with httpx.Client(base_url=server.base_url, timeout=10) as client:
        stats, elapsed_s = wait_until(
            client, condition, started_s=started, give_up_s=give_up_s
        )
        if stats is None:
            pytest.fail(
                f"{server.name}: condition not met after {elapsed_s:.1f} s: "
                f"{engine_stats(client)}"
            )
    return stats, elapsed_s


def stats_of(server: ServerProcess) -> dict[str, Any]:
    """``server``'s ``/engine/stats`` now."""
    with httpx.Client(base_url=server.base_url, timeout=10) as client:
        return engine_stats(client)


def is_idle(stats: Mapping[str, Any]) -> bool:
    """Nothing runs or waits and no KV cell is held."""
    return bool(
        stats["running"] == 0 and stats["queued"] == 0 and stats["kv_cells_used"] == 0
    )


def aborted_since(before: Mapping[str, Any], count: int = 1) -> Callable[..., bool]:
    """A stats condition: ``count`` more aborted requests than ``before``, and idle."""

    def condition(stats: Mapping[str, Any]) -> bool:
        more = stats["aborted_requests"] - before["aborted_requests"]
        return more >= count and is_idle(stats)

    return condition
