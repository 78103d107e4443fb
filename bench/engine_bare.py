"""A diagnostic for bench/engine.py: the bare decode loop on the llama.cpp bindings.

B sequences, one prefill each, then one token per sequence per ``llama_decode``
with greedy sampling: no HTTP, no detokenizing, no scheduler. What it leaves out
of a server's step is what a server adds to it.

Run: ``.venv/bin/python bench/engine_bare.py [--concurrency 1,16] [--max-tokens 128]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from sluicegate.model import default_model_path

PROMPT = "Once upon a time, in a lighthouse by the sea, there lived"


def bare_loop(
    model: Path, batch: int, max_tokens: int, threads: int, n_ctx: int, n_seq: int
) -> tuple[float, float]:
    """Tokens/s and the median time to first token (s) of ``batch`` sequences.

    The context has the server's shape (``n_ctx`` unified KV cells for ``n_seq``
    sequences): attention runs over the cells of the cache, so a smaller cache
    would make the loop faster than any server configured for 16 streams.
    """
    import llama_cpp as llama

    from sluicegate.engines.llamacpp.vocab import LlamaTokenizer, quiet_logs

    quiet_logs()
    mparams = llama.llama_model_default_params()
    mdl = llama.llama_model_load_from_file(str(model).encode(), mparams)
    vocab = LlamaTokenizer(mdl)
    prompt = vocab.encode(PROMPT, add_special=True, parse_special=False)
    cparams = llama.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = cparams.n_ubatch = max(256, batch)
    cparams.n_seq_max = n_seq
    cparams.n_threads = cparams.n_threads_batch = threads
    cparams.kv_unified = True
    ctx = llama.llama_init_from_model(mdl, cparams)
    lb = llama.llama_batch_init(max(256, batch), 0, 1)
    samplers = []
    for _ in range(batch):
        chain = llama.llama_sampler_chain_init(
            llama.llama_sampler_chain_default_params()
        )
        llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_greedy())
        samplers.append(chain)

    def fill(entries: list[tuple[int, int, int, bool]]) -> None:
        for i, (token, pos, seq, logits) in enumerate(entries):
            lb.token[i], lb.pos[i], lb.n_seq_id[i] = token, pos, 1
            lb.seq_id[i][0], lb.logits[i] = seq, int(logits)
        lb.n_tokens = len(entries)

    # Warm-up, as the servers get one request before timing: the first decode
    # of a context allocates its compute buffers.
    fill([(t, p, 0, p == len(prompt) - 1) for p, t in enumerate(prompt)])
    llama.llama_decode(ctx, lb)
    llama.llama_memory_seq_rm(llama.llama_get_memory(ctx), -1, -1, -1)
    start = time.perf_counter()
    last = []
    ttfts = []
    for seq in range(batch):  # one prefill per sequence, as a server would
        fill([(t, p, seq, p == len(prompt) - 1) for p, t in enumerate(prompt)])
        llama.llama_decode(ctx, lb)
        last.append(llama.llama_sampler_sample(samplers[seq], ctx, len(prompt) - 1))
        ttfts.append(time.perf_counter() - start)
    produced = batch
    for step in range(1, max_tokens):
        fill([(last[s], len(prompt) + step - 1, s, True) for s in range(batch)])
        llama.llama_decode(ctx, lb)
        last = [llama.llama_sampler_sample(samplers[s], ctx, s) for s in range(batch)]
        produced += batch
    wall = time.perf_counter() - start
    for chain in samplers:
        llama.llama_sampler_free(chain)
    llama.llama_batch_free(lb)
    llama.llama_free(ctx)
    llama.llama_model_free(mdl)
    return produced / wall, statistics.median(ttfts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,4,8,16")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--n-ctx", type=int, default=8192)
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    for c in levels:
        rate, ttft = bare_loop(
            default_model_path(), c, args.max_tokens, args.threads, args.n_ctx, 16
        )
        print(f"{c:3d} streams: {rate:7.1f} tok/s, TTFT p50 {1000 * ttft:6.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
