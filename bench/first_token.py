"""One request's path to its first token, timed inside sluicegate, beside llama-server.

``sluicegate serve`` runs here with timestamps at the points of a request's way
to its first token (the monotonic clock, which this client reads too): the
request reaching the app, its submission to the engine, the worker taking it
(after the loop ended the submitting callback), the first step's
``llama_decode`` and draw, the output reaching the event loop, and the first
text handed to the server to write. ``llama-server`` (built by
``bench/llama-server.sh``) runs beside it with the same shape as in
``bench/engine.py``; its log gives each request's prompt eval time. The two
take turns, one short streamed ``/v1/completions`` at a time (greedy, EOS
ignored), each prompt with its own first words.

Reported: time to first token (TTFT) p50 and mean per server, sluicegate's
segments (p50 over the requests), llama-server's prompt eval time, and the
load average before and after. Writes ``bench/results/first-token.json``. Not
a test.

Run: ``.venv/bin/python bench/first_token.py [--requests 30]``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import shlex
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "first-token.json"
POINTS = (
    "app",  # the ASGI app got the request (uvicorn parsed it)
    "submit",  # Generation.start() called the engine's generate()
    "wake",  # the worker woke for it, then waited for the loop's callback to end
    "step",  # the first step's llama_decode began (admitted, planned, batch filled)
    "stepped",  # the step's decode and draw ended
    "delivered",  # its output reached the event loop
    "sent",  # the first text went to the server's send
)
_PROMPT_EVAL = re.compile(r"prompt eval time =\s+([0-9.]+) ms")
_TEXT = re.compile(rb'"text":"(?!")')  # a chunk with text (compact JSON)


def _serve_with_points(events: Path, argv: list[str]) -> int:
    """``sluicegate serve`` (``argv``), writing ``<perf_counter> <point>`` lines."""
    out = events.open("a", buffering=1)
    lock = threading.Lock()

    def point(name: str) -> None:
        now = time.perf_counter()
        with lock:
            out.write(f"{now:.6f} {name}\n")

    import uvicorn

    from sluicegate.engines.llamacpp import engine as engine_module
    from sluicegate.engines.llamacpp import handoff

    make_config = uvicorn.Config.__init__

    def config(self: Any, app: Any, *args: Any, **kwargs: Any) -> None:
        async def timed(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http" or scope["path"] != "/v1/completions":
                await app(scope, receive, send)
                return
            point("app")
            first = True

            async def send_timed(message: Any) -> None:
                nonlocal first
                body = message.get("body", b"")
                if (
                    first
                    and message["type"] == "http.response.body"
                    and _TEXT.search(body)
                ):
                    first = False
                    point("sent")
                await send(message)

            await app(scope, receive, send_timed)

        make_config(self, timed, *args, **kwargs)

    uvicorn.Config.__init__ = config  # type: ignore[method-assign]
    engine_class = engine_module.LlamaCppEngine
    generate, step = engine_class.generate, engine_class._step
    after_current, deliver = handoff.after_current_callback, handoff.deliver

    def generate_timed(self: Any, request: Any) -> Any:
        point("submit")
        return generate(self, request)

    def after_current_timed(loop: Any) -> None:
        point("wake")
        after_current(loop)

    def step_timed(self: Any, plan: Any, fault: Any) -> None:
        point("step")
        step(self, plan, fault)
        point("stepped")

    def deliver_timed(items: Any) -> None:
        point("delivered")
        deliver(items)

    engine_class.generate = generate_timed  # type: ignore[method-assign]
    engine_class._step = step_timed  # type: ignore[method-assign]
    setattr(engine_module, "after_current_callback", after_current_timed)  # noqa: B010
    handoff.deliver = deliver_timed
    from sluicegate.cli import main

    return main(["serve", *argv])


def segments(events: Path) -> list[dict[str, float]]:
    """Per request (in order), ms from each point to the next, and ``total``."""
    requests: list[dict[str, float]] = []
    for line in events.read_text().splitlines():
        at, name = line.split()
        if name == "app":
            requests.append({})
        if requests and name not in requests[-1]:
            requests[-1][name] = float(at)
    rows = []
    for times in requests:
        if not all(p in times for p in POINTS):
            continue  # a request that never woke the worker (it was busy)
        row = {
            f"{a}->{b}": 1000 * (times[b] - times[a])
            for a, b in itertools.pairwise(POINTS)
        }
        row["total"] = 1000 * (times["sent"] - times["app"])
        rows.append(row)
    return rows


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve-with-points":
        return _serve_with_points(Path(sys.argv[2]), sys.argv[3:])
    sys.path.insert(0, str(ROOT / "bench"))
    from engine import llama_server_binary, prompt
    from engine_load import stream_once

    from sluicegate.model import default_model_path
    from sluicegate.testing import ServerProcess, free_port

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=30, help="per server")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--sluicegate-args", default="")
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="sluicegate-first-token-"))
    events = logs / "points.txt"
    events.touch()
    binary = llama_server_binary()
    t, ports = (
        str(args.threads),
        {"sluicegate": free_port(), "llama-server": free_port()},
    )
    ours = [sys.executable, __file__, "--serve-with-points", str(events), "--port"]
    ours += [str(ports["sluicegate"]), "--parallel", "16", "--n-ctx", "8192"]
    ours += ["--threads", t, "--log-level", "warning"]
    ours += shlex.split(args.sluicegate_args)
    theirs = [
        binary,
        "-m",
        str(default_model_path()),
        "--port",
        str(ports["llama-server"]),
    ]
    theirs += ["-c", "8192", "-np", "16", "-t", t, "-tb", t, "-kvu", "-a", "default"]
    servers = {
        "sluicegate": ServerProcess(
            ours, ports["sluicegate"], log_path=logs / "sg.log"
        ),
        "llama-server": ServerProcess(
            theirs, ports["llama-server"], log_path=logs / "ls.log"
        ),
    }
    ttft: dict[str, list[float]] = {name: [] for name in servers}
    try:
        for server in servers.values():
            server.wait_ready("/health", timeout_s=180, interval_s=0.5)

        async def run() -> None:
            for port in ports.values():
                for i in range(3):  # warm both
                    await stream_once(port, prompt("short", f"warm{i}"), 4)
            events.write_text("")
            for r in range(args.requests):
                order = list(servers) if r % 2 == 0 else list(servers)[::-1]
                for name in order:
                    text = prompt("short", f"t{r}{name[0]}{time.time():.0f}")
                    stream = await stream_once(ports[name], text, args.max_tokens)
                    ttft[name].append(1000 * stream.ttft_s)
                    await asyncio.sleep(0.05)  # both servers idle again

        load = os.getloadavg()[0]
        asyncio.run(run())
        load_after = os.getloadavg()[0]
    finally:
        for server in servers.values():
            server.stop(timeout_s=30)
    evals = [float(m) for m in _PROMPT_EVAL.findall((logs / "ls.log").read_text())]
    evals = evals[-args.requests :]  # the warm-up requests came first
    rows = segments(events)
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "args": {k: str(v) for k, v in vars(args).items()},
        "load_1m": load,
        "load_1m_after": load_after,
        "ttft_ms": {
            name: {
                "p50": statistics.median(v),
                "mean": statistics.mean(v),
                "min": min(v),
                "all": [round(x, 1) for x in v],
            }
            for name, v in ttft.items()
        },
        "sluicegate_segments_p50_ms": {
            key: statistics.median(row[key] for row in rows) for key in rows[0]
        }
        if rows
        else {},
        "sluicegate_requests_timed": len(rows),
        "llama_server_prompt_eval_ms_p50": statistics.median(evals) if evals else None,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "args"}, indent=1))
    print(f"wrote {args.json} (logs in {logs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
