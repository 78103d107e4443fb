"""``sluicegate doctor``: CPU features, the build, and a generation in a child."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sluicegate.cpu import compiled_features, cpu_flags, missing_features
from sluicegate.doctor import CRASHED, FAILED, diagnose, run_child
from sluicegate.engines.llamacpp.config import EngineConfig

ROOT = Path(__file__).resolve().parents[1]
SYSTEM_INFO = (
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | "
    "BMI2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 |"
)
CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse sse2 pni ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2

processor\t: 1
flags\t\t: fpu
"""
# A child that says what llama.cpp would, then dies in native code.
CRASHING_CHILD = [
    sys.executable,
    "-c",
    "import ctypes, json; "
    f"print(json.dumps({{'kind': 'system_info', 'text': {SYSTEM_INFO!r}}}), "
    "flush=True); ctypes.string_at(0)",
]


def test_cpu_flags_are_the_first_processors() -> None:
    flags = cpu_flags(CPUINFO)
    assert {"avx2", "fma", "sse4_2"} <= flags
    assert "avx512f" not in flags
    assert cpu_flags("") == frozenset()


def test_compiled_features_are_read_from_llama_cpp_system_info() -> None:
    features = compiled_features(SYSTEM_INFO)
    assert features["AVX2"] is True
    assert features["AVX512"] is True
    assert features["OPENMP"] is True
    assert compiled_features("CPU : AVX2 = 0 |") == {"AVX2": False}


def test_features_compiled_in_that_the_cpu_lacks_are_named() -> None:
    features = compiled_features(SYSTEM_INFO)
    assert missing_features(features, cpu_flags(CPUINFO)) == ["AVX512", "AMX_INT8"]
    assert missing_features(features, frozenset()) == []


def test_a_child_killed_by_a_signal_counts_as_crashed() -> None:
    child = run_child(CRASHING_CHILD)
    assert child.crashed
    assert child.returncode == -signal.SIGSEGV
    assert child.records["system_info"]["text"] == SYSTEM_INFO
    assert "Segmentation fault" in child.stderr or child.stderr == ""
    ok = run_child([sys.executable, "-c", 'print(\'{"kind": "x"}\')'])
    assert (ok.crashed, ok.returncode, list(ok.records)) == (False, 0, ["x"])


def test_a_child_past_its_timeout_is_neither_crashed_nor_passed() -> None:
    child = run_child([sys.executable, "-c", "import time; time.sleep(30)"], 0.5)
    assert child.returncode is None
    assert not child.crashed


def test_a_crash_of_the_native_code_is_a_clear_message_and_exit_3(
    tmp_path: Path,
) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    stamp = tmp_path / "stamp"
    out = io.StringIO()
    code = diagnose(model, out, stamp, child_argv=CRASHING_CHILD)
    report = out.getvalue()
    assert code == CRASHED == 3
    assert "the llama.cpp build crashed on this CPU: killed by SIGSEGV" in report
    assert "cpu features:" in report
    assert "llama.cpp system info: CPU : SSE3 = 1" in report
    assert not stamp.exists()


def test_a_failing_child_is_exit_1_with_its_error(tmp_path: Path) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    out = io.StringIO()
    argv = [sys.executable, "-c", "raise SystemExit('cannot load the model')"]
    assert diagnose(model, out, child_argv=argv) == FAILED
    assert "cannot load the model" in out.getvalue()


def test_a_pass_is_stamped_and_a_later_run_skips(tmp_path: Path) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    stamp = tmp_path / "stamp"
    record = {"kind": "generation", "tokens": 3, "seconds": 0.1, "text": " there"}
    argv = [sys.executable, "-c", f"print({json.dumps(json.dumps(record))})"]
    out = io.StringIO()
    assert diagnose(model, out, stamp, child_argv=argv) == 0
    assert "doctor: ok" in out.getvalue()
    assert "no expected value for this file" in out.getvalue()
    again = io.StringIO()
    failing = [sys.executable, "-c", "raise SystemExit(1)"]
    assert diagnose(model, again, stamp, child_argv=failing) == 0
    assert "passed before" in again.getvalue()
    model.write_bytes(b"GGUF2")  # another model file: the stamp no longer holds
    assert diagnose(model, io.StringIO(), stamp, child_argv=failing) == FAILED


@pytest.mark.llamacpp
@pytest.mark.slow
def test_doctor_runs_the_default_model_in_a_child_and_exits_0() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sluicegate", "doctor"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = proc.stdout
    assert "llama.cpp system info:" in report
    assert "AVX2 = 1" in report
    assert "matches the package's" in report
    assert "generation: 32 tokens" in report
    assert f"serve's engine (no flags): {EngineConfig().describe()}" in report
    assert report.rstrip().endswith("doctor: ok")


def test_doctor_reports_each_upstreams_models_or_why_not() -> None:
    import io

    import httpx

    from sluicegate.doctor_upstream import diagnose_upstreams

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.host == "10.0.0.5":
            return httpx.Response(200, json={"data": [{"id": "qwen"}]})
        return httpx.Response(401, json={"error": {"message": "bad key sk-x"}})

    out = io.StringIO()
    urls = ["http://10.0.0.5:8000/v1", "http://u:pw-secret@10.0.0.6:8000/v1"]
    code = diagnose_upstreams(urls, out, transport=httpx.MockTransport(answer))
    report = out.getvalue()
    assert code == 1
    assert "upstream http://10.0.0.5:8000/v1/models: 1 models: 'qwen'" in report
    assert "upstream http://10.0.0.6:8000/v1/models: error: answered 401" in report
    assert "pw-secret" not in report
    assert "sk-x" not in report
    ok = io.StringIO()
    assert diagnose_upstreams(urls[:1], ok, transport=httpx.MockTransport(answer)) == 0
    assert "doctor: upstreams ok" in ok.getvalue()


def test_doctor_with_only_upstreams_exits_1_for_an_unreachable_one() -> None:
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sluicegate",
            "doctor",
            "--upstream",
            f"http://127.0.0.1:{port}/v1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "error: no answer (ConnectError)" in done.stdout
    assert "llama" not in done.stdout  # no local model check without --model
