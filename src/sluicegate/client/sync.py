# Generated from aio.py by scripts/unasync.py: edit aio.py and run the
# script; scripts/check fails while this file differs from what it writes.
"""The streaming client: ``Client`` sends requests, ``Stream`` reads one.

The shell is a loop: read bytes, ``StreamAssembler.feed`` them, hand the deltas
on, and ``flush`` once at the end; every decision is in ``client.assemble``.

``client/aio.py`` is the only client written by hand: ``client/sync.py``
(``Client``, ``Stream``) is generated from it by ``scripts/unasync.py``, which
drops the ``async`` and ``await`` keywords, the ``Async`` prefix of class names
and the ``a`` prefix of method names, and ``scripts/check`` fails while the
checked-in copy differs. Both clients behave alike and give the same results;
the async one runs on any anyio backend that httpx supports.

Usage::

    with Client("http://127.0.0.1:8000") as client:
        with client.stream_chat(messages, model="m") as stream:
            for delta in stream:
                print(delta.text, end="")
        result = stream.result()
    print(result.end_state)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from sluicegate.client.assemble_events import EventApi
from sluicegate.client.results import StreamResult
from sluicegate.client.shell import (
    Resumption,
    Timeouts,
    api_url,
    chat_body,
    completion_body,
)
from sluicegate.client.stream_sync import Stream, WithBlock

__all__ = ["Client"]


class Client(WithBlock):
    """A streaming client for one OpenAI-compatible server.

    Args:
        base_url: the server, with or without the trailing ``/v1``.
        api_key: sent as ``Authorization: Bearer <key>`` when given.
        timeouts: client-side time limits (see ``client.shell``).
        transport: an ``httpx.BaseTransport`` (``httpx.MockTransport`` in
            tests).
        headers: extra request headers.
        resumption: how a resumable stream is resumed after a dropped
            connection (default ``Resumption()``: up to 5 times, backoff from
            0.1 s doubling to 2 s).

    Outcomes (finished, errored, truncated, rejected, aborted, timed out,
    connection refused) are values in ``StreamResult``; only misuse raises.
    """

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        *,
        api_key: str | None = None,
        timeouts: Timeouts | None = None,
        transport: httpx.BaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
        resumption: Resumption | None = None,
    ) -> None:
        self.timeouts = timeouts or Timeouts()
        self.resumption = resumption or Resumption()
        sent = dict(headers or {})
        if api_key:
            sent["Authorization"] = f"Bearer {api_key}"
        self.http = httpx.Client(
            base_url=api_url(base_url),
            headers=sent,
            transport=transport,
            timeout=self.timeouts.head(),
        )

    def stream_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str,
        include_usage: bool = True,
        record: bool = False,
        resumable: bool = False,
        **params: Any,
    ) -> Stream:
        """The ``Stream`` of ``POST /v1/chat/completions`` with ``stream: true``.

        Args:
            messages: OpenAI chat messages.
            model: the model name.
            include_usage: ask for the final usage chunk.
            record: keep the raw body in ``StreamResult.raw`` and read to EOF.
            resumable: ask for a resumable stream (``stream_options.resumable``),
                which the client resumes after a dropped connection.
            **params: other request fields (``max_tokens``, ``n``, ``stop``...).

        Spec: OpenAI API reference, "Create chat completion".
        """
        body = chat_body(messages, model, include_usage, params)
        return self._stream("chat/completions", body, record, resumable)

    def stream_completion(
        self,
        prompt: str,
        *,
        model: str,
        include_usage: bool = True,
        record: bool = False,
        resumable: bool = False,
        **params: Any,
    ) -> Stream:
        """The ``Stream`` of ``POST /v1/completions``; as ``stream_chat``.

        Spec: OpenAI API reference, "Create completion" (legacy).
        """
        body = completion_body(prompt, model, include_usage, params)
        return self._stream("completions", body, record, resumable)

    def stream_responses(
        self,
        input: str | Sequence[Mapping[str, Any]],
        *,
        model: str,
        record: bool = False,
        **params: Any,
    ) -> Stream:
        """The ``Stream`` of ``POST /v1/responses`` with ``stream: true``.

        Args:
            input: the prompt text, or Responses input items.
            model: the model name.
            record: keep the raw body in ``StreamResult.raw`` and read to EOF.
            **params: other request fields (``max_output_tokens``...).

        Spec: OpenAI API reference, "Responses: create a response".
        """
        body = {"model": model, "input": input, **params, "stream": True}
        return self._typed("responses", body, record)

    def stream_messages(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str,
        max_tokens: int,
        record: bool = False,
        **params: Any,
    ) -> Stream:
        """The ``Stream`` of ``POST /v1/messages`` with ``stream: true``.

        Args:
            messages: Anthropic messages (``system`` goes in ``params``).
            model: the model name.
            max_tokens: the answer limit, in tokens (required by the API).
            record: keep the raw body in ``StreamResult.raw`` and read to EOF.
            **params: other request fields (``stop_sequences``, ``system``...).

        Spec: Anthropic API, "Messages: create a message".
        """
        body = {"model": model, "messages": list(messages), "max_tokens": max_tokens}
        return self._typed("messages", {**body, **params, "stream": True}, record)

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str,
        **params: Any,
    ) -> StreamResult:
        """Stream a chat completion to its end; its ``StreamResult``."""
        with self.stream_chat(messages, model=model, **params) as stream:
            return stream.result()

    def complete(
        self,
        prompt: str,
        *,
        model: str,
        **params: Any,
    ) -> StreamResult:
        """Stream a text completion to its end; its ``StreamResult``."""
        with self.stream_completion(prompt, model=model, **params) as stream:
            return stream.result()

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()

    def _typed(self, api: EventApi, body: dict[str, Any], record: bool) -> Stream:
        request = self.http.build_request("POST", api, json=body)
        return Stream(
            self.http, request, 1, self.timeouts, record, self.resumption, api
        )

    def _stream(
        self, path: str, body: dict[str, Any], record: bool, resumable: bool
    ) -> Stream:
        if resumable:
            options = dict(body.get("stream_options") or {})
            body["stream_options"] = {**options, "resumable": True}
        request = self.http.build_request("POST", path, json=body)
        n = int(body.get("n") or 1)
        resumption = self.resumption
        return Stream(self.http, request, n, self.timeouts, record, resumption)
