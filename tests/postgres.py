"""A real PostgreSQL for the tests: a throwaway cluster in a temp dir, one process.

The binaries are Debian's (``scripts/install-system-deps`` installs
``postgresql``), found under ``/usr/lib/postgresql/<version>/bin``. ``initdb``
makes the cluster in a fresh temp dir; ``postgres`` serves it on loopback, with
its socket in that dir and ``fsync=off`` (the tests never survive a power cut).
PostgreSQL refuses to run as root, so a root test run starts both as the
``postgres`` user (``setpriv``, which ``exec``s: the process we hold is the
server itself, and a signal to it reaches the server).

The session fixture ``postgres`` starts one cluster for the whole run and
stops it at the end; ``postgres_url`` gives each test a schema of its own in
its database, as a URL whose ``search_path`` names it (``CREATE DATABASE`` costs
a checkpoint; a schema costs next to nothing). A test may ``stop()`` and
``start()`` the cluster to take the database away; the fixture starts it again
if the test did not.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluicegate.testing import free_port

__all__ = ["PostgresCluster", "bin_dir", "postgres", "postgres_url"]

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
USER = "postgres"
"""The database superuser (trust auth on loopback) and, for root runs, the OS
user the server runs as."""

_schemas = itertools.count()


def bin_dir() -> Path | None:
    """The newest Debian PostgreSQL binaries' folder, or ``None`` without one."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/postgres"),
        key=lambda p: (
            int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0
        ),
    )
    return found[-1].parent if found else None


class PostgresCluster:
    """One cluster in ``root`` (a temp dir), served by one ``postgres`` process.

    Args:
        binaries: the folder of ``initdb``, ``postgres`` and ``pg_isready``.
        root: an empty folder that the server's user may write.
    """

    def __init__(self, binaries: Path, root: Path) -> None:
        self.binaries = binaries
        self.root = root
        self.data = root / "data"
        self.port = free_port()
        self.log_path = root / "postgres.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._run_as = _demote_to_postgres() if os.geteuid() == 0 else []
        self._run(
            [str(binaries / "initdb"), "--no-sync", "-D", str(self.data), "-U", USER]
        )
        # initdb's default: trust on the socket and on loopback.

    def url(self, database: str = "postgres") -> str:
        """A libpq URL of ``database`` on this cluster, over TCP on loopback."""
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        """Start the server and wait until it accepts connections.

        Raises:
            pytest.fail: it exited or was not ready within ``START_TIMEOUT_S``.
        """
        command = [
            *self._run_as,
            str(self.binaries / "postgres"),
            *("-D", str(self.data), "-k", str(self.root), "-p", str(self.port)),
            *("-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"),
        ]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=log)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"postgres did not start:\n{self.log_text()}")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop the server (fast shutdown: SIGINT), ending every connection."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGINT)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    @property
    def running(self) -> bool:
        """Whether the server process runs."""
        return self.process is not None and self.process.poll() is None

    def create_database(self, name: str) -> str:
        """Create ``name`` and return its URL."""
        self._run([str(self.binaries / "createdb"), *self._where(), name])
        return self.url(name)

    def create_schema(self, name: str) -> str:
        """Create the schema ``name`` in the ``postgres`` database; a URL whose
        connections use it (``search_path``)."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as db:
            db.execute(f"CREATE SCHEMA {name}".encode())
        return f"{self.url()}?options=-csearch_path%3D{name}"

    def log_text(self) -> str:
        """The server's log so far."""
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def _where(self) -> list[str]:
        return ["-h", "127.0.0.1", "-p", str(self.port), "-U", USER]

    def _ready(self) -> bool:
        command = [str(self.binaries / "pg_isready"), "-q", *self._where()]
        return subprocess.run(command, check=False).returncode == 0

    def _run(self, command: list[str]) -> None:
        done = subprocess.run(
            [*self._run_as, *command], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            pytest.fail(f"{command[0]} failed:\n{done.stdout}{done.stderr}")


def _demote_to_postgres() -> list[str]:
    """``setpriv`` arguments that run a command as the ``postgres`` user."""
    try:
        entry = pwd.getpwnam(USER)
    except KeyError:
        pytest.fail(f"no {USER!r} user: run scripts/install-system-deps")
    return [
        "setpriv",
        f"--reuid={entry.pw_uid}",
        f"--regid={entry.pw_gid}",
        "--clear-groups",
        "--",
    ]


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresCluster]:
    """A running PostgreSQL cluster for the whole session, stopped at its end."""
    binaries = bin_dir()
    if binaries is None:
        pytest.fail("PostgreSQL is missing: run scripts/install-system-deps")
    # Not under pytest's own temp dir: root's is 0700, closed to ``postgres``.
    root = Path(tempfile.mkdtemp(prefix="sluicegate-pg-"))
    try:
        if os.geteuid() == 0:
            entry = pwd.getpwnam(USER)
            os.chown(root, entry.pw_uid, entry.pw_gid)
        cluster = PostgresCluster(binaries, root)
        cluster.start()
        try:
            yield cluster
        finally:
            cluster.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres: PostgresCluster) -> Iterator[str]:
    """A new, empty schema on the session's cluster, as a URL."""
    if not postgres.running:  # an earlier test stopped it and failed
        postgres.start()
    yield postgres.create_schema(f"t{next(_schemas)}")
    if not postgres.running:
        postgres.start()
