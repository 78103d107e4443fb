"""Many concurrent streams against one server core: sluicegate vs a common baseline.

Starts two servers, each pinned to CPU 0 with ``taskset``, both running the
scripted engine at ``--rate`` tokens/s per stream on the same ASCII script:

- ``sluicegate``: ``sluicegate serve --engine scripted`` (every event padded,
  the default);
- ``sluicegate-plain``: the same with ``--no-obfuscation`` (what padding costs);
- ``baseline``: ``bench/baseline_server.py`` (Starlette + sse-starlette + a pydantic
  chunk per token, naive per-token re-decode);
- ``raw``: ``bench/raw_server.py``, the floor: uvloop writing a prebuilt frame per
  token on the same schedule, no framework, JSON or engine (what this machine
  charges for the write and the loop alone).

For each N in ``--n``, a load process pinned to CPU 1 (this file with
``--load``) opens N streaming chat requests over raw asyncio sockets, their starts
spread uniformly over ``--ramp-s`` seconds (a real server's streams do not tick in
phase), each asking for ``rate x duration`` tokens. The client parses no JSON: it
counts content events in whole HTTP chunks and stamps their arrival time, so it is
cheap enough not to be the bottleneck (its own CPU share is reported).

Reported per server and N:

- delivered tokens/s: content events that arrived while every stream was running
  (from the end of the ramp to the end of the first stream), per second;
- added inter-token latency p50/p99 (ms): each gap between two content events of
  a stream minus the engine's own step ``1/rate``;
- schedule lag p99 (ms): how late the k-th event is against ``first + k/rate``
  (includes the engine's timer drift, which both servers share);
- time to first token p50/p99 (ms), from sending the request; and time to
  the response's first byte (its head, which the server sends with the
  stream's first event once it admitted the request): what a new stream waited
  before the server answered (the accept queue, reading and admitting the
  request) against what it waited after (the engine's first step, the first
  token's write);
- server CPU (share of one core over the load) and CPU us per token, peak RSS
  (MiB, sampled ``VmRSS``);
- bytes per token: every byte the client received (HTTP head and chunk framing
  included) over the content events;
- streams finished, truncated (closed without ``[DONE]``; errored and rejected
  ones counted here too) and timed out (not over ``ramp + 2 x duration + 10`` s
  after the load started: the client gave up on them).

Then the ratio sluicegate/baseline for delivered tokens/s, p99 added latency and
CPU per token, and sluicegate's CPU per token over the floor's. With
``--repeat R`` every server is measured R times at each N, the order of the
servers reversed every other round (each row says its ``round``; the ratios
above are the last round's); with ``--resumable``, the on/off ratio of each
round and their median. With ``--paired``, the servers of a round are measured
at the same time instead of one after the other, each under its own load
process (all on the load CPU), so that whatever the shared machine does during
the round falls on every server alike; the server CPU must then have room for
all of them (each row's ``paired_cpu_share`` is their sum: over 0.9, the
servers waited for the core and the round says so).
Prints a table and writes ``bench/results/streams.json``, with the load average.
Not a test: nothing here asserts a timing.

Run: ``.venv/bin/python bench/streams.py [--n 100 500 1000 1500 2000] [--duration-s 10]
[--quick] [--repeat R] [--paired] [--profile FILE]``
"""

from __future__ import annotations

import argparse
import array
import asyncio
import contextlib
import json
import os
import platform
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from sluicegate.testing import ServerProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "streams.json"
PYTHON = sys.executable

# ASCII only, so every token is one content event (no UTF-8 held back).
SENTENCE = " The quick brown fox streams tokens correctly, once upon a time."

CONTENT = b'"content":"'
EMPTY_CONTENT = b'"content":""'
DONE = b"data: [DONE]"
ERROR = b'data: {"error"'
COMPLETION_TOKENS = re.compile(rb'"completion_tokens":(\d+)')
# A chunk of the chunked body whose data ends in a newline: every event before it
# is whole (each server writes whole events per chunk).
CHUNK_END = b"\n\r\n"


# ---------------------------------------------------------------- load process


@dataclass
class LoadStats:
    """What the load process measured over all its streams."""

    rate: float
    window: tuple[float, float]
    gaps_ms: array.array[float] = field(default_factory=lambda: array.array("d"))
    lags_ms: array.array[float] = field(default_factory=lambda: array.array("d"))
    ttft_ms: list[float] = field(default_factory=list)
    ttfb_ms: list[float] = field(default_factory=list)
    in_window: int = 0
    events: int = 0
    completion_tokens: int = 0
    finished: int = 0
    truncated: int = 0
    timed_out: int = 0
    errored: int = 0
    rejected: int = 0
    bytes_received: int = 0


class _Stream(asyncio.Protocol):
    """One streaming request; counts content events as whole chunks arrive."""

    def __init__(self, stats: LoadStats, request: bytes, done: asyncio.Future[None]):
        self.stats = stats
        self.request = request
        self.done = done
        self.buffer = b""
        self.sent_at = 0.0
        self.first = 0.0
        self.last = 0.0
        self.count = 0
        self.status_checked = False
        self.answered = False
        self.ended = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self.sent_at = time.perf_counter()
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if not self.answered:  # the response's first byte
            self.answered = True
            self.stats.ttfb_ms.append((now - self.sent_at) * 1000.0)
        self.stats.bytes_received += len(data)
        buffer = self.buffer + data
        cut = buffer.rfind(CHUNK_END)
        if cut < 0:
            self.buffer = buffer
            return
        whole, self.buffer = buffer[: cut + 3], buffer[cut + 3 :]
        stats = self.stats
        if not self.status_checked:
            self.status_checked = True
            if not whole.startswith(b"HTTP/1.1 200"):
                stats.rejected += 1
                self._end()
                return
        events = whole.count(CONTENT) - whole.count(EMPTY_CONTENT)
        if events:
            step_ms = 1000.0 / stats.rate
            if self.count == 0:
                self.first = now
                stats.ttft_ms.append((now - self.sent_at) * 1000.0)
            else:
                stats.gaps_ms.append((now - self.last) * 1000.0 - step_ms)
            for k in range(self.count, self.count + events):
                stats.lags_ms.append((now - self.first) * 1000.0 - k * step_ms)
            stats.gaps_ms.extend([-step_ms] * (events - 1))  # arrived together
            self.count += events
            self.last = now
            stats.events += events
            if stats.window[0] <= now < stats.window[1]:
                stats.in_window += events
        if ERROR in whole:
            stats.errored += 1
            self._end()
        elif DONE in whole:
            found = COMPLETION_TOKENS.search(whole)
            stats.completion_tokens += int(found[1]) if found else self.count
            stats.finished += 1
            self._end()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ended:
            self.stats.truncated += 1
            self.ended = True
        if not self.done.done():
            self.done.set_result(None)

    def _end(self) -> None:
        self.ended = True
        self.transport.close()


def _request(port: int, tokens: int, headers: Sequence[str] = ()) -> bytes:
    body = json.dumps(
        {
            "model": "scripted",
            "messages": [{"role": "user", "content": "Tell me a story."}],
            "stream": True,
            "max_tokens": tokens,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        + "".join(f"{header}\r\n" for header in headers)
        + "Accept: text/event-stream\r\n\r\n"
    )
    return head.encode() + body


async def _one(
    stats: LoadStats, port: int, request: bytes, delay_s: float, deadline: float
) -> None:
    await asyncio.sleep(delay_s)
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    try:
        transport, protocol = await loop.create_connection(
            lambda: _Stream(stats, request, done), "127.0.0.1", port
        )
    except OSError:
        stats.rejected += 1
        return
    transport.get_extra_info("socket").setsockopt(
        socket.IPPROTO_TCP, socket.TCP_NODELAY, 1
    )
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(done, max(deadline - time.perf_counter(), 0.0))
    if not protocol.ended:  # not over by the deadline: the client gives up
        protocol.ended = True
        stats.timed_out += 1
        transport.abort()


async def _load(
    port: int,
    n: int,
    rate: float,
    duration_s: float,
    ramp_s: float,
    headers: Sequence[str] = (),
) -> LoadStats:
    start = time.perf_counter()
    window = (start + ramp_s + 0.5, start + duration_s)
    stats = LoadStats(rate, window)
    request = _request(port, max(int(rate * duration_s), 1), headers)
    deadline = start + ramp_s + 2 * duration_s + 10.0
    rng = random.Random(n)
    await asyncio.gather(
        *(
            _one(stats, port, request, rng.uniform(0, ramp_s), deadline)
            for _ in range(n)
        )
    )
    return stats


def _run_load(args: argparse.Namespace) -> int:
    """The ``--load`` process: run one load, print its measurements as JSON."""
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    cpu0 = time.process_time()
    wall0 = time.perf_counter()
    stats = asyncio.run(
        _load(
            args.port,
            args.streams,
            args.rate,
            args.duration_s,
            args.ramp_s,
            args.header,
        )
    )
    window_s = stats.window[1] - stats.window[0]
    print(
        json.dumps(
            {
                "tokens_per_s": stats.in_window / window_s if window_s > 0 else 0.0,
                "events": stats.events,
                "completion_tokens": stats.completion_tokens,
                "itl_added_ms": _percentiles(stats.gaps_ms),
                "schedule_lag_ms": _percentiles(stats.lags_ms),
                "ttft_ms": _percentiles(stats.ttft_ms),
                "ttfb_ms": _percentiles(stats.ttfb_ms),
                "finished": stats.finished,
                "truncated": stats.truncated,
                "timed_out": stats.timed_out,
                "errored": stats.errored,
                "rejected": stats.rejected,
                "bytes_per_token": stats.bytes_received / max(stats.events, 1),
                "load_cpu_share": (time.process_time() - cpu0)
                / (time.perf_counter() - wall0),
            }
        )
    )
    return 0


def _percentiles(values: Sequence[float]) -> dict[str, float | None]:
    if len(values) < 2:
        only = values[0] if values else None
        return {"p50": only, "p99": only, "max": only}
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": cuts[49], "p99": cuts[98], "max": max(values)}


# ---------------------------------------------------------------- orchestration


# sluicegate with every unpaced stream written by its own task, not by the
# engine's callbacks (eager, the default): what the eager path earns.
_TASK_WRITER = (
    "import sys; from sluicegate.cli import main; "
    "from sluicegate.server.streaming.sse_response import EventStreamResponse; "
    "EventStreamResponse.eager = False; sys.exit(main(sys.argv[1:]))"
)


# sluicegate on uvicorn's httptools protocol instead of its own h11 one: what the
# HTTP layer costs per token. Not a server to deploy: none of the connection
# limits of server/http/connections.py (head size, read deadlines, the cap) apply.
_HTTPTOOLS = (
    "import sys; import sluicegate.server.http.connections as c; "
    "from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol; "
    "c.protocol_class = lambda limits, on_refuse=None: HttpToolsProtocol; "
    "from sluicegate.cli import main; sys.exit(main(sys.argv[1:]))"
)
# sluicegate served by Granian (bench/granian-install.sh) instead of uvicorn, with
# every stream written by its own task: a frame sink drives only a send it can
# step by hand (uvicorn's), so compare it with sluicegate-task. Not a server to
# deploy either: no connection limits, no draining shutdown.
_GRANIAN = (
    "import asyncio, sys; import sluicegate.server.app.options as o; "
    "from sluicegate.server.streaming.sse_response import EventStreamResponse; "
    "EventStreamResponse.eager = False\n"
    "def run(app, args):\n"
    "    from granian.constants import HTTPModes, Interfaces\n"
    "    from granian.server.embed import Server\n"
    "    server = Server(app, address=args.host, port=args.port,"
    " interface=Interfaces.ASGI, http=HTTPModes.http1, log_enabled=False)\n"
    "    asyncio.run(server.serve())\n"
    "    return 0\n"
    "o.run_server = run\n"
    "from sluicegate.cli import main; sys.exit(main(sys.argv[1:]))"
)
# sluicegate with other thresholds for the collector (``sluicegate-gc=A,B,C``).
_GC = (
    "import os, sys; import sluicegate.cli as c; "
    "c._GC_THRESHOLDS = tuple(int(x) for x in os.environ['BENCH_GC'].split(',')); "
    "sys.exit(c.main(sys.argv[1:]))"
)

_RESUMABLE = ("sluicegate-resumable", "sluicegate-redis")
_WORKERS = "sluicegate-w2"
"""sluicegate with ``--workers 2`` (so ``--redis``), to compare with one process."""
_SLUICEGATES = (
    "sluicegate",
    "sluicegate-task",
    "sluicegate-plain",
    _WORKERS,
    "sluicegate-before",
    "sluicegate-plain-before",
    "sluicegate-httptools",
    "sluicegate-granian",
    *_RESUMABLE,
)
_redis_url = [""]
"""The Redis of ``sluicegate-redis`` (``main`` starts one when it is asked for)."""
_before_src = [""]
"""The ``src`` folder the ``-before`` servers run (``--before-src``)."""


def _server_env(kind: str) -> dict[str, str]:
    """The environment a server of ``kind`` adds to this one's."""
    if kind.endswith("-before"):
        return {"PYTHONPATH": _before_src[0]}
    if kind.startswith("sluicegate-gc="):
        return {"BENCH_GC": kind.partition("=")[2]}
    if kind == "sluicegate-granian":
        path = [str(ROOT / "bench" / ".granian"), os.environ.get("PYTHONPATH", "")]
        return {"PYTHONPATH": os.pathsep.join(path)}
    return {}


def _server_command(kind: str, port: int, rate: float, text: Path) -> list[str]:
    if kind in _SLUICEGATES or kind.startswith("sluicegate-gc="):
        start = ["-m", "sluicegate"]
        if kind == "sluicegate-task":
            start = ["-c", _TASK_WRITER]
        elif kind == "sluicegate-httptools":
            start = ["-c", _HTTPTOOLS]
        elif kind == "sluicegate-granian":
            start = ["-c", _GRANIAN]
        elif kind.startswith("sluicegate-gc="):
            start = ["-c", _GC]
        extra = ["--resumable"] if kind in _RESUMABLE else []
        if kind in ("sluicegate-redis", _WORKERS):
            extra.append(f"--redis={_redis_url[0]}")
        if kind == _WORKERS:
            extra.append("--workers=2")
        if kind.startswith("sluicegate-plain"):
            extra.append("--no-obfuscation")
        return [
            PYTHON,
            *start,
            "serve",
            "--engine=scripted",
            f"--port={port}",
            f"--scripted-rate={rate}",
            f"--scripted-text={text}",
            "--scripted-max-running=100000",
            "--scripted-max-queued=100000",
            "--no-ledger",
            "--log-level=warning",
            *extra,
        ]
    if kind == "raw":
        return [
            PYTHON,
            str(ROOT / "bench" / "raw_server.py"),
            f"--port={port}",
            f"--rate={rate}",
        ]
    return [
        PYTHON,
        str(ROOT / "bench" / "baseline_server.py"),
        f"--port={port}",
        f"--rate={rate}",
        f"--text={text}",
        "--max-running=100000",
    ]


@contextlib.contextmanager
def _server(kind: str, rate: float, text: Path, cpu: str) -> Iterator[tuple[int, int]]:
    """A server pinned to ``cpu``; yields (pid, port) once ``/health`` answers."""
    port = free_port()
    command = ["taskset", "-c", cpu, *_server_command(kind, port, rate, text)]
    server = ServerProcess(command, port, name=kind, cwd=ROOT, env=_server_env(kind))
    try:
        server.wait_ready("/health", timeout_s=30, interval_s=0.1)
        yield server.pid, port
    finally:
        server.stop(signal.SIGINT)


def _cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and of its running children (``--workers``)."""
    ticks = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(entry.name) == pid or int(fields[1]) == pid:
                ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class _RssSampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak_mib = _rss_mib(pid)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.2):
            with contextlib.suppress(OSError):
                self.peak_mib = max(self.peak_mib, _rss_mib(self.pid))


def _measure(
    kind: str,
    pid: int,
    port: int,
    n: int,
    args: argparse.Namespace,
    profile: Path | None,
) -> dict[str, Any]:
    command = [
        "taskset",
        "-c",
        args.load_cpu,
        PYTHON,
        __file__,
        "--load",
        f"--port={port}",
        f"--streams={n}",
        f"--rate={args.rate}",
        f"--duration-s={args.duration_s}",
        f"--ramp-s={args.ramp_s}",
    ]
    sampler = _RssSampler(pid)
    sampler.start()
    spy = None
    if profile is not None:
        spy = subprocess.Popen(
            [
                os.environ.get("PY_SPY") or str(Path(PYTHON).parent / "py-spy"),
                "record",
                "--pid",
                str(pid),
                "--duration",
                str(max(int(args.duration_s - args.ramp_s), 1)),
                "--rate",
                "250",
                "--format",
                "raw",
                "-o",
                str(profile),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    loadavg = os.getloadavg()[0]
    cpu0, wall0 = _cpu_s(pid), time.perf_counter()
    load = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT)
    cpu_s, wall_s = _cpu_s(pid) - cpu0, time.perf_counter() - wall0
    sampler.stop.set()
    sampler.join()
    if spy is not None:
        spy.wait()
    result: dict[str, Any] = json.loads(load.stdout)
    tokens = max(result["events"], 1)
    return {
        "server": kind,
        "n": n,
        **result,
        "server_cpu_share": cpu_s / wall_s,
        "server_cpu_us_per_token": cpu_s / tokens * 1e6,
        "server_rss_mib": sampler.peak_mib,
        "loadavg_1m": loadavg,
        "measured_at_s": [wall0, wall0 + wall_s],  # the bench's perf_counter
    }


def _measure_together(
    servers: list[tuple[str, tuple[int, int]]], n: int, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """``_measure`` of every server at once, each under its own load process."""
    with ThreadPoolExecutor(len(servers)) as pool:
        futures = [
            pool.submit(_measure, kind, pid, port, n, args, None)
            for kind, (pid, port) in servers
        ]
        rows = [future.result() for future in futures]
    share = sum(row["server_cpu_share"] for row in rows)
    if share > 0.9:
        print(
            f"N={n}: the paired servers used {share:.0%} of their core together:"
            " they waited for it (lower --rate or N)",
            file=sys.stderr,
        )
    return [{**row, "paired_cpu_share": share} for row in rows]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _print(rows: list[dict[str, Any]], ratios: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="streams: one server core, scripted engine")
    for column in (
        "server",
        "N",
        "tok/s",
        "ITL+ p50",
        "ITL+ p99",
        "lag p99",
        "TTFT p50",
        "TTFT p99",
        "TTFB p99",
        "CPU",
        "us/tok",
        "B/tok",
        "RSS MiB",
        "fin",
        "trunc",
        "timeout",
        "load CPU",
        "loadavg",
    ):
        table.add_column(column, justify="left" if column == "server" else "right")
    for row in rows:
        table.add_row(
            row["server"],
            str(row["n"]),
            f"{row['tokens_per_s']:.0f}",
            _ms(row["itl_added_ms"]["p50"]),
            _ms(row["itl_added_ms"]["p99"]),
            _ms(row["schedule_lag_ms"]["p99"]),
            _ms(row["ttft_ms"]["p50"]),
            _ms(row["ttft_ms"]["p99"]),
            _ms(row.get("ttfb_ms", {}).get("p99")),
            f"{row['server_cpu_share']:.0%}",
            f"{row['server_cpu_us_per_token']:.0f}",
            f"{row.get('bytes_per_token', 0):.0f}",
            f"{row['server_rss_mib']:.0f}",
            str(row["finished"]),
            str(row["truncated"] + row["errored"] + row["rejected"]),
            str(row["timed_out"]),
            f"{row['load_cpu_share']:.0%}",
            f"{row.get('loadavg_1m', 0):.1f}",
        )
    console = Console(width=200)
    console.print(table)
    for r in ratios:
        over_raw = r["cpu_us_per_token_over_raw"]
        console.print(
            f"N={r['n']}: sluicegate/baseline tokens/s x{r['tokens_per_s']:.2f}, "
            f"baseline/sluicegate ITL+ p99 x{r['itl_added_p99']:.2f}, "
            f"baseline/sluicegate CPU us/token x{r['cpu_us_per_token']:.2f}"
            + ("" if over_raw is None else f", sluicegate/raw CPU x{over_raw:.2f}")
        )


def _ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by = {(r["server"], r["n"]): r for r in rows}  # the last round's
    out = []
    for (kind, n), ours in by.items():
        base = by.get(("baseline", n))
        if kind != "sluicegate" or base is None:
            continue
        raw = by.get(("raw", n))
        p99_ours = ours["itl_added_ms"]["p99"] or 0.0
        p99_base = base["itl_added_ms"]["p99"] or 0.0
        out.append(
            {
                "n": n,
                "tokens_per_s": ours["tokens_per_s"] / max(base["tokens_per_s"], 1e-9),
                "itl_added_p99": p99_base / max(p99_ours, 1e-3),
                "cpu_us_per_token": base["server_cpu_us_per_token"]
                / max(ours["server_cpu_us_per_token"], 1e-9),
                "cpu_us_per_token_over_raw": None
                if raw is None
                else ours["server_cpu_us_per_token"]
                / max(raw["server_cpu_us_per_token"], 1e-9),
            }
        )
    return out


def _resumable_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Resumable streams (memory store or Redis) against the same load with them
    off, in the same round."""
    by = {(r["server"], r["n"], r["round"]): r for r in rows}
    out = []
    for (kind, n, round_), on in by.items():
        off = by.get(("sluicegate", n, round_))
        if kind not in _RESUMABLE or off is None:
            continue
        out.append(
            {
                "store": "redis" if kind == "sluicegate-redis" else "memory",
                "n": n,
                "round": round_,
                "cpu_us_per_token_on_over_off": on["server_cpu_us_per_token"]
                / max(off["server_cpu_us_per_token"], 1e-9),
                "itl_added_p99_ms_on": on["itl_added_ms"]["p99"],
                "itl_added_p99_ms_off": off["itl_added_ms"]["p99"],
            }
        )
    return out


def _medians(ratios: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per store and N: the median on/off CPU-per-token ratio over the rounds,
    with the lowest and highest."""
    by: dict[tuple[str, int], list[float]] = {}
    for row in ratios:
        key = (row["store"], row["n"])
        by.setdefault(key, []).append(row["cpu_us_per_token_on_over_off"])
    return [
        {
            "store": store,
            "n": n,
            "rounds": len(values),
            "cpu_us_per_token_on_over_off": statistics.median(values),
            "min": min(values),
            "max": max(values),
        }
        for (store, n), values in by.items()
    ]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add(
        "--n", type=int, nargs="+", default=[100, 500, 1000, 1500, 2000], help="streams"
    )
    add("--rate", type=float, default=20.0, help="engine tokens/s per stream")
    add("--duration-s", type=float, default=10.0, help="length of each stream")
    add("--ramp-s", type=float, default=2.0, help="stream starts spread over this")
    add(
        "--servers",
        nargs="+",
        default=["sluicegate", "sluicegate-plain", "baseline", "raw"],
        choices=[
            "sluicegate",
            "sluicegate-task",
            "sluicegate-plain",
            "sluicegate-resumable",
            "sluicegate-redis",
            _WORKERS,
            "sluicegate-before",
            "sluicegate-plain-before",
            "sluicegate-httptools",
            "sluicegate-granian",
            "baseline",
            "raw",
        ],
        help="sluicegate-task: sluicegate with the task writer instead of eager"
        " writes; sluicegate-plain: sluicegate with --no-obfuscation;"
        " sluicegate-resumable: every stream resumable (memory store);"
        " sluicegate-w2: --workers 2 (give it two --server-cpu);"
        " sluicegate-before, sluicegate-plain-before: the same servers on"
        " --before-src; sluicegate-httptools: sluicegate on uvicorn's httptools"
        " protocol, without the connection limits; sluicegate-granian: served by"
        " Granian (bench/granian-install.sh), streams written by tasks (compare"
        " with sluicegate-task)",
    )
    add(
        "--before-src",
        type=Path,
        help="the src folder of another checkout (a worktree of an older"
        " commit), which the -before servers run",
    )
    add(
        "--gc",
        nargs="+",
        default=[],
        metavar="A,B,C",
        help="also measure sluicegate with these collector thresholds"
        " (gc.set_threshold), one server each",
    )
    add(
        "--resumable",
        action="store_true",
        help="measure sluicegate with resumable streams on (memory store) next to"
        " sluicegate with them off",
    )
    add(
        "--store",
        choices=["memory", "redis"],
        default="memory",
        help="the store of --resumable (redis: sluicegate-redis, a redis-server"
        " started here on the load CPU)",
    )
    add(
        "--repeat",
        type=int,
        default=1,
        help="rounds: every server measured this many times at each N, in"
        " alternating order (with --resumable, the median on/off ratio too)",
    )
    add(
        "--paired",
        action="store_true",
        help="measure the servers of each round at the same time, on the same"
        " core (the core must have room for all: e.g. --rate 10 at 1,000"
        " streams)",
    )
    add("--server-cpu", default="0", help="taskset CPU list of the servers")
    add("--load-cpu", default="1", help="taskset CPU list of the load process")
    add("--quick", action="store_true", help="tiny N and duration (CI smoke)")
    add("--json", type=Path, default=RESULTS, help="where to write the results")
    add("--profile", type=Path, help="py-spy raw profile of one server, largest N")
    add("--profile-server", default="sluicegate", help="the server --profile records")
    add("--load", action="store_true", help=argparse.SUPPRESS)
    add("--port", type=int, help=argparse.SUPPRESS)
    add("--streams", type=int, help=argparse.SUPPRESS)
    add("--header", action="append", default=[], help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark (or, with ``--load``, one load process)."""
    args = _parser().parse_args(argv)
    if args.load:
        return _run_load(args)
    if args.repeat < 1:
        raise SystemExit(f"expected --repeat >= 1, got {args.repeat}")
    if args.quick:
        args.n, args.duration_s, args.ramp_s = [4, 16], 0.8, 0.1
    if args.resumable:
        args.servers = list(dict.fromkeys(["sluicegate", *args.servers]))
        store = "sluicegate-redis" if args.store == "redis" else "sluicegate-resumable"
        args.servers.append(store)
    if any(kind.endswith("-before") for kind in args.servers):
        if args.before_src is None:
            raise SystemExit("the -before servers need --before-src")
        _before_src[0] = str(args.before_src.resolve())
    args.servers += [f"sluicegate-gc={thresholds}" for thresholds in args.gc]
    cpus = os.cpu_count() or 1
    if cpus < 2:
        args.server_cpu = args.load_cpu = "0"
    load_before = os.getloadavg()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "script.txt"
        # Each sentence is more than 10 tokens: enough sentences for every token.
        repeats = int(args.rate * args.duration_s) // 10 + 1
        text.write_text(SENTENCE * repeats, encoding="utf-8")
        with contextlib.ExitStack() as stack:
            if {"sluicegate-redis", _WORKERS} & set(args.servers):
                sys.path.insert(0, str(Path(__file__).parent))  # bench/ is scripts
                import resume_store

                _redis_url[0], _ = stack.enter_context(
                    resume_store.redis_server(int(args.load_cpu.split(",")[0]))
                )
            servers = {
                kind: stack.enter_context(
                    _server(kind, args.rate, text, args.server_cpu)
                )
                for kind in args.servers
            }
            for round_ in range(args.repeat):
                for n in args.n:
                    # Each round in the other order: a machine that gets noisier
                    # (or quieter) during a run favours neither side.
                    order = list(servers.items())
                    if round_ % 2:
                        order.reverse()
                    if args.paired:
                        together = _measure_together(order, n, args)
                        rows += [{**row, "round": round_} for row in together]
                        continue
                    for kind, (pid, port) in order:
                        profile = None
                        if (
                            args.profile
                            and round_ == 0
                            and kind == args.profile_server
                            and n == max(args.n)
                        ):
                            profile = args.profile
                        row = _measure(kind, pid, port, n, args, profile)
                        rows.append({**row, "round": round_})
    ratios = _ratios(rows)
    report = {
        "benchmark": "streams",
        "rate_tokens_per_s": args.rate,
        "duration_s": args.duration_s,
        "ramp_s": args.ramp_s,
        "server_cpu": args.server_cpu,
        "load_cpu": args.load_cpu,
        "paired": args.paired,
        "cpus": cpus,
        "loadavg_before": load_before,
        "before_src": _before_src[0] or None,
        "loadavg_after": os.getloadavg(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "rows": rows,
        "ratios": ratios,
        "resumable": _resumable_ratios(rows),
    }
    report["resumable_median"] = _medians(report["resumable"])
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    _print(rows, ratios)
    for row in report["resumable"]:
        print(
            f"resumable on/off at N={row['n']} (round {row['round']}): CPU per token"
            f" x{row['cpu_us_per_token_on_over_off']:.2f}, p99 added ITL "
            f"{_ms(row['itl_added_p99_ms_on'])} ms (off: "
            f"{_ms(row['itl_added_p99_ms_off'])} ms)"
        )
    if args.repeat > 1:
        for row in report["resumable_median"]:
            print(
                f"resumable on/off at N={row['n']}, median of {row['rounds']} rounds:"
                f" CPU per token x{row['cpu_us_per_token_on_over_off']:.2f}"
                f" (from x{row['min']:.2f} to x{row['max']:.2f})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
