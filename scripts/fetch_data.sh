#!/usr/bin/env bash
# fetch_data.sh: puts Jane Austen's six novels (Debian's r-cran-janeaustenr, public-domain texts
# stored as an R lazy-load database) into the project-local folder .data/. The .deb is fetched
# with `apt-get download` and unpacked with `dpkg-deb -x`: installing it would pull in R, and
# taper reads the database itself (examples/finetune/rdata.h). Idempotent: when the files are
# present it only checks them. Prints the directory holding Rdata.rdx/Rdata.rdb as its last line.
#
# Usage: bash scripts/fetch_data.sh [DEST]      (DEST defaults to <repo>/.data)
set -euo pipefail

PKG="r-cran-janeaustenr"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${1:-$ROOT/.data}"
PKG_DIR="$DEST/janeaustenr"
DATA_DIR="$PKG_DIR/usr/lib/R/site-library/janeaustenr/data"

have_all() { [ -s "$DATA_DIR/Rdata.rdx" ] && [ -s "$DATA_DIR/Rdata.rdb" ]; }

if ! have_all; then
  mkdir -p "$DEST"
  deb="$(ls "$DEST"/${PKG}_*.deb 2>/dev/null | head -n1 || true)"
  if [ -z "$deb" ]; then
    echo "fetch_data: downloading $PKG"
    # apt-get download writes into the current directory; it needs the package lists, which a
    # fresh machine may not have yet.
    if ! (cd "$DEST" && apt-get download -qq "$PKG" 2>/dev/null); then
      SUDO=""
      [ "$(id -u)" -ne 0 ] && SUDO="sudo"
      $SUDO apt-get update -qq
      (cd "$DEST" && apt-get download -qq "$PKG")
    fi
    deb="$(ls "$DEST"/${PKG}_*.deb | head -n1)"
  fi
  rm -rf "$PKG_DIR"
  TMP="$(mktemp -d "$DEST/.unpack.XXXXXX")"
  trap 'rm -rf "$TMP"' EXIT
  dpkg-deb -x "$deb" "$TMP"
  mv "$TMP" "$PKG_DIR"
  trap - EXIT
  if ! have_all; then
    echo "fetch_data: $deb has no Rdata.rdx/Rdata.rdb under ${DATA_DIR#"$PKG_DIR"}" >&2
    exit 1
  fi
fi

echo "fetch_data: janeaustenr's lazy-load database is in $DATA_DIR (Rdata.rdx, Rdata.rdb)"
echo "$DATA_DIR"
