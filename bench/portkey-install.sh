#!/usr/bin/env bash
# Portkey's AI gateway, for bench/gateway.py's `portkey` column: the npm package
# `@portkey-ai/gateway`, pinned to one release, in its own folder
# (bench/.portkey), run by the node from Debian (`apt-get install nodejs npm`).
# Not part of `make test`: only this benchmark needs it.
#   bench/portkey-install.sh          (idempotent: a matching install is left alone)
set -euo pipefail
cd "$(dirname "$0")"
version="1.15.2"
dir=".portkey"
command -v node >/dev/null || { echo "no node: apt-get install nodejs npm" >&2; exit 1; }
installed() {
    node -e "console.log(require('./$dir/node_modules/@portkey-ai/gateway/package.json').version)" \
        2>/dev/null || true
}
if [ "$(installed)" != "$version" ]; then
    mkdir -p "$dir"
    printf '{"private": true}\n' >"$dir/package.json"
    npm install --prefix "$dir" --no-audit --no-fund --omit=dev --save-exact \
        "@portkey-ai/gateway@$version" >/dev/null
fi
got="$(installed)"
if [ "$got" != "$version" ]; then
    echo "expected @portkey-ai/gateway $version in bench/$dir, found '${got:-nothing}'" >&2
    exit 1
fi
test -f "$dir/node_modules/@portkey-ai/gateway/build/start-server.js"
echo "@portkey-ai/gateway $got in bench/$dir (node $(node --version))"
