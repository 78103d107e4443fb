"""Engine throughput: sluicegate over HTTP vs the bare llama.cpp loop vs a peer server.

For each concurrency (default 1, 2, 4, 8, 16) and the same prompt, measures output
tokens/s (all streams together) and time to first token for:

- ``bare``: the ceiling. A decode loop straight on the low-level llama.cpp bindings:
  one prefill per sequence, then one token per sequence per ``llama_decode`` with
  greedy sampling, no HTTP, no detokenizing.
- ``sluicegate``: ``sluicegate serve`` over HTTP, streaming completions.
- ``peer``: the ``llama-cpp-python[server]`` server on the same GGUF file, installed
  in ``bench/.peer-venv`` by ``bench/peer-venv.sh`` (skipped with ``--no-peer``).

Each system gets one warm-up request (the bare loop one warm-up prefill) before
timing; each cell is run ``--repeats`` times (default 9) and the median run is
shown. The bare loop and sluicegate take turns, run by run, at each concurrency
(this VM's speed drifts by about 10% over minutes), and their ratio is the median
of those paired runs' ratios. Prints a table and writes
``bench/results/engine.json``. Not a test: nothing here asserts a timing.

Run: ``.venv/bin/python bench/engine.py [--max-tokens 64] [--no-peer]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import h11
from rich.console import Console
from rich.table import Table

from sluicegate.core.sse import SSEDecoder
from sluicegate.model import default_model_path
from sluicegate.testing import ServerNotReady, ServerProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "engine.json"
PEER_PYTHON = ROOT / "bench" / ".peer-venv" / "bin" / "python"
PROMPT = "Once upon a time, in a lighthouse by the sea, there lived"
_FIRST_TEXT = re.compile(rb'"text": ?"[^"]')


@dataclass(frozen=True, slots=True)
class Row:
    """One (system, concurrency) measurement."""

    system: str
    concurrency: int
    output_tokens: int
    wall_s: float
    tokens_per_s: float
    ttft_p50_s: float
    ttft_max_s: float
    truncated: int


def bare_loop(
    model: Path, batch: int, max_tokens: int, threads: int, n_ctx: int, n_seq: int
) -> Row:
    """The ceiling: B sequences, one token each per llama_decode, greedy.

    The context has the server's shape (``n_ctx`` unified KV cells for ``n_seq``
    sequences): attention runs over the cells of the cache, so a smaller cache
    would make the ceiling faster than any server configured for 16 streams.
    """
    import llama_cpp as llama

    from sluicegate.engines.llamacpp_vocab import LlamaTokenizer, quiet_logs

    quiet_logs()
    mparams = llama.llama_model_default_params()
    mdl = llama.llama_model_load_from_file(str(model).encode(), mparams)
    vocab = LlamaTokenizer(mdl)
    prompt = vocab.encode(PROMPT, add_special=True, parse_special=False)
    cparams = llama.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = cparams.n_ubatch = max(256, batch)
    cparams.n_seq_max = n_seq
    cparams.n_threads = cparams.n_threads_batch = threads
    cparams.kv_unified = True
    ctx = llama.llama_init_from_model(mdl, cparams)
    lb = llama.llama_batch_init(max(256, batch), 0, 1)
    samplers = []
    for _ in range(batch):
        chain = llama.llama_sampler_chain_init(
            llama.llama_sampler_chain_default_params()
        )
        llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_greedy())
        samplers.append(chain)

    def fill(entries: list[tuple[int, int, int, bool]]) -> None:
        for i, (token, pos, seq, logits) in enumerate(entries):
            lb.token[i], lb.pos[i], lb.n_seq_id[i] = token, pos, 1
            lb.seq_id[i][0], lb.logits[i] = seq, int(logits)
        lb.n_tokens = len(entries)

    # Warm-up, as the servers get one request before timing: the first decode
    # of a context allocates its compute buffers.
    fill([(t, p, 0, p == len(prompt) - 1) for p, t in enumerate(prompt)])
    llama.llama_decode(ctx, lb)
    llama.llama_memory_seq_rm(llama.llama_get_memory(ctx), -1, -1, -1)
    start = time.perf_counter()
    last = []
    ttfts = []
    for seq in range(batch):  # one prefill per sequence, as a server would
        fill([(t, p, seq, p == len(prompt) - 1) for p, t in enumerate(prompt)])
        llama.llama_decode(ctx, lb)
        last.append(llama.llama_sampler_sample(samplers[seq], ctx, len(prompt) - 1))
        ttfts.append(time.perf_counter() - start)
    produced = batch
    for step in range(1, max_tokens):
        fill([(last[s], len(prompt) + step - 1, s, True) for s in range(batch)])
        llama.llama_decode(ctx, lb)
        last = [llama.llama_sampler_sample(samplers[s], ctx, s) for s in range(batch)]
        produced += batch
    wall = time.perf_counter() - start
    for chain in samplers:
        llama.llama_sampler_free(chain)
    llama.llama_batch_free(lb)
    llama.llama_free(ctx)
    llama.llama_model_free(mdl)
    return Row(
        "bare",
        batch,
        produced,
        wall,
        produced / wall,
        statistics.median(ttfts),
        max(ttfts),
        0,
    )


async def _one_stream(
    port: int, model: str, max_tokens: int
) -> tuple[int, float, bool]:
    """(completion tokens, time to first token in s, finished cleanly).

    The load client shares the 2 cores with the server, and every microsecond it
    takes per event is one the server's llama.cpp threads lose: while streaming
    it only keeps the bytes (raw asyncio, no HTTP parser) and looks for the
    first non-empty text. The response is parsed (h11, then SSE) after it ended,
    outside the timed work of the server.

    Raises:
        RuntimeError: the status was not 200.
    """
    body = json.dumps(
        {
            "model": model,
            "prompt": PROMPT,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Accept: text/event-stream\r\nConnection: close\r\n\r\n"
    ).encode()
    start = time.perf_counter()
    ttft = float("nan")
    received: list[bytes] = []
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + body)
        while data := await reader.read(65536):
            received.append(data)
            if ttft != ttft and _FIRST_TEXT.search(b"".join(received)):
                ttft = time.perf_counter() - start
    finally:
        writer.close()
    chunks = 0
    usage_tokens: int | None = None
    done = False
    for event in SSEDecoder().feed(_response_body(b"".join(received))):
        if event.data == "[DONE]":
            done = True
            continue
        payload = json.loads(event.data)
        if payload.get("usage"):
            usage_tokens = payload["usage"]["completion_tokens"]
        chunks += sum(1 for c in payload.get("choices", []) if c.get("text"))
    return (usage_tokens if usage_tokens is not None else chunks), ttft, done


def _response_body(raw: bytes) -> bytes:
    """The body of one raw HTTP/1.1 response (chunked or not), parsed by h11.

    Raises:
        RuntimeError: the status was not 200.
    """
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="POST", target="/", headers=[("Host", "x")]))
    conn.receive_data(raw)
    conn.receive_data(b"")  # the server closed the connection
    parts: list[bytes] = []
    while True:
        event = conn.next_event()
        if isinstance(event, h11.Response) and event.status_code != 200:
            raise RuntimeError(f"status {event.status_code}")
        if isinstance(event, h11.Data):
            parts.append(bytes(event.data))
        if event is h11.NEED_DATA or isinstance(event, h11.EndOfMessage):
            return b"".join(parts)
        if isinstance(event, h11.ConnectionClosed):
            return b"".join(parts)


async def http_run(
    system: str, port: int, model: str, concurrency: int, max_tokens: int
) -> Row:
    """C concurrent streaming completions against an OpenAI-compatible server."""
    start = time.perf_counter()
    results = await asyncio.gather(
        *(_one_stream(port, model, max_tokens) for _ in range(concurrency)),
        return_exceptions=True,
    )
    wall = time.perf_counter() - start
    ok = [r for r in results if isinstance(r, tuple)]
    tokens = sum(r[0] for r in ok)
    ttfts = [r[1] for r in ok if r[1] == r[1]] or [float("nan")]
    truncated = sum(1 for r in results if not isinstance(r, tuple) or not r[2])
    return Row(
        system,
        concurrency,
        tokens,
        wall,
        tokens / wall,
        statistics.median(ttfts),
        max(ttfts),
        truncated,
    )


def _median(runs: Iterable[Row]) -> Row:
    """The run with the median tokens/s (this 2-core VM varies by ~10% per run)."""
    ordered = sorted(runs, key=lambda r: r.tokens_per_s)
    return ordered[len(ordered) // 2]


def _start(cmd: list[str], port: int, health: str, log: Path) -> ServerProcess:
    server = ServerProcess(cmd, port, log_path=log)
    try:
        server.wait_ready(health, timeout_s=180, interval_s=0.5)
    except ServerNotReady:
        server.stop(timeout_s=30)
        raise
    return server


def _measure_server(
    system: str,
    label: str,
    cmd: list[str],
    port: int,
    health: str,
    logs: Path,
    levels: list[int],
    args: argparse.Namespace,
) -> list[Row]:
    """Start one server, warm it up, measure every concurrency, stop it."""
    server = _start(cmd, port, health, logs / f"{system}.log")
    rows = []
    try:
        asyncio.run(http_run("warm-up", port, "default", 1, 4))
        for c in levels:
            Console().print(f"{label}, concurrency {c}")
            rows.append(
                _median(
                    asyncio.run(http_run(system, port, "default", c, args.max_tokens))
                    for _ in range(args.repeats)
                )
            )
    finally:
        server.stop(timeout_s=30)
    return rows


def _measure_paired(
    model: Path,
    cmd: list[str],
    port: int,
    logs: Path,
    levels: list[int],
    args: argparse.Namespace,
    n_ctx: int,
) -> tuple[list[Row], list[Row], dict[int, float]]:
    """The bare loop and sluicegate, run after run in turn at each concurrency.

    This VM's speed drifts by about 10% over minutes: two medians taken minutes
    apart compare the drift as much as the systems. Run back to back, repeat
    after repeat, the two share it, and the median of the paired ratios
    (sluicegate / bare, returned per concurrency) is much steadier.
    """
    server = _start(cmd, port, "/health", logs / "sluicegate.log")
    top = max(levels)
    bare_rows: list[Row] = []
    our_rows: list[Row] = []
    ratios: dict[int, float] = {}
    try:
        asyncio.run(http_run("warm-up", port, "default", 1, 4))
        for c in levels:
            Console().print(f"bare loop and sluicegate over HTTP, concurrency {c}")
            pairs = []
            for _ in range(args.repeats):
                bare = bare_loop(model, c, args.max_tokens, args.threads, n_ctx, top)
                ours = asyncio.run(
                    http_run("sluicegate", port, "default", c, args.max_tokens)
                )
                pairs.append((bare, ours))
            bare_rows.append(_median(b for b, _ in pairs))
            our_rows.append(_median(o for _, o in pairs))
            ratios[c] = statistics.median(
                o.tokens_per_s / b.tokens_per_s for b, o in pairs
            )
    finally:
        server.stop(timeout_s=30)
    return bare_rows, our_rows, ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,2,4,8,16")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--repeats", type=int, default=9, help="runs per cell; the median is shown"
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    model = default_model_path()
    top = max(levels)
    n_ctx = top * (64 + args.max_tokens) + 256
    rows: list[Row] = []
    console = Console()
    logs = Path(tempfile.mkdtemp(prefix="sluicegate-bench-"))

    port = free_port()
    ours = [sys.executable, "-m", "sluicegate", "serve", "--port", str(port)]
    ours += ["--parallel", str(top), "--n-ctx", str(n_ctx), "--log-level", "warning"]
    ours += ["--threads", str(args.threads)]
    bare_rows, our_rows, ratios = _measure_paired(
        model, ours, port, logs, levels, args, n_ctx
    )
    rows += bare_rows + our_rows

    if not args.no_peer:
        if not PEER_PYTHON.exists():
            subprocess.run(["bash", str(ROOT / "bench" / "peer-venv.sh")], check=True)
        port = free_port()
        peer = [str(PEER_PYTHON), "-m", "llama_cpp.server", "--model", str(model)]
        peer += ["--port", str(port), "--n_ctx", str(n_ctx)]
        peer += ["--n_threads", str(args.threads), "--model_alias", "default"]
        rows += _measure_server(
            "peer",
            "llama-cpp-python server",
            peer,
            port,
            "/v1/models",
            logs,
            levels,
            args,
        )

    table = Table(title=f"output tokens/s, {args.max_tokens} tokens per stream")
    for col in ["system", "streams", "tok/s", "TTFT p50 s", "TTFT max s", "truncated"]:
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r.system,
            str(r.concurrency),
            f"{r.tokens_per_s:.1f}",
            f"{r.ttft_p50_s:.3f}",
            f"{r.ttft_max_s:.3f}",
            str(r.truncated),
        )
    console.print(table)
    console.print(
        "sluicegate / bare loop, median of the paired runs: "
        + ", ".join(f"{c} streams {r:.0%}" for c, r in ratios.items())
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "max_tokens": args.max_tokens,
        "threads": args.threads,
        "repeats": args.repeats,
        "rows": [asdict(r) for r in rows],
        "sluicegate_vs_bare": {str(c): r for c, r in ratios.items()},
    }
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"wrote {args.json} (server logs in {logs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
