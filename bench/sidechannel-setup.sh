#!/usr/bin/env bash
# Set up bench/sidechannel.py: Debian's tshark (the observer's capture of TLS
# records) and bench/.sidechannel-venv, a venv that sees the project's .venv
# (through a .pth file) and adds scikit-learn and cryptography.
# Idempotent; needs root (or sudo) for tshark.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v tshark >/dev/null; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq tshark
fi
VENV=.sidechannel-venv
PY=${PROJECT_PYTHON:-../.venv/bin/python}
if [ ! -f "$VENV/.installed" ] || ! cmp -s sidechannel-requirements.txt "$VENV/.installed"; then
    "$PY" -m venv --without-pip "$VENV"
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    main=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "import site; site.addsitedir('$main')" > "$site/project-venv.pth"
    "$VENV/bin/python" -m pip install --quiet -r sidechannel-requirements.txt
    cp sidechannel-requirements.txt "$VENV/.installed"
fi
