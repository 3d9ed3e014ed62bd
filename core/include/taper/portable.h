// portable.h: the bits every device must compute identically, in one source that host code and
// CUDA device code both compile (functions are `TAPER_HD`: __host__ __device__ under nvcc).
//
// What it is: the f32 <-> bf16/f16 conversions with round-to-nearest-even, f64 -> f32 rounded to
// odd (so f64 -> half rounds once), `round_to` / `widen` between storage and compute types,
// `cast_value`, the to_dtype contract for one value (tests/ref/copy_cast_ref.h states it and
// holds an independent reference), and the Philox4x32-10 generator behind rand/randn with the
// transforms that turn its words into uniform and normal values. What it is not: SIMD code
// (cpu/) or kernels (cuda/); no allocation, no exceptions, nothing that needs the host.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#if defined(__CUDACC__)
#define TAPER_HD __host__ __device__ inline
#else
#define TAPER_HD inline
#endif

namespace taper {

// ---- bit casts ------------------------------------------------------------------------------

TAPER_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
TAPER_HD float f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
TAPER_HD uint64_t f64_bits(double d) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(d));
#else
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
#endif
}
TAPER_HD double f64_from_bits(uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double d;
  std::memcpy(&d, &u, 8);
  return d;
#endif
}

// ---- scalar half conversions ----------------------------------------------------------------

/// f32 -> bf16 bits, round to nearest-even; NaN becomes a quiet NaN with the same sign.
TAPER_HD uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);  // ties go to the even bf16; overflow carries into inf
  return static_cast<uint16_t>(u >> 16);
}
TAPER_HD float bf16_bits_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

/// f32 -> IEEE binary16 bits, round to nearest-even, subnormals exact, overflow to inf,
/// NaN to a quiet NaN with the same sign.
TAPER_HD uint16_t f32_to_f16_bits(float f) {
  uint32_t u = f32_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((u >> 13) & 0x3ffu));
  if (u >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (u < 0x38800000u) {  // below the smallest normal f16 (2^-14): subnormal or zero
    if (u < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25 rounds to 0 (tie too)
    const uint32_t exp = u >> 23;                  // 102..112
    const uint32_t mant = (u & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exp;             // 14..24
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = ((u - 0x38000000u) >> 13);  // rebias exponent 127 -> 15
  const uint32_t rem = u & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // carry may reach the next binade
  return static_cast<uint16_t>(sign | h);
}

TAPER_HD float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // zero or subnormal: mant * 2^-24, exact in f32
    const float v = static_cast<float>(mant) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  if (exp == 31) return f32_from_bits(sign | 0x7f800000u | (mant << 13));
  return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

/// f64 -> f32 rounded to odd: an inexact value takes the neighbour whose last mantissa bit is 1,
/// so a later rounding to a format with >= 2 fewer bits equals rounding the f64 value directly.
TAPER_HD float f64_to_f32_round_odd(double d) {
  const float f = static_cast<float>(d);
  if (d != d || static_cast<double>(f) == d) return f;
  const double fmax = 3.4028234663852886e38;
  if (d > fmax || d < -fmax) {
    if (d - d != 0.0) return f;  // inf
    return d > 0 ? static_cast<float>(fmax) : -static_cast<float>(fmax);
  }
  uint32_t u = f32_bits(f);
  if ((f < 0 ? -static_cast<double>(f) : static_cast<double>(f)) > (d < 0 ? -d : d)) --u;
  return f32_from_bits(u | 1u);
}

/// f64 -> bf16 bits, rounded once to nearest-even.
TAPER_HD uint16_t f64_to_bf16_bits(double d) { return f32_to_bf16_bits(f64_to_f32_round_odd(d)); }
/// f64 -> f16 bits, rounded once to nearest-even.
TAPER_HD uint16_t f64_to_f16_bits(double d) { return f32_to_f16_bits(f64_to_f32_round_odd(d)); }

/// bfloat16 storage type. Arithmetic is done by converting to float.
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  TAPER_HD explicit bf16(float f) : bits(f32_to_bf16_bits(f)) {}
  /// Rounds the f64 value once (not through a rounded f32).
  TAPER_HD explicit bf16(double d) : bits(f64_to_bf16_bits(d)) {}
  TAPER_HD static bf16 from_bits(uint16_t b) {
    bf16 r;
    r.bits = b;
    return r;
  }
  TAPER_HD explicit operator float() const { return bf16_bits_to_f32(bits); }
  TAPER_HD explicit operator double() const { return bf16_bits_to_f32(bits); }
};

/// IEEE binary16 storage type. Arithmetic is done by converting to float.
struct f16 {
  uint16_t bits = 0;
  f16() = default;
  TAPER_HD explicit f16(float f) : bits(f32_to_f16_bits(f)) {}
  /// Rounds the f64 value once (not through a rounded f32).
  TAPER_HD explicit f16(double d) : bits(f64_to_f16_bits(d)) {}
  TAPER_HD static f16 from_bits(uint16_t b) {
    f16 r;
    r.bits = b;
    return r;
  }
  TAPER_HD explicit operator float() const { return f16_bits_to_f32(bits); }
  TAPER_HD explicit operator double() const { return f16_bits_to_f32(bits); }
};

/// An unsigned type of B bytes, for kernels that move bits only (copy, fill, where_cond): 4
/// widths serve the 7 dtypes.
template <size_t B> struct Bits;
template <> struct Bits<1> { using type = uint8_t; };
template <> struct Bits<2> { using type = uint16_t; };
template <> struct Bits<4> { using type = uint32_t; };
template <> struct Bits<8> { using type = uint64_t; };

template <class T> inline constexpr bool is_half_v = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

/// The type a kernel computes in for storage type T: f64 for f64, f32 for everything else
/// (bf16/f16 widen exactly; every device uses this one rule).
template <class T> using compute_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

/// Widens a storage value to its compute type (exact for the float types).
template <class T> TAPER_HD compute_t<T> widen(T v) { return static_cast<compute_t<T>>(v); }

/// Rounds a compute value (float or double) once to the storage type T (bf16, f16, float,
/// double).
template <class T, class C> TAPER_HD T round_to(C v) {
  if constexpr (std::is_same_v<T, C>) {
    return v;
  } else if constexpr (std::is_same_v<T, bf16>) {
    if constexpr (std::is_same_v<C, double>) return bf16::from_bits(f64_to_bf16_bits(v));
    else return bf16::from_bits(f32_to_bf16_bits(static_cast<float>(v)));
  } else if constexpr (std::is_same_v<T, f16>) {
    if constexpr (std::is_same_v<C, double>) return f16::from_bits(f64_to_f16_bits(v));
    else return f16::from_bits(f32_to_f16_bits(static_cast<float>(v)));
  } else {
    return static_cast<T>(v);
  }
}

// ---- to_dtype of one value (the contract of tests/ref/copy_cast_ref.h) ------------------------

namespace detail {

TAPER_HD int clz64(uint64_t x) {
#if defined(__CUDA_ARCH__)
  return __clzll(static_cast<long long>(x));
#else
  return __builtin_clzll(x);
#endif
}

/// Float value (exact, in f64) -> integer type D: truncate toward zero, saturate, NaN -> 0.
template <class D> TAPER_HD D float_to_int(double v) {
  if constexpr (std::is_signed_v<D>) {
    if (v != v) return 0;
    if (v >= 0x1p63) return std::numeric_limits<D>::max();
    if (v < -0x1p63) return std::numeric_limits<D>::min();
    return static_cast<D>(v);
  } else {
    if (!(v > -1.0)) return 0;  // NaN, and everything that truncates below 0
    const double top = static_cast<double>(std::numeric_limits<D>::max()) + 1.0;  // exact
    if (v >= top) return std::numeric_limits<D>::max();
    return static_cast<D>(v);
  }
}

/// Integer -> integer, saturating (u8, u32 and i64 all fit in i64 or u64 comparisons).
template <class D, class S> TAPER_HD D int_to_int(S x) {
  if constexpr (std::is_signed_v<S>) {
    if (x < 0) {
      if constexpr (std::is_signed_v<D>) return static_cast<D>(x);  // i64 -> i64 only
      else return 0;
    }
  }
  const auto u = static_cast<uint64_t>(x);
  if (u > static_cast<uint64_t>(std::numeric_limits<D>::max())) return std::numeric_limits<D>::max();
  return static_cast<D>(u);
}

/// i64 -> f64 rounded to odd: the top 53 significant bits with the dropped bits OR-ed into the
/// last one. Rounding this later to f32 (to odd) and then to a half type equals rounding the
/// integer once.
TAPER_HD double i64_to_f64_round_odd(int64_t x) {
  const uint64_t m = x < 0 ? 0 - static_cast<uint64_t>(x) : static_cast<uint64_t>(x);
  if (m < (uint64_t{1} << 53)) return static_cast<double>(x);
  const int shift = 64 - clz64(m) - 53;  // 1..11
  uint64_t kept = m >> shift;
  if (m & ((uint64_t{1} << shift) - 1)) kept |= 1u;
  // kept < 2^53 is exact in f64; scaling by 2^shift is exact.
  const double d = static_cast<double>(kept) * f64_from_bits(static_cast<uint64_t>(1023 + shift) << 52);
  return x < 0 ? -d : d;
}

}  // namespace detail

/// One value of type S to type D, per the to_dtype contract: float targets round to nearest-even
/// once from the exact source value; integer targets truncate toward zero and saturate, NaN -> 0.
template <class D, class S> TAPER_HD D cast_value(S x) {
  if constexpr (std::is_same_v<D, S>) {
    return x;
  } else if constexpr (std::is_integral_v<D>) {
    if constexpr (std::is_integral_v<S>) return detail::int_to_int<D>(x);
    else return detail::float_to_int<D>(static_cast<double>(widen(x)));
  } else if constexpr (std::is_same_v<S, int64_t>) {
    // f32/f64: the FPU's conversion rounds once; halves need the sticky bit kept.
    if constexpr (std::is_same_v<D, float> || std::is_same_v<D, double>) return static_cast<D>(x);
    else return round_to<D>(detail::i64_to_f64_round_odd(x));
  } else if constexpr (std::is_integral_v<S>) {
    return round_to<D>(static_cast<double>(x));  // u8/u32 are exact in f64
  } else {
    using C = std::conditional_t<std::is_same_v<S, double> || std::is_same_v<D, double>, double,
                                 float>;
    return round_to<D>(static_cast<C>(widen(x)));
  }
}

// ---- Philox4x32-10 and the rand/randn transforms ----------------------------------------------

/// Four 32-bit words: a Philox counter or output block.
struct Philox4 {
  uint32_t w[4];
  TAPER_HD uint32_t operator[](int i) const { return w[i]; }
};

/// Philox4x32 with 10 rounds (Salmon et al., SC'11; Random123's philox4x32_R(10, ...)).
TAPER_HD Philox4 philox4x32_10(Philox4 ctr, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    const uint64_t p0 = static_cast<uint64_t>(kM0) * ctr.w[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * ctr.w[2];
    ctr = Philox4{{static_cast<uint32_t>(p1 >> 32) ^ ctr.w[1] ^ k0, static_cast<uint32_t>(p1),
                   static_cast<uint32_t>(p0 >> 32) ^ ctr.w[3] ^ k1, static_cast<uint32_t>(p0)}};
  }
  return ctr;
}

/// The Philox block of element pair k = i / 2 for `seed`: counter (k_lo, k_hi, 0, 0), key
/// (seed_lo, seed_hi). Values depend only on (seed, index), never on threads or devices.
TAPER_HD Philox4 philox_block(uint64_t seed, uint64_t k) {
  return philox4x32_10(Philox4{{static_cast<uint32_t>(k), static_cast<uint32_t>(k >> 32), 0u, 0u}},
                       static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

/// 53 random bits of two words -> [0, 1) in f64.
TAPER_HD double unit_double(uint32_t hi, uint32_t lo) {
  const uint64_t u = ((static_cast<uint64_t>(hi) << 32) | lo) >> 11;
  return static_cast<double>(u) * 0x1p-53;
}

/// The pre-rounding f64 value of a rand element from its Philox block: lo + (hi - lo) u with one
/// fma (correctly rounded on every device), u in [0, 1) from words 0-1 (`second` false) or 2-3.
TAPER_HD double uniform_f64(const Philox4& b, bool second, double lo, double hi) {
  const double u = second ? unit_double(b.w[2], b.w[3]) : unit_double(b.w[0], b.w[1]);
  return std::fma(hi - lo, u, lo);
}

/// The pre-rounding f64 value of a randn element from its Philox block (Box-Muller):
/// u1 in (0, 1] from words 0-1, u2 in [0, 1) from words 2-3; the first element of the pair takes
/// r cos(2 pi u2), the second r sin(2 pi u2); then mean + std z with one fma. log, sin and cos
/// are each device's libm (glibc on the host, CUDA's on the GPU: both within 1 ulp of f64, so
/// the f64 values may differ in the last bit and a value rounded to f32 or a half type almost
/// never does).
TAPER_HD double normal_f64(const Philox4& b, bool second, double mean, double std) {
  const double u1 = 1.0 - unit_double(b.w[0], b.w[1]);  // (0, 1]: log never sees 0
  const double u2 = unit_double(b.w[2], b.w[3]);
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double theta = 6.283185307179586476925286766559 * u2;
  return std::fma(std, second ? r * std::sin(theta) : r * std::cos(theta), mean);
}

/// Largest value of float type T (bf16, f16, float, double) strictly below v (v finite).
template <class T> TAPER_HD T step_down(T v) {
  if constexpr (std::is_same_v<T, float>) {
    const uint32_t u = f32_bits(v);
    if ((u & 0x7fffffffu) == 0) return -f32_from_bits(1u);
    return f32_from_bits((u & 0x80000000u) ? u + 1 : u - 1);
  } else if constexpr (std::is_same_v<T, double>) {
    const uint64_t u = f64_bits(v);
    if ((u & 0x7fffffffffffffffull) == 0) return -f64_from_bits(1u);
    return f64_from_bits((u & 0x8000000000000000ull) ? u + 1 : u - 1);
  } else {
    const uint16_t b = v.bits;
    if ((b & 0x7fffu) == 0) return T::from_bits(0x8001u);  // +-0 -> the negative subnormal
    return T::from_bits(static_cast<uint16_t>((b & 0x8000u) ? b + 1 : b - 1));
  }
}

/// Keeps a rounded uniform value inside [lo, hi): a value that rounded up to hi (or past it, when
/// hi is not representable in T) steps down to the largest T below hi.
template <class T> TAPER_HD T below_hi(T v, double lo, double hi) {
  if constexpr (!std::is_integral_v<T>) {  // integers truncate: already below hi
    for (int guard = 0; guard < 4 && hi > lo && static_cast<double>(widen(v)) >= hi; ++guard)
      v = step_down(v);
  }
  return v;
}

/// Element i of rand(shape, T, seed, lo, hi): uniform in [lo, hi), rounded once to T.
template <class T> TAPER_HD T uniform_value(uint64_t seed, double lo, double hi, uint64_t i) {
  return below_hi(cast_value<T>(uniform_f64(philox_block(seed, i >> 1), i & 1, lo, hi)), lo, hi);
}

/// Element i of randn(shape, T, seed, mean, std): Normal(mean, std), rounded once to T.
template <class T> TAPER_HD T normal_value(uint64_t seed, double mean, double std, uint64_t i) {
  return cast_value<T>(normal_f64(philox_block(seed, i >> 1), i & 1, mean, std));
}

/// arange element i: start + i * step with one rounding (fma) in f64, converted once.
template <class T> TAPER_HD T arange_value(double start, double step, uint64_t i) {
  return cast_value<T>(std::fma(static_cast<double>(i), step, start));
}

}  // namespace taper
