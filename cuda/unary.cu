// unary.cu: CUDA kernels of the unary elementwise ops (neg abs exp log sqrt rsqrt recip sqr tanh
// sigmoid relu gelu gelu_erf silu sin cos powf affine clamp) and gelu_erf_bwd, the twins of
// cpu/unary.cpp.
// x: any shape and strides -> y: the same shape and dtype, contiguous.
//
// What it is: one grid-stride kernel per (op, dtype) over the row-major output index; x's
// offsets come from a coalesced Strided<1> (rank <= 1 layouts skip the index division). The
// float dtypes compute in compute_t<T> (f32 for bf16/f16/f32, f64 for f64) and round once at the
// store; the integer dtypes the CPU serves (neg: i64; abs relu sqr affine clamp: u8 u32 i64) use
// the CPU's integer semantics (two's-complement wrap, saturation, ceil/floor clamp bounds).
// What it is not: the backward rules (core) or the reference (tests/ref/elementwise_ref.h).
//
// Precision (the same formulas as the CPU, CUDA's accurate libdevice math, never __fast):
// - exact, bit-identical to the CPU: neg abs (sign-bit operations: NaN payloads kept) sqrt
//   rsqrt (1/sqrt: two IEEE roundings, as the CPU) recip sqr relu clamp, affine (one fma, as the
//   CPU's AVX2/AVX3 MulAdd; its SSE4/scalar targets round twice), and every integer op. NaN
//   results that the GPU computes (sqrt(-1), inf - inf...) are its canonical NaN, not x86's.
// - exp log tanh sin cos: CUDA's expf/logf/... (documented max error 1-2 ulp) instead of
//   Highway's contrib math: within a few ulp of the CPU, not bit-identical. sigmoid, silu and
//   gelu use the CPU's two-sided forms on top of exp.
// - gelu_erf: f32 and f64 through the CPU's f64 algorithm (Chebyshev erfcx with the rounding of
//   x/sqrt2 and of b^2 compensated; fma for the exact products), rounded once: f64 within a few
//   ulp of the CPU; f32 nearly correctly rounded (CPU f32: 1.5 ulp). bf16/f16 (forward and
//   gelu_erf_bwd) compute in f32 with erfcf and round once: within one half-type ulp of the CPU.
// - powf: f32/bf16/f16 in f64, rounded once: integer exponents |e| <= 16 by exact-or-nearly
//   products, others CUDA's pow (the CPU: exp(e log|x|) in f64 lanes; the same C99 special
//   cases); f64 is CUDA's pow (2 ulp documented) where the CPU has glibc's.
// Contraction: nvcc fuses a*b+c by default. Where the rounding of a product matters (the
// error-free products of gelu_erf; integer affine with fractional parameters, which the CPU
// rounds as a product and a sum) the code uses __dmul_rn/__dadd_rn, which are never fused.
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "cuda/cuda_common.cuh"
#include "taper/dtype.h"
#include "taper/op.h"

namespace taper::cuda {
namespace {

// ---- launch ----------------------------------------------------------------------------------

/// y[i] = f(x at offset off(i)) for every row-major i < n.
template <class F>
__global__ void __launch_bounds__(kThreads) unary_map(int64_t n, Strided<1> s, F f) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += step) {
    int64_t off[1];
    if (s.rank <= 1) off[0] = s.rank == 0 ? 0 : i * s.strides[0][0];
    else s.offsets(i, off);
    f(i, off[0]);
  }
}

/// Parameters prepared on the host (f0/f1 as the op reads them; the integer forms of affine and
/// clamp as the CPU derives them).
struct UnaryParams {
  double f0 = 0.0, f1 = 0.0;
  bool int_affine = false;   ///< affine with integer mul/add: x * m + c wraps
  uint64_t m = 0, c = 0;     ///< integer affine mul/add, as T's bits
  uint64_t lo = 0, hi = 0;   ///< integer clamp bounds saturate(ceil f0), saturate(floor f1)
  bool small_int_pow = false;  ///< powf of f32/bf16/f16 with an integer exponent |e| <= 16
  int pow_n = 0;
};

// ---- float ops ---------------------------------------------------------------------------------

/// -x (kNeg) or |x| as sign-bit operations, as the CPU's Neg/Abs: NaN payloads are kept (the
/// GPU's neg/abs instructions may return the canonical NaN).
template <bool kNeg, class C> __device__ __forceinline__ C sign_op(C x) {
  if constexpr (std::is_same_v<C, double>) {
    const uint64_t u = f64_bits(x);
    return f64_from_bits(kNeg ? u ^ 0x8000000000000000ull : u & 0x7fffffffffffffffull);
  } else {
    const uint32_t u = f32_bits(x);
    return f32_from_bits(kNeg ? u ^ 0x80000000u : u & 0x7fffffffu);
  }
}

/// sigmoid(t) as the CPU: e = exp(-|t|); 1/(1+e) for t >= 0, e/(1+e) for t < 0.
template <class C> __device__ __forceinline__ C sigmoid(C t) {
  const C e = exp(-fabs(t));
  const C r = C(1) / (C(1) + e);
  return t < C(0) ? e * r : r;
}

// erfcx(b) = exp(b^2) erfc(b) for b >= 0 as h(y) / (1 + sqrt(pi) b), y = (b - 3)/(b + 3),
// h = sum c_k T_k(y): cpu/unary.cpp's kErfcxCheb (max relative error 4.6e-16 on [0, 40]).
__constant__ double kErfcxCheb[26] = {
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

/// gelu_erf(x) = 0.5 x erfc(-x/sqrt2) in f64: cpu/unary.cpp's GeluErfF64 with fma for the exact
/// products (the CPU splits with Dekker where it lacks FMA; the error terms are the same).
__device__ double gelu_erf_f64(double x) {
  // Beyond |x| = 60 the result is x (erfc(-42) == 2) or -0 (underflow); NaN stays.
  if (!(fabs(x) <= 60.0)) return x != x ? x : (x > 0.0 ? x : -0.0);
  // x/sqrt2 = s + err: 1/sqrt2 = kR + kRl, the product's error exact by fma. The products whose
  // rounding error is recovered are __dmul_rn: nvcc must not contract them into a later sum.
  constexpr double kR = 0.70710678118654757, kRl = -4.8336466567264567e-17;
  const double p = __dmul_rn(x, kR);
  const double e0 = fma(x, kRl, fma(x, kR, -p));
  const double s = p + e0;  // renormalised: |err| <= ulp(s)/2
  const double err = (p - s) + e0;
  const double a = -s, da = -err;  // erfc's argument is a + da
  const double b = fabs(a);
  // erfcx(b) by Clenshaw.
  const double y = (b - 3.0) / (b + 3.0);
  const double y2 = y + y;
  double b1 = 0.0, b2 = 0.0;
#pragma unroll
  for (int k = 25; k >= 1; --k) {
    const double t = fma(y2, b1, -b2) + kErfcxCheb[k];
    b2 = b1;
    b1 = t;
  }
  const double h = fma(y, b1, -b2) + kErfcxCheb[0];
  const double q = h / fma(1.772453850905516104, b, 1.0);
  // g = exp(-b^2) with b^2 = bb + bb_lo exactly: exp(-bb) (1 - bb_lo).
  const double bb = __dmul_rn(b, b);
  const double bb_lo = fma(b, b, -bb);
  const double g = exp(-bb) * (1.0 - bb_lo);
  // erfc(a + da) = erfc(a) - (2/sqrt(pi)) exp(-a^2) da; erfc(a) = g q (a >= 0), 2 - g q (a < 0).
  const double cda = 1.1283791670955125586 * da;
  const double erfc_v = a >= 0.0 ? g * (q - cda) : fma(-g, q + cda, 2.0);
  return (0.5 * x) * erfc_v;
}

/// gelu_erf of bf16/f16 data, computed in f32 as the half types' rule says: 0.5 x erfc(-x/sqrt2)
/// with CUDA's erfcf (a few f32 ulp, also in the tails, where the rounding of -x/sqrt2 adds at
/// most 2 x^2 f32 ulp: below 2^-16 relative for |x| < 13), so at most one half-type ulp from the
/// CPU's correctly rounded f64 path, at a fraction of f64's cost (run 11, docs/cuda.md).
__device__ __forceinline__ float gelu_erf_f32(float x) {
  return (0.5f * x) * erfcf(x * -0.70710678118654752f);
}

/// The float ops on a compute value x (C = f32 or f64). Returns C, or f64 where the op computes
/// in f64 for f32 data (gelu_erf, powf); the caller rounds once to the storage type.
template <OpId kOp, class C>
__device__ __forceinline__ auto unary_float(C x, const UnaryParams& p) {
  if constexpr (kOp == OpId::neg) return sign_op<true>(x);
  else if constexpr (kOp == OpId::abs) return sign_op<false>(x);
  else if constexpr (kOp == OpId::exp) return exp(x);
  else if constexpr (kOp == OpId::log) return log(x);
  else if constexpr (kOp == OpId::sqrt) return sqrt(x);
  else if constexpr (kOp == OpId::rsqrt) return C(1) / sqrt(x);
  else if constexpr (kOp == OpId::recip) return C(1) / x;
  else if constexpr (kOp == OpId::sqr) return x * x;
  else if constexpr (kOp == OpId::tanh) return tanh(x);
  else if constexpr (kOp == OpId::sigmoid) return sigmoid(x);
  else if constexpr (kOp == OpId::relu) return x < C(0) ? C(0) : x;  // NaN and -0 pass through
  else if constexpr (kOp == OpId::silu) return x * sigmoid(x);
  else if constexpr (kOp == OpId::sin) return sin(x);
  else if constexpr (kOp == OpId::cos) return cos(x);
  else if constexpr (kOp == OpId::gelu) {
    // 0.5 x (1 + tanh z) = x sigmoid(2z), z = sqrt(2/pi) (x + 0.044715 x^3), as the CPU.
    const C t = (C(2 * 0.797884560802865355879892) * x) * fma(C(0.044715), x * x, C(1));
    return x * sigmoid(t);
  } else if constexpr (kOp == OpId::gelu_erf) {
    return gelu_erf_f64(static_cast<double>(x));
  } else if constexpr (kOp == OpId::powf) {
    if constexpr (std::is_same_v<C, double>) {
      return pow(x, p.f0);
    } else {
      const double xd = x;
      if (!p.small_int_pow) return pow(xd, p.f0);
      // x^n, |n| <= 16, by binary powering in f64: exact for bf16 (n <= 6) and f16 (n <= 4),
      // within ~2 f64 roundings for f32 data, so the result rounds correctly where pow (and the
      // CPU's exp(e log|x|)) can land on the wrong side of an exact tie. The C99 special cases
      // (signed zeros, infinities, NaN, x^0 == 1) follow from the products and 1/r.
      double r = 1.0, b = xd;
      for (int n = p.pow_n < 0 ? -p.pow_n : p.pow_n; n != 0; n >>= 1) {
        if (n & 1) r *= b;
        b *= b;
      }
      return p.pow_n < 0 ? 1.0 / r : r;
    }
  } else if constexpr (kOp == OpId::affine) {
    return fma(x, static_cast<C>(p.f0), static_cast<C>(p.f1));
  } else {
    static_assert(kOp == OpId::clamp, "not a unary op");
    const C lo = static_cast<C>(p.f0), hi = static_cast<C>(p.f1);
    return x < lo ? lo : (x > hi ? hi : x);  // selects: NaN passes through
  }
}

// ---- integer ops -------------------------------------------------------------------------------

template <class T> __device__ __forceinline__ T wrap_neg(T v) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(U(0) - static_cast<U>(v)));
}
template <class T> __device__ __forceinline__ T wrap_mul(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<uint64_t>(static_cast<U>(a)) *
                        static_cast<uint64_t>(static_cast<U>(b)));
}
/// Round toward zero, saturate to T's range, NaN -> 0 (the CPU's saturate).
template <class T> __host__ __device__ __forceinline__ T saturate(double v) {
  if (v != v) return T{0};
  using L = std::numeric_limits<T>;
  if (v <= static_cast<double>(L::lowest())) return L::lowest();
  if (v >= static_cast<double>(L::max())) return L::max();
  return static_cast<T>(v);
}

template <OpId kOp, class T> __device__ __forceinline__ T unary_int(T v, const UnaryParams& p) {
  constexpr bool kSigned = std::is_signed_v<T>;
  if constexpr (kOp == OpId::neg) return wrap_neg(v);
  else if constexpr (kOp == OpId::abs) return (kSigned && v < T{0}) ? wrap_neg(v) : v;
  else if constexpr (kOp == OpId::relu) return (kSigned && v < T{0}) ? T{0} : v;
  else if constexpr (kOp == OpId::sqr) return wrap_mul(v, v);
  else if constexpr (kOp == OpId::affine) {
    using U = std::make_unsigned_t<T>;
    if (p.int_affine)
      return static_cast<T>(static_cast<U>(wrap_mul(v, static_cast<T>(p.m))) + static_cast<U>(p.c));
    // Two roundings, as the CPU's scalar loop (no contraction into an fma).
    return saturate<T>(__dadd_rn(__dmul_rn(static_cast<double>(v), p.f0), p.f1));
  } else {
    static_assert(kOp == OpId::clamp, "integer unary op without a kernel");
    const double dv = static_cast<double>(v);
    return dv < p.f0 ? static_cast<T>(p.lo) : (dv > p.f1 ? static_cast<T>(p.hi) : v);
  }
}

/// Whether the CPU registers (kOp, T): every float dtype; neg on i64; abs relu sqr affine clamp
/// on u8 u32 i64.
template <OpId kOp, class T> constexpr bool served() {
  if constexpr (!std::is_integral_v<T>) return true;
  else if constexpr (kOp == OpId::neg) return std::is_same_v<T, int64_t>;
  else return kOp == OpId::abs || kOp == OpId::relu || kOp == OpId::sqr || kOp == OpId::affine ||
              kOp == OpId::clamp;
}

template <OpId kOp, class T> struct UnaryFn {
  const T* x;
  T* y;
  UnaryParams p;
  __device__ __forceinline__ T apply(T v) const {
    if constexpr (std::is_integral_v<T>) return unary_int<kOp>(v, p);
    else if constexpr (kOp == OpId::gelu_erf && is_half_v<T>)
      return round_to<T>(gelu_erf_f32(widen(v)));
    else return round_to<T>(unary_float<kOp>(widen(v), p));
  }
  __device__ __forceinline__ void operator()(int64_t i, int64_t off) const { y[i] = apply(x[off]); }
};

/// f over x's elements Vec16 by Vec16 when x's innermost coalesced dim is a run of whole vectors
/// (runs_in_vectors): a dense x, or a head view such as q * scale on (B, H, T, d) of (B, T, H, d).
template <OpId kOp, class T>
__global__ void __launch_bounds__(kThreads)
    unary_runs(int64_t nv, Strided<1> s, UnaryFn<kOp, T> f) {
  constexpr int kV = 16 / sizeof(T);
  for_each_vector<1, kV>(nv, s, [&](int64_t v, const int64_t (&off)[1]) {
    const Vec16<T> in = *reinterpret_cast<const Vec16<T>*>(f.x + off[0]);
    Vec16<T> out;
#pragma unroll
    for (int k = 0; k < kV; ++k) out.v[k] = f.apply(in.v[k]);
    reinterpret_cast<Vec16<T>*>(f.y)[v] = out;
  });
}

template <class T> UnaryParams params_for(OpId op, const OpAttrs& a) {
  UnaryParams p;
  p.f0 = a.f0;
  p.f1 = a.f1;
  if constexpr (!std::is_integral_v<T> && !std::is_same_v<T, double>) {
    if (op == OpId::powf && a.f0 == std::trunc(a.f0) && std::fabs(a.f0) <= 16.0) {
      p.small_int_pow = true;
      p.pow_n = static_cast<int>(a.f0);
    }
  }
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    const double lim = 9007199254740992.0;  // 2^53
    if (op == OpId::affine && a.f0 == std::trunc(a.f0) && a.f1 == std::trunc(a.f1) &&
        std::fabs(a.f0) <= lim && std::fabs(a.f1) <= lim) {
      p.int_affine = true;
      p.m = static_cast<U>(static_cast<T>(static_cast<int64_t>(a.f0)));
      p.c = static_cast<U>(static_cast<T>(static_cast<int64_t>(a.f1)));
    }
    if (op == OpId::clamp) {
      p.lo = static_cast<uint64_t>(saturate<T>(std::ceil(a.f0)));
      p.hi = static_cast<uint64_t>(saturate<T>(std::floor(a.f1)));
    }
  }
  return p;
}

template <OpId kOp>
std::vector<Tensor> unary_kernel(const std::vector<Tensor>& in, const OpAttrs& attrs) {
  const Tensor& x = in[0];
  Tensor y = new_output(x.shape(), x.dtype(), x);
  const size_t n = x.elem_count();
  if (n == 0) return {y};
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (served<kOp, T>()) {
      const int ord = x.device().ordinal();
      const cudaStream_t st = stream(ord);
      const Strided<1> s = make_strided<1>(x.shape(), {&x.strides()});
      const UnaryFn<kOp, T> f{ptr<T>(x), ptr<T>(y), params_for<T>(kOp, attrs)};
      if (runs_in_vectors<1>(s, {ptr<T>(x)}, sizeof(T), /*splat_runs=*/false)) {
        const int64_t nv = static_cast<int64_t>(n / (16 / sizeof(T)));
        unary_runs<kOp, T><<<grid_for(static_cast<size_t>(nv), ord), kThreads, 0, st>>>(nv, s, f);
      } else {
        unary_map<<<grid_for(n, ord), kThreads, 0, st>>>(static_cast<int64_t>(n), s, f);
      }
      TAPER_CUDA_CHECK_LAUNCH(op_name(kOp).data(), in);
    } else {
      TAPER_ASSERT(false && "cuda: unary op not registered for this dtype");
    }
  });
  return {y};
}

// ---- gelu_erf_bwd ----------------------------------------------------------------------------

/// dx = g (Phi(x) + x phi(x)) in f32 for the half types (as the forward): erfcf is within a few
/// f32 ulp, far below a bf16/f16 rounding step, and f32 runs many times faster than f64 here.
__device__ float gelu_erf_bwd_f32(float x, float g) {
  const float ax = fabsf(x);
  if (ax > 37.0f) return g * (x > 0.0f ? 1.0f : 0.0f);
  const float cdf = 0.5f * erfcf(x * -0.70710678118654752f);
  const float pdf = expf((x * x) * -0.5f) * 0.3989422804014327f;
  return g * fmaf(x, pdf, cdf);
}

/// dx = g (Phi(x) + x phi(x)) in f64 for f32 and f64: Phi = gelu_erf(x) / x (1/2 below
/// |x| = 1e-20), phi = exp(-x^2/2) / sqrt(2 pi), and beyond |x| = 37 the limits 1 (x > 0) and
/// 0, as cpu/unary.cpp's GeluErfBwdF64 has them. NaN stays NaN. Here x^2 is rounded before the
/// exp (up to x^2/2 ulp of phi), where the CPU carries it as a double-double since 44d54a4.
__device__ double gelu_erf_bwd_f64(double x, double g) {
  const double ax = fabs(x);
  if (ax > 37.0) return g * (x > 0.0 ? 1.0 : 0.0);
  const double cdf = ax < 1e-20 ? 0.5 : gelu_erf_f64(x) / x;
  const double pdf = exp((x * x) * -0.5) * 0.3989422804014327;
  return g * fma(x, pdf, cdf);
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    gelu_erf_bwd_map(const T* __restrict__ x, const T* __restrict__ g, T* __restrict__ dx,
                     int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    if constexpr (is_half_v<T>)
      dx[i] = round_to<T>(gelu_erf_bwd_f32(widen(x[i]), widen(g[i])));
    else
      dx[i] = round_to<T>(gelu_erf_bwd_f64(static_cast<double>(widen(x[i])),
                                           static_cast<double>(widen(g[i]))));
}

/// (x, g) -> dx, both contiguous (registered needs_contiguous), x's shape.
std::vector<Tensor> gelu_erf_bwd_kernel(const std::vector<Tensor>& in, const OpAttrs&) {
  const Tensor& x = in[0];
  const Tensor& g = in[1];
  TAPER_ASSERT(x.shape() == g.shape() && x.dtype() == g.dtype());
  Tensor dx = new_output(x.shape(), x.dtype(), x);
  const size_t n = x.elem_count();
  if (n == 0) return {dx};
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_integral_v<T>) {
      const int ord = x.device().ordinal();
      gelu_erf_bwd_map<T><<<grid_for(n, ord), kThreads, 0, stream(ord)>>>(
          ptr<const T>(x), ptr<const T>(g), ptr<T>(dx), static_cast<int64_t>(n));
      TAPER_CUDA_CHECK_LAUNCH("gelu_erf_bwd", in);
    } else {
      TAPER_ASSERT(false && "cuda: gelu_erf_bwd of an integer dtype is not registered");
    }
  });
  return {dx};
}

constexpr uint32_t kIntDTypes =
    dtype_bit(DType::U8) | dtype_bit(DType::U32) | dtype_bit(DType::I64);

struct UnaryRegistrar {
  UnaryRegistrar() {
    const auto reg = [](OpId op, KernelFn fn, uint32_t extra) {
      register_kernel(op, DeviceKind::Cuda, kFloatDTypes | extra, fn, /*needs_contiguous=*/false);
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
    register_kernel(OpId::gelu_erf_bwd, DeviceKind::Cuda, kFloatDTypes, &gelu_erf_bwd_kernel,
                    /*needs_contiguous=*/true);
  }
};
const UnaryRegistrar g_unary_registrar;

}  // namespace
}  // namespace taper::cuda
