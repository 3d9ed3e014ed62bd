// simd_exp-inl.h: the exp that the softmax family evaluates once per element, and the reduced
// polynomial that gelu_erf shares with it.
//
// What it is: a per-target header (re-included once per target by foreach_target.h, as
// simd_half-inl.h is) with
// - `ExpM1Reduced(d, r)`: exp(r) - 1 for |r| <= ln2/2 + 0.001, as r + r^2 S(r);
// - `ExpNoSubnormal(d, t)`: exp(t) for t <= 0 (valid up to t = 80), with results below the
//   smallest normal (t < ln FLT_MIN = -87.34 in f32, ln DBL_MIN = -708.4 in f64) flushed to 0.
// What it is not: the exp op (unary.cpp patches Highway's contrib Exp for the whole range,
// subnormal results included).
//
// Why not Highway's contrib Exp here: it serves every t (two scale factors, so that subnormal
// results come out right, plus a sign-dependent rounding), ~26 vector ops per f32 vector. The
// softmax's arguments are x - max <= 0, and its results below FLT_MIN are below the smallest
// normal y can hold anyway, so one scale factor built from the rounding constant's own bits
// serves: ~15 ops (f32), and the bf16 forward, which is bound by exactly this arithmetic, runs
// at memory speed instead of half of it.
//
// Accuracy (tests/test_fused.cpp checks it on every target against the f64/long double exp):
// f32 within 2 ulp (S's fit: 3.9e-9 relative; the reduction r = t - k ln2 in two exact-enough
// steps; two roundings in assembling 1 + r + r^2 S); f64 within 2 ulp (S is Taylor to degree 13:
// truncation < 0.03 ulp on |r| <= 0.347). NaN propagates (t NaN -> NaN); t = -inf gives 0.

// ---- scalar part (once per translation unit) -------------------------------------------------
#ifndef TAPER_CPU_SIMD_EXP_SCALAR_H_
#define TAPER_CPU_SIMD_EXP_SCALAR_H_

namespace taper::cpu {

// exp(r) = 1 + r + r^2 S(r) on |r| <= ln2/2 + 0.001. f32: fitted offline with mpmath (50 digits),
// a linearised least-squares fit in relative error on Chebyshev nodes reweighted (Lawson) towards
// minimax, the coefficients rounded to f32 at once: max relative error 3.9e-9 in exact
// arithmetic. f64: Taylor, S_k = 1/(k+2)! (k = 0..11), truncation < 6e-18 on the interval.
inline constexpr float kExpSF32[5] = {0.49999994f, 0.166665196f, 0.0416684076f, 0.00836891402f,
                                      0.00138141855f};
inline constexpr double kExpSF64[12] = {
    1.0 / 2,        1.0 / 6,         1.0 / 24,          1.0 / 120,
    1.0 / 720,      1.0 / 5040,      1.0 / 40320,       1.0 / 362880,
    1.0 / 3628800,  1.0 / 39916800,  1.0 / 479001600,   1.0 / 6227020800};

}  // namespace taper::cpu

#endif  // TAPER_CPU_SIMD_EXP_SCALAR_H_

// ---- per-target part -------------------------------------------------------------------------
#if defined(TAPER_CPU_SIMD_EXP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TAPER_CPU_SIMD_EXP_INL_H_
#undef TAPER_CPU_SIMD_EXP_INL_H_
#else
#define TAPER_CPU_SIMD_EXP_INL_H_
#endif

#include <cstddef>
#include <type_traits>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace taper::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// c[0] + c[1] r + ... + c[K-1] r^(K-1), by Horner's rule.
template <class D, size_t K>
HWY_INLINE hn::Vec<D> Horner(D d, hn::Vec<D> r, const hn::TFromD<D> (&c)[K]) {
  auto s = hn::Set(d, c[K - 1]);
  for (size_t k = K - 1; k-- > 0;) s = hn::MulAdd(s, r, hn::Set(d, c[k]));
  return s;
}

/// exp(r) - 1 = r + r^2 S(r) for |r| <= ln2/2 + 0.001 (f32 or f64 lanes).
template <class D> HWY_INLINE hn::Vec<D> ExpM1Reduced(D d, hn::Vec<D> r) {
  hn::Vec<D> s;
  if constexpr (std::is_same_v<hn::TFromD<D>, float>) s = Horner(d, r, kExpSF32);
  else s = Horner(d, r, kExpSF64);
  return hn::MulAdd(s, hn::Mul(r, r), r);
}

/// exp(t) for t <= 0 (f32 or f64 lanes); results below the smallest normal are 0, NaN stays
/// NaN, -inf gives 0. t = k ln2 + r with k = round(t / ln2): the rounding is done by adding
/// 1.5 * 2^mantissa_bits + bias, after which the low bits of the sum are k + bias, i.e. the
/// exponent field of 2^k once shifted into place.
template <class D> HWY_INLINE hn::Vec<D> ExpNoSubnormal(D d, hn::Vec<D> t) {
  using T = hn::TFromD<D>;
  const hn::RebindToUnsigned<D> du;
  constexpr bool kF32 = std::is_same_v<T, float>;
  static_assert(kF32 || std::is_same_v<T, double>, "ExpNoSubnormal: f32 or f64 lanes");
  // Sum of 1.5 * 2^23 (2^52) and the exponent bias: exact, its ulp is 1.
  const auto magic = hn::Set(d, kF32 ? T(12582912.0 + 127.0) : T(6755399441055744.0 + 1023.0));
  const auto z = hn::MulAdd(t, hn::Set(d, T(1.4426950408889634074)), magic);
  const auto k = hn::Sub(z, magic);
  // -ln2 in two parts; k * hi is exact for the k that reach here (|k| <= 1022).
  const T ln2_hi = kF32 ? T(0.693145751953125) : T(6.93147180369123816490e-01);
  const T ln2_lo = kF32 ? T(1.428606765330187045e-6) : T(1.90821492927058770002e-10);
  auto r = hn::MulAdd(k, hn::Set(d, -ln2_hi), t);
  r = hn::MulAdd(k, hn::Set(d, -ln2_lo), r);
  const auto er = hn::Add(ExpM1Reduced(d, r), hn::Set(d, T(1)));
  const auto scale = hn::BitCast(d, hn::ShiftLeft<kF32 ? 23 : 52>(hn::BitCast(du, z)));
  // ln of the smallest normal, rounded down (-87.3365479, -708.396418532264192): from there on
  // 2^k is normal (k >= -126, resp. -1022), and every t below gives a true result below it.
  const T lo = kF32 ? T(-0x1.5d58ap+6) : T(-0x1.6232bdd7abcd3p+9);
  return hn::IfThenZeroElse(hn::Lt(t, hn::Set(d, lo)), hn::Mul(er, scale));
}

}  // namespace taper::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
