"""What this CPU offers and what llama.cpp was compiled for, read from their texts.

``cpu_flags`` and ``cpu_model`` read ``/proc/cpuinfo`` text (``read_cpuinfo``);
``compiled_features`` reads llama.cpp's ``llama_print_system_info()`` text;
``missing_features`` names the x86 features compiled in that the CPU does not
advertise: each is an illegal instruction waiting to happen. Pure functions over
text, but for ``read_cpuinfo`` and ``cpu_model``'s fall-back to ``platform``.
"""

from __future__ import annotations

import platform
from pathlib import Path

__all__ = [
    "SHOWN_FLAGS",
    "compiled_features",
    "cpu_flags",
    "cpu_model",
    "missing_features",
    "read_cpuinfo",
]

# llama.cpp's system-info names for x86 features -> the flags /proc/cpuinfo
# lists for them. A feature compiled in that the CPU lacks is an illegal
# instruction waiting to happen.
_X86_FLAGS = {
    "SSE3": "pni",
    "SSSE3": "ssse3",
    "SSE42": "sse4_2",
    "AVX": "avx",
    "AVX_VNNI": "avx_vnni",
    "AVX2": "avx2",
    "F16C": "f16c",
    "FMA": "fma",
    "BMI2": "bmi2",
    "AVX512": "avx512f",
    "AVX512_VBMI": "avx512vbmi",
    "AVX512_VNNI": "avx512_vnni",
    "AVX512_BF16": "avx512_bf16",
    "AMX_INT8": "amx_int8",
}

SHOWN_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "bmi2",
    "avx_vnni",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
)
"""The CPU flags ``sluicegate doctor`` prints, in the order a reader expects."""


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The feature flags of the first processor in ``/proc/cpuinfo`` text.

    Returns an empty set when the text has no ``flags`` (x86) or
    ``Features`` (arm) line.
    """
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def compiled_features(system_info: str) -> dict[str, bool]:
    """The ``NAME = 0|1`` pairs of llama.cpp's ``llama_print_system_info()``.

    The text looks like ``CPU : SSE3 = 1 | AVX2 = 1 | ... |``; names that
    appear more than once (one per backend) keep their last value.
    """
    features: dict[str, bool] = {}
    for part in system_info.replace(":", "|").split("|"):
        name, sep, value = part.partition("=")
        if sep and value.strip() in ("0", "1"):
            features[name.strip()] = value.strip() == "1"
    return features


def missing_features(compiled: dict[str, bool], flags: frozenset[str]) -> list[str]:
    """x86 features compiled into llama.cpp that the CPU does not advertise."""
    if not flags:
        return []
    return [
        name
        for name, on in compiled.items()
        if on and name in _X86_FLAGS and _X86_FLAGS[name] not in flags
    ]


def read_cpuinfo() -> str:
    """The text of ``/proc/cpuinfo``, or ``""`` where there is none."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_model(cpuinfo: str) -> str:
    """The first ``model name`` of ``/proc/cpuinfo`` text, else the platform's."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "model name":
            return value.strip()
    return platform.processor() or platform.machine()
