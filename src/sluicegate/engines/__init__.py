"""Engines: the protocols (``base``: ``TokenEngine``, ``TextEngine``) and their
implementations.

The engines are subpackages: ``llamacpp`` (a real GGUF model through
llama.cpp), ``upstream`` (OpenAI-compatible upstream servers, pooled) and
``scripted`` (no model: replays token scripts or text with injectable faults).
They and ``clocks`` (time for them) are imported from their own modules, so that
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
