"""A request's grammar, checked before its plan: schema limits, and the compile
ahead of the engine, off the event loop within a deadline.

``checked_grammar`` checks a request's JSON schemas against the server's schema
limits and builds its grammar (``constraints.py``); an engine that compiles
grammars (``Capabilities.grammars``) compiles it here, in a worker thread of a
known stack size (``schema_worker.py``), so a compile that takes seconds refuses
with 400 at the deadline instead of stalling the first token. A turn that may not
call but whose prompt shows tool markup ends at ``TOOL_MARKUP_STOPS``.

Spec: docs/DESIGN.md, "Status first, errors in band"; docs/tools.md.
"""

from __future__ import annotations

from sluicegate.core.decoding.toolcalls import OPEN_TAG
from sluicegate.engines.base import Grammar, TokenEngine
from sluicegate.server.config import ServerConfig
from sluicegate.server.prepare.constraints import grammar_for_request
from sluicegate.server.prepare.schema_checks import check_schemas
from sluicegate.server.prepare.schema_worker import SchemaWorker
from sluicegate.server.schemas.chat import ChatCompletionRequest

__all__ = [
    "SCHEMA_WORKER",
    "TOOL_MARKUP_STOPS",
    "checked_grammar",
    "compile_ahead",
    "shows_tool_markup",
]

SCHEMA_WORKER = SchemaWorker()
"""Where this process compiles request schemas (threads of a known stack)."""


async def checked_grammar(
    request: ChatCompletionRequest,
    config: ServerConfig,
    engine: TokenEngine | None,
    *,
    compile_ahead: bool = True,
) -> Grammar | None:
    """The request's schemas checked against ``config.schema_limits``, then (for
    an ``engine`` of token ids) its ``grammar_for_request``, compiled ahead by
    the engine when it can (``Capabilities.grammars``) and ``compile_ahead``:
    off the event loop when there is a schema, within
    ``config.schema_timeout_s``. A compile takes up to seconds, in native code
    that releases the interpreter: the loop serves meanwhile, and the engine's
    other sequences do not wait for it.

    Raises:
        RequestError: 400: a schema past a limit, one the grammar cannot
            express, or the deadline ran out.
    """
    if request.response_format is None and not request.tools:
        return None if engine is None else grammar_for_request(request)
    grammars = engine is not None and engine.capabilities.grammars
    compiling = engine if grammars and compile_ahead else None

    def work() -> Grammar | None:
        check_schemas(request, config.schema_limits)
        if engine is None:
            return None
        grammar = grammar_for_request(request)
        if grammar is not None and compiling is not None:
            compiling.compile_grammar(grammar)
        return grammar

    return await SCHEMA_WORKER.run(
        work,
        config.schema_timeout_s,
        "the request's JSON schemas",
        "response_format" if request.response_format is not None else "tools",
    )


async def compile_ahead(
    grammar: Grammar,
    engine: TokenEngine,
    config: ServerConfig,
    request: ChatCompletionRequest,
) -> None:
    """``grammar`` compiled ahead by ``engine`` when it can, off the event loop
    within ``config.schema_timeout_s`` (as ``checked_grammar`` does).

    Raises:
        RequestError: 400 when the deadline ran out.
    """
    if not engine.capabilities.grammars:
        return

    def work() -> None:
        engine.compile_grammar(grammar)

    await SCHEMA_WORKER.run(
        work,
        config.schema_timeout_s,
        "the request's JSON schemas",
        "response_format" if request.response_format is not None else "tools",
    )


TOOL_MARKUP_STOPS = (OPEN_TAG, "<tool_response")
"""Where a turn that may not call (``tool_choice: "none"``) ends if the model
starts to write tool markup anyway (an engine without grammars), as it may
after calls in the history: the text before is the answer, finish ``stop``."""


def shows_tool_markup(request: ChatCompletionRequest) -> bool:
    """Whether the prompt shows tools or past calls (in the format of
    docs/tools.md), so that a turn that may not call could imitate them: such a
    turn decodes under ``NO_TOOL_MARKUP`` and ends at ``TOOL_MARKUP_STOPS``."""
    return bool(request.tools) or any(
        m.role == "tool" or m.tool_calls for m in request.messages
    )
