"""The native load client of ``bench/stream_load.py``: build it, run it, replay its log.

``bench/stream_client.c`` runs the streams and keeps every read it gets, with
its time, in one log; nothing is parsed while they run. Once they are over,
``replay`` feeds each read to a ``stream_load.Stream`` at the time the client
recorded (``Stream.take``), so the counts, gaps, TTFT and ends come from the
same code as the Python client's, and ``tally`` works as before.

Why native: on two cores the load shares the machine with the server it
measures, and the Python client (uvloop, a Protocol, a time stamp and a count
per read) cost 9.5-12 us per token, half of it in Python and uvloop; the
native client costs the kernel's recv, epoll and TCP acknowledgement, and
little else.

The binary is built once per source (``cc -O2``, ``$CC`` if set) into
``bench/.stream-client/``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from stream_load import Stream

__all__ = ["NativeRun", "build", "compiler", "replay", "run"]

BENCH = Path(__file__).resolve().parent
SOURCE = BENCH / "stream_client.c"
BUILDS = BENCH / ".stream-client"

_HEAD = struct.Struct("=4sIddd")  # magic, streams, start, cpu_s, wall_s
_STREAM = struct.Struct("=dii")  # sent_at, state, 0
_LOG = struct.Struct("=Q")  # the log's bytes
_READ = struct.Struct("=iid")  # stream, length, time
_FAILED, _TIMED_OUT = 1, 2
QUANTUM_S = 0.0005
"""After a wake that found reads, the client sleeps until this has passed, so
that it wakes at most 2,000 times a second (``bench/stream_client.c`` says
why); a read is stamped up to this late."""
BYTES_PER_TOKEN = 512
"""The log the client fills before the start, per token asked for: more than
any server here sends (padded events are the largest, under 400 bytes); past
it the log grows while the streams run."""


class NativeRun:
    """What one run of the native client gave: its start (perf_counter
    seconds), its CPU and wall seconds over the streams, and each stream
    (``None``: its connection failed)."""

    __slots__ = ("cpu_s", "start", "streams", "wall_s")

    def __init__(
        self, start: float, cpu_s: float, wall_s: float, streams: list[Stream | None]
    ) -> None:
        self.start = start
        self.cpu_s = cpu_s
        self.wall_s = wall_s
        self.streams = streams


def compiler() -> str | None:
    """The C compiler's path (``$CC``, else ``cc``), ``None`` if there is none."""
    return shutil.which(os.environ.get("CC", "cc"))


def build() -> Path:
    """The client's binary, compiled if this source has none yet.

    Raises:
        SystemExit: no C compiler (``cc`` or ``$CC``) to build it with.
    """
    source = SOURCE.read_bytes()
    binary = BUILDS / f"stream_client-{hashlib.sha256(source).hexdigest()[:16]}"
    if binary.exists():
        return binary
    found = compiler()
    if found is None:
        raise SystemExit(
            "the native load client needs a C compiler (cc, or $CC): set CC,"
            " or pass --load-client python"
        )
    BUILDS.mkdir(exist_ok=True)
    partial = binary.with_suffix(f".{os.getpid()}.tmp")
    subprocess.run(
        [found, "-O2", "-o", str(partial), str(SOURCE)],
        check=True,
        capture_output=True,
    )
    partial.replace(binary)  # another load may have built it meanwhile: same bytes
    return binary


def replay(blob: bytes, request: bytes) -> NativeRun:
    """The streams of one client's output ``blob``, each read fed at its time.

    Raises:
        ValueError: ``blob`` is not the client's output.
    """
    magic, count, start, cpu_s, wall_s = _HEAD.unpack_from(blob, 0)
    if magic != b"SGC1":
        raise ValueError(f"expected the native client's output, got {blob[:4]!r}")
    offset = _HEAD.size
    streams: list[Stream | None] = []
    for sent_at, state, _ in _STREAM.iter_unpack(
        blob[offset : offset + count * _STREAM.size]
    ):
        stream = None
        if state != _FAILED:
            stream = Stream(request)
            stream.sent_at = sent_at
            stream.timed_out = state == _TIMED_OUT
        streams.append(stream)
    offset += count * _STREAM.size
    (size,) = _LOG.unpack_from(blob, offset)
    offset += _LOG.size
    end = offset + size
    while offset < end:
        index, length, now = _READ.unpack_from(blob, offset)
        offset += _READ.size
        stream = streams[index]
        assert stream is not None  # a failed connection has no read
        stream.take(now, blob[offset : offset + length])
        offset += length
    return NativeRun(start, cpu_s, wall_s, streams)


def run(
    port: int,
    request: bytes,
    delays_s: Sequence[float],
    deadline_s: float,
    tokens: int,
    quantum_s: float = QUANTUM_S,
) -> NativeRun:
    """Run the client: one stream per delay (seconds after the start) sending
    ``request`` (for ``tokens`` tokens) to ``port`` on 127.0.0.1, each aborted
    ``deadline_s`` after the start if not over (timed out), its reads gathered
    over ``quantum_s`` (0: each taken as it comes); then ``replay`` its log."""
    binary = build()
    reserve = len(delays_s) * (tokens + 8) * BYTES_PER_TOKEN
    stdin = f"{len(request)}\n".encode() + request
    stdin += "".join(f"{delay!r}\n" for delay in delays_s).encode()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "reads"
        subprocess.run(
            [
                str(binary),
                str(port),
                repr(deadline_s),
                str(out),
                str(reserve),
                repr(quantum_s),
            ],
            input=stdin,
            check=True,
        )
        blob = out.read_bytes()
    return replay(blob, request)
