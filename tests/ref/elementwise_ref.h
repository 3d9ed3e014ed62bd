// elementwise_ref.h: scalar references for the unary and binary elementwise op families, the
// yardstick the SIMD kernels of cpu/unary.cpp and cpu/binary.cpp are tested against.
//
// What it is: header-only, one function per family, plain scalar code. Float ops are computed in
// double where double is exact or correctly rounded (+ - * / sqrt, comparisons), and in long
// double (x87 80-bit, 11 more bits) for the transcendental ones, so that the reference is a
// better f64 answer than an f64 kernel can give. Integer ops have their own reference with the
// kernels' integer semantics (two's-complement wrap, division by zero gives 0).
// What it is not: fast, or a kernel: nothing registers these. Rounding to the tensor's dtype is
// the caller's job (the tests round once through f32 for bf16/f16, as the kernels do).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "taper/op.h"

namespace taper::cpu::ref {

/// The reference of a float unary op at x. attrs: powf reads f0 (exponent), affine f0 (mul) and
/// f1 (add), clamp f0 (lo) and f1 (hi). Returns NaN for an op that is not unary.
inline double unary(OpId op, double x, const OpAttrs& attrs = {}) {
  using L = long double;
  const L xl = x;
  switch (op) {
    case OpId::neg: return -x;
    case OpId::abs: return std::fabs(x);
    case OpId::exp: return static_cast<double>(std::exp(xl));
    case OpId::log: return static_cast<double>(std::log(xl));
    case OpId::sqrt: return std::sqrt(x);
    case OpId::rsqrt: return static_cast<double>(1.0L / std::sqrt(xl));
    case OpId::recip: return 1.0 / x;
    case OpId::sqr: return x * x;
    case OpId::tanh: return static_cast<double>(std::tanh(xl));
    case OpId::sigmoid: return static_cast<double>(1.0L / (1.0L + std::exp(-xl)));
    case OpId::relu: return std::isnan(x) ? x : (x > 0.0 ? x : 0.0);
    case OpId::gelu: {
      // 0.5 x (1 + tanh(z)) == x * sigmoid(2z): the same function without the cancellation of
      // 1 + tanh(z) for negative x.
      const L z = 0.797884560802865355879892119868763737L * (xl + 0.044715L * xl * xl * xl);
      return static_cast<double>(xl / (1.0L + std::exp(-2.0L * z)));
    }
    case OpId::gelu_erf:
      // 0.5 x (1 + erf(x/sqrt2)) == 0.5 x erfc(-x/sqrt2), no cancellation for negative x.
      return static_cast<double>(0.5L * xl *
                                 std::erfc(-xl * 0.707106781186547524400844362104849039L));
    case OpId::silu: return static_cast<double>(xl / (1.0L + std::exp(-xl)));
    case OpId::sin: return static_cast<double>(std::sin(xl));
    case OpId::cos: return static_cast<double>(std::cos(xl));
    case OpId::powf: return static_cast<double>(std::pow(xl, static_cast<L>(attrs.f0)));
    case OpId::affine: return static_cast<double>(xl * attrs.f0 + attrs.f1);
    case OpId::clamp:
      if (std::isnan(x)) return x;
      return x < attrs.f0 ? attrs.f0 : (x > attrs.f1 ? attrs.f1 : x);
    default: return std::numeric_limits<double>::quiet_NaN();
  }
}

/// The reference of a float binary op: arithmetic in double (exact or correctly rounded for
/// operands of any taper float dtype); maximum/minimum propagate NaN; comparisons give 1 or 0
/// (false for NaN operands except ne). Returns NaN for an op that is not binary.
inline double binary(OpId op, double a, double b) {
  const bool any_nan = std::isnan(a) || std::isnan(b);
  switch (op) {
    case OpId::add: return a + b;
    case OpId::sub: return a - b;
    case OpId::mul: return a * b;
    case OpId::div: return a / b;
    case OpId::maximum: return any_nan ? a + b : (a < b ? b : a);
    case OpId::minimum: return any_nan ? a + b : (b < a ? b : a);
    case OpId::eq: return a == b ? 1.0 : 0.0;
    case OpId::ne: return a != b ? 1.0 : 0.0;
    case OpId::lt: return a < b ? 1.0 : 0.0;
    case OpId::le: return a <= b ? 1.0 : 0.0;
    case OpId::gt: return a > b ? 1.0 : 0.0;
    case OpId::ge: return a >= b ? 1.0 : 0.0;
    default: return std::numeric_limits<double>::quiet_NaN();
  }
}

/// mul_add in the compute type C (float for f32/bf16/f16, double for f64): a * b + c rounded
/// once (std::fma); a half type then rounds the float result once more, at the store.
template <class C> C mul_add(C a, C b, C c) { return std::fma(a, b, c); }

/// where_cond: `on_true` where the mask is nonzero, else `on_false`.
inline double where_cond(double mask, double on_true, double on_false) {
  return mask != 0.0 ? on_true : on_false;
}

namespace detail {
/// Wrapping arithmetic in the width of T (no signed overflow UB).
template <class T> using wrap_t = std::make_unsigned_t<T>;
template <class T> T wrap_add(T a, T b) { return static_cast<T>(static_cast<wrap_t<T>>(a) + static_cast<wrap_t<T>>(b)); }
template <class T> T wrap_sub(T a, T b) { return static_cast<T>(static_cast<wrap_t<T>>(a) - static_cast<wrap_t<T>>(b)); }
template <class T> T wrap_mul(T a, T b) {
  // uint8 (and uint16) would promote to int and could overflow it: multiply in uint64.
  return static_cast<T>(static_cast<uint64_t>(static_cast<wrap_t<T>>(a)) *
                        static_cast<uint64_t>(static_cast<wrap_t<T>>(b)));
}
/// Round toward zero and saturate to T's range; NaN gives 0.
template <class T> T saturate(double v) {
  if (std::isnan(v)) return T{0};
  if (v <= static_cast<double>(std::numeric_limits<T>::lowest())) return std::numeric_limits<T>::lowest();
  if (v >= static_cast<double>(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
  return static_cast<T>(v);
}
}  // namespace detail

/// Integer unary ops (T = uint8_t, uint32_t, int64_t): neg/abs/sqr wrap; relu of an unsigned
/// value is itself. affine: with integer mul and add (|.| <= 2^53) x*mul + add wraps like the
/// binary ops; otherwise it is computed in double, rounded toward zero and saturated. clamp
/// clamps to [ceil(lo), floor(hi)] (saturated to T's range).
template <class T> T unary_int(OpId op, T x, const OpAttrs& attrs = {}) {
  switch (op) {
    case OpId::neg: return detail::wrap_sub<T>(T{0}, x);
    case OpId::abs: return (std::is_signed_v<T> && x < T{0}) ? detail::wrap_sub<T>(T{0}, x) : x;
    case OpId::relu: return (std::is_signed_v<T> && x < T{0}) ? T{0} : x;
    case OpId::sqr: return detail::wrap_mul<T>(x, x);
    case OpId::affine: {
      const double m = attrs.f0, a = attrs.f1;
      const double lim = 9007199254740992.0;  // 2^53
      if (m == std::trunc(m) && a == std::trunc(a) && std::fabs(m) <= lim && std::fabs(a) <= lim) {
        const T mi = static_cast<T>(static_cast<int64_t>(m));
        const T ai = static_cast<T>(static_cast<int64_t>(a));
        return detail::wrap_add<T>(detail::wrap_mul<T>(x, mi), ai);
      }
      return detail::saturate<T>(static_cast<double>(x) * m + a);
    }
    case OpId::clamp: {
      const double v = static_cast<double>(x);
      if (v < attrs.f0) return detail::saturate<T>(std::ceil(attrs.f0));
      if (v > attrs.f1) return detail::saturate<T>(std::floor(attrs.f1));
      return x;
    }
    default: return T{0};
  }
}

/// Integer binary ops (T = uint8_t, uint32_t, int64_t): add/sub/mul wrap; div truncates toward
/// zero, x / 0 == 0 and INT64_MIN / -1 == INT64_MIN (wrap); comparisons give 1 or 0.
template <class T> T binary_int(OpId op, T a, T b) {
  switch (op) {
    case OpId::add: return detail::wrap_add<T>(a, b);
    case OpId::sub: return detail::wrap_sub<T>(a, b);
    case OpId::mul: return detail::wrap_mul<T>(a, b);
    case OpId::div:
      if (b == T{0}) return T{0};
      if constexpr (std::is_signed_v<T>) {
        if (b == T{-1}) return detail::wrap_sub<T>(T{0}, a);
      }
      return static_cast<T>(a / b);
    case OpId::maximum: return std::max(a, b);
    case OpId::minimum: return std::min(a, b);
    case OpId::eq: return a == b;
    case OpId::ne: return a != b;
    case OpId::lt: return a < b;
    case OpId::le: return a <= b;
    case OpId::gt: return a > b;
    case OpId::ge: return a >= b;
    default: return T{0};
  }
}

}  // namespace taper::cpu::ref
