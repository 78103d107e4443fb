"""CLI subcommands ``chat``, ``check`` and ``bench`` (registered by ``cli.py``).

Exit codes: 0 success; 1 a probe failed (``check``) or requests failed
(``bench``); 2 the server could not be reached or a file could not be read.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["add_commands"]

DEFAULT_URL = "http://127.0.0.1:8000"


def add_commands(sub: Any) -> None:
    """Register ``chat``, ``check`` and ``bench`` on the ``sluicegate`` subparsers.

    Args:
        sub: the object ``ArgumentParser.add_subparsers()`` returned.
    """
    _add_check(sub)
    from sluicegate.check.bench import add_bench
    from sluicegate.check.chat import add_chat

    add_chat(sub)
    add_bench(sub)


def _add_check(sub: Any) -> None:
    check = sub.add_parser(
        "check", help="grade an OpenAI-compatible endpoint's streaming conformance"
    )
    check.add_argument("url", nargs="?", default=DEFAULT_URL, help="the server")
    check.add_argument("--model", help="model name (default: the first listed)")
    check.add_argument("--api-key", help="sent as a bearer token")
    check.add_argument("--json", metavar="FILE", help="write the verdicts as JSON")
    check.add_argument("--save", metavar="FILE", help="write the raw recording")
    check.add_argument(
        "--replay", metavar="FILE", help="grade a saved recording (no network)"
    )
    check.add_argument("--max-tokens", type=int, default=24)
    check.add_argument(
        "--prefill-tokens", type=int, default=1500, metavar="N",
        help="about how long the time-to-headers prompt is (tokens)",
    )  # fmt: skip
    check.add_argument(
        "--timeout-s", type=float, default=60.0, help="first-byte and idle limit"
    )
    check.add_argument("--rules", action="store_true", help="show each rule")
    check.add_argument(
        "--api", choices=("chat", "responses", "messages", "all"),
        help="which API to grade (default: chat completions; with --replay,"
        " what the recording holds)",
    )  # fmt: skip
    check.set_defaults(func=run_check)


def run_check(args: argparse.Namespace) -> int:
    """``sluicegate check``: record (or load), grade, print; the exit code."""
    import logging

    from rich.console import Console

    from sluicegate.check.probes import failed, recorded_api, run_api_probes
    from sluicegate.check.report import print_table, results_json
    from sluicegate.check.transcript import dump_recording, load_recording

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request
    console = Console()
    if args.replay:
        try:
            recording = load_recording(Path(args.replay).read_bytes())
        except (OSError, ValueError, KeyError) as exc:
            console.print(f"[red]cannot read {args.replay}: {exc}")
            return 2
        url, model = args.replay, args.model or "(recorded)"
    else:
        url = args.url
        got = _record(console, args)
        if got is None:
            return 2
        model, recording = got
        if args.save:
            Path(args.save).write_bytes(dump_recording(recording))
    api = getattr(args, "api", None) or (
        recorded_api(recording) if args.replay else "chat"
    )
    results = run_api_probes(recording, api)
    print_table(console, results, f"sluicegate check {url} ({model})", args.rules)
    if args.json:
        Path(args.json).write_bytes(results_json(url, model, results))
    return 1 if failed(results) else 0


def _record(
    console: Any, args: argparse.Namespace
) -> tuple[str, dict[str, Any]] | None:
    from sluicegate.check import names
    from sluicegate.check.record import discover_model
    from sluicegate.client import Client, Timeouts

    limit = args.timeout_s
    timeouts = Timeouts(connect_s=10.0, first_byte_s=limit, idle_s=limit)
    with Client(args.url, api_key=args.api_key, timeouts=timeouts) as client:
        model = args.model or discover_model(client)
        with console.status("probing") as status:
            recording = _record_apis(client, model, args, status)
    first = recording.get(names.STREAM) or next(iter(recording.values()), None)
    if first is None or first.status is None:
        console.print(f"[red]cannot reach {args.url}")
        return None
    if first.status in (401, 403):  # nothing could be graded
        hint = "a key it accepts" if args.api_key else "--api-key"
        console.print(f"[red]{args.url} answered {first.status}: pass {hint}")
        return None
    return model, recording


def _record_apis(
    client: Any, model: str, args: argparse.Namespace, status: Any
) -> dict[str, Any]:
    from sluicegate.check.record import record
    from sluicegate.check.record_events import record_messages, record_responses

    api = getattr(args, "api", None) or "chat"
    kw = {
        "max_tokens": args.max_tokens,
        "progress": lambda name: status.update(f"probing: {name}"),
    }
    recording: dict[str, Any] = {}
    if api in ("chat", "all"):
        prefill = getattr(args, "prefill_tokens", 1500)
        recording.update(record(client, model, **kw, prefill_tokens=prefill))
    if api in ("responses", "all"):
        recording.update(record_responses(client, model, **kw))
    if api in ("messages", "all"):
        recording.update(record_messages(client, model, **kw))
    return recording
