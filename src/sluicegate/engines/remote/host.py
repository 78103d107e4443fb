"""The engine process: one ``TokenEngine`` served to the workers over a Unix socket.

``serve_engine(engine, path, model_path)`` listens on ``path`` and serves
every worker that connects (``engine.py``'s ``RemoteEngine``), each on its own
connection, with the frames of ``frames.py``:

- on connecting, the worker gets ``HELLO`` (the model, the capabilities, and
  the vocabulary: the model file, from which it loads it for its own
  detokenizing, or a tokenizer that pickles);
- ``GENERATE`` queues the request in the engine and answers ``ACCEPTED``, or
  ``REFUSED`` with what the engine raised (a full queue, a request that can
  never fit); the outputs then go back as ``OUTPUT``, ``FAIL`` or ``END``;
- ``ABORT`` aborts at the engine's next step (the engine's own contract);
- ``GRAMMAR`` compiles a grammar for the engine, ``GRAMMAR_CHECK`` checks one
  (``server/prepare/grammar_check.py``), each in a thread of this process (native code
  that may crash takes this process down, not a worker), then
  ``GRAMMAR_DONE``;
- the engine's ``stats()``, when they changed, go to a worker as ``STATS``
  (a worker's ``/engine/stats`` reads the last): to a worker with requests
  running, in the frame of each step's outputs for it (and at a tick only
  when it got no frame for ``STATS_IDLE_S``); to a worker with none, at every
  tick. A busy worker is woken once a step, not by a timer too: on cores
  that llama.cpp's threads keep busy, each wake-up costs the step
  (docs/performance.md, "The engine process");
- every ``STATS_INTERVAL_S`` (a tick) a beat is written to the beat file
  (``write_beat``): a tick, the engine's progress and whether it is busy,
  which the supervisor reads to kill an engine process that is stuck
  (``core/restarts.py``, ``StuckWatch``).

The outputs of one engine step reach the loop in one callback
(``engines/llamacpp/handoff.py``), so their frames are gathered per connection and
written once per loop pass: one ``write`` per worker per step (``link.py``'s
``FrameLink``, the frame loop a worker's ``RemoteEngine`` uses too).

A connection that closes (its worker died or stopped) aborts every request it
started, so their KV cells are freed at the next step; so does one that left
``MAX_UNREAD_BYTES`` unread (a worker whose loop is stuck).

The socket's folder is made by the supervisor with mode 0700 (only this user
may connect), and the socket itself is made 0600.

Spec: docs/serving.md, "The engine process"; docs/ARCHITECTURE.md, "Processes".
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
from pathlib import Path

from sluicegate.core.errors import EngineError, EngineUnavailable, RequestError
from sluicegate.core.events import EngineOutput
from sluicegate.core.restarts import Beat
from sluicegate.engines.base import OutputItem, TokenEngine
from sluicegate.engines.outputs import SequenceOutputs
from sluicegate.engines.remote.frames import (
    ABORT,
    ACCEPTED,
    END,
    FAIL,
    GENERATE,
    GRAMMAR,
    GRAMMAR_CHECK,
    GRAMMAR_DONE,
    HELLO,
    OUTPUT,
    REFUSED,
    STATS,
)
from sluicegate.engines.remote.link import FrameLink
from sluicegate.engines.values import EngineStats, GenerateRequest, Grammar

__all__ = [
    "MAX_UNREAD_BYTES",
    "STATS_IDLE_S",
    "STATS_INTERVAL_S",
    "beat_path",
    "read_beat",
    "serve_engine",
    "write_beat",
]

logger = logging.getLogger(__name__)

STATS_INTERVAL_S = 0.05
"""Seconds between two ticks: a beat, and the stats of idle workers."""

STATS_IDLE_S = 0.5
"""Seconds a worker with requests running may go without a frame (a long
step) before a tick sends it the stats (when they changed); it gets them with
each step's outputs otherwise."""

MAX_UNREAD_BYTES = 64 * 1024 * 1024
"""Bytes of frames a worker may leave unread before its link is closed (its
requests are then aborted, as when the worker dies)."""


class _Link(FrameLink):
    """One worker's connection: its frames in, its requests' outputs out."""

    def __init__(self, host: _Host) -> None:
        super().__init__("worker", MAX_UNREAD_BYTES)
        self._host = host
        self.outputs: dict[str, SequenceOutputs[EngineOutput]] = {}
        self.stats_sent: EngineStats | None = None
        self.sent_at = 0.0  # the loop's time of the last frame written

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._host.links.add(self)
        engine = self._host.engine
        self.send((HELLO, engine.model, engine.capabilities, self._host.vocab))
        self.send_stats(engine.stats())

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._host.links.discard(self)
        outputs, self.outputs = self.outputs, {}
        for request_id, sequence in outputs.items():
            sequence.close()  # the engine aborts it at its next step
            logger.info("worker gone: aborted %s", request_id)

    def send_stats(self, stats: EngineStats) -> None:
        """Queue ``stats`` for this worker, unless it has them already."""
        if stats != self.stats_sent:
            self.stats_sent = stats
            self.send((STATS, stats))

    def flush(self) -> None:
        """Write what is queued as one frame, with the engine's stats when they
        changed (a step's outputs: the worker reads them in the same wake)."""
        if self._pending and self.transport is not None:
            self.send_stats(self._host.engine.stats())
            self.sent_at = asyncio.get_running_loop().time()
        super().flush()

    def receive(self, message: tuple[object, ...]) -> None:
        """One frame's message from the worker."""
        kind = message[0]
        engine = self._host.engine
        if kind == GENERATE:
            request = message[1]
            assert isinstance(request, GenerateRequest)
            self._generate(request)
        elif kind == ABORT:
            request_id, stopped = message[1], message[2]
            assert isinstance(request_id, str)
            engine.abort(request_id, stopped=bool(stopped))
        elif kind in (GRAMMAR, GRAMMAR_CHECK):
            task = asyncio.ensure_future(self._compile(message))
            self._host.tasks.add(task)
            task.add_done_callback(self._host.tasks.discard)
        else:
            logger.error("worker sent an unknown frame %r: ignored", kind)

    def _generate(self, request: GenerateRequest) -> None:
        request_id = request.request_id
        try:
            outputs = self._host.engine.generate(request)
        except EngineUnavailable as exc:
            self.send((REFUSED, request_id, "unavailable", str(exc), None))
            return
        except RequestError as exc:
            self.send((REFUSED, request_id, "request", str(exc), exc.param))
            return
        except EngineError as exc:
            self.send((REFUSED, request_id, "engine", str(exc), None))
            return
        assert isinstance(outputs, SequenceOutputs)  # llama.cpp's, scripted's
        self.outputs[request_id] = outputs
        self.send((ACCEPTED, request_id))
        outputs.listen(lambda item: self._forward(request_id, item))

    def _forward(self, request_id: str, item: OutputItem) -> None:
        if isinstance(item, EngineOutput):
            self.send((OUTPUT, request_id, item))
            if item.finish_reason is None:
                return
        elif isinstance(item, EngineError):
            self.send((FAIL, request_id, str(item)))
        else:
            self.send((END, request_id))
        self.outputs.pop(request_id, None)

    async def _compile(self, message: tuple[object, ...]) -> None:
        kind, ask_id, what = message[:3]
        errors: list[str] = []
        if kind == GRAMMAR:
            assert isinstance(what, Grammar)
            await asyncio.to_thread(self._host.engine.compile_grammar, what)
        else:
            from sluicegate.engines.llamacpp.grammar import grammar_errors

            errors = await asyncio.to_thread(grammar_errors, str(what))
        self.send((GRAMMAR_DONE, ask_id, errors))


class _Host:
    def __init__(self, engine: TokenEngine, vocab: object) -> None:
        self.engine = engine
        self.vocab = vocab
        self.links: set[_Link] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.failure: str | None = None
        self.deferred = False  # signalled: stop once no worker is connected

    def push_stats(self) -> EngineStats:
        """The engine's stats now; sent to each worker with no request running,
        and to one with requests that got no frame for ``STATS_IDLE_S`` (the
        others get them with their outputs)."""
        stats = self.engine.stats()
        self.failure = stats.failure
        now = asyncio.get_running_loop().time()
        for link in self.links:
            if not link.outputs or now - link.sent_at >= STATS_IDLE_S:
                link.send_stats(stats)
        return stats


async def serve_engine(
    engine: TokenEngine,
    path: Path,
    vocab: object,
    parent_pid: int | None = None,
    stop: asyncio.Event | None = None,
) -> int:
    """Serve ``engine`` on the Unix socket ``path`` until SIGTERM or SIGINT
    (with a ``parent_pid``: once no worker is connected after the first, at
    once after a second), or until ``parent_pid`` is no longer this process's
    parent, or the engine failed for good (``stats().failure``); then close
    the engine
    (every KV cell freed) and remove the socket. A beat goes to
    ``beat_path(path)`` every ``STATS_INTERVAL_S`` meanwhile, until the
    engine is closed.

    Returns:
        0, or 1 when the engine failed (its workers' requests then end as if
        this process had died, and the supervisor starts another).

    Args:
        engine: the engine, made in this process.
        path: where to listen (a missing file; its folder exists).
        vocab: what the workers make their tokenizer of: the GGUF file's
            path (``str``), or a tokenizer that pickles.
        parent_pid: the supervisor's pid, watched with the stats.
        stop: set it to stop; ``None``: SIGTERM and SIGINT set it (tests that
            run this in their own loop pass one).

    Raises:
        OSError: the socket or the beat file cannot be made at ``path``.
    """
    loop = asyncio.get_running_loop()
    host = _Host(engine, vocab)
    if stop is None:
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, _on_signal, host, stop, parent_pid)
    server = await loop.create_unix_server(lambda: _Link(host), str(path))
    os.chmod(path, 0o600)
    logger.info("engine %s serving on %s", engine.model.id, path)
    beats = os.open(beat_path(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    ticker = asyncio.ensure_future(_push_stats(host, parent_pid, stop, beats))
    try:
        await stop.wait()
    finally:
        server.close()
        for link in list(host.links):
            if link.transport is not None:
                link.transport.close()
        # Still beating: closing waits for the step in flight, which on a busy
        # machine may take longer than the supervisor's heartbeat limit.
        await engine.aclose()
        ticker.cancel()
        os.close(beats)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a socket: no disk write to wait for
    return 0 if host.failure is None else 1


def _on_signal(host: _Host, stop: asyncio.Event, parent_pid: int | None) -> None:
    """SIGTERM or SIGINT: stop; under a supervisor, the first one only once
    no worker is connected.

    A supervisor (``parent_pid``) stops this process itself once its workers
    have exited. A signal that reaches every process of the service at once
    (systemd's ``KillMode=control-group``, ``kill`` of each pid) reaches this
    one while the workers drain: their streams still need the engine, so it
    serves until the last worker's connection closes. A second signal stops
    it at once.
    """
    if parent_pid is None or host.deferred:
        stop.set()
        return
    host.deferred = True
    logger.info(
        "signalled: serving the %d connected workers until they have gone",
        len(host.links),
    )


def beat_path(socket_path: Path) -> Path:
    """The beat file of the engine process serving at ``socket_path``."""
    return socket_path.with_name(socket_path.name + ".beat")


_BEAT_BYTES = 44  # "%020d %020d %d\n"


def write_beat(fd: int, tick: int, stats: EngineStats) -> None:
    """Write one beat (``Beat``) of an engine whose stats are ``stats`` to the
    beat file open at ``fd``: one ``pwrite`` of a fixed size, in place."""
    progress = (
        stats.steps
        + stats.prompt_tokens
        + stats.generated_tokens
        + stats.finished_requests
        + stats.aborted_requests
        + stats.failed_requests
    )
    busy = stats.queued + stats.running > 0
    os.pwrite(fd, b"%020d %020d %d\n" % (tick, progress, busy), 0)


def read_beat(path: Path) -> Beat | None:
    """The last beat in the beat file at ``path``; ``None``: none is readable
    (not written yet, or a write seen half done)."""
    try:
        with open(path, "rb") as file:
            fields = file.read(_BEAT_BYTES).split()
        tick, progress, busy = (int(f) for f in fields)
    except (OSError, ValueError):
        return None
    return Beat(tick, progress, bool(busy))


async def _push_stats(
    host: _Host, parent_pid: int | None, stop: asyncio.Event, beats: int
) -> None:
    for tick in itertools.count():
        await asyncio.sleep(STATS_INTERVAL_S)
        if stop.is_set():  # closing: no worker to tell, the beats go on
            write_beat(beats, tick, host.engine.stats())
            continue
        write_beat(beats, tick, host.push_stats())
        if host.deferred and not host.links:
            logger.info("no worker is connected: stopping")
            stop.set()
        if host.failure is not None:
            logger.critical("the engine failed (%s): stopping", host.failure)
            stop.set()
        if parent_pid is not None and os.getppid() != parent_pid:
            logger.error("the supervisor %d is gone: stopping", parent_pid)
            stop.set()
