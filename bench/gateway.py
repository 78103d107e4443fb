"""Many streams through one gateway core over a scripted upstream, against direct.

Each column gets a fresh upstream, ``sluicegate serve --engine scripted`` at
``--rate`` tokens/s per stream on an ASCII script, and one way in:

- ``direct``: the load talks to the upstream itself (the baseline: the direct
  server's own cost);
- ``sluicegate``: ``sluicegate serve`` in front of it, with a config file
  written here (``--upstreams``): the same as ``--upstream
  http://127.0.0.1:PORT/v1`` but without the default per-upstream stream cap,
  which would queue the load (skipped, with a note, while ``sluicegate serve``
  has no ``--upstream``);
- ``sluicegate-before``: the same gateway run from ``--before-src``, the
  ``src`` folder of another checkout (a worktree of an older commit): the
  before/after of a change, in one run;
- ``litellm``: LiteLLM's proxy from ``bench/.litellm-venv`` (made by
  ``bench/litellm-venv.sh``; skipped, with a note, when that is missing), with a
  config file written here: one model, ``openai/scripted`` at the upstream's
  ``/v1``;
- ``portkey``: Portkey's AI gateway (the npm package ``@portkey-ai/gateway``,
  installed in ``bench/.portkey`` by ``bench/portkey-install.sh``, run by the
  node from Debian; skipped, with a note, when missing), told per request to
  use the ``openai`` provider at the upstream's ``/v1`` (its
  ``x-portkey-provider`` and ``x-portkey-custom-host`` headers, sent by the
  load too), with ``bench/portkey-shim.mjs`` loaded first: under node 20 its
  streams failed without it (see that file).

The upstream runs on ``--upstream-cpu``, a gateway on ``--gateway-cpu`` and the
load process on ``--load-cpu`` (``taskset``). The load is ``bench/streams.py
--load``: N streaming chat requests over raw sockets, starts spread over
``--ramp-s``, each asking for ``rate x duration`` tokens, content events counted
in whole HTTP chunks. A gateway must list ``scripted`` at ``/v1/models`` (or its
column is skipped, with a note) and serves four short streams, unmeasured,
before the load: a proxy's first requests pay for set-up no later one does.

Reported per column and N:

- delivered tokens/s in the window where every stream runs;
- added inter-token latency p50/p99 (ms): each gap between two content events
  minus the engine's step ``1/rate``; the hop's own share is the column's p99
  minus the direct column's at the same N;
- time to first token p50/p99 (ms), from sending the request;
- CPU us per token of the hop: the gateway's process CPU time (with its child
  processes) over the content events delivered; for ``direct``, the upstream's;
  the upstream's own CPU per token is reported in every column too;
- streams finished and truncated (closed without ``[DONE]``, errored or
  rejected: all counted as truncated) and timed out.

Then two abort probes per column, each ``--abort-streams`` requests that ask for
far more tokens than the probe lasts: ``stream`` ones read ``--abort-after``
content events, then close their sockets; ``json`` ones (``stream: false``) close
theirs ``abort_after / rate + 0.5`` s after sending, with no byte of the answer
yet. The upstream's ``/engine/stats`` says how many it aborted
(``aborted_requests`` since just before the probe) and how many still run, up to
``--abort-wait-s`` seconds after the last close: a client's close reached the
upstream when every probe request is aborted there and none runs.

While it runs, ``/tmp/sluicegate-quiet`` exists (it waits, up to ten minutes,
for one that another benchmark holds; ``--no-quiet``: neither). Prints a table
and writes ``bench/results/gateway.json``, each row with the 1-minute load
average when it started. With ``--profile FILE``, py-spy (``PY_SPY``, else the
venv's) records each gateway at the largest N into ``FILE.KIND.N`` (raw
format). Not a test: nothing here asserts a timing.

Run: ``.venv/bin/python bench/gateway.py [--n 50 200] [--duration-s 10]
[--columns direct sluicegate litellm] [--quick]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from sluicegate.testing import ServerProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "gateway.json"
LOAD = ROOT / "bench" / "streams.py"
LITELLM_VENV = ROOT / "bench" / ".litellm-venv"
PORTKEY = ROOT / "bench" / ".portkey" / "node_modules" / "@portkey-ai" / "gateway"
QUIET = Path("/tmp/sluicegate-quiet")
QUIET_WAIT_S = 600.0
PYTHON = sys.executable
MODEL = "scripted"

# ASCII only, so every token is one content event (no UTF-8 held back).
SENTENCE = " The quick brown fox streams tokens correctly, once upon a time."
CONTENT = b'"content":"'
EMPTY_CONTENT = b'"content":""'


# ---------------------------------------------------------------- processes


@dataclass(frozen=True)
class Column:
    """One way into the upstream: its name, and why it was skipped (or ``""``)."""

    name: str
    skipped: str = ""

    @property
    def kind(self) -> str:
        """``direct``, ``sluicegate``, ``sluicegate-before``, ``litellm`` or
        ``portkey``."""
        return self.name.partition("/")[0]


_headers: list[str] = []
"""Extra request headers of the column being measured (Portkey's routing)."""
_before_src = [""]
"""The ``src`` folder ``sluicegate-before`` runs (``--before-src``)."""


def _gateway_support() -> str:
    """Why the sluicegate gateway column cannot run here, or ``""``."""
    helped = subprocess.run(
        [PYTHON, "-m", "sluicegate", "serve", "--help"],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    if "--upstream" not in helped.stdout:
        return "`sluicegate serve` has no --upstream yet"
    return ""


def _litellm_support() -> str:
    """Why the LiteLLM column cannot run here, or ``""``."""
    if not (LITELLM_VENV / "bin" / "litellm").exists():
        return "no bench/.litellm-venv (run bench/litellm-venv.sh)"
    return ""


def _portkey_support() -> str:
    """Why the Portkey column cannot run here, or ``""``."""
    if not (PORTKEY / "build" / "start-server.js").exists():
        return "no bench/.portkey (run bench/portkey-install.sh)"
    if shutil.which("node") is None:
        return "no node (apt-get install nodejs)"
    return ""


def _before_support() -> str:
    """Why the sluicegate-before column cannot run here, or ``""``."""
    if not _before_src[0]:
        return "no --before-src"
    return ""


def _columns(names: Sequence[str]) -> list[Column]:
    checks = {
        "sluicegate": _gateway_support,
        "sluicegate-before": _before_support,
        "litellm": _litellm_support,
        "portkey": _portkey_support,
    }
    columns = []
    for name in names:
        skipped = checks[name]() if name in checks else ""
        columns.append(Column(name, skipped))
    return columns


def _upstream_command(port: int, rate: float, text: Path) -> list[str]:
    return [
        PYTHON,
        "-m",
        "sluicegate",
        "serve",
        "--engine=scripted",
        f"--port={port}",
        f"--scripted-rate={rate}",
        f"--scripted-text={text}",
        "--scripted-max-running=100000",
        "--scripted-max-queued=100000",
        "--max-connections=100000",
        "--no-ledger",
        "--log-level=warning",
    ]


def _litellm_config(path: Path, upstream_port: int) -> Path:
    # JSON is YAML: no YAML writer needed here.
    config = {
        "model_list": [
            {
                "model_name": MODEL,
                "litellm_params": {
                    "model": f"openai/{MODEL}",
                    "api_base": f"http://127.0.0.1:{upstream_port}/v1",
                    "api_key": "unused",
                },
            }
        ],
        "litellm_settings": {"drop_params": True},
        # No keys on any column (sluicegate's run without them too); this proxy
        # refuses to start keyless unless told that it is a local run.
        "general_settings": {"dangerously_permit_weak_or_unset_master_key": True},
    }
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return path


def _sluicegate_config(path: Path, upstream_port: int) -> Path:
    # The same as --upstream URL, but with no stream cap in the way: the
    # default per-upstream cap (64 streams) would queue the rest of the load,
    # and LiteLLM's column has none.
    path.write_text(
        f'''[[models]]
id = "{MODEL}"
max_queued = 100000

[[models.upstreams]]
url = "http://127.0.0.1:{upstream_port}/v1"
max_streams = 100000
''',
        encoding="utf-8",
    )
    return path


def _gateway_command(
    column: Column, port: int, upstream_port: int, tmp: Path
) -> tuple[list[str], dict[str, str], str]:
    """The gateway's argv, extra environment and readiness path."""
    if column.kind == "portkey":
        shim = ROOT / "bench" / "portkey-shim.mjs"  # see its comment
        command = [
            "node",
            f"--import={shim.as_uri()}",
            str(PORTKEY / "build" / "start-server.js"),
        ]
        return [*command, f"--port={port}", "--headless"], {}, "/"
    if column.kind in ("sluicegate", "sluicegate-before"):
        before = column.kind == "sluicegate-before"
        config = _sluicegate_config(tmp / "upstreams.toml", upstream_port)
        return (
            [
                PYTHON,
                "-m",
                "sluicegate",
                "serve",
                f"--upstreams={config}",
                f"--port={port}",
                "--max-connections=100000",
                "--no-ledger",
                "--log-level=warning",
            ],
            {"PYTHONPATH": _before_src[0]} if before else {},
            "/health",
        )
    config = _litellm_config(tmp / "litellm.yaml", upstream_port)
    return (
        [
            str(LITELLM_VENV / "bin" / "litellm"),
            "--config",
            str(config),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--num_workers",
            "1",
        ],
        # The bundled cost map, not one fetched at start (there is no network).
        {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"},
        "/health/liveliness",
    )


@contextlib.contextmanager
def _process(
    command: list[str],
    port: int,
    name: str,
    cpu: str,
    ready: str,
    log: Path,
    env: dict[str, str] | None = None,
) -> Iterator[int]:
    """A server pinned to ``cpu``; yields its pid once ``ready`` answers 200."""
    server = ServerProcess(
        ["taskset", "-c", cpu, *command],
        port,
        name=name,
        cwd=ROOT,
        log_path=log,
        env=env,
    )
    try:
        server.wait_ready(ready, timeout_s=180, interval_s=0.2)
        yield server.pid
    finally:
        server.stop(signal.SIGINT)


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (a LiteLLM proxy may run workers)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(parents.get(current, ()))
    return out


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its descendants."""
    ticks = 0
    for each in _tree(pid):
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- measurements


def _load(port: int, n: int, args: argparse.Namespace) -> dict[str, Any]:
    command = [
        "taskset",
        "-c",
        args.load_cpu,
        PYTHON,
        str(LOAD),
        "--load",
        f"--port={port}",
        f"--streams={n}",
        f"--rate={args.rate}",
        f"--duration-s={args.duration_s}",
        f"--ramp-s={args.ramp_s}",
        *(f"--header={header}" for header in _headers),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


class ColumnSkipped(Exception):
    """A column's gateway started but cannot serve the load; the message says why."""


def _check_serves(port: int, column: str) -> None:
    """Raise ``ColumnSkipped`` unless the gateway on ``port`` lists ``MODEL``."""
    listed = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10)
    ids = [m.get("id") for m in listed.json().get("data", [])]
    if listed.status_code != 200 or MODEL not in ids:
        raise ColumnSkipped(
            f"{column} answered /v1/models with {listed.status_code}, ids {ids!r}:"
            f" no {MODEL!r} to send the load to"
        )


def _engine_stats(upstream_port: int) -> dict[str, Any]:
    # An upstream still busy with a load's abandoned streams answers late: a
    # minute, then once more, before the run gives up.
    url = f"http://127.0.0.1:{upstream_port}/engine/stats"
    try:
        stats: dict[str, Any] = httpx.get(url, timeout=60).json()
    except httpx.TimeoutException:
        stats = httpx.get(url, timeout=60).json()
    return stats


def _settle(upstream_port: int, timeout_s: float) -> dict[str, Any]:
    """The upstream's stats once nothing runs or queues (or after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = _engine_stats(upstream_port)
        if stats["running"] + stats["queued"] == 0 or time.monotonic() > deadline:
            return stats
        time.sleep(0.2)


def _request(port: int, tokens: int, stream: bool = True) -> bytes:
    fields: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a story."}],
        "stream": stream,
        "max_tokens": tokens,
    }
    if stream:
        fields["stream_options"] = {"include_usage": True}
    body = json.dumps(fields).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        + "".join(f"{header}\r\n" for header in _headers)
        + "Accept: text/event-stream\r\n\r\n"
    )
    return head.encode() + body


async def _close_early(port: int, request: bytes, events: int, wait_s: float) -> bool:
    """Close before the response ends; whether it was still unfinished then.

    A stream is closed after ``events`` content events; a JSON response (``events``
    0) after ``wait_s`` seconds without a byte of it.
    """
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        if events == 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(reader.read(1), wait_s)
                return False
            return True
        seen = 0
        while seen < events:
            data = await reader.read(65536)
            if not data:
                return False
            seen += data.count(CONTENT) - data.count(EMPTY_CONTENT)
        return True
    finally:
        writer.close()


async def _warm_up(port: int, streams: int = 4) -> None:
    request = _request(port, 4)

    async def one() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        data = b""
        while b"[DONE]" not in data:
            more = await reader.read(65536)
            if not more:
                break
            data += more
        writer.close()

    await asyncio.wait_for(asyncio.gather(*(one() for _ in range(streams))), 60.0)


async def _close_all(port: int, stream: bool, args: argparse.Namespace) -> int:
    # Long enough that no probe request can finish by itself before it is closed.
    tokens = int(args.rate * (args.abort_wait_s + 30.0))
    request = _request(port, tokens, stream)
    events = args.abort_after if stream else 0
    wait_s = args.abort_after / args.rate + 0.5
    closes = [
        asyncio.wait_for(_close_early(port, request, events, wait_s), 30.0)
        for _ in range(args.abort_streams)
    ]
    outcomes = await asyncio.gather(*closes, return_exceptions=True)
    return sum(1 for outcome in outcomes if outcome is True)


def _abort_probe(
    port: int, upstream_port: int, stream: bool, args: argparse.Namespace
) -> dict[str, Any]:
    """Close ``--abort-streams`` requests early; what the upstream saw of it."""
    before = _settle(upstream_port, timeout_s=args.duration_s + 10.0)
    closed = asyncio.run(_close_all(port, stream, args))
    closed_at = time.monotonic()
    aborted, reached_s = 0, None
    while True:
        stats = _engine_stats(upstream_port)
        aborted = stats["aborted_requests"] - before["aborted_requests"]
        waited = time.monotonic() - closed_at
        if reached_s is None and aborted >= closed and stats["running"] == 0:
            reached_s = waited
        if reached_s is not None or waited > args.abort_wait_s:
            break
        time.sleep(0.05)
    return {
        "mode": "stream" if stream else "json",
        "streams": args.abort_streams,
        "closed_early": closed,
        "aborted_upstream": aborted,
        "running_after": stats["running"],
        "all_aborted_within_s": reached_s,
        "wait_s": args.abort_wait_s,
    }


def _row(
    column: str,
    n: int,
    load: dict[str, Any],
    cpu_s: dict[str, float],
    wall_s: float,
    loadavg: float,
) -> dict[str, Any]:
    tokens = max(load["events"], 1)
    hop = cpu_s.get("gateway", cpu_s["upstream"])
    return {
        "column": column,
        "n": n,
        **load,
        "hop_cpu_share": hop / wall_s,
        "hop_cpu_us_per_token": hop / tokens * 1e6,
        "upstream_cpu_us_per_token": cpu_s["upstream"] / tokens * 1e6,
        "loadavg_1m": loadavg,
    }


def _spy(pid: int, path: Path, args: argparse.Namespace) -> subprocess.Popen[bytes]:
    """py-spy recording ``pid`` over the window where every stream runs (raw
    format, 250 Hz, into ``path``); ``PY_SPY`` names the binary, else the
    venv's."""
    spy = os.environ.get("PY_SPY") or str(Path(PYTHON).parent / "py-spy")
    seconds = max(int(args.duration_s - args.ramp_s), 1)
    command = [spy, "record", "--pid", str(pid), "--duration", str(seconds)]
    command += ["--rate", "250", "--format", "raw", "-o", str(path)]
    return subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def _measure_column(
    spec: Column, args: argparse.Namespace, tmp: Path
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every N through one column, then its abort probes: (rows, probes)."""
    column = spec.name
    text = tmp / "script.txt"
    upstream_port = free_port()
    with contextlib.ExitStack() as stack:
        upstream = stack.enter_context(
            _process(
                _upstream_command(upstream_port, args.rate, text),
                upstream_port,
                "upstream",
                args.upstream_cpu,
                "/health",
                tmp / f"{spec.kind}-upstream.log",
            )
        )
        pids = {"upstream": upstream}
        port = upstream_port
        _headers[:] = []
        if spec.kind == "portkey":
            _headers[:] = [
                "x-portkey-provider: openai",
                f"x-portkey-custom-host: http://127.0.0.1:{upstream_port}/v1",
                "Authorization: Bearer unused",
            ]
        if column != "direct":
            port = free_port()
            command, env, ready = _gateway_command(spec, port, upstream_port, tmp)
            pids["gateway"] = stack.enter_context(
                _process(
                    command,
                    port,
                    column,
                    args.gateway_cpu,
                    ready,
                    tmp / f"{spec.kind}.log",
                    env,
                )
            )
            if spec.kind != "portkey":  # no model list: routed by its headers
                _check_serves(port, column)
        # A few whole streams first: a proxy's first requests pay for imports
        # and client set-up that no later one does.
        asyncio.run(_warm_up(port))
        rows = []
        for n in args.n:
            _settle(upstream_port, timeout_s=args.duration_s + 10.0)
            spy = None
            if args.profile is not None and n == max(args.n) and column != "direct":
                path = args.profile.with_name(f"{args.profile.name}.{spec.kind}.{n}")
                spy = _spy(pids["gateway"], path, args)
            loadavg = os.getloadavg()[0]
            cpu0 = {name: _cpu_s(pid) for name, pid in pids.items()}
            wall0 = time.perf_counter()
            load = _load(port, n, args)
            wall_s = time.perf_counter() - wall0
            cpu_s = {name: _cpu_s(pid) - cpu0[name] for name, pid in pids.items()}
            if spy is not None:
                spy.wait()
            rows.append(_row(column, n, load, cpu_s, wall_s, loadavg))
        probes = [
            {"column": column, **_abort_probe(port, upstream_port, stream, args)}
            for stream in (True, False)
        ]
    return rows, probes


# ---------------------------------------------------------------- report


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _print(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="gateway: many streams over one scripted upstream")
    headers = "column N tok/s ITL+p50 ITL+p99 TTFTp50 TTFTp99 hopCPU hop_us/tok"
    more = ("upstream_us/tok", "fin", "trunc", "timeout", "loadavg")
    for header in (*headers.split(), *more):
        table.add_column(header, justify="left" if header == "column" else "right")
    for row in report["rows"]:
        table.add_row(
            row["column"],
            str(row["n"]),
            f"{row['tokens_per_s']:.0f}",
            _ms(row["itl_added_ms"]["p50"]),
            _ms(row["itl_added_ms"]["p99"]),
            _ms(row["ttft_ms"]["p50"]),
            _ms(row["ttft_ms"]["p99"]),
            f"{row['hop_cpu_share']:.0%}",
            f"{row['hop_cpu_us_per_token']:.0f}",
            f"{row['upstream_cpu_us_per_token']:.0f}",
            str(row["finished"]),
            str(row["truncated"] + row["errored"] + row["rejected"]),
            str(row["timed_out"]),
            f"{row.get('loadavg_1m', 0):.1f}",
        )
    console = Console(width=170)
    console.print(table)
    for probe in report["abort_probes"]:
        reached = probe["all_aborted_within_s"]
        console.print(
            f"{probe['column']} ({probe['mode']}): {probe['closed_early']}/"
            f"{probe['streams']} closed early; upstream aborted"
            f" {probe['aborted_upstream']}, still"
            f" running {probe['running_after']}"
            + (
                f" (all aborted within {reached:.2f} s)"
                if reached is not None
                else f" after {probe['wait_s']:.1f} s: the close did not reach it"
            )
        )
    for ratio in report["ratios"]:
        console.print(
            f"N={ratio['n']} {ratio['column']}: hop CPU/direct CPU per token"
            f" x{ratio['hop_cpu_over_direct']:.2f}, added ITL p99 over direct"
            f" {ratio['itl_p99_over_direct_ms']:+.1f} ms"
        )
    for column, why in report["skipped"].items():
        console.print(f"{column}: skipped: {why}")


def _ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    direct = {row["n"]: row for row in rows if row["column"] == "direct"}
    out = []
    for row in rows:
        base = direct.get(row["n"])
        if row["column"] == "direct" or base is None:
            continue
        out.append(
            {
                "column": row["column"],
                "n": row["n"],
                "hop_cpu_over_direct": row["hop_cpu_us_per_token"]
                / max(base["hop_cpu_us_per_token"], 1e-9),
                "itl_p99_over_direct_ms": (row["itl_added_ms"]["p99"] or 0.0)
                - (base["itl_added_ms"]["p99"] or 0.0),
            }
        )
    return out


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--n", type=int, nargs="+", default=[50, 200], help="concurrent streams")
    add("--rate", type=float, default=20.0, help="engine tokens/s per stream")
    add("--duration-s", type=float, default=10.0, help="length of each stream")
    add("--ramp-s", type=float, default=2.0, help="stream starts spread over this")
    add(
        "--columns",
        nargs="+",
        default=["direct", "sluicegate", "litellm", "portkey"],
        choices=["direct", "sluicegate", "sluicegate-before", "litellm", "portkey"],
    )
    add(
        "--before-src",
        type=Path,
        help="the src folder of another checkout, which sluicegate-before runs",
    )
    add("--upstream-cpu", default="0", help="taskset CPU list of the upstream")
    add("--gateway-cpu", default="1", help="taskset CPU list of a gateway")
    add("--load-cpu", default="1", help="taskset CPU list of the load process")
    add("--abort-streams", type=int, default=20, help="streams the probe closes")
    add("--abort-after", type=int, default=3, help="content events read first")
    add("--abort-wait-s", type=float, default=3.0, help="how long aborts may take")
    add("--quick", action="store_true", help="tiny N and duration (CI smoke)")
    add("--no-quiet", action="store_true", help=f"do not hold {QUIET}")
    add("--json", type=Path, default=RESULTS, help="where to write the results")
    add(
        "--profile",
        type=Path,
        help="py-spy raw profile of each gateway at the largest N, in FILE.KIND.N",
    )
    return parser


@contextlib.contextmanager
def _quiet(hold: bool) -> Iterator[None]:
    """Hold ``/tmp/sluicegate-quiet`` while the body runs, when ``hold``.

    Waits while another benchmark holds it, at most ``QUIET_WAIT_S`` seconds (a
    stale file must not stop this one for good).
    """
    if not hold:
        yield
        return
    deadline = time.monotonic() + QUIET_WAIT_S
    while QUIET.exists() and time.monotonic() < deadline:
        time.sleep(5)
    QUIET.touch()
    try:
        yield
    finally:
        QUIET.unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; 0 once the table is printed and the JSON written."""
    args = _parser().parse_args(argv)
    if args.quick:
        args.n, args.duration_s, args.ramp_s = [4], 1.5, 0.2
        args.abort_streams, args.abort_wait_s = 2, 3.0
    if (os.cpu_count() or 1) < 2:
        args.upstream_cpu = args.gateway_cpu = args.load_cpu = "0"
    if args.before_src is not None:
        _before_src[0] = str(args.before_src.resolve())
    columns = _columns(args.columns)
    rows: list[dict[str, Any]] = []
    probes: list[dict[str, Any]] = []
    with _quiet(not args.no_quiet), tempfile.TemporaryDirectory() as name:
        load_before = os.getloadavg()
        tmp = Path(name)
        # Each sentence is more than 10 tokens: enough sentences for every token,
        # the abort probe's long streams included.
        repeats = int(args.rate * (args.duration_s + args.abort_wait_s + 30)) // 10
        (tmp / "script.txt").write_text(SENTENCE * (repeats + 1), encoding="utf-8")
        skipped = {c.name: c.skipped for c in columns if c.skipped}
        for column in columns:
            if column.skipped:
                continue
            try:
                column_rows, column_probes = _measure_column(column, args, tmp)
            except ColumnSkipped as why:
                skipped[column.name] = str(why)
                continue
            except (httpx.HTTPError, subprocess.CalledProcessError) as why:
                # One column's failure (an upstream too busy to answer its
                # stats) costs that column, not the run's other figures.
                skipped[column.name] = f"failed: {why!r}"
                continue
            rows += column_rows
            probes += column_probes
        load_after = os.getloadavg()
    report = {
        "benchmark": "gateway",
        "rate_tokens_per_s": args.rate,
        "duration_s": args.duration_s,
        "ramp_s": args.ramp_s,
        "cpus": {
            "upstream": args.upstream_cpu,
            "gateway": args.gateway_cpu,
            "load": args.load_cpu,
            "count": os.cpu_count(),
        },
        "litellm_version": _litellm_version(),
        "portkey_version": _portkey_version(),
        "before_src": _before_src[0] or None,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "skipped": skipped,
        "rows": rows,
        "abort_probes": probes,
        "ratios": _ratios(rows),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    _print(report)
    return 0


def _portkey_version() -> str | None:
    package = PORTKEY / "package.json"
    if not package.exists():
        return None
    version: str = json.loads(package.read_text())["version"]
    return version


def _litellm_version() -> str | None:
    python = LITELLM_VENV / "bin" / "python"
    if not python.exists():
        return None
    found = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.metadata as m; print(m.version('litellm'))",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    return found.stdout.strip() or None


if __name__ == "__main__":
    sys.exit(main())
