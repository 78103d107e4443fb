"""The ``sluicegate usage`` command: the ledger's totals per API key and end state.

Reads the SQLite ledger file (``serve``'s default path unless ``--ledger`` names
another) or a PostgreSQL ledger (``--ledger postgresql://...``) and prints one
table row per key and end state: requests, prompt, completion and reasoning
tokens. Exit status 2 when there is no such file or the database cannot be read.

Spec: docs/DESIGN.md, "Metering".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluicegate.server.app.options import default_ledger_path
from sluicegate.server.ledger.pg_schema import is_url, redact

if TYPE_CHECKING:
    from sluicegate.server.ledger.ledger import UsageTotal

__all__ = ["add_usage_command"]


def add_usage_command(sub: Any) -> None:
    """Add ``sluicegate usage [--ledger PATH|URL]`` to the subcommands ``sub``."""
    usage = sub.add_parser("usage", help="ledger totals per API key and end state")
    usage.add_argument(
        "--ledger", metavar="PATH|URL", help="SQLite ledger file or postgresql:// URL"
    )
    usage.set_defaults(func=_usage)


def _usage(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    target: str = args.ledger or str(default_ledger_path())
    totals = _totals(target)
    if totals is None:
        return 2
    table = Table(title=f"usage ({redact(target)})")
    columns = ("key", "end state", "requests", "prompt", "completion", "reasoning")
    for column in columns:
        table.add_column(column, justify="left" if column in columns[:2] else "right")
    for t in totals:
        table.add_row(
            t.key_id,
            str(t.end_state),
            str(t.requests),
            str(t.prompt_tokens),
            str(t.completion_tokens),
            str(t.reasoning_tokens),
        )
    Console().print(table)
    return 0


def _totals(target: str) -> list[UsageTotal] | None:
    """The totals of the ledger file or URL ``target``; ``None`` (said on stderr)
    when there is no such file or the database cannot be read."""
    if not is_url(target):
        from sluicegate.server.ledger.ledger import usage_totals

        path = Path(target)
        if not path.is_file():
            print(f"sluicegate: no ledger at {path}", file=sys.stderr)
            return None
        return usage_totals(path)
    import psycopg

    from sluicegate.server.ledger.pg_read import usage_totals as database_totals

    try:
        return database_totals(target)
    except psycopg.Error as exc:
        print(
            f"sluicegate: cannot read the ledger at {redact(target)}: {exc}",
            file=sys.stderr,
        )
        return None
