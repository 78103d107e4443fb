"""The installed llama.cpp build is the project's portable one, on any machine.

pip's default llama.cpp build compiles for the build machine's CPU
(``-march=native``): on a CPU that advertises AMX that puts ggml's AMX
matrix-multiply path in, which faults on some machines of this project's kind,
and AVX-512 code that a machine without AVX-512 cannot run.
``scripts/install-llama-cpp`` builds for x86-64-v3 with both off. These tests
read the installed shared libraries themselves (``objdump -d``), so they hold
on a machine without AMX or AVX-512 as well as on one with them.
"""

from __future__ import annotations

import hashlib
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = ROOT / "scripts" / "install-llama-cpp"

# Every AMX instruction: tile configuration, loads and stores, and the dot
# products (Intel SDM, "Intel AMX Instruction Set Reference").
AMX = re.compile(
    r"\s(ldtilecfg|sttilecfg|tileloadd|tileloaddt1|tilestored|tilerelease|"
    r"tilezero|tdpbssd|tdpbsud|tdpbusd|tdpbuud|tdpbf16ps|tdpfp16ps)\s"
)
# AVX-512 code uses the zmm registers or the opmask registers k0-k7.
AVX512 = re.compile(r"%zmm\d|\{%k[1-7]\}|%k[0-7][,\s]")


def _libraries() -> list[Path]:
    """One path per distinct library file: the wheel's install writes each
    library three times (``libllama.so``, ``.so.0``, ``.so.0.5.0``) as copies,
    not links, and a copy's code is its original's."""
    import llama_cpp

    lib = Path(llama_cpp.__file__).parent / "lib"
    found = sorted(
        p
        for p in lib.glob("lib*.so*")
        if p.name.startswith(("libggml", "libllama")) and not p.is_symlink()
    )
    assert found, f"no llama.cpp libraries under {lib}"
    distinct = {hashlib.sha256(p.read_bytes()).digest(): p for p in reversed(found)}
    return sorted(distinct.values())


def _disassembly(path: Path) -> Iterator[str]:
    objdump = shutil.which("objdump")
    assert objdump, "objdump (binutils) is not installed"
    with subprocess.Popen(
        [objdump, "-d", "--no-show-raw-insn", str(path)],
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        yield from proc.stdout
    assert proc.returncode == 0


def _scan(path: Path) -> tuple[int, list[str], list[str], int]:
    """(instructions, AMX lines, AVX-512 lines, AVX2 FMA lines) of ``path``."""
    instructions = 0
    amx: list[str] = []
    avx512: list[str] = []
    fma = 0
    for line in _disassembly(path):
        if "\t" not in line:
            continue
        instructions += 1
        if AMX.search(line):
            amx.append(line.strip())
        if AVX512.search(line):
            avx512.append(line.strip())
        if "vfmadd" in line:
            fma += 1
    return instructions, amx, avx512, fma


pytestmark = pytest.mark.skipif(
    platform.machine() != "x86_64", reason="the instruction checks are for x86-64"
)


@pytest.mark.slow
def test_installed_llama_cpp_libraries_hold_no_amx_or_avx512_instruction() -> None:
    cpu_backend_fma = 0
    for path in _libraries():
        instructions, amx, avx512, fma = _scan(path)
        assert instructions > 0, f"objdump found no code in {path}"
        assert amx == [], f"{path.name}: AMX instructions, e.g. {amx[:3]}"
        assert avx512 == [], f"{path.name}: AVX-512 instructions, e.g. {avx512[:3]}"
        if path.name.startswith("libggml-cpu"):
            cpu_backend_fma += fma
    # The scan reads real vector code: the CPU backend is built for AVX2 + FMA.
    assert cpu_backend_fma > 100


def test_the_scan_finds_amx_and_avx512_instructions() -> None:
    lines = {
        "  4011f0:\tldtilecfg (%rax)\n": (True, False),
        "  4011f4:\ttdpbssd %tmm2,%tmm1,%tmm0\n": (True, False),
        "  401200:\tvfmadd231ps %zmm1,%zmm2,%zmm0\n": (False, True),
        "  401206:\tvmovups (%rdi),%ymm0{%k1}\n": (False, True),
        "  40120c:\tkmovw %k1,%eax\n": (False, True),
        "  401210:\tvfmadd231ps %ymm1,%ymm2,%ymm0\n": (False, False),
        "  401216:\tcall   401000 <tileloadd_wrapper@plt>\n": (False, False),
    }
    for line, (amx, avx512) in lines.items():
        assert (bool(AMX.search(line)), bool(AVX512.search(line))) == (amx, avx512)


def test_the_build_in_effect_is_the_projects() -> None:
    key = subprocess.run(
        [str(INSTALL_SCRIPT), "--print-key"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    stamp = Path(sys.prefix) / ".llama-cpp-build"
    assert stamp.is_file(), "llama-cpp-python was not installed by install-llama-cpp"
    assert stamp.read_text().strip() == key
    flags = subprocess.run(
        [str(INSTALL_SCRIPT), "--print-flags"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for flag in ("-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON"):
        assert flag in flags
    for feature in ("AVX512", "AMX_TILE", "AMX_INT8", "AMX_BF16"):
        assert f"-DGGML_{feature}=OFF" in flags
    # llama.cpp's own account of what it was compiled with, in a child process.
    info = subprocess.run(
        [
            sys.executable,
            "-c",
            "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    from sluicegate.doctor import compiled_features

    features = compiled_features(info)
    assert features.get("AVX2") is True, info
    assert not any(
        on for name, on in features.items() if name.startswith(("AVX512", "AMX"))
    ), info
