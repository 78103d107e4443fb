"""A hostile OpenAI-compatible upstream in its own process: it misbehaves on command.

``python -m tests.integration.hostile_upstream --port N --other-port M`` serves
``POST /v1/chat/completions`` on port N and picks what to do per request from
the last message's content, ``attack:NAME`` or ``attack:NAME:ARG`` (the gateway
forwards messages as they came); any other content gets a short, valid stream.
Port M is "another host" for the redirects: it counts what reaches it and
answers with a body that must never reach a client (``OTHER_HOST_MARK``).

The server is raw asyncio over sockets, one request per connection
(``Connection: close``), so that it can send what no HTTP library would: a
malformed status or header line, a line that never ends, bytes split anywhere.
Every attack that can echo a secret echoes the ``Authorization`` header the
gateway sent. ``GET /_control/stats`` gives its counters as JSON; ``GET
/drip/v1/models`` answers one byte a second (a discovery that never ends).

Attacks (ARG in brackets; ``before``/``after``: before any content, or after
some):

- ``ok``: a valid stream; ``usage:[JSON number]``: a valid stream whose usage
  numbers are the given JSON text (past 64 bits, negative, fractional, a string);
- ``tool_deltas:[N]:[same|many]``: one chunk of N ``tool_calls`` entries, all
  arguments of one call or N calls;
- ``echo_key:[status]``, ``bad_status_line``, ``bad_header_line``,
  ``inband_key:[before|after]``: error paths that quote the key;
- ``redirect:[301|302|307|308]``: to port M;
- ``error_code:[code]:[before|after]``: an in-band error event with that ``code``;
- ``endless_line:[before|after]``: one SSE line, written until the peer leaves;
- ``flood:[comment|empty]``: keep-alive comments, or chunks with nothing in
  them, written until the peer leaves;
- ``many_deltas:[N]``: N one-character deltas, all in one write;
  ``overrun:[N]:[content|reasoning]``: N chunks of that kind, whatever
  the request's ``max_tokens``, then ``length`` and a usage of N
  (``overrun:endless:KIND``: chunks until the peer leaves);
  ``huge_delta:[MiB]:[before|after]``;
- ``retry_after:[status]``: that status with ``Retry-After: 1000000000``;
  ``status:[code]``: that status with an error body;
- ``unoffered_tool:[before|after]``: a call of a tool the client never offered;
- ``garbage:[seed]``: a 200 head, then seeded random bytes; ``garbage_raw:[seed]``:
  random bytes where the response's head should be;
- ``splits:[seed]``: a valid stream written in seeded random pieces;
- ``finish:[reason]``: some content, then that ``finish_reason``;
- ``same_call_ids``: two calls of ``get_weather`` with one ``id``, ``same``;
- ``reasoning_then_content``: two ``reasoning_content`` chunks, then two
  ``content`` chunks, all in one write (``REASONING``, ``CONTENT``).

One attack is on ``POST /v1/messages/count_tokens`` (the first token counter
the gateway asks; the others, ``/tokenize`` and the rest, answer 404):
``slow_count`` is never answered (for ``ENDLESS_LIMIT_S``); any other body is
a 404 there.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import socket
import string
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

MODEL = "hostile"
OTHER_HOST_MARK = "OTHER-HOST-BODY-NEVER-FORWARDED"
SPLIT_TEXT = "Hé, wörld 🌍 — ünïcödé and 漢字 split anywhere. " * 3
"""The text of ``splits``: multi-byte characters, so that splits fall inside them."""
REASONING = ["plan: ", "2+2=4"]
CONTENT = ["The answer", " is 4."]
"""The chunks of ``reasoning_then_content``."""
ENDLESS_LIMIT_S = 60.0
"""``endless_line`` stops after this long even if the peer never leaves."""


@dataclass
class Stats:
    """What the upstream saw (``GET /_control/stats``)."""

    requests: int = 0
    other_host_hits: int = 0
    attacks: dict[str, int] = field(default_factory=dict)
    endless_bytes: int = 0
    """Bytes of the last ``endless_line`` written before its peer left."""
    endless_ended: str = ""
    """Why the last ``endless_line`` ended: ``peer closed`` or ``limit``."""
    drips: int = 0
    """Listings begun on ``/drip/`` (each goes on one byte a second)."""


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes

    @property
    def key(self) -> str:
        return self.headers.get("authorization", "").removeprefix("Bearer ")


STATS = Stats()


# -- wire helpers ------------------------------------------------------------------


def head(status: int, reason: str, headers: dict[str, str] | None = None) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    lines += ["Connection: close", "", ""]
    return "\r\n".join(lines).encode()


SSE_HEAD = head(200, "OK", {"Content-Type": "text/event-stream"})


def json_answer(status: int, body: Any, headers: dict[str, str] | None = None) -> bytes:
    data = json.dumps(body).encode()
    fields = {"Content-Type": "application/json", "Content-Length": str(len(data))}
    return head(status, "Whatever", {**fields, **(headers or {})}) + data


def event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-hostile",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def usage_event(number_text: str) -> bytes:
    """A usage chunk whose three numbers are ``number_text``, as raw JSON."""
    base = json.dumps({**chunk({}), "choices": [], "usage": "USAGE"})
    usage = (
        f'{{"prompt_tokens": {number_text}, "completion_tokens": {number_text}, '
        f'"total_tokens": {number_text}}}'
    )
    return b"data: " + base.replace('"USAGE"', usage).encode() + b"\n\n"


def text_stream(pieces: list[str], usage: str | None = None) -> bytes:
    """A whole valid stream of ``pieces``: role, deltas, finish, usage, ``[DONE]``."""
    out = [event(chunk({"role": "assistant", "content": ""}))]
    out += [event(chunk({"content": piece})) for piece in pieces]
    out.append(event(chunk({}, "stop")))
    out.append(usage_event(usage or str(len(pieces))))
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)


def error_event(message: str, code: Any) -> bytes:
    return event({"error": {"message": message, "type": "server_error", "code": code}})


def leading(when: str) -> bytes:
    """The head and, ``after``, some content first."""
    content = (
        event(chunk({"content": "Some content first. "})) if when == "after" else b""
    )
    return SSE_HEAD + event(chunk({"role": "assistant", "content": ""})) + content


def key_message(key: str) -> str:
    # The way OpenAI's own 401 quotes a key it was given, whole.
    return f"Incorrect API key provided: {key}. You can find your API key at ..."


# -- attacks -----------------------------------------------------------------------

Send = Callable[[bytes], Awaitable[None]]
Attack = Callable[[Send, Request, list[str]], Awaitable[None]]


async def ok(send: Send, request: Request, args: list[str]) -> None:
    await send(SSE_HEAD + text_stream(["Hello", ", ", "world", "."]))


async def usage(send: Send, request: Request, args: list[str]) -> None:
    await send(SSE_HEAD + text_stream(["Counted", " wrong", "."], usage=args[0]))


async def tool_deltas(send: Send, request: Request, args: list[str]) -> None:
    count, shape = int(args[0]), args[1]
    if shape == "same":
        start = {"index": 0, "id": "call_0", "type": "function"}
        calls = [{**start, "function": {"name": "get_weather", "arguments": ""}}]
        calls += [{"index": 0, "function": {"arguments": "x"}}] * (count - 1)
    else:
        calls = [
            {
                "index": i,
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": "get_weather", "arguments": "{}"},
            }
            for i in range(count)
        ]
    await send(SSE_HEAD + event(chunk({"role": "assistant", "tool_calls": calls})))
    await send(event(chunk({}, "tool_calls")) + b"data: [DONE]\n\n")


async def echo_key(send: Send, request: Request, args: list[str]) -> None:
    body = {"error": {"message": key_message(request.key), "type": "auth", "code": 1}}
    echo = {"X-Echo-Authorization": request.headers.get("authorization", "")}
    await send(json_answer(int(args[0]), body, echo))


async def bad_status_line(send: Send, request: Request, args: list[str]) -> None:
    await send(f"HTTP/1.1 2O0 {request.key}\r\nConnection: close\r\n\r\n".encode())


async def bad_header_line(send: Send, request: Request, args: list[str]) -> None:
    line = f"Authorization echoed {request.key} without a colon"
    await send(f"HTTP/1.1 200 OK\r\n{line}\r\nConnection: close\r\n\r\n".encode())


async def inband_key(send: Send, request: Request, args: list[str]) -> None:
    await send(leading(args[0]) + error_event(key_message(request.key), "401"))


async def redirect(send: Send, request: Request, args: list[str]) -> None:
    location = f"http://127.0.0.1:{OTHER_PORT}/v1/chat/completions"
    await send(json_answer(int(args[0]), {"moved": location}, {"Location": location}))


async def error_code(send: Send, request: Request, args: list[str]) -> None:
    code, when = args
    await send(leading(when) + error_event("overloaded, try later", code))


async def endless_line(send: Send, request: Request, args: list[str]) -> None:
    line = b'data: {"choices": [{"index": 0, "delta": {"content": "'
    await _until_closed(send, leading(args[0]) + line, b"a" * 65536)


async def flood(send: Send, request: Request, args: list[str]) -> None:
    line = {"comment": b": keep-alive\n", "empty": event(chunk({}))}[args[0]]
    await _until_closed(send, SSE_HEAD, line * (65536 // len(line)))


async def _until_closed(send: Send, first: bytes, piece: bytes) -> None:
    """``first``, then ``piece`` again and again until the peer leaves, or
    ``ENDLESS_LIMIT_S``; the bytes and the reason it ended in ``STATS``."""
    await send(first)
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + ENDLESS_LIMIT_S
    STATS.endless_bytes, STATS.endless_ended = 0, "limit"
    try:
        while loop.time() < stop_at:
            await send(piece)
            STATS.endless_bytes += len(piece)
    except OSError:
        STATS.endless_ended = "peer closed"


async def many_deltas(send: Send, request: Request, args: list[str]) -> None:
    """Every event in one write: the gateway reads them as fast as it can."""
    count = int(args[0])
    # The 26 events built once: the same bytes as one built per delta, without
    # 200,000 JSON encodings in this process while the gateway is measured.
    letters = [event(chunk({"content": letter})) for letter in string.ascii_lowercase]
    deltas = (letters[i % 26] for i in range(count))
    end = event(chunk({}, "stop")) + usage_event(str(count)) + b"data: [DONE]\n\n"
    role = event(chunk({"role": "assistant", "content": ""}))
    await send(b"".join([SSE_HEAD, role, *deltas, end]))


async def overrun(send: Send, request: Request, args: list[str]) -> None:
    """More output chunks than the ``max_tokens`` asked for, all in one write;
    ``endless``: written until the peer leaves (``Stats.endless_ended``)."""
    kind = args[1]
    key = "content" if kind == "content" else "reasoning_content"
    if args[0] == "endless":
        await _until_closed(send, SSE_HEAD, event(chunk({key: "w "})) * 512)
        return
    count = int(args[0])
    pieces = [event(chunk({key: "w "}))] * count
    end = event(chunk({}, "length")) + usage_event(str(count)) + b"data: [DONE]\n\n"
    await send(b"".join([SSE_HEAD, *pieces, end]))


async def huge_delta(send: Send, request: Request, args: list[str]) -> None:
    # Built before the head goes: encoding it takes this process long enough,
    # on a loaded machine, for the gateway to send its headers meanwhile.
    huge = event(chunk({"content": "h" * (int(args[0]) << 20)}))
    await send(leading(args[1]))
    await send(huge)
    await send(event(chunk({}, "stop")) + usage_event("3") + b"data: [DONE]\n\n")


async def retry_after(send: Send, request: Request, args: list[str]) -> None:
    body = {"error": {"message": "overloaded", "type": "overloaded", "code": None}}
    await send(json_answer(int(args[0]), body, {"Retry-After": "1000000000"}))


async def status(send: Send, request: Request, args: list[str]) -> None:
    body = {"error": {"message": f"upstream says {args[0]}", "type": "x", "code": None}}
    await send(json_answer(int(args[0]), body))


async def unoffered_tool(send: Send, request: Request, args: list[str]) -> None:
    call = {
        "index": 0,
        "id": "call_evil",
        "type": "function",
        "function": {"name": "delete_everything", "arguments": '{"path": "/"}'},
    }
    await send(leading(args[0]) + event(chunk({"tool_calls": [call]})))
    await send(event(chunk({}, "tool_calls")) + usage_event("5") + b"data: [DONE]\n\n")


async def garbage(send: Send, request: Request, args: list[str]) -> None:
    noise = random.Random(int(args[0])).randbytes(64 * 1024)
    await send(SSE_HEAD + noise)


async def garbage_raw(send: Send, request: Request, args: list[str]) -> None:
    await send(random.Random(int(args[0])).randbytes(16 * 1024))


async def splits(send: Send, request: Request, args: list[str]) -> None:
    rng = random.Random(int(args[0]))
    pieces = [word + " " for word in SPLIT_TEXT.split(" ") if word]
    data = SSE_HEAD + text_stream(pieces)
    cuts = sorted(rng.sample(range(1, len(data)), 120))
    for begin, end in zip([0, *cuts], [*cuts, len(data)], strict=True):
        await send(data[begin:end])
        await asyncio.sleep(0.001)


async def finish(send: Send, request: Request, args: list[str]) -> None:
    end = event(chunk({}, args[0])) + usage_event("2") + b"data: [DONE]\n\n"
    await send(leading("after") + end)


async def same_call_ids(send: Send, request: Request, args: list[str]) -> None:
    calls = [
        {
            "index": i,
            "id": "same",
            "type": "function",
            "function": {"name": "get_weather", "arguments": f'{{"city": "{city}"}}'},
        }
        for i, city in enumerate(["Paris", "Tokyo"])
    ]
    role = event(chunk({"role": "assistant", "content": None}))
    deltas = [event(chunk({"tool_calls": [call]})) for call in calls]
    end = event(chunk({}, "tool_calls")) + usage_event("9") + b"data: [DONE]\n\n"
    await send(b"".join([SSE_HEAD, role, *deltas, end]))


async def reasoning_then_content(send: Send, request: Request, args: list[str]) -> None:
    role = event(chunk({"role": "assistant", "content": ""}))
    thoughts = [event(chunk({"reasoning_content": text})) for text in REASONING]
    answer = [event(chunk({"content": text})) for text in CONTENT]
    end = event(chunk({}, "stop")) + usage_event("4") + b"data: [DONE]\n\n"
    await send(b"".join([SSE_HEAD, role, *thoughts, *answer, end]))


ATTACKS: dict[str, Attack] = {
    attack.__name__: attack
    for attack in (
        ok,
        usage,
        tool_deltas,
        echo_key,
        bad_status_line,
        bad_header_line,
        inband_key,
        redirect,
        error_code,
        endless_line,
        flood,
        many_deltas,
        overrun,
        huge_delta,
        retry_after,
        status,
        unoffered_tool,
        garbage,
        garbage_raw,
        splits,
        reasoning_then_content,
        same_call_ids,
        finish,
    )
}


def attack_of(body: bytes) -> tuple[str, list[str]]:
    """The attack a chat request asks for: ``(name, args)``; ``ok`` if none."""
    try:
        content = json.loads(body)["messages"][-1]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return "ok", []
    if not isinstance(content, str) or not content.startswith("attack:"):
        return "ok", []
    name, *args = content.removeprefix("attack:").split(":")
    return name, args


# -- the servers -------------------------------------------------------------------

OTHER_PORT = 0


async def read_request(reader: asyncio.StreamReader) -> Request:
    raw = await reader.readuntil(b"\r\n\r\n")
    request_line, *lines = raw.decode("latin-1").split("\r\n")
    method, target, _ = request_line.split(" ", 2)
    headers = {}
    for line in lines:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    body = b""
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        while size := int((await reader.readline()).split(b";")[0], 16):
            body += await reader.readexactly(size)
            await reader.readexactly(2)
        await reader.readline()
    return Request(method, target, headers, body)


async def drip(send: Send) -> None:
    listing = json.dumps({"object": "list", "data": [{"id": MODEL}]}).encode()
    fields = {"Content-Type": "application/json", "Content-Length": str(len(listing))}
    for byte in head(200, "OK", fields) + listing:
        await send(bytes([byte]))
        await asyncio.sleep(1.0)


async def answer(request: Request, send: Send) -> None:
    path = request.target
    if request.method == "GET" and path == "/_control/stats":
        stats = {
            "requests": STATS.requests,
            "other_host_hits": STATS.other_host_hits,
            "attacks": STATS.attacks,
            "endless_bytes": STATS.endless_bytes,
            "endless_ended": STATS.endless_ended,
            "drips": STATS.drips,
        }
        await send(json_answer(200, stats))
    elif request.method == "GET" and path.startswith("/drip/"):
        STATS.drips += 1
        await drip(send)
    elif request.method == "GET" and path.endswith("/models"):
        await send(json_answer(200, {"object": "list", "data": [{"id": MODEL}]}))
    elif request.method == "POST" and path.endswith("/messages/count_tokens"):
        name, _ = attack_of(request.body)
        STATS.attacks[name] = STATS.attacks.get(name, 0) + 1
        if name == "slow_count":  # a counter slower than the gateway waits for
            await asyncio.sleep(ENDLESS_LIMIT_S)
        await send(json_answer(404, {"error": {"message": f"no route {path}"}}))
    elif request.method == "POST" and path.endswith("/chat/completions"):
        STATS.requests += 1
        name, args = attack_of(request.body)
        STATS.attacks[name] = STATS.attacks.get(name, 0) + 1
        await ATTACKS.get(name, ok)(send, request, args)
    else:
        await send(json_answer(404, {"error": {"message": f"no route {path}"}}))


def connection(
    respond: Callable[[Request, Send], Awaitable[None]],
) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        async def send(data: bytes) -> None:
            writer.write(data)
            await writer.drain()

        try:
            request = await read_request(reader)
            await respond(request, send)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # the peer left, or sent something this server does not read
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    return serve


async def other_host(request: Request, send: Send) -> None:
    STATS.other_host_hits += 1
    await send(SSE_HEAD + text_stream([OTHER_HOST_MARK]))


async def main(port: int, other_port: int) -> None:
    global OTHER_PORT
    OTHER_PORT = other_port
    main_server = await asyncio.start_server(connection(answer), "127.0.0.1", port)
    other = await asyncio.start_server(connection(other_host), "127.0.0.1", other_port)
    async with main_server, other:
        await asyncio.gather(main_server.serve_forever(), other.serve_forever())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--other-port", type=int, required=True)
    options = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(options.port, options.other_port))
