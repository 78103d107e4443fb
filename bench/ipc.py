"""The IPC between a worker and the engine process: a Unix socket with
length-prefixed pickle frames (``engines/remote/frames.py``) against pyzmq.

Two measures, each with the engine side in a child process and the worker
side here, on one asyncio loop as in a worker:

- ``rtt``: round trips of a small message (a request out, its ``ACCEPTED``
  back), one at a time: the latency one request adds before its first byte.
- ``stream``: the engine side sends ``--steps`` steps of ``--streams`` token
  frames (an ``EngineOutput`` of one token each), one write per step; the
  worker side receives and unpickles them. Reported: frames per second and the
  worker side's CPU seconds per million frames (what the worker's core pays).

pyzmq runs DEALER (worker) / ROUTER-less PAIR over ``ipc://``, with
``zmq.asyncio``, one message per step (the frames of a step pickled together)
and, as ``zmq-each``, one message per frame.

Usage::

    PYTHONPATH=src python bench/ipc.py            # both transports
    PYTHONPATH=src python bench/ipc.py --only unix

pyzmq is not a dependency: install it in a separate environment to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import pickle
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from sluicegate.core.events import EngineOutput
from sluicegate.engines.remote.frames import FrameReader, encode_frames

PING = ("generate", "chatcmpl-0123456789abcdef0123456789abcdef-0")
PONG = ("accepted", "chatcmpl-0123456789abcdef0123456789abcdef-0")


def _outputs(streams: int) -> list[tuple[object, ...]]:
    return [
        ("output", f"chatcmpl-{i:032x}-0", EngineOutput(token_ids=(1234 + i,)))
        for i in range(streams)
    ]


# -- the engine side (a child process) -----------------------------------------


def _unix_engine(path: str, mode: str, n: int, streams: int) -> None:
    async def main() -> None:
        done = asyncio.Event()

        async def serve(
            reader: asyncio.StreamReader, writer: asyncio.StreamWriter
        ) -> None:
            frames = FrameReader()
            if mode == "rtt":
                answered = 0
                while answered < n:
                    data = await reader.read(65536)
                    if not data:
                        break
                    for _ in frames.feed(data):
                        writer.write(encode_frames([PONG]))
                        answered += 1
            else:
                step = _outputs(streams)
                for _ in range(n):
                    writer.write(encode_frames(step))
                    await writer.drain()
            await writer.drain()
            writer.close()
            done.set()

        server = await asyncio.start_unix_server(serve, path)
        async with server:
            await done.wait()

    asyncio.run(main())


def _zmq_engine(address: str, mode: str, n: int, streams: int) -> None:
    import zmq
    import zmq.asyncio

    async def main() -> None:
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.PAIR)
        sock.bind(address)
        if mode == "rtt":
            for _ in range(n):
                await sock.recv()
                await sock.send(pickle.dumps(PONG, pickle.HIGHEST_PROTOCOL))
        elif mode == "stream":
            step = pickle.dumps(_outputs(streams), pickle.HIGHEST_PROTOCOL)
            await sock.recv()  # the worker is ready
            for _ in range(n):
                await sock.send(step)
        else:  # one message per frame
            frames = [
                pickle.dumps(f, pickle.HIGHEST_PROTOCOL) for f in _outputs(streams)
            ]
            await sock.recv()
            for _ in range(n):
                for frame in frames:
                    await sock.send(frame)
        await sock.recv()  # the worker's goodbye: everything was read
        sock.close()
        ctx.term()

    asyncio.run(main())


# -- the worker side (here) ----------------------------------------------------


async def _unix_worker(path: str, mode: str, n: int, streams: int) -> float:
    for _ in range(1000):  # the child binds first
        try:
            reader, writer = await asyncio.open_unix_connection(path)
            break
        except OSError:
            await asyncio.sleep(0.01)
    frames = FrameReader()
    got = 0
    if mode == "rtt":
        for _ in range(n):
            writer.write(encode_frames([PING]))
            while not frames.feed(await reader.read(65536)):
                pass
            got += 1
    else:
        while True:
            data = await reader.read(1 << 16)
            if not data:
                break
            got += len(frames.feed(data))
    writer.close()
    return got


async def _zmq_worker(address: str, mode: str, n: int, streams: int) -> float:
    import zmq
    import zmq.asyncio

    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.connect(address)
    got = 0
    if mode == "rtt":
        for _ in range(n):
            await sock.send(pickle.dumps(PING, pickle.HIGHEST_PROTOCOL))
            pickle.loads(await sock.recv())
            got += 1
    elif mode == "stream":
        await sock.send(b"ready")
        for _ in range(n):
            got += len(pickle.loads(await sock.recv()))
    else:
        await sock.send(b"ready")
        for _ in range(n * streams):
            pickle.loads(await sock.recv())
            got += 1
    await sock.send(b"bye")
    sock.close()
    ctx.term()
    return got


def _measure(transport: str, mode: str, n: int, streams: int) -> tuple[float, float]:
    """Wall seconds and this process's CPU seconds of one run."""
    folder = tempfile.mkdtemp(prefix="sluicegate-ipc-")
    path = str(Path(folder) / "engine.sock")
    target: Callable[[str, str, int, int], None] = _unix_engine
    worker: Callable[[str, str, int, int], Coroutine[Any, Any, float]] = _unix_worker
    where = path
    if transport != "unix":
        target, worker, where = _zmq_engine, _zmq_worker, f"ipc://{path}"
        mode = "each" if transport == "zmq-each" and mode == "stream" else mode
    child = multiprocessing.Process(target=target, args=(where, mode, n, streams))
    child.start()
    if transport != "unix":
        time.sleep(0.3)  # the child binds first
    wall, cpu = time.perf_counter(), time.process_time()
    asyncio.run(worker(where, mode, n, streams))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    child.join()
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pings", type=int, default=20_000)
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument(
        "--only", choices=["unix", "zmq", "zmq-each"], action="append", default=None
    )
    args = parser.parse_args()
    transports = args.only or ["unix", "zmq", "zmq-each"]
    print(f"load average: {os.getloadavg()}")
    for transport in transports:
        try:
            wall, _ = _measure(transport, "rtt", args.pings, 1)
            print(
                f"{transport:9} rtt: {wall / args.pings * 1e6:7.1f} us per round trip"
            )
            wall, cpu = _measure(transport, "stream", args.steps, args.streams)
        except ImportError:
            print(f"{transport:9} skipped: pyzmq is not installed")
            continue
        frames = args.steps * args.streams
        print(
            f"{transport:9} stream: {frames / wall / 1e3:7.0f} k frames/s, "
            f"worker CPU {cpu / frames * 1e6:5.2f} s per million frames"
        )


if __name__ == "__main__":
    main()
