#!/usr/bin/env bash
# no_cpu_includes.sh SRC: fails when a source file outside cpu/ includes a cpu/ header (issue 11:
# tests and benches reach cpu/ through tests/cpu_hooks.h and the public taper::num_threads; the
# scalar references live in tests/ref/). Searches SRC's C, C++ and CUDA sources, build folders,
# .git and the hidden folders of fetched data left out.
set -euo pipefail
SRC=${1:?usage: no_cpu_includes.sh SOURCE_DIR}
cd "$SRC"
[ -f cpu/cpu_common.h ] || { echo "no_cpu_includes: $SRC is not taper's source tree" >&2; exit 2; }
sources() {
  find . \( -path ./cpu -o -path './build*' -o -path './.*' -o -path ./out \) -prune -o -type f \
    \( -name '*.h' -o -name '*.hpp' -o -name '*.cpp' -o -name '*.cc' -o -name '*.cu' \
    -o -name '*.cuh' -o -name '*.inl' \) -print0
}
n=$(sources | tr -cd '\0' | wc -c)
((n > 0)) || { echo "no_cpu_includes: no sources found under $SRC" >&2; exit 2; }
# "cpu/x.h", <cpu/x.h>, "../cpu/x.h", "../../cpu/x.h", ...
hits=$(sources | xargs -0 grep -nHE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"](\.\./)*cpu/' || true)
if [ -n "$hits" ]; then
  echo "FAIL: files outside cpu/ include cpu/ headers (tests and benches: tests/cpu_hooks.h,"
  echo "tests/ref/ or the public API):"
  echo "$hits"
  exit 1
fi
echo "no file outside cpu/ includes a cpu/ header ($n files checked)"
