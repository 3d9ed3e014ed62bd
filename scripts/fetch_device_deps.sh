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
if ((have)); then
  echo "fetch_device_deps: all ${#PKGS[@]} packages present"
else
  apt-get download "${PKGS[@]}" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true
  ls -1 *.deb | wc -l
fi

# The model for the GPU machine's fine-tune: the f32 safetensors (87 MiB) does not fit the device
# tool's 64 MiB transfer, so .devmodel/ holds a copy whose weights are f16 (rounded to nearest-
# even by Python's struct 'e'; taper's loader converts them to the model's dtype).
cd ..
SRC=.models/all-MiniLM-L6-v2
DST=.devmodel/all-MiniLM-L6-v2
if [ -s "$SRC/model.safetensors" ] && [ ! -s "$DST/model.safetensors" ]; then
  mkdir -p "$DST"
  cp -r "$SRC"/*.json "$SRC"/vocab.txt "$SRC"/1_Pooling "$DST"/
  python3 - "$SRC/model.safetensors" "$DST/model.safetensors" <<'PY'
import array, json, struct, sys
src, dst = sys.argv[1], sys.argv[2]
with open(src, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    head = json.loads(f.read(n))
    body = f.read()
meta = head.pop("__metadata__", None)
out_head, chunks, off = {}, [], 0
for name, t in sorted(head.items(), key=lambda kv: kv[1]["data_offsets"][0]):
    a, b = t["data_offsets"]
    raw = body[a:b]
    if t["dtype"] == "F32":
        v = array.array("f"); v.frombytes(raw)
        raw = struct.pack("<%de" % len(v), *v)
        t = dict(t, dtype="F16")
    out_head[name] = dict(t, data_offsets=[off, off + len(raw)])
    chunks.append(raw); off += len(raw)
if meta is not None: out_head["__metadata__"] = meta
h = json.dumps(out_head).encode(); h += b" " * (-len(h) % 8)
with open(dst, "wb") as f:
    f.write(struct.pack("<Q", len(h))); f.write(h)
    for c in chunks: f.write(c)
PY
  echo "fetch_device_deps: $DST (f16 weights, $(du -m "$DST/model.safetensors" | cut -f1) MiB)"
fi
