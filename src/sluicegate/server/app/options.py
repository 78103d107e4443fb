"""Command-line options of ``sluicegate serve`` for admission, limits, shutdown and
the ledger.

``cli.py`` calls ``add_serve_options`` on its ``serve`` parser, turns the parsed
options into ``ServerConfig`` fields with ``config_fields``, runs uvicorn with
``run_server`` (SIGTERM drains first, see ``shutdown.py``; HTTP connection limits,
see ``connections.py``). The ``sluicegate usage`` command is ``usage_command.py``.

Spec: docs/DESIGN.md, "Admission and limits", "Slow consumers", "Timeouts",
"Graceful shutdown" and "Metering".
"""

from __future__ import annotations

import argparse
import gc
import os
from pathlib import Path
from typing import Any

from starlette.applications import Starlette

from sluicegate.server.admission.keys import ApiKey, read_keys_file
from sluicegate.server.admission.quotas import Quota
from sluicegate.server.app.workers import add_worker_options, worker_count
from sluicegate.server.ledger.pg_schema import is_url
from sluicegate.server.prepare import schema_checks

__all__ = [
    "add_serve_options",
    "config_fields",
    "default_ledger_path",
    "read_chat_template",
    "run_server",
]


def read_chat_template(arg: str | None) -> str | None:
    """The text of ``--chat-template FILE`` (``None`` without one).

    Raises:
        SystemExit: the file cannot be read as UTF-8 (message names it).
    """
    if arg is None:
        return None
    try:
        return Path(arg).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SystemExit(f"sluicegate: --chat-template {arg!r}: {exc}") from exc


def default_ledger_path() -> Path:
    """``<data dir>/ledger.sqlite3`` (``$SLUICEGATE_HOME`` or the user cache)."""
    from sluicegate.model import data_dir

    return data_dir() / "ledger.sqlite3"


def add_serve_options(serve: argparse.ArgumentParser) -> None:
    """Add the admission, limit and ledger options to the ``serve`` parser."""
    add = serve.add_argument
    add("--api-key", action="append", default=[], help="accepted key (repeatable)")
    add("--api-keys-file", type=Path, help="lines of 'key [model,...]'")
    add(
        "--admin-key",
        action="append",
        default=[],
        help="key of /metrics, /engine/stats and /engine/requests (repeatable);"
        " without one they are open only while no API key is set",
    )
    add(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name accepted besides IP addresses, localhost and --host,"
        " while no key guards a route (repeatable; '*': any)",
    )
    add(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a web origin (http://host:port) whose pages may call this server"
        " from a browser (repeatable; '*': any; default: none)",
    )
    add("--requests-per-minute", type=float, help="per-key request quota")
    add("--tokens-per-minute", type=float, help="per-key prompt+max_tokens quota")
    add(
        "--redis",
        metavar="URL",
        help="redis://host:port/db holding the quotas and resumable logs, shared"
        " by every replica given the same URL (default: in this process)",
    )
    _add_resume_options(serve)
    add("--first-token-timeout-s", type=float, help="time to first token limit")
    add("--request-timeout-s", type=float, help="total time limit of a request")
    add(
        "--retry-after-s",
        type=int,
        default=1,
        help="Retry-After seconds of a 503 (overload, draining, a store down)",
    )
    add("--stream-buffer-bytes", type=int, default=1024 * 1024)
    add("--stuck-stream-timeout", type=float, default=30.0, help="seconds")
    add("--stream-interval-ms", type=float, default=0.0, help="event pacing")
    add("--stream-interval", type=int, default=1, help="tokens per content write")
    add(
        "--no-obfuscation",
        action="store_true",
        help="do not pad stream events unless a request's include_obfuscation asks",
    )
    add(
        "--cadence-ms",
        type=float,
        default=0.0,
        help="send stream events on a fixed clock of this period, padded, an"
        " empty event when no token is ready (0: off; default: %(default)s)",
    )
    add(
        "--default-max-tokens",
        type=int,
        default=1024,
        help="max_tokens of a request that sets none (0: all the context leaves);"
        " the engine reserves prompt + max_tokens KV cells per request",
    )
    add(
        "--ledger",
        metavar="PATH|URL",
        help="SQLite ledger file (default: data dir), or a postgresql:// URL of a"
        " ledger database that replicas share",
    )
    add(
        "--ledger-lease-s",
        type=float,
        default=10.0,
        help="with a postgresql:// ledger: seconds without a heartbeat after which"
        " a replica marks this server's running requests truncated"
        " (default: %(default)s)",
    )
    add("--no-ledger", action="store_true", help="keep the ledger in memory only")
    add_worker_options(serve)
    _add_http_options(serve)
    schema_checks.add_schema_options(serve)


def _add_resume_options(serve: argparse.ArgumentParser) -> None:
    add = serve.add_argument
    add(
        "--resumable",
        action="store_true",
        help="make event streams resumable unless a request sets"
        " stream_options.resumable to false (default: only those that ask)",
    )
    add(
        "--store-responses",
        action="store_true",
        help="store Responses API responses unless a request sets store to false"
        " (default: only those that ask, and background ones)",
    )
    add(
        "--resume-grace-s",
        type=float,
        default=30.0,
        help="seconds a resumable stream generates with no reader before it is"
        " aborted (default: %(default)s)",
    )
    add(
        "--resume-ttl-s",
        type=float,
        default=600.0,
        help="seconds a finished resumable stream stays readable"
        " (default: %(default)s)",
    )
    add("--max-log-bytes", type=int, default=1 << 20, help="bytes kept per stream")
    add(
        "--max-store-bytes",
        type=int,
        default=256 << 20,
        help="bytes kept over all resumable streams (default: 256 MiB)",
    )


def _add_http_options(serve: argparse.ArgumentParser) -> None:
    from sluicegate.server.app.workers import ACCEPT_SOCKETS
    from sluicegate.server.http.connections import ConnectionLimits

    limits = ConnectionLimits()
    add = serve.add_argument
    add(
        "--max-connections",
        type=int,
        help="open connections served at once; a request on one more gets 503"
        " (default: 4096, or the open-file limit minus 64 when lower)",
    )
    add(
        "--accept-sockets",
        type=int,
        default=ACCEPT_SOCKETS,
        metavar="N",
        help="SO_REUSEPORT listening sockets of one serve process on its port;"
        " the event loop accepts one connection per socket per turn, so more"
        " sockets answer a burst of new streams sooner and delay the running"
        " ones more (docs/performance.md) (default: %(default)s; a worker of"
        " --workers listens on its parent's one)",
    )
    add(
        "--max-header-bytes",
        type=int,
        default=limits.max_header_bytes,
        help="largest request line + headers, bytes; larger gets 431 and a close"
        " (default: %(default)s)",
    )
    add(
        "--header-timeout-s",
        type=float,
        default=limits.header_timeout_s,
        help="seconds for a request's headers to arrive (from the connection's"
        " opening or the request's first byte); later: 408 and a close"
        " (default: %(default)s)",
    )
    add(
        "--body-timeout-s",
        type=float,
        default=limits.body_timeout_s,
        help="seconds for a request's body to arrive after its headers;"
        " later: 408 and a close (default: %(default)s)",
    )
    add(
        "--keep-alive-timeout-s",
        type=int,
        default=5,
        help="seconds an idle connection stays open between requests"
        " (default: %(default)s)",
    )


def config_fields(args: argparse.Namespace) -> dict[str, Any]:
    """``ServerConfig`` keyword arguments from the options ``add_serve_options`` added.

    Raises:
        SystemExit: the keys file cannot be read or parsed (message names it).
    """
    keys = [ApiKey(k) for k in args.api_key]
    if args.api_keys_file is not None:
        try:
            keys += read_keys_file(args.api_keys_file)
        except (OSError, ValueError) as exc:
            raise SystemExit(f"sluicegate: --api-keys-file: {exc}") from exc
    ledger = None if args.no_ledger else (args.ledger or str(default_ledger_path()))
    url = ledger if ledger is not None and is_url(ledger) else None
    return {
        "api_keys": tuple(keys),
        "admin_keys": tuple(ApiKey(k) for k in args.admin_key),
        # The bound name is one that clients use; IP literals and localhost
        # names are always accepted (access.py).
        "allowed_hosts": (args.host, *args.allowed_host),
        "cors_origins": tuple(args.cors_origin),
        "quota": Quota(args.requests_per_minute, args.tokens_per_minute),
        "first_token_timeout_s": args.first_token_timeout_s,
        "request_timeout_s": args.request_timeout_s,
        "retry_after_s": args.retry_after_s,
        "max_stream_buffer_bytes": args.stream_buffer_bytes,
        "stuck_stream_timeout_s": args.stuck_stream_timeout,
        "stream_interval_s": args.stream_interval_ms / 1000.0,
        "stream_interval": args.stream_interval,
        "obfuscation": not args.no_obfuscation,
        "cadence_s": args.cadence_ms / 1000.0,
        "ledger_path": None if ledger is None or url else Path(ledger),
        "ledger_url": url,
        "ledger_lease_s": args.ledger_lease_s,
        "redis_url": args.redis,
        "resumable_streams": args.resumable,
        "store_responses": args.store_responses,
        "resume_grace_s": args.resume_grace_s,
        "resume_ttl_s": args.resume_ttl_s,
        "max_log_bytes": args.max_log_bytes,
        "max_store_bytes": args.max_store_bytes,
        "default_max_tokens": args.default_max_tokens or None,
        "workers": worker_count(args.workers),
        **schema_checks.schema_config_fields(args),
    }


def run_server(app: Starlette, args: argparse.Namespace) -> int:
    """Serve ``app`` with uvicorn until a signal; the first SIGTERM drains.

    Running responses get ``args.grace_s`` seconds, then the in-band
    ``server_shutdown`` error; uvicorn's own shutdown follows. Connections are
    served by h11 with the limits of ``connections.py`` (head size and read
    deadlines, a connection cap: 503 past it) and uvicorn's keep-alive
    timeout. Their refusals count in the app's metrics.

    Raises:
        SystemExit: a limit is out of range, or the address cannot be bound.

    Returns:
        The process exit code: 0, or 1 when the engine stopped serving.
    """
    import uvicorn

    from sluicegate.server.app.workers import serve_sockets
    from sluicegate.server.http.connections import (
        ConnectionLimits,
        default_max_connections,
        protocol_class,
    )
    from sluicegate.server.streaming.shutdown import DrainingServer

    max_connections = args.max_connections or default_max_connections()
    if max_connections < 1 or args.keep_alive_timeout_s < 1 or args.accept_sockets < 1:
        raise SystemExit(
            "sluicegate: --max-connections, --keep-alive-timeout-s and"
            " --accept-sockets must be >= 1"
        )
    try:
        limits = ConnectionLimits(
            header_timeout_s=args.header_timeout_s,
            body_timeout_s=args.body_timeout_s,
            max_header_bytes=args.max_header_bytes,
            max_connections=max_connections,
            retry_after_s=app.state.config.retry_after_s,
        )
    except ValueError as exc:
        raise SystemExit(f"sluicegate: {exc}") from exc
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=args.grace_s + 5.0,
        # h11, never httptools (see connections.py); the protocol caps
        # connections itself (a JSON 503 with Retry-After): no limit_concurrency.
        http=protocol_class(limits, app.state.metrics.refuse),
        h11_max_incomplete_event_size=limits.max_header_bytes,
        timeout_keep_alive=args.keep_alive_timeout_s,
        backlog=limits.backlog,  # a burst of new streams waits there
        # No route speaks WebSocket; an upgrade would take the connection away
        # from the limits above.
        ws="none",
    )
    worker = args.listen_fd is not None  # a worker of serve --workers
    server = DrainingServer(
        config,
        app.state.drain,
        args.grace_s,
        app.state.engine,
        parent_pid=os.getppid() if worker else None,
    )
    # Everything made so far (modules, the app, the engine, its templates) lives
    # as long as the process: out of every later collection, so that a full one
    # walks only what requests and kept logs made (a pause of milliseconds, not
    # tens of them). Spec: the gc module's documentation, gc.freeze().
    gc.freeze()
    server.run(sockets=serve_sockets(args, limits.backlog))
    return server.exit_code
