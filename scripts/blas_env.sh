#!/usr/bin/env bash
# blas_env.sh: sourced by scripts/main.sh and scripts/test.sh after a build, with a program that
# links OpenBLAS as $1. OpenBLAS 0.3.21 picks its kernels from the CPU's model number; where a
# virtual machine hides the model ("Intel(R) Xeon(R) Processor"), it falls back to its SSE3
# "Prescott" kernels on CPUs that have AVX-512: a 1024^3 f32 product ran at 56 GFLOP/s with them
# on a 2-core VM here, 293 with the SkylakeX kernels, and the main job's training step 2.5-3x
# slower (docs/benchmarks.md). When the user has not set OPENBLAS_CORETYPE, this asks OpenBLAS
# which kernels it chose (OPENBLAS_VERBOSE=2 prints "Core: NAME"), and where that is a pre-AVX
# core but the CPU's flags have AVX-512 (F, BW, DQ, VL) or AVX2 + FMA, exports
# OPENBLAS_CORETYPE=SkylakeX or Haswell and says so. It changes nothing when OpenBLAS recognised
# the CPU, on other architectures, or when the user chose.
# What it is not: a setting of taper's (taper never picks BLAS kernels itself).
taper_blas_env() {
  [ -n "${OPENBLAS_CORETYPE:-}" ] && return 0
  [ -x "${1:-}" ] && [ -r /proc/cpuinfo ] || return 0
  local core flags want=""
  core=$(OPENBLAS_VERBOSE=2 "$1" --help 2>&1 >/dev/null | sed -n 's/^Core: //p' | head -1)
  case "$core" in
    Prescott | Core2 | Penryn | Dunnington | Nehalem | Atom | Katmai | Coppermine | Northwood | Banias) ;;
    *) return 0 ;;
  esac
  flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  if [[ $flags == *" avx512f "* && $flags == *" avx512bw "* && $flags == *" avx512dq "* &&
        $flags == *" avx512vl "* ]]; then
    want=SkylakeX
  elif [[ $flags == *" avx2 "* && $flags == *" fma "* ]]; then
    want=Haswell
  fi
  [ -n "$want" ] || return 0
  export OPENBLAS_CORETYPE=$want
  echo "== OpenBLAS chose its $core kernels on this $(grep -m1 'model name' /proc/cpuinfo |
    cut -d: -f2 | sed 's/^ *//'), whose flags have $([ "$want" = SkylakeX ] && echo AVX-512 ||
    echo AVX2): OPENBLAS_CORETYPE=$want (set OPENBLAS_CORETYPE yourself to choose)" >&2
}
# `|| true`: a probe that fails (or a grep that finds nothing) never ends a `set -e` caller.
taper_blas_env "$@" || true
