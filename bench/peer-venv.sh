#!/usr/bin/env bash
# The peer for side-by-side runs: the llama-cpp-python[server] OpenAI server, in its own
# virtual environment, the same llama-cpp-python version as sluicegate's (pip's wheel
# cache makes this quick after sluicegate's own set-up).
set -euo pipefail
cd "$(dirname "$0")"
python3 -m venv .peer-venv
.peer-venv/bin/python -m pip install --quiet --upgrade pip
.peer-venv/bin/python -m pip install --quiet "llama-cpp-python[server]==0.3.36"
