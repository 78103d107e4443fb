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
servers alternates between rounds.

``kill``: ``--streams`` scripted streams through ``--engine-process``
(the scripted engine there, paced), then SIGKILL of the engine process:
reported are the seconds from the kill to the last stream's in-band error,
how many streams ended with exactly one ``engine_crashed`` error and no
``[DONE]``, and the seconds to the first 200 after the kill.

Not a test: nothing here asserts a timing. The machine's load average is
printed with every figure (a shared machine makes them noisy).

Run: ``.venv/bin/python bench/engine_process.py [compare|kill] [--rounds 2]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from sluicegate.testing import ServerProcess, free_port, serve_command

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


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


def compare(args: argparse.Namespace) -> None:
    redis, redis_process = _redis()
    rows: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for round_ in range(args.rounds):
                kinds = ["one", "split"] if round_ % 2 == 0 else ["split", "one"]
                for kind in kinds:
                    log = Path(tmp) / f"{kind}.log"
                    with _serve(kind, redis, log, args.threads) as server:
                        url = server.base_url
                        _bench(url, args, Path(tmp) / "warm.json", 16)
                        load = os.getloadavg()[0]
                        summary = _bench(url, args, Path(tmp) / "b.json", args.requests)
                    row = {"round": round_, "server": kind, "load1": load, **summary}
                    rows.append(row)
                    print(json.dumps(_short(row)), flush=True)
    finally:
        redis_process.terminate()
        redis_process.wait(10)
    for round_ in range(args.rounds):
        one, split = (
            next(r for r in rows if r["round"] == round_ and r["server"] == k)
            for k in ("one", "split")
        )
        tokens = split["output_tokens_per_s"] / one["output_tokens_per_s"]
        ttft = _p(split, "ttft_s", "p50") / _p(one, "ttft_s", "p50")
        print(f"round {round_}: tok/s split/one {tokens:.3f}, TTFT p50 {ttft:.3f}")


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
    }


async def _stream(client: httpx.AsyncClient, ended: list[float]) -> tuple[int, bool]:
    body = {
        "messages": [{"role": "user", "content": "Go"}],
        "max_tokens": 2000,
        "stream": True,
    }
    errors, done = 0, False
    async with client.stream("POST", "/v1/chat/completions", json=body) as live:
        async for line in live.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data:") and '"error"' in line:
                errors += '"engine_crashed"' in line
    ended.append(time.monotonic())
    return errors, done


async def _kill(base_url: str, parent: int, streams: int) -> None:
    limits = httpx.Limits(max_connections=streams + 8)
    async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as c:
        ended: list[float] = []
        tasks = [asyncio.ensure_future(_stream(c, ended)) for _ in range(streams)]
        while (await c.get("/engine/stats")).json()["running"] < streams:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)
        engine = _engine_pid(parent)
        killed = time.monotonic()
        os.kill(engine, signal.SIGKILL)
        results = await asyncio.gather(*tasks)
        last_error_s = max(ended) - killed
        ok = sum(1 for errors, done in results if errors == 1 and not done)
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        while (await c.post("/v1/chat/completions", json=body)).status_code != 200:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        back_s = time.monotonic() - killed
    print(
        f"load {os.getloadavg()[0]:.1f}: {ok}/{streams} streams ended with one "
        f"engine_crashed and no [DONE]; last error {last_error_s:.3f} s after the "
        f"kill; first 200 after {back_s:.2f} s"
    )


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


def kill(args: argparse.Namespace) -> None:
    port = free_port()
    text = Path(tempfile.mkdtemp(prefix="sluicegate-bench-")) / "text.txt"
    text.write_text(" ".join(f"w{i}" for i in range(4000)))  # longer than the run
    command = serve_command(
        port, "--engine-process", "--engine", "scripted", "--scripted-rate", "20",
        "--scripted-text", str(text),
        "--scripted-max-running", str(args.streams),
        "--scripted-max-queued", str(args.streams), "--no-ledger",
        "--log-level", "warning",
    )  # fmt: skip
    with ServerProcess(command, port, name="kill", cwd=ROOT) as server:
        server.wait_ready("/health", timeout_s=120)
        asyncio.run(_kill(server.base_url, server.pid, args.streams))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "mode", nargs="?", choices=["compare", "kill"], default="compare"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompt-words", type=int, default=32)
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--threads", type=int, help="llama.cpp threads (compare)")
    args = parser.parse_args()
    print(f"load average: {os.getloadavg()}")
    if args.mode == "kill":
        kill(args)
    else:
        compare(args)


if __name__ == "__main__":
    main()
