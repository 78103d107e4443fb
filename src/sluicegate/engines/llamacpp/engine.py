"""LlamaCppEngine: continuous batching over llama.cpp, run in one worker thread.

Each step is one ``llama_decode`` over the batch ``BatchScheduler`` plans (admission,
KV cells, aborts, prompt chunks paced by the step times the worker reports).
This module keeps what needs llama.cpp: the batch (``batch``), the samplers
(``sampling``), the KV memory, the worker thread and the hand-off (``handoff``).

Threading: the worker thread owns the llama.cpp context; the event loop touches
plain Python state under ``_lock`` only. One step's outputs reach their requests'
``SequenceOutputs`` through one ``loop.call_soon_threadsafe`` (one wake-up of the
loop per step): the worker never waits on a consumer. ``llama_decode`` frees the GIL.

Capacity: ``n_parallel`` sequences at once and ``n_ctx`` KV cells shared by all
(a unified KV cache). A request is admitted (FIFO) when its prompt plus its
``max_tokens`` fits in the cells not yet reserved: no sequence runs out mid-stream.

Abort: ``abort(id)`` removes a queued request at once; a prefilling or decoding
one is dropped before the next step (tokens of a step already running: waste).

Prefix reuse: the KV cells of a sequence that left stay in its slot
(``core/prefix_cache.py``); a prompt that starts with the same tokens gets that
slot and reads only the rest, its first output saying how many
(``EngineOutput.cached_tokens``); ``trim_memory`` removes the rest before a step.

Deliberate divergence from the house rule on ``except Exception`` (the stream's
outermost frame and the CLI only): the worker catches any exception of one step
and fails only that batch's sequences with an ``EngineError``, because an escaped
exception would end the thread and leave every other request waiting forever.
What still ends the worker (an exception outside a step, a ``BaseException``) is
logged, every request it held gets an ``EngineError``, later ones
``EngineUnavailable``, and ``stats().failure`` says why (the server exits
non-zero). A fault in native code kills the process before any of this:
``sluicegate doctor`` runs the same engine in a child process to catch that.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import Any

import llama_cpp as llama

from sluicegate.core.errors import EngineError, EngineUnavailable
from sluicegate.core.events import EngineOutput, TokenLogprob
from sluicegate.core.prefix_cache import PrefixCache
from sluicegate.core.scheduling import BatchScheduler, Phase, PlannedChunk
from sluicegate.engines.base import (
    Capabilities,
    EngineStats,
    GenerateRequest,
    Grammar,
    ModelInfo,
    TokenEngineBase,
)
from sluicegate.engines.llamacpp.batch import fill_batch, new_context, trim_memory
from sluicegate.engines.llamacpp.grammar import GrammarCompiler, GrammarError
from sluicegate.engines.llamacpp.handoff import ABORTED, Handoff, after_current_callback
from sluicegate.engines.llamacpp.handoff import LlamaSequence as _Sequence
from sluicegate.engines.llamacpp.sampling import Sampling
from sluicegate.engines.llamacpp.stats import Counters
from sluicegate.engines.llamacpp.vocab import LlamaTokenizer, load_vocab, quiet_logs
from sluicegate.engines.outputs import SequenceOutputs

__all__ = ["LlamaCppEngine", "load_vocab"]

log = logging.getLogger(__name__)

_CAN = dict(grammars=True, logprobs=True, listenable=True, reasoning_budgets=True)
"""What the engine declares (``Capabilities``), prefix reuse aside: when on."""
_Plan = list[PlannedChunk[_Sequence]]


class LlamaCppEngine(TokenEngineBase[LlamaTokenizer, SequenceOutputs[EngineOutput]]):
    """A ``TokenEngine`` over a GGUF model in llama.cpp (CPU by default): grammars
    (compiled ahead by ``compile_grammar``), logprobs, listenable outputs.

    Args:
        model_path: a GGUF file.
        model_id: the id clients address the model by.
        n_ctx: KV cells shared by all sequences (tokens); also the longest
            sequence (prompt + completion) the engine serves.
        n_parallel: sequences decoded together in one step.
        step_tokens: token budget of one step (decode tokens + prefill chunk).
        chunk_tokens, step_ratio: how prompts are cut among decoding
            sequences (``BatchScheduler``: ``EngineConfig`` has the defaults).
        n_threads: CPU threads for llama.cpp (default: one per core this
            process may run on, ``batch.usable_cores``).
        queue_limit: requests that may wait for admission; more raise
            ``EngineUnavailable`` from ``generate``.
        prefix_cache: keep finished sequences' KV cells for prompts that
            start alike (16 tokens or more; ``EngineConfig`` says why it is off).
        swa_full: keep every cell in a sliding-window model's window layers
            (``batch.new_context``); prefix reuse reads them.

    Raises:
        FileNotFoundError: ``model_path`` cannot be loaded.
        ValueError: ``prefix_cache`` without ``swa_full``.
    """

    def __init__(
        self,
        model_path: str | Path,
        *,
        model_id: str | None = None,
        n_ctx: int = 8192,
        n_parallel: int = 4,
        step_tokens: int = 128,
        chunk_tokens: int | None = None,
        step_ratio: float | None = None,
        n_threads: int | None = None,
        queue_limit: int = 64,
        prefix_cache: bool = False,
        swa_full: bool = True,
    ) -> None:
        if prefix_cache and not swa_full:
            raise ValueError("prefix reuse needs the full sliding-window cache")
        quiet_logs()
        path = Path(model_path)
        mparams = llama.llama_model_default_params()
        self._model_ptr = llama.llama_model_load_from_file(str(path).encode(), mparams)
        if not self._model_ptr:
            raise FileNotFoundError(f"cannot load a GGUF model from {str(path)!r}")
        tokenizer = LlamaTokenizer(self._model_ptr, path)
        self._grammars = GrammarCompiler(tokenizer)
        # llguidance's view of the vocabulary takes about a second: built beside
        # the start-up, not by the worker on the first constrained request.
        threading.Thread(
            target=self._grammars.lltokenizer, name="llguidance-vocab", daemon=True
        ).start()
        train_ctx = llama.llama_model_n_ctx_train(self._model_ptr)
        self._n_ctx = min(n_ctx, train_ctx) if train_ctx > 0 else n_ctx
        self._n_parallel = n_parallel
        self._step_tokens = max(step_tokens, n_parallel)
        shape = (self._n_ctx, n_parallel, self._step_tokens, n_threads)
        self._ctx = new_context(self._model_ptr, *shape, swa_full=swa_full)
        if not self._ctx:
            llama.llama_model_free(self._model_ptr)
            raise EngineError(f"llama.cpp could not create a context of {n_ctx} cells")
        self._memory = llama.llama_get_memory(self._ctx)
        self._sampling = Sampling(self._ctx, tokenizer, self._grammars)
        self._batch = llama.llama_batch_init(self._step_tokens, 0, 1)
        model = ModelInfo(model_id or path.stem, self._n_ctx, int(path.stat().st_mtime))
        can = Capabilities(**_CAN, prefix_cache=prefix_cache)
        super().__init__(model, tokenizer, can, SequenceOutputs[EngineOutput])
        self._queue_limit = queue_limit
        self._lock = threading.Condition()
        self._scheduler = BatchScheduler[_Sequence](
            kv_cells=self._n_ctx,
            slots=n_parallel,
            step_tokens=self._step_tokens,
            queue_limit=queue_limit,
            chunk_tokens=chunk_tokens,
            step_ratio=step_ratio,
            prefix_cache=PrefixCache(enabled=prefix_cache),
        )
        self._leaked_cells = 0
        self._handoff = Handoff[_Sequence](self._lock)
        self._counters = Counters()
        self._closed = False
        self._failure: str | None = None  # why the worker died, if it did
        self._submitter: asyncio.AbstractEventLoop | None = None
        self._fault: BaseException | None = None  # for tests: fail the next step
        self._worker = threading.Thread(
            target=self._run, name="llamacpp-engine", daemon=True
        )
        self._worker.start()

    # -- the TokenEngine protocol --------------------------------------------

    def generate(self, request: GenerateRequest) -> SequenceOutputs[EngineOutput]:
        """Queue ``request`` now; its outputs hold one ``EngineOutput`` per step.

        Admission errors are raised by this call, before any output, so that a
        server can still answer with a status code. The outputs end after the
        one that carries ``finish_reason``, or without one when the request was
        aborted. Closing them early aborts the request.

        Raises:
            EngineUnavailable: the queue is full or the engine is closed.
            RequestError: the prompt is empty, or the prompt plus ``max_tokens``
                can never fit in the KV cells, or the request id is running.
            EngineError: from the iterator, when a decode step failed.
        """
        params = request.params
        self._scheduler.check(request.prompt_token_ids, params.max_tokens)
        seq = _Sequence(
            request.request_id,
            request.prompt_token_ids,
            params.max_tokens,
            self._stop_ids(params),
            request=request,
            loop=asyncio.get_running_loop(),
            outputs=self._open(request.request_id),
        )
        with self._lock:
            if self._failure is not None:
                raise EngineUnavailable(f"the engine stopped: {self._failure}")
            if self._closed:
                raise EngineUnavailable("the engine is shutting down")
            self._scheduler.submit(seq)
            self._submitter = seq.loop
            self._lock.notify_all()
        return seq.outputs

    def abort(self, request_id: str, *, stopped: bool = False) -> None:
        """Stop ``request_id`` before the next step and free its KV cells.

        Idempotent; a no-op for unknown or finished requests. Never blocks on a
        decode step. ``stopped`` (a stop string matched): counted as finished.
        """
        with self._lock:
            left = self._scheduler.abort(request_id)
            if left is not None:  # it was queued
                self._counters.count_abort(request_id, stopped)
                self._handoff.emit(left, ABORTED)
            elif stopped and request_id in self._scheduler.running:
                self._counters.stopped_ids.add(request_id)  # reaped next
            self._lock.notify_all()
        self._handoff.flush()

    def stats(self) -> EngineStats:
        """Queue depth, running sequences, KV cells used/total, token counters."""
        with self._lock:
            return self._counters.snapshot(
                self._scheduler,
                kv_cells_total=self._n_ctx,
                failure=self._failure,
                submit_limit=self._queue_limit,
            )

    async def aclose(self) -> None:
        """Abort every request, stop the worker and free the model."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._scheduler.flag_all()
            self._lock.notify_all()
        await asyncio.to_thread(self._worker.join)
        llama.llama_batch_free(self._batch)
        llama.llama_free(self._ctx)
        llama.llama_model_free(self._model_ptr)

    def compile_grammar(self, grammar: Grammar) -> None:
        """Compile ``grammar`` for this vocabulary now, in the caller's thread
        (``TokenEngine.compile_grammar``), so that the worker does not stall every
        sequence to compile it on the request's first draw."""
        self._grammars.compile(grammar)

    def inject_fault(self, error: BaseException) -> None:
        """Make the next decode step raise ``error`` (for tests of failure paths)."""
        with self._lock:
            self._fault = error
            self._lock.notify_all()

    # -- the worker thread ---------------------------------------------------

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # the worker must never end in silence
            self._die(exc)

    def _die(self, exc: BaseException) -> None:
        """The worker is ending on ``exc``: fail every request it holds."""
        log.critical("the llama.cpp engine worker died: %r", exc, exc_info=exc)
        error = EngineError(f"the engine stopped: {exc!r}")
        with self._lock:
            self._failure = repr(exc)
            self._closed = True
            # No llama.cpp call here: the context may be what failed.
            running, queued = self._scheduler.drain()
            for seq in [*running, *queued]:
                self._counters.failed += 1
                self._handoff.emit(seq, error)
        self._handoff.flush()

    def _serve(self) -> None:
        scheduler = self._scheduler
        while True:
            with self._lock:
                woken = False
                while not self._closed and scheduler.idle:
                    self._lock.wait()
                    woken = True
                submitter = None if self._closed else self._submitter
            if woken and submitter is not None:
                after_current_callback(submitter)
            with self._lock:
                if self._closed:
                    self._drop_all()
                    return
                self._reap_aborted()
                for seq in scheduler.admit():
                    self._sampling.start(seq)
                # Cells llama.cpp failed to remove stay counted: a leak shows.
                self._leaked_cells += trim_memory(self._memory, scheduler.take_trims())
                plan = scheduler.plan()
                fault, self._fault = self._fault, None
            self._handoff.flush()
            if plan:
                self._step(plan, fault)
                self._handoff.flush()

    def _drop_all(self) -> None:
        running, queued = self._scheduler.drain()
        self._leaked_cells += trim_memory(self._memory, self._scheduler.take_trims())
        for seq in running:
            self._sampling.stop(seq)
            self._counters.aborted += 1
            self._handoff.emit(seq, ABORTED)
        for seq in queued:
            self._handoff.emit(seq, ABORTED)
        self._refresh_kv_cells()
        self._handoff.flush()

    def _reap_aborted(self) -> None:
        for seq in self._scheduler.reap():
            self._sampling.stop(seq)
            self._counters.count_reaped(seq.request_id)
            self._handoff.emit(seq, ABORTED)
        self._refresh_kv_cells()

    def _step(self, plan: _Plan, fault: BaseException | None) -> None:
        batch = self._batch
        n, logits_at = fill_batch(batch, plan)
        started = time.perf_counter()
        try:
            if fault is not None:
                raise fault
            rc = llama.llama_decode(self._ctx, batch)
            if rc != 0:
                raise EngineError(f"llama_decode returned {rc} for a {n}-token batch")
            sampled = [self._sample_or_fail(seq, idx) for seq, idx in logits_at]
        except Exception as exc:  # one failed step fails its batch only
            self._fail_batch(plan, exc)
            return
        elapsed = time.perf_counter() - started
        with self._lock:
            read = self._scheduler.advance(plan, elapsed)
            self._counters.count_step(n, elapsed, read)
            for seq, token, logprob in sampled:
                if isinstance(logprob, EngineError):  # its grammar failed: it alone
                    self._release(seq)
                    self._counters.failed += 1
                    self._handoff.emit(seq, logprob)
                    continue
                self._accept(seq, token, logprob)
            self._refresh_kv_cells()

    def _sample_or_fail(self, seq: _Sequence, idx: int) -> tuple[_Sequence, int, Any]:
        try:
            token, logprob = self._sampling.sample(seq, idx)
        except GrammarError as exc:
            log.error("sequence %s failed its grammar: %s", seq.request_id, exc)
            return seq, -1, EngineError(f"constrained decoding failed: {exc}")
        return seq, token, logprob

    def _accept(self, seq: _Sequence, token: int, logprob: TokenLogprob | None) -> None:
        reason = self._scheduler.accept(seq, token)
        self._counters.generated_tokens += 1
        if seq.abort_requested:
            self._counters.wasted_tokens += 1
            return  # reaped before the next step
        lp = None if logprob is None else (logprob,)
        cached = seq.n_cached if seq.n_generated == 1 else 0
        self._handoff.emit(seq, EngineOutput((token,), reason, lp, cached))
        if reason is not None:
            self._release(seq)
            self._counters.finished += 1

    def _fail_batch(self, plan: _Plan, exc: BaseException) -> None:
        log.error("decode step failed for %d sequences: %r", len(plan), exc)
        error = exc if isinstance(exc, EngineError) else EngineError(repr(exc))
        with self._lock:
            for chunk in plan:
                seq = chunk.seq
                if seq.phase is Phase.DONE:
                    continue
                self._release(seq, keep_cells=False)
                self._counters.failed += 1
                self._handoff.emit(seq, error)
            self._refresh_kv_cells()

    def _release(self, seq: _Sequence, *, keep_cells: bool = True) -> None:
        """Remove a running sequence: its slot, sampler, and cells (held for
        reuse, or trimmed before the next step)."""
        self._scheduler.release(seq, keep_cells=keep_cells)
        self._sampling.stop(seq)

    def _refresh_kv_cells(self) -> None:
        # Bookkeeping, not one llama.cpp call per sequence per step: each ctypes
        # call gives the GIL away, and taking it back from a busy event loop can
        # cost milliseconds. trim_memory() checks llama.cpp's memory itself.
        used = self._scheduler.kv_cells_used
        self._counters.kv_cells_used = used + self._leaked_cells
