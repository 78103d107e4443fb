"""Ledger write rate: rows per second the writer commits, SQLite vs PostgreSQL.

Each backend gets the statements a server puts for ``--requests`` requests, the
way ``Meter`` does: an ``open`` row at admission, then the ended row (an
upsert), all put on the calling thread as fast as it can (a burst, the worst
case for the backlog), then ``flush``. The figures, the median over ``--runs``:

- ``rows/s``: statements committed per second, from the first ``put`` to the
  end of ``flush`` (so the writer's commit rate, not the caller's);
- ``put us``: CPU microseconds per statement on the calling thread (what the
  event loop pays: a queue append);
- ``process us``: CPU microseconds per statement of the whole process (the
  writer thread, the driver and, for SQLite, the database itself).

Driver choice for PostgreSQL: when ``asyncpg`` can be imported (it is not a
dependency: ``pip install --target DIR asyncpg`` and ``--extra-path DIR``), the
same rows are also committed by asyncpg's ``executemany`` on an event loop, and
by psycopg's, in batches of the writer's size, to show what each costs on the
thread that runs it.

PostgreSQL is a throwaway cluster started the way the tests start it
(``tests/postgres.py``: Debian's binaries, ``fsync=off``), or ``--url``. Prints a
table and writes ``bench/results/ledger.json``. Not a test: nothing here asserts
a timing.

Run: ``.venv/bin/python bench/ledger.py [--requests 20000] [--runs 3] [--quick]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from sluicegate.core.endstate import EndState
from sluicegate.core.events import FinishReason
from sluicegate.server.ledger.ledger import Ledger, LedgerRow

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "ledger.json"
BATCH = 1000  # the writers' batch size


def _row(i: int) -> LedgerRow:
    return LedgerRow(
        request_id=f"chatcmpl-{i:032x}",
        endpoint="/v1/chat/completions",
        model="gemma-3-270m",
        status=200,
        end_state=EndState.FINISHED,
        prompt_tokens=12,
        completion_tokens=64,
        finish_reasons=(FinishReason.STOP,),
        received_at=1.7e9 + i,
        first_token_at=1.7e9 + i + 0.05,
        ended_at=1.7e9 + i + 1.0,
        key_id="alice",
    )


def _burst(make: Callable[[], Ledger], requests: int) -> dict[str, float]:
    """One run: ``requests`` opens and ends into a fresh ledger, then flush."""
    ledger = make()
    assert ledger.flush(60), "the ledger never became writable"
    rows = [_row(i) for i in range(requests)]
    statements = 2 * requests
    started, cpu, thread = time.perf_counter(), time.process_time(), time.thread_time()
    for row in rows:
        ledger.open(row, lambda: (0, None))
    for row in rows:
        ledger.record(row)
    put_s = time.thread_time() - thread
    assert ledger.flush(600)
    wall_s = time.perf_counter() - started
    process_s = time.process_time() - cpu
    ledger.close()
    return {
        "rows_per_s": statements / wall_s,
        "put_us": put_s / statements * 1e6,
        "process_us": process_s / statements * 1e6,
    }


def _run_backend(name: str, make: Callable[[], Ledger], args: Any) -> dict[str, Any]:
    runs = [asyncio.run(_in_loop(make, args.requests)) for _ in range(args.runs)]
    return {"backend": name, **_median(runs)}


async def _in_loop(make: Callable[[], Ledger], requests: int) -> dict[str, float]:
    # Ledger.open wants a running loop (for its progress timer): run the burst
    # on this loop's thread, as a server does.
    return _burst(make, requests)


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def _drivers(url: str, args: Any) -> list[dict[str, Any]]:
    """psycopg vs asyncpg executemany of the same rows, on the thread running it."""
    try:
        asyncpg: Any = importlib.import_module("asyncpg")
    except ImportError:
        return []
    import psycopg

    ddl = (
        "CREATE TABLE IF NOT EXISTS bench_rows (request_id text PRIMARY KEY, "
        "key_id text, n bigint, t double precision, reasons text)"
    )
    rows = [(f"r{i}", "alice", i, 1.7e9 + i, '["stop"]') for i in range(args.requests)]
    insert = "INSERT INTO bench_rows VALUES ({}) ON CONFLICT (request_id) DO NOTHING"

    def with_psycopg() -> tuple[float, float]:
        with psycopg.connect(url, autocommit=True) as db:
            db.execute(ddl)
            db.execute("TRUNCATE bench_rows")
            sql = insert.format(", ".join(["%s"] * 5)).encode()
            started, cpu = time.perf_counter(), time.thread_time()
            for i in range(0, len(rows), BATCH):
                with db.transaction(), db.cursor() as cursor:
                    cursor.executemany(sql, rows[i : i + BATCH])
            return time.perf_counter() - started, time.thread_time() - cpu

    async def with_asyncpg() -> tuple[float, float]:
        db = await asyncpg.connect(url)
        try:
            await db.execute(ddl)
            await db.execute("TRUNCATE bench_rows")
            sql = insert.format(", ".join(f"${k}" for k in range(1, 6)))
            started, cpu = time.perf_counter(), time.thread_time()
            for i in range(0, len(rows), BATCH):
                async with db.transaction():
                    await db.executemany(sql, rows[i : i + BATCH])
            return time.perf_counter() - started, time.thread_time() - cpu
        finally:
            await db.close()

    results = []
    for name, run in (
        ("psycopg (writer thread)", with_psycopg),
        ("asyncpg (event loop)", lambda: asyncio.run(with_asyncpg())),
    ):
        runs = []
        for _ in range(args.runs):
            wall_s, cpu_s = run()
            runs.append(
                {"rows_per_s": len(rows) / wall_s, "thread_us": cpu_s / len(rows) * 1e6}
            )
        results.append({"driver": name, **_median(runs)})
    return results


@contextlib.contextmanager
def _database(url: str | None) -> Iterator[str]:
    if url is not None:
        yield url
        return
    sys.path.insert(0, str(ROOT))
    import os
    import pwd
    import shutil

    from tests.postgres import USER, PostgresCluster, bin_dir

    binaries = bin_dir()
    if binaries is None:
        raise SystemExit("PostgreSQL is missing: run scripts/install-system-deps")
    root = Path(tempfile.mkdtemp(prefix="sluicegate-pg-"))
    if os.geteuid() == 0:
        entry = pwd.getpwnam(USER)
        os.chown(root, entry.pw_uid, entry.pw_gid)
    cluster = PostgresCluster(binaries, root)
    cluster.start()
    try:
        yield cluster.url()
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def _print(backends: list[dict[str, Any]], drivers: list[dict[str, Any]]) -> None:
    table = Table(title="ledger writers: a burst of open + end rows, then flush")
    for column in ("backend", "rows/s", "put us/row", "process us/row"):
        table.add_column(column, justify="left" if column == "backend" else "right")
    for b in backends:
        table.add_row(
            b["backend"],
            f"{b['rows_per_s']:,.0f}",
            f"{b['put_us']:.1f}",
            f"{b['process_us']:.1f}",
        )
    console = Console()
    console.print(table)
    if drivers:
        table = Table(title="PostgreSQL drivers: executemany in batches of 1000")
        for column in ("driver", "rows/s", "CPU us/row on its thread"):
            table.add_column(column, justify="left" if column == "driver" else "right")
        for d in drivers:
            table.add_row(
                d["driver"], f"{d['rows_per_s']:,.0f}", f"{d['thread_us']:.1f}"
            )
        console.print(table)


def main(argv: list[str] | None = None) -> int:
    """Run the bench; print the tables and write ``RESULTS``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--url", help="a postgresql:// URL instead of a new cluster")
    parser.add_argument("--extra-path", help="a folder to import asyncpg from")
    parser.add_argument("--quick", action="store_true", help="2000 requests, 1 run")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.runs = 2000, 1
    if args.extra_path:
        sys.path.append(args.extra_path)
    with tempfile.TemporaryDirectory() as tmp, _database(args.url) as url:
        counter = iter(range(1_000_000))

        def sqlite() -> Ledger:
            return Ledger(Path(tmp) / f"ledger-{next(counter)}.sqlite3")

        def postgres() -> Ledger:
            import psycopg

            with psycopg.connect(url, autocommit=True) as db:
                db.execute("DROP TABLE IF EXISTS requests")
            return Ledger(url=url)

        backends = [
            _run_backend("SQLite (WAL file)", sqlite, args),
            _run_backend("PostgreSQL (psycopg)", postgres, args),
        ]
        drivers = _drivers(url, args)
    _print(backends, drivers)
    result = {
        "bench": "ledger",
        "machine": platform.platform(),
        "python": platform.python_version(),
        "requests": args.requests,
        "statements": 2 * args.requests,
        "runs": args.runs,
        "backends": backends,
        "drivers": drivers,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
