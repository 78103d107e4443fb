#!/usr/bin/env bash
# Granian (a Rust HTTP server for Python), for bench/streams.py's
# `sluicegate-granian` server only: installed with pip into its own folder,
# bench/.granian, which that server adds to its PYTHONPATH. Not part of
# `make test`; sluicegate itself never imports it.
#   bench/granian-install.sh          (idempotent: a matching install is left alone)
set -euo pipefail
cd "$(dirname "$0")"
version="2.8.9"
dir=".granian"
python="../.venv/bin/python"
installed() {
    PYTHONPATH="$dir" "$python" -c 'import granian; print(granian.__version__)' \
        2>/dev/null || true
}
if [ "$(installed)" != "$version" ]; then
    "$python" -m pip install --quiet --target "$dir" --upgrade "granian==$version"
fi
got="$(installed)"
if [ "$got" != "$version" ]; then
    echo "expected granian $version in bench/$dir, found '${got:-nothing}'" >&2
    exit 1
fi
echo "granian $got in bench/$dir"
