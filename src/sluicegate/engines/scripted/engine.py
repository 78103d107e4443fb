"""A model-free engine that replays token-id scripts, with injectable faults.

``ScriptedEngine`` is a ``TokenEngine`` without a model: every
sequence replays a script of token ids (a fixed list, text, or a function of the
request) at a fixed rate. It keeps the accounting a real engine keeps (queue,
running batch, KV cells, generated and wasted tokens) and can inject the faults a
streaming front end must survive: a long prefill, a stall at one step, an error at
one step (in every sequence, or in a seeded random share of them), and a sequence
that never finishes.

``ScriptedTokenizer`` (from ``scripted_vocab``) is its toy byte-piece vocabulary.
``ScriptedTextEngine`` (``scripted_text``) yields its text instead of token ids.
Each sequence's state is a ``ScriptedSequence`` (``scripted_sequence``), its
ids from ``Scripts`` (``scripted_script``); the CLI's fault
specs are read by ``parse_faults`` (``scripted_faults``). Time comes from a
``Timers`` object (``clocks``): the running event loop by default, or a
``ManualClock`` that tests step by hand; all sequences share one ``HeapClock``
(``heap_clock``) on it.

Invariants:
    - Each sequence is a chain of event-loop timers (no task) that pushes into
      its ``SequenceOutputs``: the engine never waits on a consumer and never
      blocks the event loop.
    - KV cells used = prompt + generated tokens of the running sequences; they are
      freed when a sequence finishes, is aborted or fails.
    - ``abort()`` takes effect at once. The decode step that was due next still
      runs, as a step in flight would: its token counts as generated *and* wasted
      and is never delivered. An abort during the queue wait or the prefill delay
      stops the sequence before any token.

Sampling parameters other than ``max_tokens``, ``stop_token_ids`` and
``ignore_eos`` do not change the script (a script function may read them); with
``logprobs`` each token carries ``scripted_logprob``.

Deliberate divergences: an exhausted script behaves like a sampled end-of-sequence
token; the stop token that ends a sequence is not counted as generated (it is not
in any output either); ``never_finishes`` cycles the script and ignores stop
tokens, ``max_tokens`` and the context window. Without ``clock`` the engine is
asyncio-only.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import random
import signal
from collections import deque
from collections.abc import AsyncIterator

from sluicegate.core.errors import EngineError, EngineUnavailable
from sluicegate.core.events import EngineOutput, FinishReason
from sluicegate.engines.base import (
    Capabilities,
    EngineStats,
    GenerateRequest,
    Grammar,
    ModelInfo,
    TokenEngineBase,
)
from sluicegate.engines.clocks import Timers
from sluicegate.engines.heap_clock import HeapClock
from sluicegate.engines.outputs import SequenceOutputs
from sluicegate.engines.scripted.faults import Faults, parse_faults
from sluicegate.engines.scripted.script import (
    DEFAULT_TEXT,
    Script,
    Scripts,
    scripted_logprob,
)
from sluicegate.engines.scripted.sequence import Phase, ScriptedSequence, kv_cells
from sluicegate.engines.scripted.vocab import ScriptedTokenizer

__all__ = [
    "DEFAULT_TEXT",
    "Faults",
    "Script",
    "ScriptedEngine",
    "ScriptedTokenizer",
    "parse_faults",
    "scripted_logprob",
]

logger = logging.getLogger(__name__)


_CAPABILITIES = Capabilities(logprobs=True, listenable=True)
_MAX_SHARED_OUTPUTS = 1 << 16  # token ids whose plain step output is kept


class ScriptedEngine(TokenEngineBase[ScriptedTokenizer, SequenceOutputs[EngineOutput]]):
    """A ``TokenEngine`` that replays scripts instead of running a model: the
    scripted model (``owned_by`` "sluicegate"), logprobs, listenable outputs;
    no grammars (a grammar is ignored).

    Args:
        script: what every sequence generates: text (encoded with special tokens
            parsed), token ids, or a function of the request returning ids (it may
            be infinite). Default: ``DEFAULT_TEXT`` then ``<end_of_turn>``. A script
            that runs out ends the sequence as if EOS was sampled.
        tokenizer: the vocabulary; a ``ScriptedTokenizer()`` by default.
        model_id: the served model's id.
        context_length: the context window, in tokens.
        tokens_per_s: decode rate per sequence; ``math.inf`` means no delay (each
            step still yields to the event loop).
        prefill_delay_s: seconds from admission to the first decode step.
        prefill_min_tokens: the shortest prompt (tokens) that waits
            ``prefill_delay_s``; shorter ones start decoding at once (a long
            prompt's slow prefill among quick ones).
        stall_at_step: 0-based decode step before which ``stall_s`` more seconds
            pass (``None``: no stall).
        stall_s: length of that stall, in seconds.
        fail_at_step: 0-based decode step at which the sequence fails: the iterator
            raises ``EngineError`` after delivering the earlier steps.
        fail_rate: the share of sequences that fail at ``fail_at_step``; each
            sequence draws from a ``random.Random(seed)`` when it is submitted.
        seed: seeds that draw (the same submissions fail on every run).
        never_finishes: cycle the script forever, ignoring stop tokens,
            ``max_tokens`` and the context window.
        crash_on_grammar: claim grammars, and end this process with SIGSEGV
            when asked to compile one (a native crash, for supervision tests).
        max_running: sequences decoded at once (the batch); later ones queue.
        max_queued: sequences that may wait; beyond it ``generate`` raises
            ``EngineUnavailable`` at once.
        kv_cells_total: KV cells reported as total (default: context x batch).
        clock: where time and timers come from; default: the event loop that
            runs ``generate``.
    """

    def __init__(
        self,
        script: Script | None = None,
        *,
        tokenizer: ScriptedTokenizer | None = None,
        model_id: str = "scripted",
        context_length: int = 4096,
        tokens_per_s: float = 1000.0,
        prefill_delay_s: float = 0.0,
        prefill_min_tokens: int = 0,
        stall_at_step: int | None = None,
        stall_s: float = 0.0,
        fail_at_step: int | None = None,
        fail_rate: float = 1.0,
        seed: int = 0,
        never_finishes: bool = False,
        crash_on_grammar: bool = False,
        max_running: int = 8,
        max_queued: int = 32,
        kv_cells_total: int | None = None,
        clock: Timers | None = None,
    ) -> None:
        if tokens_per_s <= 0:
            raise ValueError(f"tokens_per_s must be > 0, got {tokens_per_s!r}")
        model = ModelInfo(model_id, context_length, created=1_700_000_000)
        tokenizer = tokenizer or ScriptedTokenizer()
        outputs = SequenceOutputs[EngineOutput]
        capabilities = _CAPABILITIES
        if crash_on_grammar:
            capabilities = dataclasses.replace(capabilities, grammars=True)
        super().__init__(model, tokenizer, capabilities, outputs)
        self._crash_on_grammar = crash_on_grammar
        self._scripts = Scripts(script, tokenizer, never_finishes=never_finishes)
        self._step_s = 1.0 / tokens_per_s
        self._prefill_delay_s = prefill_delay_s
        self._prefill_min_tokens = prefill_min_tokens
        self._stall = (stall_at_step, stall_s)
        self._fail_at_step = fail_at_step
        self._fail_rate = fail_rate
        self._rng = random.Random(seed)
        self._never_finishes = never_finishes
        self._max_running = max_running
        self._max_queued = max_queued
        self._kv_total = kv_cells_total or context_length * max_running
        self._live: dict[str, ScriptedSequence] = {}
        self._plain: dict[int, EngineOutput] = {}  # see _step
        self._waiting: deque[ScriptedSequence] = deque()
        self._aborted_ids: deque[str] = deque(maxlen=1024)
        self._counts = dict.fromkeys(
            ("prompt", "generated", "wasted", "finished", "aborted", "failed"), 0
        )
        self._running = 0
        self._closed = False
        self._timers = clock
        self._clock: HeapClock[ScriptedSequence] | None = None
        if clock is not None:
            self._clock = HeapClock(clock)

    def compile_grammar(self, grammar: Grammar) -> None:
        """Nothing: the scripted engine ignores grammars (but for
        ``crash_on_grammar``: this process dies of SIGSEGV)."""
        if self._crash_on_grammar:
            os.kill(os.getpid(), signal.SIGSEGV)

    def generate(self, request: GenerateRequest) -> AsyncIterator[EngineOutput]:
        """Queue ``request``; its outputs arrive one decode step at a time.

        The iterator is a ``SequenceOutputs`` (a listener may take its items);
        the annotation is the protocol's, so that subclasses may wrap it.

        Must be called with a running asyncio loop unless the engine has a
        ``clock``. The sequence starts at once
        (whether or not its outputs are read); closing them early aborts it.
        After ``abort()`` they end without anything more.

        Raises:
            EngineUnavailable: at once, when the engine is closed or the queue full.
            EngineError: at once, for a duplicate running id or an empty prompt;
                from the iterator, at ``fail_at_step``.
        """
        if self._closed:
            raise EngineUnavailable("the engine is closed")
        request_id = request.request_id
        if request_id in self._live:
            raise EngineError(f"request id {request_id!r} is already running")
        if not request.prompt_token_ids:
            raise EngineError("the prompt has no tokens")
        full = self._running >= self._max_running
        if full and len(self._waiting) >= self._max_queued:
            raise EngineUnavailable(
                f"the queue is full: {len(self._waiting)} requests wait, "
                f"limit {self._max_queued}"
            )
        if self._timers is None:
            loop = asyncio.get_running_loop()
            if self._clock is None or self._clock.timers is not loop:
                self._clock = HeapClock(loop)
        outputs = self._open(request_id)
        seq = ScriptedSequence(request, self._scripts.for_request(request), outputs)
        seq.stop_ids = self._stop_ids(request.params)
        room = self._model.context_length - len(request.prompt_token_ids)
        seq.most_generated = min(request.params.max_tokens, room)
        if self._fail_at_step is not None and (
            self._fail_rate >= 1.0 or self._rng.random() < self._fail_rate
        ):
            seq.fail_at_step = self._fail_at_step
        self._live[request_id] = seq
        if not full:
            self._start(seq)
        else:
            self._waiting.append(seq)
        return outputs

    def abort(self, request_id: str, *, stopped: bool = False) -> None:
        """Stop ``request_id`` now and free its KV cells.

        A decoding sequence's step that was due next still runs, as a step in
        flight would: its token counts as generated and wasted, and is never
        delivered. Idempotent; a no-op for unknown or already finished ids. Never
        blocks. ``stopped`` (a stop string matched): counted as finished.
        """
        seq = self._live.get(request_id)
        # ``done``: its last output (or failure) is being delivered right now
        # (a stop string matched on the final token): it ended, nothing to abort.
        if seq is None or seq.abort_requested or seq.outputs.done:
            return
        seq.abort_requested = True
        if stopped:
            self._counts["finished"] += 1
        else:
            self._counts["aborted"] += 1
            self._aborted_ids.append(request_id)
        if seq.phase is Phase.QUEUED:
            self._waiting.remove(seq)
        elif seq.decoding:
            with contextlib.suppress(Exception):  # a script bug: nothing to waste
                self._step(seq, aborted=True)
        self._release(seq)

    def stats(self) -> EngineStats:
        """A snapshot: queue, running batch, KV cells, token and request counters."""
        running = [s for s in self._live.values() if s.phase is Phase.RUNNING]
        c = self._counts
        return EngineStats(
            queued=len(self._waiting),
            running=len(running),
            kv_cells_used=sum(kv_cells(s) for s in running),
            kv_cells_total=self._kv_total,
            prompt_tokens=c["prompt"],
            generated_tokens=c["generated"],
            wasted_tokens=c["wasted"],
            finished_requests=c["finished"],
            aborted_requests=c["aborted"],
            failed_requests=c["failed"],
            running_ids=tuple(s.request.request_id for s in running),
            aborted_ids=tuple(self._aborted_ids),
            submit_limit=self._max_running + self._max_queued,
        )

    async def aclose(self) -> None:
        """Abort every sequence; ``generate`` then fails."""
        self._closed = True
        for request_id in list(self._live):
            self.abort(request_id)

    # -- the schedule: a chain of clock callbacks per sequence, no task -------
    #
    # Each sequence is a chain of callbacks (prefill delay, then one per decode
    # step) on the engine's ``HeapClock`` rather than a task: with thousands of
    # streams a task per sequence cost a future, a task step and an Event per
    # token, and a loop timer per step cost more than the step itself.

    def _start(self, seq: ScriptedSequence) -> None:
        seq.phase = Phase.RUNNING
        self._running += 1
        prompt = len(seq.request.prompt_token_ids)
        self._counts["prompt"] += prompt
        if self._prefill_delay_s > 0 and prompt >= self._prefill_min_tokens:
            clock = self._clock
            assert clock is not None, "generate() makes the clock"
            clock.at(clock.timers.time() + self._prefill_delay_s, seq, self._decode)
        else:
            self._decode(seq)

    def _decode(self, seq: ScriptedSequence) -> None:
        """The prefill is over: schedule the first decode step."""
        seq.decoding = True
        assert self._clock is not None, "generate() makes the clock"
        seq.due = self._clock.timers.time()
        self._schedule(seq)

    def _schedule(self, seq: ScriptedSequence) -> None:
        step_s = self._step_s
        clock = self._clock
        assert clock is not None, "generate() makes the clock"
        # An absolute schedule, at most one step behind: a loop whose timers
        # round to whole milliseconds (uvloop, under uvicorn) fires a 0.5 ms
        # timer at once, and per-step delays would then ignore the rate.
        late = clock.timers.time() - step_s
        due = (seq.due if seq.due > late else late) + step_s
        if seq.step == self._stall[0]:
            due += self._stall[1]
        seq.due = due
        clock.at(due, seq, self._tick)

    def _tick(self, seq: ScriptedSequence) -> None:
        """One decode step of ``seq``, delivered; then the next one scheduled."""
        if seq.step == seq.fail_at_step:
            self._counts["failed"] += 1
            self._fail(seq, EngineError(f"scripted fault: failed at step {seq.step}"))
            return
        try:
            output = self._step(seq, aborted=False)
        except Exception:  # a script's bug fails its sequence, never the loop
            logger.exception("scripted sequence %s failed", seq.request.request_id)
            self._fail(
                seq, EngineError("the scripted sequence failed: its script raised")
            )
            return
        assert output is not None, "only an aborted step has no output"
        seq.step += 1
        seq.outputs.push(output)  # a listener may abort the sequence right here
        if output.finish_reason is not None:
            self._counts["finished"] += 1
            self._release(seq)
        elif seq.phase is Phase.RUNNING:
            self._schedule(seq)

    def _fail(self, seq: ScriptedSequence, error: EngineError) -> None:
        seq.outputs.fail(error)
        self._release(seq)

    def _release(self, seq: ScriptedSequence) -> None:
        if seq.pending:  # its clock entry is void
            assert self._clock is not None, "a pending entry has a clock"
            self._clock.void(seq)
        was_running = seq.phase is Phase.RUNNING
        self._running -= was_running
        seq.phase = Phase.DONE
        self._live.pop(seq.request.request_id, None)
        seq.outputs.end()  # a no-op when the sequence already ended
        if was_running and self._waiting and not self._closed:
            self._start(self._waiting.popleft())

    def _step(self, seq: ScriptedSequence, aborted: bool) -> EngineOutput | None:
        """One decode step; ``None`` when an abort ended the sequence."""
        token = next(seq.script, None)
        if token is None or (token in seq.stop_ids and not self._never_finishes):
            return None if aborted else EngineOutput((), FinishReason.STOP)
        seq.generated += 1
        self._counts["generated"] += 1
        if aborted:
            self._counts["wasted"] += 1
            return None
        full = seq.generated >= seq.most_generated  # max_tokens, or the context
        reason = FinishReason.LENGTH if full and not self._never_finishes else None
        k = seq.request.params.logprobs
        if k is None:
            # Once per token: a plain step's output is shared per token id
            # (immutable), not built again (about 0.25 us each).
            output = self._plain.get(token) if reason is None else None
            if output is None:
                output = EngineOutput((token,), reason)
                if reason is None and len(self._plain) < _MAX_SHARED_OUTPUTS:
                    self._plain[token] = output
            return output
        vocab_size = len(self._tokenizer.pieces)
        return EngineOutput((token,), reason, (scripted_logprob(token, k, vocab_size),))
