"""The ctypes side of a step: a llama.cpp context sized for it, a plan in its batch.

``new_context`` makes the context one engine decodes in: ``n_ctx`` KV cells
shared by all sequences (a unified KV cache), ``n_parallel`` sequence slots, and
a batch of ``step_tokens`` tokens. ``fill_batch`` writes one step's plan (the
scheduler's ``PlannedChunk`` list) into a ``llama_batch``: each chunk's tokens
at their positions in the sequence's slot, with logits asked for where the
chunk wants the next token sampled. ``usable_cores`` is the default thread
count: the cores this process may run on. ``trim_memory`` removes cells.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

import llama_cpp as llama

from sluicegate.core.scheduling import PlannedChunk, Scheduled

__all__ = ["fill_batch", "new_context", "trim_memory", "usable_cores"]

log = logging.getLogger(__name__)

_S = TypeVar("_S", bound=Scheduled)


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity mask, not the machine's.

    A process confined to some cores (``taskset``, a container's cpuset, one
    test worker of several) that starts one llama.cpp thread per core of the
    machine has threads waiting for each other's turn at every decode step.

    Returns:
        The number of CPUs in ``os.sched_getaffinity(0)`` (Linux); where the
        platform has no affinity mask, ``os.cpu_count()``. At least 1.
    """
    getaffinity = getattr(os, "sched_getaffinity", None)
    if getaffinity is None:  # pragma: no cover - platforms without affinity
        return os.cpu_count() or 1
    return max(1, len(getaffinity(0)))


def new_context(
    model: Any,
    n_ctx: int,
    n_parallel: int,
    step_tokens: int,
    n_threads: int | None,
    *,
    swa_full: bool = True,
) -> Any:
    """A llama.cpp context over ``model``; a null pointer when llama.cpp fails.

    Args:
        model: the loaded ``llama_model``.
        n_ctx: KV cells shared by all sequences (tokens).
        n_parallel: sequence slots.
        step_tokens: tokens of one batch (and of one micro-batch).
        n_threads: CPU threads for decoding, one token or a batch (``None``:
            ``usable_cores()``).
        swa_full: keep every cell of a sequence in the sliding-window layers
            (llama.cpp's ``swa_full``; its own default). ``False``, as
            llama-server has it: those layers keep only the window's cells
            (plus a micro-batch), so a sequence's prefix beyond the window
            cannot be read back from them (no prefix reuse).
    """
    cparams = llama.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = step_tokens
    cparams.n_ubatch = step_tokens
    cparams.n_seq_max = n_parallel
    cparams.n_threads = cparams.n_threads_batch = n_threads or usable_cores()
    cparams.kv_unified = True
    cparams.swa_full = swa_full
    cparams.no_perf = True
    return llama.llama_init_from_model(model, cparams)


def fill_batch(
    batch: Any, plan: Sequence[PlannedChunk[_S]]
) -> tuple[int, list[tuple[_S, int]]]:
    """Write ``plan`` into ``batch`` (``llama_batch_init`` sized for it).

    Returns:
        The number of tokens written (also set as ``batch.n_tokens``), and the
        batch index whose logits each sampling sequence reads, in plan order.
    """
    n = 0
    logits_at: list[tuple[_S, int]] = []
    for chunk in plan:
        seq, tokens, pos = chunk.seq, chunk.tokens, chunk.first_pos
        for i, token in enumerate(tokens):
            batch.token[n] = token
            batch.pos[n] = pos + i
            batch.n_seq_id[n] = 1
            batch.seq_id[n][0] = seq.slot
            last = chunk.wants_logits and i == len(tokens) - 1
            batch.logits[n] = 1 if last else 0
            if last:
                logits_at.append((seq, n))
            n += 1
    batch.n_tokens = n
    return n, logits_at


def trim_memory(memory: Any, trims: Iterable[tuple[int, int]]) -> int:
    """Remove each ``(sequence id, first position)``'s cells from that position on.

    Returns:
        The cells llama.cpp's memory still holds past a trimmed position
        (tokens; 0 unless llama.cpp failed to remove them, which is logged).
    """
    leaked = 0
    for seq_id, first in trims:
        llama.llama_memory_seq_rm(memory, seq_id, first, -1)
        left = llama.llama_memory_seq_pos_max(memory, seq_id) + 1 - first
        if left > 0:  # pragma: no cover - only if llama.cpp failed to remove them
            log.error("sequence %d still holds %d KV cells", seq_id, left)
            leaked += left
    return leaked
