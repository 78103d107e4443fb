"""The faults a scripted engine injects, and the ``--fault`` specs that name them.

``Faults`` holds ``ScriptedEngine``'s fault keyword arguments; ``parse_faults``
reads them from the command line's specs (``sluicegate serve --fault``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypedDict

__all__ = ["Faults", "parse_faults"]


class Faults(TypedDict, total=False):
    """Fault keyword arguments of ``ScriptedEngine`` (see its ``Args``)."""

    prefill_delay_s: float
    prefill_min_tokens: int
    stall_at_step: int
    stall_s: float
    fail_at_step: int
    fail_rate: float
    seed: int
    never_finishes: bool
    crash_on_grammar: bool


def parse_faults(specs: Iterable[str]) -> Faults:
    """Fault specs (the CLI's ``--fault``) -> ``ScriptedEngine`` keyword arguments.

    Args:
        specs: each one of ``error-after:N`` (fail at decode step N, after N
            steps were delivered), ``error-rate:P:N`` (the same, in a share P of
            the sequences, drawn from a random generator seeded with ``seed:X``,
            0 by default), ``prefill-delay:S`` (S seconds before the first token;
            ``prefill-delay:S:N``: only for prompts of N tokens or more),
            ``stall:K:S`` (S more seconds before decode step K),
            ``never-finishes`` and ``grammar-crash`` (the process dies of
            SIGSEGV when asked to compile a grammar, as native code that
            crashes). Steps count from 0; seconds may be fractional.

    Returns:
        The keyword arguments; a later spec of the same kind wins.

    Raises:
        ValueError: an unknown spec or a malformed number, naming the spec.
    """
    faults: Faults = {}
    for spec in specs:
        name, *args = spec.split(":")
        try:
            if name == "error-after" and len(args) == 1:
                faults["fail_at_step"] = int(args[0])
                faults.pop("fail_rate", None)  # every sequence
            elif name == "error-rate" and len(args) == 2:
                rate = float(args[0])
                if not 0.0 <= rate <= 1.0:
                    raise ValueError("the share is not in [0, 1]")
                faults["fail_rate"] = rate
                faults["fail_at_step"] = int(args[1])
            elif name == "seed" and len(args) == 1:
                faults["seed"] = int(args[0])
            elif name == "prefill-delay" and len(args) in (1, 2):
                faults["prefill_delay_s"] = float(args[0])
                faults["prefill_min_tokens"] = int(args[1]) if len(args) == 2 else 0
            elif name == "stall" and len(args) == 2:
                faults["stall_at_step"] = int(args[0])
                faults["stall_s"] = float(args[1])
            elif name == "never-finishes" and not args:
                faults["never_finishes"] = True
            elif name == "grammar-crash" and not args:
                faults["crash_on_grammar"] = True
            else:
                raise ValueError("unknown fault")
        except ValueError as exc:
            raise ValueError(
                "expected error-after:N, error-rate:P:N, seed:X, prefill-delay:S[:N], "
                f"stall:K:S, never-finishes or grammar-crash; got {spec!r}"
            ) from exc
    return faults
