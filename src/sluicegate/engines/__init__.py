"""Engines: the Engine protocol (``base``) and its implementations.

``llamacpp`` (a real GGUF model through llama.cpp) and ``scripted`` (no model: replays
token scripts with injectable faults) are imported from their own modules, so that
importing this package does not load llama.cpp.
"""

from sluicegate.engines.base import (
    Engine,
    EngineStats,
    GenerateRequest,
    ModelInfo,
    SamplingParams,
    Tokenizer,
)

__all__ = [
    "Engine",
    "EngineStats",
    "GenerateRequest",
    "ModelInfo",
    "SamplingParams",
    "Tokenizer",
]
