// test_elementwise.cpp: the CPU unary and binary elementwise families (cpu/unary.cpp,
// cpu/binary.cpp) against the scalar references of tests/ref/elementwise_ref.h, through the public
// Tensor methods and operators.
//
// Parameterised over op x dtype x layout (testing::kAllLayouts) x size {1, 7, 33, 1000, 4099,
// 60000}. The expected value is the reference evaluated on the (dtype-rounded) inputs:
// - exact ops (neg abs sqrt recip sqr relu clamp, add sub mul div maximum minimum, comparisons,
//   where_cond) must equal the single rounding of the f32 (f64) result bit for bit: for bf16/f16
//   that is bf16(float(ref)), e.g. bf16(a + b computed in f32), so a double rounding fails;
// - the other float ops: |got - ref| <= k * u_c * scale, u_c the unit roundoff of the compute type
//   (f32 for bf16/f16/f32, f64 for f64), k per op (tests/unary_cases.h: affine 2, rsqrt 3,
//   exp/log/powf 4, sin/cos/gelu 6, tanh/sigmoid/silu 8, gelu_erf 10: 1 to 5 ulp; measured maxima
//   are about half of these), scale = |ref| except affine (|x*mul| + |add|: cancellation) and gelu
//   (|ref| (1 + |2z|): the condition number of the sigmoid factor in its argument 2z, which no
//   working-precision evaluation escapes); bf16/f16 add one unit in the last place of the result
//   (2 u_h |want|), the flip a correctly computed f32 value may cause when it is rounded once to
//   the half type. Subnormal results may differ by a subnormal step (times |x|).
// Every Highway target compiled in (AVX3, AVX2, SSE4, scalar) is checked too.
// Integer ops are exact (two's-complement wrap; integer division by zero gives 0).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "tests/ref/elementwise_ref.h"
#include "tests/test_util.h"
#include "tests/unary_cases.h"

namespace taper::testing {
namespace {

TAPER_COVERS(Forward, OpId::neg, OpId::abs, OpId::exp, OpId::log, OpId::sqrt, OpId::rsqrt,
             OpId::recip, OpId::sqr, OpId::tanh, OpId::sigmoid, OpId::relu, OpId::gelu,
             OpId::gelu_erf, OpId::silu, OpId::sin, OpId::cos, OpId::powf, OpId::affine,
             OpId::clamp, OpId::add, OpId::sub, OpId::mul, OpId::div, OpId::maximum,
             OpId::minimum, OpId::eq, OpId::ne, OpId::lt, OpId::le, OpId::gt, OpId::ge,
             OpId::where_cond, OpId::mul_add, OpId::gelu_erf_bwd);

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

constexpr DType kFloatTypes[] = {DType::BF16, DType::F16, DType::F32, DType::F64};
constexpr DType kIntTypes[] = {DType::U8, DType::U32, DType::I64};
constexpr DType kAllTypes[] = {DType::U8,  DType::U32, DType::I64, DType::BF16,
                               DType::F16, DType::F32, DType::F64};
constexpr size_t kSizes[] = {1, 7, 33, 1000, 4099, 60000};

/// A shape of n elements; ranks 2 and 3 where n allows, so that Transposed really transposes.
Shape shape_for(size_t n) {
  switch (n) {
    case 33: return Shape({3, 11});
    case 1000: return Shape({10, 10, 10});
    case 60000: return Shape({40, 1500});  // transposed: gathered runs longer than the buffer
    default: return Shape({n});
  }
}

/// v rounded once from f32 to dt (bf16/f16), or from double to f32, as a kernel stores it.
double round_like(DType dt, double v) {
  switch (dt) {
    case DType::F64: return v;
    case DType::F32: return static_cast<float>(v);
    case DType::BF16: return static_cast<float>(bf16(static_cast<float>(v)));
    case DType::F16: return static_cast<float>(f16(static_cast<float>(v)));
    default: return v;
  }
}

/// Element i passes when got == want (NaN matching NaN, inf matching the same inf) or, for
/// finite want, |got - want| <= bound[i]. The message names the first failure and its input.
::testing::AssertionResult check_elements(const std::vector<double>& in,
                                          const std::vector<double>& got,
                                          const std::vector<double>& want,
                                          const std::vector<double>& bound) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    bool ok;
    if (std::isnan(w) || std::isnan(g)) ok = std::isnan(w) && std::isnan(g);
    else if (std::isinf(w) || std::isinf(g)) ok = g == w;
    else ok = std::abs(g - w) <= bound[i];
    if (!ok && bad++ == 0) first = i;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  auto f = ::testing::AssertionFailure();
  f.operator<<(bad) << " of " << got.size() << " elements wrong; first at " << first;
  if (first < in.size()) f << " (input " << in[first] << ")";
  f << ": got " << got[first] << " want " << want[first] << " bound " << bound[first];
  return f;
}

// ---- unary, float dtypes ---------------------------------------------------------------------

/// Expected values and per-element bounds of a float unary op on inputs xv of dtype dt.
void unary_expectation(const UnarySpec& s, DType dt, const std::vector<double>& xv,
                       std::vector<double>& want, std::vector<double>& bound) {
  OpAttrs attrs;
  attrs.f0 = s.f0;
  attrs.f1 = s.f1;
  const bool half = is_half(dt);
  const double uc = compute_u(dt);
  want.resize(xv.size());
  bound.resize(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) {
    const double x = xv[i];
    const double r = cpu::ref::unary(s.op, x, attrs);
    double scale = std::abs(r);
    if (s.scale == Scale::Affine) scale = std::abs(x * s.f0) + std::abs(s.f1) + std::abs(r);
    if (s.scale == Scale::Gelu) {
      const double z = 0.7978845608028654 * (x + 0.044715 * x * x * x);
      scale = std::abs(r) * (1.0 + std::abs(2.0 * z));
    }
    if (s.scale == Scale::Exact) {
      want[i] = round_like(dt, r);
      bound[i] = 0.0;
    } else if (half) {
      want[i] = round_like(dt, r);
      bound[i] = 2.0 * unit_roundoff(dt) * std::abs(want[i]) + s.k * uc * scale +
                 tiny_of(dt) * std::max(1.0, std::abs(x));
    } else {
      // Unrounded, so the bound covers the kernel's own final rounding; but a value beyond
      // the dtype's range must be inf.
      want[i] = std::isinf(round_like(dt, r)) ? round_like(dt, r) : r;
      bound[i] = s.k * uc * scale + 2.0 * tiny_of(dt) * std::max(1.0, std::abs(x));
    }
  }
}

// One case per (op, dtype); layouts and sizes run inside it (SCOPED_TRACE names them), which
// keeps the CTest case count, and so CI's per-process cost, in check.
using UnaryParam = std::tuple<size_t, DType>;

class UnaryFloatTest : public ::testing::TestWithParam<UnaryParam> {};

void unary_float_case(size_t idx, DType dt, LayoutKind layout, size_t n) {
  const UnarySpec& s = kUnary[idx];
  const Shape shape = shape_for(n);
  const Tensor base = random_tensor(shape, dt, 1000 + 37 * idx + n, s.lo, s.hi);
  const Tensor x = with_layout(base, layout);
  const Tensor y = apply_unary(s.op, x, s.f0, s.f1);
  ASSERT_EQ(y.dtype(), dt);
  ASSERT_EQ(y.shape(), shape);
  EXPECT_TRUE(y.is_contiguous());
  const std::vector<double> xv = values(x);
  std::vector<double> want, bound;
  unary_expectation(s, dt, xv, want, bound);
  EXPECT_TRUE(check_elements(xv, values(y), want, bound));
}

TEST_P(UnaryFloatTest, MatchesReference) {
  const auto [idx, dt] = GetParam();
  for (LayoutKind layout : kAllLayouts)
    for (size_t n : kSizes) {
      SCOPED_TRACE(std::string(layout_name(layout)) + " n=" + std::to_string(n));
      unary_float_case(idx, dt, layout, n);
    }
}

std::string unary_name(const ::testing::TestParamInfo<UnaryParam>& info) {
  const auto [idx, dt] = info.param;
  return gtest_name(std::string(op_name(kUnary[idx].op)) + "_" + std::string(dtype_name(dt)));
}

INSTANTIATE_TEST_SUITE_P(
    Elementwise, UnaryFloatTest,
    ::testing::Combine(::testing::Range<size_t>(0, std::size(kUnary)),
                       ::testing::ValuesIn(kFloatTypes)),
    unary_name);

// Every layout and thread count gets the same arithmetic: results are bit-identical.
TEST(ElementwiseUnary, LayoutsAndThreadCountsGiveIdenticalBits) {
  const Shape shape({40, 1500});
  for (const UnarySpec& s : kUnary) {
    for (DType dt : {DType::BF16, DType::F32, DType::F64}) {
      SCOPED_TRACE(std::string(op_name(s.op)) + " " + std::string(dtype_name(dt)));
      const Tensor base = random_tensor(shape, dt, 77, s.lo, s.hi);
      const std::vector<double> ref = values(apply_unary(s.op, base, s.f0, s.f1));
      for (LayoutKind k : {LayoutKind::Transposed, LayoutKind::Narrowed}) {
        const std::vector<double> got = values(apply_unary(s.op, with_layout(base, k), s.f0, s.f1));
        ASSERT_TRUE(check_elements({}, got, ref, std::vector<double>(ref.size(), 0.0)))
            << layout_name(k);
      }
      std::vector<double> one;
      {
        ThreadsGuard guard;
        set_num_threads(1);
        one = values(apply_unary(s.op, base, s.f0, s.f1));
      }
      ASSERT_TRUE(check_elements({}, one, ref, std::vector<double>(ref.size(), 0.0)))
          << "one thread";
    }
  }
}

// NaN, infinities, signed zeros, the edges of the contrib math ranges.
TEST(ElementwiseUnary, SpecialValues) {
  const std::vector<double> specials = {kNaN, kInf, -kInf, 0.0, -0.0, 1.0, -1.0, 1e-30, -1e-30,
                                        80.0, -80.0, 100.0, -110.0, 750.0, -750.0, 1e6, -1e6,
                                        39000.5, -50000.25, 3.0e38};
  for (DType dt : kFloatTypes) {
    const Tensor x = Tensor::from_vector(specials, Shape({specials.size()})).to_dtype(dt);
    const std::vector<double> xv = values(x);
    for (const UnarySpec& s : kUnary) {
      SCOPED_TRACE(std::string(op_name(s.op)) + " " + std::string(dtype_name(dt)));
      std::vector<double> want, bound;
      unary_expectation(s, dt, xv, want, bound);
      std::vector<double> got = values(apply_unary(s.op, x, s.f0, s.f1));
      for (size_t i = 0; i < xv.size(); ++i) {
        // 0 * inf in the reference formula: the limits (-0 for x -> -inf) are not the contract.
        const bool minus_inf_tail = (s.op == OpId::gelu || s.op == OpId::gelu_erf ||
                                     s.op == OpId::silu) && xv[i] == -kInf;
        if (minus_inf_tail) {
          got[i] = want[i] = 0.0;
          bound[i] = 0.0;
        }
      }
      EXPECT_TRUE(check_elements(xv, got, want, bound));
    }
  }
}

// f32 sin/cos near multiples of pi keep their relative accuracy (extended range reduction).
TEST(ElementwiseUnary, SinCosNearZerosOfTheFunction) {
  std::vector<double> xs;
  for (int k = -40; k <= 40; ++k) {
    if (k == 0) continue;
    xs.push_back(static_cast<float>(k * M_PI));
    xs.push_back(static_cast<float>(k * M_PI + M_PI / 2));
  }
  for (DType dt : {DType::F32, DType::F64}) {
    const Tensor x = Tensor::from_vector(xs, Shape({xs.size()})).to_dtype(dt);
    for (const UnarySpec& s : kUnary) {
      if (s.op != OpId::sin && s.op != OpId::cos) continue;
      std::vector<double> want, bound;
      const std::vector<double> xv = values(x);
      unary_expectation(s, dt, xv, want, bound);
      EXPECT_TRUE(check_elements(xv, values(apply_unary(s.op, x, 0, 0)), want, bound))
          << op_name(s.op) << " " << dtype_name(dt);
    }
  }
}

// powf: C99 special cases and negative bases with integer exponents, every float dtype.
TEST(ElementwiseUnary, PowfSpecialCases) {
  const std::vector<double> bases = {-2.0, -0.5, -0.0, 0.0, 0.5, 2.0, 3.0, kInf, -kInf, kNaN, 1.0};
  for (double e : {3.0, 2.0, 0.5, -1.0, -1.5, -3.0, 0.0, 1.0, 7.25}) {
    for (DType dt : kFloatTypes) {
      SCOPED_TRACE("e=" + std::to_string(e) + " " + std::string(dtype_name(dt)));
      const Tensor x = Tensor::from_vector(bases, Shape({bases.size()})).to_dtype(dt);
      const std::vector<double> xv = values(x);
      const UnarySpec s{OpId::powf, 0, 0, e, 0, Scale::Rel, 4, 0};
      std::vector<double> want, bound;
      unary_expectation(s, dt, xv, want, bound);
      const std::vector<double> got = values(x.powf(e));
      EXPECT_TRUE(check_elements(xv, got, want, bound));
      for (size_t i = 0; i < got.size(); ++i) {  // pow(-0, 3) == -0, pow(-0, 2) == +0
        if (want[i] == 0.0) {
          EXPECT_EQ(std::signbit(got[i]), std::signbit(want[i])) << xv[i];
        }
      }
    }
  }
}

// gelu_erf far in the negative tail: the f64 result keeps its relative accuracy (the
// compensated x/sqrt2 and b^2), where a plain erfc(-x/sqrt2) loses ~2b^2 ulp.
TEST(ElementwiseUnary, GeluErfTailIsRelativelyAccurate) {
  std::vector<double> xs;
  for (double x = -37.5; x <= -3.0; x += 0.173) xs.push_back(x);
  const Tensor x = Tensor::from_vector(xs, Shape({xs.size()}));
  const std::vector<double> got = values(x.gelu_erf());
  for (size_t i = 0; i < xs.size(); ++i) {
    const double r = cpu::ref::unary(OpId::gelu_erf, xs[i]);
    EXPECT_LE(std::abs(got[i] - r), 10 * unit_roundoff(DType::F64) * std::abs(r)) << xs[i];
  }
}

// gelu_erf_bwd, (x, g) -> g (Phi(x) + x phi(x)): against a long-double reference rounded once
// to each dtype, on every SIMD target, odd sizes and strided inputs (the same bits); its limits
// beyond |x| = 37 (so +inf -> g, -inf -> 0) and NaN; and against its composed form in f64.
/// Phi(x) + x phi(x), and the size of its terms |Phi| + |x phi| (the sum crosses 0 near
/// x = -0.75, where only an absolute bound on the terms' scale makes sense).
std::pair<long double, long double> gelu_erf_grad_ref(long double x) {
  const long double phi = std::exp(-0.5L * x * x) / std::sqrt(2.0L * 3.14159265358979323846264L);
  const long double cdf = 0.5L * std::erfc(-x / std::sqrt(2.0L));
  return {cdf + x * phi, std::fabs(cdf) + std::fabs(x * phi)};
}

TEST(ElementwiseUnary, GeluErfBwdMatchesReferenceOnEveryDtypeAndTarget) {
  std::vector<double> xs = {0.0, -0.0, 1e-25, -1e-25, 1e-8, 0.25, -0.5, 0.5, 1, -1, 2.5, -3,
                            5, -7.25, 10, -14.5, 20, -30, 36.9, -36.9, 37.5, -37.5, 100, -1e30};
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(-9.0, 9.0);
  while (xs.size() < 1037) xs.push_back(u(rng));
  std::vector<double> gs(xs.size());
  for (double& g : gs) g = u(rng) / 3;
  for_each_target([&](int64_t) {
    for (DType dt : {DType::F64, DType::F32, DType::BF16, DType::F16}) {
      SCOPED_TRACE(dtype_name(dt));
      const Tensor x = Tensor::from_vector(xs, Shape({xs.size()})).to_dtype(dt);
      const Tensor g = Tensor::from_vector(gs, Shape({gs.size()})).to_dtype(dt);
      const std::vector<double> got = values(dispatch1(OpId::gelu_erf_bwd, {x, g}));
      const std::vector<double> xv = values(x), gv = values(g);
      for (size_t i = 0; i < xv.size(); ++i) {
        if (!std::isfinite(xv[i])) continue;  // -1e30 in f16 is -inf: the limits below
        const auto [ref, terms] = gelu_erf_grad_ref(xv[i]);
        const double w = static_cast<double>(static_cast<long double>(gv[i]) * ref);
        // The f64 evaluation is within a few ulp of the terms' scale, whatever |x| (x^2 / 2
        // enters the exp as a double-double; 4.0 ulp the most seen, on every target here; the
        // limit taken beyond |x| = 37 drops values under 1e-293); the other dtypes round that
        // value once more.
        const double u64 = unit_roundoff(DType::F64);
        const double scale = std::abs(gv[i]) * static_cast<double>(terms);
        const double tol = 8 * u64 * scale + 1e-293 +
                           (dt == DType::F64 ? 0.0 : unit_roundoff(dt) * std::abs(w) + tiny_of(dt));
        EXPECT_LE(std::abs(got[i] - w), tol) << "x " << xv[i] << " g " << gv[i];
      }
      // Strided inputs (transposed views) give the contiguous bits.
      const Tensor x2 = x.narrow(0, 0, 1036).reshape({28, 37});
      const Tensor g2 = g.narrow(0, 0, 1036).reshape({28, 37});
      const Tensor xt = x2.t().contiguous().t(), gt = g2.t().contiguous().t();
      EXPECT_EQ(values(dispatch1(OpId::gelu_erf_bwd, {xt, gt})),
                values(dispatch1(OpId::gelu_erf_bwd, {x2, g2})));
      // Limits and NaN.
      const double inf = std::numeric_limits<double>::infinity();
      const Tensor sx = Tensor::from_vector(std::vector<double>{inf, -inf, NAN}, {3}).to_dtype(dt);
      const Tensor sg = Tensor::from_vector(std::vector<double>{0.75, 0.75, 1.0}, {3}).to_dtype(dt);
      const std::vector<double> sv = values(dispatch1(OpId::gelu_erf_bwd, {sx, sg}));
      EXPECT_EQ(sv[0], 0.75);
      EXPECT_EQ(sv[1], 0.0);
      EXPECT_TRUE(std::isnan(sv[2]));
    }
  });
  // The composed form (what a device without the kernel runs) agrees in f64 away from the
  // infinities, where it gives NaN.
  const Tensor x = Tensor::from_vector(xs, Shape({xs.size()}));
  const Tensor g = Tensor::from_vector(gs, Shape({gs.size()}));
  const std::vector<double> k = values(dispatch1(OpId::gelu_erf_bwd, {x, g}));
  std::vector<double> c;
  {
    ComposedOnlyGuard only({OpId::gelu_erf_bwd});
    c = values(dispatch1(OpId::gelu_erf_bwd, {x, g}));
  }
  EXPECT_TRUE(all_close(c, k, 1e-13, 1e-300));
  EXPECT_NE(c, k);  // the guard did reach the composed form (not the same bits everywhere)
}

// Rank 0 (one element, no dims) and empty tensors go through the same kernels.
TEST(ElementwiseUnary, RankZeroAndEmptyTensors) {
  const Tensor s = Tensor::full(Shape(std::vector<size_t>{}), 2.0, DType::F32);
  EXPECT_EQ(s.exp().rank(), 0u);
  EXPECT_NEAR(s.exp().item(), std::exp(2.0), 1e-6);
  EXPECT_EQ((s * s).item(), 4.0);
  EXPECT_EQ(s.lt(s).item(), 0.0);
  const Tensor e = Tensor::zeros(Shape({0, 3}), DType::BF16);
  EXPECT_EQ(e.gelu().shape(), Shape({0, 3}));
  EXPECT_EQ((e + e).shape(), Shape({0, 3}));
  EXPECT_EQ(e.eq(e).dtype(), DType::U8);
}

// ---- unary, integer dtypes -------------------------------------------------------------------

template <class T>
void check_int_unary(const IntUnarySpec& s, const Tensor& x) {
  OpAttrs a;
  a.f0 = s.f0;
  a.f1 = s.f1;
  const Tensor y = apply_unary(s.op, x, s.f0, s.f1);
  ASSERT_EQ(y.dtype(), x.dtype());
  const std::vector<T> xv = x.to_vector<T>();
  const std::vector<T> yv = y.to_vector<T>();
  for (size_t i = 0; i < xv.size(); ++i) {
    ASSERT_EQ(yv[i], cpu::ref::unary_int<T>(s.op, xv[i], a))
        << op_name(s.op) << "(" << +xv[i] << ") at " << i << " f0=" << s.f0 << " f1=" << s.f1;
  }
}

using IntUnaryParam = std::tuple<size_t, DType>;
class UnaryIntTest : public ::testing::TestWithParam<IntUnaryParam> {};

void unary_int_case(size_t idx, DType dt, LayoutKind layout, size_t n) {
  const IntUnarySpec& s = kIntUnary[idx];
  if (s.op == OpId::neg && dt != DType::I64) {
    // neg of an unsigned type is not registered: the registry answers, with an Error.
    EXPECT_FALSE(has_kernel(OpId::neg, Device::cpu(), dt));
    EXPECT_THROW(-random_ints(Shape({3}), dt, 1), Error);
    return;
  }
  const Tensor x = with_layout(random_ints(shape_for(n), dt, 500 + idx + n), layout);
  switch (dt) {
    case DType::U8: check_int_unary<uint8_t>(s, x); break;
    case DType::U32: check_int_unary<uint32_t>(s, x); break;
    default: check_int_unary<int64_t>(s, x); break;
  }
}

TEST_P(UnaryIntTest, MatchesReference) {
  const auto [idx, dt] = GetParam();
  for (LayoutKind layout : kAllLayouts)
    for (size_t n : {size_t{1}, size_t{33}, size_t{4099}}) {
      SCOPED_TRACE(std::string(layout_name(layout)) + " n=" + std::to_string(n));
      unary_int_case(idx, dt, layout, n);
    }
}

std::string int_unary_name(const ::testing::TestParamInfo<IntUnaryParam>& info) {
  const auto [idx, dt] = info.param;
  return gtest_name(std::string(op_name(kIntUnary[idx].op)) + std::to_string(idx) + "_" +
                    std::string(dtype_name(dt)));
}

INSTANTIATE_TEST_SUITE_P(
    Elementwise, UnaryIntTest,
    ::testing::Combine(::testing::Range<size_t>(0, std::size(kIntUnary)),
                       ::testing::ValuesIn(kIntTypes)),
    int_unary_name);

TEST(ElementwiseUnary, FloatOnlyOpsRejectIntegers) {
  for (OpId op : {OpId::exp, OpId::log, OpId::tanh, OpId::gelu, OpId::sqrt, OpId::powf})
    for (DType dt : kIntTypes) EXPECT_FALSE(has_kernel(op, Device::cpu(), dt)) << op_name(op);
  EXPECT_THROW(random_ints(Shape({4}), DType::I64, 3).exp(), Error);
}

// ---- binary ---------------------------------------------------------------------------------

constexpr OpId kBinaryOps[] = {OpId::add, OpId::sub, OpId::mul, OpId::div,
                               OpId::maximum, OpId::minimum, OpId::eq, OpId::ne,
                               OpId::lt, OpId::le, OpId::gt, OpId::ge};

bool is_compare(OpId op) {
  return op == OpId::eq || op == OpId::ne || op == OpId::lt || op == OpId::le || op == OpId::gt ||
         op == OpId::ge;
}

/// An integer partner for a: every third element equals a's (ties for the comparisons), every
/// third is small (zeros and, for i64, negatives: divisors), the rest random.
template <class T> Tensor int_partner(const Tensor& a, uint64_t seed) {
  const std::vector<T> av = a.to_vector<T>();
  std::vector<T> r = random_ints(a.shape(), a.dtype(), seed).to_vector<T>();
  for (size_t i = 0; i < r.size(); ++i) {
    if (i % 3 == 0) r[i] = av[i];
    if (i % 3 == 1) r[i] = static_cast<T>(static_cast<int64_t>(i % 9) - (std::is_signed_v<T> ? 4 : 0));
  }
  return Tensor::from_vector(r, a.shape());
}

/// Operands for a binary test: random values, every third element of b equal to a's (so that
/// comparisons see ties); integer divisors include zeros.
std::pair<Tensor, Tensor> binary_operands(const Shape& s, DType dt, uint64_t seed) {
  switch (dt) {
    case DType::U8: { Tensor a = random_ints(s, dt, seed); return {a, int_partner<uint8_t>(a, seed + 1)}; }
    case DType::U32: { Tensor a = random_ints(s, dt, seed); return {a, int_partner<uint32_t>(a, seed + 1)}; }
    case DType::I64: { Tensor a = random_ints(s, dt, seed); return {a, int_partner<int64_t>(a, seed + 1)}; }
    default: break;
  }
  const Tensor a = random_tensor(s, dt, seed, -3.0, 3.0);
  std::vector<double> av = values(a), bv = values(random_tensor(s, dt, seed + 1, -3.0, 3.0));
  for (size_t i = 0; i < av.size(); i += 3) bv[i] = av[i];
  return {a, Tensor::from_vector(bv, s).to_dtype(dt)};  // dt-representable: converts exactly
}

/// Checks out against the references, element by element (exact for every dtype).
::testing::AssertionResult check_binary(OpId op, DType dt, const Tensor& a, const Tensor& b,
                                        const Tensor& out) {
  if (out.dtype() != (is_compare(op) ? DType::U8 : dt))
    return ::testing::AssertionFailure() << "output dtype " << dtype_name(out.dtype());
  if (out.shape() != a.shape()) return ::testing::AssertionFailure() << "output shape";
  const auto fail = [&](size_t i, auto x, auto y, auto got, auto want) {
    return ::testing::AssertionFailure()
           << op_name(op) << "(" << +x << ", " << +y << ") at " << i << ": got " << +got
           << " want " << +want;
  };
  const auto ints = [&](auto tag) -> ::testing::AssertionResult {
    using T = decltype(tag);
    const std::vector<T> av = a.to_vector<T>(), bv = b.to_vector<T>();
    const std::vector<double> ov = values(out);
    const std::vector<T> ot = is_compare(op) ? std::vector<T>() : out.to_vector<T>();
    for (size_t i = 0; i < av.size(); ++i) {
      const T want = cpu::ref::binary_int<T>(op, av[i], bv[i]);
      const bool ok = is_compare(op) ? ov[i] == static_cast<double>(want) : ot[i] == want;
      if (!ok) return fail(i, av[i], bv[i], is_compare(op) ? ov[i] : static_cast<double>(ot[i]), want);
    }
    return ::testing::AssertionSuccess();
  };
  switch (dt) {
    case DType::U8: return ints(uint8_t{});
    case DType::U32: return ints(uint32_t{});
    case DType::I64: return ints(int64_t{});
    default: break;
  }
  const std::vector<double> av = values(a), bv = values(b), ov = values(out);
  for (size_t i = 0; i < av.size(); ++i) {
    const double r = cpu::ref::binary(op, av[i], bv[i]);
    // Arithmetic: the single rounding of the f32 (f64) result; comparisons: exact 0/1.
    const double want = is_compare(op) ? r : round_like(dt, r);
    const bool ok = (std::isnan(want) && std::isnan(ov[i])) || ov[i] == want;
    if (!ok) return fail(i, av[i], bv[i], ov[i], want);
  }
  return ::testing::AssertionSuccess();
}

using BinaryParam = std::tuple<OpId, DType>;
class BinaryTest : public ::testing::TestWithParam<BinaryParam> {};

void binary_case(OpId op, DType dt, LayoutKind layout, size_t n) {
  const Shape shape = shape_for(n);
  auto [a0, b0] = binary_operands(shape, dt, 2000 + static_cast<uint64_t>(op) * 7 + n);
  // b gets the next layout kind, so the two operands have different stride patterns.
  const LayoutKind other = kAllLayouts[(static_cast<size_t>(layout) + 1) % std::size(kAllLayouts)];
  const Tensor a = with_layout(a0, layout);
  const Tensor b = with_layout(b0, other);
  const Tensor out = apply_binary(op, a, b);
  EXPECT_TRUE(out.is_contiguous());
  EXPECT_TRUE(check_binary(op, dt, a, b, out));
}

TEST_P(BinaryTest, MatchesReference) {
  const auto [op, dt] = GetParam();
  for (LayoutKind layout : kAllLayouts)
    for (size_t n : kSizes) {
      SCOPED_TRACE(std::string(layout_name(layout)) + " n=" + std::to_string(n));
      binary_case(op, dt, layout, n);
    }
}

std::string binary_name(const ::testing::TestParamInfo<BinaryParam>& info) {
  const auto [op, dt] = info.param;
  return gtest_name(std::string(op_name(op)) + "_" + std::string(dtype_name(dt)));
}

INSTANTIATE_TEST_SUITE_P(
    Elementwise, BinaryTest,
    ::testing::Combine(::testing::ValuesIn(kBinaryOps), ::testing::ValuesIn(kAllTypes)),
    binary_name);

// NumPy broadcasting: each shape pair, every dtype, every op; checked against an explicit
// broadcast of the operands (broadcast_as + contiguous, independent of the kernel's strides).
TEST(ElementwiseBinary, BroadcastShapes) {
  const std::vector<std::pair<Shape, Shape>> pairs = {
      {Shape({5, 1, 7}), Shape({1, 3, 7})}, {Shape({33}), Shape({1})},
      {Shape({1}), Shape({33})},            {Shape({4, 1}), Shape({1, 1029})},
      {Shape({2, 3, 4}), Shape({4})},       {Shape({2, 3, 1}), Shape({3, 1000})},
      {Shape({1000, 1}), Shape({1000, 9})}, {Shape({1}), Shape({1})}};
  uint64_t seed = 3000;
  for (const auto& [sa, sb] : pairs) {
    const Shape so = broadcast_shapes(sa, sb, "test");
    for (DType dt : kAllTypes) {
      auto [a, unused_a] = binary_operands(sa, dt, ++seed);
      auto [b, unused_b] = binary_operands(sb, dt, ++seed);
      const Tensor ab = a.broadcast_as(so).contiguous();
      const Tensor bb = b.broadcast_as(so).contiguous();
      for (OpId op : kBinaryOps) {
        SCOPED_TRACE(sa.to_string() + " " + sb.to_string() + " " + std::string(op_name(op)) +
                     " " + std::string(dtype_name(dt)));
        const Tensor out = apply_binary(op, a, b);
        ASSERT_EQ(out.shape(), so);
        EXPECT_TRUE(check_binary(op, dt, ab, bb, out));
      }
    }
  }
}

// Scalar operators: a / s and s / a broadcast a one-element tensor (the SIMD scalar-operand
// paths); a + s, a * s, s - a go through affine.
TEST(ElementwiseBinary, ScalarOperators) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor a = with_layout(random_tensor(Shape({3, 1001}), dt, 9, 0.5, 3.0), LayoutKind::Narrowed);
    const std::vector<double> av = values(a);
    const double s = round_like(dt, 1.3);
    const std::vector<double> q1 = values(a / 1.3), q2 = values(1.3 / a);
    const std::vector<double> p = values(a + 2.5), m = values(a * 0.25), r = values(2.0 - a);
    for (size_t i = 0; i < av.size(); ++i) {
      ASSERT_EQ(q1[i], round_like(dt, av[i] / s)) << i;
      ASSERT_EQ(q2[i], round_like(dt, s / av[i])) << i;
      // affine with exactly representable parameters: a single rounding of the exact value.
      ASSERT_EQ(p[i], round_like(dt, av[i] + 2.5)) << i;
      ASSERT_EQ(m[i], round_like(dt, av[i] * 0.25)) << i;
      ASSERT_EQ(r[i], round_like(dt, 2.0 - av[i])) << i;
    }
  }
}

// A scalar operand travels as the op attribute f0 (no one-element tensor): x.gt(s), x / s,
// s / x, x.maximum(s), m.where_cond(x, s) give the bits of the same op with Tensor::full(s) of
// x's dtype, on every device, dtype and layout; and each is one kernel call, not a fill and the op.
TEST(ElementwiseBinary, ScalarOperandsMatchAFullTensorBitForBit) {
  for (Device dev : test_devices()) {
    for (DType dt : kAllTypes) {
      for (LayoutKind k : {LayoutKind::Contiguous, LayoutKind::Transposed, LayoutKind::Broadcast}) {
        SCOPED_TRACE(dev.to_string() + " " + std::string(dtype_name(dt)) + " " + layout_name(k));
        const bool fl = is_float(dt);
        const Tensor x = with_layout(
            random_tensor(Shape({5, 37}), dt, dev, 71, fl ? -3.0 : 0.0, fl ? 3.0 : 9.0), k);
        const Tensor m = random_tensor(Shape({5, 37}), DType::F32, dev, 72).gt(0.0);
        for (double s : {1.3, -0.0, 2.0, 7.0}) {
          const Tensor f = Tensor::full(Shape({}), s, dt, dev);
          const auto same = [&](const Tensor& got, const Tensor& want, const char* what) {
            ASSERT_EQ(got.shape(), want.shape()) << what;
            ASSERT_EQ(got.dtype(), want.dtype()) << what;
            const Tensor g = got.to_device(Device::cpu()), w = want.to_device(Device::cpu());
            const size_t bytes = g.elem_count() * dtype_size(g.dtype());
            ASSERT_EQ(std::memcmp(g.data_ptr(), w.data_ptr(), bytes), 0)
                << what << " s=" << s;
          };
          same(x.gt(s), x.gt(f), "gt");
          same(x.ge(s), x.ge(f), "ge");
          same(x.lt(s), x.lt(f), "lt");
          same(x.le(s), x.le(f), "le");
          same(x.eq(s), x.eq(f), "eq");
          same(x.ne(s), x.ne(f), "ne");
          same(x.maximum(s), x.maximum(f), "maximum");
          same(x.minimum(s), x.minimum(f), "minimum");
          same(x / s, x / f, "x / s");
          same(s / x, f / x, "s / x");
          same(m.where_cond(x, s), m.where_cond(x, f), "where(m, x, s)");
          same(m.where_cond(s, x), m.where_cond(f, x), "where(m, s, x)");
        }
        const uint64_t before = kernel_calls(dev.kind());
        const Tensor q = x / 3.0;
        EXPECT_EQ(kernel_calls(dev.kind()) - before, 1u) << "x / 3.0 is one kernel call";
      }
    }
  }
}

TEST(ElementwiseBinary, NaNAndInfinities) {
  const std::vector<double> av = {kNaN, 1.0, kNaN, kInf, -kInf, 0.0, -0.0, 2.0, kInf};
  const std::vector<double> bv = {1.0, kNaN, kNaN, kInf, kInf, 0.0, 0.0, -kInf, 1.0};
  for (DType dt : kFloatTypes) {
    const Tensor a = Tensor::from_vector(av, Shape({av.size()})).to_dtype(dt);
    const Tensor b = Tensor::from_vector(bv, Shape({bv.size()})).to_dtype(dt);
    for (OpId op : kBinaryOps) {
      EXPECT_TRUE(check_binary(op, dt, a, b, apply_binary(op, a, b)))
          << op_name(op) << " " << dtype_name(dt);
    }
  }
}

TEST(ElementwiseBinary, IntegerDivisionByZeroGivesZero) {
  const int64_t kMin = std::numeric_limits<int64_t>::min();
  {
    const Tensor a = Tensor::from_vector(std::vector<int64_t>{7, -7, 0, kMin, kMin, 9, -9}, Shape({7}));
    const Tensor b = Tensor::from_vector(std::vector<int64_t>{0, 0, 0, -1, 0, -2, 2}, Shape({7}));
    EXPECT_EQ((a / b).to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 0, kMin, 0, -4, -4}));
  }
  {
    const Tensor a = Tensor::from_vector(std::vector<uint8_t>{7, 255, 0, 200}, Shape({4}));
    const Tensor b = Tensor::from_vector(std::vector<uint8_t>{0, 0, 0, 3}, Shape({4}));
    EXPECT_EQ((a / b).to_vector<uint8_t>(), (std::vector<uint8_t>{0, 0, 0, 66}));
  }
  {
    const Tensor a = Tensor::from_vector(std::vector<uint32_t>{7, 4000000000u, 5}, Shape({3}));
    const Tensor b = Tensor::from_vector(std::vector<uint32_t>{0, 0, 2}, Shape({3}));
    EXPECT_EQ((a / b).to_vector<uint32_t>(), (std::vector<uint32_t>{0, 0, 2}));
  }
  // A zero divisor broadcast over a whole run (the scalar path).
  const Tensor a = Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 4, 5}, Shape({5}));
  const Tensor z = Tensor::from_vector(std::vector<int64_t>{0}, Shape({1}));
  EXPECT_EQ((a / z).to_vector<int64_t>(), std::vector<int64_t>(5, 0));
}

TEST(ElementwiseBinary, IntegerArithmeticWraps) {
  const Tensor a = Tensor::from_vector(std::vector<uint8_t>{250, 3, 16}, Shape({3}));
  const Tensor b = Tensor::from_vector(std::vector<uint8_t>{10, 5, 17}, Shape({3}));
  EXPECT_EQ((a + b).to_vector<uint8_t>(), (std::vector<uint8_t>{4, 8, 33}));
  EXPECT_EQ((a - b).to_vector<uint8_t>(), (std::vector<uint8_t>{240, 254, 255}));
  EXPECT_EQ((a * b).to_vector<uint8_t>(), (std::vector<uint8_t>{196, 15, 16}));
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  const Tensor c = Tensor::from_vector(std::vector<int64_t>{kMax, -kMax}, Shape({2}));
  const Tensor one = Tensor::from_vector(std::vector<int64_t>{1}, Shape({1}));
  EXPECT_EQ((c + one).to_vector<int64_t>(),
            (std::vector<int64_t>{std::numeric_limits<int64_t>::min(), -kMax + 1}));
}

// A large contiguous f32 add (many blocks over the thread pool), against the reference.
TEST(ElementwiseBinary, LargeContiguousAddIsExact) {
  const Shape s({1 << 21});
  const Tensor a = random_tensor(s, DType::F32, 11, -1e3, 1e3);
  const Tensor b = random_tensor(s, DType::F32, 12, -1e-3, 1e-3);
  EXPECT_TRUE(check_binary(OpId::add, DType::F32, a, b, a + b));
}

// ---- every Highway target ---------------------------------------------------------------

// The tests above run on the best target of this CPU; these repeat the core checks with
// dispatch restricted to each compiled target in turn (SSE4 and the scalar target have no FMA
// and different tails), so every path the library may take elsewhere is checked here.
TEST(ElementwiseTargets, EveryTargetMatchesReference) {
  for_each_target([&](int64_t) {
    for (DType dt : kFloatTypes) {
      for (size_t idx = 0; idx < std::size(kUnary); ++idx) {
        const UnarySpec& s = kUnary[idx];
        SCOPED_TRACE(std::string(op_name(s.op)) + " " + std::string(dtype_name(dt)));
        for (LayoutKind k : {LayoutKind::Contiguous, LayoutKind::Transposed}) {
          const Tensor x = with_layout(random_tensor(Shape({33, 125}), dt, 40 + idx, s.lo, s.hi), k);
          const std::vector<double> xv = values(x);
          std::vector<double> want, bound;
          unary_expectation(s, dt, xv, want, bound);
          EXPECT_TRUE(check_elements(xv, values(apply_unary(s.op, x, s.f0, s.f1)), want, bound));
        }
      }
    }
    for (DType dt : kAllTypes) {
      for (OpId op : kBinaryOps) {
        SCOPED_TRACE(std::string(op_name(op)) + " " + std::string(dtype_name(dt)));
        auto [a, b] = binary_operands(Shape({33, 125}), dt, 60);
        EXPECT_TRUE(check_binary(op, dt, a, b, apply_binary(op, a, b)));
        const Tensor s = b.narrow(0, 0, 1).narrow(1, 0, 1);  // the scalar-operand paths
        EXPECT_TRUE(check_binary(op, dt, a, s.broadcast_as(a.shape()).contiguous(), apply_binary(op, a, s)));
        EXPECT_TRUE(check_binary(op, dt, s.broadcast_as(a.shape()).contiguous(), a, apply_binary(op, s, a)));
      }
    }
  });
}

// ---- where_cond -----------------------------------------------------------------------------

TEST(ElementwiseWhere, SelectsPerElementForEveryDtypeAndLayout) {
  for (DType dt : kAllTypes) {
    for (LayoutKind k : kAllLayouts) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + layout_name(k));
      const Shape s({33, 41});
      std::mt19937_64 rng(5);
      std::vector<uint8_t> mv(s.elem_count());
      for (auto& m : mv) m = (rng() % 3 == 0) ? 0 : static_cast<uint8_t>(1 + rng() % 255);
      const Tensor m = with_layout(Tensor::from_vector(mv, s), k);
      const Tensor t = with_layout(is_float(dt) ? random_tensor(s, dt, 6) : random_ints(s, dt, 6),
                                   kAllLayouts[(static_cast<size_t>(k) + 1) % 4]);
      const Tensor f = with_layout(is_float(dt) ? random_tensor(s, dt, 7) : random_ints(s, dt, 7),
                                   kAllLayouts[(static_cast<size_t>(k) + 2) % 4]);
      const Tensor out = m.where_cond(t, f);
      ASSERT_EQ(out.dtype(), dt);
      ASSERT_EQ(out.shape(), s);
      // Compare in the value type through doubles, except i64 (beyond 2^53): through int64.
      if (dt == DType::I64) {
        const auto tv = t.to_vector<int64_t>(), fv = f.to_vector<int64_t>(), ov = out.to_vector<int64_t>();
        const auto mvv = m.to_vector<uint8_t>();
        for (size_t i = 0; i < ov.size(); ++i) ASSERT_EQ(ov[i], mvv[i] ? tv[i] : fv[i]) << i;
      } else {
        const auto tv = values(t), fv = values(f), ov = values(out), mvv = values(m);
        for (size_t i = 0; i < ov.size(); ++i)
          ASSERT_EQ(ov[i], cpu::ref::where_cond(mvv[i], tv[i], fv[i])) << i;
      }
    }
  }
}

TEST(ElementwiseWhere, Broadcasts) {
  const Tensor m = Tensor::from_vector(std::vector<uint8_t>{1, 0, 1, 0}, Shape({4, 1}));
  const Tensor t = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5}, Shape({1, 5}));
  const Tensor f = Tensor::from_vector(std::vector<float>{-1}, Shape({1}));
  const Tensor out = m.where_cond(t, f);
  ASSERT_EQ(out.shape(), Shape({4, 5}));
  const std::vector<float> ov = out.to_vector<float>();
  for (size_t i = 0; i < 4; ++i)
    for (size_t j = 0; j < 5; ++j)
      EXPECT_EQ(ov[i * 5 + j], (i % 2 == 0) ? static_cast<float>(j + 1) : -1.0f) << i << "," << j;
}

// Comparisons produce a u8 mask that where_cond consumes: relu written as a select.
TEST(ElementwiseWhere, ComposesWithComparisons) {
  const Tensor x = random_tensor(Shape({1000}), DType::BF16, 8);
  const Tensor zero = Tensor::zeros(Shape({1}), DType::BF16);
  const Tensor y = x.gt(zero).where_cond(x, zero);
  EXPECT_EQ(values(y), values(x.relu()));
}

// ---- mul_add --------------------------------------------------------------------------------

/// out against the fused multiply-add in the compute type (f32 for the half types, then one
/// rounding to the half type; f64 for f64), element by element, exactly.
::testing::AssertionResult check_mul_add(DType dt, const Tensor& a, const Tensor& b,
                                         const Tensor& c, const Tensor& out) {
  if (out.dtype() != dt) return ::testing::AssertionFailure() << "dtype " << dtype_name(out.dtype());
  const Shape& s = out.shape();
  const std::vector<double> av = values(a.broadcast_as(s)), bv = values(b.broadcast_as(s)),
                            cv = values(c.broadcast_as(s)), ov = values(out);
  for (size_t i = 0; i < ov.size(); ++i) {
    const double want =
        dt == DType::F64
            ? cpu::ref::mul_add(av[i], bv[i], cv[i])
            : round_like(dt, cpu::ref::mul_add(static_cast<float>(av[i]), static_cast<float>(bv[i]),
                                               static_cast<float>(cv[i])));
    if (!((std::isnan(want) && std::isnan(ov[i])) || ov[i] == want))
      return ::testing::AssertionFailure() << "mul_add(" << av[i] << ", " << bv[i] << ", " << cv[i]
                                           << ") at " << i << ": got " << ov[i] << " want " << want;
  }
  return ::testing::AssertionSuccess();
}

TEST(ElementwiseMulAdd, MatchesReferenceForEveryDtypeLayoutAndSize) {
  for (DType dt : kFloatTypes)
    for (size_t li = 0; li < std::size(kAllLayouts); ++li)
      for (size_t n : kSizes) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + layout_name(kAllLayouts[li]) + " n=" +
                     std::to_string(n));
        const Shape shape = shape_for(n);
        const auto lay = [&](size_t k) { return kAllLayouts[(li + k) % std::size(kAllLayouts)]; };
        const Tensor a = with_layout(random_tensor(shape, dt, 7000 + n, -3.0, 3.0), lay(0));
        const Tensor b = with_layout(random_tensor(shape, dt, 7001 + n, -3.0, 3.0), lay(1));
        const Tensor c = with_layout(random_tensor(shape, dt, 7002 + n, -3.0, 3.0), lay(2));
        const Tensor out = a.mul_add(b, c);
        EXPECT_TRUE(out.is_contiguous());
        EXPECT_TRUE(check_mul_add(dt, a, b, c, out));
      }
}

// Every operand may be a broadcast scalar along the run (stride 0) or a full run.
TEST(ElementwiseMulAdd, Broadcasts) {
  const std::vector<std::array<Shape, 3>> cases = {
      {Shape({1000, 9}), Shape({1000, 1}), Shape({1, 9})},
      {Shape({33}), Shape({1}), Shape({1})},
      {Shape({1}), Shape({33}), Shape({1})},
      {Shape({1}), Shape({1}), Shape({33})},
      {Shape({4, 1, 1029}), Shape({3, 1}), Shape({1029})},
      {Shape({2, 3, 1}), Shape({3, 1000}), Shape({2, 1, 1})}};
  uint64_t seed = 7100;
  for (const auto& [sa, sb, sc] : cases)
    for (DType dt : kFloatTypes) {
      SCOPED_TRACE(sa.to_string() + " " + sb.to_string() + " " + sc.to_string() + " " +
                   std::string(dtype_name(dt)));
      const Tensor a = random_tensor(sa, dt, ++seed, -3.0, 3.0);
      const Tensor b = random_tensor(sb, dt, ++seed, -3.0, 3.0);
      const Tensor c = random_tensor(sc, dt, ++seed, -3.0, 3.0);
      const Tensor out = a.mul_add(b, c);
      ASSERT_EQ(out.shape(), broadcast_shapes(broadcast_shapes(sa, sb, "t"), sc, "t"));
      EXPECT_TRUE(check_mul_add(dt, a, b, c, out));
    }
}

// One rounding on every Highway target (SSE4 and the scalar target have no FMA instruction):
// (1 + e)^2 - (1 + 2e) = e^2 is exact fused and 0 with the product rounded first.
TEST(ElementwiseMulAdd, RoundsOnceOnEveryTarget) {
  for_each_target([&](int64_t) {
    for (const auto& [dt, e] : {std::pair{DType::F32, 0x1p-12}, std::pair{DType::F64, 0x1p-27}}) {
      SCOPED_TRACE(dtype_name(dt));
      const Tensor a = Tensor::full(Shape({37}), 1.0 + e, dt, Device::cpu());
      const Tensor c = Tensor::full(Shape({37}), -(1.0 + 2.0 * e), dt, Device::cpu());
      for (double v : values(a.mul_add(a, c))) ASSERT_EQ(v, e * e);
    }
    for (DType dt : kFloatTypes) {
      SCOPED_TRACE(dtype_name(dt));
      const Tensor a = random_tensor(Shape({33, 125}), dt, 7200, -3.0, 3.0);
      const Tensor b = random_tensor(Shape({33, 125}), dt, 7201, -3.0, 3.0);
      const Tensor c = random_tensor(Shape({125}), dt, 7202, -3.0, 3.0);
      EXPECT_TRUE(check_mul_add(dt, a, b, c, a.mul_add(b, c)));
      const Tensor col = c.unsqueeze(-1);  // (125, 1): a scalar per run of the transposed views
      EXPECT_TRUE(check_mul_add(dt, a.t(), b.t(), col, a.t().mul_add(b.t(), col)));
    }
  });
}

TEST(ElementwiseMulAdd, BadInputNamesTheOpShapesAndDtypes) {
  const auto message = [](const auto& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const Tensor a = random_tensor(Shape({3, 4}), DType::F32, 1);
  const Tensor h = random_tensor(Shape({3, 4}), DType::BF16, 2);
  const Tensor i = random_ints(Shape({3, 4}), DType::I64, 3);
  std::string m = message([&] { (void)a.mul_add(h, a); });
  EXPECT_NE(m.find("mul_add"), std::string::npos) << m;
  EXPECT_NE(m.find("bf16"), std::string::npos) << m;
  m = message([&] { (void)i.mul_add(i, i); });
  EXPECT_NE(m.find("mul_add"), std::string::npos) << m;
  EXPECT_NE(m.find("i64"), std::string::npos) << m;
  m = message([&] { (void)a.mul_add(a, random_tensor(Shape({5}), DType::F32, 4)); });
  EXPECT_NE(m.find("mul_add"), std::string::npos) << m;
  EXPECT_NE(m.find("(5)"), std::string::npos) << m;
}

}  // namespace
}  // namespace taper::testing
