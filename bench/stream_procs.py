"""The processes of a server under ``bench/streams.py``'s load, one by one.

A ``serve --workers 2`` server is a parent, two workers and (with
``--engine-process``) an engine process; ``ProcessWatch`` samples each one's
CPU seconds and open sockets every ``INTERVAL_S`` while a load runs, so a row
says whether the workers were balanced (the streams each held, the CPU each
used over the window where every stream runs) and what the parent and a Redis
cost beside them; and the whole machine's busy CPU over the same window
(``report_machine``), so that what neither the server nor the load used is
seen too (other work, the hypervisor). Open sockets count the connections a
worker accepted and has not closed, less those it had before the load (its
listening socket, Redis, the engine's socket). With a port it also samples
the connections waiting in the server's listen queues (``ss``'s Recv-Q of each
socket listening on it, summed): how many new streams the kernel holds that no
process has accepted yet.

And the saturation rule (``saturation``): what "delivered tokens/s at
saturation" means when two servers are compared, the same for both.

``cpu_budget`` holds a server's processes to a share of the CPUs (a cgroup of
the v1 ``cpu`` controller, ``cpu.cfs_quota_us`` over a 10 ms period; root
only): with ``--cpu-budget C``, ``serve --workers N`` gets ``N x C`` CPUs'
worth of time, whatever the load process (outside every budget) takes of the
same CPUs. On two CPUs the load cannot be kept out of an unbudgeted
comparison: two workers and the load share them, one process and the load
need not.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "CGROUP_CPU",
    "INTERVAL_S",
    "ProcessWatch",
    "cpu_budget",
    "listen_queue",
    "role",
    "saturation",
    "throttled_s",
    "tree",
    "worker_ratios",
]

INTERVAL_S = 0.25
"""Seconds between two samples."""

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")

CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
"""The cgroup v1 ``cpu`` controller's root."""
PERIOD_US = 10_000
"""The budget's period: a process over its quota waits at most this long."""


@contextlib.contextmanager
def cpu_budget(pids: Sequence[int], cpus: float, name: str) -> Iterator[Path]:
    """Hold ``pids`` and the children they start later to ``cpus`` CPUs' worth
    of time (a new cgroup, given back to the root when done); yields it.

    Raises:
        OSError: no writable cgroup v1 ``cpu`` controller (not root, cgroup v2).
    """
    group = CGROUP_CPU / f"sluicegate-bench-{os.getpid()}-{name}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(round(cpus * PERIOD_US)))
        for pid in pids:
            (group / "cgroup.procs").write_text(str(pid))
        yield group
    finally:
        for held in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (CGROUP_CPU / "cgroup.procs").write_text(held)
        group.rmdir()


def throttled_s(group: Path | None) -> float:
    """Seconds the processes of ``group`` waited for their budget so far."""
    if group is None:
        return 0.0
    for line in (group / "cpu.stat").read_text().splitlines():
        if line.startswith("throttled_time "):
            return int(line.split()[1]) / 1e9
    return 0.0


def tree(pid: int) -> list[int]:
    """``pid`` and its children (the workers and engine process of a parent)."""
    found = [pid]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    found.append(int(entry.name))
    return found


def role(pid: int, root: int) -> str:
    """``server`` (``root`` itself), ``worker``, ``engine`` or ``redis``."""
    if pid == root:
        return "server"
    with contextlib.suppress(OSError):
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"--engine-serve" in command:
            return "engine"
        if b"redis-server" in command[0]:  # it rewrites its own title
            return "redis"
    return "worker"


def _cpu_s(pid: int) -> float:
    with contextlib.suppress(OSError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime
    return 0.0


def _machine_s() -> tuple[float, float]:
    """CPU seconds the whole machine spent busy (every CPU, every process, the
    kernel's interrupts) and stolen by the hypervisor, since boot."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
    return (user + nice + system + irq + softirq) * _TICK_S, steal * _TICK_S


def _sockets(pid: int) -> int:
    count = 0
    with contextlib.suppress(OSError):
        for fd in os.scandir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                count += os.readlink(fd.path).startswith("socket:")
    return count


def listen_queue(port: int) -> int:
    """Connections waiting to be accepted on the sockets listening on ``port``
    (every worker's, summed): ``ss``'s Recv-Q of a listening socket. About 2 ms
    of CPU a call (a process started); 0 when ``ss`` fails."""
    with contextlib.suppress(OSError, subprocess.SubprocessError, ValueError):
        out = subprocess.run(
            ["ss", "-Hltn", f"sport = :{port}"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout  # fmt: skip
        return sum(int(line.split()[1]) for line in out.splitlines() if line.strip())
    return 0


class ProcessWatch(threading.Thread):
    """Samples CPU seconds and sockets of ``pids`` (a server's ``tree`` and any
    helper, such as the Redis), and with ``port`` the server's listen queue,
    every ``INTERVAL_S`` until ``stop`` is set."""

    def __init__(self, root: int, pids: Sequence[int], port: int | None = None) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.pids = list(pids)
        self.port = port
        self.idle_sockets = {pid: _sockets(pid) for pid in self.pids}
        # While they run: a report may come after the server has stopped.
        self.roles = {pid: role(pid, root) for pid in self.pids}
        self.samples: list[tuple[float, dict[int, tuple[float, int]]]] = []
        self.machine: list[tuple[float, tuple[float, float]]] = []
        self.queue: list[tuple[float, int]] = []
        self.stop = threading.Event()

    def _sample(self) -> None:
        now = time.perf_counter()
        seen = {pid: (_cpu_s(pid), _sockets(pid)) for pid in self.pids}
        self.samples.append((now, seen))
        self.machine.append((now, _machine_s()))
        if self.port is not None:
            self.queue.append((now, listen_queue(self.port)))

    def report_queue(self, start: float) -> dict[str, float | None]:
        """The listen queue over the whole load: its deepest sample, when that
        was and when the last sample with a connection in it was (seconds after
        ``start``, perf_counter; ``None``: it was never seen non-empty)."""
        waiting = [(t, depth) for t, depth in self.queue if depth > 0]
        if not waiting:
            return {"max": 0, "max_at_s": None, "last_nonempty_s": None}
        deepest = max(waiting, key=lambda sample: sample[1])
        return {
            "max": deepest[1],
            "max_at_s": deepest[0] - start,
            "last_nonempty_s": waiting[-1][0] - start,
        }

    def report_machine(self, window: tuple[float, float]) -> dict[str, float]:
        """The whole machine over ``window``, in cores: ``busy`` (the server,
        the load and everything else running) and ``stolen`` (by the
        hypervisor)."""
        inside = [s for s in self.machine if window[0] <= s[0] <= window[1]]
        if len(inside) < 2:
            inside = [self.machine[0], self.machine[-1]]
        (t0, (busy0, steal0)), (t1, (busy1, steal1)) = inside[0], inside[-1]
        span_s = max(t1 - t0, 1e-9)
        return {"busy": (busy1 - busy0) / span_s, "stolen": (steal1 - steal0) / span_s}

    def run(self) -> None:
        self._sample()
        while not self.stop.wait(INTERVAL_S):
            self._sample()
        self._sample()

    def report(self, window: tuple[float, float]) -> list[dict[str, Any]]:
        """Per process over ``window`` (perf_counter seconds): its role, CPU
        share of one core, and the most sockets it held beyond its idle ones
        (its streams); the samples nearest the window's ends bound it."""
        inside = [s for s in self.samples if window[0] <= s[0] <= window[1]]
        if len(inside) < 2:
            inside = [self.samples[0], self.samples[-1]]
        (t0, first), (t1, last) = inside[0], inside[-1]
        span_s = max(t1 - t0, 1e-9)
        return [
            {
                "pid": pid,
                "role": self.roles[pid],
                "cpu_share": (last[pid][0] - first[pid][0]) / span_s,
                "streams": max(s[pid][1] for _, s in inside) - self.idle_sockets[pid],
            }
            for pid in self.pids
        ]


def saturation(
    rows: Sequence[dict[str, Any]], p99_ms: float, ttft_p99_ms: float
) -> list[dict[str, Any]]:
    """Per server and round: its delivered tokens/s at saturation.

    That is the most tokens/s among the round's N at which the server kept the
    p99 added inter-token latency at or under ``p99_ms``, the p99 time to first
    token at or under ``ttft_p99_ms`` and timed out no stream (the same rule
    for every server); ``n`` says where, ``None`` when no N kept it. Past its
    CPU a server still delivers a little more at a larger N, and what its
    streams pay for it depends on how it sheds the load: one process, slow to
    accept, leaves new streams in the listen queue (a TTFT p99 of seconds)
    while those it runs keep their pace; two workers accept them and every
    stream's gaps grow. Compared at the same N past saturation, each would be
    credited at a latency the other never paid.
    """
    best: dict[tuple[str, int], dict[str, Any]] = {}
    for row in rows:
        key = (row["server"], row.get("round", 0))
        p99 = row["itl_added_ms"]["p99"]
        ttft = row["ttft_ms"]["p99"]
        kept = (
            p99 is not None
            and p99 <= p99_ms
            and ttft is not None
            and ttft <= ttft_p99_ms
            and row["timed_out"] == 0
        )
        entry = best.setdefault(
            key, {"server": key[0], "round": key[1], "n": None, "tokens_per_s": 0.0}
        )
        if kept and row["tokens_per_s"] > entry["tokens_per_s"]:
            entry.update(n=row["n"], tokens_per_s=row["tokens_per_s"])
    rule = {"itl_p99_ms_at_most": p99_ms, "ttft_p99_ms_at_most": ttft_p99_ms}
    return [{**entry, **rule} for entry in best.values()]


def worker_ratios(
    rows: Sequence[dict[str, Any]],
    p99_ms: float,
    ttft_p99_ms: float,
    one: str,
    two: str,
) -> list[dict[str, Any]]:
    """Per round, ``two``'s tokens/s over ``one``'s: at each N (each step of
    ``--n``: with ``--n-per-worker`` the two ran different N), and at
    saturation (``saturation``'s rule, ``n`` ``"saturation"``)."""
    by = {(r["server"], r.get("step_n", r["n"]), r.get("round", 0)): r for r in rows}
    out = []
    for (server, n, round_), row in sorted(by.items(), key=lambda item: item[0][1:]):
        other = by.get((one, n, round_))
        if server != two or other is None:
            continue
        out.append(
            {
                "n": n,
                "round": round_,
                "ratio": row["tokens_per_s"] / max(other["tokens_per_s"], 1e-9),
                "itl_p99_ms": [
                    other["itl_added_ms"]["p99"],
                    row["itl_added_ms"]["p99"],
                ],
            }
        )
    best = {(e["server"], e["round"]): e for e in saturation(rows, p99_ms, ttft_p99_ms)}
    for (server, round_), entry in sorted(best.items(), key=lambda item: item[0][1]):
        other = best.get((one, round_))
        if server != two or other is None:
            continue
        out.append(
            {
                "n": "saturation",
                "round": round_,
                "ratio": None  # no N kept the rule for one of them
                if entry["n"] is None or other["n"] is None
                else entry["tokens_per_s"] / other["tokens_per_s"],
                "at_n": [other["n"], entry["n"]],
                "tokens_per_s": [other["tokens_per_s"], entry["tokens_per_s"]],
            }
        )
    return out
