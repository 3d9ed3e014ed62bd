#!/usr/bin/env bash
# sass.sh: the sm_90 SASS of one CUDA source's kernels, without a GPU. nvcc -cubin with the
# flags of cuda/CMakeLists.txt, then nvdisasm, which Debian's CUDA toolkit here lacks: NVIDIA's
# PyPI wheel nvidia-cuda-nvdisasm, fetched once into .tools/ (git ignores it). Prints each kernel
# whose mangled name matches PATTERN (a Python regex) with its count of static instructions and
# ptxas's registers; SASS_OUT=FILE keeps the whole listing. For comparing a change's code before
# a GPU can time it (docs/cuda.md, session 22). cuda/norm.cu compiles once per float dtype
# (cuda/CMakeLists.txt): alone it gives f32's kernels, and with SASS_DEFS=-DTAPER_NORM_PART=bf16
# (f16, double) that dtype's.
# Usage: SASS_DEFS=-DTAPER_NORM_PART=bf16 bash scripts/sass.sh cuda/norm.cu \
#          'fwd_rows_kernelINS_4bf16ELNS1_4KindE0'
set -euo pipefail
cd "$(dirname "$0")/.."
src=$1
pat=${2:-.}
tool=.tools/nvdisasm/nvidia/cu13/bin/nvdisasm
if [ ! -x "$tool" ]; then
  mkdir -p .tools/nvdisasm
  python3 -m pip download -q --no-deps -d .tools/nvdisasm nvidia-cuda-nvdisasm==13.5.37
  (cd .tools/nvdisasm && python3 -m zipfile -e nvidia_cuda_nvdisasm-*.whl .)
  chmod +x "$tool"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
nvcc -std=c++20 -O3 -arch=sm_90 -I core/include -I . --expt-relaxed-constexpr --extended-lambda \
  --fmad=false ${SASS_DEFS:-} -Xptxas -v -cubin -o "$tmp/k.cubin" "$src" 2>"$tmp/ptxas.log"
"$tool" -c "$tmp/k.cubin" >"$tmp/k.sass"
[ -n "${SASS_OUT:-}" ] && cp "$tmp/k.sass" "$SASS_OUT"
python3 - "$tmp/k.sass" "$tmp/ptxas.log" "$pat" <<'PY'
import re, sys
sass, log, pat = open(sys.argv[1]).read(), open(sys.argv[2]).read(), sys.argv[3]
regs = dict(re.findall(r"Compiling entry function '(\w+)'.*?\n.*?Used (\d+) registers", log, re.S))
parts = re.split(r"\n\s*\.text\.(\S+):", sass)
for i in range(1, len(parts), 2):
    if re.search(pat, parts[i]):
        n = sum(1 for l in parts[i + 1].split("\n") if re.search(r"/\*[0-9a-f]{4,}\*/", l))
        print(f"{n:6d} instructions  {regs.get(parts[i], '?'):>3} registers  {parts[i]}")
PY
