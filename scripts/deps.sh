#!/usr/bin/env bash
# Installs the Debian 12 packages glm5.cpp needs, only those that are missing.
set -euo pipefail
pkgs=(build-essential cmake clang libclang-rt-14-dev googletest libgtest-dev libbenchmark-dev
      nlohmann-json3-dev libcpp-httplib-dev libpng-dev libjpeg62-turbo-dev nodejs npm curl
      tmux expect wamerican openmpi-bin libopenmpi-dev procps iproute2 chromium)
missing=()
for p in "${pkgs[@]}"; do
  # NodeSource's nodejs package bundles npm and conflicts with Debian's npm.
  [[ $p == npm ]] && command -v npm >/dev/null && continue
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

# The server's end-to-end tests drive glm5 serve with the official openai and
# @anthropic-ai/sdk clients, and its chat page in chromium (above) through
# playwright-core, pinned in tests/server/package-lock.json; reinstalled only when the
# lock changes.
server_tests="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/server"
if [[ ! -f $server_tests/node_modules/.package-lock.json ||
      $server_tests/package-lock.json -nt $server_tests/node_modules/.package-lock.json ]]; then
  echo "installing the server tests' npm packages (npm ci in tests/server)" >&2
  (cd "$server_tests" && npm ci --no-audit --no-fund --loglevel=error)
fi

# The ThreadSanitizer build (scripts/sanitize.sh) compiles cpp-httplib from the
# single header in Debian's source package, since the compiled library is not
# instrumented; it is fetched with apt-get source (adding Debian's deb-src index
# when the machine has none) into .cache/cpp-httplib.
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if ! ls "$repo"/.cache/cpp-httplib/*/httplib.h >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  if ! grep -rqs "^Types:.*deb-src" /etc/apt/sources.list.d/ && ! grep -qs "^deb-src" /etc/apt/sources.list; then
    echo "adding Debian's source index (deb-src) to fetch cpp-httplib's header" >&2
    sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources |
      $SUDO tee /etc/apt/sources.list.d/glm5-deb-src.sources >/dev/null
    $SUDO apt-get update -qq
  fi
  mkdir -p "$repo/.cache/cpp-httplib"
  (cd "$repo/.cache/cpp-httplib" && apt-get source --download-only -qq cpp-httplib >/dev/null 2>&1 &&
    tar xf cpp-httplib_*.orig.tar.* && rm -f ./*.dsc ./*.tar.*)
  ls "$repo"/.cache/cpp-httplib/*/httplib.h >/dev/null
fi
