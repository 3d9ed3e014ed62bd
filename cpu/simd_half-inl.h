// simd_half-inl.h: loading bf16/f16/f32/f64 into compute lanes and storing them back, with the
// same rounding as the scalar conversions of taper/dtype.h, bit for bit, on every Highway target.
//
// What it is: a per-target header (re-included once per target by foreach_target.h, as
// Highway's own -inl.h files are) with `LoadAs` / `StoreFrom` and their partial forms
// `LoadAsN` / `StoreFromN`, plus a scalar section (normal include guard) with the f64 -> half
// conversions that round once.
// What it is not: kernels. Highway 1.0.3's own bf16 demotion truncates and its software f16
// paths (SSE4/EMU128) truncate and mishandle inf/NaN, so every rounding here is written with
// integer lanes; only F16C's f32 -> f16 (AVX2/AVX3, round-to-nearest-even) is used as is.
//
// Rounding contract (the same as dtype.h): f32 -> bf16/f16 rounds to nearest, ties to even;
// overflow gives inf; f16 subnormals are exact; NaN becomes a quiet NaN with the same sign
// (bf16: (bits >> 16) | 0x40; f16: sign | 0x7e00 | mantissa >> 13). f64 -> bf16/f16 rounds the
// f64 value once: f64 -> f32 by round-to-odd (which keeps a sticky bit, 29 spare bits >= 2), then
// f32 -> half to nearest-even, so no double rounding.

// ---- scalar part (once per translation unit) -------------------------------------------------
#ifndef TAPER_CPU_SIMD_HALF_SCALAR_H_
#define TAPER_CPU_SIMD_HALF_SCALAR_H_

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cpu/cpu_common.h"
#include "taper/dtype.h"

namespace taper::cpu {

// The scalar twins of LoadAs / StoreFrom (`widen`, `round_to`) and the f64 -> half conversions
// that round once live in taper/portable.h, shared with the CUDA kernels.

}  // namespace taper::cpu

#endif  // TAPER_CPU_SIMD_HALF_SCALAR_H_

// ---- per-target part -------------------------------------------------------------------------
#if defined(TAPER_CPU_SIMD_HALF_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TAPER_CPU_SIMD_HALF_INL_H_
#undef TAPER_CPU_SIMD_HALF_INL_H_
#else
#define TAPER_CPU_SIMD_HALF_INL_H_
#endif

#include <algorithm>
#include <cstring>

#include "hwy/cache_control.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace taper::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// F16C's f32 -> f16 (AVX2 and up) rounds to nearest-even and treats NaN/inf/subnormals exactly
// as dtype.h does (checked on all 2^32 inputs); elsewhere Highway 1.0.3 emulates it inexactly,
// so we use integer lanes.
#undef TAPER_HWY_HAVE_F16C
#if HWY_ARCH_X86 && (HWY_TARGET <= HWY_AVX2) && !defined(HWY_DISABLE_F16C)
#define TAPER_HWY_HAVE_F16C 1
#else
#define TAPER_HWY_HAVE_F16C 0
#endif

namespace detail {

/// u16 bits (zero-extended in u32 lanes of df's shape) of bf16 values -> f32.
template <class DF>
HWY_INLINE hn::Vec<DF> Bf16BitsToF32(DF df, hn::Vec<hn::RebindToUnsigned<DF>> bits) {
  return hn::BitCast(df, hn::ShiftLeft<16>(bits));
}

/// f32 -> bf16 rounded to nearest-even (f32_to_bf16_bits), the bf16 bits in the upper half of
/// each u32 lane (the lower half is left over). Ties go to the even bf16; a carry out of the
/// mantissa bumps the exponent (overflow -> inf); NaN keeps its upper half with the quiet bit.
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> F32ToBf16High(DF df, hn::Vec<DF> v) {
  const hn::RebindToUnsigned<DF> du;
  (void)df;
  const auto u = hn::BitCast(du, v);
  const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
  const auto rounded = hn::Add(u, hn::Add(lsb, hn::Set(du, 0x7fffu)));
  return hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), hn::Or(u, hn::Set(du, 0x400000u)),
                        rounded);
}

/// f32 -> bf16 bits in u32 lanes, round to nearest-even (f32_to_bf16_bits).
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> F32ToBf16Bits(DF df, hn::Vec<DF> v) {
  return hn::ShiftRight<16>(F32ToBf16High(df, v));
}

/// f16 bits (in u32 lanes) -> f32, exact (f16_bits_to_f32).
template <class DF>
HWY_INLINE hn::Vec<DF> F16BitsToF32(DF df, hn::Vec<hn::RebindToUnsigned<DF>> h) {
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const auto sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)));
  const auto em = hn::And(h, hn::Set(du, 0x7fffu));
  const auto em_i = hn::BitCast(di, em);
  // Normal: rebias the exponent 15 -> 127. Inf/NaN: all-ones exponent, mantissa kept.
  const auto normal = hn::Add(hn::ShiftLeft<13>(em), hn::Set(du, 112u << 23));
  const auto special = hn::Or(hn::ShiftLeft<13>(em), hn::Set(du, 0x7f800000u));
  // Subnormal (and zero): mantissa * 2^-24, exact in f32.
  const auto sub = hn::BitCast(
      du, hn::Mul(hn::ConvertTo(df, em_i), hn::Set(df, 5.9604644775390625e-08f)));
  auto r = hn::IfThenElse(hn::RebindMask(du, hn::Lt(em_i, hn::Set(di, 0x0400))), sub, normal);
  r = hn::IfThenElse(hn::RebindMask(du, hn::Gt(em_i, hn::Set(di, 0x7bff))), special, r);
  return hn::BitCast(df, hn::Or(r, sign));
}

/// f32 -> f16 bits in u32 lanes, round to nearest-even (f32_to_f16_bits).
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> F32ToF16Bits(DF df, hn::Vec<DF> v) {
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const auto u = hn::BitCast(du, v);
  const auto sign = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 0x8000u));
  const auto a = hn::And(u, hn::Set(du, 0x7fffffffu));
  const auto a_i = hn::BitCast(di, a);
  // Normal: rebias 127 -> 15 and round on the 13 dropped bits (add 0xfff + lsb: ties to even).
  const auto lsb = hn::And(hn::ShiftRight<13>(a), hn::Set(du, 1u));
  const auto normal = hn::ShiftRight<13>(
      hn::Add(hn::Sub(a, hn::Set(du, 0x38000000u)), hn::Add(hn::Set(du, 0xfffu), lsb)));
  // Below 2^-14: |v| + 0.5 is rounded by the FPU (nearest-even) to a multiple of 2^-24, the f16
  // subnormal step; its mantissa is the f16 result (1024 = the smallest normal, also right).
  const auto sub = hn::Sub(hn::BitCast(du, hn::Add(hn::BitCast(df, a), hn::Set(df, 0.5f))),
                           hn::Set(du, 0x3f000000u));
  const auto nan = hn::Or(hn::Set(du, 0x7e00u), hn::And(hn::ShiftRight<13>(a), hn::Set(du, 0x3ffu)));
  auto r = hn::IfThenElse(hn::RebindMask(du, hn::Lt(a_i, hn::Set(di, 0x38800000))), sub, normal);
  r = hn::IfThenElse(hn::RebindMask(du, hn::Gt(a_i, hn::Set(di, 0x477fefff))),
                     hn::Set(du, 0x7c00u), r);
  r = hn::IfThenElse(hn::RebindMask(du, hn::Gt(a_i, hn::Set(di, 0x7f800000))), nan, r);
  return hn::Or(r, sign);
}

/// f64 -> f32 to nearest-even with IEEE overflow: |v| >= FLT_MAX + half an ulp gives inf. The
/// emulated targets' DemoteTo (SCALAR, EMU128) clamps overflow and even inf to +-FLT_MAX.
template <class DD>
HWY_INLINE hn::Vec<hn::Rebind<float, DD>> DemoteF64ToF32(DD dd, hn::Vec<DD> v) {
  const hn::Rebind<float, DD> df;
  const auto f = hn::DemoteTo(df, v);
  const auto over = hn::Ge(hn::Abs(v), hn::Set(dd, 0x1.ffffffp127));  // false for NaN
  // Masks cannot change lane width in 1.0.3: carry it as 0/1 doubles -> f32.
  const auto over_f =
      hn::Gt(hn::DemoteTo(df, hn::IfThenElseZero(over, hn::Set(dd, 1.0))), hn::Set(df, 0.5f));
  return hn::IfThenElse(over_f, hn::CopySign(hn::Set(df, HUGE_VALF), f), f);
}

/// f64 -> f32 rounded to odd (f64_to_f32_round_odd), in the f32 lanes of Rebind<float, DD>.
template <class DD>
HWY_INLINE hn::Vec<hn::Rebind<float, DD>> F64ToF32RoundOdd(DD dd, hn::Vec<DD> v) {
  const hn::Rebind<float, DD> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const auto vabs = hn::Abs(v);
  // Clamp finite overflow to FLT_MAX first so the conversion itself never overflows.
  const auto big = hn::And(hn::Gt(vabs, hn::Set(dd, static_cast<double>(FLT_MAX))),
                           hn::Lt(vabs, hn::Set(dd, HUGE_VAL)));
  const auto vc = hn::IfThenElse(big, hn::CopySign(hn::Set(dd, static_cast<double>(FLT_MAX)), v), v);
  const auto f = DemoteF64ToF32(dd, vc);  // nearest-even; inf stays inf
  const auto back = hn::Abs(hn::PromoteTo(dd, f));
  const auto inexact = hn::And(hn::Ne(back, vabs), hn::Eq(v, v));
  const auto toward_zero = hn::Gt(back, vabs);  // implies inexact; false for NaN
  // Masks cannot change lane width in 1.0.3: carry them as small doubles (0, 1, 2) -> f32.
  const auto code = hn::Add(hn::IfThenElseZero(inexact, hn::Set(dd, 1.0)),
                            hn::IfThenElseZero(toward_zero, hn::Set(dd, 1.0)));
  const auto code_f = hn::DemoteTo(df, code);
  auto u = hn::BitCast(du, f);
  u = hn::Sub(u, hn::IfThenElseZero(hn::RebindMask(du, hn::Gt(code_f, hn::Set(df, 1.5f))),
                                    hn::Set(du, 1u)));
  u = hn::IfThenElse(hn::RebindMask(du, hn::Gt(code_f, hn::Set(df, 0.5f))),
                     hn::Or(u, hn::Set(du, 1u)), u);
  return hn::BitCast(df, u);
}

/// Loads Lanes(df) elements of T (float, bf16, f16) as f32.
template <class DF, class T> HWY_INLINE hn::Vec<DF> LoadF32(DF df, const T* HWY_RESTRICT p) {
  if constexpr (std::is_same_v<T, float>) {
    return hn::LoadU(df, p);
  } else {
    static_assert(std::is_same_v<T, bf16> || std::is_same_v<T, f16>, "LoadAs: unsupported type");
    static_assert(sizeof(T) == 2, "half types are 16-bit");
    const hn::Rebind<uint16_t, DF> d16;
    const hn::RebindToUnsigned<DF> du;
    const auto raw = hn::LoadU(d16, reinterpret_cast<const uint16_t*>(p));
    if constexpr (std::is_same_v<T, bf16>) {
      return Bf16BitsToF32(df, hn::PromoteTo(du, raw));
    } else {
#if TAPER_HWY_HAVE_F16C
      // F16C's vcvtph2ps is exact for every f16 (subnormals too) but a signaling NaN, which it
      // quiets where dtype.h keeps it: a vector holding any NaN (rare) takes the integer path.
      // About 12 instructions a vector fewer, which made f16 rows 1.6-2.2x slower than bf16's.
      const hn::Rebind<hwy::float16_t, DF> dh;
      const auto f = hn::PromoteTo(df, hn::BitCast(dh, raw));
      if (HWY_LIKELY(hn::AllFalse(df, hn::IsNaN(f)))) return f;
#endif
      return F16BitsToF32(df, hn::PromoteTo(du, raw));
    }
  }
}

/// Stores Lanes(df) f32 values as T (float, bf16, f16), rounding to nearest-even.
template <class DF, class T> HWY_INLINE void StoreF32(DF df, hn::Vec<DF> v, T* HWY_RESTRICT p) {
  if constexpr (std::is_same_v<T, float>) {
    hn::StoreU(v, df, p);
  } else {
    static_assert(std::is_same_v<T, bf16> || std::is_same_v<T, f16>, "StoreFrom: unsupported type");
    const hn::Rebind<uint16_t, DF> d16;
    const hn::RebindToSigned<DF> di;
    uint16_t* HWY_RESTRICT out = reinterpret_cast<uint16_t*>(p);
    if constexpr (std::is_same_v<T, bf16>) {
      // Results are < 2^16, so the saturating i32 -> u16 demotion is a plain narrowing.
      hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, F32ToBf16Bits(df, v))), d16, out);
    } else {
#if TAPER_HWY_HAVE_F16C
      (void)di;
      const hn::Rebind<hwy::float16_t, DF> dh;
      hn::StoreU(hn::BitCast(d16, hn::DemoteTo(dh, v)), d16, out);
#else
      hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, F32ToF16Bits(df, v))), d16, out);
#endif
    }
  }
}

}  // namespace detail

/// Loads Lanes(d) elements of T and returns them in D's lane type: D's lanes are float for
/// T = float/bf16/f16 (compute_t<T>), double for T = double; D = double lanes with
/// T = float/bf16/f16 also works (exact widening, used by to_dtype).
template <class D, class T> HWY_INLINE hn::Vec<D> LoadAs(D d, const T* HWY_RESTRICT p) {
  using L = hn::TFromD<D>;
  if constexpr (std::is_same_v<L, T>) {
    return hn::LoadU(d, p);
  } else if constexpr (std::is_same_v<L, float>) {
    return detail::LoadF32(d, p);
  } else {
    static_assert(std::is_same_v<L, double>, "LoadAs: D must have float or double lanes");
    const hn::Rebind<float, D> df;
    return hn::PromoteTo(d, detail::LoadF32(df, p));
  }
}

/// Stores Lanes(d) values of D to T, rounding once to nearest-even (bit-exact with the scalar
/// dtype.h conversions; f64 -> bf16/f16 rounds the f64 value once, f64 -> f32 is the FPU's
/// nearest-even).
template <class D, class T> HWY_INLINE void StoreFrom(D d, hn::Vec<D> v, T* HWY_RESTRICT p) {
  using L = hn::TFromD<D>;
  if constexpr (std::is_same_v<L, T>) {
    hn::StoreU(v, d, p);
  } else if constexpr (std::is_same_v<L, float>) {
    detail::StoreF32(d, v, p);
  } else {
    static_assert(std::is_same_v<L, double>, "StoreFrom: D must have float or double lanes");
    const hn::Rebind<float, D> df;
    if constexpr (std::is_same_v<T, float>) {
      hn::StoreU(detail::DemoteF64ToF32(d, v), df, p);
    } else {
      detail::StoreF32(df, detail::F64ToF32RoundOdd(d, v), p);
    }
  }
}

/// StoreFrom with a non-temporal (streaming) store: the same rounding, written around the cache
/// so a large output costs no read-for-ownership. `p` must be aligned to the stored vector
/// (Lanes(d) * sizeof(T) bytes); the caller runs hwy::FlushStream() before the data is shared.
/// D's lanes are T's compute type (float for float/bf16/f16, double for double).
template <class D, class T> HWY_INLINE void StreamFrom(D d, hn::Vec<D> v, T* HWY_RESTRICT p) {
  using L = hn::TFromD<D>;
  if constexpr (std::is_same_v<L, T>) {
    hn::Stream(v, d, p);
  } else {
    static_assert(std::is_same_v<L, float> && sizeof(T) == 2, "StreamFrom: f32 lanes to bf16/f16");
    const hn::Rebind<uint16_t, D> d16;
    const hn::RebindToSigned<D> di;
    uint16_t* HWY_RESTRICT out = reinterpret_cast<uint16_t*>(p);
    if constexpr (hn::MaxLanes(d16) * sizeof(uint16_t) < 16) {
      // Highway's Stream of a partial vector (SSE4's 4 x u16) writes 16 bytes: store instead.
      (void)di;
      (void)out;
      StoreFrom(d, v, p);
    } else if constexpr (std::is_same_v<T, bf16>) {
      hn::Stream(hn::DemoteTo(d16, hn::BitCast(di, detail::F32ToBf16Bits(d, v))), d16, out);
    } else {
#if TAPER_HWY_HAVE_F16C
      const hn::Rebind<hwy::float16_t, D> dh;
      hn::Stream(hn::BitCast(d16, hn::DemoteTo(dh, v)), d16, out);
#else
      hn::Stream(hn::DemoteTo(d16, hn::BitCast(di, detail::F32ToF16Bits(d, v))), d16, out);
#endif
    }
  }
}

/// LoadAs for n < Lanes(d) elements: reads only p[0, n); the missing lanes are 0.
template <class D, class T>
HWY_INLINE hn::Vec<D> LoadAsN(D d, const T* HWY_RESTRICT p, size_t n);
/// StoreFrom for n < Lanes(d) elements: writes only p[0, n).
template <class D, class T>
HWY_INLINE void StoreFromN(D d, hn::Vec<D> v, T* HWY_RESTRICT p, size_t n);

/// StoreFrom (kStream: StreamFrom) of two vectors, v0 to p[0, N) and v1 to p[N, 2N), N = Lanes(d).
/// For bf16 the two roundings are packed into one vector of 2N u16 by ConcatOdd (one permute)
/// instead of two narrowing demotions, and stored as one vector (streamed: `p` aligned to it).
template <bool kStream, class D, class T>
HWY_INLINE void StoreFrom2(D d, hn::Vec<D> v0, hn::Vec<D> v1, T* HWY_RESTRICT p) {
  const size_t N = hn::Lanes(d);
#if HWY_TARGET != HWY_SCALAR  // (no ConcatOdd there)
  if constexpr (std::is_same_v<T, bf16> && std::is_same_v<hn::TFromD<D>, float> &&
                hn::MaxLanes(d) >= 4) {
    const hn::Repartition<uint16_t, D> d16;  // 2N lanes
    const auto packed = hn::ConcatOdd(d16, hn::BitCast(d16, detail::F32ToBf16High(d, v1)),
                                      hn::BitCast(d16, detail::F32ToBf16High(d, v0)));
    uint16_t* HWY_RESTRICT out = reinterpret_cast<uint16_t*>(p);
    if constexpr (kStream) hn::Stream(packed, d16, out);
    else hn::StoreU(packed, d16, out);
    return;
  }
#endif
  if constexpr (kStream) {
    StreamFrom(d, v0, p);
    StreamFrom(d, v1, p + N);
  } else {
    StoreFrom(d, v0, p);
    StoreFrom(d, v1, p + N);
  }
}

/// Writes y[lo, hi) vector by vector: y[i, i + n) = f(i, n), n = Lanes(d) except for a partial
/// head or tail (f then loads with LoadAsN); whole vectors go two at a time (StoreFrom2). With
/// kStream the pairs are streamed, after a head that reaches their alignment (2N elements).
template <bool kStream, class D, class T, class F>
HWY_INLINE void MapStore(D d, T* HWY_RESTRICT y, size_t lo, size_t hi, const F& f) {
  const size_t N = hn::Lanes(d);
  size_t i = lo;
  if constexpr (kStream) {
    const size_t mis = (reinterpret_cast<uintptr_t>(y + i) % (2 * N * sizeof(T))) / sizeof(T);
    for (size_t head = mis == 0 ? 0 : std::min(hi - i, 2 * N - mis); head > 0;) {
      const size_t h = std::min(head, N);
      if (h == N) StoreFrom(d, f(i, N), y + i);
      else StoreFromN(d, f(i, h), y + i, h);
      i += h;
      head -= h;
    }
  }
  for (; i + 2 * N <= hi; i += 2 * N) StoreFrom2<kStream>(d, f(i, N), f(i + N, N), y + i);
  for (; i + N <= hi; i += N) StoreFrom(d, f(i, N), y + i);  // at most once
  if (i < hi) StoreFromN(d, f(i, hi - i), y + i, hi - i);
}

/// Asks for the cache lines of [p, p + bytes) (hwy::Prefetch, one per 64-byte line).
HWY_INLINE void PrefetchBytes(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (size_t k = 0; k < bytes; k += 64) hwy::Prefetch(c + k);
}

/// LoadAs for n < Lanes(d) elements: reads only p[0, n); the missing lanes are 0.
template <class D, class T>
HWY_INLINE hn::Vec<D> LoadAsN(D d, const T* HWY_RESTRICT p, size_t n) {
  // An upper bound on Lanes(d) valid for every D (its lanes are at least as wide as T's).
  T buf[HWY_MAX_BYTES / sizeof(hn::TFromD<D>)];
  std::memset(static_cast<void*>(buf), 0, sizeof(buf));
  n = std::min(n, hn::Lanes(d));  // n < Lanes(d) already; lets GCC see the copy is in bounds
  std::memcpy(static_cast<void*>(buf), static_cast<const void*>(p), n * sizeof(T));
  return LoadAs(d, buf);
}

/// StoreFrom for n < Lanes(d) elements: writes only p[0, n).
template <class D, class T>
HWY_INLINE void StoreFromN(D d, hn::Vec<D> v, T* HWY_RESTRICT p, size_t n) {
  T buf[HWY_MAX_BYTES / sizeof(hn::TFromD<D>)];
  StoreFrom(d, v, buf);
  std::memcpy(static_cast<void*>(p), static_cast<const void*>(buf), n * sizeof(T));
}

}  // namespace taper::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // TAPER_CPU_SIMD_HALF_INL_H_ per target
