"""The real model behind an engine process and two workers, against one process.

``compare`` (the default): for each round, one server at a time on the same
cores, the default model through llama.cpp with ``--parallel 16``:

- ``one``: ``sluicegate serve`` (the engine in the server's own process);
- ``split``: ``sluicegate serve --workers 2 --redis URL`` (the engine in a
  process of its own, two workers reaching it over a Unix socket);

each driven by ``sluicegate bench --concurrency 16`` (16 requests to warm up,
then ``--requests`` streamed requests of ``--max-tokens`` tokens, the prompt of
``--prompt-words`` words; ``--threads`` sets llama.cpp's). Reported:
output tokens/s, TTFT p50/p99, and the ratios split/one. The order of the
servers alternates between rounds (``--first-round`` numbers them, so that
rounds run one per command still alternate). Each row also has the engine's
decode steps over the measured requests (``/engine/stats`` before and after:
how many, their mean time, the share of the window spent in one) and every
thread of the server's processes that ran (CPU seconds, voluntary and
involuntary context switches): where the CPU beside llama.cpp's threads went,
and how often each process woke.

``kill``: ``--streams`` scripted streams through ``--engine-process``
(the scripted engine there, paced; ``--workers`` front-end workers, with a
Redis above one) and a SQLite ledger, then SIGKILL of the engine process once
every stream has had a token: reported are the seconds from the kill to the
last stream's in-band error, how many streams ended with exactly one
``engine_crashed`` error and no ``[DONE]``, the seconds to the first 200
after the kill (against what it is documented to take: the supervisor's
back-off, seen as when the new engine process started, then that engine's
start, bounded by the first one's from its process's start to the first
ready answer, then at most 0.1 s for a worker's next try), and the streams'
ledger rows: how many were closed, how many as ``errored``, and how many of
those count at least the tokens their client was sent.

Each mode writes its results as JSON (``--json``; by default
``bench/results/engine-process-<mode>.json``) with the machine's load
averages before and after every figure, and prints them as it goes. Not a
test: nothing here asserts a timing (a shared machine makes them noisy).

Run: ``.venv/bin/python bench/engine_process.py [compare|kill] [--rounds 2]
[--streams 100] [--json PATH]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from sluicegate.server.ledger.read import read_rows
from sluicegate.testing import ServerProcess, free_port, serve_command

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))  # bench/ is scripts, not a package
import stream_procs  # noqa: E402  (bench/stream_procs.py: a server's processes)

PYTHON = sys.executable
RESULTS = ROOT / "bench" / "results"
ROWS_GIVE_UP_S = 30.0
"""How long the kill run waits for the streams' ledger rows after the first 200."""


def _redis() -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    return f"redis://127.0.0.1:{port}/0", process


def _bench(
    url: str, args: argparse.Namespace, out: Path, requests: int
) -> dict[str, Any]:
    subprocess.run(
        [
            PYTHON, "-m", "sluicegate", "bench", url, "--concurrency", "16",
            "--requests", str(requests), "--max-tokens", str(args.max_tokens),
            "--prompt-words", str(args.prompt_words), "--json", str(out),
        ],
        check=True, stdout=subprocess.DEVNULL, cwd=ROOT,
    )  # fmt: skip
    summary: dict[str, Any] = json.loads(out.read_text())
    return summary


def _serve(kind: str, redis: str, log: Path, threads: int | None) -> ServerProcess:
    port = free_port()
    extra = ["--workers", "2", "--redis", redis] if kind == "split" else []
    if threads is not None:
        extra += ["--threads", str(threads)]
    command = serve_command(
        port, "--engine", "llamacpp", "--parallel", "16", "--n-ctx", "8192",
        "--no-ledger", "--log-level", "warning", *extra,
    )  # fmt: skip
    server = ServerProcess(command, port, log_path=log, name=kind, cwd=ROOT)
    server.wait_ready("/health", timeout_s=300)
    return server


def compare(args: argparse.Namespace) -> dict[str, Any]:
    redis, redis_process = _redis()
    rows: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for round_ in range(args.first_round, args.first_round + args.rounds):
                kinds = ["one", "split"] if round_ % 2 == 0 else ["split", "one"]
                for kind in kinds:
                    log = Path(tmp) / f"{kind}.log"
                    with _serve(kind, redis, log, args.threads) as server:
                        url = server.base_url
                        _bench(url, args, Path(tmp) / "warm.json", 16)
                        load = os.getloadavg()
                        watch = stream_procs.ProcessWatch(
                            server.pid, stream_procs.tree(server.pid)
                        )
                        watch.start()
                        stats_before = _engine_stats(url)
                        threads_before = _threads(watch.pids)
                        began = time.perf_counter()
                        summary = _bench(url, args, Path(tmp) / "b.json", args.requests)
                        window = (began, time.perf_counter())
                        threads = _thread_deltas(threads_before, _threads(watch.pids))
                        # A worker is sent the engine's stats at most a tick
                        # late once its requests are done; the engine is idle.
                        time.sleep(0.5)
                        steps = _steps(stats_before, _engine_stats(url), window)
                        watch.stop.set()
                        watch.join()
                    row = {
                        "round": round_,
                        "server": kind,
                        "load1": load[0],
                        "load_before": load,
                        "load_after": os.getloadavg(),
                        **summary,
                        # Each process's share of a core over the measured
                        # requests (the parent, the workers, the engine), and
                        # the whole machine's busy and stolen cores.
                        "processes": [
                            {k: v for k, v in p.items() if k != "streams"}
                            for p in watch.report(window)
                        ],
                        "machine_cores": watch.report_machine(window),
                        "engine_steps": steps,
                        "threads": threads,
                    }
                    rows.append(row)
                    print(json.dumps(_short(row)), flush=True)
    finally:
        redis_process.terminate()
        redis_process.wait(10)
    ratios = []
    for round_ in range(args.first_round, args.first_round + args.rounds):
        one, split = (
            next(r for r in rows if r["round"] == round_ and r["server"] == k)
            for k in ("one", "split")
        )
        tokens = split["output_tokens_per_s"] / one["output_tokens_per_s"]
        ttft = _p(split, "ttft_s", "p50") / _p(one, "ttft_s", "p50")
        ratios.append({"round": round_, "tokens_per_s": tokens, "ttft_p50": ttft})
        print(f"round {round_}: tok/s split/one {tokens:.3f}, TTFT p50 {ttft:.3f}")
    return {"rows": rows, "split_over_one": ratios}


def _engine_stats(url: str) -> dict[str, Any]:
    stats: dict[str, Any] = httpx.get(f"{url}/engine/stats", timeout=30).json()
    return stats


def _steps(
    before: dict[str, Any], after: dict[str, Any], window: tuple[float, float]
) -> dict[str, float]:
    """The engine's decode steps over the measured requests: how many, their
    mean time, and the share of the window the engine spent in a step (what is
    left is time with no step running: waiting for requests, or for the lock)."""
    steps = after["steps"] - before["steps"]
    busy_s = after["step_time_s"] - before["step_time_s"]
    wall_s = window[1] - window[0]
    return {
        "steps": steps,
        "step_ms": busy_s / steps * 1000 if steps else 0.0,
        "busy_share": busy_s / wall_s,
        "idle_s": wall_s - busy_s,
        "prompt_tokens": after["prompt_tokens"] - before["prompt_tokens"],
        "generated_tokens": after["generated_tokens"] - before["generated_tokens"],
    }


def _threads(pids: list[int]) -> dict[str, tuple[float, int, int]]:
    """Every thread of ``pids``: CPU seconds, voluntary and involuntary
    context switches (``/proc/PID/task/TID/status``), keyed by pid/name/tid."""
    found: dict[str, tuple[float, int, int]] = {}
    tick = 1.0 / os.sysconf("SC_CLK_TCK")
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                stat = (task / "stat").read_text()
                status = (task / "status").read_text()
            except OSError:
                continue
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat.rsplit(")", 1)[1].split()
            switches = dict(
                line.split(":\t") for line in status.splitlines() if "ctxt" in line
            )
            found[f"{pid}/{name}/{task.name}"] = (
                (int(fields[11]) + int(fields[12])) * tick,
                int(switches["voluntary_ctxt_switches"]),
                int(switches["nonvoluntary_ctxt_switches"]),
            )
    return found


def _thread_deltas(
    before: dict[str, tuple[float, int, int]], after: dict[str, tuple[float, int, int]]
) -> list[dict[str, Any]]:
    """The threads that ran over the window: CPU seconds and switches."""
    rows = []
    for key, (cpu, voluntary, forced) in after.items():
        cpu0, voluntary0, forced0 = before.get(key, (0.0, 0, 0))
        if cpu - cpu0 > 0.005 or forced - forced0 > 0:
            rows.append({
                "thread": key,
                "cpu_s": round(cpu - cpu0, 3),
                "voluntary_switches": voluntary - voluntary0,
                "involuntary_switches": forced - forced0,
            })  # fmt: skip
    return rows


def _p(row: dict[str, Any], name: str, cut: str) -> float:
    return float(row[name][cut])


def _short(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "round": row["round"],
        "server": row["server"],
        "load1": row["load1"],
        "tokens_per_s": round(row["output_tokens_per_s"], 1),
        "ttft_p50_ms": round(_p(row, "ttft_s", "p50") * 1000, 1),
        "ttft_p99_ms": round(_p(row, "ttft_s", "p99") * 1000, 1),
        "cpu": {
            role: round(
                sum(p["cpu_share"] for p in row["processes"] if p["role"] == role), 2
            )
            for role in dict.fromkeys(p["role"] for p in row["processes"])
        },
        "machine_busy": round(row["machine_cores"]["busy"], 2),
        "steps": row["engine_steps"],
        "stolen": round(row["machine_cores"]["stolen"], 2),
    }


async def _stream(
    client: httpx.AsyncClient, streaming: asyncio.Semaphore
) -> dict[str, Any]:
    """One stream to its end: its id, content chunks, errors, [DONE], end time."""
    body = {
        "messages": [{"role": "user", "content": "Go"}],
        "max_tokens": 2000,
        "stream": True,
    }
    seen: dict[str, Any] = {"id": None, "deltas": 0, "errors": 0, "done": False}
    async with client.stream("POST", "/v1/chat/completions", json=body) as live:
        async for line in live.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                seen["done"] = True
                continue
            chunk = json.loads(data)
            seen["id"] = seen["id"] or chunk.get("id")
            if "error" in chunk:
                seen["errors"] += chunk["error"].get("code") == "engine_crashed"
            elif chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                seen["deltas"] += 1
                if seen["deltas"] == 1:
                    streaming.release()
    seen["ended_s"] = time.monotonic()
    return seen


async def _kill(base_url: str, parent: int, streams: int) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=streams + 8)
    async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as c:
        streaming = asyncio.Semaphore(0)
        tasks = [asyncio.ensure_future(_stream(c, streaming)) for _ in range(streams)]
        for _ in range(streams):  # every stream has had a token: its row counts it
            await asyncio.wait_for(streaming.acquire(), 120)
        load_before = os.getloadavg()
        engine = _engine_pid(parent)
        killed = time.monotonic()
        killed_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        os.kill(engine, signal.SIGKILL)
        results = await asyncio.gather(*tasks)
        last_error_s = max(r["ended_s"] for r in results) - killed
        ok = sum(1 for r in results if r["errors"] == 1 and not r["done"])
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        while (await c.post("/v1/chat/completions", json=body)).status_code != 200:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        back_s = time.monotonic() - killed
    replacement = _engine_pid(parent)
    return {
        # The replacement's start (the kernel's, to a clock tick) after the kill:
        # the supervisor's back-off; first_200 less it is the new engine's
        # start and a worker's next try of its socket.
        "engine_started_after_kill_s": _started_boot_s(replacement) - killed_boot,
        "streams": streams,
        "one_engine_crashed_no_done": ok,
        "last_error_after_kill_s": last_error_s,
        "first_200_after_kill_s": back_s,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "results": results,
    }


def _engine_pid(parent: int) -> int:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                command = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent and (
                b"--engine-serve" in command
            ):
                return int(entry.name)
    raise LookupError("no engine process")


def _started_boot_s(pid: int) -> float:
    """When ``pid`` started, seconds since boot (``CLOCK_BOOTTIME``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")  # starttime, in ticks


def _rows(ledger: Path, results: list[dict[str, Any]]) -> dict[str, int]:
    """The streams' ledger rows once all are written (or ``ROWS_GIVE_UP_S``)."""
    streamed = {r["id"]: r["deltas"] for r in results}
    deadline = time.monotonic() + ROWS_GIVE_UP_S
    while True:
        rows = {r.request_id: r for r in read_rows(ledger) if r.request_id in streamed}
        if len(rows) == len(streamed) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    errored = [r for r in rows.values() if r.end_state == "errored"]
    return {
        "closed": len(rows),
        "errored": len(errored),
        "errored_with_streamed_tokens": sum(
            1 for r in errored if r.completion_tokens >= streamed[r.request_id] > 0
        ),
        "missing": len(streamed) - len(rows),
    }


def kill(args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="sluicegate-bench-"))
    text = folder / "text.txt"
    text.write_text(" ".join(f"w{i}" for i in range(4000)))  # longer than the run
    ledger = folder / "ledger.sqlite3"
    redis, redis_process = _redis() if args.workers > 1 else ("", None)
    workers = ["--workers", str(args.workers)]
    if args.workers > 1:
        workers += ["--redis", redis]
    command = serve_command(
        port, "--engine-process", *workers, "--engine", "scripted",
        "--scripted-rate", "20", "--scripted-text", str(text),
        "--scripted-max-running", str(args.streams),
        "--scripted-max-queued", str(args.streams), "--ledger", str(ledger),
        "--log-level", "warning",
    )  # fmt: skip
    try:
        with ServerProcess(command, port, name="kill", cwd=ROOT) as server:
            # The engine's first start, as the restart's is bounded by it: from
            # the engine process's start to the first ready answer (with the
            # workers starting beside it, so at most this).
            server.wait_ready("/ready", timeout_s=120, interval_s=0.01)
            ready_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
            first_start_s = ready_boot - _started_boot_s(_engine_pid(server.pid))
            run = asyncio.run(_kill(server.base_url, server.pid, args.streams))
            run["engine_first_start_s"] = first_start_s
            run["ledger_rows"] = _rows(ledger, run.pop("results"))
    finally:
        if redis_process is not None:
            redis_process.terminate()
            redis_process.wait(10)
    run["workers"] = args.workers
    rows = run["ledger_rows"]
    print(
        f"load {run['load_before'][0]:.1f} -> {run['load_after'][0]:.1f}: "
        f"{run['one_engine_crashed_no_done']}/{args.streams} streams ended with one "
        f"engine_crashed and no [DONE]; last error "
        f"{run['last_error_after_kill_s']:.3f} s after the kill; first 200 after "
        f"{run['first_200_after_kill_s']:.2f} s (the new engine started "
        f"{run['engine_started_after_kill_s']:.2f} s after the kill; its first start "
        f"took {run['engine_first_start_s']:.2f} s); ledger rows closed "
        f"{rows['closed']}/{args.streams}, errored {rows['errored']}, with the "
        f"tokens streamed {rows['errored_with_streamed_tokens']}",
        flush=True,
    )
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "mode", nargs="?", choices=["compare", "kill"], default="compare"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--first-round",
        type=int,
        default=0,
        help="the first round's number (compare): the order alternates by it,"
        " so rounds run one per command keep alternating",
    )
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompt-words", type=int, default=32)
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument(
        "--workers", type=int, default=1, help="front-end workers (kill)"
    )
    parser.add_argument("--threads", type=int, help="llama.cpp threads (compare)")
    parser.add_argument("--json", type=Path, help="where to write the results")
    args = parser.parse_args(argv)
    started = os.getloadavg()
    print(f"load average: {started}", flush=True)
    results = kill(args) if args.mode == "kill" else compare(args)
    report = {
        "benchmark": "engine_process",
        "mode": args.mode,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "args": {k: str(v) for k, v in vars(args).items()},
        "load_at_start": started,
        "load_at_end": os.getloadavg(),
        **results,
    }
    out = args.json or RESULTS / f"engine-process-{args.mode}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
