#!/usr/bin/env bash
# LiteLLM's proxy, for bench/gateway.py's third column: `litellm[proxy]` in its own
# virtual environment, bench/.litellm-venv, pinned to one release. The 1.107 series
# was a compromised release and is never installed; any pin here stays at or above
# 1.108. 1.108.7 is the newest release whose whole `proxy` extra resolves from the
# package index this project uses (later ones pin `litellm-proxy`,
# `litellm-proxy-extras` or `litellm-enterprise` builds it does not carry). The
# script checks the installed version before it reports success.
#   bench/litellm-venv.sh            (idempotent: a matching venv is left alone)
set -euo pipefail
cd "$(dirname "$0")"
version="1.108.7"
venv=".litellm-venv"
installed() {
    "$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("litellm"))' \
        2>/dev/null || true
}
if [ "$(installed)" != "$version" ]; then
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install --quiet --progress-bar off \
        "litellm[proxy]==$version"
fi
got="$(installed)"
case "$got" in
    1.107.*) echo "litellm $got is a compromised release: remove $venv" >&2; exit 1 ;;
esac
if [ "$got" != "$version" ]; then
    echo "expected litellm $version in $venv, found '${got:-nothing}'" >&2
    exit 1
fi
"$venv/bin/litellm" --help >/dev/null
echo "litellm $got in bench/$venv"
