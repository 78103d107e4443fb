"""``sluicegate chat``: a terminal chat that streams answers as they arrive.

The conversation is kept between turns. A thinking model's reasoning is shown
as it streams, apart from the answer: after ``thinking:`` (dimmed on a
terminal), then a blank line before the answer; only the answer is kept in the
conversation. After each answer a status line gives the end state, time to
first token, tokens/s and usage (with the reasoning tokens, when counted).
Ctrl-C while an answer streams closes the connection (so the server aborts the
request), keeps what arrived, and returns to the prompt; Ctrl-C or Ctrl-D at
the prompt quits.
Answers are asked for as resumable streams (``--no-resume``: not), so a network
hop that drops the connection mid-answer is survived: the client resumes from
the last event it saw, and the answer goes on where it stopped.

The first Ctrl-C of an answer does not raise ``KeyboardInterrupt`` wherever
Python happens to be (possibly halfway through the HTTP library's bookkeeping):
its handler calls ``Stream.interrupt()``, which shuts the connection down, and
the read loop ends as after a close. A second Ctrl-C raises as usual.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

import httpx

from sluicegate.client import Client, Stream, StreamResult, Timeouts

__all__ = ["add_chat", "run_chat", "status_line"]

PROMPT = "you> "
THINKING = "thinking: "
"""What comes before a reasoning's text (``_DIM`` and ``_PLAIN`` around it on a
terminal)."""
_DIM, _PLAIN = "\x1b[2m", "\x1b[0m"


def add_chat(sub: Any) -> None:
    """Register ``chat`` on the ``sluicegate`` subparsers."""
    chat = sub.add_parser("chat", help="chat with a model in the terminal")
    chat.add_argument("prompt", nargs="?", help="ask once, print, and exit")
    chat.add_argument("--url", default="http://127.0.0.1:8000", help="the server")
    chat.add_argument("--model", help="model name (default: the first listed)")
    chat.add_argument("--api-key", help="sent as a bearer token")
    chat.add_argument("--system", help="a system message")
    chat.add_argument("--max-tokens", type=int, default=512)
    chat.add_argument("--temperature", type=float, default=0.7)
    chat.add_argument(
        "--no-resume",
        dest="resumable",
        action="store_false",
        help="do not ask for resumable streams (a server that refuses"
        " stream_options.resumable)",
    )
    chat.set_defaults(func=run_chat)


def status_line(result: StreamResult, url: str = "the server") -> str:
    """``[finished (stop) · TTFT 120 ms · 35.2 tokens/s · usage 12+40]``.

    Tokens/s counts from the first token to the end; usage is ``prompt+completion``
    tokens when the server sent it, with ``(N reasoning)`` when it counted N > 0
    reasoning tokens. The error message is added when there is one.
    A request that got no response head at all (the server gone, or never
    there) says so instead: ``[no response from <url> · ConnectError: ...]``,
    not ``truncated``.
    """
    if result.status is None:
        why = result.transport_error or f"the {result.timeout} time limit ran out"
        return f"[no response from {url} · {why}]"
    parts = [
        f"{result.end_state}"
        + (f" ({result.finish_reason})" if result.finish_reason else "")
    ]
    timing = result.timing
    if timing.first_token_s is not None:
        parts.append(f"TTFT {timing.first_token_s * 1000:.0f} ms")
        tokens = (
            result.usage.completion_tokens
            if result.usage
            else len(timing.token_times_s)
        )
        span = timing.end_s - timing.first_token_s
        if span > 0:
            parts.append(f"{tokens / span:.1f} tokens/s")
    usage = result.usage
    if usage is not None:
        parts.append(f"usage {usage.prompt_tokens}+{usage.completion_tokens}")
        if usage.reasoning_tokens:
            parts[-1] += f" ({usage.reasoning_tokens} reasoning)"
    if result.error is not None:
        parts.append(f"error: {result.error.get('message', result.error)}")
    if result.transport_error is not None:
        parts.append(result.transport_error)
    return "[" + " · ".join(parts) + "]"


def _answer(
    client: Client,
    messages: list[dict[str, Any]],
    args: argparse.Namespace,
    out: TextIO,
) -> StreamResult:
    stream = client.stream_chat(
        messages, model=args.model, max_tokens=args.max_tokens,
        temperature=args.temperature, resumable=args.resumable,
    )  # fmt: skip
    dim, plain = (_DIM, _PLAIN) if out.isatty() else ("", "")
    thinking = False
    try:
        with _interrupt_on_sigint(stream):
            for delta in stream:
                if delta.reasoning:
                    if not thinking:
                        out.write(f"{dim}{THINKING}")
                    thinking = True
                    out.write(delta.reasoning)
                if delta.text and thinking:
                    out.write(f"{plain}\n\n")
                    thinking = False
                out.write(delta.text)
                out.flush()
    except KeyboardInterrupt:  # a second Ctrl-C, or one before the handler was set
        stream.close()  # closing the connection is what aborts it server-side
    result = stream.result()
    out.write(f"{plain if thinking else ''}\n{status_line(result, args.url)}\n")
    out.flush()
    return result


@contextmanager
def _interrupt_on_sigint(stream: Stream) -> Iterator[None]:
    """While the body runs, the first SIGINT interrupts ``stream`` (see the module
    docstring) and puts the previous handler back for the next one. Only the main
    thread can set signal handlers; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)

    def on_sigint(signum: int, frame: object) -> None:
        signal.signal(signal.SIGINT, previous)
        stream.interrupt()

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def run_chat(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """``sluicegate chat``: one question (``PROMPT``) or a conversation loop.

    Returns:
        With ``PROMPT``: 0 if the answer finished, else 1. Interactive: 0.
        1 at once, with a message on stderr, when no connection to ``--url``
        can be made.
    """
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with Client(
        args.url, api_key=args.api_key, timeouts=Timeouts(idle_s=300.0)
    ) as client:
        try:
            client.http.get("models")  # any status will do: someone answers
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            sys.stderr.write(
                f"sluicegate chat: cannot connect to {args.url} ({exc}); is a"
                " server running there? Start one with `sluicegate serve`, or"
                " pass --url\n"
            )
            return 1
        if not args.model:
            from sluicegate.check.record import discover_model

            args.model = discover_model(client)
        messages: list[dict[str, Any]] = []
        if args.system:
            messages.append({"role": "system", "content": args.system})
        if args.prompt:
            messages.append({"role": "user", "content": args.prompt})
            result = _answer(client, messages, args, out)
            return 0 if result.end_state == "finished" else 1
        _loop(client, messages, args, out)
    return 0


def _loop(
    client: Client,
    messages: list[dict[str, Any]],
    args: argparse.Namespace,
    out: TextIO,
) -> None:
    out.write(f"chatting with {args.model} at {args.url}; Ctrl-C stops an answer, "
              "Ctrl-D quits\n")  # fmt: skip
    while True:
        try:
            line = input(PROMPT)
        except (EOFError, KeyboardInterrupt):
            out.write("\n")
            return
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        result = _answer(client, messages, args, out)
        if result.text:  # keep what the user saw, even of an aborted answer
            messages.append({"role": "assistant", "content": result.text})
        else:
            messages.pop()
