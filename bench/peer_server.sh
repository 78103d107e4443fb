#!/usr/bin/env bash
# Serve sluicegate's default GGUF with the llama-cpp-python[server] peer, for
# side-by-side `sluicegate check` and `sluicegate bench` runs.
#   bench/peer_server.sh [PORT]        (default 8001; n_ctx 2048, like the tests)
# The peer lives in bench/.peer-venv (made by bench/peer-venv.sh, same
# llama-cpp-python version as sluicegate's, reusing pip's wheel cache).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
port="${1:-8001}"
if ! "$root/bench/.peer-venv/bin/python" -c "import llama_cpp.server" 2>/dev/null; then
    "$root/bench/peer-venv.sh"
fi
model="$("$root/.venv/bin/sluicegate" model | tail -n 1)"  # the last line is the path
exec "$root/bench/.peer-venv/bin/python" -m llama_cpp.server \
    --model "$model" --host 127.0.0.1 --port "$port" --n_ctx 2048
