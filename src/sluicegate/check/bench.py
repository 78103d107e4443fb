"""``sluicegate bench``: a streaming load generator (asyncio + ``AsyncClient``).

Requests go out either at a fixed concurrency (a new one as soon as one ends) or
at a fixed rate (requests per second, whatever is in flight), until a request
count or a duration is reached. Every request is one ``StreamResult``; the
statistics are ``check.stats.summarize``.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import anyio
import httpx
import orjson
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from sluicegate.check.stats import Summary, summarize
from sluicegate.client import AsyncClient, StreamResult, Timeouts

__all__ = ["add_bench", "load_prompts", "run_bench"]

_N = TypeVar("_N", int, float)

WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog")


def add_bench(sub: Any) -> None:
    """Register ``bench`` on the ``sluicegate`` subparsers."""
    bench = sub.add_parser("bench", help="load-test an OpenAI-compatible endpoint")
    bench.add_argument("url", nargs="?", default="http://127.0.0.1:8000")
    bench.add_argument("--model", help="model name (default: the first listed)")
    bench.add_argument("--api-key", help="sent as a bearer token")
    load = bench.add_mutually_exclusive_group()
    load.add_argument(
        "--concurrency", type=_positive(int), default=4, help="requests in flight"
    )
    load.add_argument(
        "--rate", type=_positive(float), help="requests per second (open loop)"
    )
    bench.add_argument(
        "--requests", type=_positive(int), default=32, help="requests to send"
    )
    bench.add_argument(
        "--duration-s", type=_positive(float), help="stop sending after this"
    )
    bench.add_argument(
        "--prompt-words", type=_positive(int), default=32, help="synthetic prompt"
    )
    bench.add_argument("--prompts", metavar="JSONL", help='lines of {"prompt": ...}')
    bench.add_argument(
        "--max-tokens", type=_positive(int), default=64, help="output length"
    )
    bench.add_argument(
        "--timeout-s", type=_positive(float), default=120.0, help="idle limit"
    )
    bench.add_argument("--json", metavar="FILE", help="write the summary as JSON")
    bench.set_defaults(func=run_bench)


def _positive(kind: Callable[[str], _N]) -> Callable[[str], _N]:
    """An argparse type: ``kind(text)``, refused unless > 0."""

    def parse(text: str) -> _N:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a number, got {text!r}"
            ) from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"expected a number > 0, got {text}")
        return value

    return parse


def load_prompts(path: Path) -> list[list[dict[str, Any]]]:
    """Chat message lists from a JSONL file: ``{"prompt": str}`` or
    ``{"messages": [...]}`` per line; blank lines are skipped.

    Raises:
        OSError: the file cannot be read.
        ValueError: a line is not such an object.
    """
    prompts = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        item = orjson.loads(line)
        if isinstance(item, dict) and isinstance(item.get("messages"), list):
            prompts.append(item["messages"])
        elif isinstance(item, dict) and isinstance(item.get("prompt"), str):
            prompts.append([{"role": "user", "content": item["prompt"]}])
        else:
            raise ValueError(f"{path}:{number}: expected prompt or messages: {line!r}")
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def _synthetic(words: int, i: int) -> list[dict[str, Any]]:
    text = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(words))
    return [{"role": "user", "content": f"Continue this story: {text}"}]


async def _drive(
    client: AsyncClient, model: str, args: argparse.Namespace,
    prompts: Sequence[list[dict[str, Any]]], progress: Progress,
) -> tuple[list[StreamResult], float]:  # fmt: skip
    results: list[StreamResult] = []
    task = progress.add_task("requests", total=args.requests)
    start = time.monotonic()
    slots = anyio.Semaphore(args.concurrency)  # closed loop only

    async def one(i: int) -> None:
        try:
            result = await client.achat(
                prompts[i % len(prompts)],
                model=model,
                max_tokens=args.max_tokens,
                temperature=0,
            )
        finally:
            if args.rate is None:
                slots.release()
        results.append(result)
        progress.advance(task)

    async with anyio.create_task_group() as tg:
        for i in range(args.requests):
            if args.rate is not None:
                await anyio.sleep_until(start + i / args.rate)
            else:
                await slots.acquire()  # a new request as soon as one ends
            if args.duration_s and time.monotonic() - start > args.duration_s:
                progress.update(task, total=i)
                break
            tg.start_soon(one, i)
    return results, time.monotonic() - start


def run_bench(args: argparse.Namespace) -> int:
    """``sluicegate bench``: run the load, print the summary; the exit code.

    Returns:
        0 when every request finished, 1 otherwise, 2 for a bad prompts file
        or a server no request reached (as ``check`` says it).
    """
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request
    console = Console()
    try:
        prompts = (
            load_prompts(Path(args.prompts))
            if args.prompts
            else [_synthetic(args.prompt_words, i) for i in range(16)]
        )
    except (OSError, ValueError) as exc:
        console.print(f"[red]{exc}")
        return 2
    summary, model, unreached = anyio.run(_bench, args, prompts, console)
    if unreached is not None:  # it read as "1 truncated" in the table
        console.print(f"[red]cannot reach {args.url} ({unreached})")
        return 2
    print_summary(console, summary, f"sluicegate bench {args.url} ({model})")
    if args.json:
        doc = {"url": args.url, "model": model, "settings": _settings(args)}
        doc.update(summary.as_dict())
        Path(args.json).write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    return 0 if summary.end_states == {"finished": summary.requests} else 1


async def _bench(
    args: argparse.Namespace, prompts: Sequence[list[dict[str, Any]]], console: Console
) -> tuple[Summary, str, str | None]:
    """The summary, the model, and the connection failure when no request got
    an answer (else ``None``)."""
    timeouts = Timeouts(first_byte_s=args.timeout_s, idle_s=args.timeout_s)
    async with AsyncClient(args.url, api_key=args.api_key, timeouts=timeouts) as client:
        model = args.model or await _discover(client)
        columns = (*Progress.get_default_columns()[:2], MofNCompleteColumn())
        with Progress(
            *columns, BarColumn(), TimeElapsedColumn(), console=console
        ) as bar:
            results, wall_s = await _drive(client, model, args, prompts, bar)
    heard = any(r.status is not None for r in results)
    failures = [r.transport_error for r in results if r.transport_error]
    unreached = None if heard or not failures else failures[0]
    return summarize(results, wall_s), model, unreached


async def _discover(client: AsyncClient) -> str:
    try:
        data = (await client.http.get("models")).json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError, KeyError):
        return "default"
    return str(data[0]["id"]) if data and "id" in data[0] else "default"


def _settings(args: argparse.Namespace) -> Mapping[str, Any]:
    keys = ("concurrency", "rate", "requests", "duration_s", "prompt_words",
            "prompts", "max_tokens")  # fmt: skip
    return {k: getattr(args, k) for k in keys}


def print_summary(console: Console, summary: Summary, title: str) -> None:
    """Print latency percentiles (ms), throughput and end states."""
    table = Table(title=title)
    for column in ("metric", "p50", "p90", "p99", "mean"):
        table.add_column(column, justify="right" if column != "metric" else "left")
    for name, spread in (("TTFT ms", summary.ttft_s), ("ITL ms", summary.itl_s),
                         ("E2E ms", summary.e2e_s)):  # fmt: skip
        cells = [f"{v * 1000:.1f}" if v is not None else "-" for v in spread.values()]
        table.add_row(name, *cells)
    console.print(table)
    states = ", ".join(f"{n} {s}" for s, n in sorted(summary.end_states.items()))
    console.print(
        f"{summary.requests} requests in {summary.wall_s:.2f} s: {states}; "
        f"{summary.output_tokens} output tokens, "
        f"{summary.output_tokens_per_s:.1f} tokens/s"
    )
