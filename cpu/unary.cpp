// unary.cpp: CPU kernels of the unary elementwise ops (neg abs exp log sqrt rsqrt recip sqr tanh
// sigmoid relu gelu gelu_erf silu sin cos powf affine clamp). x: any shape and strides -> y: the
// same shape and dtype, contiguous.
//
// What it is: Highway kernels for bf16/f16/f32/f64 (bf16/f16 load as f32, compute in f32, round
// once at the store; f64 end to end in f64), and scalar loops for the integer dtypes where an op
// makes sense (neg: i64; abs relu sqr affine clamp: u8 u32 i64). Strided inputs are served
// directly (registered needs_contiguous = false): a unit-stride run goes straight to SIMD, any
// other run is gathered into a small stack buffer first, so every layout gets the same SIMD
// arithmetic and bit-identical results.
// Also gelu_erf_bwd, (x, g) -> g gelu_erf'(x), gelu_erf's backward in one pass (f64 lanes).
// What it is not: the backward rules (core) or the reference (tests/ref/elementwise_ref.h).
//
// Precision notes (bounds are checked by tests/test_elementwise.cpp):
// - exp log tanh sin cos come from hwy/contrib/math (1.0.3), which has f32 and f64 versions
//   (documented max error 1, 4, 4, 3, 3 ulp). Their holes are patched here: exp of NaN/large x,
//   log of 0/negative/inf/NaN, sin/cos beyond |x| <= 39000 (libm per lane).
// - sigmoid/silu/gelu use the two-sided form (e = exp(-|t|); 1/(1+e) or e/(1+e)), accurate in
//   both tails; gelu (tanh form) is computed as x * sigmoid(2z), equal to 0.5x(1+tanh z). Its
//   relative error grows like (1 + |2z|) u for negative x, the conditioning of sigmoid in 2z.
// - gelu_erf: f64 in f64 lanes, erfc from our own Chebyshev fit of erfcx (relative error
//   < 5e-16), with the rounding of x/sqrt2 and of b^2 compensated (f64 accuracy). f32/bf16/f16
//   in f32 lanes: gelu(-t) = -t Phi(-t) = -G(t) exp(-t^2/2) for t = |x| >= 0.5 (gelu(t) = t +
//   gelu(-t)), an erf polynomial in x^2 below; max error 1.5 ulp (FMA targets) / 1.8 ulp (SSE4,
//   scalar), relative, over all of f32, the negative tail included (measured on every 7th f32
//   in [-14.6, 8] against erfcl). See GeluErfF32 for the error budget.
// - powf: f32/bf16/f16 evaluate exp(e*log|x|) in f64 lanes (the f32 error of e*log|x| would be
//   amplified by |e*log x|); f64 uses std::pow per element (no SIMD pow is f64-accurate).
// - affine and clamp round their double parameters to the compute type (f32 for bf16/f16/f32).
//   affine is a MulAdd: fused on AVX2/AVX3, two roundings on SSE4 and the scalar target.
// - Transcendentals differ in the last bits between targets (FMA or not); the exact ops (neg abs
//   sqrt recip sqr relu clamp) give the same bits everywhere.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/unary.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"
#include "cpu/simd_exp-inl.h"
#include "cpu/simd_half-inl.h"

#ifndef TAPER_CPU_UNARY_ONCE_H_
#define TAPER_CPU_UNARY_ONCE_H_
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu/cpu_common.h"
#include "taper/op.h"
#endif

HWY_BEFORE_NAMESPACE();
namespace taper::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ---- patched contrib math ---------------------------------------------------------------------

/// exp: contrib Exp is valid for x <= 104 (f32) / 706 (f64), gives garbage above and 0 for NaN.
/// Clamping at 100 / 710 still overflows to inf (e^100 > FLT_MAX, e^710 > DBL_MAX).
template <class D> HWY_INLINE hn::Vec<D> SafeExp(D d, hn::Vec<D> x) {
  using C = hn::TFromD<D>;
  const auto hi = hn::Set(d, static_cast<C>(sizeof(C) == 4 ? 100.0 : 710.0));
  const auto y = hn::Exp(d, hn::Min(x, hi));
  return hn::IfThenElse(hn::IsNaN(x), x, y);
}

/// log: contrib Log is valid on (0, max]; here 0 -> -inf, x < 0 -> NaN, +inf -> +inf, NaN stays.
template <class D> HWY_INLINE hn::Vec<D> SafeLog(D d, hn::Vec<D> x) {
  const auto zero = hn::Zero(d);
  auto y = hn::Log(d, x);
  y = hn::IfThenElse(hn::Eq(x, zero), hn::Neg(hn::Inf(d)), y);
  y = hn::IfThenElse(hn::Lt(x, zero), hn::NaN(d), y);
  return hn::IfThenElse(hn::Or(hn::IsNaN(x), hn::Eq(x, hn::Inf(d))), x, y);
}

/// sin/cos: contrib is valid on |x| <= 39000; lanes beyond (and inf/NaN) go to libm, decided per
/// lane so a value gets the same result whatever its neighbours.
template <bool kSin, class D> HWY_INLINE hn::Vec<D> SafeSinCos(D d, hn::Vec<D> x) {
  using C = hn::TFromD<D>;
  const C kLimit = static_cast<C>(39000);
  const auto y = kSin ? hn::Sin(d, x) : hn::Cos(d, x);
  if (HWY_LIKELY(hn::AllTrue(d, hn::Le(hn::Abs(x), hn::Set(d, kLimit))))) return y;
  HWY_ALIGN C xs[HWY_MAX_BYTES / sizeof(C)];
  HWY_ALIGN C ys[HWY_MAX_BYTES / sizeof(C)];
  hn::Store(x, d, xs);
  hn::Store(y, d, ys);
  for (size_t i = 0; i < hn::Lanes(d); ++i) {
    if (!(std::fabs(xs[i]) <= kLimit)) ys[i] = kSin ? std::sin(xs[i]) : std::cos(xs[i]);
  }
  return hn::Load(d, ys);
}

/// sigmoid(t) = 1/(1+e^-t) as 1/(1+e) for t >= 0 and e/(1+e) for t < 0 with e = exp(-|t|):
/// no overflow, relative accuracy in both tails.
template <class D> HWY_INLINE hn::Vec<D> Sigmoid(D d, hn::Vec<D> t) {
  const auto one = hn::Set(d, hn::TFromD<D>(1));
  const auto e = SafeExp(d, hn::Neg(hn::Abs(t)));
  const auto r = hn::Div(one, hn::Add(one, e));
  return hn::IfThenElse(hn::Lt(t, hn::Zero(d)), hn::Mul(e, r), r);
}

// ---- gelu_erf in f64 lanes -------------------------------------------------------------------

// erfcx(b) = exp(b^2) erfc(b) for b >= 0 as h(y) / (1 + sqrt(pi) b), y = (b - 3)/(b + 3) in
// [-1, 1), h = sum c_k T_k(y). Coefficients: our Chebyshev projection of
// h = erfcx(b)(1 + sqrt(pi) b), computed in binary128 (120 nodes) and truncated after 26 terms;
// max relative error of the f64 evaluation of erfcx on [0, 40]: 4.6e-16.
constexpr double kErfcxCheb[26] = {
    1.08111716172079,        -0.046869691636051342,   -0.064857363693664322,
    0.043071743776818425,    -0.015720635975333071,   0.0037826275071170725,
    -0.00054998143920940144, 1.7027241788493142e-05,  1.0968036939711283e-05,
    -1.7706833451002085e-06, -1.5004553631331413e-07, 6.6064237155563147e-08,
    1.3992880505772145e-09,  -2.3575464725179041e-09, -4.0778916509089122e-12,
    9.0578838293606208e-11,  9.5608741419030899e-13,  -3.7505839892027067e-12,
    -1.6834914399162488e-13, 1.5977466251235227e-13,  1.6733579968962597e-14,
    -6.467849184195461e-15,  -1.3097260946642813e-15, 2.1183814359046077e-16,
    8.7290871020155379e-17,  -2.1422136890683647e-18,
};

/// Dekker's split of x into hi + lo, each with at most 26 (f64; |x| < 2^995) or 12 (f32;
/// |x| < 2^115) significant bits, so products of halves are exact without FMA (SSE4/EMU128
/// have no fused MulAdd).
template <class D> HWY_INLINE void Split(D d, hn::Vec<D> x, hn::Vec<D>& hi, hn::Vec<D>& lo) {
  using C = hn::TFromD<D>;
  const auto c = hn::Mul(hn::Set(d, C(sizeof(C) == 8 ? 134217729.0 : 4097.0)), x);  // 2^27+1, 2^12+1
  hi = hn::Sub(c, hn::Sub(c, x));
  lo = hn::Sub(x, hi);
}

/// For x in [-60, 60]: erfc(-x/sqrt2) and exp(-x^2/2), f64-accurate, double lanes. x/sqrt2 is
/// carried as a double-double a + da (negated), erfc(a) = exp(-a^2) erfcx(|a|) (2 minus that
/// for a < 0) with a^2 as a double-double too, and both results take da's first-order
/// correction: erfc(a + da) = erfc(a) - (2/sqrt(pi)) exp(-a^2) da, exp(-(a + da)^2) =
/// exp(-a^2) (1 - 2 a da).
template <class D>
HWY_INLINE void ErfcAndGauss(D d, hn::Vec<D> xc, hn::Vec<D>& erfc, hn::Vec<D>& gauss) {
  // x/sqrt2 as s + err (double-double): 1/sqrt2 = kRh + kRl with kRh of 26 bits.
  const auto kRh = hn::Set(d, 0.7071067839860916137695312);
  const auto kRl = hn::Set(d, -2.7995440893686869e-09);
  hn::Vec<D> xh, xl;
  Split(d, xc, xh, xl);
  const auto p1 = hn::Mul(xh, kRh);  // exact
  const auto p2 = hn::Mul(xl, kRh);  // exact
  const auto s0 = hn::Add(p1, p2);
  const auto e0 = hn::MulAdd(xc, kRl, hn::Add(hn::Sub(p1, s0), p2));  // Fast2Sum, |p1| >= |p2|
  // Renormalise so that |da| <= ulp(a)/2: the first-order corrections below then leave a
  // second-order error of ~(2 a da)^2, far below f64 rounding.
  const auto s = hn::Add(s0, e0);
  const auto err = hn::Add(hn::Sub(s0, s), e0);
  const auto a = hn::Neg(s);  // erfc argument; the true argument is a + da
  const auto da = hn::Neg(err);
  const auto b = hn::Abs(a);
  // erfcx(b) by Clenshaw.
  const auto k3 = hn::Set(d, 3.0);
  const auto y = hn::Div(hn::Sub(b, k3), hn::Add(b, k3));
  const auto y2 = hn::Add(y, y);
  auto b1 = hn::Zero(d), b2 = hn::Zero(d);
  for (int k = 25; k >= 1; --k) {
    const auto t = hn::Add(hn::MulSub(y2, b1, b2), hn::Set(d, kErfcxCheb[k]));
    b2 = b1;
    b1 = t;
  }
  const auto h = hn::Add(hn::MulSub(y, b1, b2), hn::Set(d, kErfcxCheb[0]));
  const auto q = hn::Div(h, hn::MulAdd(hn::Set(d, 1.772453850905516104), b, hn::Set(d, 1.0)));
  // g = exp(-b^2) with b^2 = bb + bb_lo (Dekker product): exp(-bb) * (1 - bb_lo).
  hn::Vec<D> bh, bl;
  Split(d, b, bh, bl);
  const auto bb = hn::Mul(b, b);
  const auto bb_lo = hn::MulAdd(
      bl, bl, hn::MulAdd(hn::Add(bh, bh), bl, hn::MulSub(bh, bh, bb)));
  const auto g = hn::Mul(SafeExp(d, hn::Neg(bb)), hn::Sub(hn::Set(d, 1.0), bb_lo));
  // erfc(a) = g q (a >= 0), 2 - g q (a < 0).
  const auto cda = hn::Mul(hn::Set(d, 1.1283791670955125586), da);
  const auto e_pos = hn::Mul(g, hn::Sub(q, cda));
  const auto e_neg = hn::NegMulAdd(g, hn::Add(q, cda), hn::Set(d, 2.0));
  erfc = hn::IfThenElse(hn::Ge(a, hn::Zero(d)), e_pos, e_neg);
  gauss = hn::NegMulAdd(hn::Add(a, a), hn::Mul(da, g), g);
}

/// gelu_erf(x) = 0.5 x erfc(-x/sqrt2), double lanes.
struct GeluErfF64 {
  template <class D> HWY_INLINE hn::Vec<D> operator()(D d, hn::Vec<D> x) const {
    static_assert(std::is_same_v<hn::TFromD<D>, double>, "gelu_erf computes in f64");
    // Beyond |x| = 60 the result is x (erfc(-42) == 2) or -0 (underflow): clamp, patch below.
    const auto xc = hn::Min(hn::Max(x, hn::Set(d, -60.0)), hn::Set(d, 60.0));
    hn::Vec<D> erfc, gauss;
    ErfcAndGauss(d, xc, erfc, gauss);
    auto r = hn::Mul(hn::Mul(hn::Set(d, 0.5), xc), erfc);
    r = hn::IfThenElse(hn::Gt(x, hn::Set(d, 60.0)), x, r);
    r = hn::IfThenElse(hn::Lt(x, hn::Set(d, -60.0)), hn::Set(d, -0.0), r);
    return hn::IfThenElse(hn::IsNaN(x), x, r);
  }
};

// ---- gelu_erf in f32 lanes -------------------------------------------------------------------

/// a * b = p + e exactly (p the rounded product): one FMA where the target has it, Dekker's
/// product otherwise (|a|, |b| < 2^115 for f32).
template <class D>
HWY_INLINE void TwoProd(D d, hn::Vec<D> a, hn::Vec<D> b, hn::Vec<D>& p, hn::Vec<D>& e) {
  p = hn::Mul(a, b);
#if HWY_NATIVE_FMA
  (void)d;
  e = hn::MulSub(a, b, p);
#else
  hn::Vec<D> ah, al, bh, bl;
  Split(d, a, ah, al);
  Split(d, b, bh, bl);
  e = hn::Add(hn::Add(hn::Add(hn::MulSub(ah, bh, p), hn::Mul(ah, bl)), hn::Mul(al, bh)),
              hn::Mul(al, bl));
#endif
}

// The coefficients below were fitted offline with mpmath (50 digits): a linearised
// least-squares fit in relative error on 200-400 Chebyshev nodes, reweighted (Lawson) towards
// minimax, then (kGeluQ, kGeluR) the coefficients rounded to f32 one at a time, leading first,
// refitting the remaining ones after each rounding. Max relative error of each fit with its f32
// coefficients (exact arithmetic): kGeluQ 1.4e-9 (of F), kGeluR 2.8e-8 (R; the f32 R(0) alone
// is 2.8e-8 off). exp's S (kExpSF32, simd_exp-inl.h, shared with the softmax) 3.9e-9.

// F(t) = (1 + c t) Phi(-t) exp(t^2/2), c = f32(sqrt(pi/2)), t in [0, 14.5]: flat (0.5 at both
// ends, at most 0.593), so F = 0.5 + f(q) with f a polynomial in q = (t - 4)/(t + 4) in
// [-1, 0.568], and the rounding of q hardly matters (|df/dq| small against F).
constexpr float kGeluC = 1.25331414f;
constexpr float kGeluQ[12] = {
    0.0677154064f,   -0.0780356824f, -0.0139610581f,  0.0540097207f,
    -0.0481724329f,  0.02463107f,    -0.00640105642f, -0.000524433854f,
    0.000931364542f, -8.29181154e-05f, -0.000128263928f, -1.3796046e-05f,
};
// R(u) = erf(x/sqrt2) / (2x), u = x^2 in [0, 0.25]: gelu(x) = 0.5x + u R(u) for |x| < 0.5.
constexpr float kGeluR[4] = {0.398942292f, -0.0664907321f, 0.0099723693f, -0.00115003239f};

/// gelu_erf(x) = 0.5 x erfc(-x/sqrt2) in f32 lanes (for f32, bf16, f16 data).
///
/// t = |x|. For t >= 0.5: gelu(-t) = -G(t) 2^n (1 + e1), gelu(t) = t + gelu(-t) = t - G 2^n
/// (1 + e1) (no cancellation: G 2^n (1 + e1) = t Phi(-t) <= t/2), where
/// - G = t Phi(-t) exp(t^2/2) = t F(t) / (1 + c t), F = 0.5 + f(q) from kGeluQ. The numerator,
///   the denominator and the quotient are each kept as an unevaluated sum hi + lo (TwoProd), so
///   G carries only the ~0.1 u of f's evaluation instead of three roundings (measured: 2.6 u
///   max without this);
/// - exp(-t^2/2) = 2^n (1 + e1) with t^2 = s + slo exact (TwoProd) and the reduction
///   r = -s/2 - n ln2_hi exact, so that the relative error does not grow with t^2 (a plain
///   exp(-0.5f * t * t) is off by t^2/2 u, ~100 u at the underflow);
/// - 2^n is applied last, in two exact steps and one final rounding, so the subnormal results
///   (13.15 < t < 14.36) are rounded once, and gelu(x) == -0 for x <= -14.3561 (|result| below
///   half the least subnormal).
/// For t < 0.5 the erfc form loses the accuracy of q near -1 (|df/dq| ~ 0.9 F there): gelu(x) =
/// 0.5x + x^2 R(x^2) (x^2 again as s + slo), whose rounding is amplified by at most
/// 0.19/Phi(-0.5) = 0.62 for negative x.
struct GeluErfF32 {
  template <class D> HWY_INLINE hn::Vec<D> operator()(D d, hn::Vec<D> x) const {
    static_assert(std::is_same_v<hn::TFromD<D>, float>, "the f32 gelu_erf");
    using V = hn::Vec<D>;
    const hn::RebindToSigned<D> di;
    const V one = hn::Set(d, 1.0f);
    const V half = hn::Set(d, 0.5f);
    // Beyond 14.5 the result is x or -0 (both follow from t = 14.5). A select rather than Min:
    // NaN lanes get t = 14.5 on every target (no NaN reaches ConvertTo); patched at the end.
    const V ax = hn::Abs(x);
    const V tmax = hn::Set(d, 14.5f);
    const V t = hn::IfThenElse(hn::Lt(ax, tmax), ax, tmax);
    V s, slo;
    TwoProd(d, t, t, s, slo);

    // |x| < 0.5.
    V r_small = hn::Set(d, kGeluR[3]);
    for (int k = 2; k >= 0; --k) r_small = hn::MulAdd(r_small, s, hn::Set(d, kGeluR[k]));
    // CopySign: gelu(-0) = -0 (the sums above give +0).
    const V small = hn::CopySign(
        hn::MulAdd(s, r_small, hn::MulAdd(slo, r_small, hn::Mul(half, x))), x);

    // exp(-(s + slo)/2) = 2^n exp(r + rlo): r exact (n ln2_hi has <= 23 bits for |n| <= 152).
    const V a = hn::Mul(hn::Set(d, -0.5f), s);
    const V alo = hn::Mul(hn::Set(d, -0.5f), slo);
    const V nf = hn::Round(hn::Mul(a, hn::Set(d, 1.44269504f)));
    const V r = hn::MulAdd(nf, hn::Set(d, -0.693145751953125f), a);
    const V rlo = hn::MulAdd(nf, hn::Set(d, -1.42860677e-6f), alo);
    V e1 = ExpM1Reduced(d, r);                          // exp(r) - 1
    e1 = hn::Add(hn::MulAdd(rlo, e1, rlo), e1);        // exp(r + rlo) - 1

    // G = num / den, num = t F = 0.5t + t f = num + dn, den = 1 + c t = den + dd exactly.
    const V q = hn::Div(hn::Sub(t, hn::Set(d, 4.0f)), hn::Add(t, hn::Set(d, 4.0f)));
    V f = hn::Set(d, kGeluQ[11]);
    for (int k = 10; k >= 0; --k) f = hn::MulAdd(f, q, hn::Set(d, kGeluQ[k]));
    const V ht = hn::Mul(half, t);
    const V num = hn::MulAdd(t, f, ht);
    V pf, ef;
    TwoProd(d, t, f, pf, ef);
    const V dn = hn::Add(hn::Add(hn::Sub(ht, num), pf), ef);  // first two steps exact (Sterbenz)
    const V c = hn::Set(d, kGeluC);
    const V den = hn::MulAdd(c, t, one);
    V pc, ec;
    TwoProd(d, c, t, pc, ec);
    const V dd = hn::Add(hn::Add(hn::Sub(one, den), pc), ec);
    // g0 = num/den to ~2 u (a multiplication by the rounded reciprocal); g0 + gl = G to ~u^2 via
    // the exact residual.
    const V rden = hn::Div(one, den);
    const V g0 = hn::Mul(num, rden);
    V pg, eg;
    TwoProd(d, g0, den, pg, eg);
    const V res = hn::Sub(hn::Sub(num, pg), eg);
    const V gl = hn::Mul(hn::NegMulAdd(g0, dd, hn::Add(res, dn)), rden);
    // m = (g0 + gl)(1 + e1), the large part g0 added last.
    const V m = hn::Add(g0, hn::MulAdd(g0, e1, hn::MulAdd(gl, e1, gl)));
    // y = m 2^n with n in [-152, 0]: two normal powers of two, one rounding at the end.
    const auto n = hn::ConvertTo(di, nf);
    const auto n1 = hn::ShiftRight<1>(n);
    const auto bias = hn::Set(di, 127);
    const V p1 = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(n1, bias)));
    const V p2 = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(hn::Sub(n, n1), bias)));
    const V y = hn::Mul(hn::Mul(m, p1), p2);

    V out = hn::IfThenElse(hn::Ge(x, hn::Zero(d)), hn::Sub(x, y), hn::Neg(y));
    out = hn::IfThenElse(hn::Lt(t, half), small, out);
    return hn::IfThenElse(hn::IsNaN(x), x, out);
  }
};

// ---- op functors: (tag, compute vector) -> compute vector -------------------------------------

#define TAPER_UNARY_OP(Name, expr)                                               \
  struct Name {                                                                  \
    template <class D> HWY_INLINE hn::Vec<D> operator()(D d, hn::Vec<D> x) const { \
      using C [[maybe_unused]] = hn::TFromD<D>;                                  \
      (void)d;                                                                   \
      return expr;                                                               \
    }                                                                            \
  };

TAPER_UNARY_OP(NegOp, hn::Neg(x))
TAPER_UNARY_OP(AbsOp, hn::Abs(x))
TAPER_UNARY_OP(ExpOp, SafeExp(d, x))
TAPER_UNARY_OP(LogOp, SafeLog(d, x))
TAPER_UNARY_OP(SqrtOp, hn::Sqrt(x))
TAPER_UNARY_OP(RsqrtOp, hn::Div(hn::Set(d, C(1)), hn::Sqrt(x)))
TAPER_UNARY_OP(RecipOp, hn::Div(hn::Set(d, C(1)), x))
TAPER_UNARY_OP(SqrOp, hn::Mul(x, x))
TAPER_UNARY_OP(TanhOp, hn::IfThenElse(hn::IsNaN(x), x, hn::Tanh(d, x)))
TAPER_UNARY_OP(SigmoidOp, Sigmoid(d, x))
// relu(NaN) = NaN: a select, not Max (x86 max returns the second operand for NaN).
TAPER_UNARY_OP(ReluOp, hn::IfThenElse(hn::Lt(x, hn::Zero(d)), hn::Zero(d), x))
TAPER_UNARY_OP(SiluOp, hn::Mul(x, Sigmoid(d, x)))
TAPER_UNARY_OP(SinOp, SafeSinCos<true>(d, x))
TAPER_UNARY_OP(CosOp, SafeSinCos<false>(d, x))
// gelu (tanh form): 0.5 x (1 + tanh z) = x sigmoid(2z), z = sqrt(2/pi) (x + 0.044715 x^3).
TAPER_UNARY_OP(GeluOp,
               hn::Mul(x, Sigmoid(d, hn::Mul(hn::Mul(hn::Set(d, C(2 * 0.797884560802865355879892)), x),
                                             hn::MulAdd(hn::Set(d, C(0.044715)), hn::Mul(x, x),
                                                        hn::Set(d, C(1)))))))
#undef TAPER_UNARY_OP

struct AffineOp {
  double mul, add;
  template <class D> HWY_INLINE hn::Vec<D> operator()(D d, hn::Vec<D> x) const {
    using C = hn::TFromD<D>;
    return hn::MulAdd(x, hn::Set(d, static_cast<C>(mul)), hn::Set(d, static_cast<C>(add)));
  }
};

struct ClampOp {
  double lo, hi;
  // Selects rather than Min/Max so that NaN passes through.
  template <class D> HWY_INLINE hn::Vec<D> operator()(D d, hn::Vec<D> x) const {
    using C = hn::TFromD<D>;
    const auto vlo = hn::Set(d, static_cast<C>(lo));
    const auto vhi = hn::Set(d, static_cast<C>(hi));
    return hn::IfThenElse(hn::Lt(x, vlo), vlo, hn::IfThenElse(hn::Gt(x, vhi), vhi, x));
  }
};

/// x^e in double lanes (for f32/bf16/f16 data), C99 special cases: NaN base -> NaN, 0^e>0 -> 0,
/// 0^e<0 -> inf, negative finite base with non-integer e -> NaN, odd integer e keeps the sign.
struct PowOp {
  double e;
  bool is_int, is_odd;
  template <class D> HWY_INLINE hn::Vec<D> operator()(D d, hn::Vec<D> x) const {
    static_assert(std::is_same_v<hn::TFromD<D>, double>, "powf computes in f64 lanes");
    if (e == 0.0) return hn::Set(d, 1.0);
    const auto mag = SafeExp(d, hn::Mul(hn::Set(d, e), SafeLog(d, hn::Abs(x))));
    auto r = is_odd ? hn::CopySign(mag, x) : mag;
    if (!is_int) {
      const auto neg_finite = hn::And(hn::Lt(x, hn::Zero(d)), hn::Gt(x, hn::Neg(hn::Inf(d))));
      r = hn::IfThenElse(neg_finite, hn::NaN(d), r);
    }
    return r;
  }
};

// ---- loops ------------------------------------------------------------------------------------

/// out[i] = op(in[i]) for i < n, in D's lanes; the tail (n % Lanes) reads and writes only [0, n).
template <class D, class T, class Op>
HWY_INLINE void Apply(D d, const T* HWY_RESTRICT in, T* HWY_RESTRICT out, size_t n,
                      const Op& op) {
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    const auto x0 = LoadAs(d, in + i);
    const auto x1 = LoadAs(d, in + i + N);
    StoreFrom2<false>(d, op(d, x0), op(d, x1), out + i);
  }
  for (; i + N <= n; i += N) StoreFrom(d, op(d, LoadAs(d, in + i)), out + i);
  if (i < n) StoreFromN(d, op(d, LoadAsN(d, in + i, n - i)), out + i, n - i);
}

template <class T>
HWY_INLINE void UnaryT(int op, const T* HWY_RESTRICT in, T* HWY_RESTRICT out, size_t n,
                       double f0, double f1) {
  const hn::ScalableTag<compute_t<T>> d;
  const hn::ScalableTag<double> dd;
  switch (static_cast<OpId>(op)) {
    case OpId::neg: return Apply(d, in, out, n, NegOp());
    case OpId::abs: return Apply(d, in, out, n, AbsOp());
    case OpId::exp: return Apply(d, in, out, n, ExpOp());
    case OpId::log: return Apply(d, in, out, n, LogOp());
    case OpId::sqrt: return Apply(d, in, out, n, SqrtOp());
    case OpId::rsqrt: return Apply(d, in, out, n, RsqrtOp());
    case OpId::recip: return Apply(d, in, out, n, RecipOp());
    case OpId::sqr: return Apply(d, in, out, n, SqrOp());
    case OpId::tanh: return Apply(d, in, out, n, TanhOp());
    case OpId::sigmoid: return Apply(d, in, out, n, SigmoidOp());
    case OpId::relu: return Apply(d, in, out, n, ReluOp());
    case OpId::gelu: return Apply(d, in, out, n, GeluOp());
    case OpId::gelu_erf:
      if constexpr (std::is_same_v<T, double>) return Apply(dd, in, out, n, GeluErfF64());
      else return Apply(d, in, out, n, GeluErfF32());
    case OpId::silu: return Apply(d, in, out, n, SiluOp());
    case OpId::sin: return Apply(d, in, out, n, SinOp());
    case OpId::cos: return Apply(d, in, out, n, CosOp());
    case OpId::affine: return Apply(d, in, out, n, AffineOp{f0, f1});
    case OpId::clamp: return Apply(d, in, out, n, ClampOp{f0, f1});
    case OpId::powf: {
      if constexpr (std::is_same_v<T, double>) {
        for (size_t i = 0; i < n; ++i) out[i] = std::pow(in[i], f0);
      } else if (!std::isfinite(f0)) {
        for (size_t i = 0; i < n; ++i)
          out[i] = round_to<T>(std::pow(static_cast<double>(widen(in[i])), f0));
      } else {
        const bool is_int = f0 == std::trunc(f0);
        const bool is_odd = is_int && std::fabs(std::fmod(f0, 2.0)) == 1.0;
        Apply(dd, in, out, n, PowOp{f0, is_int, is_odd});
      }
      return;
    }
    default: HWY_ASSERT(false);
  }
}

void UnaryBF16(int op, const bf16* HWY_RESTRICT in, bf16* HWY_RESTRICT out, size_t n, double f0,
               double f1) {
  UnaryT(op, in, out, n, f0, f1);
}
void UnaryF16(int op, const f16* HWY_RESTRICT in, f16* HWY_RESTRICT out, size_t n, double f0,
              double f1) {
  UnaryT(op, in, out, n, f0, f1);
}
void UnaryF32(int op, const float* HWY_RESTRICT in, float* HWY_RESTRICT out, size_t n, double f0,
              double f1) {
  UnaryT(op, in, out, n, f0, f1);
}
void UnaryF64(int op, const double* HWY_RESTRICT in, double* HWY_RESTRICT out, size_t n,
              double f0, double f1) {
  UnaryT(op, in, out, n, f0, f1);
}

// ---- gelu_erf_bwd -----------------------------------------------------------------------------

/// dx = g (Phi(x) + x phi(x)), the derivative of gelu_erf = x Phi(x), in f64 lanes for every
/// dtype, rounded once at the store. Phi = erfc(-x/sqrt2) / 2 and phi = exp(-x^2/2) / sqrt(2 pi)
/// both from ErfcAndGauss (f64-accurate, one exp for the two); Phi is 1/2 for |x| < 1e-20, as
/// the CUDA kernel takes it. Beyond |x| = 37 the factor is its limit, 1 (x > 0) or 0 (x < 0):
/// exact for x > 37, and below -37 the true factor is under 1e-294. So +inf gives g and -inf
/// gives 0; NaN stays NaN.
struct GeluErfBwdF64 {
  template <class D>
  HWY_INLINE hn::Vec<D> operator()(D d, hn::Vec<D> x, hn::Vec<D> g) const {
    static_assert(std::is_same_v<hn::TFromD<D>, double>, "gelu_erf_bwd computes in f64");
    const auto ax = hn::Abs(x);
    const auto big = hn::Gt(ax, hn::Set(d, 37.0));
    const auto tiny = hn::Lt(ax, hn::Set(d, 1e-20));
    const auto one = hn::Set(d, 1.0);
    const auto xc = hn::IfThenElse(big, hn::CopySign(hn::Set(d, 37.0), x), x);
    hn::Vec<D> erfc, gauss;
    ErfcAndGauss(d, xc, erfc, gauss);
    const auto cdf = hn::IfThenElse(tiny, hn::Set(d, 0.5), hn::Mul(hn::Set(d, 0.5), erfc));
    const auto pdf = hn::Mul(gauss, hn::Set(d, 0.3989422804014327));  // 1 / sqrt(2 pi)
    const auto lim = hn::IfThenElse(hn::Gt(x, hn::Zero(d)), one, hn::Zero(d));
    return hn::Mul(g, hn::IfThenElse(big, lim, hn::MulAdd(xc, pdf, cdf)));
  }
};

template <class T>
HWY_INLINE void GeluErfBwdT(const T* HWY_RESTRICT x, const T* HWY_RESTRICT g, T* HWY_RESTRICT dx,
                            size_t n) {
  const hn::ScalableTag<double> d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N)
    StoreFrom(d, GeluErfBwdF64()(d, LoadAs(d, x + i), LoadAs(d, g + i)), dx + i);
  if (i < n)
    StoreFromN(d, GeluErfBwdF64()(d, LoadAsN(d, x + i, n - i), LoadAsN(d, g + i, n - i)), dx + i,
               n - i);
}
void GeluErfBwdBF16(const bf16* x, const bf16* g, bf16* dx, size_t n) { GeluErfBwdT(x, g, dx, n); }
void GeluErfBwdF16(const f16* x, const f16* g, f16* dx, size_t n) { GeluErfBwdT(x, g, dx, n); }
void GeluErfBwdF32(const float* x, const float* g, float* dx, size_t n) { GeluErfBwdT(x, g, dx, n); }
void GeluErfBwdF64(const double* x, const double* g, double* dx, size_t n) {
  GeluErfBwdT(x, g, dx, n);
}

}  // namespace taper::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace taper::cpu {

HWY_EXPORT(UnaryBF16);
HWY_EXPORT(UnaryF16);
HWY_EXPORT(UnaryF32);
HWY_EXPORT(UnaryF64);
HWY_EXPORT(GeluErfBwdBF16);
HWY_EXPORT(GeluErfBwdF16);
HWY_EXPORT(GeluErfBwdF32);
HWY_EXPORT(GeluErfBwdF64);

namespace {

/// Elements per work item inside one inner run; a thread takes whole items.
constexpr size_t kBlock = 4096;
/// Elements gathered at a time from a non-unit-stride run (a stack buffer).
constexpr size_t kGather = 512;

void unary_simd(int op, const bf16* in, bf16* out, size_t n, double f0, double f1) {
  HWY_DYNAMIC_DISPATCH(UnaryBF16)(op, in, out, n, f0, f1);
}
void unary_simd(int op, const f16* in, f16* out, size_t n, double f0, double f1) {
  HWY_DYNAMIC_DISPATCH(UnaryF16)(op, in, out, n, f0, f1);
}
void unary_simd(int op, const float* in, float* out, size_t n, double f0, double f1) {
  HWY_DYNAMIC_DISPATCH(UnaryF32)(op, in, out, n, f0, f1);
}
void unary_simd(int op, const double* in, double* out, size_t n, double f0, double f1) {
  HWY_DYNAMIC_DISPATCH(UnaryF64)(op, in, out, n, f0, f1);
}

/// Calls f(in, in_stride, out, len) over x's elements in row-major order, in blocks of at most
/// kBlock elements spread over the thread pool; `out` is contiguous with x's shape.
template <class T, class F> void for_each_run(const Tensor& x, const Tensor& y, F&& f) {
  if (x.elem_count() == 0) return;
  const StridedLoop<2> loop(x.shape(), {&y.strides(), &x.strides()});
  TAPER_ASSERT(loop.inner_stride[0] == 1 || loop.inner == 1);
  const T* src = x.data<T>();
  T* dst = y.data<T>();
  const size_t inner = loop.inner;
  const size_t per_run = (inner + kBlock - 1) / kBlock;
  const size_t items = loop.outer_count * per_run;
  const size_t grain = std::max<size_t>(1, kElemGrain / std::min(inner, kBlock));
  parallel_for(items, grain, [&](size_t begin, size_t end) {
    for (size_t it = begin; it < end; ++it) {
      const size_t run = it / per_run;
      const size_t start = (it % per_run) * kBlock;
      const size_t len = std::min(kBlock, inner - start);
      const auto off = loop.offsets(run);
      const int64_t s = loop.inner_stride[1];
      f(src + off[1] + static_cast<int64_t>(start) * s, s, dst + off[0] + start, len);
    }
  });
}

template <class T> void unary_float(OpId op, const Tensor& x, const Tensor& y, const OpAttrs& a) {
  for_each_run<T>(x, y, [&](const T* in, int64_t s, T* out, size_t len) {
    if (s == 1) {
      unary_simd(static_cast<int>(op), in, out, len, a.f0, a.f1);
      return;
    }
    T buf[kGather];
    for (size_t c = 0; c < len; c += kGather) {
      const size_t m = std::min(kGather, len - c);
      for (size_t k = 0; k < m; ++k) buf[k] = in[static_cast<int64_t>(c + k) * s];
      unary_simd(static_cast<int>(op), buf, out + c, m, a.f0, a.f1);
    }
  });
}

// ---- integer ops (scalar) ---------------------------------------------------------------------

template <class T> T wrap_neg(T x) {
  return static_cast<T>(std::make_unsigned_t<T>(0) - static_cast<std::make_unsigned_t<T>>(x));
}
template <class T> T wrap_mul(T a, T b) {
  return static_cast<T>(static_cast<uint64_t>(static_cast<std::make_unsigned_t<T>>(a)) *
                        static_cast<uint64_t>(static_cast<std::make_unsigned_t<T>>(b)));
}
/// Round toward zero, saturate to T's range, NaN -> 0.
template <class T> T saturate(double v) {
  if (std::isnan(v)) return T{0};
  if (v <= static_cast<double>(std::numeric_limits<T>::lowest())) return std::numeric_limits<T>::lowest();
  if (v >= static_cast<double>(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
  return static_cast<T>(v);
}

template <class T, class F> void int_map(const Tensor& x, const Tensor& y, F f) {
  for_each_run<T>(x, y, [&](const T* in, int64_t s, T* out, size_t len) {
    for (size_t k = 0; k < len; ++k) out[k] = f(in[static_cast<int64_t>(k) * s]);
  });
}

// neg/abs/sqr wrap (two's complement); affine with integer mul/add wraps like the binary ops,
// with fractional ones it goes through double (round toward zero, saturate); clamp bounds are
// ceil(lo), floor(hi).
template <class T> void unary_int(OpId op, const Tensor& x, const Tensor& y, const OpAttrs& a) {
  constexpr bool kSigned = std::is_signed_v<T>;
  switch (op) {
    case OpId::neg: return int_map<T>(x, y, [](T v) { return wrap_neg(v); });
    case OpId::abs: return int_map<T>(x, y, [](T v) { return (kSigned && v < T{0}) ? wrap_neg(v) : v; });
    case OpId::relu: return int_map<T>(x, y, [](T v) { return (kSigned && v < T{0}) ? T{0} : v; });
    case OpId::sqr: return int_map<T>(x, y, [](T v) { return wrap_mul(v, v); });
    case OpId::affine: {
      const double lim = 9007199254740992.0;  // 2^53
      if (a.f0 == std::trunc(a.f0) && a.f1 == std::trunc(a.f1) && std::fabs(a.f0) <= lim &&
          std::fabs(a.f1) <= lim) {
        using U = std::make_unsigned_t<T>;
        const U m = static_cast<U>(static_cast<T>(static_cast<int64_t>(a.f0)));
        const U c = static_cast<U>(static_cast<T>(static_cast<int64_t>(a.f1)));
        return int_map<T>(x, y, [m, c](T v) {
          return static_cast<T>(static_cast<U>(wrap_mul(static_cast<T>(v), static_cast<T>(m))) + c);
        });
      }
      return int_map<T>(x, y, [&a](T v) { return saturate<T>(static_cast<double>(v) * a.f0 + a.f1); });
    }
    case OpId::clamp: {
      const T lo = saturate<T>(std::ceil(a.f0)), hi = saturate<T>(std::floor(a.f1));
      const double dlo = a.f0, dhi = a.f1;
      return int_map<T>(x, y, [=](T v) {
        const double dv = static_cast<double>(v);
        return dv < dlo ? lo : (dv > dhi ? hi : v);
      });
    }
    default: TAPER_ASSERT(false && "integer unary op without a kernel");
  }
}

template <OpId kOp>
std::vector<Tensor> unary_kernel(const std::vector<Tensor>& in, const OpAttrs& attrs) {
  const Tensor& x = in[0];
  Tensor y = new_output(x.shape(), x.dtype());
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16> ||
                  std::is_floating_point_v<T>) {
      unary_float<T>(kOp, x, y, attrs);
    } else {
      unary_int<T>(kOp, x, y, attrs);
    }
  });
  return {y};
}

// gelu_erf_bwd: (x, g) -> dx, both contiguous (registered needs_contiguous), of x's shape.
void gelu_erf_bwd_simd(const bf16* x, const bf16* g, bf16* dx, size_t n) {
  HWY_DYNAMIC_DISPATCH(GeluErfBwdBF16)(x, g, dx, n);
}
void gelu_erf_bwd_simd(const f16* x, const f16* g, f16* dx, size_t n) {
  HWY_DYNAMIC_DISPATCH(GeluErfBwdF16)(x, g, dx, n);
}
void gelu_erf_bwd_simd(const float* x, const float* g, float* dx, size_t n) {
  HWY_DYNAMIC_DISPATCH(GeluErfBwdF32)(x, g, dx, n);
}
void gelu_erf_bwd_simd(const double* x, const double* g, double* dx, size_t n) {
  HWY_DYNAMIC_DISPATCH(GeluErfBwdF64)(x, g, dx, n);
}

std::vector<Tensor> gelu_erf_bwd_kernel(const std::vector<Tensor>& in, const OpAttrs&) {
  const Tensor& x = in[0];
  const Tensor& g = in[1];
  TAPER_ASSERT(x.shape() == g.shape() && x.dtype() == g.dtype());
  Tensor dx = new_output(x.shape(), x.dtype());
  const size_t n = x.elem_count();
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16> ||
                  std::is_floating_point_v<T>) {
      const T* xp = x.data<T>();
      const T* gp = g.data<T>();
      T* dp = dx.data<T>();
      parallel_for((n + kBlock - 1) / kBlock, std::max<size_t>(1, kElemGrain / kBlock),
                   [&](size_t begin, size_t end) {
                     for (size_t b = begin; b < end; ++b) {
                       const size_t at = b * kBlock, len = std::min(kBlock, n - at);
                       gelu_erf_bwd_simd(xp + at, gp + at, dp + at, len);
                     }
                   });
    } else {
      TAPER_ASSERT(false && "gelu_erf_bwd of an integer dtype is not registered");
    }
  });
  return {dx};
}

constexpr uint32_t kIntDTypes = dtype_bit(DType::U8) | dtype_bit(DType::U32) | dtype_bit(DType::I64);

struct UnaryRegistrar {
  UnaryRegistrar() {
    const auto reg = [](OpId op, KernelFn fn, uint32_t extra) {
      register_kernel(op, DeviceKind::Cpu, kFloatDTypes | extra, fn, /*needs_contiguous=*/false);
    };
    reg(OpId::neg, &unary_kernel<OpId::neg>, dtype_bit(DType::I64));
    reg(OpId::abs, &unary_kernel<OpId::abs>, kIntDTypes);
    reg(OpId::exp, &unary_kernel<OpId::exp>, 0);
    reg(OpId::log, &unary_kernel<OpId::log>, 0);
    reg(OpId::sqrt, &unary_kernel<OpId::sqrt>, 0);
    reg(OpId::rsqrt, &unary_kernel<OpId::rsqrt>, 0);
    reg(OpId::recip, &unary_kernel<OpId::recip>, 0);
    reg(OpId::sqr, &unary_kernel<OpId::sqr>, kIntDTypes);
    reg(OpId::tanh, &unary_kernel<OpId::tanh>, 0);
    reg(OpId::sigmoid, &unary_kernel<OpId::sigmoid>, 0);
    reg(OpId::relu, &unary_kernel<OpId::relu>, kIntDTypes);
    reg(OpId::gelu, &unary_kernel<OpId::gelu>, 0);
    reg(OpId::gelu_erf, &unary_kernel<OpId::gelu_erf>, 0);
    reg(OpId::silu, &unary_kernel<OpId::silu>, 0);
    reg(OpId::sin, &unary_kernel<OpId::sin>, 0);
    reg(OpId::cos, &unary_kernel<OpId::cos>, 0);
    reg(OpId::powf, &unary_kernel<OpId::powf>, 0);
    reg(OpId::affine, &unary_kernel<OpId::affine>, kIntDTypes);
    reg(OpId::clamp, &unary_kernel<OpId::clamp>, kIntDTypes);
    register_kernel(OpId::gelu_erf_bwd, DeviceKind::Cpu, kFloatDTypes, &gelu_erf_bwd_kernel,
                    /*needs_contiguous=*/true);
  }
};
const UnaryRegistrar g_unary_registrar;

}  // namespace
}  // namespace taper::cpu
#endif  // HWY_ONCE
