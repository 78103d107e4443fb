"""Core CPU cost per token: sluicegate's sans-IO path vs a pydantic baseline.

Measures CPU microseconds per token for everything sluicegate does once per token
of one stream, on Gemma 3's real vocabulary and a text mixing English prose,
code, accented words, CJK and emoji (tokenized once, before timing):

- ``core``: ``ChoiceDecoder.feed`` (incremental UTF-8 detokenizer, then a stop
  matcher with two stop strings), ``Delta`` and ``StreamMachine.feed`` (the chunk
  and its SSE frame). Also the two halves on their own: ``core decode`` (the
  ``ChoiceDecoder`` only) and ``core frame`` (``StreamMachine.feed`` on the texts
  ``core decode`` produced).
- ``baseline``: the same stream written the common way: a windowed re-decode of
  recent token bytes with a diff against the text already sent, stop strings
  searched in the tail of the whole output with a fixed holdback, and a pydantic
  chunk model built per token, dumped with ``model_dump_json`` and wrapped in
  ``data: ...\\n\\n``.

Each path streams the text for one choice (``n=1``) and for four interleaved
choices (``n=4``; each choice starts the text at another paragraph), role
chunks, finish chunks, usage chunk and ``[DONE]`` included. The figure is the
median over ``--runs`` runs of (CPU time of ``--reps`` streams) / tokens.

Prints a table and writes ``bench/results/core.json``. Not a test: nothing here
asserts a timing.

Run: ``.venv/bin/python bench/core.py [--runs 7] [--reps 40] [--quick]``
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from sluicegate.core.decoding.choice import ChoiceDecoder
from sluicegate.core.decoding.detokenize import IncrementalDetokenizer
from sluicegate.core.decoding.stops import StopMatcher
from sluicegate.core.events import Delta, End, Finish, FinishReason, Usage
from sluicegate.core.wire.chunks import Endpoint, ResponseHeader
from sluicegate.core.wire.stream import StreamMachine

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "core.json"

# Two stop strings that never occur in the text but whose first characters often
# do (newlines, "<"), so the matcher holds text back and releases it again.
STOPS = ("\n\nUser:", "</answer>")

PARAGRAPHS = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, "
    "counting the steps out of habit: one hundred and twelve. Below, the sea "
    "worked patiently at the rocks, and the gulls argued about nothing at all. "
    "He wrote the weather in a ledger <em>by hand</em>, because the radio "
    "sometimes lied and the ledger never did.",
    "def moving_average(values: list[float], window: int = 3) -> list[float]:\n"
    '    """Mean of each run of `window` values (e.g. [1, 2, 3] -> [2.0])."""\n'
    "    if window <= 0:\n"
    '        raise ValueError(f"window must be positive, got {window!r}")\n'
    "    return [sum(values[i : i + window]) / window\n"
    "            for i in range(len(values) - window + 1)]\n",
    "À Montréal, le café crème coûte trois dollars ; à Zürich, Müller commande "
    "un Käsekuchen et paie en francs. São Paulo, Kraków and Reykjavík all made "
    "the list, along with the naïve façade of the old théâtre in Besançon.",
    "東京の朝は早い。駅のホームには人があふれ、電車は一分の遅れもなく到着する。"
    "北京的秋天很美，天空又高又蓝。서울의 밤거리는 언제나 활기차다.",  # noqa: RUF001
    "Release notes 🚀: faster streaming ⚡, fewer bugs 🐛➡️✅, and a new logo 🎨. "
    "Quote of the week: \"It's not a bug, it's a feature\" \\o/ — with 100% "
    "more emoji 👩‍💻👨‍👩‍👧 and a flag 🇯🇵.",
    "Q: What is 7 × 8?\nA: 56. Next question:\n\n- bullets work\n- so do tabs\t"  # noqa: RUF001
    'and backslashes C:\\temp\\new, and JSON {"a": [1, 2, null]}.',
)


# -- sluicegate's path ----------------------------------------------------------


def _header(n: int) -> ResponseHeader:
    return ResponseHeader(
        id="chatcmpl-bench0123456789",
        created=1_700_000_000,
        model="gemma-3-270m-q4_k_m",
        endpoint=Endpoint.CHAT,
        n=n,
        include_usage=True,
    )


def _interleave(streams: Sequence[Sequence[int]]) -> list[tuple[int, tuple[int]]]:
    """(choice index, token ids of one step) in engine order: one token per choice.

    The ids come as the one-id tuples an engine's ``EngineOutput`` carries.
    """
    order: list[tuple[int, tuple[int]]] = []
    for step in range(max(len(s) for s in streams)):
        order.extend((i, (s[step],)) for i, s in enumerate(streams) if step < len(s))
    return order


def core_stream(
    pieces: Sequence[bytes],
    special_ids: frozenset[int],
    streams: Sequence[Sequence[int]],
) -> Callable[[], int]:
    """A callable that streams ``streams`` through the core once; returns bytes."""
    order = _interleave(streams)
    n = len(streams)
    header = _header(n)

    def run() -> int:
        machine = StreamMachine(header)
        decoders = [
            ChoiceDecoder(
                IncrementalDetokenizer(pieces, special_ids), StopMatcher(STOPS)
            )
            for _ in range(n)
        ]
        # As the server does: collect the frames, write them joined.
        frames = machine.start()
        feed = machine.feed
        for index, token_ids in order:
            step = decoders[index].feed(token_ids)
            if step.text:
                frames += feed(Delta(index, step.text))
        tokens = 0
        for index, decoder in enumerate(decoders):
            tail = decoder.flush()
            if tail.text:
                frames += feed(Delta(index, tail.text))
            frames += feed(Finish(index, FinishReason.LENGTH))
            tokens += decoder.completion_tokens
        frames += feed(End(Usage(10, tokens)))
        return len(b"".join(frames))

    return run


def core_decode_only(
    pieces: Sequence[bytes],
    special_ids: frozenset[int],
    streams: Sequence[Sequence[int]],
) -> Callable[[], int]:
    """The ``ChoiceDecoder`` half of ``core_stream``: text out, no frames."""
    order = _interleave(streams)
    n = len(streams)

    def run() -> int:
        decoders = [
            ChoiceDecoder(
                IncrementalDetokenizer(pieces, special_ids), StopMatcher(STOPS)
            )
            for _ in range(n)
        ]
        chars = 0
        for index, token_ids in order:
            chars += len(decoders[index].feed(token_ids).text)
        for decoder in decoders:
            chars += len(decoder.flush().text)
        return chars

    return run


def core_frame_only(
    pieces: Sequence[bytes],
    special_ids: frozenset[int],
    streams: Sequence[Sequence[int]],
) -> Callable[[], int]:
    """The ``StreamMachine`` half of ``core_stream``, on precomputed deltas."""
    n = len(streams)
    header = _header(n)
    decoders = [
        ChoiceDecoder(IncrementalDetokenizer(pieces, special_ids), StopMatcher(STOPS))
        for _ in range(n)
    ]
    texts = [(i, decoders[i].feed(ids).text) for i, ids in _interleave(streams)]
    texts += [(i, d.flush().text) for i, d in enumerate(decoders)]
    deltas = [(i, text) for i, text in texts if text]

    def run() -> int:
        machine = StreamMachine(header)
        feed = machine.feed
        frames = machine.start()
        for index, text in deltas:
            frames += feed(Delta(index, text))
        for index in range(n):
            frames += feed(Finish(index, FinishReason.LENGTH))
        frames += feed(End(Usage(10, 0)))
        return len(b"".join(frames))

    return run


# -- the baseline, written the common way ---------------------------------------


class DeltaMessage(BaseModel):
    role: str | None = None
    content: str | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
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
    choices: list[ChunkChoice]
    usage: UsageInfo | None = None


class _BaselineChoice:
    """Windowed re-decode (prefix/read offsets) and a tail search for stops."""

    def __init__(self, pieces: Sequence[bytes], special_ids: frozenset[int]) -> None:
        self.pieces = pieces
        self.special_ids = special_ids
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.output = ""
        self.sent = 0
        self.stopped = False
        self.holdback = max(len(s) for s in STOPS) - 1

    def _decode(self, ids: list[int]) -> str:
        data = b"".join(self.pieces[t] for t in ids if t not in self.special_ids)
        return data.decode("utf-8", errors="replace")

    def feed(self, token_id: int) -> str:
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.output += full[len(prefix) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
        tail_start = max(0, self.sent - self.holdback)
        for stop in STOPS:
            found = self.output.find(stop, tail_start)
            if found >= 0:
                self.output = self.output[:found]
                self.stopped = True
        limit = len(self.output) if self.stopped else len(self.output) - self.holdback
        if limit <= self.sent:
            return ""
        text = self.output[self.sent : limit]
        self.sent = limit
        return text

    def flush(self) -> str:
        text = self.output[self.sent :]
        self.sent = len(self.output)
        return text


def _pydantic_frame(chunk: ChatCompletionChunk) -> bytes:
    return f"data: {chunk.model_dump_json()}\n\n".encode()


def baseline_stream(
    pieces: Sequence[bytes],
    special_ids: frozenset[int],
    streams: Sequence[Sequence[int]],
) -> Callable[[], int]:
    """The same stream as ``core_stream``, pydantic chunks and naive decoding."""
    order = _interleave(streams)
    n = len(streams)
    header = _header(n)

    def chunk(choices: list[ChunkChoice], usage: UsageInfo | None = None) -> bytes:
        model = ChatCompletionChunk(
            id=header.id,
            created=header.created,
            model=header.model,
            choices=choices,
            usage=usage,
        )
        return _pydantic_frame(model)

    def run() -> int:
        choices = [_BaselineChoice(pieces, special_ids) for _ in range(n)]
        frames = []
        for index in range(n):
            role = DeltaMessage(role="assistant", content="")
            frames.append(chunk([ChunkChoice(index=index, delta=role)]))
        for index, (token_id,) in order:
            text = choices[index].feed(token_id)
            if text:
                delta = DeltaMessage(content=text)
                frames.append(chunk([ChunkChoice(index=index, delta=delta)]))
        tokens = 0
        for index, choice in enumerate(choices):
            tail = choice.flush()
            if tail:
                delta = DeltaMessage(content=tail)
                frames.append(chunk([ChunkChoice(index=index, delta=delta)]))
            last = ChunkChoice(
                index=index, delta=DeltaMessage(), finish_reason="length"
            )
            frames.append(chunk([last]))
            tokens += len(choice.ids)
        usage = UsageInfo(prompt_tokens=10, completion_tokens=tokens, total_tokens=10)
        frames += [chunk([], usage), b"data: [DONE]\n\n"]
        return len(b"".join(frames))

    return run


# -- measuring ------------------------------------------------------------------


def measure(run: Callable[[], int], tokens: int, runs: int, reps: int) -> float:
    """Median over ``runs`` of CPU microseconds per token over ``reps`` streams."""
    run()  # warm caches and lazily built state
    samples = []
    for _ in range(runs):
        start = time.process_time_ns()
        for _ in range(reps):
            run()
        samples.append((time.process_time_ns() - start) / 1000 / (reps * tokens))
    return statistics.median(samples)


def choice_texts(text_paragraphs: Sequence[str], n: int) -> list[str]:
    """Choice ``i`` reads the paragraphs starting at paragraph ``i``."""
    count = len(text_paragraphs)
    return [
        "\n\n".join(text_paragraphs[(i + k) % count] for k in range(count))
        for i in range(n)
    ]


PATHS: dict[str, Callable[..., Callable[[], int]]] = {
    "core": core_stream,
    "core decode": core_decode_only,
    "core frame": core_frame_only,
    "baseline": baseline_stream,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark, print the table and write the JSON report."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs; median reported")
    parser.add_argument("--reps", type=int, default=40, help="streams per run")
    parser.add_argument("--copies", type=int, default=2, help="text copies per choice")
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes (a smoke run, not a figure)"
    )
    parser.add_argument(
        "--paths",
        default=",".join(PATHS),
        help="comma-separated subset of paths (baseline is always measured)",
    )
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.reps, args.copies = 1, 1, 1

    from sluicegate.engines.llamacpp.engine import load_vocab
    from sluicegate.model import default_model_path

    tokenizer: Any = load_vocab(default_model_path())
    pieces: Sequence[bytes] = tokenizer.pieces
    special_ids: frozenset[int] = tokenizer.special_ids

    chosen = {*args.paths.split(","), "baseline"}
    rows: list[dict[str, Any]] = []
    for n in (1, 4):
        texts = choice_texts(PARAGRAPHS, n)
        streams = [
            tokenizer.encode(text * args.copies, add_special=False, parse_special=False)
            for text in texts
        ]
        tokens = sum(map(len, streams))
        results = {
            name: measure(
                make(pieces, special_ids, streams), tokens, args.runs, args.reps
            )
            for name, make in PATHS.items()
            if name in chosen
        }
        for name, us in results.items():
            rows.append(
                {
                    "path": name,
                    "n": n,
                    "tokens_per_stream": tokens,
                    "us_per_token": round(us, 4),
                    "ratio_vs_baseline": round(results["baseline"] / us, 2),
                }
            )

    table = Table(title="CPU microseconds per token (median of runs)")
    for column in ("path", "n", "tokens", "us/token", "baseline / path"):
        table.add_column(column, justify="left" if column == "path" else "right")
    for row in rows:
        table.add_row(
            row["path"],
            str(row["n"]),
            str(row["tokens_per_stream"]),
            f"{row['us_per_token']:.3f}",
            f"{row['ratio_vs_baseline']:.2f}x",
        )
    Console().print(table)

    report = {
        "benchmark": "core",
        "unit": "cpu_us_per_token",
        "stops": list(STOPS),
        "runs": args.runs,
        "reps": args.reps,
        "copies": args.copies,
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "rows": rows,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
