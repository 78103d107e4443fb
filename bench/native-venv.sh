#!/usr/bin/env bash
# A rejected candidate, for bench/builds.py only: llama-cpp-python built the way pip
# builds it by default (GGML_NATIVE=ON: -march=native for this machine's CPU), with AMX
# switched off, in bench/.native-venv. sluicegate itself never installs this build
# (see scripts/install-llama-cpp); the version is the same, pip's cache is not used.
set -euo pipefail
cd "$(dirname "$0")"
version=$(../scripts/install-llama-cpp --print-version)
python3 -m venv .native-venv
.native-venv/bin/python -m pip install --quiet --upgrade pip
CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" \
    .native-venv/bin/python -m pip install --no-cache-dir --no-binary llama-cpp-python \
    --progress-bar off "llama-cpp-python==$version"
# llama-cpp-python is installed above and satisfies sluicegate's range.
.native-venv/bin/python -m pip install --quiet -e .. h11
