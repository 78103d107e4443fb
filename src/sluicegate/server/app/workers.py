"""``serve --workers N``: N front-end processes on one port, and the engine process.

The parent process binds the port and starts N workers, each a plain
``sluicegate serve`` process (its own event loop, engines, ledger writer and
metrics) that inherits one listening socket (``--listen-fd``) and accepts on
it, and, for a local engine in a process of its own (``--engine-process``,
always for llama.cpp above one worker), the engine process
(``--engine-serve``, ``engines/remote/host.py``), which the workers reach
through ``--engine-socket`` (``engines/remote/engine.py``). The parent serves
nothing: ``supervisor.py`` restarts a child that exits and stops them all on
a signal. A worker whose parent is gone drains and exits (``DrainingServer``
watches its parent); so does the engine process.

What the workers share lives outside them: quotas and resumable streams in
Redis (``--redis``, required above one worker: the memory store would give
each worker its own), the ledger in one SQLite file in WAL mode or in
PostgreSQL (every worker writes its own rows under its own server id), and the
Prometheus series of finished requests in files of one folder
(``PROMETHEUS_MULTIPROC_DIR``, prometheus-client's multiprocess mode), summed
by whichever worker answers ``/metrics``.

The sockets: one ``SO_REUSEPORT`` socket per worker slot, all on the same
port, made and kept open by the parent; worker ``i`` inherits socket ``i``.
The kernel spreads new connections over the sockets by a hash of their
addresses, so each worker gets an even share whether or not it is busy.
One socket shared by all workers (gunicorn's and uvicorn's way) leaves the
choice to whichever worker's event loop wakes first, and epoll wakes the one
that waited last: under load one worker takes most connections while the
others idle. Because the parent holds each slot's socket, the connections
queued at a worker that died wait for its restart in that socket's queue
instead of being reset, and ``--port 0`` works (the first socket picks the
port, the others bind it). Only processes of the same user may join a port's
``SO_REUSEPORT`` group.

Spec: docs/serving.md, "Workers"; uvicorn's and gunicorn's ``--workers``.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import logging
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path

from sluicegate.core.restarts import StuckWatch
from sluicegate.engines.base import Engine, OutputKind
from sluicegate.engines.remote.host import beat_path
from sluicegate.server.app.supervisor import WorkerSupervisor
from sluicegate.server.metering.metrics import MULTIPROC_DIR
from sluicegate.server.metering.worker_stats import RUN_DIR

__all__ = [
    "add_worker_options",
    "listen_sockets",
    "parse_workers",
    "run_engine_process",
    "run_workers",
    "serve_sockets",
    "supervised",
    "worker_count",
    "worker_sockets",
]

logger = logging.getLogger(__name__)

ACCEPT_SOCKETS = 8
"""Listening sockets one ``serve`` process binds to its address by default
(``--accept-sockets``; ``SO_REUSEPORT``;
the kernel spreads new connections over them). The event loop (libuv) accepts
one connection per listening socket per turn, and a turn at thousands of
streams takes milliseconds: with one socket, a burst of new connections waited
in the kernel's queue for seconds (``bench/stream_waits.py``)."""


def parse_workers(text: str) -> int:
    """``--workers``: a count from 1, or ``auto`` (0 here: ``worker_count``
    turns it into the usable cores).

    Raises:
        ValueError: neither ``auto`` nor an integer >= 1.
    """
    if text == "auto":
        return 0
    try:
        count = int(text)
    except ValueError:
        count = 0  # "two": the same message as for "0"
    if count < 1:
        raise ValueError(f"expected auto or an integer >= 1, got {text!r}")
    return count


def worker_count(asked: int) -> int:
    """``asked``, or for 0 (``auto``) the cores this process may run on."""
    return asked or len(os.sched_getaffinity(0))


def add_worker_options(serve: argparse.ArgumentParser) -> None:
    """Add ``--workers``, ``--engine-process`` and the children's own options
    to the ``serve`` parser."""

    def workers(text: str) -> int:
        try:
            return parse_workers(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    add = serve.add_argument
    add(
        "--workers",
        type=workers,
        default=1,
        metavar="N",
        help="front-end processes accepting on the port, each with its own event"
        " loop (auto: one per usable core; above 1, --redis is required)"
        " (default: %(default)s)",
    )
    add(
        "--engine-process",
        action="store_true",
        help="run the local engine in a process of its own, which the workers"
        " reach over a Unix socket; a crash there ends its streams with an"
        " error, and it is restarted (always so for llama.cpp above one worker)",
    )
    add(
        "--engine-heartbeat-s",
        type=float,
        default=10.0,
        metavar="S",
        help="an engine process that wrote no beat for S seconds (stopped, its"
        " loop blocked) is killed and restarted (default: %(default)s)",
    )
    add(
        "--engine-step-deadline-s",
        type=float,
        default=60.0,
        metavar="S",
        help="an engine process with requests and no progress for S seconds (a"
        " step that never returns) is killed and restarted (default: %(default)s)",
    )
    # Set by the parent (workers.py) on the command lines of its children.
    add("--listen-fd", type=int, help=argparse.SUPPRESS)
    add("--engine-socket", help=argparse.SUPPRESS)
    add("--engine-serve", help=argparse.SUPPRESS)


def listen_sockets(
    host: str, port: int, count: int, backlog: int, *, inheritable: bool = True
) -> list[socket.socket]:
    """``count`` TCP sockets bound to ``host:port`` with ``SO_REUSEPORT``,
    listening with ``backlog`` (connections; the kernel caps it at
    ``net.core.somaxconn``), inheritable by children unless ``inheritable``
    is false.

    Port 0 binds a free port for the first, and the others bind that one
    (``getsockname()`` tells which). A port some socket already listens on is
    refused, as one process's ``serve`` refuses it: ``SO_REUSEPORT`` sockets
    would join the listening group of another ``serve --workers`` of the same
    user on that port, and the two servers would share its connections.

    Raises:
        OSError: the address cannot be bound (in use, not local).
    """
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    with socket.socket(family, kind, proto) as probe:  # without SO_REUSEPORT
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(address)
        address = probe.getsockname()
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(address)
            address = sock.getsockname()  # port 0: the one the first got
            sock.listen(backlog)
            sock.set_inheritable(inheritable)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def serve_sockets(args: argparse.Namespace, backlog: int) -> list[socket.socket]:
    """The sockets ``serve``'s server listens on: a worker's, from its parent
    (``--listen-fd``), else ``--accept-sockets`` of them bound to
    ``--host``/``--port`` with ``backlog`` each.

    Raises:
        SystemExit: the address cannot be bound (the message names it).
    """
    if args.listen_fd is not None:
        return [socket.socket(fileno=args.listen_fd)]
    try:
        # A socket without SO_REUSEPORT first: it cannot bind a port another
        # server listens on, so a second ``serve`` there is refused, as it was
        # with one socket, instead of sharing the first one's connections.
        family, kind, proto, _, address = socket.getaddrinfo(
            args.host, args.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
            port = probe.getsockname()[1]  # port 0: a free one
        return listen_sockets(
            args.host,
            port,
            args.accept_sockets,
            backlog,
            inheritable=False,
        )
    except OSError as exc:
        raise SystemExit(
            f"sluicegate: cannot listen on {args.host}:{args.port}: {exc}"
        ) from exc


def worker_sockets(args: argparse.Namespace) -> list[socket.socket]:
    """The listening sockets of ``serve --workers``' ``args``, one per worker,
    each with the backlog a single-process ``serve`` listens with: its
    connection cap (``--max-connections``, else the default), at least
    uvicorn's 2,048 (``ConnectionLimits.backlog``).

    A worker's server listens again with the same backlog once it runs; the
    parent's counts while a worker starts or restarts, when new connections
    wait in that worker's queue.

    Raises:
        OSError: the address cannot be bound.
        ValueError: ``--max-connections`` below 1.
    """
    from sluicegate.server.http.connections import (
        ConnectionLimits,
        default_max_connections,
    )

    cap = args.max_connections or default_max_connections()
    backlog = ConnectionLimits(max_connections=cap).backlog
    return listen_sockets(args.host, args.port, worker_count(args.workers), backlog)


def _check_redis(url: str) -> None:
    """Refuse a ``--redis`` that is no Redis URL; warn when it does not answer.

    Every worker would fail on a malformed URL at its start, and the parent
    would restart them until its limit; an unreachable Redis is not fatal (it
    may come up later), but until it answers each request that quotas apply to
    is refused with 503 and resumable streams fail, so it is said at once.

    Raises:
        SystemExit: ``url`` is not a Redis URL.
    """
    from sluicegate.server.ledger.pg_schema import redact
    from sluicegate.server.redis.client import redis_unreachable

    try:
        why = redis_unreachable(url)
    except ValueError as exc:
        raise SystemExit(f"sluicegate: --redis {redact(url)!r}: {exc}") from exc
    if why is not None:
        logger.warning(
            "Redis at %s does not answer (%s): the workers start, but until it"
            " does, requests that a quota applies to and resumable streams are"
            " refused with 503",
            redact(url),
            why,
        )


def supervised(args: argparse.Namespace) -> bool:
    """Whether ``serve``'s ``args`` make this process the parent of workers
    (``--workers`` above 1, or ``--engine-process``), not a worker itself."""
    child = args.listen_fd is not None or args.engine_serve is not None
    return not child and (worker_count(args.workers) > 1 or args.engine_process)


def _local_engine(args: argparse.Namespace) -> bool:
    return args.engine is not None or not (args.upstream or args.upstreams)


def run_workers(args: argparse.Namespace) -> int:
    """``serve --workers``/``--engine-process``: bind the port, start the
    engine process when there is one, and the workers (``WorkerSupervisor``)
    until a signal; ``args`` are ``serve``'s, ``args.argv`` the command line
    the children repeat.

    The engine process runs the local engine when ``--engine-process`` asks,
    and for llama.cpp above one worker (one model in memory, one batch); a
    scripted engine above one worker runs in each worker.

    A ``--redis`` that does not answer a ``PING`` is warned about in the log
    (``redis_unreachable``); the workers start all the same.

    Raises:
        SystemExit: above one worker, no ``--redis``; a ``--redis`` that is no
            Redis URL; the port cannot be bound (each message says what to
            pass).

    Returns:
        The exit code: 0, or 1 (a restart limit, a failed stop).
    """
    count = worker_count(args.workers)
    if count > 1 and args.redis is None:
        raise SystemExit(
            f"sluicegate: --workers {count} keeps quotas and resumable streams in"
            " Redis, shared by the workers: pass --redis redis://HOST:PORT/DB"
            " (or --workers 1)"
        )
    if args.redis is not None:
        _check_redis(args.redis)
    llamacpp = _local_engine(args) and args.engine != "scripted"
    separate = _local_engine(args) and (args.engine_process or llamacpp)
    try:
        sockets = worker_sockets(args)
    except ValueError as exc:
        raise SystemExit(f"sluicegate: --max-connections: {exc}") from exc
    except OSError as exc:
        raise SystemExit(
            f"sluicegate: cannot listen on {args.host}:{args.port}: {exc}"
        ) from exc
    run_dir = Path(tempfile.mkdtemp(prefix="sluicegate-"))  # mode 0700
    env = dict(os.environ)
    env[RUN_DIR] = str(run_dir / "stats")  # each worker's engine stats
    if MULTIPROC_DIR not in env:  # each worker's series in files here
        env[MULTIPROC_DIR] = str(run_dir / "metrics")
        os.mkdir(env[MULTIPROC_DIR])
    base = [sys.executable, "-m", "sluicegate", *args.argv]
    engine_command = None
    worker_command = base
    engine_socket = run_dir / "engine.sock"
    if separate:
        engine_command = [*base, "--engine-serve", str(engine_socket)]
        worker_command = [*base, "--engine-socket", str(engine_socket)]
    port = sockets[0].getsockname()[1]
    logger.info("serving on http://%s:%d with %d workers", args.host, port, count)
    supervisor = WorkerSupervisor(
        worker_command,
        [sock.fileno() for sock in sockets],
        env,
        engine_command,
        engine_beat=beat_path(engine_socket) if separate else None,
        watch=lambda: StuckWatch(args.engine_heartbeat_s, args.engine_step_deadline_s),
    )
    try:
        return supervisor.run()
    finally:
        for sock in sockets:
            sock.close()
        shutil.rmtree(run_dir, ignore_errors=True)


def run_engine_process(args: argparse.Namespace, engine: Engine) -> int:
    """The engine process (``--engine-serve PATH``): serve ``engine`` to the
    workers on the Unix socket ``PATH`` until SIGTERM (``engines/remote/host.py``).

    Returns:
        The exit code: 0, or 1 when the engine failed (the supervisor
        restarts it).
    """
    from sluicegate.engines.remote.host import serve_engine

    assert engine.output_kind is OutputKind.TOKENS
    # llama.cpp: the workers load the vocabulary from the model file; the
    # scripted engine's tokenizer is sent as it is.
    vocab: object = engine.tokenizer if args.engine == "scripted" else args.model
    path = Path(args.engine_serve)
    if not faulthandler.is_enabled():  # a native crash: its stacks on stderr
        faulthandler.enable()
    return asyncio.run(serve_engine(engine, path, vocab, parent_pid=os.getppid()))
