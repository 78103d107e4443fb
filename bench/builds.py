"""llama.cpp builds side by side: the bare decode loop under each build's Python.

The candidates are virtual environments that differ only in how llama-cpp-python
was compiled: ``portable`` is the project's build (``.venv``, from
``scripts/install-llama-cpp``: x86-64-v3, no AVX-512, no AMX) and ``native`` is
pip's default build for this machine's CPU with AMX off (``bench/.native-venv``,
from ``bench/native-venv.sh``, made on first use). Each run is
``bench/engine_bare.py``'s bare loop (one prefill per sequence, then one token per
sequence per ``llama_decode``, greedy, a context of the server's shape) in a
child process of that Python; the candidates take turns run by run, each cell is
the median of ``--repeats`` runs, and "paired" is the median ratio of the runs
taken back to back. Prints a table and writes ``bench/results/builds.json``.
Not a test: nothing here asserts a timing.

Run: ``.venv/bin/python bench/builds.py [--concurrency 1,4,16] [--repeats 5]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sluicegate.cpu import cpu_model, read_cpuinfo

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "builds.json"
CANDIDATES = {
    "portable": ROOT / ".venv" / "bin" / "python",
    "native": ROOT / "bench" / ".native-venv" / "bin" / "python",
}


def _child(batch: int, max_tokens: int, threads: int, n_ctx: int, n_seq: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from engine_bare import bare_loop  # bench/engine_bare.py, beside this file

    from sluicegate.model import default_model_path

    rate, _ = bare_loop(default_model_path(), batch, max_tokens, threads, n_ctx, n_seq)
    print(json.dumps({"tokens_per_s": rate}))


def _run(
    python: Path, batch: int, args: argparse.Namespace, n_ctx: int, top: int
) -> float:
    cmd = [str(python), __file__, "--child", str(batch), str(args.max_tokens)]
    cmd += [str(args.threads), str(n_ctx), str(top)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return float(json.loads(out.splitlines()[-1])["tokens_per_s"])


def _system_info(python: Path) -> str:
    code = "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())"
    return subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args()
    if not CANDIDATES["native"].exists():
        subprocess.run(["bash", str(ROOT / "bench" / "native-venv.sh")], check=True)
    levels = [int(c) for c in args.concurrency.split(",")]
    top = max(levels)
    n_ctx = top * (64 + args.max_tokens) + 256
    console = Console()
    info = {name: _system_info(py) for name, py in CANDIDATES.items()}
    runs: dict[str, dict[int, list[float]]] = {n: {} for n in CANDIDATES}
    for c in levels:
        console.print(f"bare loop, {c} streams")
        for _ in range(args.repeats):
            for name, python in CANDIDATES.items():
                runs[name].setdefault(c, []).append(_run(python, c, args, n_ctx, top))
    table = Table(
        title=f"bare loop output tokens/s, {args.max_tokens} tokens per stream"
    )
    for col in ["streams", *CANDIDATES, "portable / native (paired)"]:
        table.add_column(col, justify="right")
    result: dict[str, object] = {
        "machine": platform.machine(),
        "cpu": cpu_model(read_cpuinfo()),
        "system_info": info,
        "repeats": args.repeats,
        "rows": [],
    }
    rows: list[dict[str, object]] = []
    for c in levels:
        medians = {n: statistics.median(runs[n][c]) for n in CANDIDATES}
        paired = statistics.median(
            p / n for p, n in zip(runs["portable"][c], runs["native"][c], strict=True)
        )
        table.add_row(
            str(c), *(f"{medians[n]:.1f}" for n in CANDIDATES), f"{paired:.1%}"
        )
        rows.append({"streams": c, "tokens_per_s": medians, "paired_ratio": paired})
    result["rows"] = rows
    console.print(table)
    for name, text in info.items():
        console.print(f"{name}: {text}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "--child":
        _child(*(int(a) for a in sys.argv[2:]))
        sys.exit(0)
    sys.exit(main())
