"""The observer's seat: what TLS record sizes and times tell about a stream.

An on-path observer of a TLS connection sees each record's length and time, not
its bytes. This bench serves sluicegate over TLS (uvicorn with a self-signed
certificate it makes), captures the records of its loopback port with Debian's
``tshark`` (a capture filter on the port), and attacks them as the published
attacks do:

- **(a) token lengths**: the observer learns, from streams of its own, how many
  records frame a response and the constant a record adds to its token; then
  reads every other stream's token lengths (JSON bytes) off its record sizes.
  Reported: the share of streams whose whole sequence comes out exact, and the
  share of tokens, against chance (every token guessed the commonest length);
- **(b) topic**: a scikit-learn random forest on each stream's size and timing
  features (size histogram, first sizes, gap statistics and histogram, counts),
  5-fold stratified cross-validation; macro AUPRC against the base rate;
- **(c) cost**: TLS bytes per completion token, the client's inter-token gaps
  (p50/p99) and the added per-token delivery latency (p50/p99) against the
  unmitigated run of the same request.

Two corpora, each under four settings (none: no padding; padding: the default;
cadence: a 50 ms clock without padding; padding + cadence), asked for per
request and interleaved on one server:

- ``scripted``: the scripted engine replaying Gemma token ids of generated text
  in four topic classes (health, finance, sports, cooking), so that the token
  lengths are the real vocabulary's, every answer ``MAX_TOKENS`` long, at
  ``RATE`` tokens/s, ``CONCURRENCY`` streams at a time;
- ``real``: the default model (Gemma 3 270M through llama.cpp) on a few prompts
  per topic, one stream at a time, greedy.

Prints a table and writes ``bench/results/sidechannel.json``. About 8 minutes on
2 cores. Set up first with ``bench/sidechannel-setup.sh`` (tshark, and a venv with
scikit-learn and cryptography); run as root (the capture):

    bench/.sidechannel-venv/bin/python bench/sidechannel.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import itertools
import json
import math
import os
import platform
import random
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluicegate.core.wire.sse import SSEDecoder
from sluicegate.testing import ServerProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "sidechannel.json"
MAX_TOKENS = 64
REAL_MAX_TOKENS = 40
RATE = 50.0
CONCURRENCY = 16
CADENCE_MS = 50
SETTINGS: dict[str, dict[str, Any]] = {
    "none": {"include_obfuscation": False, "cadence_ms": 0},
    "padding": {"include_obfuscation": True, "cadence_ms": 0},
    "cadence": {"include_obfuscation": False, "cadence_ms": CADENCE_MS},
    "padding+cadence": {"include_obfuscation": True, "cadence_ms": CADENCE_MS},
}
"""Each setting's ``stream_options`` (the same as ``serve --no-obfuscation`` and
``--cadence-ms``): one server serves them all, interleaved, so that they share
the machine's load."""
CALIBRATION_STREAMS = 8


def _words(text: str) -> list[str]:
    return text.split()


_COMMON = _words(
    "the a of and to in is that it for on with as was this are by be at from or "
    "which can an their more has have not also when most all other some these"
)
TOPICS: dict[str, list[str]] = {
    "health": _words(
        "patients doctor symptoms cardiovascular disease treatment hospital "
        "medication chronic inflammation immune vaccine diagnosis blood pressure "
        "cholesterol diabetes therapy clinical nutrition metabolism infection"
    ),
    "finance": _words(
        "investors market stocks bonds interest rates inflation portfolio "
        "dividends equity liquidity mortgage credit banking revenue earnings "
        "valuation hedge fund currency exchange volatility"
    ),
    "sports": _words(
        "team goal match player coach season league score win ball fans game "
        "run kick field cup final race club champion play"
    ),
    "cooking": _words(
        "recipe onions garlic butter simmer oven flour sugar sauce pan bake "
        "roast chopped tablespoon minutes stir salt pepper dough cheese fry"
    ),
}
REAL_PROMPTS: dict[str, list[str]] = {
    "health": [
        "The main symptoms of diabetes are",
        "To lower blood pressure, doctors recommend",
        "A vaccine trains the immune system by",
        "Chronic inflammation in the body is caused by",
        "After a heart attack, patients should",
    ],
    "finance": [
        "When interest rates rise, bond prices",
        "A diversified investment portfolio contains",
        "Inflation reduces the value of savings because",
        "Stock market volatility is measured by",
        "A mortgage is a loan that",
    ],
    "sports": [
        "In football, a team scores a goal when",
        "The final match of the world cup was",
        "A good coach helps players to",
        "The fastest runners in the marathon race",
        "The basketball season ended with",
    ],
    "cooking": [
        "To bake bread, first mix the flour with",
        "A good tomato sauce needs garlic and",
        "Roast the chicken in the oven for",
        "To make pancakes, whisk the eggs with",
        "Chop the onions and fry them in butter until",
    ],
}


# --- the server, in a child process -------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    """``--serve``: ``sluicegate serve`` over TLS (and the Gemma-replaying engine)."""
    import uvicorn

    from sluicegate import cli

    plain_config = uvicorn.Config

    def tls_config(*a: Any, **k: Any) -> uvicorn.Config:
        k.update(ssl_certfile=args.cert, ssl_keyfile=args.key)
        return plain_config(*a, **k)

    uvicorn.Config = tls_config  # type: ignore[misc,assignment]
    plain_context = uvicorn.config.create_ssl_context

    def no_tickets(*a: Any, **k: Any) -> ssl.SSLContext:
        # TLS 1.3 session tickets come before or after the request, as it
        # happens; an observer drops them by their size, here none are sent.
        context = plain_context(*a, **k)
        context.num_tickets = 0
        return context

    uvicorn.config.create_ssl_context = no_tickets
    if args.corpus is not None:
        engine = _gemma_scripted_engine(Path(args.corpus))
        cli._build_engines = lambda _args: [engine]  # type: ignore[assignment]
    return cli.main(
        [
            "serve",
            f"--engine={'scripted' if args.corpus else 'llamacpp'}",
            f"--port={args.port}",
            "--no-ledger",
            "--log-level=warning",
        ]
    )


def _gemma_scripted_engine(corpus: Path) -> Any:
    """A scripted engine whose tokens are Gemma's: item ``seed`` of ``corpus``."""
    from sluicegate.engines.base import GenerateRequest
    from sluicegate.engines.llamacpp.vocab import load_vocab
    from sluicegate.engines.scripted.engine import ScriptedEngine
    from sluicegate.engines.scripted.vocab import ScriptedTokenizer
    from sluicegate.model import default_model_path

    gemma = load_vocab(default_model_path())
    items: list[list[int]] = json.loads(corpus.read_text())["ids"]

    class GemmaPieces(ScriptedTokenizer):
        """The toy tokenizer for prompts; Gemma's pieces for the outputs."""

        @property
        def pieces(self) -> Sequence[bytes]:
            return gemma.pieces

        @property
        def special_ids(self) -> frozenset[int]:
            return gemma.special_ids

        @property
        def stop_ids(self) -> frozenset[int]:
            return gemma.stop_ids

    def script(request: GenerateRequest) -> list[int]:
        return items[(request.params.seed or 0) % len(items)]

    return ScriptedEngine(
        script,
        tokenizer=GemmaPieces(),
        tokens_per_s=RATE,
        max_running=CONCURRENCY * 2,
        max_queued=1000,
    )


def _scripted_corpus(per_topic: int, rng: random.Random) -> tuple[list[Any], Any]:
    """``per_topic`` texts per topic, as Gemma ids of ``MAX_TOKENS`` tokens."""
    from sluicegate.engines.llamacpp.vocab import load_vocab
    from sluicegate.model import default_model_path

    gemma = load_vocab(default_model_path())
    labels, ids = [], []
    for topic, words in TOPICS.items():
        for _ in range(per_topic):
            pool = [rng.choice(words) if rng.random() < 0.4 else rng.choice(_COMMON)]
            while len(pool) < 4 * MAX_TOKENS:
                pool.append(
                    rng.choice(words) if rng.random() < 0.4 else rng.choice(_COMMON)
                )
            text = " " + " ".join(pool) + "."
            tokens = gemma.encode(text, add_special=False, parse_special=False)
            ids.append(tokens[:MAX_TOKENS])
            labels.append(topic)
    return labels, {"ids": ids}


def _certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed P-256 certificate for 127.0.0.1 (cert, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@contextlib.contextmanager
def _server(cert: Path, key: Path, corpus: Path | None) -> Iterator[int]:
    port = free_port()
    command = [sys.executable, __file__, "--serve", f"--port={port}"]
    command += [f"--cert={cert}", f"--key={key}"]
    if corpus is not None:
        command.append(f"--corpus={corpus}")
    log = cert.parent / f"server-{port}.log"
    server = ServerProcess(command, port, log_path=log, name="tls", cwd=ROOT)
    try:
        _wait_tls(port, server)
        yield port
    finally:
        server.stop(signal.SIGINT)


def _wait_tls(port: int, server: ServerProcess, timeout_s: float = 120.0) -> None:
    context = _client_tls()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            body = asyncio.run(_get(port, context, "/health"))
            if body.startswith(b"HTTP/1.1 200"):
                return
        except OSError:
            pass
        if server.process.poll() is not None:
            raise RuntimeError(f"the server exited:\n{server.log_text()}")
        time.sleep(0.5)
    raise RuntimeError("the server did not become healthy")


def _client_tls() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


async def _get(port: int, context: ssl.SSLContext, path: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
    )
    data = await reader.read()
    writer.close()
    return data


# --- the client and the capture -----------------------------------------------


@dataclass
class Stream:
    """One request as the client saw it, then the observer's records of it."""

    label: str
    item: int
    client_port: int = 0
    sent_at: float = 0.0
    tokens: list[tuple[float, int]] = field(default_factory=list)  # (time, bytes)
    texts: list[str] = field(default_factory=list)
    completion_tokens: int = 0
    records: list[tuple[float, int]] = field(default_factory=list)  # (time, bytes)


async def _stream(
    port: int, context: ssl.SSLContext, body: dict[str, Any], stream: Stream
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    stream.client_port = writer.get_extra_info("sockname")[1]
    raw = json.dumps(body).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n"
        "Connection: close\r\n\r\n"
    )
    stream.sent_at = time.time()
    writer.write(head.encode() + raw)
    decoder, buffer, in_body = SSEDecoder(), b"", False
    while data := await reader.read(65536):
        now = time.time()
        buffer += data
        if not in_body:
            if b"\r\n\r\n" not in buffer:
                continue
            buffer = buffer.split(b"\r\n\r\n", 1)[1]
            in_body = True
        body_bytes, buffer = _dechunk(buffer)
        for event in decoder.feed(body_bytes):
            _take(stream, now, event.data)
    writer.close()


def _dechunk(buffer: bytes) -> tuple[bytes, bytes]:
    """The complete chunks' data of an HTTP/1.1 chunked body, and the rest."""
    out = []
    while (end := buffer.find(b"\r\n")) >= 0:
        size = int(buffer[:end], 16)
        if len(buffer) < end + 2 + size + 2:
            break
        out.append(buffer[end + 2 : end + 2 + size])
        buffer = buffer[end + 2 + size + 2 :]
    return b"".join(out), buffer


def _take(stream: Stream, now: float, data: str) -> None:
    if data == "[DONE]":
        return
    payload = json.loads(data)
    if payload.get("usage"):
        stream.completion_tokens = payload["usage"]["completion_tokens"]
    for choice in payload.get("choices", []):
        text = choice.get("delta", {}).get("content")
        if text:
            stream.texts.append(text)
            stream.tokens.append((now, len(json.dumps(text, ensure_ascii=False)) - 2))


class Capture:
    """``tshark`` on the loopback port: every TLS record's time and length."""

    def __init__(self, port: int, directory: Path) -> None:
        self._out = directory / f"tshark-{port}.tsv"
        fields = ["frame.time_epoch", "tcp.srcport", "tcp.dstport", "tls.record.length"]
        command = ["tshark", "-i", "lo", "-f", f"tcp port {port}", "-l", "-Q"]
        command += ["-d", f"tcp.port=={port},tls", "-T", "fields", "-E", "separator=/t"]
        command += [arg for f in fields for arg in ("-e", f)]
        self._port = port
        self._file = self._out.open("w")
        self._process = subprocess.Popen(
            command, stdout=self._file, stderr=subprocess.DEVNULL
        )
        time.sleep(2.0)  # tshark needs a moment before it captures

    def stop(self) -> dict[int, list[tuple[float, int]]]:
        """Stop; server-to-client records per client port, in time order."""
        time.sleep(1.0)
        self._process.send_signal(signal.SIGINT)
        self._process.wait(timeout=30)
        self._file.close()
        records: dict[int, list[tuple[float, int]]] = {}
        requests: dict[int, float] = {}
        hellos: set[int] = set()
        for line in self._out.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) < 4 or not parts[3]:
                continue
            at, src, dst = float(parts[0]), int(parts[1]), int(parts[2])
            lengths = [int(x) + 5 for x in parts[3].split(",")]  # with the header
            if src == self._port:
                records.setdefault(dst, []).extend((at, n) for n in lengths)
            elif src not in hellos:
                hellos.add(src)  # the ClientHello, the client's first record
            elif max(lengths) > 200:  # the request, after the small Finished
                requests.setdefault(src, at)
        return {
            port: [r for r in rs if r[0] >= requests.get(port, 0.0)]
            for port, rs in records.items()
        }


async def _load(
    port: int, streams: list[Stream], bodies: list[dict[str, Any]], concurrency: int
) -> None:
    context = _client_tls()
    gate = asyncio.Semaphore(concurrency)

    async def one(stream: Stream, body: dict[str, Any]) -> None:
        async with gate:
            await _stream(port, context, body, stream)

    await asyncio.gather(*(one(s, b) for s, b in zip(streams, bodies, strict=True)))


def _run_corpus(
    corpus: str,
    labels: list[str],
    bodies: list[dict[str, Any]],
    paths: tuple[Path, Path, Path | None, Path],
) -> dict[str, list[Stream]]:
    """Every item under every setting, interleaved; streams by setting, in item
    order."""
    cert, key, corpus_file, tmp = paths
    runs = [(setting, i) for setting in SETTINGS for i in range(len(labels))]
    random.Random(13).shuffle(runs)
    streams = {setting: [Stream(label, i) for i, label in enumerate(labels)]
               for setting in SETTINGS}  # fmt: skip
    concurrency = CONCURRENCY if corpus == "scripted" else 1
    with _server(cert, key, corpus_file) as port:
        capture = Capture(port, tmp)
        asyncio.run(
            _load(
                port,
                [streams[setting][i] for setting, i in runs],
                [_with(bodies[i], SETTINGS[setting]) for setting, i in runs],
                concurrency,
            )
        )
        by_port = capture.stop()
    for stream in (s for group in streams.values() for s in group):
        stream.records = by_port.get(stream.client_port, [])
    return streams


def _with(body: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    return {**body, "stream_options": {**body["stream_options"], **options}}


# --- the attacks and the costs ------------------------------------------------


def _lengths_attack(streams: list[Stream]) -> dict[str, float]:
    """(a): learn the framing on the first streams, read the rest's lengths."""
    train, test = streams[:CALIBRATION_STREAMS], streams[CALIBRATION_STREAMS:]
    frame = _framing(train)
    exact = hits = total = chance_hits = aligned = 0
    for stream in test:
        truth = [n for _, n in stream.tokens]
        total += len(truth)
        mode = statistics.mode(truth) if truth else 0
        chance_hits += sum(n == mode for n in truth)
        if frame is None:
            continue
        head, tail, constant = frame
        sizes = [n for _, n in stream.records][head : len(stream.records) - tail]
        guess = [n - constant for n in sizes]
        if len(guess) == len(truth):
            aligned += 1
            hits += sum(g == t for g, t in zip(guess, truth, strict=True))
            exact += guess == truth
    chance_exact = sum(
        len(set(n for _, n in s.tokens)) <= 1 for s in test
    )  # the commonest length guessed for every token
    count = max(len(test), 1)
    return {
        "exact_sequences": exact / count,
        "exact_sequences_chance": chance_exact / count,
        "tokens": hits / max(total, 1),
        "tokens_chance": chance_hits / max(total, 1),
        "framing_found": frame is not None,
        "streams_aligned": aligned / count,
    }


def _framing(train: list[Stream]) -> tuple[int, int, int] | None:
    """The records before and after the tokens, and a record's constant, that
    explain the most calibration streams exactly (at least half of them);
    ``None`` when none does."""
    votes: dict[tuple[int, int, int], int] = {}
    for s in train:
        truth = [n for _, n in s.tokens]
        for head in range(6):
            for tail in range(6):
                sizes = [n for _, n in s.records][head : len(s.records) - tail]
                if len(sizes) != len(truth) or not truth:
                    continue
                constants = {a - b for a, b in zip(sizes, truth, strict=True)}
                if len(constants) == 1:
                    key = (head, tail, constants.pop())
                    votes[key] = votes.get(key, 0) + 1
    if not votes:
        return None
    best = max(votes, key=lambda k: votes[k])
    return best if 2 * votes[best] >= len(train) else None


def _features(stream: Stream) -> list[float]:
    """Sizes (relative to the stream's smallest record) and gaps (ms)."""
    sizes = [n for _, n in stream.records] or [0]
    times = [t for t, _ in stream.records] or [0.0]
    low = min(sizes)
    histogram = [0.0] * 64
    for n in sizes:
        histogram[min(n - low, 63)] += 1 / len(sizes)
    first = [float(n - low) for n in sizes[:24]]
    first += [0.0] * (24 - len(first))
    gaps = [(b - a) * 1000 for a, b in itertools.pairwise(times)] or [0.0]
    quantiles = statistics.quantiles(gaps, n=10) if len(gaps) > 1 else [0.0] * 9
    gap_histogram = [0.0] * 16  # quarter decades from 1 us
    for g in gaps:
        bucket = 0 if g <= 0.001 else int(4 * (math.log10(g) + 3))
        gap_histogram[min(max(bucket, 0), 15)] += 1 / len(gaps)
    first_gaps = gaps[:12] + [0.0] * (12 - len(gaps[:12]))
    summary = [
        float(len(sizes)), float(sum(sizes)), statistics.fmean(sizes),
        statistics.pstdev(sizes), statistics.fmean(gaps), statistics.pstdev(gaps),
        (times[-1] - times[0]) * 1000, float(len(set(sizes))),
    ]  # fmt: skip
    return histogram + first + quantiles + gap_histogram + first_gaps + summary


def _topic_attack(streams: list[Stream], seed: int) -> dict[str, float]:
    """(b): a random forest on sizes and times, 5-fold stratified CV."""
    import numpy as np
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.metrics import average_precision_score
    from sklearn.model_selection import StratifiedKFold, cross_val_predict
    from sklearn.preprocessing import label_binarize

    x = np.array([_features(s) for s in streams])
    classes = sorted(TOPICS)
    y = np.array([classes.index(s.label) for s in streams])
    folds = StratifiedKFold(n_splits=5, shuffle=True, random_state=seed)
    forest = RandomForestClassifier(n_estimators=300, random_state=seed, n_jobs=2)
    scores = cross_val_predict(forest, x, y, cv=folds, method="predict_proba")
    truth = label_binarize(y, classes=list(range(len(classes))))
    auprc = float(average_precision_score(truth, scores, average="macro"))
    base = float(np.mean(truth.mean(axis=0)))
    accuracy = float(np.mean(scores.argmax(axis=1) == y))
    return {"auprc": auprc, "base_rate": base, "accuracy": accuracy}


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def _char_arrivals(stream: Stream) -> list[float]:
    """The arrival time of each character of the stream's text (seconds)."""
    out: list[float] = []
    for (at, _), text in zip(stream.tokens, stream.texts, strict=True):
        out += [at] * len(text)
    return out


def _costs(streams: list[Stream], plain: list[Stream] | None) -> dict[str, Any]:
    """(c): bytes per token, client inter-token gaps, added per-token latency."""
    tokens = sum(s.completion_tokens or len(s.tokens) for s in streams)
    record_bytes = sum(n for s in streams for _, n in s.records)
    gaps = [
        (b[0] - a[0]) * 1000
        for s in streams
        for a, b in zip(s.tokens, s.tokens[1:], strict=False)
    ]
    added: list[float] = []
    for s, p in zip(streams, plain or [], strict=False):
        if "".join(s.texts) != "".join(p.texts):
            continue  # the real model answered differently: not comparable
        # When each of the plain run's tokens arrived, and when its last
        # character did here (events may carry several tokens).
        arrivals = _char_arrivals(s)
        end = 0
        for (u, _), text in zip(p.tokens, p.texts, strict=True):
            end += len(text)
            added.append(((arrivals[end - 1] - s.sent_at) - (u - p.sent_at)) * 1000)
    return {
        "bytes_per_token": record_bytes / max(tokens, 1),
        "itl_ms": {"p50": _percentile(gaps, 0.5), "p99": _percentile(gaps, 0.99)},
        "added_ms": {"p50": _percentile(added, 0.5), "p99": _percentile(added, 0.99)},
        "streams": len(streams),
        "streams_captured": sum(bool(s.records) for s in streams),
        "tokens": tokens,
    }


# --- the run ------------------------------------------------------------------


def _corpus_requests(
    corpus: str, per_topic: int, tmp: Path
) -> tuple[list[str], list[dict[str, Any]], Path | None]:
    if corpus == "scripted":
        labels, ids = _scripted_corpus(per_topic, random.Random(7))
        path = tmp / "corpus.json"
        path.write_text(json.dumps(ids))
        bodies = [
            {
                "model": "scripted",
                "messages": [{"role": "user", "content": "Tell me about it."}],
                "stream": True,
                "max_tokens": MAX_TOKENS,
                "seed": i,
                "stream_options": {"include_usage": True},
            }
            for i in range(len(labels))
        ]
        order = list(range(len(labels)))
        random.Random(3).shuffle(order)
        return [labels[i] for i in order], [bodies[i] for i in order], path
    labels, bodies = [], []
    for topic, prompts in REAL_PROMPTS.items():
        for prompt in prompts[:per_topic]:
            labels.append(topic)
            bodies.append(
                {
                    "messages": [{"role": "user", "content": prompt}],
                    "stream": True,
                    "max_tokens": REAL_MAX_TOKENS,
                    "temperature": 0,
                    "stream_options": {"include_usage": True},
                }
            )
    order = list(range(len(labels)))
    random.Random(5).shuffle(order)
    return [labels[i] for i in order], [bodies[i] for i in order], None


def _measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        cert, key = _certificate(tmp)
        for corpus, per_topic in (("scripted", args.scripted), ("real", args.real)):
            if per_topic <= 0:
                continue
            labels, bodies, corpus_file = _corpus_requests(corpus, per_topic, tmp)
            started = time.monotonic()
            paths = (cert, key, corpus_file, tmp)
            by_setting = _run_corpus(corpus, labels, bodies, paths)
            wall_s = time.monotonic() - started
            for setting, streams in by_setting.items():
                plain = None if setting == "none" else by_setting["none"]
                row = {
                    "corpus": corpus,
                    "setting": setting,
                    "lengths": _lengths_attack(streams),
                    "topic": _topic_attack(streams, seed=11),
                    **_costs(streams, plain),
                    "corpus_wall_s": wall_s,
                }
                print(json.dumps(row), file=sys.stderr, flush=True)
                rows.append(row)
    return rows


def _print(rows: list[dict[str, Any]]) -> None:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    head = (
        "| corpus | setting | exact length seqs (chance) | tokens read (chance) "
        "| topic AUPRC (base) | bytes/token | ITL p50/p99 ms | added p50/p99 ms |"
    )
    print(head)
    print("|" + "---|" * 8)
    for r in rows:
        a, b = r["lengths"], r["topic"]
        print(
            f"| {r['corpus']} | {r['setting']} "
            f"| {a['exact_sequences']:.0%} ({a['exact_sequences_chance']:.0%}) "
            f"| {a['tokens']:.0%} ({a['tokens_chance']:.0%}) "
            f"| {b['auprc']:.2f} ({b['base_rate']:.2f}) "
            f"| {r['bytes_per_token']:.0f} "
            f"| {ms(r['itl_ms']['p50'])} / {ms(r['itl_ms']['p99'])} "
            f"| {ms(r['added_ms']['p50'])} / {ms(r['added_ms']['p99'])} |"
        )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--scripted", type=int, default=40, help="scripted streams per topic")
    add("--real", type=int, default=5, help="real-model prompts per topic (max 5)")
    add("--quick", action="store_true", help="a few streams only (a smoke run)")
    add("--json", type=Path, default=RESULTS, help="where to write the results")
    add("--serve", action="store_true", help=argparse.SUPPRESS)
    add("--port", type=int, help=argparse.SUPPRESS)
    add("--cert", help=argparse.SUPPRESS)
    add("--key", help=argparse.SUPPRESS)
    add("--corpus", help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the bench (or, with ``--serve``, one TLS server)."""
    args = _parser().parse_args(argv)
    if args.serve:
        return _serve(args)
    if args.quick:
        args.scripted, args.real = 10, 0
    started = time.monotonic()
    load_before = os.getloadavg()
    rows = _measure(args)
    report = {
        "benchmark": "sidechannel",
        "max_tokens": {"scripted": MAX_TOKENS, "real": REAL_MAX_TOKENS},
        "scripted_rate_tokens_per_s": RATE,
        "cadence_ms": CADENCE_MS,
        "concurrency": {"scripted": CONCURRENCY, "real": 1},
        "cpus": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "python": platform.python_version(),
        "wall_s": time.monotonic() - started,
        "rows": rows,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    _print(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
