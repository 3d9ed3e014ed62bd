#!/usr/bin/env bash
# fetch_device_deps.sh: downloads (never installs) the Debian 12 packages taper builds with into
# .devdeps/, so a lent GPU machine with no package registry can build taper: scripts/gpu_run.sh
# unpacks them into a prefix there. About 14 MB; .devdeps/ is ignored by git.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .devdeps
cd .devdeps
PKGS=(libhwy-dev libhwy1 libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libopenblas0
      libgfortran5 libquadmath0 libgtest-dev libbenchmark-dev libbenchmark1debian
      pkgconf pkgconf-bin libpkgconf3)
have=1
for p in "${PKGS[@]}"; do ls "${p}"_*.deb >/dev/null 2>&1 || have=0; done
if ((have)); then echo "fetch_device_deps: all ${#PKGS[@]} packages present"; exit 0; fi
apt-get download "${PKGS[@]}" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true
ls -1 *.deb | wc -l
