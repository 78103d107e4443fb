"""Chaos run: many concurrent streams that misbehave, then one ledger row each.

Two modes, each against a fresh ``sluicegate serve --engine scripted`` subprocess
with an SQLite ledger in a temp dir:

- ``--streams N`` (default 300): N concurrent chat streams through the project's
  ``AsyncClient``, each drawn (seeded) to be a reader that reads to the end, a
  slow reader (a pause after every delta, so the server coalesces), a pausing
  reader (one long pause, shorter than the stuck timeout), a client that
  disconnects at a random time after its first token, a raw client that sends
  its request and closes the socket at once, or an invalid request (400). The engine
  injects errors in a seeded share of the sequences (``--fault error-rate``)
  and stalls every sequence once (``--fault stall``, heartbeats cover it).
  Afterwards it checks that every request has exactly one ledger row, that the
  row's end state is the one the client classified, and that active streams,
  the engine's queue, running sequences and KV cells are back to zero.
- ``--stuck-reader SECONDS``: one fast never-ending stream whose client reads the
  response head and then nothing; samples the server's ``VmRSS`` while the
  engine keeps generating, until the stuck timeout aborts the stream, and
  compares the growth with what the generated tokens' frames would have taken
  if they had been buffered without a bound.

Timing races kept out by construction: a disconnect comes at most
``DISCONNECT_MAX_S`` after the first token, well before any stream can end or
fail (error at decode step ``ERROR_STEP``, plus a stall), so a client that closed
and the server always both say ``aborted``. A client cancelled before its
request went out would have no row, rightly; so early disconnects are the raw
``drop`` clients, whose request was written whole before they close.

Run: ``.venv/bin/python bench/chaos.py [--streams 300] [--seed 1] [--json FILE]``
or ``.venv/bin/python bench/chaos.py --stuck-reader 60``. Exit status 1 when a
check fails. The suite runs short versions (``tests/integration/test_chaos.py``,
``tests/integration/test_robust_streams.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from sluicegate.client import AsyncClient, Timeouts
from sluicegate.core.endstate import EndState
from sluicegate.server.ledger.ledger import LedgerRow, read_rows
from sluicegate.testing import ServerNotReady, ServerProcess, free_port, serve_command

HEALTH_TIMEOUT_S = 60.0
SCRIPT = "The quick brown fox streams tokens correctly, once upon a time. " * 10
"""About 195 scripted tokens: every stream ends by ``max_tokens`` (``length``)."""
HELLO = [{"role": "user", "content": "Hi"}]

RATE = 50.0
"""Scripted tokens per second per sequence."""
ERROR_STEP = 40
"""Decode step at which a failing sequence fails (0.8 s at ``RATE``)."""
STALL = (20, 1.5)
"""Every sequence stalls 1.5 s before decode step 20."""
MAX_TOKENS = (60, 120)
DISCONNECT_MAX_S = 1.0
"""A disconnecting client leaves within this after its first token; every
stream runs >= 2.7 s, and fails no sooner than 2.3 s, after it."""
IDLE_KEYS = ("active_streams", "engine_queue_depth", "engine_running", "kv_cells_used")
KINDS = ("reader", "slow", "pause", "disconnect", "drop", "invalid")
WEIGHTS = (4, 2, 1, 3, 1, 1)


@dataclass
class Server:
    """A ``sluicegate serve`` subprocess, its ledger file and its log."""

    proc: ServerProcess
    ledger: Path
    log: Path

    @property
    def process(self) -> subprocess.Popen[bytes]:
        return self.proc.process

    @property
    def base_url(self) -> str:
        return self.proc.base_url

    @property
    def port(self) -> int:
        return self.proc.port

    def rss_kib(self) -> int:
        """The process's resident set (``VmRSS``), in KiB."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        assert match is not None, status
        return int(match.group(1))

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = httpx.get(f"{self.base_url}/engine/stats").json()
        return stats

    def metrics(self) -> dict[str, float]:
        """``/metrics`` samples without labels, ``sluicegate_`` prefix dropped."""
        text = httpx.get(f"{self.base_url}/metrics").text
        found = re.findall(r"^sluicegate_(\w+) (\S+)$", text, re.MULTILINE)
        return {name: float(value) for name, value in found}

    def stop(self) -> int:
        return self.proc.stop(timeout_s=20)


def start_server(workdir: Path, *args: str) -> Server:
    """``sluicegate serve`` on a free port with a ledger in ``workdir``; healthy."""
    port = free_port()
    ledger = workdir / f"ledger-{port}.sqlite3"
    log = workdir / f"server-{port}.log"
    command = serve_command(port, "--ledger", str(ledger), *args)
    server = Server(ServerProcess(command, port, log_path=log), ledger, log)
    try:
        server.proc.wait_ready("/health", timeout_s=HEALTH_TIMEOUT_S, interval_s=0.1)
    except ServerNotReady:
        server.stop()
        raise
    return server


def wait_idle(server: Server, give_up_s: float = 15.0) -> dict[str, float]:
    """Poll ``/metrics`` until nothing runs; the last values of ``IDLE_KEYS``."""
    deadline = time.monotonic() + give_up_s
    while True:
        metrics = server.metrics()
        idle = {key: metrics.get(key, -1.0) for key in IDLE_KEYS}
        if all(v == 0 for v in idle.values()) or time.monotonic() > deadline:
            return idle
        time.sleep(0.1)


# -- chaos ------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What one client does."""

    index: int
    kind: str
    max_tokens: int
    start_s: float
    disconnect_s: float = 0.0
    pause_s: float = 0.0


@dataclass
class Outcome:
    """What the client saw: its end state, status and the response id."""

    plan: Plan
    end_state: EndState
    status: int | None
    response_id: str | None


@dataclass
class ChaosReport:
    streams: int
    seed: int
    seconds: float
    client_states: dict[str, int]
    ledger_rows: int
    mismatches: list[str]
    idle_after: dict[str, float]
    kinds: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.mismatches


def plans(streams: int, seed: int, ramp_s: float) -> list[Plan]:
    rng = random.Random(seed)
    made = []
    for index in range(streams):
        (kind,) = rng.choices(KINDS, WEIGHTS)
        made.append(
            Plan(
                index,
                kind,
                max_tokens=rng.randint(*MAX_TOKENS),
                start_s=rng.uniform(0, ramp_s),
                disconnect_s=rng.uniform(0.0, DISCONNECT_MAX_S),
                pause_s=rng.uniform(0.5, 2.0),
            )
        )
    return made


def response_id(raw: bytes) -> str | None:
    """The ``id`` of the first chunk in a recorded body, if one arrived whole."""
    for line in raw.split(b"\n"):
        if line.startswith(b"data: {"):
            try:
                chunk = json.loads(line[6:])
            except ValueError:
                return None
            found = chunk.get("id")
            return found if isinstance(found, str) else None
    return None


async def drop(base_url: str, plan: Plan) -> Outcome:
    """Write a whole streaming request, then close the socket without reading."""
    port = int(base_url.rsplit(":", 1)[1])
    body = {"messages": HELLO, "stream": True, "max_tokens": plan.max_tokens}
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_request_bytes(port, body))
    await writer.drain()
    writer.close()
    await writer.wait_closed()
    return Outcome(plan, EndState.ABORTED, None, None)


async def run_one(client: AsyncClient, base_url: str, plan: Plan) -> Outcome:
    await asyncio.sleep(plan.start_s)
    if plan.kind == "drop":
        return await drop(base_url, plan)
    max_tokens = -1 if plan.kind == "invalid" else plan.max_tokens
    stream = client.astream_chat(
        HELLO, model="scripted", record=True, max_tokens=max_tokens
    )
    try:
        if plan.kind == "disconnect":
            loop = asyncio.get_running_loop()
            try:
                async with asyncio.timeout(None) as timeout:
                    async for _ in stream:
                        if timeout.when() is None:
                            timeout.reschedule(loop.time() + plan.disconnect_s)
            except TimeoutError:
                pass
        else:
            deltas = 0
            async for _ in stream:
                deltas += 1
                if plan.kind == "slow":
                    await asyncio.sleep(0.03)
                elif plan.kind == "pause" and deltas == 3:
                    await asyncio.sleep(plan.pause_s)
    finally:
        await stream.aclose()
    result = await stream.aresult()
    return Outcome(plan, result.end_state, result.status, response_id(result.raw))


async def drive(base_url: str, made: Sequence[Plan]) -> list[Outcome]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    transport = httpx.AsyncHTTPTransport(limits=limits)
    timeouts = Timeouts(connect_s=30.0, first_byte_s=60.0, idle_s=30.0, total_s=120.0)
    async with AsyncClient(base_url, timeouts=timeouts, transport=transport) as client:
        runs = (run_one(client, base_url, p) for p in made)
        return list(await asyncio.gather(*runs))


def compare(outcomes: Sequence[Outcome], rows: Sequence[LedgerRow]) -> list[str]:
    """Every way the ledger and the clients disagree (``[]`` when they agree)."""
    problems = []
    by_id: dict[str, list[LedgerRow]] = collections.defaultdict(list)
    for row in rows:
        by_id[row.request_id].append(row)
    problems += [f"{rid}: {len(rs)} rows" for rid, rs in by_id.items() if len(rs) > 1]
    if len(rows) != len(outcomes):
        problems.append(f"{len(rows)} ledger rows for {len(outcomes)} requests")
    seen = set()
    unmatched: collections.Counter[str] = collections.Counter()
    for outcome in outcomes:
        rid = outcome.response_id
        if rid is None:  # rejected, or gone before the first event
            unmatched[f"{outcome.end_state} client"] += 1
            continue
        seen.add(rid)
        found = by_id.get(rid)
        if not found:
            problems.append(f"{rid} ({outcome.plan.kind}): no ledger row")
        elif found[0].end_state != outcome.end_state:
            problems.append(
                f"{rid} ({outcome.plan.kind}): client {outcome.end_state}, "
                f"ledger {found[0].end_state}"
            )
    for row in rows:
        if row.request_id not in seen:
            unmatched[f"{row.end_state} ledger"] += 1
    for state in EndState:
        client, ledger = unmatched[f"{state} client"], unmatched[f"{state} ledger"]
        if client != ledger:
            problems.append(
                f"{state} without a response id: {client} clients, {ledger} rows"
            )
    return problems


def wait_rows(ledger: Path, expected: int, give_up_s: float = 15.0) -> list[LedgerRow]:
    """The ledger's rows once there are ``expected`` (or after ``give_up_s``)."""
    deadline = time.monotonic() + give_up_s
    while True:
        rows = read_rows(ledger) if ledger.exists() else []
        if len(rows) >= expected or time.monotonic() > deadline:
            return rows
        time.sleep(0.1)


def chaos(streams: int, seed: int, workdir: Path, ramp_s: float = 0.5) -> ChaosReport:
    """The chaos run against a fresh server in ``workdir``; see the module doc."""
    script = workdir / "script.txt"
    script.write_text(SCRIPT)
    server = start_server(
        workdir,
        *("--log-level", "warning", "--engine", "scripted"),
        *("--scripted-rate", str(RATE), "--scripted-text", str(script)),
        *("--scripted-max-running", str(streams), "--scripted-max-queued", "64"),
        *("--fault", f"error-rate:0.15:{ERROR_STEP}", "--fault", f"seed:{seed}"),
        *("--fault", f"stall:{STALL[0]}:{STALL[1]}", "--heartbeat-s", "1"),
        *("--stuck-stream-timeout", "10", "--stream-buffer-bytes", "65536"),
    )
    try:
        made = plans(streams, seed, ramp_s)
        started = time.monotonic()
        outcomes = asyncio.run(drive(server.base_url, made))
        seconds = time.monotonic() - started
        rows = wait_rows(server.ledger, len(outcomes))
        idle = wait_idle(server)
    finally:
        server.stop()
    problems = compare(outcomes, rows)
    problems += [f"{k} = {v} after the run" for k, v in idle.items() if v != 0]
    return ChaosReport(
        streams=streams,
        seed=seed,
        seconds=round(seconds, 2),
        client_states=dict(collections.Counter(str(o.end_state) for o in outcomes)),
        ledger_rows=len(rows),
        mismatches=problems,
        idle_after=idle,
        kinds=dict(collections.Counter(p.kind for p in made)),
    )


# -- a client that stops reading --------------------------------------------------


@dataclass
class StuckReport:
    """RSS of a server whose only client stopped reading, and how it ended."""

    rate: float
    n: int
    stuck_timeout_s: float
    buffer_bytes: int
    frame_bytes: float
    """Wire bytes per content event, measured on a stream that was read."""
    baseline_kib: int
    peak_kib: int
    samples: list[tuple[float, int]]
    """(seconds since the client stopped reading, VmRSS KiB)."""
    generated_tokens: int
    """Engine tokens generated for the stuck stream."""
    aborted_after_s: float | None
    """When ``/engine/stats`` first showed nothing running, from the request."""
    ledger: list[tuple[str, int, int]]
    """(end state, status, completion tokens) of the stuck stream's row."""
    slow_client_aborts: float
    tail_has_done: bool
    eof: bool
    """The client, reading again after the abort, reached the end of the body."""
    log: str

    @property
    def growth_kib(self) -> int:
        return self.peak_kib - self.baseline_kib

    @property
    def unbounded_kib(self) -> float:
        """What the generated tokens' frames take if kept (a lower bound)."""
        return self.generated_tokens * self.frame_bytes / 1024


def _request_bytes(port: int, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    return head.encode() + data


def _read_head(sock: socket.socket) -> bytes:
    received = b""
    while b"\r\n\r\n" not in received:
        data = sock.recv(1024)
        if not data:
            break
        received += data
    return received


def _frame_bytes(server: Server, body: dict[str, Any], read_s: float) -> float:
    """Wire bytes per content event of ``body``'s stream, read for ``read_s``."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(_request_bytes(server.port, body))
        received = _read_head(sock)
        head_end = received.index(b"\r\n\r\n") + 4
        deadline = time.monotonic() + read_s
        while time.monotonic() < deadline:
            received += sock.recv(65536)
    events = received[head_end:].count(b'"content":"')
    return (len(received) - head_end) / max(events, 1)


def stuck_reader(
    seconds: float,
    workdir: Path,
    *,
    rate: float = 2000.0,
    n: int = 1,
    stuck_timeout_s: float | None = None,
    buffer_bytes: int = 1 << 20,
    give_up_s: float | None = None,
) -> StuckReport:
    """A client that stops reading a fast stream; RSS sampled for ``seconds``.

    The stuck timeout defaults to ``seconds``: the engine generates for all of
    them (plus the time the socket buffers take to fill) before the abort.
    Sampling stops ``seconds`` after the request, or once the stream was aborted
    if that is later (``give_up_s`` at most, default ``3 x seconds + 30``).
    """
    stuck_s = seconds if stuck_timeout_s is None else stuck_timeout_s
    server = start_server(
        workdir,
        *("--log-level", "warning", "--engine", "scripted"),
        *("--scripted-rate", str(rate), "--fault", "never-finishes"),
        *("--stuck-stream-timeout", str(stuck_s)),
        *("--stream-buffer-bytes", str(buffer_bytes)),
    )
    body = {"messages": HELLO, "stream": True, "n": n}
    try:
        frame = _frame_bytes(server, body, 1.0)  # also warms the server up
        wait_idle(server)
        before = server.stats()
        baseline = server.rss_kib()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(_request_bytes(server.port, body))
        started = time.monotonic()
        _read_head(sock)  # then read nothing
        samples: list[tuple[float, int]] = []
        aborted_after = None
        limit = give_up_s if give_up_s is not None else 3 * seconds + 30
        while True:
            now = time.monotonic() - started
            samples.append((round(now, 2), server.rss_kib()))
            stats = server.stats()
            if aborted_after is None and stats["aborted_requests"] > before.get(
                "aborted_requests", 0
            ):
                aborted_after = now
            done = aborted_after is not None and now >= aborted_after + 0.5
            if (done and now >= seconds) or now > limit:
                break
            time.sleep(0.25)
        generated = stats["generated_tokens"] - before["generated_tokens"]
        sock.settimeout(30)
        tail = b""
        eof = False
        try:
            while chunk := sock.recv(1 << 20):
                tail += chunk
            eof = True
        except OSError:
            pass
        sock.close()
        idle = wait_idle(server)
        rows = wait_rows(server.ledger, 2)
        slow_aborts = server.metrics().get("slow_client_aborts_total", -1.0)
    finally:
        server.stop()
    stuck_rows = rows[1:]  # the first row is the warm-up stream's
    return StuckReport(
        rate=rate,
        n=n,
        stuck_timeout_s=stuck_s,
        buffer_bytes=buffer_bytes,
        frame_bytes=round(frame, 1),
        baseline_kib=baseline,
        peak_kib=max(kib for _, kib in samples),
        samples=samples,
        generated_tokens=generated,
        aborted_after_s=None if aborted_after is None else round(aborted_after, 2),
        ledger=[(str(r.end_state), r.status, r.completion_tokens) for r in stuck_rows],
        slow_client_aborts=slow_aborts if all(v == 0 for v in idle.values()) else -1,
        tail_has_done=b"data: [DONE]" in tail,
        eof=eof,
        log=server.log.read_text(errors="replace"),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--stuck-reader",
        type=float,
        metavar="SECONDS",
        help="measure RSS under one client that stops reading, instead",
    )
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        if args.stuck_reader is not None:
            stuck = stuck_reader(args.stuck_reader, Path(tmp))
            report: dict[str, Any] = asdict(stuck)
            del report["log"]
            report["growth_kib"] = stuck.growth_kib
            report["unbounded_kib"] = round(stuck.unbounded_kib)
            # Bounded: the stream is aborted (stuck timeout or buffer overflow,
            # whichever comes first) and the server grew by no more than twice
            # the buffer limit plus 512 KiB of allocator and socket slack.
            ok = (
                stuck.aborted_after_s is not None
                and stuck.ledger[:1] == [("aborted", 200, stuck.ledger[0][2])]
                and stuck.growth_kib < 2 * stuck.buffer_bytes / 1024 + 512
            )
            samples = report.pop("samples")
            print(json.dumps(report, indent=2))
            print("RSS KiB over time:", samples[:: max(len(samples) // 20, 1)])
        else:
            chaos_report = chaos(args.streams, args.seed, Path(tmp))
            report = asdict(chaos_report)
            ok = chaos_report.ok
            print(json.dumps(report, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    print("ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
