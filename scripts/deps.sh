#!/usr/bin/env bash
# Installs the Debian 12 packages glm5.cpp needs, only those that are missing.
set -euo pipefail
pkgs=(build-essential cmake clang libclang-rt-14-dev googletest libgtest-dev libbenchmark-dev
      nlohmann-json3-dev libcpp-httplib-dev nodejs npm curl tmux expect)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
