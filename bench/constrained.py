"""Constrained decoding: grammar compile time, and tokens/s constrained vs free.

Three parts, in process on the default model (the constraint acts in the
engine's sampling, so no HTTP is needed to measure it), for three constraints
built by ``server/prepare/constraints.py``: ``json_object``, the animal schema
(``{name: string, legs: integer, sounds: [string]}``, all required, nothing
else) and a named tool call (one block calling ``add_note(title, body)``).

- ``compile``: ``grammar_for`` (building the grammar and compiling it without
  the vocabulary: what the server does before its status line); compiling it
  against the vocabulary (``GrammarCompiler.constraint``), the first time and
  from the cache; the one-time build of llguidance's tokenizer; and for
  comparison llama.cpp's own path (its JSON-schema to GBNF converter and
  ``llama_sampler_init_grammar``).
- ``library``: one stream of the animal schema in a bare decode loop, greedy,
  with four samplers: none; llama.cpp's grammar sampler in the chain (it checks
  every candidate on every step); llama.cpp's grammar checked after sampling
  (the whole vocabulary only after a rejection); llguidance checked after
  sampling (``TokenConstraint``, what the engine runs). Besides tokens/s (the
  runs may differ in length: each grammar ends the JSON where the model does),
  the time spent sampling per token, and the slow steps (those that went over
  the whole vocabulary).
- ``engine``: ``LlamaCppEngine`` at 1 and 4 streams, each constraint against
  the same prompt unconstrained (``ignore_eos``, so it runs its ``max_tokens``).
  The rate is decode tokens/s: the tokens after every stream has its first one,
  over the time from then to the last (prefill is left out; the two differ in
  length). Each cell is the median of ``--repeats`` runs, the two kinds taking
  turns run by run.

Prints the tables and writes ``bench/results/constrained.json``. Not a test:
nothing here asserts a timing.

Run: ``.venv/bin/python bench/constrained.py [--repeats 5] [--max-tokens 64]``
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import llama_cpp as llama
import numpy as np
from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf
from rich.console import Console
from rich.table import Table

from sluicegate.engines.base import GenerateRequest, Grammar, SamplingParams
from sluicegate.engines.llamacpp.engine import LlamaCppEngine
from sluicegate.engines.llamacpp.grammar import GrammarCompiler, TokenConstraint
from sluicegate.engines.llamacpp.vocab import LlamaTokenizer, quiet_logs
from sluicegate.model import default_model_path
from sluicegate.server.prepare.constraints import grammar_for

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "constrained.json"

ANIMAL = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "legs": {"type": "integer"},
        "sounds": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "legs", "sounds"],
    "additionalProperties": False,
}
NOTE = {
    "type": "function",
    "function": {
        "name": "add_note",
        "parameters": {
            "type": "object",
            "properties": {"title": {"type": "string"}, "body": {"type": "string"}},
            "required": ["title", "body"],
            "additionalProperties": False,
        },
    },
}
CASES: dict[str, tuple[dict[str, Any], str]] = {
    "json_object": (
        {"response_format": {"type": "json_object"}},
        "Describe a cat as a JSON object with many fields.",
    ),
    "animal schema": (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "animal", "schema": ANIMAL},
            }
        },
        "Describe a cat as JSON with name, legs and sounds.",
    ),
    "named tool call": (
        {
            "tools": [NOTE],
            "tool_choice": {"type": "function", "function": {"name": "add_note"}},
        },
        "Write a long note about the history of cats.",
    ),
}


def chat(user: str) -> str:
    return f"<start_of_turn>user\n{user}<end_of_turn>\n<start_of_turn>model\n"


def grammar_of(case: str) -> Grammar:
    grammar = grammar_for(**CASES[case][0])
    assert grammar is not None
    return grammar


def _ms(fn: Any, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def compile_times(tokenizer: LlamaTokenizer, model: Any) -> list[dict[str, Any]]:
    """Milliseconds to build each grammar, on each path (median of 5)."""
    compiler = GrammarCompiler(tokenizer)
    start = time.perf_counter()
    compiler.lltokenizer()
    tokenizer_ms = (time.perf_counter() - start) * 1000
    params = SamplingParams(max_tokens=1)
    vocab = llama.llama_model_get_vocab(model)
    rows = []
    for case in CASES:
        grammar = grammar_of(case)
        start = time.perf_counter()
        compiler.constraint(grammar, params)
        first_ms = (time.perf_counter() - start) * 1000
        if case == "json_object":
            gbnf = JSON_GBNF
        elif case == "animal schema":
            gbnf = json_schema_to_gbnf(json.dumps(ANIMAL))
        else:
            gbnf = None  # the block grammar exists only in llguidance's dialect

        def llama_grammar(text: str | None = gbnf) -> None:
            if text is not None:
                sampler = llama.llama_sampler_init_grammar(
                    vocab, text.encode(), b"root"
                )
                llama.llama_sampler_free(sampler)

        rows.append(
            {
                "case": case,
                "grammar_for_ms": _ms(lambda c=case: grammar_of(c)),
                "vocab_compile_first_ms": first_ms,
                "vocab_compile_cached_ms": _ms(
                    lambda g=grammar: compiler.constraint(g, params)
                ),
                "llamacpp_gbnf_ms": None if gbnf is None else _ms(llama_grammar),
                "lltokenizer_build_ms": tokenizer_ms,
            }
        )
    return rows


class _BareLoop:
    """One sequence decoded greedily on the low-level bindings (bench/engine.py's)."""

    def __init__(self, model: Any, tokenizer: LlamaTokenizer, threads: int) -> None:
        cparams = llama.llama_context_default_params()
        cparams.n_ctx = 2048
        cparams.n_batch = cparams.n_ubatch = 256
        cparams.n_seq_max = 1
        cparams.n_threads = cparams.n_threads_batch = threads
        self.ctx = llama.llama_init_from_model(model, cparams)
        self.batch = llama.llama_batch_init(256, 0, 1)
        self.vocab = llama.llama_model_get_vocab(model)
        self.tokenizer = tokenizer
        n = tokenizer.vocab_size
        self.cells = np.zeros(
            n,
            dtype=np.dtype(
                [("id", np.int32), ("logit", np.float32), ("p", np.float32)]
            ),
        )
        self.cells["id"] = np.arange(n)
        self.one = (llama.llama_token_data * 1)()

    def _decode(self, tokens: list[int], pos: int) -> None:
        b = self.batch
        for i, token in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i] = token, pos + i, 1
            b.seq_id[i][0], b.logits[i] = 0, int(i == len(tokens) - 1)
        b.n_tokens = len(tokens)
        assert llama.llama_decode(self.ctx, b) == 0

    def _rejects(self, grammar: Any, token: int) -> bool:
        self.one[0] = llama.llama_token_data(token, 1.0, 0.0)
        single = llama.llama_token_data_array(self.one, 1, -1, False)
        llama.llama_sampler_apply(grammar, ctypes.byref(single))
        return bool(self.one[0].logit == float("-inf"))

    def _resample(self, grammar: Any, chain: Any) -> int:
        n = self.tokenizer.vocab_size
        logits = llama.llama_get_logits_ith(self.ctx, -1)
        self.cells["logit"] = np.ctypeslib.as_array(logits, shape=(n,))
        data = self.cells.ctypes.data_as(llama.llama_token_data_p)
        cells = llama.llama_token_data_array(data, n, -1, False)
        llama.llama_sampler_apply(grammar, ctypes.byref(cells))
        llama.llama_sampler_apply(chain, ctypes.byref(cells))
        return int(cells.data[cells.selected].id)

    def run(
        self, way: str, prompt: list[int], max_tokens: int, llg: Any
    ) -> dict[str, Any]:
        llama.llama_memory_clear(llama.llama_get_memory(self.ctx), True)
        self._decode(prompt, 0)
        chain = llama.llama_sampler_chain_init(
            llama.llama_sampler_chain_default_params()
        )
        gbnf = json_schema_to_gbnf(json.dumps(ANIMAL)).encode()
        grammar = None
        if way.startswith("llama.cpp"):
            grammar = llama.llama_sampler_init_grammar(self.vocab, gbnf, b"root")
        if way == "llama.cpp grammar in the chain":
            llama.llama_sampler_chain_add(chain, grammar)
        llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_greedy())
        constraint: TokenConstraint | None = llg() if way == "llguidance" else None
        stops, out, rejections = self.tokenizer.stop_ids, [], 0
        sampling_s = 0.0
        start = time.perf_counter()
        for pos in range(len(prompt), len(prompt) + max_tokens):
            sampled_at = time.perf_counter()
            if constraint is not None:
                token = constraint.sample(chain, self.ctx, -1)
            else:
                token = llama.llama_sampler_sample(chain, self.ctx, -1)
                if way == "llama.cpp grammar, checked after sampling":
                    if self._rejects(grammar, token):
                        rejections += 1
                        token = self._resample(grammar, chain)
                    llama.llama_sampler_accept(grammar, token)
            sampling_s += time.perf_counter() - sampled_at
            out.append(token)
            if token in stops:
                break
            self._decode([token], pos)
        wall = time.perf_counter() - start
        llama.llama_sampler_free(chain)
        if grammar is not None and way != "llama.cpp grammar in the chain":
            llama.llama_sampler_free(grammar)
        if constraint is not None:
            rejections = constraint.masks
        return {
            "way": way,
            "tokens": len(out),
            "tokens_per_s": len(out) / wall,
            "sampling_ms_per_token": sampling_s * 1000 / len(out),
            "slow_steps": rejections
            if way != "llama.cpp grammar in the chain"
            else len(out),
        }


LIBRARY_WAYS = [
    "unconstrained",
    "llama.cpp grammar in the chain",
    "llama.cpp grammar, checked after sampling",
    "llguidance",
]


def library(
    model: Any, tokenizer: LlamaTokenizer, threads: int, max_tokens: int, repeats: int
) -> list[dict[str, Any]]:
    loop = _BareLoop(model, tokenizer, threads)
    compiler = GrammarCompiler(tokenizer)
    grammar = grammar_of("animal schema")
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    prompt = tokenizer.encode(
        chat(CASES["animal schema"][1]), add_special=True, parse_special=True
    )
    runs: dict[str, list[dict[str, Any]]] = {w: [] for w in LIBRARY_WAYS}
    for _ in range(repeats):
        for way in LIBRARY_WAYS:
            runs[way].append(
                loop.run(
                    way,
                    prompt,
                    max_tokens,
                    lambda: compiler.constraint(grammar, params),
                )
            )
    rows = []
    for results in runs.values():
        rows.append(sorted(results, key=lambda r: r["tokens_per_s"])[len(results) // 2])
    return rows


async def _engine_run(
    engine: LlamaCppEngine, case: str, streams: int, constrained: bool, max_tokens: int
) -> tuple[int, float]:
    """(decode tokens, seconds) of ``streams`` concurrent requests."""
    prompt = tuple(
        engine.tokenizer.encode(
            chat(CASES[case][1]), add_special=True, parse_special=True
        )
    )
    grammar = grammar_of(case) if constrained else None
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=0.0,
        grammar=grammar,
        ignore_eos=not constrained,
    )
    firsts: list[float] = []
    stamps: list[float] = []

    async def one(i: int) -> None:
        rid = f"{case}-{constrained}-{i}-{time.monotonic_ns()}"
        seen = False
        async for _ in engine.generate(GenerateRequest(rid, prompt, params)):
            now = time.perf_counter()
            if not seen:
                firsts.append(now)
                seen = True
            else:
                stamps.append(now)

    await asyncio.gather(*(one(i) for i in range(streams)))
    start = max(firsts)
    after = [t for t in stamps if t > start]
    return len(after), (max(after) - start) if after else float("nan")


def engine_rates(
    threads: int, max_tokens: int, repeats: int, levels: list[int]
) -> list[dict[str, Any]]:
    engine = LlamaCppEngine(
        default_model_path(), n_ctx=4096, n_parallel=max(levels), n_threads=threads
    )

    async def measure() -> list[dict[str, Any]]:
        await _engine_run(engine, "animal schema", 1, True, 8)  # warm-up, tokenizer
        rows = []
        for case in CASES:
            for streams in levels:
                rates: dict[bool, list[float]] = {True: [], False: []}
                tokens: dict[bool, list[int]] = {True: [], False: []}
                for _ in range(repeats):
                    for constrained in (False, True):
                        n, wall = await _engine_run(
                            engine, case, streams, constrained, max_tokens
                        )
                        rates[constrained].append(n / wall)
                        tokens[constrained].append(n)
                free = statistics.median(rates[False])
                bound = statistics.median(rates[True])
                rows.append(
                    {
                        "case": case,
                        "streams": streams,
                        "unconstrained_tokens_per_s": free,
                        "constrained_tokens_per_s": bound,
                        "ratio": bound / free,
                        "constrained_decode_tokens": statistics.median(tokens[True]),
                    }
                )
        await engine.aclose()
        return rows

    return asyncio.run(measure())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--repeats", type=int, default=5, help="runs per cell; median shown"
    )
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    console = Console()
    quiet_logs()
    model = llama.llama_model_load_from_file(
        str(default_model_path()).encode(), llama.llama_model_default_params()
    )
    tokenizer = LlamaTokenizer(model)

    compiled = compile_times(tokenizer, model)
    table = Table(title="grammar compile time, ms (median of 5)")
    for col in [
        "constraint",
        "grammar_for",
        "vocab, first",
        "vocab, cached",
        "llama.cpp GBNF",
    ]:
        table.add_column(col, justify="right")
    for r in compiled:
        gbnf = r["llamacpp_gbnf_ms"]
        table.add_row(
            r["case"],
            f"{r['grammar_for_ms']:.2f}",
            f"{r['vocab_compile_first_ms']:.2f}",
            f"{r['vocab_compile_cached_ms']:.3f}",
            "-" if gbnf is None else f"{gbnf:.3f}",
        )
    console.print(table)
    console.print(
        "llguidance tokenizer, built once: "
        f"{compiled[0]['lltokenizer_build_ms']:.0f} ms"
    )

    lib = library(model, tokenizer, args.threads, args.max_tokens, args.repeats)
    table = Table(title="animal schema, 1 stream, bare loop, greedy: which library")
    for col in [
        "sampler",
        "tokens",
        "tok/s",
        "vs free",
        "sampling ms/token",
        "slow steps",
    ]:
        table.add_column(col, justify="right")
    free = lib[0]["tokens_per_s"]
    for r in lib:
        table.add_row(
            r["way"],
            str(r["tokens"]),
            f"{r['tokens_per_s']:.1f}",
            f"{r['tokens_per_s'] / free:.0%}",
            f"{r['sampling_ms_per_token']:.2f}",
            str(r["slow_steps"]),
        )
    console.print(table)
    llama.llama_model_free(model)

    rates = engine_rates(args.threads, args.max_tokens, args.repeats, levels)
    table = Table(title=f"LlamaCppEngine decode tokens/s, max_tokens {args.max_tokens}")
    for col in [
        "constraint",
        "streams",
        "unconstrained",
        "constrained",
        "ratio",
        "tokens",
    ]:
        table.add_column(col, justify="right")
    for r in rates:
        table.add_row(
            r["case"],
            str(r["streams"]),
            f"{r['unconstrained_tokens_per_s']:.1f}",
            f"{r['constrained_tokens_per_s']:.1f}",
            f"{r['ratio']:.0%}",
            f"{r['constrained_decode_tokens']:.0f}",
        )
    console.print(table)
    report = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "date": time.strftime("%Y-%m-%d"),
        "command": "bench/constrained.py " + " ".join(sys.argv[1:]),
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "threads": args.threads,
        "compile": compiled,
        "library": lib,
        "engine": rates,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
