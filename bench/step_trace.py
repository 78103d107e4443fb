"""``sluicegate serve`` with each engine step written to a file: a diagnostic.

``bench/engine.py --step-log`` starts sluicegate through this script, so that
the bench can say which steps made the long prompt's interference: for each
step the local engine runs, one JSON line with the wall time it was told
(``time.time()``, seconds; the clock the bench's client records too), the
sequences that decoded in it, the prompt tokens it read, its time in seconds
(``llama_decode`` and the draws), whether its prompt chunk was paced, and the
pacer's decode-only estimate for its decoding sequences and its cost per
prompt token (seconds) as they were when the step was planned (``null``
before they were learnt). It wraps ``BatchScheduler.advance`` in this process
only; nothing in ``src/`` changes.

Run: ``python bench/step_trace.py STEPS.jsonl serve [serve's flags]``.
"""

from __future__ import annotations

import json
import sys
import time
from typing import IO, Any

from sluicegate.cli import main
from sluicegate.core.scheduling import BatchScheduler, Phase


def trace_steps(out: IO[str]) -> None:
    """Make every ``BatchScheduler.advance`` of this process write its step
    to ``out`` (one JSON object a line, flushed)."""
    advance = BatchScheduler.advance

    def traced(
        self: BatchScheduler[Any], plan: list[Any], elapsed_s: float = -1.0
    ) -> int:
        decoding = sum(c.seq.phase is Phase.DECODE for c in plan)
        pacer = self.pacer
        estimate_s = pacer.decode_step_s(decoding) if pacer and decoding else None
        token_s = pacer.prompt_token_s() if pacer else None
        paced = self._paced
        read = advance(self, plan, elapsed_s)
        step = {
            "t": time.time(),
            "decoding": decoding,
            "read": read,
            "elapsed_s": elapsed_s,
            "paced": paced,
            "estimate_s": estimate_s,
            "token_s": token_s,
        }
        out.write(json.dumps(step) + "\n")
        out.flush()
        return read

    BatchScheduler.advance = traced  # type: ignore[method-assign]


if __name__ == "__main__":
    with open(sys.argv[1], "a", encoding="utf-8") as steps:
        trace_steps(steps)
        sys.exit(main(sys.argv[2:]))
