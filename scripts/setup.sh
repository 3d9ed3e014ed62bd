#!/usr/bin/env bash
# setup.sh: installs the Debian packages taper builds with, when any is missing. Idempotent: when
# everything is present it only checks (well under a second). `--bench` adds libtorch-dev
# (LibTorch 1.13, for the benchmark report's side-by-side bench_torch).
set -euo pipefail
PKGS=(cmake g++ make pkg-config libhwy-dev libopenblas-dev libgtest-dev libbenchmark-dev zlib1g-dev
      clang libclang-rt-14-dev)
[ "${1:-}" = "--bench" ] && PKGS+=(libtorch-dev)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi
