"""Which servers writing one ledger file are alive: each holds a lock file for life.

A server's ledger writer holds an exclusive ``flock`` on
``<ledger>-servers/<server_id>.lock`` for as long as it runs; the kernel releases
it when the process dies, ``kill -9`` included. A lock file that can be locked
is a dead server's: its rows may be marked ``truncated`` and the file deleted.

Invariant: a lock file is created and locked under a temporary name, then
renamed, so a sweep never finds a live server's file unlocked.

Spec: flock(2).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

__all__ = ["alive", "hold_lock", "release_lock", "servers_dir", "sweep_locks"]


def servers_dir(path: Path) -> Path:
    """Where the servers writing the ledger at ``path`` hold their locks."""
    return path.with_name(f"{path.name}-servers")


def _lock_path(folder: Path, server_id: str) -> Path:
    return folder / f"{server_id}.lock"


def hold_lock(folder: Path, server_id: str) -> int:
    """Create and lock this writer's file; the kernel unlocks it when we die.

    Returns:
        The file descriptor that holds the lock (``release_lock`` closes it).

    Raises:
        OSError: the folder or the file cannot be made, or it is locked.
    """
    folder.mkdir(parents=True, exist_ok=True)
    # Locked under a temporary name, then renamed: a sweep never finds the
    # file unlocked (it would delete it under us).
    temporary = folder / f".{server_id}.tmp"
    fd = os.open(temporary, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.rename(temporary, _lock_path(folder, server_id))
    return fd


def release_lock(folder: Path, server_id: str, fd: int) -> None:
    """Delete this writer's lock file, then let the lock go (close ``fd``)."""
    with contextlib.suppress(FileNotFoundError):
        _lock_path(folder, server_id).unlink()
    os.close(fd)


def alive(folder: Path, server_id: str | None) -> bool:
    """Whether the server ``server_id`` still holds its lock."""
    if server_id is None or not server_id.isalnum():
        return False
    try:
        fd = os.open(_lock_path(folder, server_id), os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def sweep_locks(folder: Path) -> None:
    """Delete the lock files of servers that died (their rows are marked)."""
    for lock in folder.glob("*.lock"):
        if not alive(folder, lock.stem):
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()
