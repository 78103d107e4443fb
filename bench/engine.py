"""The local engine against llama.cpp's own server, side by side, turn by turn.

``sluicegate serve`` and ``llama-server`` (llama.cpp's C++ server, built by
``bench/llama-server.sh`` from the llama.cpp that sluicegate's llama-cpp-python
vendors, with the same ggml flags) run on the same GGUF file with the same
shape: ``--parallel`` slots, ``--n-ctx`` KV cells unified across them, the same
threads. Both are up for the whole run and take turns, run by run (this VM's
speed drifts by about 10% over minutes, and other work shares its cores): at
each concurrency (1, 4, 8, 16 streams) and prompt (about 20 and about 1,000
tokens), ``--repeats`` runs each, greedy, ``--max-tokens`` per stream with EOS
ignored, streamed ``/v1/completions``. Every prompt starts with its own tag,
so neither server reuses a cached prefix in these rows.

Reported per cell: output tokens/s of all streams together (the median run),
time to first token and the gap between text events (p50, p99 over all streams
of all runs), the server's CPU time per output token (all its threads; less
moved by other work on the machine than wall time, though spinning threads
count), and the 1-minute load average before and after the cell. Then two more
figures: ``interference``, 15 streams decoding when one ~4,000-token prompt
arrives (their gaps before it and while it is read, and its time to first
token); and ``prefix``, the time to first token of a ~1,000-token prompt when
its first part was read by an earlier request and when it was not, with the
``cached_tokens`` each server reports. Prints tables and writes
``bench/results/engine.json``. Not a test: nothing here asserts a timing.

Run: ``.venv/bin/python bench/engine.py [--repeats 3] [--concurrency 1,16]``
(``--sluicegate-args`` / ``--llama-server-args`` add flags to one side).
``--before-src DIR`` puts ``sluicegate-before`` (the same ``serve`` command on
the ``src`` folder of another checkout, a worktree of an older commit) where
llama-server was: the code before a change against the code now, turn by turn.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from engine_load import Stream, percentile, run_streams, stream_once, summary
from rich.console import Console
from rich.table import Table

from sluicegate.model import default_model_path
from sluicegate.testing import ServerNotReady, ServerProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "engine.json"
SHORT = "Once upon a time, in a lighthouse by the sea, there lived"
SYSTEMS = ("sluicegate", "llama-server")
BEFORE = "sluicegate-before"
STEPS = "sluicegate-steps.jsonl"


def systems(args: argparse.Namespace) -> tuple[str, str]:
    """The two systems of this run: sluicegate and llama-server, or sluicegate
    and sluicegate on ``--before-src``."""
    return (SYSTEMS[0], BEFORE) if args.before_src else SYSTEMS


def _filler(n: int, tag: str) -> str:
    """About ``26 * n`` tokens of varied, deterministic text (the default model;
    more with a longer ``tag``)."""
    return " ".join(
        f"Keeper {tag} of lighthouse {i} counted {(i * 7) % 13} ships and "
        f"{(i * 11) % 17} gulls before the dawn of day {i}."
        for i in range(n)
    )


def prompt(kind: str, tag: str) -> str:
    """A prompt of ``kind`` (``short`` ~20 tokens, ``long`` 980-1,050 with this
    script's tags) starting with ``tag``, so that no two requests share more
    than a few tokens."""
    if kind == "short":
        return f"Note {tag}. {SHORT}"
    return f"Note {tag}. {_filler(32, tag)} {SHORT}"


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) process ``pid`` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def llama_server_binary() -> str:
    """The path of ``llama-server``, built by ``bench/llama-server.sh`` if not yet."""
    return subprocess.run(
        ["bash", str(ROOT / "bench" / "llama-server.sh")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()[-1]


def start_servers(args: argparse.Namespace, logs: Path) -> dict[str, ServerProcess]:
    """Both servers, ready; stopped by the caller."""
    model = str(default_model_path())
    t, ctx, par = str(args.threads), str(args.n_ctx), str(args.parallel)
    ports = {name: free_port() for name in systems(args)}
    ours = [sys.executable, "-m", "sluicegate", "serve", "--port"]
    ours += [str(ports["sluicegate"]), "--parallel", par, "--n-ctx", ctx]
    if not args.no_prefix_cache:
        ours += ["--prefix-cache"]  # as cache_prompt, on by default in llama-server
    ours += ["--threads", t, "--log-level", "warning"]
    ours += shlex.split(args.sluicegate_args)
    other, env = systems(args)[1], {}
    if args.before_src:
        theirs = [*ours[:5], str(ports[other]), *ours[6:]]
        env = {"PYTHONPATH": str(args.before_src.resolve())}
    else:
        theirs = [llama_server_binary(), "-m", model, "--port", str(ports[other])]
        theirs += ["-c", ctx, "-np", par, "-t", t, "-tb", t, "-kvu", "-a", "default"]
        theirs += shlex.split(args.llama_server_args)
    if args.step_log:
        trace = ROOT / "bench" / "step_trace.py"
        ours = [sys.executable, str(trace), str(logs / STEPS), *ours[3:]]
    servers: dict[str, ServerProcess] = {}
    try:
        for name, cmd, health in [
            ("sluicegate", ours, "/health"),
            (other, theirs, "/health"),
        ]:
            log = logs / f"{name}.log"
            server = ServerProcess(
                cmd, ports[name], log_path=log, env=env if name == BEFORE else None
            )
            servers[name] = server
            server.wait_ready(health, timeout_s=180, interval_s=0.5)
            asyncio.run(run_streams(ports[name], [prompt("short", "warm")], 4))
    except (ServerNotReady, RuntimeError):
        for server in servers.values():
            server.stop(timeout_s=30)
        raise
    return servers


def write_report(
    args: argparse.Namespace, rows: list[dict[str, Any]], extras: list[dict[str, Any]]
) -> None:
    """The JSON results so far (written after every cell: a slow run that is
    stopped keeps what it measured)."""
    report = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "args": {k: str(v) for k, v in vars(args).items()},
        "rows": rows,
        "extras": extras,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")


def measure_cells(
    servers: dict[str, ServerProcess],
    args: argparse.Namespace,
    rows: list[dict[str, Any]],
) -> None:
    """Every (prompt kind, concurrency) cell, the systems taking turns."""
    names = systems(args)
    for kind in args.prompts.split(","):
        for level in [int(c) for c in args.concurrency.split(",")]:
            Console().print(f"{kind} prompts, {level} streams")
            load = os.getloadavg()[0]
            runs: dict[str, list[tuple[list[Stream], float]]] = {s: [] for s in names}
            cpu = dict.fromkeys(names, 0.0)
            for r in range(args.repeats):
                prompts = [
                    prompt(kind, f"{kind[0]}{level}r{r}s{i}") for i in range(level)
                ]
                order = names if r % 2 == 0 else names[::-1]
                for name in order:
                    server = servers[name]
                    before = cpu_s(server.pid)
                    runs[name].append(
                        asyncio.run(run_streams(server.port, prompts, args.max_tokens))
                    )
                    cpu[name] += cpu_s(server.pid) - before
            ratios = [
                sum(s.tokens for s in a[0])
                / a[1]
                / (sum(s.tokens for s in b[0]) / b[1])
                for a, b in zip(runs[names[0]], runs[names[1]], strict=True)
            ]
            for name in names:
                row = {
                    "system": name,
                    "prompt": kind,
                    "streams": level,
                    "load_1m": load,
                }
                row |= summary(runs[name])
                tokens = sum(s.tokens for streams, _ in runs[name] for s in streams)
                row["cpu_ms_per_tok"] = 1000 * cpu[name] / max(tokens, 1)
                row["load_1m_after"] = os.getloadavg()[0]
                if name == "sluicegate":
                    row["ratio_tok_s"] = statistics.median(ratios)
                rows.append(row)
            write_report(args, rows, [])


async def _interference(
    port: int, max_tokens: int, settle_s: float
) -> dict[str, float]:
    """15 short streams decoding, then one ~4,000-token prompt among them;
    the 15 are closed once it has had its tokens."""
    start, start_unix_s = time.perf_counter(), time.time()
    done = asyncio.Event()
    shorts = [
        asyncio.ensure_future(
            stream_once(
                port,
                prompt("short", f"i{i}x{start:.0f}"),
                max_tokens,
                t0=start,
                stop=done,
            )
        )
        for i in range(15)
    ]
    await asyncio.sleep(settle_s)  # all 15 decoding (3 s is plenty on a quiet machine)
    long_text = f"Note L{start:.0f}. {_filler(152, 'L')}"  # ~4,000 tokens
    arrived = time.perf_counter() - start
    long_stream = await stream_once(port, long_text, 16, t0=start)
    read_until = long_stream.ttft_s
    done.set()
    streams = await asyncio.gather(*shorts)
    steady, during = [], []
    for s in streams:
        for at, gap in zip(s.token_times_s[1:], s.gaps_s, strict=True):
            if at < arrived:
                steady.append(gap)
            elif at - gap < read_until:
                during.append(gap)
    return {
        "steady_gap_p50_ms": 1000 * percentile(steady, 50),
        "steady_gap_p99_ms": 1000 * percentile(steady, 99),
        "during_gap_p50_ms": 1000 * percentile(during, 50),
        "during_gap_p99_ms": 1000 * percentile(during, 99),
        "during_gap_max_ms": 1000 * max(during, default=float("nan")),
        "p99_during_over_steady": percentile(during, 99) / percentile(steady, 99),
        "gaps_during": len(during),
        "long_ttft_ms": 1000 * (long_stream.ttft_s - arrived),
        "arrived_unix_s": start_unix_s + arrived,
        "read_unix_s": start_unix_s + read_until,
    }


def _steps_while_read(steps_log: Path, extra: dict[str, Any]) -> dict[str, Any]:
    """sluicegate's steps (``bench/step_trace.py``) from the long prompt's
    arrival to its first token: what each took and read, the decode-only
    steps just before it came, and the slowest steps with the pacer's
    estimates they were planned with."""
    steps = [json.loads(line) for line in steps_log.read_text().splitlines()]
    arrived, read = extra["arrived_unix_s"], extra["read_unix_s"]
    during = [s for s in steps if arrived <= s["t"] <= read and s["decoding"]]
    before = [
        s for s in steps if arrived - 5 <= s["t"] < arrived and s["decoding"] >= 15
    ][-10:]
    mixed = [s for s in during if s["read"]]
    slowest = sorted(during, key=lambda s: -s["elapsed_s"])[:5]

    def ms(s: dict[str, Any], key: str) -> float | None:
        return None if s[key] is None else round(1000 * s[key], 3)

    return {
        "steps_during": len(during),
        "mixed_steps": len(mixed),
        "mixed_step_p50_ms": 1000 * percentile([s["elapsed_s"] for s in mixed], 50),
        "decode_only_before_ms": [round(1000 * s["elapsed_s"], 1) for s in before],
        "step_ms_during": [round(1000 * s["elapsed_s"], 1) for s in during],
        "read_during": [s["read"] for s in during],
        "slowest_steps": [
            {
                "ms": round(1000 * s["elapsed_s"], 1),
                "decoding": s["decoding"],
                "read": s["read"],
                "estimate_ms": ms(s, "estimate_s"),
                "token_ms": ms(s, "token_s"),
            }
            for s in slowest
        ],
    }


async def _prefix(port: int, tag: str) -> dict[str, float]:
    """TTFT of a ~1,000-token prompt: read cold, then again with a new ending."""
    shared = f"Note {tag}. {_filler(32, tag)}"
    cold = await stream_once(port, f"{shared} Question one: who", 4)
    warm = await stream_once(port, f"{shared} Question two: what", 4)
    return {
        "cold_ttft_ms": 1000 * cold.ttft_s,
        "warm_ttft_ms": 1000 * warm.ttft_s,
        "warm_cached_tokens": warm.cached_tokens,
    }


def _table(title: str, rows: list[dict[str, Any]]) -> Table:
    """The rows' figures (not their lists, nor the clock readings) as a table."""
    table = Table(title=title)
    cols = [
        k
        for k in dict.fromkeys(k for row in rows for k in row)
        if not k.endswith("_unix_s")
        and all(not isinstance(row.get(k), list | dict) for row in rows)
    ]
    for col in cols:
        table.add_column(col, justify="right")
    for row in rows:
        values = [row.get(col, "") for col in cols]
        table.add_row(*(f"{v:.1f}" if isinstance(v, float) else str(v) for v in values))
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,4,8,16")
    parser.add_argument("--prompts", default="short,long")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs per cell and system"
    )
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--parallel", type=int, default=16)
    parser.add_argument("--n-ctx", type=int, default=8192)
    parser.add_argument("--sluicegate-args", default="")
    parser.add_argument("--llama-server-args", default="")
    parser.add_argument(
        "--before-src",
        type=Path,
        help="the src folder of another checkout (a worktree of an older commit):"
        " sluicegate-before, run on it, takes llama-server's place",
    )
    parser.add_argument("--no-extras", action="store_true", help="cells only")
    parser.add_argument(
        "--no-cells", action="store_true", help="the long prompt and prefix only"
    )
    parser.add_argument(
        "--no-prefix-cache",
        action="store_true",
        help="sluicegate as `serve` has it by default (finished sequences' KV cells "
        "freed), not with --prefix-cache",
    )
    parser.add_argument(
        "--extra-tokens",
        type=int,
        default=250,
        help="most tokens per stream among the 15 (closed when the long prompt has "
        "its tokens; 15 x 270 cells and the long prompt fill 8,192)",
    )
    parser.add_argument(
        "--settle-s", type=float, default=3.0, help="before the long prompt comes"
    )
    parser.add_argument(
        "--step-log",
        action="store_true",
        help="sluicegate's steps through bench/step_trace.py: the long prompt's "
        "run records the steps that ran while it was read",
    )
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args()
    console = Console(width=240)
    logs = Path(tempfile.mkdtemp(prefix="sluicegate-bench-"))
    servers = start_servers(args, logs)
    rows: list[dict[str, Any]] = []
    extras: list[dict[str, Any]] = []
    try:
        if not args.no_cells:
            measure_cells(servers, args, rows)
        for r in range(0 if args.no_extras else args.repeats):
            names = systems(args)
            for name in names if r % 2 == 0 else names[::-1]:
                console.print(f"{name}: one long prompt among 15 streams; prefix reuse")
                load = os.getloadavg()[0]
                port = servers[name].port
                extra = {"system": name, "run": r, "load_1m": load}
                extra |= asyncio.run(
                    _interference(port, args.extra_tokens, args.settle_s)
                )
                if args.step_log and name == "sluicegate":
                    extra |= _steps_while_read(logs / STEPS, extra)
                extra |= asyncio.run(_prefix(port, f"P{r}{name[0]}{time.time():.0f}"))
                extra["load_1m_after"] = os.getloadavg()[0]
                extras.append(extra)
                write_report(args, rows, extras)
    finally:
        for server in servers.values():
            server.stop(timeout_s=30)
    if rows:
        console.print(_table(f"{args.max_tokens} tokens per stream, greedy", rows))
    if extras:
        console.print(
            _table("a 4,000-token prompt among 15 streams; prefix reuse", extras)
        )
    console.print(f"wrote {args.json} (server logs in {logs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
