"""Where a grammar is compiled to check it: here, or in the engine process.

``constraints.py`` compiles every grammar a request brings (llguidance, native
code) before it answers, so that one the engine cannot build is a 400. In a
worker whose engine runs in a process of its own (``serve --workers``,
``--engine-process``), ``check_grammars_with(engine.grammar_errors)`` sends
those compiles to the engine process, where a crash of the compiler ends that
process (its streams get ``engine_crashed``; it is restarted) and no worker.

Spec: docs/serving.md, "The engine process".
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["check_grammars_with", "grammar_errors"]

_checker: list[Callable[[str], list[str]]] = []


def check_grammars_with(checker: Callable[[str], list[str]]) -> None:
    """Check every grammar of this process with ``checker`` from now on
    (``grammar_errors``' contract)."""
    _checker[:] = [checker]


def grammar_errors(text: str) -> list[str]:
    """llguidance's errors for the grammar ``text`` (``[]``: it compiles), from
    the checker set by ``check_grammars_with``, or else compiled here
    (``llamacpp_grammar.grammar_errors``)."""
    if _checker:
        return _checker[0](text)
    # Imported here: llguidance costs a server that checks no grammar.
    from sluicegate.engines.llamacpp.grammar import grammar_errors as compile_here

    return compile_here(text)
