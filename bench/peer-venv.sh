#!/usr/bin/env bash
# The peer for side-by-side runs: the llama-cpp-python[server] OpenAI server, in its own
# virtual environment, on the same llama-cpp-python build as sluicegate's (the same
# version and CPU flags, from scripts/install-llama-cpp; quick after sluicegate's own
# set-up, which built the wheel).
set -euo pipefail
cd "$(dirname "$0")"
python3 -m venv .peer-venv
.peer-venv/bin/python -m pip install --quiet --upgrade pip
../scripts/install-llama-cpp .peer-venv/bin/python
# llama-cpp-python itself is installed above and satisfies the pin: this adds only the
# server's own dependencies.
.peer-venv/bin/python -m pip install --quiet \
    "llama-cpp-python[server]==$(../scripts/install-llama-cpp --print-version)"
