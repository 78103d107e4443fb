"""The resumable-stream store alone at many streams: Redis against memory.

Drives an ``EventStore`` the way a server with resumable streams does, with no
HTTP and no engine: N producers each append one chat-completion-sized frame every
``1/--rate`` s (starts spread over one step, as real streams do not tick in
phase), and each log has one reader following it live, in the same process (a
stream's first reader is the connection that asked for it). Stores:

- ``redis``: ``RedisEventStore`` on a ``redis-server`` this script starts on
  loopback (Debian's, ``scripts/install-system-deps``), no persistence;
- ``memory``: ``MemoryEventStore``, the one-process default.

Reported per store and N: frames appended per second; append latency p50/p99
(ms: from ``append`` to its return, which waits for the flush that carries it);
delivery latency p50/p99 (ms: from ``append`` to the frame reaching its reader:
what resumption adds to a token's way to the client); this process's CPU (share
of one core, us per frame); Redis's own CPU (us per frame, from ``INFO``); and the
flushes per second (round trips of appends). With ``--cpu`` (default 0) this
process is pinned to that core and Redis to the next one.
Not a test: nothing here asserts a timing.

Run: ``.venv/bin/python bench/resume_store.py [--n 100 1000] [--duration-s 10]
[--rate 20] [--stores redis memory] [--json FILE]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from sluicegate.server.http.errors import LogNotFound
from sluicegate.server.redis.client import connect
from sluicegate.server.redis.store import RedisEventStore
from sluicegate.server.stores.event_store import EventStore
from sluicegate.server.stores.memory_store import MemoryEventStore
from sluicegate.testing import free_port

RESULTS = Path(__file__).parent / "results" / "resume_store.json"
FRAME = (
    b'data: {"id":"chatcmpl-0123456789abcdef0123456789abcdef","object":'
    b'"chat.completion.chunk","created":1700000000,"model":"default",'
    b'"choices":[{"index":0,"delta":{"content":" word"},"logprobs":null,'
    b'"finish_reason":null}]}\n\n'
)


@contextlib.contextmanager
def redis_server(cpu: int | None) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A throwaway ``redis-server`` on loopback: ``(url, process)``."""
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    port = free_port()
    with tempfile.TemporaryDirectory() as root:
        command = [binary, "--port", str(port), "--bind", "127.0.0.1"]
        command += ["--save", "", "--appendonly", "no", "--dir", root]
        if cpu is not None and shutil.which("taskset"):
            command = ["taskset", "-c", str(cpu), *command]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        try:
            yield f"redis://127.0.0.1:{port}/0", process
        finally:
            process.terminate()
            process.wait(10)


async def _redis_cpu_s(client: Any) -> float:
    info = await client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def _produce(
    store: EventStore,
    rid: str,
    frames: int,
    step_s: float,
    offset_s: float,
    sent: dict[tuple[str, int], float],
    appends: list[float],
) -> None:
    loop = asyncio.get_running_loop()
    await store.create(rid, "bench")
    start = loop.time() + offset_s
    for seq in range(frames):
        await asyncio.sleep(max(0.0, start + seq * step_s - loop.time()))
        began = time.perf_counter()
        sent[rid, seq] = began
        await store.append(rid, [FRAME])
        appends.append(time.perf_counter() - began)
    await store.finish(rid)


async def _follow(
    store: EventStore,
    rid: str,
    sent: dict[tuple[str, int], float],
    delivered: list[float],
) -> None:
    while True:
        try:
            async for batch in store.read(rid, "bench", -1):
                now = time.perf_counter()
                delivered.extend(now - sent[rid, seq] for seq, _ in batch)
            return
        except LogNotFound:  # not created yet: retry
            await asyncio.sleep(0.01)


async def _measure(
    kind: str, url: str | None, n: int, args: argparse.Namespace
) -> dict[str, Any]:
    client = connect(url) if url is not None else None
    store: EventStore = (
        RedisEventStore(client, max_store_bytes=4 << 30)
        if client is not None
        else MemoryEventStore(max_store_bytes=4 << 30)
    )
    frames = int(args.rate * args.duration_s)
    step_s = 1.0 / args.rate
    sent: dict[tuple[str, int], float] = {}
    appends: list[float] = []
    delivered: list[float] = []
    redis_before = await _redis_cpu_s(client) if client is not None else 0.0
    flushes_before = getattr(store, "flushes", 0)
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    wall_before = time.perf_counter()
    ids = [f"chatcmpl-{kind}-{n}-{i}" for i in range(n)]
    producers = [
        _produce(store, rid, frames, step_s, step_s * i / n, sent, appends)
        for i, rid in enumerate(ids)
    ]
    await asyncio.sleep(0)
    followers = [_follow(store, rid, sent, delivered) for rid in ids]
    await asyncio.gather(*producers, *followers)
    wall = time.perf_counter() - wall_before
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (
        cpu_after.ru_stime - cpu_before.ru_stime
    )
    total = n * frames
    row: dict[str, Any] = {
        "store": kind,
        "streams": n,
        "frames": total,
        "frames_per_s": total / wall,
        "append_ms_p50": _pct(appends, 50),
        "append_ms_p99": _pct(appends, 99),
        "delivery_ms_p50": _pct(delivered, 50),
        "delivery_ms_p99": _pct(delivered, 99),
        "delivered": len(delivered),
        "cpu_share": cpu / wall,
        "cpu_us_per_frame": cpu / total * 1e6,
        "flushes_per_s": (getattr(store, "flushes", 0) - flushes_before) / wall,
    }
    await store.aclose()
    if client is not None:
        row["redis_cpu_us_per_frame"] = (
            (await _redis_cpu_s(client) - redis_before) / total * 1e6
        )
        await client.aclose()
    return row


def _pct(values: list[float], pct: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))] * 1000


def _print(rows: list[dict[str, Any]]) -> None:
    head = (
        "store",
        "N",
        "frames/s",
        "app p50",
        "app p99",
        "dlv p50",
        "dlv p99",
        "cpu",
        "us/frame",
        "redis us",
        "flush/s",
    )
    print(("{:>8} " * len(head)).format(*head))
    for r in rows:
        print(
            f"{r['store']:>8} {r['streams']:>8} {r['frames_per_s']:>8.0f} "
            f"{r['append_ms_p50']:>8.2f} {r['append_ms_p99']:>8.2f} "
            f"{r['delivery_ms_p50']:>8.2f} {r['delivery_ms_p99']:>8.2f} "
            f"{r['cpu_share']:>8.2f} {r['cpu_us_per_frame']:>8.1f} "
            f"{r.get('redis_cpu_us_per_frame', 0.0):>8.1f} {r['flushes_per_s']:>8.0f}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print a table and write ``--json``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--n", type=int, nargs="+", default=[100, 1000], help="streams")
    add("--rate", type=float, default=20.0, help="frames/s per stream")
    add("--duration-s", type=float, default=10.0, help="length of each stream")
    add("--stores", nargs="+", default=["redis", "memory"], choices=["redis", "memory"])
    add("--cpu", type=int, default=0, help="core of this process (Redis: the next)")
    add("--json", type=Path, default=RESULTS, help="where to write the results")
    args = parser.parse_args(argv)
    cores = os.cpu_count() or 1
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.cpu % cores})
    rows = []
    with redis_server((args.cpu + 1) % cores) as (url, _):
        time.sleep(0.3)
        for n in args.n:
            for kind in args.stores:
                rows.append(
                    asyncio.run(
                        _measure(kind, url if kind == "redis" else None, n, args)
                    )
                )
    report = {
        "benchmark": "resume_store",
        "rate": args.rate,
        "duration_s": args.duration_s,
        "loadavg": os.getloadavg(),
        "rows": rows,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    _print(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
