"""Python function calls per streamed token through the whole server, in-process.

A machine-independent measure of the per-token path: the app (``create_app``)
in front of a scripted engine streams ``--streams`` completions of ``--tokens``
tokens each to in-memory ASGI clients (no sockets, every write accepted at
once, so the eager writer writes each token from the engine's callback), under
``cProfile``; the figure is the profiler's call count divided by the tokens
streamed. Wall time on a loaded 2-core machine wanders by tens of percent; the
call count of one code version does not (it moves by a few hundredths with how
the streams interleave), so a change on the per-token path shows as a change
here even where ``bench/streams.py`` cannot tell it from noise.

Side by side: ``--against REV`` runs the same measurement, in a child process,
on the source tree of a git revision (checked out with ``git worktree`` into a
temporary folder, imported before the installed package), e.g. the release
before a refactor. The calls themselves differ in cost: this says how many, not
how long.

Prints a table (the totals, then the functions whose calls per token differ
most between the two) and writes ``bench/results/calls.json``. Not a test.

Run: ``.venv/bin/python bench/calls.py [--against REV] [--streams 50] [--tokens 200]``
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import platform
import pstats
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "calls.json"
_SRC = re.compile(r".*/src/(sluicegate/.*)$")


async def _stream(app: Any, tokens: int) -> int:
    """One streamed completion through ``app``; returns the body writes."""
    body = json.dumps(
        {"prompt": "Hi", "max_tokens": tokens, "ignore_eos": True, "stream": True}
    ).encode()
    gone = asyncio.Event()
    requested = False
    writes = 0

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal writes
        writes += message["type"] == "http.response.body"

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/completions",
        "raw_path": b"/v1/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("bench", 80),
    }
    await app(scope, receive, send)
    return writes


async def _measure(streams: int, tokens: int) -> dict[str, Any]:
    from sluicegate.engines.scripted.engine import ScriptedEngine
    from sluicegate.server.app.factory import create_app
    from sluicegate.server.config import ServerConfig

    engine = ScriptedEngine(
        "word " * 400, tokens_per_s=2000, max_running=streams, max_queued=streams
    )
    app = create_app(engine, ServerConfig())
    async with app.router.lifespan_context(app):
        await asyncio.gather(*[_stream(app, tokens) for _ in range(5)])  # warm up
        profile = cProfile.Profile()
        profile.enable()
        writes = await asyncio.gather(*[_stream(app, tokens) for _ in range(streams)])
        profile.disable()
    stats = pstats.Stats(profile)
    streamed = streams * tokens
    per_function: dict[str, float] = {}
    for (path, _line, name), (_, calls, *_rest) in stats.stats.items():  # type: ignore[attr-defined]
        match = _SRC.match(path)
        where = f"{match.group(1)}:{name}" if match else f"{Path(path).name}:{name}"
        per_function[where] = per_function.get(where, 0.0) + calls / streamed
    return {
        "calls_per_token": stats.total_calls / streamed,  # type: ignore[attr-defined]
        "writes_per_stream": sum(writes) / streams,
        "functions": {k: round(v, 3) for k, v in per_function.items() if v >= 0.05},
    }


def _measure_revision(rev: str, streams: int, tokens: int) -> dict[str, Any]:
    """``_measure`` on the source of git revision ``rev``, in a child process."""
    with tempfile.TemporaryDirectory(prefix="sluicegate-calls-") as folder:
        tree = Path(folder) / "tree"
        subprocess.run(
            [
                "git",
                "-C",
                str(ROOT),
                "worktree",
                "add",
                "--detach",
                "-q",
                str(tree),
                rev,
            ],
            check=True,
        )
        try:
            # Not measured by a coverage run around this one: its files are
            # gone by the time that run's report is written.
            env = {k: v for k, v in os.environ.items() if not k.startswith("COVERAGE")}
            env["PYTHONPATH"] = str(tree / "src")
            child = subprocess.run(
                [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "--child",
                    "--streams",
                    str(streams),
                    "--tokens",
                    str(tokens),
                ],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            )
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                check=True,
            )
    result: dict[str, Any] = json.loads(child.stdout)
    return result


def _revision(rev: str) -> str:
    out = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", rev],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", metavar="REV", help="a git revision to compare")
    parser.add_argument("--streams", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--json", type=Path, default=RESULTS, help="where to write")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:  # a revision's run: print its figures for the parent
        print(json.dumps(asyncio.run(_measure(args.streams, args.tokens))))
        return 0

    from rich.console import Console
    from rich.table import Table

    runs = {"this tree": asyncio.run(_measure(args.streams, args.tokens))}
    if args.against:
        label = f"{args.against} ({_revision(args.against)})"
        runs[label] = _measure_revision(args.against, args.streams, args.tokens)
    console = Console()
    table = Table(title=f"calls per token: {args.streams} streams x {args.tokens}")
    table.add_column("source")
    table.add_column("calls / token", justify="right")
    table.add_column("writes / stream", justify="right")
    for label, run in runs.items():
        table.add_row(
            label, f"{run['calls_per_token']:.1f}", f"{run['writes_per_stream']:.0f}"
        )
    console.print(table)
    if len(runs) == 2:
        ours, theirs = (run["functions"] for run in runs.values())
        names = sorted(
            set(ours) | set(theirs),
            key=lambda n: -abs(ours.get(n, 0.0) - theirs.get(n, 0.0)),
        )
        diff = Table(title="functions whose calls per token differ most")
        diff.add_column("function")
        for label in runs:
            diff.add_column(label, justify="right")
        for name in names[:12]:
            if abs(ours.get(name, 0.0) - theirs.get(name, 0.0)) < 0.5:
                break
            diff.add_row(
                name, f"{ours.get(name, 0.0):.2f}", f"{theirs.get(name, 0.0):.2f}"
            )
        console.print(diff)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": "calls",
        "unit": "python_calls_per_token",
        "python": platform.python_version(),
        "streams": args.streams,
        "tokens": args.tokens,
        "runs": runs,
    }
    args.json.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
