// copy_cast_ref.h: scalar references for the copy_cast family (to_dtype, arange, rand), the
// yardstick of cpu/copy_cast.cpp and cuda/copy_cast.cu in the tests. (The hooks that run the CPU's
// SIMD conversions on a chosen Highway target are declared in tests/cpu_hooks.h.)
//
// What it is: header-only, plain code written independently of dtype.h's bit tricks: a value is
// widened exactly to long double (64-bit significand: every u8/u32/i64/bf16/f16/f32/f64 fits) and
// rounded by `round_to_format`, a textbook round-to-nearest-even on (significand bits, exponent
// range) using frexp/ldexp/nearbyint. The Philox4x32-10 generator that rand/randn use is here too
// (pinned by the Random123 known-answer vectors in the tests).
// What it is not: fast, or a kernel. Kernels live in cpu/copy_cast.cpp and cuda/copy_cast.cu.
//
// The to_dtype contract (kernels and references agree bit for bit):
// - float targets round to nearest-even once from the exact source value (f64 -> bf16 and
//   i64 -> bf16 included: no double rounding through f32 or f64); overflow gives inf.
// - NaN -> bf16: the f32 NaN's (bits >> 16) | 0x40; NaN -> f16: sign | 0x7e00 | mantissa >> 13
//   (a f64 NaN passes through the FPU's f64 -> f32 conversion first); NaN -> f32/f64 stays NaN.
// - integer targets truncate toward zero and saturate: NaN -> 0, values below the type's minimum
//   give the minimum (0 for u8/u32), above its maximum give the maximum. Integer -> integer
//   saturates the same way (no wrap-around).
#pragma once

#include <algorithm>
#include <array>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "taper/dtype.h"

namespace taper::cpu::ref {

// ---- rounding, by value ------------------------------------------------------------------

/// A binary floating-point format: `p` significand bits (implicit bit included), smallest normal
/// 2^emin, largest finite (2 - 2^(1-p)) * 2^emax.
struct Format {
  int p, emin, emax;
};
inline constexpr Format kBf16{8, -126, 127};
inline constexpr Format kF16{11, -14, 15};
inline constexpr Format kF32{24, -126, 127};
inline constexpr Format kF64{53, -1022, 1023};

/// Rounds x to nearest-even in `fmt` (subnormals included, beyond the largest finite -> inf).
/// NaN, inf and zeros pass through.
inline long double round_to_format(long double x, Format fmt) {
  if (std::isnan(x) || std::isinf(x) || x == 0) return x;
  const long double a = std::fabs(x);
  int e = 0;
  (void)std::frexp(a, &e);                 // a in [2^(e-1), 2^e)
  const int exp = std::max(e - 1, fmt.emin);  // subnormals share the smallest normal's quantum
  const long double q = std::ldexp(1.0L, exp - (fmt.p - 1));
  const int saved = std::fegetround();
  std::fesetround(FE_TONEAREST);
  const long double r = std::nearbyint(a / q) * q;  // a / q and r * q are exact: powers of 2
  std::fesetround(saved);
  const long double max_finite = std::ldexp(2.0L - std::ldexp(1.0L, 1 - fmt.p), fmt.emax);
  const long double res = r > max_finite ? std::numeric_limits<long double>::infinity() : r;
  return x < 0 ? -res : res;
}

/// f16 bits of a value already representable in f16 (or +-inf), built from its exponent and
/// significand rather than from f32 bits.
inline uint16_t encode_f16(long double v) {
  const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  const long double a = std::fabs(v);
  if (std::isinf(a)) return sign | 0x7c00;
  if (a < std::ldexp(1.0L, -14)) return sign | static_cast<uint16_t>(std::ldexp(a, 24));
  int e = 0;
  const long double m = std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
  const auto mant = static_cast<uint16_t>(std::ldexp(m, 11) - 1024.0L);
  return sign | static_cast<uint16_t>((e - 1 + 15) << 10) | mant;
}

// ---- any dtype to any dtype, one value -------------------------------------------------------

/// The exact value of x.
template <class S> inline long double widen_exact(S x) {
  if constexpr (std::is_same_v<S, bf16> || std::is_same_v<S, f16>) {
    return static_cast<long double>(static_cast<float>(x));
  } else {
    return static_cast<long double>(x);
  }
}

/// The f32 a NaN of type S becomes (S's own bits for f32, the FPU's conversion for f64).
template <class S> inline float nan_as_f32(S x) {
  if constexpr (std::is_same_v<S, double>) {
    return static_cast<float>(x);
  } else if constexpr (std::is_same_v<S, float>) {
    return x;
  } else {
    return static_cast<float>(x);
  }
}

/// to_dtype of one value, per the contract at the top of this file.
template <class D, class S> inline D convert(S x) {
  const long double v = widen_exact(x);
  if constexpr (std::is_integral_v<D>) {
    if (std::isnan(v)) return 0;
    const long double t = std::trunc(v);
    const long double lo = static_cast<long double>(std::numeric_limits<D>::min());
    const long double hi = static_cast<long double>(std::numeric_limits<D>::max());
    if (t <= lo) return std::numeric_limits<D>::min();
    if (t >= hi) return std::numeric_limits<D>::max();
    return static_cast<D>(t);
  } else if constexpr (std::is_same_v<D, double>) {
    if (std::isnan(v)) return static_cast<double>(x);
    return static_cast<double>(round_to_format(v, kF64));
  } else if constexpr (std::is_same_v<D, float>) {
    if (std::isnan(v)) return nan_as_f32(x);
    return static_cast<float>(round_to_format(v, kF32));
  } else if constexpr (std::is_same_v<D, bf16>) {
    if (std::isnan(v)) {
      uint32_t u;
      const float f = nan_as_f32(x);
      std::memcpy(&u, &f, 4);
      return bf16::from_bits(static_cast<uint16_t>((u >> 16) | 0x40u));
    }
    // Representable in bf16, hence in f32 with the low 16 bits zero.
    const float f = static_cast<float>(round_to_format(v, kBf16));
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return bf16::from_bits(static_cast<uint16_t>(u >> 16));
  } else {
    static_assert(std::is_same_v<D, f16>);
    if (std::isnan(v)) {
      uint32_t u;
      const float f = nan_as_f32(x);
      std::memcpy(&u, &f, 4);
      return f16::from_bits(
          static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7e00u | ((u >> 13) & 0x3ffu)));
    }
    return f16::from_bits(encode_f16(round_to_format(v, kF16)));
  }
}

/// Bits of a value of any dtype, widened to 64 bits (for bit-exact comparisons; NaNs compare by
/// payload too).
template <class T> inline uint64_t bits_of(T x) {
  uint64_t u = 0;
  std::memcpy(&u, &x, sizeof(T));
  return u;
}

// ---- arange ----------------------------------------------------------------------------------

/// Element i of arange(start, step) as dtype T: start + i * step with one rounding (fma) in f64,
/// then converted as to_dtype does from f64.
template <class T> inline T arange_value(double start, double step, size_t i) {
  return convert<T>(std::fma(static_cast<double>(i), step, start));
}

// ---- Philox4x32-10 ---------------------------------------------------------------------------

/// Philox4x32 with 10 rounds: the one generator of taper/portable.h, in array form (the tests
/// pin it with Random123's known-answer vectors).
inline std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> ctr,
                                             std::array<uint32_t, 2> key) {
  const Philox4 r = taper::philox4x32_10(Philox4{{ctr[0], ctr[1], ctr[2], ctr[3]}}, key[0], key[1]);
  return {r[0], r[1], r[2], r[3]};
}

/// The Philox block of element pair k = i / 2 for `seed` (taper::philox_block).
inline Philox4 philox_block(uint64_t seed, uint64_t k) { return taper::philox_block(seed, k); }
using taper::normal_f64;
using taper::uniform_f64;
using taper::unit_double;

/// Keeps a rounded uniform value inside [lo, hi) (taper::below_hi).
using taper::below_hi;

/// Element i of rand(shape, T, seed, lo, hi): uniform in [lo, hi). Elements 2k and 2k+1 share
/// Philox block k; the f64 value is rounded once to T.
template <class T> inline T uniform_value(uint64_t seed, double lo, double hi, uint64_t i) {
  return below_hi(convert<T>(uniform_f64(philox_block(seed, i >> 1), i & 1, lo, hi)), lo, hi);
}

/// Element i of randn(shape, T, seed, mean, std): Normal(mean, std), rounded once to T.
template <class T> inline T normal_value(uint64_t seed, double mean, double std, uint64_t i) {
  return convert<T>(normal_f64(philox_block(seed, i >> 1), i & 1, mean, std));
}

}  // namespace taper::cpu::ref
