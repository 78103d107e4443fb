"""A streaming chat server written the common way, as the baseline of ``streams.py``.

Starlette, sse-starlette's ``EventSourceResponse`` and one pydantic chunk model per
token dumped with ``model_dump_json``; text comes from a naive detokenizer that
re-decodes every token generated so far at each step and sends what grew. It runs
the same ``ScriptedEngine`` as ``sluicegate serve --engine scripted``, so the two
servers differ only in their front end.

Deliberate divergences from a real server: no validation beyond pydantic, no
stop strings, no admission, no ledger, no disconnect-to-abort beyond closing the
engine iterator. Only what ``bench/streams.py`` asks for is served:
``POST /v1/chat/completions`` (streaming) and ``GET /health``.

Run: ``.venv/bin/python bench/baseline_server.py --port 8001 --rate 20
--text FILE --max-running 4096``
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import AsyncIterator, Sequence

import uvicorn
from pydantic import BaseModel
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from sluicegate.engines.base import GenerateRequest, SamplingParams
from sluicegate.engines.scripted.engine import ScriptedEngine


class Message(BaseModel):
    role: str
    content: str


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatRequest(BaseModel):
    model: str
    messages: list[Message]
    stream: bool = False
    max_tokens: int = 256
    stream_options: StreamOptions | None = None


class ChoiceDelta(BaseModel):
    role: str | None = None
    content: str | None = None


class StreamChoice(BaseModel):
    index: int
    delta: ChoiceDelta
    logprobs: None = None
    finish_reason: str | None = None


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletionChunk(BaseModel):
    id: str
    object: str = "chat.completion.chunk"
    created: int
    model: str
    choices: list[StreamChoice]
    usage: UsageInfo | None = None


def naive_decode(pieces: Sequence[bytes], ids: Sequence[int], skip: int) -> str:
    """Every token so far, decoded from scratch (ids below ``skip`` are special)."""
    return b"".join(pieces[i] for i in ids if i >= skip).decode("utf-8", "replace")


def create_app(engine: ScriptedEngine) -> Starlette:
    """The baseline app around ``engine``."""
    tokenizer = engine.tokenizer
    pieces = tokenizer.pieces

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def chat(request: Request) -> EventSourceResponse:
        body = ChatRequest.model_validate(await request.json())
        prompt = "".join(f"{m.role}: {m.content}\n" for m in body.messages)
        prompt_ids = tuple(
            tokenizer.encode(prompt, add_special=True, parse_special=False)
        )
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        outputs = engine.generate(
            GenerateRequest(request_id, prompt_ids, SamplingParams(body.max_tokens))
        )
        created = int(time.time())
        usage_wanted = (
            body.stream_options is not None and body.stream_options.include_usage
        )

        def chunk(choices: list[StreamChoice], usage: UsageInfo | None = None) -> str:
            return ChatCompletionChunk(
                id=request_id,
                created=created,
                model=body.model,
                choices=choices,
                usage=usage,
            ).model_dump_json(exclude_none=True)

        async def events() -> AsyncIterator[str]:
            yield chunk([StreamChoice(index=0, delta=ChoiceDelta(role="assistant"))])
            ids: list[int] = []
            sent = ""
            finish: str | None = None
            try:
                async for output in outputs:
                    ids.extend(output.token_ids)
                    text = naive_decode(pieces, ids, 4)
                    if not text.endswith("\ufffd") and len(text) > len(sent):
                        delta, sent = text[len(sent) :], text
                        yield chunk(
                            [StreamChoice(index=0, delta=ChoiceDelta(content=delta))]
                        )
                    if output.finish_reason is not None:
                        finish = str(output.finish_reason)
            finally:  # a client that left (or any end) frees the sequence
                engine.abort(request_id)
            yield chunk(
                [StreamChoice(index=0, delta=ChoiceDelta(), finish_reason=finish)]
            )
            if usage_wanted:
                n = len(ids)
                yield chunk([], UsageInfo(
                    prompt_tokens=len(prompt_ids),
                    completion_tokens=n,
                    total_tokens=len(prompt_ids) + n,
                ))  # fmt: skip
            yield "[DONE]"

        return EventSourceResponse(events(), ping=15)

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/v1/chat/completions", chat, methods=["POST"]),
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the baseline until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--rate", type=float, default=20.0, help="tokens/s")
    parser.add_argument("--text", help="file with what the engine says")
    parser.add_argument("--max-running", type=int, default=4096)
    args = parser.parse_args(argv)
    script = None
    if args.text:
        with open(args.text, encoding="utf-8") as f:
            script = f.read()
    engine = ScriptedEngine(
        script,
        tokens_per_s=args.rate,
        max_running=args.max_running,
        max_queued=args.max_running,
    )
    uvicorn.run(create_app(engine), host=args.host, port=args.port, log_level="info")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
