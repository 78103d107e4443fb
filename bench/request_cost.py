"""Server CPU per streamed request: what a new stream costs from accept to close.

Starts ``sluicegate serve --engine scripted`` (every event padded, the default;
``--plain``: ``--no-obfuscation``) pinned to ``--server-cpu``, then sends
``--requests`` streamed chat requests of ``--tokens`` tokens each, ``--concurrency``
at a time, each on its own connection (``Connection: close``), from this
process (the load; pin it with ``taskset`` if wanted). A first pass of the same
size warms the server up; the second is measured: the server's CPU time
(``/proc``, user + system) over the requests. With ``--tokens 1`` that is the
per-request cost a stream pays once (accept, read, plan and admit, the head,
the first event, the end, close); a ramp of N streams over S seconds asks the
server for about ``N / S x`` that, on top of the tokens of the streams already
running. With ``--before-src``, the same against another checkout's ``src``,
alternated ``--repeat`` times.

Prints one line per pass with the 1-minute load average; not a test.

Run: ``.venv/bin/python bench/request_cost.py [--requests 2000] [--tokens 1]
[--concurrency 20] [--repeat 3] [--before-src OLD_CHECKOUT/src] [--profile FILE]``
(``--profile``: a py-spy raw profile of the measured pass, written over by
each pass: use it with ``--repeat 1``)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from sluicegate.testing import ServerProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
SENTENCE = " The quick brown fox streams tokens correctly, once upon a time."

sys.path.insert(0, str(ROOT / "bench"))  # bench/ is scripts, not a package
import stream_load  # noqa: E402  (bench/stream_load.py: the request it sends)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _one(port: int, request: bytes) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    received = b""
    while chunk := await reader.read(65536):
        received += chunk
    writer.close()
    if b"data: [DONE]" not in received:
        raise RuntimeError(f"a stream did not finish: {received[:200]!r}")


async def _requests(port: int, request: bytes, count: int, concurrency: int) -> None:
    slots = asyncio.Semaphore(concurrency)

    async def limited() -> None:
        async with slots:
            await _one(port, request)

    await asyncio.gather(*(limited() for _ in range(count)))


def _pass(src: str | None, args: argparse.Namespace, text: Path) -> float:
    """One server: a warm-up pass, then the measured one; ms of CPU a request."""
    port = free_port()
    command = [
        *("taskset", "-c", args.server_cpu, sys.executable, "-m", "sluicegate"),
        *("serve", "--engine=scripted", f"--port={port}", "--scripted-rate=1000"),
        f"--scripted-text={text}",
        "--scripted-max-running=100000",
        "--scripted-max-queued=100000",
        "--no-ledger",
        "--log-level=warning",
        *(["--no-obfuscation"] if args.plain else []),
    ]
    env = {"PYTHONPATH": src} if src else {}
    server = ServerProcess(command, port, name="sluicegate", cwd=ROOT, env=env)
    request = stream_load.request_bytes(port, args.tokens, ["Connection: close"])
    try:
        server.wait_ready("/health", timeout_s=60, interval_s=0.1)
        asyncio.run(_requests(port, request, args.requests, args.concurrency))
        spy = _spy(server.pid, args.profile) if args.profile is not None else None
        cpu0 = _cpu_s(server.pid)
        asyncio.run(_requests(port, request, args.requests, args.concurrency))
        requests: int = args.requests
        cpu_s = _cpu_s(server.pid) - cpu0
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes what it sampled
            spy.wait()
        return cpu_s / requests * 1e3
    finally:
        server.stop(signal.SIGINT)


def _spy(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling ``pid`` at 1 kHz into ``out`` (raw) until interrupted."""
    spy = os.environ.get("PY_SPY") or str(Path(sys.executable).parent / "py-spy")
    command = [spy, "record", "--pid", str(pid), "--rate", "1000"]
    return subprocess.Popen(
        [*command, "--format", "raw", "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Measure, alternating the two checkouts when given two; print each pass."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--requests", type=int, default=2000, help="requests per pass")
    add("--tokens", type=int, default=1, help="tokens per stream (max_tokens)")
    add("--concurrency", type=int, default=20, help="requests open at a time")
    add("--repeat", type=int, default=3, help="passes of each checkout")
    add("--plain", action="store_true", help="serve with --no-obfuscation")
    add("--server-cpu", default="0", help="taskset CPU list of the server")
    add("--before-src", type=Path, help="another checkout's src, alternated")
    add("--profile", type=Path, help="py-spy raw profile of the measured passes")
    args = parser.parse_args(argv)
    sources: dict[str, str | None] = {"this": None}
    if args.before_src is not None:
        sources = {"before": str(args.before_src.resolve()), **sources}
    results: dict[str, list[float]] = {name: [] for name in sources}
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "script.txt"
        text.write_text(SENTENCE * (args.tokens // 10 + 2), encoding="utf-8")
        for round_ in range(args.repeat):
            order = list(sources.items())
            if round_ % 2:
                order.reverse()
            for name, src in order:
                loadavg = os.getloadavg()[0]
                started = time.perf_counter()
                ms = _pass(src, args, text)
                results[name].append(ms)
                took_s = time.perf_counter() - started
                print(
                    f"{name}: {ms:.3f} ms of server CPU a request "
                    f"({args.requests} requests of {args.tokens} tokens, "
                    f"{took_s:.0f} s, load average {loadavg:.1f})"
                )
    for name, values in results.items():
        print(f"{name}: median {statistics.median(values):.3f} ms a request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
