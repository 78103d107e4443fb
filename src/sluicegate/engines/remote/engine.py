"""RemoteEngine: a worker's ``TokenEngine`` whose engine runs in another process.

The engine process (``host.py``) runs llama.cpp (or any
``TokenEngine``); each worker holds one ``RemoteEngine`` with one Unix-socket
connection to it (frames: ``frames.py``, read and written by ``link.py``). The
worker sends requests and aborts and receives token ids; the detokenizer, the
stop matcher and the framing run in the worker, on its own core, with the
vocabulary it loads from the model file (``load_vocab``: no weights).

Acceptance is late (``Capabilities.late_acceptance``): ``generate`` returns at
once, and the server awaits ``accepted()`` (the engine's ``ACCEPTED``, one
round trip) before its status line, so that a full queue is still a 503.

When the engine process dies (its socket closes), every request in flight
ends at once with one ``EngineCrashed`` (the in-band ``engine_crashed`` error,
no ``[DONE]``; the ledger closes its row as an engine error with the tokens
it had), and each request not yet accepted gets ``EngineUnavailable`` (503
with ``Retry-After``). Until the socket answers again (tried every
``RECONNECT_S``), ``generate`` fails at once with the same 503 and
``stats().unavailable`` says why (``/ready`` is 503). ``stats()`` is the
engine's last pushed snapshot (``STATS``), shared by every worker; while the
engine is away it shows nothing running. The connection is opened as the
server starts (``start``), not at the first request, so a worker that has
served none still follows the engine: its stats are the engine's current
ones, and its ``/ready`` turns 503 while the engine is away.

Spec: docs/serving.md, "The engine process"; ``engines/base.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import socket
import time
from pathlib import Path

from sluicegate.core.errors import (
    EngineCrashed,
    EngineError,
    EngineUnavailable,
    RequestError,
)
from sluicegate.core.events import EngineOutput
from sluicegate.engines.base import Capabilities, TokenEngineBase, Tokenizer
from sluicegate.engines.remote.frames import (
    ABORT,
    ACCEPTED,
    END,
    FAIL,
    GENERATE,
    GRAMMAR,
    GRAMMAR_CHECK,
    GRAMMAR_DONE,
    OUTPUT,
    REFUSED,
    STATS,
    encode_frames,
)
from sluicegate.engines.remote.link import FrameLink
from sluicegate.engines.remote.outputs import FrameStream, RemoteOutputs, hello
from sluicegate.engines.values import EngineStats, GenerateRequest, Grammar, ModelInfo

__all__ = ["RECONNECT_S", "RemoteEngine", "RemoteOutputs"]

logger = logging.getLogger(__name__)

RECONNECT_S = 0.1
"""Seconds between two tries of the socket of an engine process that went away."""

_RESTARTING = "the engine is restarting; retry shortly"
_CRASHED = "the engine process stopped; the request was lost with it"


class _Link(FrameLink):
    def __init__(self, engine: RemoteEngine) -> None:
        super().__init__("engine")
        self._engine = engine

    def receive(self, message: tuple[object, ...]) -> None:
        self._engine._receive(message)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._engine._lost(self)


class RemoteEngine(TokenEngineBase[Tokenizer, RemoteOutputs]):
    """A ``TokenEngine`` served by the engine process listening at ``path``.

    Its capabilities are the engine's, with ``late_acceptance``
    (``RemoteOutputs``) and ``shared_stats`` (the engine process counts every
    worker's requests).

    Made by ``connect`` (which waits for the engine and reads what it serves);
    one connection, opened on the event loop by ``start`` (or the first
    ``generate``) and opened again whenever it is lost.

    Args:
        path: the engine process's Unix socket.
        model: the served model, as the engine said.
        capabilities: the engine's, plus ``late_acceptance``.
        tokenizer: the model's vocabulary, loaded in this process.
        stats: the engine's stats when connected.
    """

    def __init__(
        self,
        path: Path,
        model: ModelInfo,
        capabilities: Capabilities,
        tokenizer: Tokenizer,
        stats: EngineStats,
    ) -> None:
        capabilities = dataclasses.replace(
            capabilities, late_acceptance=True, shared_stats=True
        )
        super().__init__(model, tokenizer, capabilities, RemoteOutputs)
        self._path = path
        self._stats = stats
        self._link: _Link | None = None
        self._connecting: asyncio.Future[None] | None = None
        self._returning: asyncio.Future[None] | None = None
        self._backlog: list[tuple[object, ...]] = []
        self._sequences: dict[str, RemoteOutputs] = {}
        self._asks = itertools.count()
        self._closed = False
        self._told_away = False  # the absence's first failed connect was logged

    @classmethod
    def connect(cls, path: Path, timeout_s: float = 300.0) -> RemoteEngine:
        """Wait (blocking) until the engine process at ``path`` answers, then
        load its model's vocabulary here.

        Raises:
            EngineUnavailable: no engine answered within ``timeout_s`` seconds.
            FileNotFoundError: the model file it names cannot be read.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                said, stats = hello(path)
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise EngineUnavailable(
                        f"no engine process answered at {str(path)!r} "
                        f"within {timeout_s} s: {exc}"
                    ) from exc
                time.sleep(0.1)
        _, model, capabilities, vocab = said
        assert isinstance(model, ModelInfo)
        assert isinstance(capabilities, Capabilities)
        assert isinstance(stats, EngineStats)
        if isinstance(vocab, str):  # a GGUF file: the vocabulary only
            from sluicegate.engines.llamacpp.vocab import load_vocab

            tokenizer: Tokenizer = load_vocab(vocab)
        else:  # an engine whose tokenizer pickles (the scripted one)
            tokenizer = vocab  # type: ignore[assignment]
        return cls(path, model, capabilities, tokenizer, stats)

    async def start(self) -> None:
        """Open the connection now, on the server's event loop: until then
        ``stats()`` is the snapshot ``connect`` read. An engine process that
        does not answer is tried every ``RECONNECT_S`` (``stats().unavailable``
        says so meanwhile)."""
        if self._link is None and self._connecting is None and not self._closed:
            self._connecting = asyncio.ensure_future(self._connect())
        if self._connecting is not None:
            await asyncio.shield(self._connecting)

    # -- the TokenEngine protocol --------------------------------------------

    def generate(self, request: GenerateRequest) -> RemoteOutputs:
        """Send ``request`` to the engine process; await ``accepted()`` next.

        Raises:
            EngineUnavailable: at once, when this engine is closed; from
                ``accepted()``, when the engine's queue is full or the engine
                process is away (restarting).
            RequestError: from ``accepted()``: the engine can never serve it.
            EngineCrashed: from the outputs, when the engine process died.
        """
        if self._closed:
            raise EngineUnavailable("the engine is closed")
        outputs = self._sequences[request.request_id] = self._open(request.request_id)
        self._send((GENERATE, request))
        return outputs

    def abort(self, request_id: str, *, stopped: bool = False) -> None:
        """Ask the engine to stop ``request_id`` at its next step; idempotent."""
        # The sequence stays until the engine ends it (``END``), as in process.
        if request_id in self._sequences:
            self._send((ABORT, request_id, stopped))

    def stats(self) -> EngineStats:
        """The engine's last pushed stats (every worker's requests)."""
        return self._stats

    async def aclose(self) -> None:
        """Abort this worker's requests and close the connection; the engine
        process goes on serving the other workers."""
        self._closed = True
        if self._returning is not None:
            self._returning.cancel()
        for request_id in list(self._sequences):
            self.abort(request_id)
        link = self._link
        if link is not None and link.transport is not None:
            link.flush()
            link.transport.close()

    def compile_grammar(self, grammar: Grammar) -> None:
        """Have the engine process compile ``grammar`` (blocking this thread
        until it did): native code that may crash runs there, not here."""
        try:
            self._ask((GRAMMAR, next(self._asks), grammar))
        except OSError as exc:  # the request fails at its first step instead
            logger.warning("grammar not compiled ahead: %s", exc)

    def grammar_errors(self, text: str) -> list[str]:
        """llguidance's errors for the grammar ``text``, compiled in the engine
        process (blocking this thread); ``[]``: it compiles.

        Raises:
            EngineUnavailable: the engine process is away, or died compiling it.
        """
        try:
            return self._ask((GRAMMAR_CHECK, next(self._asks), text))
        except OSError as exc:
            raise EngineUnavailable(_RESTARTING) from exc

    def _ask(self, message: tuple[object, ...]) -> list[str]:
        """Send ``message`` on a connection of its own; ``GRAMMAR_DONE``'s errors.

        Raises:
            OSError: the engine is away, or closed before it answered.
        """
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(self._path))
            sock.sendall(encode_frames([message]))
            for answer in FrameStream(sock):
                errors = answer[2] if answer[0] == GRAMMAR_DONE else None
                if isinstance(errors, list):
                    return [str(e) for e in errors]
        raise ConnectionError("the engine process closed before it answered")

    # -- the connection ------------------------------------------------------

    def _send(self, message: tuple[object, ...]) -> None:
        link = self._link
        if link is None or link.transport is None:
            self._backlog.append(message)
            if self._connecting is None:
                self._connecting = asyncio.ensure_future(self._connect())
            return
        link.send(message)

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, link = await loop.create_unix_connection(
                lambda: _Link(self), str(self._path)
            )
        except OSError as exc:
            # Tried every RECONNECT_S while the process is away (its model loads
            # for seconds): warned once per absence, each later try at debug.
            level = logging.DEBUG if self._told_away else logging.WARNING
            logger.log(level, "engine process unreachable: %s", exc)
            self._told_away = True
            self._connecting = None
            self._refuse_backlog()
            self._away()
            return
        self._link = link
        self._connecting = None
        if self._told_away:
            logger.info("engine process reachable again")
            self._told_away = False
        self._stats = dataclasses.replace(self._stats, unavailable=None)
        backlog, self._backlog = self._backlog, []
        for message in backlog:
            self._send(message)

    def _away(self) -> None:
        """The engine process is away: unavailable until its socket answers."""
        self._stats = dataclasses.replace(self._stats, unavailable=_RESTARTING)
        if self._returning is None and not self._closed:
            self._returning = asyncio.ensure_future(self._await_return())

    async def _await_return(self) -> None:
        while not self._closed and self._link is None:
            await asyncio.sleep(RECONNECT_S)
            connecting = self._connecting or asyncio.ensure_future(self._connect())
            self._connecting = connecting
            await asyncio.shield(connecting)
        self._returning = None

    def _refuse_backlog(self) -> None:
        backlog, self._backlog = self._backlog, []
        for message in backlog:
            request = message[1]
            if message[0] == GENERATE and isinstance(request, GenerateRequest):
                outputs = self._sequences.pop(request.request_id, None)
                if outputs is not None:
                    outputs.settle(EngineUnavailable(_RESTARTING))
                    outputs.fail(EngineUnavailable(_RESTARTING))

    def _lost(self, link: _Link) -> None:
        if link is not self._link:
            return
        self._link = None
        self._stats = dataclasses.replace(
            self._stats, queued=0, running=0, kv_cells_used=0, running_ids=()
        )
        self._away()
        sequences, self._sequences = self._sequences, {}
        if sequences and not self._closed:
            logger.error(
                "engine process gone: %d requests end with engine_crashed",
                len(sequences),
            )
        for outputs in sequences.values():
            outputs.settle(EngineUnavailable(_RESTARTING))
            outputs.fail(EngineCrashed(_CRASHED))
        self._refuse_backlog()

    def _receive(self, message: tuple[object, ...]) -> None:
        kind = message[0]
        if kind == OUTPUT:
            outputs = self._sequences.get(str(message[1]))
            output = message[2]
            assert isinstance(output, EngineOutput)
            if outputs is not None:
                if output.finish_reason is not None:
                    del self._sequences[str(message[1])]
                outputs.push(output)
        elif kind == STATS:
            stats = message[1]
            assert isinstance(stats, EngineStats)
            # An engine that failed for good stops its process, which is
            # restarted: not a reason for this worker to exit.
            self._stats = dataclasses.replace(stats, failure=None)
        elif kind == ACCEPTED:
            outputs = self._sequences.get(str(message[1]))
            if outputs is not None:
                outputs.settle(None)
        elif kind in (FAIL, END, REFUSED):
            self._ended(message)

    def _ended(self, message: tuple[object, ...]) -> None:
        outputs = self._sequences.pop(str(message[1]), None)
        if outputs is None:
            return
        if message[0] == END:
            outputs.end()
            return
        if message[0] == FAIL:
            outputs.fail(EngineError(str(message[2])))
            return
        kind, text, param = message[2], str(message[3]), message[4]
        error: Exception
        if kind == "unavailable":
            error = EngineUnavailable(text)
        elif kind == "request":
            error = RequestError(text, param=None if param is None else str(param))
        else:
            error = EngineError(text)
        outputs.settle(error)
        outputs.fail(error if isinstance(error, EngineError) else EngineError(text))
