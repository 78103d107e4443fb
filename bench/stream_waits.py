"""Where a new stream waits before its first byte, many streams on one core.

``bench/streams.py``'s sluicegate (``serve --engine scripted``, every event
padded, pinned to ``--server-cpu``) and its native load client (on
``--load-cpu``): ``--n`` streams started over ``--ramp-s``, each asking for
``--rate`` tokens/s for ``--duration-s``. The server runs with stamps added
from outside the package: this script, started as the server, wraps four
places a request passes (``time.perf_counter``, the clock the client stamps
with) before it runs the CLI:

- ``accepted``: the connection made (``LimitedH11Protocol.connection_made``:
  the loop accepted it from the listen queue);
- ``app``: its request's head parsed and the app called
  (``LimitedH11Protocol._capped_app``);
- ``admitted``: the body read, the request validated, planned and admitted,
  its generation started (``CompletionRoutes._admit`` returned);
- ``head``: the response's head written with its first event
  (``ChunkedBodySend.start_with``);

and a probe of the loop's lag (a callback every 10 ms, late by how much). The
client stamps each connection when the kernel completed it (``sent_at``) and
its first read. The listen queue is first in, first out: the i-th connection
completed is the i-th accepted, so the wait in the queue is the i-th stamp of
one sorted list against the i-th of the other.

Prints and writes (``--json``) p50, p99 and max of each wait, the first
byte's and the first token's times (the client's), and the loop's lag while
the streams start and after, with the kernel's counts of listen-queue
overflows and SYN cookies over the run (the machine's). Not a test.

Run: ``.venv/bin/python bench/stream_waits.py --n 2000 --json FILE``
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sluicegate.testing import ServerProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))  # bench/ is scripts, not a package
import stream_load  # noqa: E402  (bench/stream_load.py: the request)
import stream_native  # noqa: E402  (bench/stream_native.py: the native client)

STAMPS_ENV = "STREAM_WAITS_OUT"
SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank. "
LAG_EVERY_S = 0.01


def _serve(argv: list[str]) -> int:
    """The server side: the CLI with the stamps wrapped in (see the module)."""
    from sluicegate.cli import main
    from sluicegate.server.apis.completion_routes import CompletionRoutes
    from sluicegate.server.http.chunked_body import ChunkedBodySend
    from sluicegate.server.http.connections import LimitedH11Protocol

    now = time.perf_counter
    stamps: dict[str, list[tuple[int, float]]] = {
        "accepted": [],
        "app": [],
        "admitted": [],
        "head": [],
    }
    lags: list[tuple[float, float]] = []

    def probe(loop: Any, due: float) -> None:
        at = now()
        lags.append((at, at - due))
        loop.call_later(LAG_EVERY_S, probe, loop, at + LAG_EVERY_S)

    made, capped = LimitedH11Protocol.connection_made, LimitedH11Protocol._capped_app
    admit, start_with = CompletionRoutes._admit, ChunkedBodySend.start_with

    def connection_made(self: Any, transport: Any) -> None:
        at = now()
        made(self, transport)
        if not lags:
            lags.append((at, 0.0))
            self.loop.call_later(LAG_EVERY_S, probe, self.loop, at + LAG_EVERY_S)
        stamps["accepted"].append((self.client[1], at))

    async def capped_app(self: Any, scope: Any, receive: Any, send: Any) -> None:
        stamps["app"].append((scope["client"][1], now()))
        await capped(self, scope, receive, send)

    async def admitted(self: Any, request: Any, planner: Any, meter: Any) -> Any:
        generation = await admit(self, request, planner, meter)
        stamps["admitted"].append((request.scope["client"][1], now()))
        return generation

    async def head(self: Any, start: Any, message: Any, body: bytes) -> None:
        stamps["head"].append((self._cycle.scope["client"][1], now()))
        await start_with(self, start, message, body)

    LimitedH11Protocol.connection_made = connection_made  # type: ignore[method-assign]
    LimitedH11Protocol._capped_app = capped_app  # type: ignore[method-assign]
    CompletionRoutes._admit = admitted  # type: ignore[method-assign]
    ChunkedBodySend.start_with = head  # type: ignore[method-assign]

    def write() -> None:
        out = {"stamps": stamps, "lags": lags}
        Path(os.environ[STAMPS_ENV]).write_text(json.dumps(out))

    atexit.register(write)
    return main(argv)


_NETSTAT = (
    "ListenOverflows",
    "ListenDrops",
    "TCPReqQFullDoCookies",
    "TCPReqQFullDrop",
    "SyncookiesSent",
    "SyncookiesRecv",
)


def _netstat() -> dict[str, int]:
    """The kernel's TCP counters of a listen queue's overflows and SYN cookies
    (``/proc/net/netstat``, the whole machine's)."""
    lines = Path("/proc/net/netstat").read_text().splitlines()
    heads, values = (line.split() for line in lines[:2])
    counts = dict(zip(heads[1:], (int(v) for v in values[1:]), strict=True))
    return {name: counts.get(name, 0) for name in _NETSTAT}


def _cuts(values: Sequence[float]) -> dict[str, float | None]:
    """p50, p99 and max of ``values``, in ms."""
    cut = stream_load.percentiles([1000 * v for v in values])
    return {k: None if v is None else round(v, 1) for k, v in cut.items()}


def _waits(server: dict[str, Any], run: stream_native.NativeRun) -> dict[str, Any]:
    """Each wait's p50, p99 and max over the streams, and the loop's lag."""
    streams = [s for s in run.streams if s is not None]
    sent = sorted(s.sent_at for s in streams)
    by = {k: dict(v) for k, v in server["stamps"].items()}
    # The health checks' connections came before the client started.
    accepted = sorted(a for a in by["accepted"].values() if a >= run.start)
    queue = [a - s for s, a in zip(sent, accepted, strict=False)]

    def between(first: str, then: str) -> list[float]:
        return [by[then][p] - by[first][p] for p in by[then] if p in by[first]]

    first_byte = [s.stamps[0] - s.sent_at for s in streams if s.stamps]
    first_token = [
        next(t for t, c in zip(s.stamps, s.counts, strict=True) if c) - s.sent_at
        for s in streams
        if any(s.counts)
    ]
    ramp_end = run.start + max(sent) - min(sent) if sent else run.start
    lags = [lag for at, lag in server["lags"] if at <= ramp_end]
    return {
        "connections": len(streams),
        "accepted": len(accepted),
        "listen_queue_ms": _cuts(queue),
        "accepted_to_app_ms": _cuts(between("accepted", "app")),
        "app_to_admitted_ms": _cuts(between("app", "admitted")),
        "admitted_to_head_ms": _cuts(between("admitted", "head")),
        "first_byte_ms": _cuts(first_byte),
        "first_token_ms": _cuts(first_token),
        "loop_lag_during_ramp_ms": _cuts(lags),
        "loop_lag_after_ramp_ms": _cuts(
            [lag for at, lag in server["lags"] if at > ramp_end]
        ),
    }


def _measure(
    args: argparse.Namespace, tmp: Path, sockets: int | None
) -> dict[str, Any]:
    text, out = tmp / "script.txt", tmp / "stamps.json"
    text.write_text(SENTENCE * (int(args.rate * args.duration_s) // 10 + 1))
    port = free_port()
    command = ["taskset", "-c", args.server_cpu, sys.executable, __file__, "--serve"]
    command += ["serve", "--engine=scripted", f"--port={port}"]
    command += [f"--scripted-rate={args.rate}", f"--scripted-text={text}"]
    command += ["--scripted-max-running=100000", "--scripted-max-queued=100000"]
    command += ["--no-ledger", "--log-level=warning"]
    if sockets is not None:
        command.append(f"--accept-sockets={sockets}")
    env = {STAMPS_ENV: str(out)}
    if args.src is not None:  # the server runs another checkout's code
        env["PYTHONPATH"] = str(args.src.resolve())
    server = ServerProcess(command, port, name="sluicegate", cwd=ROOT, env=env)
    loadavg = os.getloadavg()[0]
    try:
        server.wait_ready("/health", timeout_s=30, interval_s=0.1)
        tokens = max(int(args.rate * args.duration_s), 1)
        request = stream_load.request_bytes(port, tokens)
        rng = random.Random(args.n)
        delays = [rng.uniform(0, args.ramp_s) for _ in range(args.n)]
        os.sched_setaffinity(0, {int(c) for c in args.load_cpu.split(",")})
        kernel = _netstat()
        run = stream_native.run(port, request, delays, args.duration_s + 30, tokens)
        after = _netstat()
    finally:
        server.stop(signal.SIGINT)
    row = {"streams": args.n, "src": args.src_name, "accept_sockets": sockets}
    row["loadavg_1m"] = loadavg
    row |= _waits(json.loads(out.read_text()), run)
    row["kernel_counts"] = {k: after[k] - kernel[k] for k in kernel}
    row["loadavg_1m_after"] = os.getloadavg()[0]
    return row


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--serve"]:
        return _serve(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="streams")
    parser.add_argument("--rate", type=float, default=20.0, help="tokens/s a stream")
    parser.add_argument("--duration-s", type=float, default=10.0)
    parser.add_argument("--ramp-s", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=1, help="runs")
    parser.add_argument("--server-cpu", default="0")
    parser.add_argument("--load-cpu", default="1")
    parser.add_argument(
        "--src",
        type=Path,
        help="the src folder of another checkout for the server (a worktree of"
        " an older commit); this tree's code by default",
    )
    parser.add_argument(
        "--src-name", default="this tree", help="what the rows call --src's code"
    )
    parser.add_argument(
        "--accept-sockets",
        type=int,
        nargs="+",
        metavar="N",
        help="serve's --accept-sockets: one server per count, each run (the"
        " order reversed every other run); the server's default if not given",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    stream_native.build()
    rows = []
    counts: list[int | None] = list(args.accept_sockets or [None])
    for run in range(args.repeat):
        for sockets in counts if run % 2 == 0 else counts[::-1]:
            with tempfile.TemporaryDirectory() as tmp:
                rows.append(_measure(args, Path(tmp), sockets))
            print(json.dumps(rows[-1], indent=1))
    if args.json:
        report = {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": "bench/stream_waits.py "
            + " ".join(
                "OLD_CHECKOUT/src" if before == "--src" else a
                for before, a in zip(["", *argv], argv, strict=False)
            ),
            "rows": rows,
            "median_first_byte_p99_ms": statistics.median(
                r["first_byte_ms"]["p99"] for r in rows
            ),
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
