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
phase), each asking for ``rate x duration`` tokens (``bench/stream_load.py``).
The client parses nothing while the streams run: by default (``--load-client``)
it is ``bench/stream_client.c``, which keeps each read and its time in a log that
``bench/stream_native.py`` parses once the streams are over, and takes the reads
of ``--load-quantum-ms`` in one wake (the Python client
instead counts a read's content events as it comes), so that it takes as little
as it can of the machine it shares with the server (``load_cpu_share``, and
``load_cpu_us_per_token`` over the streams' time; ``load_client`` says which).

``sluicegate-w1`` and ``sluicegate-w2`` are ``serve --workers 1`` and ``--workers
2``, both with ``--redis`` (a Redis started here on the load CPU): the same server
but for the count. Their rows list each process (``processes``: the parent, each
worker, the Redis; its CPU share over the window of the delivered tokens/s and the
streams it held; ``machine_cores``: the whole machine's busy and stolen CPU over
that window) and ``workers`` their ratio per round, at each N and at
saturation: a server's most tokens/s among the N at which its p99 added ITL stayed
at or under ``--p99-ms`` with no stream timed out (``bench/stream_procs.py``).

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
- where a new stream waited, from the server's side: ``listen_queue`` (the
  connections waiting to be accepted, sampled every 0.25 s with ``ss``: the
  deepest sample and when the queue was last seen non-empty, seconds after the
  load started), ``answered_s`` (when the streams' first bytes came, seconds
  after the load started, against the ``--ramp-s`` over which they were sent)
  and, for sluicegate, ``server_side``: the server's own histograms over the
  load (``/metrics``, read before and after it), ``ttft_s`` from a request's
  receipt in its route to its first token and ``loop_lag_s``, each as the
  bucket bounds that hold its p50 and p99: the client's TTFT less the
  server's is the time before the route (the listen queue, the read);
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
Each server first serves ``WARM_UP_STREAMS`` streams for a second, not
recorded (not with ``--quick``), so that its first row is not its first requests.
Prints a table and writes ``bench/results/streams.json``, with the load average.
Not a test: nothing here asserts a timing.

Run: ``.venv/bin/python bench/streams.py [--n 100 500 1000 1500 2000] [--duration-s 10]
[--quick] [--repeat R] [--paired] [--profile FILE]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from sluicegate.testing import ServerProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "streams.json"
PYTHON = sys.executable

# ASCII only, so every token is one content event (no UTF-8 held back).
SENTENCE = " The quick brown fox streams tokens correctly, once upon a time."

sys.path.insert(0, str(ROOT / "bench"))  # bench/ is scripts, not a package
import stream_load  # noqa: E402  (bench/stream_load.py: the load process)
import stream_native  # noqa: E402  (bench/stream_native.py: the native client)
import stream_procs  # noqa: E402  (bench/stream_procs.py: a server's processes)

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
_WORKERS = ("sluicegate-w1", "sluicegate-w2")
"""sluicegate with ``--workers 1`` and ``--workers 2``, both with ``--redis`` (two
workers need it): the same server but for the count of workers."""
_SLUICEGATES = (
    "sluicegate",
    "sluicegate-task",
    "sluicegate-plain",
    *_WORKERS,
    "sluicegate-before",
    "sluicegate-plain-before",
    "sluicegate-httptools",
    "sluicegate-granian",
    *_RESUMABLE,
)
_redis_url = [""]
"""The Redis of ``sluicegate-redis`` (``main`` starts one when it is asked for)."""
_redis_pid = [0]
"""Its pid (0: none), whose CPU the rows of the servers that use it report."""
_groups: dict[int, Path] = {}
"""The cgroup of each server held to a budget (``--cpu-budget``), by pid."""
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
    sockets = kind.startswith("sluicegate-sockets=")
    if kind in _SLUICEGATES or kind.startswith("sluicegate-gc=") or sockets:
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
        if kind in ("sluicegate-redis", *_WORKERS):
            extra.append(f"--redis={_redis_url[0]}")
        if kind in _WORKERS:
            extra.append(f"--workers={kind[-1]}")
        if kind.startswith("sluicegate-plain"):
            extra.append("--no-obfuscation")
        if sockets:
            extra.append(f"--accept-sockets={kind.partition('=')[2]}")
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
def _server(
    kind: str, rate: float, text: Path, cpu: str, budget: float | None
) -> Iterator[tuple[int, int]]:
    """A server pinned to ``cpu``, each of its workers held to ``budget`` CPUs
    (``None``: no budget); yields (pid, port) once ``/health`` answers."""
    port = free_port()
    command = ["taskset", "-c", cpu, *_server_command(kind, port, rate, text)]
    server = ServerProcess(command, port, name=kind, cwd=ROOT, env=_server_env(kind))
    try:
        server.wait_ready("/health", timeout_s=30, interval_s=0.1)
        with contextlib.ExitStack() as stack:
            if budget is not None:
                _groups[server.pid] = stack.enter_context(
                    stream_procs.cpu_budget(
                        stream_procs.tree(server.pid), _workers(kind) * budget, kind
                    )
                )
            yield server.pid, port
    finally:
        _groups.pop(server.pid, None)
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


def _load_command(
    port: int, n: int, args: argparse.Namespace, duration_s: float, ramp_s: float
) -> list[str]:
    """The load process's command: ``n`` streams of ``duration_s`` started over
    ``ramp_s``."""
    return [
        # The load's stamps must not wait behind a server process that shares
        # its CPU (two workers on two CPUs do): a real-time priority lets it
        # take each read as it comes.
        *(["chrt", "--fifo", "10"] if args.load_rt else []),
        "taskset",
        "-c",
        args.load_cpu,
        PYTHON,
        __file__,
        "--load",
        f"--port={port}",
        f"--streams={n}",
        f"--rate={args.rate}",
        f"--duration-s={duration_s}",
        f"--ramp-s={ramp_s}",
        f"--client={args.load_client}",
        f"--quantum-ms={args.load_quantum_ms}",
        "--load-detail",
    ]


WARM_UP_STREAMS = 200
"""Streams of the load each server gets once before its first row (1 s long,
started over 0.5 s; not recorded): a new process's first requests pay for what
it loads and builds on first use, which its first row would otherwise carry."""


def _warm_up(port: int, args: argparse.Namespace) -> None:
    command = _load_command(port, WARM_UP_STREAMS, args, 1.0, 0.5)
    subprocess.run(command, capture_output=True, check=True, cwd=ROOT)


def _measure(
    kind: str,
    pid: int,
    port: int,
    n: int,
    args: argparse.Namespace,
    profile: Path | None,
) -> dict[str, Any]:
    command = _load_command(port, n, args, args.duration_s, args.ramp_s)
    pids = stream_procs.tree(pid)
    if _redis_pid[0] and kind in ("sluicegate-redis", *_WORKERS):
        pids.append(_redis_pid[0])
    watch = stream_procs.ProcessWatch(pid, pids, port)
    scraped = kind in _SLUICEGATES
    histograms0 = _histograms(port) if scraped else {}
    watch.start()
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
                *(["--subprocesses"] if len(pids) > 1 else []),
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
    throttled0 = stream_procs.throttled_s(_groups.get(pid))
    cpu0, wall0 = _cpu_s(pid), time.perf_counter()
    load = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT)
    cpu_s, wall_s = _cpu_s(pid) - cpu0, time.perf_counter() - wall0
    sampler.stop.set()
    sampler.join()
    watch.stop.set()
    watch.join()
    if spy is not None:
        spy.wait()
    result: dict[str, Any] = json.loads(load.stdout)
    if scraped:
        result["server_side"] = _server_side(histograms0, _histograms(port))
    tokens = max(result["events"], 1)
    return {
        "server": kind,
        "n": n,
        **result,
        "server_cpu_share": cpu_s / wall_s,
        "server_cpu_us_per_token": cpu_s / tokens * 1e6,
        "server_rss_mib": sampler.peak_mib,
        "loadavg_1m": loadavg,
        "cpu_budget": args.cpu_budget,
        "throttled_s": stream_procs.throttled_s(_groups.get(pid)) - throttled0,
        "measured_at_s": [wall0, wall0 + wall_s],  # the bench's perf_counter
        # Each process over the window of the delivered tokens/s (the load
        # process starts its clock a few tenths of a second after wall0).
        "processes": watch.report((wall0 + args.ramp_s + 0.5, wall0 + args.duration_s)),
        "machine_cores": watch.report_machine(
            (wall0 + args.ramp_s + 0.5, wall0 + args.duration_s)
        ),
        "listen_queue": watch.report_queue(wall0),
    }


_SERVER_SIDE = {
    "ttft_s": "sluicegate_time_to_first_token_seconds",
    "loop_lag_s": "sluicegate_event_loop_lag_seconds",
}
"""The server's own histograms a row reports (``server_side``): the time from
a request's receipt (its route, once the head and body are read) to its first
token, and how late the event loop ran its timer."""


def _histograms(port: int) -> dict[str, dict[float, float]]:
    """The cumulative buckets of ``_SERVER_SIDE``'s histograms as ``/metrics``
    says now (every worker's, summed by the server): name -> {le: count}."""
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    except httpx.HTTPError:
        return {}
    found: dict[str, dict[float, float]] = {}
    for line in text.splitlines():
        for name, metric in _SERVER_SIDE.items():
            if line.startswith(metric + "_bucket{"):
                le = line.split('le="', 1)[1].split('"', 1)[0]
                found.setdefault(name, {})[float(le)] = float(line.rsplit(" ", 1)[1])
    return found


def _server_side(
    before: dict[str, dict[float, float]], after: dict[str, dict[float, float]]
) -> dict[str, dict[str, float | None]]:
    """Per histogram, over one load (``after`` less ``before``): the count and
    the bucket bounds (seconds) that hold its p50 and p99 (``None``: past the
    last bound)."""
    out: dict[str, dict[str, float | None]] = {}
    for name, buckets in after.items():
        counts = {
            le: n - before.get(name, {}).get(le, 0.0) for le, n in buckets.items()
        }
        total = counts.get(float("inf"), 0.0)
        cut: dict[str, float | None] = {"count": total}
        for q, key in ((0.5, "p50_le"), (0.99, "p99_le")):
            le = min((le for le, n in counts.items() if n >= q * total), default=None)
            cut[key] = None if le is None or le == float("inf") or not total else le
        out[name] = cut
    return out


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


def _workers(kind: str) -> int:
    return int(kind[-1]) if kind in _WORKERS else 1


def _print_workers(report: dict[str, Any]) -> None:
    """Each process of the workers' rows, and their ratios."""
    for row in report["rows"]:
        if row["server"] in _WORKERS:
            print(
                f"{row['server']} N={row['n']} round {row['round']}: "
                + ", ".join(
                    f"{p['role']} {p['cpu_share']:.0%} CPU {p['streams']} streams"
                    for p in row["processes"]
                )
                + f"; load {row['load_cpu_us_per_token']:.1f} us/token"
            )
    for r in report["workers"]:
        where = f"N={r['n']}" if r["n"] != "saturation" else f"saturation {r['at_n']}"
        ratio = "-" if r["ratio"] is None else f"x{r['ratio']:.2f}"
        print(f"w2/w1 round {r['round']} {where}: {ratio}")


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
        "--n",
        type=int,
        nargs="+",
        help="streams (default 100 500 1000 1500 2000; 4 16 with --quick)",
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
            *_WORKERS,
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
        "--accept-sockets",
        nargs="+",
        type=int,
        default=[],
        metavar="N",
        help="also measure sluicegate listening on N sockets (serve's"
        " --accept-sockets), one server each (sluicegate-sockets=N)",
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
    add(
        "--p99-ms",
        type=float,
        default=25.0,
        help="the saturation rule: a server's tokens/s at saturation are its most"
        " among the N at which its p99 added ITL stayed at or under this (and"
        " its TTFT p99 under --ttft-p99-ms), with no stream timed out",
    )
    add(
        "--ttft-p99-ms",
        type=float,
        default=1000.0,
        help="the saturation rule's bound on the p99 time to first token",
    )
    add(
        "--n-per-worker",
        action="store_true",
        help="--n counts streams per worker: sluicegate-w2 gets twice as many"
        " (the ratios pair the rows of one --n value)",
    )
    add("--server-cpu", default="0", help="taskset CPU list of the servers")
    add(
        "--cpu-budget",
        type=float,
        metavar="C",
        help="hold each server to C CPUs' worth of time per worker (a cgroup;"
        " root and cgroup v1's cpu controller): the load's CPU stays outside"
        " every server's budget",
    )
    add("--load-cpu", default="1", help="taskset CPU list of the load process")
    add(
        "--load-rt",
        action="store_true",
        help="run the load process at a real-time priority (chrt --fifo 10), so"
        " that a server sharing its CPU does not delay its stamps",
    )
    add("--quick", action="store_true", help="tiny N and duration (CI smoke)")
    add("--json", type=Path, default=RESULTS, help="where to write the results")
    add("--profile", type=Path, help="py-spy raw profile of one server, largest N")
    add("--profile-server", default="sluicegate", help="the server --profile records")
    add(
        "--load-client",
        choices=["auto", "native", "python"],
        default="auto",
        help="the load's client: native (bench/stream_client.c, built with cc:"
        " a read costs the kernel's recv and little else), python (uvloop), or"
        " auto: native if there is a C compiler (each row's load_client says)",
    )
    add("--load", action="store_true", help=argparse.SUPPRESS)
    add(
        "--load-quantum-ms",
        type=float,
        default=0.5,
        help="the native client's quantum: after a wake that found reads it"
        " sleeps until this has passed, so that a wake takes many reads (a read"
        " is stamped up to this late; 0: each as it comes)",
    )
    add("--client", default="python", help=argparse.SUPPRESS)
    add("--quantum-ms", type=float, default=0.5, help=argparse.SUPPRESS)
    add("--load-detail", action="store_true", help=argparse.SUPPRESS)
    add("--port", type=int, help=argparse.SUPPRESS)
    add("--streams", type=int, help=argparse.SUPPRESS)
    add("--header", action="append", default=[], help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark (or, with ``--load``, one load process)."""
    args = _parser().parse_args(argv)
    if args.load:
        return stream_load.main(args)
    if args.repeat < 1:
        raise SystemExit(f"expected --repeat >= 1, got {args.repeat}")
    if args.load_client == "auto":
        args.load_client = "native" if stream_native.compiler() else "python"
    if args.load_client == "native":
        stream_native.build()  # once, before any load runs
    if args.quick:
        args.duration_s, args.ramp_s = 0.8, 0.1
    if args.n is None:
        args.n = [4, 16] if args.quick else [100, 500, 1000, 1500, 2000]
    if args.resumable:
        args.servers = list(dict.fromkeys(["sluicegate", *args.servers]))
        store = "sluicegate-redis" if args.store == "redis" else "sluicegate-resumable"
        args.servers.append(store)
    if any(kind.endswith("-before") for kind in args.servers):
        if args.before_src is None:
            raise SystemExit("the -before servers need --before-src")
        _before_src[0] = str(args.before_src.resolve())
    args.servers += [f"sluicegate-gc={thresholds}" for thresholds in args.gc]
    args.servers += [f"sluicegate-sockets={n}" for n in args.accept_sockets]
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
            if {"sluicegate-redis", *_WORKERS} & set(args.servers):
                sys.path.insert(0, str(Path(__file__).parent))  # bench/ is scripts
                import resume_store

                _redis_url[0], redis = stack.enter_context(
                    resume_store.redis_server(int(args.load_cpu.split(",")[0]))
                )
                _redis_pid[0] = redis.pid
            servers = {
                kind: stack.enter_context(
                    _server(kind, args.rate, text, args.server_cpu, args.cpu_budget)
                )
                for kind in args.servers
            }
            if not args.quick:
                for _pid, port in servers.values():
                    _warm_up(port, args)
            for round_ in range(args.repeat):
                for n in args.n:
                    # Each round in the other order: a machine that gets noisier
                    # (or quieter) during a run favours neither side.
                    order = list(servers.items())
                    if round_ % 2:
                        order.reverse()
                    if args.paired:
                        together = _measure_together(order, n, args)
                        rows += [
                            {**row, "round": round_, "step_n": n} for row in together
                        ]
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
                        streams = n * _workers(kind) if args.n_per_worker else n
                        row = _measure(kind, pid, port, streams, args, profile)
                        rows.append({**row, "round": round_, "step_n": n})
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
        "saturation": stream_procs.saturation(rows, args.p99_ms, args.ttft_p99_ms),
        "workers": stream_procs.worker_ratios(
            rows, args.p99_ms, args.ttft_p99_ms, *_WORKERS
        ),
    }
    report["resumable_median"] = _medians(report["resumable"])
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    _print(rows, ratios)
    _print_workers(report)
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
