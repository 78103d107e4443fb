"""Engines: the protocols (``base``: ``TokenEngine``, ``TextEngine``) and their
implementations.

``llamacpp`` (a real GGUF model through llama.cpp), ``scripted`` (no model: replays
token scripts with injectable faults), ``scripted_text`` (the same, yielding text)
and ``clocks`` (time for them) are imported from their own modules, so that
importing this package does not load llama.cpp.
"""

from sluicegate.engines.base import (
    Capabilities,
    Engine,
    EngineStats,
    GenerateRequest,
    ListenableOutputs,
    ModelInfo,
    OutputKind,
    SamplingParams,
    TextEngine,
    TokenEngine,
    Tokenizer,
)

__all__ = [
    "Capabilities",
    "Engine",
    "EngineStats",
    "GenerateRequest",
    "ListenableOutputs",
    "ModelInfo",
    "OutputKind",
    "SamplingParams",
    "TextEngine",
    "TokenEngine",
    "Tokenizer",
]
