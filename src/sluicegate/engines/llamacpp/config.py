"""The local engine's settings: what ``sluicegate serve`` runs with no flags.

``EngineConfig`` holds the shape of a ``LlamaCppEngine`` (KV cells, slots,
threads) and its step policy (tokens per step, tokens of one prompt per step
while others decode, prefix reuse). Its defaults are for this project's
machines (2 CPU cores, the default model; docs/performance.md, "The local
engine against llama-server", says how they were chosen): the CLI takes its
flags' defaults from here and ``sluicegate doctor`` prints them.
``add_arguments`` and ``from_args`` are the CLI's side.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, fields
from typing import Any

__all__ = ["EngineConfig", "add_arguments", "from_args"]


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Settings of one ``LlamaCppEngine`` (keyword arguments of the same names).

    Attributes:
        n_ctx: KV cells shared by all sequences (tokens).
        n_parallel: sequences decoded together in one step.
        step_tokens: tokens in one step (decode tokens and prompt chunks); also
            llama.cpp's batch and micro-batch size.
        chunk_tokens: tokens of the prompts cut in one step while more
            sequences decode than prompts are read (``None``: ``step_tokens``);
            with ``step_ratio``, the first such chunk, before step times are
            measured, and four times the smallest. A prompt no longer than this
            is read in one step.
        step_ratio: a step that reads prompts while more sequences decode
            takes about this multiple of a decode-only step of as many
            sequences, or of ``n_parallel - 1`` if fewer decode, measured now
            or before the read began, whichever is shorter (the chunk sized
            from measured step times, ``PrefillPacer``); ``None``:
            ``chunk_tokens`` always. At 1.5 the 15 streams' gap p99 while a
            ~4,000-token prompt was read stayed within twice their steady one
            in seven runs of nine; 1.3 leaves room for a slow step
            (docs/performance.md).
        n_threads: llama.cpp threads; ``None``: the cores this process may use.
        prefix_cache: keep finished sequences' KV cells for prompts that start
            with the same tokens. Off by default: a prompt partly read from
            cells gets logits that differ in the last bits from one read whole
            (llama.cpp's kernels depend on how many tokens a step holds), so a
            temperature-0 answer could change between two identical requests.
        swa_full: keep every cell in the sliding-window layers of a model that
            has them (Gemma 3), as llama.cpp's own default does; ``False``:
            only the window's, as llama-server does (no prefix reuse then,
            which reads prefixes back from them). Measured side by side with
            llama-server, neither was faster (docs/performance.md).
    """

    n_ctx: int = 8192
    n_parallel: int = 16
    step_tokens: int = 512
    chunk_tokens: int | None = 32
    step_ratio: float | None = 1.3
    n_threads: int | None = None
    prefix_cache: bool = False
    swa_full: bool = True

    def kwargs(self) -> dict[str, Any]:
        """These settings as ``LlamaCppEngine`` keyword arguments."""
        return asdict(self)

    def describe(self) -> str:
        """One line: ``name=value`` for each setting, in order."""
        return " ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))


_DEFAULT = EngineConfig()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--n-ctx``, ``--parallel``, ``--step-tokens``, ``--chunk-tokens``,
    ``--step-ratio``, ``--threads``, ``--prefix-cache`` and ``--swa-full`` to
    ``parser``, with the defaults of ``EngineConfig``."""
    add = parser.add_argument
    add("--n-ctx", type=int, default=_DEFAULT.n_ctx, help="KV cells (tokens)")
    add("--parallel", type=int, default=_DEFAULT.n_parallel, help="sequences per step")
    add(
        "--step-tokens",
        type=int,
        default=_DEFAULT.step_tokens,
        help="tokens in one decode step (bounds abort latency during prefill)",
    )
    add(
        "--chunk-tokens",
        type=int,
        default=_DEFAULT.chunk_tokens,
        help="tokens of the prompts cut in one step while more streams decode "
        "than prompts are read (with --step-ratio: the first such chunk, and 4x "
        "the smallest); a prompt no longer is never cut",
    )
    add(
        "--step-ratio",
        type=float,
        default=_DEFAULT.step_ratio,
        help="a step reading prompts among more decoding streams takes about "
        "this multiple of a decode-only step of as many, or of --parallel - 1 "
        "(0: --chunk-tokens always)",
    )
    add("--threads", type=int, default=_DEFAULT.n_threads, help="llama.cpp threads")
    add(
        "--prefix-cache",
        action="store_true",
        help="keep finished sequences' KV cells for prompts that start alike "
        "(temperature-0 answers may then differ between identical requests)",
    )
    add(
        "--swa-full",
        action=argparse.BooleanOptionalAction,
        default=_DEFAULT.swa_full,
        help="keep every cell in a sliding-window model's window layers "
        "(--no-swa-full: only the window's, as llama-server; not with --prefix-cache)",
    )


def from_args(args: argparse.Namespace) -> EngineConfig:
    """The ``EngineConfig`` that ``add_arguments``' flags in ``args`` say.

    Raises:
        SystemExit: ``--prefix-cache`` with ``--no-swa-full``.
    """
    if args.prefix_cache and not args.swa_full:
        raise SystemExit(
            "sluicegate: --prefix-cache reads prefixes back from the full "
            "sliding-window cache; drop --no-swa-full"
        )
    return EngineConfig(
        n_ctx=args.n_ctx,
        n_parallel=args.parallel,
        step_tokens=args.step_tokens,
        chunk_tokens=args.chunk_tokens,
        step_ratio=args.step_ratio or None,
        n_threads=args.threads,
        prefix_cache=args.prefix_cache,
        swa_full=args.swa_full,
    )
