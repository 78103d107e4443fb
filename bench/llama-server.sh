#!/usr/bin/env bash
# The ceiling for bench/engine.py: llama.cpp's own C++ server, `llama-server`, built from
# the llama.cpp that the llama-cpp-python source package vendors (the version sluicegate
# pins, from scripts/install-llama-cpp), with the same ggml CPU flags as sluicegate's
# wheel and the same build type (Release), into bench/.llama-server/ (ignored).
# Prints the binary's path on its last line; does nothing but print it when the binary
# exists and was built from the same version and flags.
#   bench/llama-server.sh            (several minutes on 2 cores the first time)
set -euo pipefail
cd "$(dirname "$0")"
version=$(../scripts/install-llama-cpp --print-version)
flags=$(../scripts/install-llama-cpp --print-flags)
key=$(../scripts/install-llama-cpp --print-key)
out=.llama-server
bin="$out/build/bin/llama-server"
if [ -x "$bin" ] && [ "$(cat "$out/KEY" 2>/dev/null)" = "$key" ]; then
    echo "$PWD/$bin"
    exit 0
fi
mkdir -p "$out"
src="$out/llama_cpp_python-$version"
if [ ! -d "$src/vendor/llama.cpp" ]; then
    # The source package only (pip's ordinary client; it builds nothing here).
    python3 -m pip download --quiet --no-deps --no-binary :all: \
        -d "$out" "llama-cpp-python==$version"
    tar -xzf "$out/llama_cpp_python-$version.tar.gz" -C "$out"
fi
# LLAVA_BUILD in the flags is llama-cpp-python's own switch; llama.cpp ignores it.
# shellcheck disable=SC2086  # the flags are one word each
cmake -S "$src/vendor/llama.cpp" -B "$out/build" -G Ninja $flags \
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -Wno-dev >"$out/cmake.log"
cmake --build "$out/build" --target llama-server -j "$(nproc)" >"$out/build.log"
echo "$key" >"$out/KEY"
echo "$PWD/$bin"
