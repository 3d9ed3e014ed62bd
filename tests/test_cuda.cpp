// test_cuda.cpp: the CUDA conformance suite: every op of the registry run on Device::cuda(0)
// against the CPU computing the same thing on the same inputs.
//
// What it is: inputs made on the CPU (random_tensor, fixed seeds; never all zeros), moved to the
// GPU; a strided layout is built on both devices by moving the contiguous storage tensor and
// applying the same view op on each side (`on_both`: to_device of a view would give a contiguous
// copy, and the GPU kernels would never see the strides). Then the op runs on both devices and
// the GPU result is compared with the CPU result. Every suite is named Cuda* (scripts/gpu_run.sh
// runs --gtest_filter='Cuda*'); every test skips where no CUDA device is present, but
// CudaCoverage's, which read the registry (the CUDA kernels are registered wherever the backend is
// built) and so run in CI too.
// What it is not: a test of the CPU kernels against references (the other suites do that); the
// CPU is the yardstick here.
//
// Comparisons:
// - bit for bit (raw bytes of the same dtype; a NaN matches any NaN, since payloads are no part
//   of the contract except where `copy` moves bits, compared with payloads): neg abs sqr relu
//   sqrt recip affine clamp, add sub mul div maximum minimum, the comparisons, where_cond,
//   mul_add, every integer op, copy, to_dtype (all 49 pairs), fill, arange, rand_uniform,
//   rand_normal for bf16/f16/f32, max min (there -0 also matches +0: cuda/reduce.cu documents
//   that the CPU's SIMD max may keep either zero) argmax argmin, index_select gather cat narrow
//   narrow_bwd, scatter_add (cuda/index.cu adds in source order in the CPU's precision, so even
//   random floats with 100000 rows on one index give the CPU's bits), sums of small integers
//   (exact in any order, so the order of accumulation cannot matter), matmul with k == 0, and
//   adamw_step (its CUDA kernel states the CPU's operation order).
// - the transcendental unary ops within k units of the compute type's unit roundoff u_c (2^-24
//   for bf16/f16/f32, 2^-53 for f64), relative to max(|cpu|, |gpu|) (gelu: times 1 + |2z|, the
//   condition number of its sigmoid factor; see test_elementwise.cpp), plus 2 subnormal steps
//   (times max(1, |x|)); for bf16/f16 one ulp of the half type more (both devices compute in f32
//   and round once, and two f32 values a few u_c apart may round to neighbouring half values).
//   k (k_dev in tests/unary_cases.h) is the CPU's own bound against the long-double reference
//   (test_elementwise.cpp) plus the CUDA libdevice maximum error (CUDA Programming Guide,
//   1 ulp = 2 u_c), rounded up:
//
//     op        k (u_c)   why
//     exp       8         CPU 4 + expf 2 ulp (exp f64 1 ulp)
//     log       8         CPU 4 + logf 1 ulp (log f64 1 ulp), headroom
//     rsqrt     4         CPU 3 + 1/sqrt, two IEEE roundings on the GPU
//     tanh      12        CPU 8 + tanhf 2 ulp
//     sigmoid   16        CPU 8 + exp 2 ulp and the division's roundings
//     silu      20        as sigmoid, one product more
//     gelu      16        CPU 6 + the sigmoid form; scale |y| (1 + |2z|)
//     gelu_erf  12        CPU 10 + the GPU's f64 erfcx algorithm (about 1 u_c); bf16/f16
//                         compute in f32 with erfcf, inside the half types' one-ulp term
//     sin, cos  12        CPU 6 + sinf/cosf 2 ulp (f64 2 ulp)
//     powf      8         CPU 4 + f32: pow in f64 rounded once; f64: pow 2 ulp
//
// - randn f64: within 4 ulp of |x - mean| + |mean| (Box-Muller's log, sin and cos are each
//   device's libm: glibc under 1 ulp, CUDA's log 1 ulp and sin/cos 2 ulp; their worst cases add
//   to about 4.5 ulp, a coincidence no sample here reaches; most values are bit-identical).
// - sums: |gpu - ref| <= u_dt |ref| + 2 (n + 4) u_acc sum|x|, ref and sum|x| the CPU's f64 sums
//   of the same values, n the reduced length, u_acc the accumulator's unit roundoff (f32 for the
//   half types): the bound of any summation order, for both devices; the exact integer sums and
//   the determinism tests (twice the same bits) are the tight checks.
// - matmul: |gpu - cpu| <= 4 k u_c (|a| |b|) (+ one ulp of a half type): twice gamma_k for each
//   device (|a| |b| computed on the CPU in f64); TF32 is switched off (its 2^-11 products would
//   fail this by orders of magnitude).
// - the fused ops (CUDA runs their composed forms) against the CPU fused kernels with
//   test_fused.cpp's and test_fused_grad.cpp's tolerances for fused vs composed: forward f64
//   1e-10 and f32 1e-5 relative to the rounding-floor scale, bf16/f16 one ulp + 64 u_c scale;
//   also against the f64 reference at the rounding floor (ulp/2 + 64 u_c scale). Backward: f64
//   1e-10, f32 1e-5 relative; bf16/f16 at the rounding floor of the f64 gradient (1.01 u
//   relative + 1e-2 u max|ref|). softmax_last_dim_bwd ops: 1e-12 / 1e-5 / 1e-2 (1 + |ref|).
// - gradients: grad_check's f64 central differences (tol 1e-6) of functions that move their CPU
//   inputs to the GPU, compute there and move the result back (to_device is differentiable, so
//   each case also sends a gradient across devices).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "tests/ref/copy_cast_ref.h"
#include "tests/fused_cases.h"
#include "tests/ref/fused_ref.h"
#include "tests/test_util.h"
#include "tests/unary_cases.h"

namespace taper::testing {
namespace {

const Device kCpu = Device::cpu();
constexpr Device kGpu = Device::cuda(0);

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

constexpr DType kFloatTypes[] = {DType::BF16, DType::F16, DType::F32, DType::F64};
constexpr DType kIntTypes[] = {DType::U8, DType::U32, DType::I64};
constexpr DType kAllTypes[] = {DType::U8,  DType::U32, DType::I64, DType::BF16,
                               DType::F16, DType::F32, DType::F64};

// ---- fixtures: every test skips without a GPU, but CudaCoverage's -----------------------------

template <class Base> class OnCuda : public Base {
 protected:
  void SetUp() override {
    if (!device_available(DeviceKind::Cuda)) GTEST_SKIP() << "no CUDA device: CUDA tests skipped";
  }
};
template <class P> using CudaParamTest = OnCuda<::testing::TestWithParam<P>>;

class CudaCoverage : public ::testing::Test {};  // needs no device
class CudaElementwise : public OnCuda<::testing::Test> {};
class CudaCopyCast : public OnCuda<::testing::Test> {};
class CudaReduce : public OnCuda<::testing::Test> {};
class CudaMatmul : public OnCuda<::testing::Test> {};
class CudaIndex : public OnCuda<::testing::Test> {};
class CudaFused : public OnCuda<::testing::Test> {};
class CudaDevices : public OnCuda<::testing::Test> {};
class CudaOptim : public OnCuda<::testing::Test> {};
class CudaLarge : public OnCuda<::testing::Test> {};

// ---- moving, views on both devices, comparisons ------------------------------------------------

Tensor to_gpu(const Tensor& t) { return t.to_device(kGpu); }
Tensor to_cpu(const Tensor& t) { return t.to_device(kCpu); }

/// One tensor held the same way (shape, strides, offset) on the CPU and on the GPU.
struct Both {
  Tensor cpu, gpu;
};

using ViewFn = std::function<Tensor(const Tensor&)>;

/// `view` applied to the contiguous CPU tensor `storage` and to its copy on the GPU.
Both make_both(const Tensor& storage, const ViewFn& view) {
  NoGradGuard ng;
  const Tensor s = storage.contiguous();
  Both b{view(s), view(to_gpu(s))};
  EXPECT_EQ(b.gpu.device(), kGpu);
  // Strides of size-1 dims never matter (and a contiguous tensor may carry any there).
  for (size_t d = 0; d < b.cpu.rank(); ++d) {
    if (b.cpu.dim(d) > 1) {
      EXPECT_EQ(b.gpu.strides()[d], b.cpu.strides()[d]) << "the view differs between the devices";
    }
  }
  EXPECT_EQ(b.gpu.layout().offset, b.cpu.layout().offset);
  return b;
}

/// t's values held with layout k on both devices: the views of with_layout (test_util.h), built
/// from the same storage tensor on each side. Rank 0, and Broadcast of a tensor whose first dim
/// is 0 (it has no first row), stay contiguous.
Both on_both(const Tensor& t, LayoutKind k) {
  NoGradGuard ng;
  const Tensor c = t.contiguous();
  const auto same = [](const Tensor& x) { return x; };
  if (t.rank() == 0) return make_both(c, same);
  switch (k) {
    case LayoutKind::Contiguous:
      return make_both(c, same);
    case LayoutKind::Transposed:
      if (t.rank() >= 2)
        return make_both(c.transpose(-1, -2).contiguous(),
                         [](const Tensor& x) { return x.transpose(-1, -2); });
      [[fallthrough]];
    case LayoutKind::Narrowed: {
      std::vector<size_t> pad1 = t.dims(), pad2 = t.dims();
      pad1.back() = 1;
      pad2.back() = 2;
      const Tensor big = Tensor::cat({Tensor::full(Shape(pad1), 7.0, t.dtype()), c,
                                      Tensor::full(Shape(pad2), 7.0, t.dtype())},
                                     -1);
      const size_t n = t.dims().back();
      return make_both(big, [n](const Tensor& x) { return x.narrow(-1, 1, n); });
    }
    case LayoutKind::Broadcast: {
      if (t.dim(0) == 0) return make_both(c, same);
      const Shape s = t.shape();
      return make_both(c.narrow(0, 0, 1).contiguous(),
                       [s](const Tensor& x) { return x.broadcast_as(s); });
    }
  }
  return make_both(c, same);
}

/// The value of one element of dtype dt stored at p, as double.
double value_at(DType dt, const unsigned char* p) {
  return visit_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    T v;
    std::memcpy(&v, p, sizeof(T));
    return static_cast<double>(v);
  });
}

std::string describe(DType dt, const unsigned char* p) {
  uint64_t bits = 0;
  std::memcpy(&bits, p, dtype_size(dt));
  char buf[64];
  std::snprintf(buf, sizeof buf, " (bits 0x%llx)", static_cast<unsigned long long>(bits));
  std::string s;
  if (dt == DType::I64) {
    int64_t v;
    std::memcpy(&v, p, 8);
    s = std::to_string(v);
  } else {
    char vb[40];
    std::snprintf(vb, sizeof vb, "%.17g", value_at(dt, p));
    s = vb;
  }
  return s + buf;
}

/// How same_bits treats the float values whose bits may legitimately differ.
enum class Cmp {
  Bits,    ///< every byte, NaN payloads included (copy moves bits)
  NanAny,  ///< every byte, but a NaN matches any NaN (payloads are no part of the contract)
  Value,   ///< NanAny, and -0 matches +0 (the sign of a zero max/min, see cuda/reduce.cu)
};

/// got (a GPU result) equals want (the CPU's) bit for bit: same dtype and shape, the same bytes
/// per element, up to `cmp`.
::testing::AssertionResult same_bits(const Tensor& got, const Tensor& want, Cmp cmp = Cmp::NanAny) {
  if (got.dtype() != want.dtype())
    return ::testing::AssertionFailure()
           << "dtype " << dtype_name(got.dtype()) << " vs " << dtype_name(want.dtype());
  if (got.shape() != want.shape())
    return ::testing::AssertionFailure()
           << "shape " << got.shape().to_string() << " vs " << want.shape().to_string();
  const Tensor g = to_cpu(got).contiguous(), w = to_cpu(want).contiguous();
  const DType dt = g.dtype();
  const size_t n = g.elem_count(), es = dtype_size(dt);
  if (n == 0) return ::testing::AssertionSuccess();
  const auto* pg = static_cast<const unsigned char*>(g.data_ptr());
  const auto* pw = static_cast<const unsigned char*>(w.data_ptr());
  if (std::memcmp(pg, pw, n * es) == 0) return ::testing::AssertionSuccess();
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(pg + i * es, pw + i * es, es) == 0) continue;
    if (cmp != Cmp::Bits && is_float(dt)) {
      const double a = value_at(dt, pg + i * es), b = value_at(dt, pw + i * es);
      if (std::isnan(a) && std::isnan(b)) continue;
      if (cmp == Cmp::Value && a == b) continue;
    }
    if (bad++ == 0) first = i;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << n << " " << dtype_name(dt) << " elements differ; first at " << first
         << ": gpu " << describe(dt, pg + first * es) << ", cpu " << describe(dt, pw + first * es);
}

/// Element i passes when got == want (NaN matching NaN, an infinity the same infinity) or, both
/// finite, |got - want| <= bound[i]. `in`: the inputs, named in the message.
::testing::AssertionResult within(const std::vector<double>& got, const std::vector<double>& want,
                                  const std::vector<double>& bound,
                                  const std::vector<double>& in = {}) {
  if (got.size() != want.size() || bound.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  size_t bad = 0, first = 0;
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    bool ok;
    double ratio = 0;
    if (std::isnan(g) || std::isnan(w)) {
      ok = std::isnan(g) && std::isnan(w);
    } else if (std::isinf(g) || std::isinf(w)) {
      ok = g == w;
    } else {
      const double err = std::abs(g - w);
      ok = err <= bound[i];
      ratio = bound[i] > 0 ? err / bound[i] : (err > 0 ? 1e300 : 0);
    }
    if (!ok) ratio = std::max(ratio, 1e300);
    if (ratio > worst) worst = ratio, worst_i = i;
    if (!ok && bad++ == 0) first = i;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  auto f = ::testing::AssertionFailure();
  f << bad << " of " << got.size() << " elements outside the bound; first at " << first;
  if (first < in.size()) f << " (input " << in[first] << ")";
  f << ": gpu " << got[first] << " cpu " << want[first] << " bound " << bound[first];
  f << "; worst at " << worst_i << ": gpu " << got[worst_i] << " cpu " << want[worst_i]
    << " bound " << bound[worst_i];
  return f;
}

/// A GPU result with the CPU result's dtype and shape, contiguous, on the GPU.
::testing::AssertionResult gpu_result(const Tensor& g, const Tensor& c) {
  if (g.device() != kGpu) return ::testing::AssertionFailure() << "on " << g.device().to_string();
  if (g.dtype() != c.dtype())
    return ::testing::AssertionFailure()
           << "dtype " << dtype_name(g.dtype()) << " vs " << dtype_name(c.dtype());
  if (g.shape() != c.shape())
    return ::testing::AssertionFailure()
           << "shape " << g.shape().to_string() << " vs " << c.shape().to_string();
  if (!g.is_contiguous()) return ::testing::AssertionFailure() << "not contiguous";
  return ::testing::AssertionSuccess();
}

/// Random values of any dtype: floats uniform in [lo, hi), integers from random_ints.
Tensor random_any(const Shape& s, DType dt, uint64_t seed, double lo = -2.0, double hi = 2.0) {
  return is_float(dt) ? random_tensor(s, dt, seed, lo, hi) : random_ints(s, dt, seed);
}

// The shapes of the elementwise cases: rank 0, empty, one element, odd sizes, rank 4.
const std::vector<Shape>& elementwise_shapes() {
  static const std::vector<Shape> s = {Shape(std::vector<size_t>{}), Shape({0, 5}), Shape({1}),
                                       Shape({7}), Shape({3, 11}), Shape({257, 131}),
                                       Shape({2, 3, 4, 5})};
  return s;
}

// ---- unary -------------------------------------------------------------------------------------

/// Per-element bounds of a transcendental op's |gpu - cpu| (the file header's table).
std::vector<double> unary_bounds(const UnarySpec& s, DType dt, const std::vector<double>& x,
                                 const std::vector<double>& g, const std::vector<double>& c) {
  std::vector<double> b(x.size(), 0.0);
  if (s.k_dev == 0) return b;
  for (size_t i = 0; i < x.size(); ++i) {
    const double m = std::max(std::abs(g[i]), std::abs(c[i]));
    double scale = m;
    if (s.scale == Scale::Gelu) {
      const double z = 0.7978845608028654 * (x[i] + 0.044715 * x[i] * x[i] * x[i]);
      scale = m * (1.0 + std::abs(2.0 * z));
    }
    b[i] = s.k_dev * compute_u(dt) * scale + 2.0 * tiny_of(dt) * std::max(1.0, std::abs(x[i]));
    if (is_half(dt)) b[i] += ulp_at(dt, m);
    if (std::isnan(b[i])) b[i] = 0.0;  // 0 * inf (both results 0 at x = ±inf): exact
  }
  return b;
}

using UnaryParam = std::tuple<size_t, DType>;
class CudaUnaryFloat : public CudaParamTest<UnaryParam> {};

TEST_P(CudaUnaryFloat, MatchesCpuOnEveryLayoutAndSize) {
  const auto [idx, dt] = GetParam();
  const UnarySpec& s = kUnary[idx];
  if (!has_kernel(s.op, kCpu, dt)) GTEST_SKIP() << "no CPU kernel";
  ASSERT_TRUE(has_kernel(s.op, kGpu, dt)) << "the CPU serves " << op_name(s.op) << " "
                                          << dtype_name(dt) << ", CUDA does not";
  uint64_t seed = 1000 + 97 * idx;
  for (const Shape& shape : elementwise_shapes())
    for (LayoutKind k : kAllLayouts) {
      SCOPED_TRACE(shape.to_string() + " " + layout_name(k));
      const Both x = on_both(random_tensor(shape, dt, ++seed, s.lo, s.hi), k);
      const Tensor yc = apply_unary(s.op, x.cpu, s.f0, s.f1);
      const Tensor yg = apply_unary(s.op, x.gpu, s.f0, s.f1);
      ASSERT_TRUE(gpu_result(yg, yc));
      if (s.k_dev == 0) {
        EXPECT_TRUE(same_bits(yg, yc));
      } else {
        const std::vector<double> xv = values(x.cpu), gv = values(yg), cv = values(yc);
        EXPECT_TRUE(within(gv, cv, unary_bounds(s, dt, xv, gv, cv), xv));
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaUnaryFloat,
                         ::testing::Combine(::testing::Range<size_t>(0, std::size(kUnary)),
                                            ::testing::ValuesIn(kFloatTypes)),
                         [](const ::testing::TestParamInfo<UnaryParam>& i) {
                           return gtest_name(std::string(op_name(kUnary[std::get<0>(i.param)].op)) +
                                             "_" + std::string(dtype_name(std::get<1>(i.param))));
                         });

class CudaUnaryInt : public CudaParamTest<UnaryParam> {};

TEST_P(CudaUnaryInt, MatchesCpuBitForBit) {
  const auto [idx, dt] = GetParam();
  const IntUnarySpec& s = kIntUnary[idx];
  if (!has_kernel(s.op, kCpu, dt)) GTEST_SKIP() << "no CPU kernel";
  ASSERT_TRUE(has_kernel(s.op, kGpu, dt)) << "the CPU serves " << op_name(s.op) << " "
                                          << dtype_name(dt) << ", CUDA does not";
  uint64_t seed = 3000 + 31 * idx;
  for (const Shape& shape : elementwise_shapes())
    for (LayoutKind k : kAllLayouts) {
      SCOPED_TRACE(shape.to_string() + " " + layout_name(k));
      const Both x = on_both(random_ints(shape, dt, ++seed), k);
      const Tensor yc = apply_unary(s.op, x.cpu, s.f0, s.f1);
      const Tensor yg = apply_unary(s.op, x.gpu, s.f0, s.f1);
      ASSERT_TRUE(gpu_result(yg, yc));
      EXPECT_TRUE(same_bits(yg, yc));
    }
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaUnaryInt,
                         ::testing::Combine(::testing::Range<size_t>(0, std::size(kIntUnary)),
                                            ::testing::ValuesIn(kIntTypes)),
                         [](const ::testing::TestParamInfo<UnaryParam>& i) {
                           const size_t idx = std::get<0>(i.param);
                           return gtest_name(std::string(op_name(kIntUnary[idx].op)) +
                                             std::to_string(idx) + "_" +
                                             std::string(dtype_name(std::get<1>(i.param))));
                         });

// gelu_erf_bwd (GELU's backward in one pass; f64 inside for f32 and f64, f32 with erfcf for
// bf16/f16): the GPU's values are the CPU kernel's up to one rounding of the dtype (the f64 exp
// and erfc differ in the last bits; the half types' f32 path is far inside one half-type ulp),
// strided inputs included, and the limits at +-inf and NaN are the same.
TEST_F(CudaElementwise, GeluErfBwdMatchesTheCpuKernel) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = random_tensor(Shape({33, 61}), dt, 71, -9.0, 9.0);
    const Tensor g = random_tensor(Shape({61, 33}), dt, 72).t();  // strided
    const std::vector<double> c = values(dispatch1(OpId::gelu_erf_bwd, {x, g}));
    const std::vector<double> d = values(dispatch1(OpId::gelu_erf_bwd, {to_gpu(x), to_gpu(g.contiguous()).t().t()}));
    const std::vector<double> gv = values(g);
    std::vector<double> bound(c.size());
    for (size_t i = 0; i < c.size(); ++i)
      bound[i] = (dt == DType::F64 ? 1e-13 : 2 * unit_roundoff(dt)) * std::abs(c[i]) +
                 1e-14 * std::abs(gv[i]) + tiny_of(dt);
    EXPECT_TRUE(within(d, c, bound));
    const double inf = std::numeric_limits<double>::infinity();
    const Tensor sx = Tensor::from_vector(std::vector<double>{inf, -inf, NAN, 0.0}, {4}).to_dtype(dt);
    const Tensor sg = Tensor::from_vector(std::vector<double>{0.75, 0.75, 1.0, 2.0}, {4}).to_dtype(dt);
    EXPECT_TRUE(same_bits(dispatch1(OpId::gelu_erf_bwd, {to_gpu(sx), to_gpu(sg)}),
                          dispatch1(OpId::gelu_erf_bwd, {sx, sg})));
  }
}

// NaN, infinities, signed zeros, huge and tiny inputs: the same values (±0 equal) or within the
// bound. gelu, gelu_erf and silu at -inf are 0 * inf in their formulas: no contract there.
TEST_F(CudaElementwise, UnarySpecialValues) {
  const std::vector<double> specials = {kNaN,  kInf,   -kInf,  0.0,    -0.0,    1.0,     -1.0,
                                        1e-30, -1e-30, 80.0,   -80.0,  100.0,   -110.0,  750.0,
                                        -750.0, 1e6,   -1e6,   39000.5, -50000.25, 3.0e38, 1e-40};
  for (DType dt : kFloatTypes) {
    const Tensor x = Tensor::from_vector(specials, Shape({specials.size()})).to_dtype(dt);
    const Tensor xg = to_gpu(x);
    const std::vector<double> xv = values(x);
    for (const UnarySpec& s : kUnary) {
      SCOPED_TRACE(std::string(op_name(s.op)) + " " + std::string(dtype_name(dt)));
      std::vector<double> cv = values(apply_unary(s.op, x, s.f0, s.f1));
      std::vector<double> gv = values(apply_unary(s.op, xg, s.f0, s.f1));
      const bool tail = s.op == OpId::gelu || s.op == OpId::gelu_erf || s.op == OpId::silu;
      for (size_t i = 0; i < xv.size(); ++i)
        if (tail && xv[i] == -kInf) cv[i] = gv[i] = 0.0;
      EXPECT_TRUE(within(gv, cv, unary_bounds(s, dt, xv, gv, cv), xv));
    }
  }
  // powf: C99 special cases and negative bases with integer exponents.
  const std::vector<double> bases = {-2.0, -0.5, -0.0, 0.0, 0.5, 2.0, 3.0, kInf, -kInf, kNaN, 1.0};
  const UnarySpec pow_spec = kUnary[16];
  ASSERT_EQ(pow_spec.op, OpId::powf);
  for (double e : {3.0, 2.0, 0.5, -1.0, -1.5, -3.0, 0.0, 1.0, 7.25})
    for (DType dt : kFloatTypes) {
      SCOPED_TRACE("powf " + std::to_string(e) + " " + std::string(dtype_name(dt)));
      const Tensor x = Tensor::from_vector(bases, Shape({bases.size()})).to_dtype(dt);
      const std::vector<double> xv = values(x), cv = values(x.powf(e)),
                                gv = values(to_gpu(x).powf(e));
      EXPECT_TRUE(within(gv, cv, unary_bounds(pow_spec, dt, xv, gv, cv), xv));
    }
}

// ---- binary, where_cond, mul_add -----------------------------------------------------------

constexpr OpId kBinaryOps[] = {OpId::add,     OpId::sub,     OpId::mul, OpId::div,
                               OpId::maximum, OpId::minimum, OpId::eq,  OpId::ne,
                               OpId::lt,      OpId::le,      OpId::gt,  OpId::ge};

/// Operands of a binary case: random values, every third element of b equal to a's (ties for
/// the comparisons); integer b has small values every third element (zeros and -1: divisors).
std::pair<Tensor, Tensor> binary_operands(const Shape& s, DType dt, uint64_t seed) {
  if (!is_float(dt)) {
    const Tensor a = random_ints(s, dt, seed);
    const Tensor r = random_ints(s, dt, seed + 1);
    return visit_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_integral_v<T>) {
        const std::vector<T> av = a.to_vector<T>();
        std::vector<T> bv = r.to_vector<T>();
        for (size_t i = 0; i < bv.size(); ++i) {
          if (i % 3 == 0) bv[i] = av[i];
          if (i % 3 == 1)
            bv[i] = static_cast<T>(static_cast<int64_t>(i % 9) - (std::is_signed_v<T> ? 4 : 0));
        }
        return std::pair<Tensor, Tensor>{a, Tensor::from_vector(bv, s)};
      } else {
        return std::pair<Tensor, Tensor>{a, r};  // not reached: dt is an integer dtype
      }
    });
  }
  const Tensor a = random_tensor(s, dt, seed, -3.0, 3.0);
  std::vector<double> av = values(a), bv = values(random_tensor(s, dt, seed + 1, -3.0, 3.0));
  for (size_t i = 0; i < av.size(); i += 3) bv[i] = av[i];
  return {a, Tensor::from_vector(bv, s).to_dtype(dt)};  // dt-representable: exact
}

using BinaryParam = std::tuple<OpId, DType>;
class CudaBinary : public CudaParamTest<BinaryParam> {};

TEST_P(CudaBinary, MatchesCpuBitForBitOnEveryLayoutAndSize) {
  const auto [op, dt] = GetParam();
  if (!has_kernel(op, kCpu, dt)) GTEST_SKIP() << "no CPU kernel";
  ASSERT_TRUE(has_kernel(op, kGpu, dt));
  uint64_t seed = 5000 + 13 * static_cast<uint64_t>(op);
  for (const Shape& shape : elementwise_shapes())
    for (size_t li = 0; li < std::size(kAllLayouts); ++li) {
      const LayoutKind ka = kAllLayouts[li], kb = kAllLayouts[(li + 1) % std::size(kAllLayouts)];
      SCOPED_TRACE(shape.to_string() + " " + layout_name(ka) + " / " + layout_name(kb));
      const auto [a0, b0] = binary_operands(shape, dt, seed += 2);
      const Both a = on_both(a0, ka), b = on_both(b0, kb);
      const Tensor yc = apply_binary(op, a.cpu, b.cpu), yg = apply_binary(op, a.gpu, b.gpu);
      ASSERT_TRUE(gpu_result(yg, yc));
      EXPECT_TRUE(same_bits(yg, yc));
    }
  // NumPy broadcasting: the front-end's stride-0 views of both operands.
  const std::vector<std::pair<Shape, Shape>> pairs = {
      {Shape({5, 1, 7}), Shape({1, 3, 7})}, {Shape({33}), Shape({1})},
      {Shape({1}), Shape({33})},            {Shape({4, 1}), Shape({1, 1029})},
      {Shape({2, 3, 4}), Shape({4})},       {Shape({2, 3, 1}), Shape({3, 1000})},
      {Shape({1000, 1}), Shape({1000, 9})}, {Shape({1}), Shape({1})},
      {Shape({0, 3}), Shape({1, 3})}};
  for (const auto& [sa, sb] : pairs) {
    SCOPED_TRACE("broadcast " + sa.to_string() + " " + sb.to_string());
    const Tensor a = binary_operands(sa, dt, ++seed).first;
    const Tensor b = binary_operands(sb, dt, ++seed).second;
    const Tensor yc = apply_binary(op, a, b), yg = apply_binary(op, to_gpu(a), to_gpu(b));
    ASSERT_TRUE(gpu_result(yg, yc));
    EXPECT_TRUE(same_bits(yg, yc));
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaBinary,
                         ::testing::Combine(::testing::ValuesIn(kBinaryOps),
                                            ::testing::ValuesIn(kAllTypes)),
                         [](const ::testing::TestParamInfo<BinaryParam>& i) {
                           return gtest_name(std::string(op_name(std::get<0>(i.param))) + "_" +
                                             std::string(dtype_name(std::get<1>(i.param))));
                         });

// NaN, infinities and signed zeros in every position, bit for bit (a NaN matching any NaN:
// the GPU's NaN results are canonical, x86 keeps the first operand's payload).
TEST_F(CudaElementwise, BinarySpecialValues) {
  const std::vector<double> av = {kNaN, 1.0, kNaN, kInf, -kInf, 0.0, -0.0, 2.0, kInf, -0.0, 0.0};
  const std::vector<double> bv = {1.0, kNaN, kNaN, kInf, kInf, 0.0, 0.0, -kInf, 1.0, -0.0, -0.0};
  for (DType dt : kFloatTypes) {
    const Tensor a = Tensor::from_vector(av, Shape({av.size()})).to_dtype(dt);
    const Tensor b = Tensor::from_vector(bv, Shape({bv.size()})).to_dtype(dt);
    for (OpId op : kBinaryOps)
      EXPECT_TRUE(same_bits(apply_binary(op, to_gpu(a), to_gpu(b)), apply_binary(op, a, b)))
          << op_name(op) << " " << dtype_name(dt);
  }
  // Integer division by zero gives 0; INT64_MIN / -1 wraps.
  const int64_t kMin = std::numeric_limits<int64_t>::min();
  const Tensor a = Tensor::from_vector(std::vector<int64_t>{7, -7, 0, kMin, kMin, 9, -9}, Shape({7}));
  const Tensor b = Tensor::from_vector(std::vector<int64_t>{0, 0, 0, -1, 0, -2, 2}, Shape({7}));
  EXPECT_TRUE(same_bits(to_gpu(a) / to_gpu(b), a / b));
  const Tensor u = Tensor::from_vector(std::vector<uint8_t>{7, 255, 0, 200}, Shape({4}));
  const Tensor z = Tensor::from_vector(std::vector<uint8_t>{0}, Shape({1}));
  EXPECT_TRUE(same_bits(to_gpu(u) / to_gpu(z), u / z));
}

// Scalar operators: a / s and s / a broadcast a one-element tensor; a + s, a * s, s - a are
// affine.
TEST_F(CudaElementwise, ScalarOperators) {
  for (DType dt : kAllTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Both a = on_both(random_any(Shape({3, 1001}), dt, 9, 0.5, 3.0), LayoutKind::Narrowed);
    for (auto f : std::vector<std::function<Tensor(const Tensor&)>>{
             [](const Tensor& x) { return x / 1.3; }, [](const Tensor& x) { return 1.3 / x; },
             [](const Tensor& x) { return x + 2.5; }, [](const Tensor& x) { return x * 0.25; },
             [](const Tensor& x) { return 2.0 - x; }})
      EXPECT_TRUE(same_bits(f(a.gpu), f(a.cpu)));
  }
}

// The 16-byte vector paths over runs (copy, unary, binary with a broadcast operand): attention
// head views (B, T, H, d) -> (B, H, T, d) with d a whole number of vectors or not, rows plus a
// broadcast bias, a scalar operand, a view whose base is not 16-byte aligned, and runs of one
// broadcast value (inner stride 0): the CPU's bits.
TEST_F(CudaElementwise, VectorRunsOfHeadViewsAndBroadcastRowsMatchCpu) {
  for (DType dt : kAllTypes) {
    for (size_t d : {32, 12, 7}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " d=" + std::to_string(d));
      const Tensor x = random_any(Shape({3, 5, 4, d}), dt, 17, 0.5, 3.0);
      const Tensor heads = x.permute({0, 2, 1, 3});  // (B, H, T, d), inner runs of d
      const Tensor hg = to_gpu(x).permute({0, 2, 1, 3});
      EXPECT_TRUE(same_bits(hg.contiguous(), heads.contiguous())) << "copy";
      EXPECT_TRUE(same_bits(hg * 0.5, heads * 0.5)) << "affine";
      if (is_float(dt)) {
        EXPECT_TRUE(same_bits(hg.sqrt(), heads.sqrt())) << "sqrt";
      }
      const Tensor bias = random_any(Shape({d}), dt, 18, 0.5, 3.0);
      EXPECT_TRUE(same_bits(hg + to_gpu(bias), heads + bias)) << "head view + bias";
      const Tensor rows = random_any(Shape({60, d}), dt, 19, 0.5, 3.0);
      EXPECT_TRUE(same_bits(to_gpu(rows) - to_gpu(bias), rows - bias)) << "rows - bias";
      EXPECT_TRUE(same_bits(to_gpu(bias) / to_gpu(rows), bias / rows)) << "bias / rows";
      EXPECT_TRUE(same_bits(to_gpu(rows).maximum(1.5), rows.maximum(1.5))) << "scalar";
      const Tensor off = rows.flatten_all().narrow(0, 1, 59 * d).reshape(Shape({59, d}));
      const Tensor offg = to_gpu(rows).flatten_all().narrow(0, 1, 59 * d).reshape(Shape({59, d}));
      EXPECT_TRUE(same_bits(offg + to_gpu(bias), off + bias)) << "unaligned base";
      EXPECT_TRUE(same_bits(offg * 2.0, off * 2.0)) << "unaligned unary";
      // Runs of one broadcast value (inner stride 0): not vector loads.
      const Tensor col = random_any(Shape({6, 1}), dt, 20, 0.5, 3.0);
      const Tensor bc = col.broadcast_as(Shape({6, 16}));
      const Tensor bcg = to_gpu(col).broadcast_as(Shape({6, 16}));
      EXPECT_TRUE(same_bits(bcg.contiguous(), bc.contiguous())) << "broadcast copy";
      EXPECT_TRUE(same_bits(bcg * 0.5, bc * 0.5)) << "broadcast unary";
      EXPECT_TRUE(same_bits(bcg + to_gpu(rows.narrow(0, 0, 6).narrow(1, 0, 1).contiguous()
                                             .broadcast_as(Shape({6, 16}))),
                            bc + rows.narrow(0, 0, 6).narrow(1, 0, 1).contiguous()
                                     .broadcast_as(Shape({6, 16}))))
          << "broadcast + broadcast";
    }
  }
}

TEST_F(CudaElementwise, WhereCondEveryDtypeLayoutAndBroadcast) {
  for (DType dt : kAllTypes) {
    ASSERT_TRUE(has_kernel(OpId::where_cond, kGpu, dt)) << dtype_name(dt);
    for (const Shape& s : elementwise_shapes())
      for (size_t li = 0; li < std::size(kAllLayouts); ++li) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + s.to_string() + " " +
                     layout_name(kAllLayouts[li]));
        std::mt19937_64 rng(5 + li);
        std::vector<uint8_t> mv(s.elem_count());
        for (auto& m : mv) m = (rng() % 3 == 0) ? 0 : static_cast<uint8_t>(1 + rng() % 255);
        const auto lay = [&](size_t k) { return kAllLayouts[(li + k) % std::size(kAllLayouts)]; };
        const Both m = on_both(Tensor::from_vector(mv, s), lay(0));
        const Both t = on_both(random_any(s, dt, 6 + li), lay(1));
        const Both f = on_both(random_any(s, dt, 7 + li), lay(2));
        const Tensor yc = m.cpu.where_cond(t.cpu, f.cpu), yg = m.gpu.where_cond(t.gpu, f.gpu);
        ASSERT_TRUE(gpu_result(yg, yc));
        EXPECT_TRUE(same_bits(yg, yc));
      }
    // Broadcast mask, on_true and on_false.
    const Tensor m = Tensor::from_vector(std::vector<uint8_t>{1, 0, 1, 0}, Shape({4, 1}));
    const Tensor t = random_any(Shape({1, 5}), dt, 8);
    const Tensor f = random_any(Shape({1}), dt, 9);
    EXPECT_TRUE(same_bits(to_gpu(m).where_cond(to_gpu(t), to_gpu(f)), m.where_cond(t, f)));
  }
}

TEST_F(CudaElementwise, MulAddEveryFloatDtypeLayoutAndBroadcast) {
  for (DType dt : kFloatTypes) {
    for (const Shape& s : elementwise_shapes())
      for (size_t li = 0; li < std::size(kAllLayouts); ++li) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + s.to_string() + " " +
                     layout_name(kAllLayouts[li]));
        const auto lay = [&](size_t k) { return kAllLayouts[(li + k) % std::size(kAllLayouts)]; };
        const Both a = on_both(random_tensor(s, dt, 7000 + li, -3.0, 3.0), lay(0));
        const Both b = on_both(random_tensor(s, dt, 7100 + li, -3.0, 3.0), lay(1));
        const Both c = on_both(random_tensor(s, dt, 7200 + li, -3.0, 3.0), lay(2));
        const Tensor yc = a.cpu.mul_add(b.cpu, c.cpu), yg = a.gpu.mul_add(b.gpu, c.gpu);
        ASSERT_TRUE(gpu_result(yg, yc));
        EXPECT_TRUE(same_bits(yg, yc));
      }
    const std::vector<std::array<Shape, 3>> cases = {
        {Shape({1000, 9}), Shape({1000, 1}), Shape({1, 9})},
        {Shape({33}), Shape({1}), Shape({1})},
        {Shape({1}), Shape({1}), Shape({33})},
        {Shape({4, 1, 1029}), Shape({3, 1}), Shape({1029})}};
    uint64_t seed = 7300;
    for (const auto& [sa, sb, sc] : cases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + sa.to_string() + sb.to_string() +
                   sc.to_string());
      const Tensor a = random_tensor(sa, dt, ++seed, -3, 3), b = random_tensor(sb, dt, ++seed, -3, 3),
                   c = random_tensor(sc, dt, ++seed, -3, 3);
      EXPECT_TRUE(same_bits(to_gpu(a).mul_add(to_gpu(b), to_gpu(c)), a.mul_add(b, c)));
    }
    // One rounding: (1 + e)^2 - (1 + 2e) = e^2 exactly.
    if (!is_half(dt)) {
      const double e = dt == DType::F32 ? 0x1p-12 : 0x1p-27;
      const Tensor a = Tensor::full(Shape({37}), 1.0 + e, dt, kGpu);
      const Tensor c = Tensor::full(Shape({37}), -(1.0 + 2.0 * e), dt, kGpu);
      for (double v : values(a.mul_add(a, c))) ASSERT_EQ(v, e * e) << dtype_name(dt);
    }
  }
}

// ---- copy_cast ---------------------------------------------------------------------------------

/// A tensor of `dt` holding random bit patterns (NaNs with payloads included for the floats).
Tensor random_bits(const Shape& s, DType dt, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> bytes(s.elem_count() * dtype_size(dt));
  for (auto& b : bytes) b = static_cast<unsigned char>(rng());
  return Tensor::from_host(bytes.data(), s.elem_count(), dt, s, kCpu);
}

// copy of strided views of rank 1..5 (permuted, transposed, narrowed, broadcast, the batched
// transposes that take the tiled path), every dtype: the same bits, payloads included.
TEST_F(CudaCopyCast, CopyOfStridedViewsOfRankOneToFive) {
  const std::vector<std::vector<size_t>> shapes = {
      {5003}, {70, 120}, {7, 40, 30}, {3, 5, 6, 7}, {2, 3, 4, 5, 6}};
  for (DType dt : kAllTypes)
    for (const auto& dims : shapes) {
      const size_t r = dims.size();
      const Tensor base = random_bits(Shape(dims), dt, 11 + r);
      std::vector<std::pair<std::string, ViewFn>> views;
      if (r == 1) {
        views = {{"narrow", [](const Tensor& x) { return x.narrow(0, 7, 4000); }},
                 {"broadcast",
                  [](const Tensor& x) { return x.narrow(0, 3, 1).broadcast_as(Shape({7, 5003})); }},
                 {"unsqueeze_t", [](const Tensor& x) { return x.unsqueeze(1).broadcast_as(Shape({5003, 3})); }}};
      } else {
        std::vector<size_t> rev(r);
        for (size_t i = 0; i < r; ++i) rev[i] = r - 1 - i;
        const Shape full(dims);
        const size_t d1 = dims[1];
        views = {
            {"permute_reversed", [rev](const Tensor& x) { return x.permute(rev); }},
            {"transpose_last", [](const Tensor& x) { return x.transpose(-1, -2); }},
            {"transpose_outer_narrow",
             [r](const Tensor& x) {
               const Tensor t = x.transpose(0, static_cast<int64_t>(r) - 1);
               return t.narrow(1, 1, t.dim(1) - 2);
             }},
            {"narrow_first_last",
             [](const Tensor& x) { return x.narrow(0, 1, x.dim(0) - 1).narrow(-1, 2, x.dim(-1) - 3); }},
            {"broadcast_dim1",
             [full, d1](const Tensor& x) { return x.narrow(1, d1 / 2, 1).broadcast_as(full); }},
            {"squeezed_narrow", [](const Tensor& x) { return x.narrow(-1, 2, 1).squeeze(-1); }},
        };
      }
      for (const auto& [name, view] : views) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + Shape(dims).to_string() + " " + name);
        const Both v = make_both(base, view);
        const Tensor yc = v.cpu.contiguous(), yg = v.gpu.contiguous();
        ASSERT_TRUE(gpu_result(yg, yc));
        EXPECT_TRUE(same_bits(yg, yc, Cmp::Bits));
        // The dense copy (one device memcpy) through the dispatcher, and the host round trip.
        EXPECT_TRUE(same_bits(dispatch1(OpId::copy, {yg}), yc, Cmp::Bits));
        EXPECT_TRUE(same_bits(to_gpu(v.cpu), yc, Cmp::Bits)) << "to_device of a CPU view";
      }
    }
}

/// n values of dtype dt that exercise conversions: NaN, infinities, ±0, values beyond every
/// integer and half range, tiny and subnormal values, ties of the narrower float types (nudged
/// or not), integers with sticky low bits, the extremes of the integer types.
Tensor conversion_values(const Shape& s, DType dt, uint64_t seed) {
  const size_t n = s.elem_count();
  std::mt19937_64 rng(seed);
  return visit_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    std::vector<T> v(n);
    for (size_t i = 0; i < n; ++i) {
      const uint64_t r = rng();
      if constexpr (std::is_integral_v<T>) {
        if constexpr (std::is_same_v<T, int64_t>) {
          int64_t x = static_cast<int64_t>(rng() >> (r % 64));
          if (r & (1ull << 20)) x = -x;
          if (i % 17 == 0) x = (int64_t{1} << 62) + (int64_t{1} << 54) + static_cast<int64_t>(r >> 60);
          if (i % 31 == 0)
            x = i % 2 ? std::numeric_limits<int64_t>::min() : std::numeric_limits<int64_t>::max();
          v[i] = x;
        } else {
          v[i] = static_cast<T>(i % 3 == 0 ? (r >> 40) % 300 : r);
        }
      } else {
        double d;
        switch (i % 8) {
          case 0: d = std::ldexp(static_cast<double>(r >> 11), -53) * 2000.0 - 1000.0; break;
          case 1: {  // exponents over ±150 (f32 subnormals and overflow included)
            const int e = static_cast<int>((r >> 56) % 300) - 150;
            d = std::ldexp(1.0 + std::ldexp(static_cast<double>(r & 0xffffffffffull), -40), e);
            if (r & 1) d = -d;
            break;
          }
          case 2: d = static_cast<double>(static_cast<int>((r >> 32) % 700) - 350) + 0.5; break;
          case 3: {  // a bf16 or f16 tie (as f32), nudged or not
            const uint32_t u =
                (static_cast<uint32_t>(r) & 0x807fffffu) | ((110u + (r >> 40) % 40u) << 23);
            const float tie = f32_from_bits(r & (1ull << 50) ? ((u | 0x8000u) & ~0x7fffu)
                                                             : ((u | 0x1000u) & ~0xfffu));
            const double nudge =
                (r >> 51) % 3 == 0 ? 0.0 : std::ldexp((r >> 53) & 1 ? 1.0 : -1.0, -35);
            d = static_cast<double>(tie) * (1.0 + nudge);
            break;
          }
          case 4: {
            const double sp[] = {0.0,    -0.0,   kInf,   -kInf,        kNaN,        -kNaN,
                                 65504.0, 65519.99, 65520.0, 255.0,     255.9,       256.0,
                                 -0.9,   -1.0,   4294967295.5, 4294967296.0, 9.3e18, -9.3e18,
                                 1e39,   1e-40,  5e-324, 6e-8,         3.0e38,      -1e300};
            d = sp[(r >> 8) % std::size(sp)];
            break;
          }
          case 5: d = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40); break;  // rounds once
          default: d = std::ldexp(static_cast<double>(r >> 11), -53) * 8.0 - 4.0; break;
        }
        v[i] = cpu::ref::convert<T>(d);
      }
    }
    return Tensor::from_vector(v, s);
  });
}

using PairParam = std::tuple<DType, DType>;
class CudaToDtype : public CudaParamTest<PairParam> {};

// Every pair of the 7 dtypes (the same-dtype pairs through the dispatcher, which Tensor::to_dtype
// would skip), every layout: bit for bit.
TEST_P(CudaToDtype, EveryLayoutAndSizeBitForBit) {
  const auto [from, to] = GetParam();
  ASSERT_TRUE(has_kernel(OpId::to_dtype, kGpu, from));
  uint64_t seed = 100 + 7 * static_cast<uint64_t>(from);
  for (const Shape& s : {Shape({1, 1}), Shape({1, 7}), Shape({3, 11}), Shape({37, 29}),
                         Shape({260, 301}), Shape({0, 4})})
    for (LayoutKind k : kAllLayouts) {
      SCOPED_TRACE(s.to_string() + " " + layout_name(k));
      const Both x = on_both(conversion_values(s, from, ++seed), k);
      OpAttrs a;
      a.dtype = to;
      const Tensor yc = dispatch1(OpId::to_dtype, {x.cpu}, a);
      const Tensor yg = dispatch1(OpId::to_dtype, {x.gpu}, a);
      ASSERT_TRUE(gpu_result(yg, yc));
      EXPECT_TRUE(same_bits(yg, yc));
    }
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaToDtype,
                         ::testing::Combine(::testing::ValuesIn(kAllTypes),
                                            ::testing::ValuesIn(kAllTypes)),
                         [](const ::testing::TestParamInfo<PairParam>& i) {
                           return std::string(dtype_name(std::get<0>(i.param))) + "_to_" +
                                  std::string(dtype_name(std::get<1>(i.param)));
                         });

TEST_F(CudaCopyCast, FillZerosOnesFull) {
  const std::vector<Shape> shapes = {Shape({70001}), Shape({0}), Shape(std::vector<size_t>{}),
                                     Shape({3, 5})};
  const double vals[] = {0.0,  -0.0,    1.0,  -7.9,  0.1,          300.0, 65519.99, 1e39,
                         -1e39, kNaN,   kInf, 1e-40, 4294967295.5, 9.3e18, -3.0};
  for (DType dt : kAllTypes)
    for (const Shape& s : shapes) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + s.to_string());
      for (double v : vals) {
        const Tensor yg = Tensor::full(s, v, dt, kGpu), yc = Tensor::full(s, v, dt, kCpu);
        ASSERT_TRUE(gpu_result(yg, yc)) << v;
        EXPECT_TRUE(same_bits(yg, yc)) << "full " << v;
      }
      EXPECT_TRUE(same_bits(Tensor::zeros(s, dt, kGpu), Tensor::zeros(s, dt, kCpu)));
      EXPECT_TRUE(same_bits(Tensor::ones(s, dt, kGpu), Tensor::ones(s, dt, kCpu)));
    }
}

TEST_F(CudaCopyCast, Arange) {
  struct R {
    double start, end, step;
  };
  const R ranges[] = {{0, 5, 1},       {-3.3, -3.3 + 0.1 * 49999.5, 0.1}, {3, 0, -1},
                      {1, 2, 0.25},    {1e6, 1e6 + 1000.5, 1.0},         {0, 300, 1},
                      {0.1, 1000, 0.1}, {5, 5, 1}};
  for (DType dt : kAllTypes)
    for (const R& r : ranges) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " arange(" + std::to_string(r.start) + ", " +
                   std::to_string(r.end) + ", " + std::to_string(r.step) + ")");
      const Tensor yg = Tensor::arange(r.start, r.end, r.step, dt, kGpu);
      const Tensor yc = Tensor::arange(r.start, r.end, r.step, dt, kCpu);
      ASSERT_TRUE(gpu_result(yg, yc));
      EXPECT_TRUE(same_bits(yg, yc));
    }
}

// rand: the same Philox values on both devices, bit for bit. randn: bf16/f16/f32 bit for bit,
// f64 within 4 ulp (the file header). Odd sizes: the last Philox pair is half used.
TEST_F(CudaCopyCast, RandAndRandnForTheSameSeed) {
  for (DType dt : kFloatTypes)
    for (uint64_t seed : {uint64_t{0}, uint64_t{42}, (uint64_t{1} << 40) + 3})
      for (const Shape& s : {Shape({100003}), Shape({3, 7}), Shape({1}), Shape({0})}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " seed " + std::to_string(seed) + " " +
                     s.to_string());
        for (auto [lo, hi] : {std::pair{0.0, 1.0}, std::pair{-1.0, 3.0}}) {
          const Tensor yg = Tensor::rand(s, dt, kGpu, seed, lo, hi);
          const Tensor yc = Tensor::rand(s, dt, kCpu, seed, lo, hi);
          ASSERT_TRUE(gpu_result(yg, yc));
          EXPECT_TRUE(same_bits(yg, yc)) << "rand [" << lo << ", " << hi << ")";
        }
        for (auto [mean, sd] : {std::pair{0.0, 1.0}, std::pair{0.5, 2.0}}) {
          const Tensor yg = Tensor::randn(s, dt, kGpu, seed, mean, sd);
          const Tensor yc = Tensor::randn(s, dt, kCpu, seed, mean, sd);
          ASSERT_TRUE(gpu_result(yg, yc));
          if (dt != DType::F64) {
            EXPECT_TRUE(same_bits(yg, yc)) << "randn " << mean << " " << sd;
          } else {
            const std::vector<double> gv = values(yg), cv = values(yc);
            std::vector<double> bound(cv.size());
            for (size_t i = 0; i < cv.size(); ++i)
              bound[i] = 4.0 * ulp_at(DType::F64, std::abs(cv[i] - mean) + std::abs(mean));
            EXPECT_TRUE(within(gv, cv, bound)) << "randn " << mean << " " << sd;
          }
        }
      }
}

// ---- reductions --------------------------------------------------------------------------------

/// Reduction inputs: floats in [-2, 2); i64 in (-1000, 1000); u32 up to 4e9 (sums wrap); u8 all
/// of [0, 255].
Tensor reduce_input(const Shape& s, DType dt, uint64_t seed) {
  switch (dt) {
    case DType::I64: return random_tensor(s, DType::F64, seed, -1000.0, 1000.0).to_dtype(dt);
    case DType::U32: return random_tensor(s, DType::U32, seed, 0.0, 4.0e9);
    case DType::U8: return random_tensor(s, DType::U8, seed, 0.0, 256.0);
    default: return random_tensor(s, dt, seed);
  }
}

std::string dims_str(const std::vector<int64_t>& v) {
  std::string s = "{";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "}";
}

/// The sum bound of the file header: |gpu - ref| <= u_dt |ref| + 2 (n + 4) u_acc sum|x|, with ref
/// and sum|x| the CPU's f64 sums over the same dims.
::testing::AssertionResult sum_close(const Tensor& gpu_sum, const Tensor& x_cpu,
                                     const std::vector<int64_t>& dims, bool keep, size_t n) {
  const Tensor x64 = x_cpu.to_dtype(DType::F64);
  const std::vector<double> ref = values(x64.sum(dims, keep));
  const std::vector<double> scale = values(x64.abs().sum(dims, keep));
  const DType dt = x_cpu.dtype();
  std::vector<double> bound(ref.size());
  for (size_t i = 0; i < ref.size(); ++i)
    bound[i] = unit_roundoff(dt) * std::abs(ref[i]) +
               2.0 * static_cast<double>(n + 4) * compute_u(dt) * scale[i];
  return within(values(gpu_sum), ref, bound);
}

using ReduceParam = std::tuple<DType, LayoutKind>;
class CudaReduceP : public CudaParamTest<ReduceParam> {};

TEST_P(CudaReduceP, EveryDimSubsetKeepdimBothWays) {
  const auto [dt, layout] = GetParam();
  if (!has_kernel(OpId::sum, kCpu, dt)) GTEST_SKIP() << "no CPU sum kernel";
  for (OpId op : {OpId::sum, OpId::max, OpId::min, OpId::argmax, OpId::argmin})
    if (has_kernel(op, kCpu, dt)) {
      ASSERT_TRUE(has_kernel(op, kGpu, dt)) << op_name(op);
    }
  const std::vector<std::vector<size_t>> shapes = {{1, 1, 1},    {7, 33, 1},    {3, 7, 33},
                                                   {2, 1031, 3}, {33, 2, 1013}, {1, 1, 1200},
                                                   {3, 0, 5}};
  std::vector<std::vector<int64_t>> subsets = {{}};  // {}: every dim
  for (int mask = 1; mask < 8; ++mask) {
    std::vector<int64_t> s;
    for (int64_t d = 0; d < 3; ++d)
      if (mask & (1 << d)) s.push_back(d);
    subsets.push_back(s);
  }
  uint64_t seed = 100;
  for (const auto& dims : shapes) {
    const Both x = on_both(reduce_input(Shape(dims), dt, ++seed), layout);
    // Few distinct values, so that most rows have ties: the first index must win.
    const Both xt = on_both(is_float(dt) ? random_tensor(Shape(dims), DType::F64, ++seed, 0.0, 4.0)
                                               .to_dtype(DType::I64)
                                               .to_dtype(dt)
                                         : random_tensor(Shape(dims), dt, ++seed, 0.0, 4.0),
                            layout);
    for (const auto& rd : subsets)
      for (bool keep : {false, true}) {
        SCOPED_TRACE(Shape(dims).to_string() + " dims " + dims_str(rd) + (keep ? " keepdim" : ""));
        size_t n_red = 1;
        bool empty_dim = false;
        for (size_t d = 0; d < 3; ++d)
          if (rd.empty() || std::find(rd.begin(), rd.end(), static_cast<int64_t>(d)) != rd.end()) {
            n_red *= dims[d];
            empty_dim = empty_dim || dims[d] == 0;
          }
        const Tensor sg = x.gpu.sum(rd, keep), sc = x.cpu.sum(rd, keep);
        ASSERT_TRUE(gpu_result(sg, sc));
        if (is_float(dt)) EXPECT_TRUE(sum_close(sg, x.cpu, rd, keep, n_red));
        else EXPECT_TRUE(same_bits(sg, sc));
        if (empty_dim) continue;  // max/min/arg* of an empty dim are errors
        if (has_kernel(OpId::max, kCpu, dt)) {
          EXPECT_TRUE(same_bits(x.gpu.max(rd, keep), x.cpu.max(rd, keep), Cmp::Value)) << "max";
          EXPECT_TRUE(same_bits(x.gpu.min(rd, keep), x.cpu.min(rd, keep), Cmp::Value)) << "min";
        }
        if (rd.size() == 1 && has_kernel(OpId::argmax, kCpu, dt)) {
          EXPECT_TRUE(same_bits(xt.gpu.argmax(rd[0], keep), xt.cpu.argmax(rd[0], keep))) << "argmax";
          EXPECT_TRUE(same_bits(xt.gpu.argmin(rd[0], keep), xt.cpu.argmin(rd[0], keep))) << "argmin";
        }
      }
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaReduceP,
                         ::testing::Combine(::testing::ValuesIn(kAllTypes),
                                            ::testing::ValuesIn(kAllLayouts)),
                         [](const ::testing::TestParamInfo<ReduceParam>& i) {
                           return std::string(dtype_name(std::get<0>(i.param))) + "_" +
                                  layout_name(std::get<1>(i.param));
                         });

// Sums of small integers are exact in the f32 (f64) accumulator in any order, so the GPU must
// give the CPU's bits: a dropped, repeated or half-precision-accumulated term shows.
// (4096, 8192) rows and columns with values in [-8, 8]; all dims of (1024, 1024) in [-1, 1].
TEST_F(CudaReduce, ExactIntegerSumsMatchBitForBit) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = Tensor::rand(Shape({4096, 8192}), DType::F64, kCpu, 71, -8.99, 9.0)
                         .to_dtype(DType::I64)
                         .to_dtype(dt);
    const Tensor xg = to_gpu(x);
    for (int64_t d : {1, 0})
      for (bool keep : {false, true})
        EXPECT_TRUE(same_bits(xg.sum({d}, keep), x.sum({d}, keep))) << "dim " << d;
    const Tensor y = Tensor::rand(Shape({1024, 1024}), DType::F64, kCpu, 72, -1.99, 2.0)
                         .to_dtype(DType::I64)
                         .to_dtype(dt);
    EXPECT_TRUE(same_bits(to_gpu(y).sum_all(), y.sum_all())) << "all";
    // 300 ones: a bf16 accumulator would stall at 256.
    EXPECT_EQ(Tensor::ones(Shape({300}), dt, kGpu).sum_all().item(), 300.0);
  }
}

// Long rows and long columns, f32 and bf16: sums within the bound, max/min/argmax/argmin exact
// (ties from integer values); the same CUDA reduction twice gives the same bits.
TEST_F(CudaReduce, LongRowsAndColumnsAndDeterminism) {
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = Tensor::rand(Shape({4096, 8192}), dt, kCpu, 73, -1.0, 1.0);
    const Tensor xg = to_gpu(x);
    for (const std::vector<int64_t>& d : {std::vector<int64_t>{1}, std::vector<int64_t>{0},
                                          std::vector<int64_t>{}}) {
      SCOPED_TRACE("dims " + dims_str(d));
      const size_t n = d.empty() ? x.elem_count() : x.dim(d[0]);
      const Tensor s1 = xg.sum(d), s2 = xg.sum(d);
      EXPECT_TRUE(sum_close(s1, x, d, false, n));
      EXPECT_TRUE(same_bits(s1, s2, Cmp::Bits)) << "the same sum twice";
      EXPECT_TRUE(same_bits(xg.max(d), x.max(d), Cmp::Value)) << "max";
      EXPECT_TRUE(same_bits(xg.min(d), x.min(d), Cmp::Value)) << "min";
    }
    const Tensor ties = Tensor::rand(Shape({4096, 8192}), DType::F64, kCpu, 74, 0.0, 4.0)
                            .to_dtype(DType::I64)
                            .to_dtype(dt);
    const Tensor tg = to_gpu(ties);
    for (int64_t d : {1, 0}) {
      EXPECT_TRUE(same_bits(tg.argmax(d), ties.argmax(d))) << "argmax dim " << d;
      EXPECT_TRUE(same_bits(tg.argmin(d), ties.argmin(d))) << "argmin dim " << d;
      EXPECT_TRUE(same_bits(tg.argmax(d), tg.argmax(d), Cmp::Bits)) << "argmax twice";
    }
    // One extreme in the last block of a long row, another in the middle.
    std::vector<double> v = values(Tensor::rand(Shape({1, 50001}), DType::F64, kCpu, 75, -1, 1));
    v[50000] = 3.0;
    v[20000] = -3.0;
    v[40000] = 3.0;
    const Tensor r = Tensor::from_vector(v, Shape({1, 50001})).to_dtype(dt);
    EXPECT_EQ(to_gpu(r).argmax(1).item(), 40000.0);
    EXPECT_EQ(to_gpu(r).argmin(1).item(), 20000.0);
  }
}

// NaN propagates and is the arg-extreme; rows of infinities; empty and rank-0 inputs.
TEST_F(CudaReduce, SpecialValuesEmptyAndRankZero) {
  for (DType dt : kFloatTypes)
    for (size_t n : {size_t{5}, size_t{33}, size_t{1000}, size_t{9000}}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " n=" + std::to_string(n));
      std::vector<double> v(4 * n);
      for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(static_cast<double>(i));
      v[n / 2] = kNaN;  // row 0: NaNs
      v[n - 1] = kNaN;
      for (size_t i = 0; i < n; ++i) v[n + i] = -kInf;  // row 1: all -inf
      for (size_t i = 0; i < n; ++i) v[2 * n + i] = kInf;  // row 2: all +inf
      v[4 * n - 1] = -kInf;  // row 3: one -inf at the end
      const Tensor x = Tensor::from_vector(v, Shape({4, n})).to_dtype(dt);
      const Tensor xg = to_gpu(x);
      for (int64_t d : {1, 0}) {
        EXPECT_TRUE(same_bits(xg.max({d}), x.max({d}), Cmp::Value)) << "max " << d;
        EXPECT_TRUE(same_bits(xg.min({d}), x.min({d}), Cmp::Value)) << "min " << d;
        EXPECT_TRUE(same_bits(xg.argmax(d), x.argmax(d))) << "argmax " << d;
        EXPECT_TRUE(same_bits(xg.argmin(d), x.argmin(d))) << "argmin " << d;
        const std::vector<double> s = values(xg.sum({d})), c = values(x.sum({d}));
        for (size_t i = 0; i < s.size(); ++i)
          EXPECT_EQ(std::isnan(s[i]), std::isnan(c[i])) << "sum " << d << " at " << i;
      }
    }
  const Tensor e = Tensor::zeros(Shape({3, 0}), DType::F32, kGpu);
  EXPECT_TRUE(same_bits(e.sum({1}), Tensor::zeros(Shape({3}), DType::F32)));
  EXPECT_EQ(e.sum({0}).dims(), (std::vector<size_t>{0}));
  const Tensor s = Tensor::full(Shape(std::vector<size_t>{}), 2.5, DType::F64, kGpu);
  EXPECT_EQ(s.sum_all().item(), 2.5);
  // Integer sums wrap in the dtype's width.
  const Tensor u = Tensor::from_vector(std::vector<uint32_t>{0x80000000u, 0x80000001u, 5u}, Shape({3}));
  EXPECT_TRUE(same_bits(to_gpu(u).sum({0}), u.sum({0})));
  const int64_t big = std::numeric_limits<int64_t>::max();
  const Tensor i = Tensor::from_vector(std::vector<int64_t>{big, 2, -5}, Shape({3}));
  EXPECT_TRUE(same_bits(to_gpu(i).sum({0}), i.sum({0})));
}

// ---- matmul -------------------------------------------------------------------------------------

// The shapes are test_matmul_index.cpp's table (mat_cases()).

/// Restores the TF32 setting when it goes out of scope.
struct Tf32Guard {
  bool saved = cuda_allow_tf32();
  explicit Tf32Guard(bool allow) { set_cuda_allow_tf32(allow); }
  ~Tf32Guard() { set_cuda_allow_tf32(saved); }
};

using MatParam = std::tuple<DType, LayoutKind>;
class CudaMatmulP : public CudaParamTest<MatParam> {};

TEST_P(CudaMatmulP, MatchesCpuWithinGammaK) {
  const auto [dt, layout] = GetParam();
  EXPECT_FALSE(cuda_allow_tf32()) << "TF32 must be off unless the user allows it";
  Tf32Guard tf32(false);
  ASSERT_TRUE(has_kernel(OpId::matmul, kGpu, dt));
  uint64_t seed = 500;
  for (const MatCase& c : mat_cases()) {
    SCOPED_TRACE(c.name);
    Both a = on_both(random_tensor(Shape(c.a), dt, ++seed), layout);
    Both b = on_both(random_tensor(Shape(c.b), dt, ++seed), layout);
    if (c.ta) a = {a.cpu.t(), a.gpu.t()};
    if (c.tb) b = {b.cpu.t(), b.gpu.t()};
    const Tensor yc = a.cpu.matmul(b.cpu), yg = a.gpu.matmul(b.gpu);
    ASSERT_TRUE(gpu_result(yg, yc));
    const double k = static_cast<double>(a.cpu.dim(-1));
    const std::vector<double> scale =
        values(a.cpu.to_dtype(DType::F64).abs().matmul(b.cpu.to_dtype(DType::F64).abs()));
    const std::vector<double> gv = values(yg), cv = values(yc);
    std::vector<double> bound(cv.size());
    for (size_t i = 0; i < cv.size(); ++i) {
      bound[i] = 4.0 * k * compute_u(dt) * scale[i] + 2.0 * tiny_of(dt);
      if (is_half(dt)) bound[i] += ulp_at(dt, std::max(std::abs(gv[i]), std::abs(cv[i])));
    }
    EXPECT_TRUE(within(gv, cv, bound));
    if (k == 0) {
      EXPECT_TRUE(same_bits(yg, yc)) << "k == 0: zeros";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaMatmulP,
                         ::testing::Combine(::testing::ValuesIn(kFloatTypes),
                                            ::testing::Values(LayoutKind::Contiguous,
                                                              LayoutKind::Transposed,
                                                              LayoutKind::Narrowed)),
                         [](const ::testing::TestParamInfo<MatParam>& i) {
                           return std::string(dtype_name(std::get<0>(i.param))) + "_" +
                                  layout_name(std::get<1>(i.param));
                         });

// Batch dims that do not flatten into one stride: attention's heads, (B, H, T, D) viewed from
// (B, T, H, D), as q k^T and w v; the GPU copies such an operand dense and makes one batched
// call. A mix of a broadcast and a strided batch dim still takes the host loop. Both match the
// CPU within the gamma_k bound of the suite above (here in f32: 4 k u |a||b|).
TEST_F(CudaMatmul, HeadViewsAndMixedBroadcastBatches) {
  Tf32Guard tf32(false);
  const size_t B = 5, T = 7, H = 3, D = 4;
  // The views are taken on each device (a copy to the GPU would be dense).
  struct Base {
    Tensor q, k, v, m;
  };
  const auto base = [&](Device dev) {
    const auto heads = [&](uint64_t seed) {
      return random_tensor(Shape({B, T, H, D}), DType::F32, dev, seed).permute({0, 2, 1, 3});
    };
    return Base{heads(911), heads(912), heads(913),
                random_tensor(Shape({1, H, D, T}), DType::F32, dev, 914)
                    .broadcast_as(Shape({B, H, D, T}))};
  };
  using Pair = std::pair<Tensor, Tensor>;
  const std::vector<std::function<Pair(const Base&)>> cases = {
      [](const Base& x) { return Pair{x.q, x.k.transpose(-2, -1)}; },
      [](const Base& x) { return Pair{x.q.matmul(x.k.transpose(-2, -1)), x.v}; },
      [](const Base& x) { return Pair{x.q.transpose(-2, -1), x.q}; },
      [](const Base& x) { return Pair{x.q, x.m}; },
      [](const Base& x) {
        return Pair{x.m.permute({1, 0, 2, 3}), x.q.permute({1, 0, 2, 3})};
      }};
  const Base cb = base(Device::cpu()), gb = base(kGpu);
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(i);
    const auto [a, b] = cases[i](cb);
    const auto [ag, bg] = cases[i](gb);
    EXPECT_FALSE(ag.is_contiguous() && bg.is_contiguous());
    const Tensor yc = a.matmul(b), yg = ag.matmul(bg);
    ASSERT_EQ(yg.dims(), yc.dims());
    const std::vector<double> scale =
        values(a.to_dtype(DType::F64).abs().matmul(b.to_dtype(DType::F64).abs()));
    const std::vector<double> gv = values(yg), cv = values(yc);
    std::vector<double> bound(cv.size());
    const double kk = static_cast<double>(a.dim(-1));
    for (size_t j = 0; j < cv.size(); ++j)
      bound[j] = 4.0 * kk * compute_u(DType::F32) * scale[j] + 1e-30;
    EXPECT_TRUE(within(gv, cv, bound));
  }
}

// The same product twice: the same bits (cuBLAS picks one algorithm per shape).
TEST_F(CudaMatmul, DeterministicAndF32IsNotTf32) {
  Tf32Guard tf32(false);
  const Tensor a = random_tensor(Shape({512, 1024}), DType::F32, 901);
  const Tensor b = random_tensor(Shape({1024, 384}), DType::F32, 902);
  const Tensor ag = to_gpu(a), bg = to_gpu(b);
  const Tensor y1 = ag.matmul(bg), y2 = ag.matmul(bg);
  EXPECT_TRUE(same_bits(y1, y2, Cmp::Bits));
  // 16 products of (1 + 2^-12) and 1: 16 + 2^-8, exact in f32 in any order; TF32's 10-bit
  // mantissa would round 1 + 2^-12 to 1 and give 16.
  const Tensor p = Tensor::full(Shape({16, 16}), 1.0 + std::ldexp(1.0, -12), DType::F32, kGpu);
  const Tensor q = Tensor::ones(Shape({16, 16}), DType::F32, kGpu);
  for (double v : values(p.matmul(q))) ASSERT_EQ(v, 16.0 + std::ldexp(1.0, -8));
}

// ---- index ops ----------------------------------------------------------------------------------

class CudaIndexP : public CudaParamTest<DType> {};

TEST_P(CudaIndexP, IndexSelect) {
  const DType dt = GetParam();
  ASSERT_TRUE(has_kernel(OpId::index_select, kGpu, dt));
  uint64_t seed = 700;
  const std::vector<std::pair<std::vector<size_t>, size_t>> cases = {
      {{5, 7, 33}, 11}, {{1031, 7}, 1200}, {{1, 1}, 3}, {{7, 1}, 1}, {{4, 5}, 0}};
  for (const auto& [dims, len] : cases)
    for (size_t d = 0; d < dims.size(); ++d)
      for (DType idt : {DType::I64, DType::U32})
        for (LayoutKind lk : kAllLayouts) {
          SCOPED_TRACE(Shape(dims).to_string() + " dim " + std::to_string(d) + " idx " +
                       std::string(dtype_name(idt)) + " " + layout_name(lk));
          const Both x = on_both(random_any(Shape(dims), dt, ++seed, -100, 100), lk);
          const Tensor idx = index_tensor(random_indices(len, dims[d], ++seed), Shape({len}), idt);
          const int64_t di = static_cast<int64_t>(d);
          const Tensor yc = x.cpu.index_select(idx, di), yg = x.gpu.index_select(to_gpu(idx), di);
          ASSERT_TRUE(gpu_result(yg, yc));
          EXPECT_TRUE(same_bits(yg, yc));
        }
  // A strided index vector (every other element of a longer one).
  const Tensor x = random_any(Shape({9, 4}), dt, 1, -100, 100);
  const Both idx = make_both(index_tensor(random_indices(10, 9, 2), Shape({5, 2}), DType::I64),
                             [](const Tensor& t) { return t.narrow(1, 0, 1).squeeze(1); });
  ASSERT_FALSE(idx.gpu.is_contiguous());
  EXPECT_TRUE(same_bits(to_gpu(x).index_select(idx.gpu, 0), x.index_select(idx.cpu, 0)));
}

TEST_P(CudaIndexP, Gather) {
  const DType dt = GetParam();
  ASSERT_TRUE(has_kernel(OpId::gather, kGpu, dt));
  uint64_t seed = 900;
  const std::vector<size_t> dims = {4, 9, 6};
  for (size_t d = 0; d < 3; ++d)
    for (size_t j : {size_t{1}, size_t{5}, size_t{13}})
      for (LayoutKind lk : kAllLayouts) {
        SCOPED_TRACE("dim " + std::to_string(d) + " J " + std::to_string(j) + " " + layout_name(lk));
        const Both x = on_both(random_any(Shape(dims), dt, ++seed, -100, 100), lk);
        std::vector<size_t> idims = dims;
        idims[d] = j;
        const DType idt = (seed & 1) ? DType::I64 : DType::U32;
        const Both idx = on_both(
            index_tensor(random_indices(Shape(idims).elem_count(), dims[d], ++seed), Shape(idims), idt),
            lk);
        const int64_t di = static_cast<int64_t>(d);
        const Tensor yc = x.cpu.gather(idx.cpu, di), yg = x.gpu.gather(idx.gpu, di);
        ASSERT_TRUE(gpu_result(yg, yc));
        EXPECT_TRUE(same_bits(yg, yc));
      }
  const Tensor x = random_any(Shape({3, 1100}), dt, 5, -100, 100);
  const Tensor idx = index_tensor(random_indices(3 * 1500, 1100, 6), Shape({3, 1500}), DType::I64);
  EXPECT_TRUE(same_bits(to_gpu(x).gather(to_gpu(idx), 1), x.gather(idx, 1)));
}

TEST_P(CudaIndexP, ScatterAdd) {
  const DType dt = GetParam();
  ASSERT_TRUE(has_kernel(OpId::scatter_add, kGpu, dt));
  uint64_t seed = 1100;
  const std::vector<size_t> dims = {4, 9, 6};
  for (size_t d = 0; d < 3; ++d)
    for (size_t j : {size_t{1}, size_t{5}, size_t{13}})
      for (LayoutKind lk : kAllLayouts) {
        SCOPED_TRACE("dim " + std::to_string(d) + " J " + std::to_string(j) + " " + layout_name(lk));
        const Both x = on_both(small_ints(Shape(dims), dt, ++seed), lk);
        std::vector<size_t> idims = dims;
        idims[d] = j;
        const DType idt = (seed & 1) ? DType::I64 : DType::U32;
        const Tensor idx =
            index_tensor(random_indices(Shape(idims).elem_count(), dims[d], ++seed), Shape(idims), idt);
        const Both src = on_both(small_ints(Shape(idims), dt, ++seed), lk);
        const int64_t di = static_cast<int64_t>(d);
        const Tensor yc = x.cpu.scatter_add(idx, src.cpu, di);
        const Tensor yg = x.gpu.scatter_add(to_gpu(idx), src.gpu, di);
        ASSERT_TRUE(gpu_result(yg, yc));
        EXPECT_TRUE(same_bits(yg, yc));
      }
  // Many rows hitting a few indices (the half types: 200 hits, exact there; the others 20000).
  const size_t rows = is_half(dt) ? 200 : 20000;
  std::vector<int64_t> iv(rows * 8);
  for (size_t i = 0; i < iv.size(); ++i) iv[i] = (i % 7 == 0) ? 3 : 0;
  const Tensor idx = index_tensor(iv, Shape({rows, 8}), DType::I64);
  const Tensor x = small_ints(Shape({4, 8}), dt, 1);
  const Tensor src =
      is_float(dt) ? random_tensor(Shape({rows, 8}), DType::F64, 2, -1.99, 2.0).to_dtype(DType::I64).to_dtype(dt)
                   : random_tensor(Shape({rows, 8}), dt, 2, 0.0, 3.0);
  const Tensor yg = to_gpu(x).scatter_add(to_gpu(idx), to_gpu(src), 0);
  EXPECT_TRUE(same_bits(yg, x.scatter_add(idx, src, 0))) << "many hits, small integers";
  // The input is not modified (the output is a copy).
  const Tensor xg = to_gpu(x);
  (void)xg.scatter_add(to_gpu(idx), to_gpu(src), 0);
  EXPECT_TRUE(same_bits(xg, x)) << "the input changed";
}

TEST_P(CudaIndexP, Cat) {
  const DType dt = GetParam();
  ASSERT_TRUE(has_kernel(OpId::cat, kGpu, dt));
  uint64_t seed = 1300;
  for (size_t d = 0; d < 3; ++d)
    for (LayoutKind lk : kAllLayouts) {
      SCOPED_TRACE("dim " + std::to_string(d) + " " + layout_name(lk));
      std::vector<std::vector<size_t>> dims = {{2, 3, 4}, {2, 3, 4}, {2, 3, 4}, {2, 3, 4}};
      dims[0][d] = 1;
      dims[1][d] = 7;
      dims[2][d] = 33;
      dims[3][d] = 0;
      std::vector<Tensor> tc, tg;
      for (size_t i = 0; i < dims.size(); ++i) {
        const Both t = on_both(random_any(Shape(dims[i]), dt, ++seed, -100, 100),
                               i == 1 ? LayoutKind::Contiguous : lk);
        tc.push_back(t.cpu);
        tg.push_back(t.gpu);
      }
      const int64_t di = static_cast<int64_t>(d);
      const Tensor yc = Tensor::cat(tc, di), yg = Tensor::cat(tg, di);
      ASSERT_TRUE(gpu_result(yg, yc));
      EXPECT_TRUE(same_bits(yg, yc));
    }
  const Tensor a = random_any(Shape({1000, 3}), dt, 1, -100, 100);
  const Tensor b = random_any(Shape({1200, 3}), dt, 2, -100, 100);
  EXPECT_TRUE(same_bits(Tensor::cat({to_gpu(a), to_gpu(b)}, 0), Tensor::cat({a, b}, 0)));
}

// narrow is a view (no kernel); its backward is narrow_bwd, directly and through autograd.
TEST_P(CudaIndexP, NarrowAndNarrowBwd) {
  const DType dt = GetParam();
  ASSERT_TRUE(has_kernel(OpId::narrow_bwd, kGpu, dt));
  uint64_t seed = 1500;
  const std::vector<size_t> gdims = {3, 5, 7};
  for (size_t d = 0; d < 3; ++d)
    for (size_t start : {size_t{0}, size_t{2}})
      for (LayoutKind lk : kAllLayouts) {
        SCOPED_TRACE("dim " + std::to_string(d) + " start " + std::to_string(start) + " " +
                     layout_name(lk));
        const Both g = on_both(random_any(Shape(gdims), dt, ++seed, -100, 100), lk);
        const size_t full = gdims[d] + start + 4;
        OpAttrs a;
        a.i0 = static_cast<int64_t>(d);
        a.ints = {static_cast<int64_t>(start), static_cast<int64_t>(full)};
        const Tensor yc = dispatch1(OpId::narrow_bwd, {g.cpu}, a);
        const Tensor yg = dispatch1(OpId::narrow_bwd, {g.gpu}, a);
        ASSERT_TRUE(gpu_result(yg, yc));
        EXPECT_TRUE(same_bits(yg, yc));
        // The forward view on the GPU, and its gradient through autograd (float dtypes).
        const int64_t di = static_cast<int64_t>(d);
        EXPECT_TRUE(same_bits(g.gpu.narrow(di, 1, 2), g.cpu.narrow(di, 1, 2)));
        if (!is_float(dt)) continue;
        std::vector<size_t> xdims = gdims;
        xdims[d] = full;
        const Tensor x = random_tensor(Shape(xdims), dt, ++seed);
        const Var vc = Var::from_tensor(x), vg = Var::from_tensor(to_gpu(x));
        const std::optional<Tensor> dc = vc.narrow(di, start, gdims[d]).backward(g.cpu).get(vc);
        const std::optional<Tensor> dg = vg.narrow(di, start, gdims[d]).backward(g.gpu).get(vg);
        ASSERT_TRUE(dc && dg);
        EXPECT_EQ(dg->device(), kGpu);
        EXPECT_TRUE(same_bits(*dg, *dc)) << "the gradient of narrow";
      }
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaIndexP, ::testing::ValuesIn(kAllTypes),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

// scatter_add of random floats with many rows on a few indices (the sorted plan of
// cuda/index.cu: long J, few columns): the same bits twice (no float atomics), and the CPU's
// bits (each output adds its contributions in source order, in the CPU's precision: bf16/f16
// add in f32 and round once per add), every float dtype; plus a bound against the CPU's f64
// result, which holds whatever the order.
TEST_F(CudaIndex, ScatterAddManyHitsIsDeterministic) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const size_t rows = 100000, cols = 8;
    std::vector<int64_t> iv(rows * cols);
    for (size_t i = 0; i < iv.size(); ++i) iv[i] = (i % 11 == 0) ? 2 : 0;
    const Tensor idx = Tensor::from_vector(iv, Shape({rows, cols}));
    const Tensor src = random_tensor(Shape({rows, cols}), dt, 3, -1.0, 1.0);
    const Tensor x = random_tensor(Shape({4, cols}), dt, 4);
    const Tensor ig = to_gpu(idx), sg = to_gpu(src), xg = to_gpu(x);
    const Tensor y1 = xg.scatter_add(ig, sg, 0), y2 = xg.scatter_add(ig, sg, 0);
    EXPECT_TRUE(same_bits(y1, y2, Cmp::Bits)) << "the same scatter_add twice";
    EXPECT_TRUE(same_bits(y1, x.scatter_add(idx, src, 0))) << "the CPU's bits";
    if (is_half(dt)) continue;  // rounded per add in the half type: no summation bound
    const Tensor ref = x.to_dtype(DType::F64).scatter_add(idx, src.to_dtype(DType::F64), 0);
    const Tensor scale = x.to_dtype(DType::F64).abs().scatter_add(idx, src.to_dtype(DType::F64).abs(), 0);
    const std::vector<double> rv = values(ref), sv = values(scale);
    std::vector<double> bound(rv.size());
    for (size_t i = 0; i < rv.size(); ++i)
      bound[i] = unit_roundoff(dt) * std::abs(rv[i]) +
                 2.0 * static_cast<double>(rows + 4) * compute_u(dt) * sv[i];
    EXPECT_TRUE(within(values(y1), rv, bound));
  }
}

// scatter_add with one index per row, broadcast over the columns, as index_select's backward (the
// embedding's) makes it: the row plan sorts the J indices alone and adds each run of equal
// indices row by row. The CPU's bits in every float dtype and index type, with a run of 5 000
// rows on one index (a padding token), rows on many others, and a strided src; the bf16 case
// rounds per add, so a change of order would show.
TEST_F(CudaIndex, ScatterAddOneIndexPerRowMatchesTheCpu) {
  for (DType dt : kFloatTypes)
    for (DType idt : {DType::I64, DType::U32}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + std::string(dtype_name(idt)));
      const size_t rows = 7000, cols = 37, table = 300;
      std::vector<int64_t> iv(rows);
      for (size_t i = 0; i < rows; ++i) iv[i] = i % 7 < 5 ? 0 : static_cast<int64_t>((i * 131) % table);
      const Tensor idx = index_tensor(iv, Shape({rows, 1}), idt);  // broadcast on each device
      const Tensor src = random_tensor(Shape({cols, rows}), dt, 5, -1.0, 1.0).t();  // strided
      const Tensor x = random_tensor(Shape({table, cols}), dt, 6);
      const Tensor y =
          to_gpu(x).scatter_add(to_gpu(idx).broadcast_as({rows, cols}), to_gpu(src), 0);
      EXPECT_TRUE(same_bits(y, x.scatter_add(idx.broadcast_as({rows, cols}), src, 0)));
    }
}

// The kernels check indices (the host does not read them): the op returns, and the next
// synchronisation (a copy to the host, synchronize()) raises the Error naming the op, the index,
// the dim and its size. Once: the device goes on afterwards.
TEST_F(CudaIndex, OutOfRangeIndexOnTheGpuThrowsErrorNamingTheOp) {
  const Tensor x = random_tensor(Shape({5, 4}), DType::F32, kGpu, 1);
  const Tensor bad = to_gpu(index_tensor({0, 7, 1}, Shape({3}), DType::I64));
  const Tensor bad2 = to_gpu(index_tensor({0, 1, 2, 3, 4, 9, 0, 1}, Shape({2, 4}), DType::U32));
  // Long rows (the row-move kernel) and single elements (the element kernel).
  const Tensor wide = random_tensor(Shape({5, 64}), DType::F32, kGpu, 3);
  const Tensor src = random_tensor(Shape({2, 4}), DType::F32, kGpu, 2);
  const Tensor many = to_gpu(index_tensor(std::vector<int64_t>(200, -2), Shape({100, 2}), DType::I64));
  const std::vector<std::tuple<std::string, std::function<Tensor()>, std::string>> cases = {
      {"index_select", [&] { return x.index_select(bad, 0); }, "index 7 is out of range for dim 0 of size 5"},
      {"index_select rows", [&] { return wide.index_select(bad, 0); }, "index 7"},
      {"gather", [&] { return x.gather(bad2, 0); }, "index 9 is out of range for dim 0 of size 5"},
      {"scatter_add (serial)", [&] { return x.scatter_add(bad2, src, 0); }, "index 9"},
      {"scatter_add (rows)",
       [&] {
         return Tensor::zeros(Shape({3, 70}), DType::F32, kGpu)
             .scatter_add(to_gpu(index_tensor(std::vector<int64_t>(100, 5), Shape({100, 1}), DType::I64))
                              .broadcast_as({100, 70}),
                          random_tensor(Shape({100, 70}), DType::F32, kGpu, 4), 0);
       },
       "index 5 is out of range for dim 0 of size 3"},
      {"scatter_add (sorted)",
       [&] {
         return Tensor::zeros(Shape({3, 2}), DType::F32, kGpu)
             .scatter_add(many, random_tensor(Shape({100, 2}), DType::F32, kGpu, 4), 0);
       },
       "index -2 is out of range for dim 0 of size 3"},
  };
  for (const auto& [name, run, says] : cases) {
    SCOPED_TRACE(name);
    Tensor y;
    EXPECT_NO_THROW(y = run());
    const std::string m = error_of([&] { (void)values(y); });
    EXPECT_TRUE(contains(m, name.substr(0, name.find(' '))) && contains(m, says)) << m;
    EXPECT_NO_THROW(synchronize(kGpu));  // reported once
  }
  const std::string m = error_of([&] {
    (void)x.index_select(bad, 0);
    synchronize(kGpu);
  });
  EXPECT_TRUE(contains(m, "index_select") && contains(m, "index 7")) << m;
  // The device is still usable afterwards.
  EXPECT_TRUE(same_bits(x + x, to_cpu(x) + to_cpu(x)));
  EXPECT_TRUE(same_bits(x.index_select(to_gpu(index_tensor({4, 0}, Shape({2}), DType::I64)), 0),
                        to_cpu(x).index_select(index_tensor({4, 0}, Shape({2}), DType::I64), 0)));
}

// ---- fused ops: the CUDA kernels against the CPU kernels, the composed forms, the reference -----

// The ops, inputs, reference and bound are test_fused.cpp's (tests/fused_cases.h).

using FusedParam = std::tuple<FOp, DType, LayoutKind>;
class CudaFusedForward : public CudaParamTest<FusedParam> {};

TEST_P(CudaFusedForward, OnGpuMatchesCpuKernelComposedFormAndReference) {
  const auto [op, dt, layout] = GetParam();
  std::vector<std::pair<Shape, size_t>> shapes;  // (shape, groups)
  if (op == FOp::GroupNorm) {
    shapes = {{Shape({3, 4}), 4},         {Shape({2, 6, 7}), 3},    {Shape({1, 8, 33}), 2},
              {Shape({2, 4, 10, 100}), 2}, {Shape({1, 6, 4099}), 3}, {Shape({67, 4, 7}), 2},
              {Shape({1, 2, 40000}), 1}, {Shape({64, 4, 3000}), 2},  // looped rows
              {Shape({64, 4, 16400}), 2},  // a cluster of 2 to 8 blocks per group
              {Shape({300, 32, 64}), 8},  // many aligned groups: the pipelined rows
              // chunks in one cooperative launch (fwd_chunk_grid_kernel): 2 to 16 a group ...
              {Shape({2, 8, 64, 64}), 4}, {Shape({1, 8, 128, 128}), 2},
              // ... and too many blocks for one (512 on a 132-SM device): two launches, and
              // with more than 256 chunks a row, fwd_merge_kernel between them
              {Shape({2, 64, 128, 128}), 2}, {Shape({1, 8, 512, 512}), 1}};
  } else {
    for (size_t D : {1, 7, 33, 1000, 4099})
      for (size_t R : {1, 67}) shapes.push_back({Shape({R, D}), 1});
    shapes.push_back({Shape({2, 3, 50}), 1});
    shapes.push_back({Shape({2, 262147}), 1});  // longer than any on-chip row
    // Many rows too long for a block's team: one block loops over each (fwd_loop_kernel).
    shapes.push_back({Shape({130, 8000}), 1});
    // ... but the half types' take 512-thread rows, and f32's 1024-thread rows (layer_norm's
    // pipelined)
    shapes.push_back({Shape({130, 12000}), 1});
    shapes.push_back({Shape({130, 4000}), 1});  // f64's loop
    shapes.push_back({Shape({129, 6001}), 1});  // unaligned: not looped
    shapes.push_back({Shape({128, 32776}), 1});  // a cluster of blocks per row (2 to 8)
    // Aligned rows, many more than the device holds at once: the pipelined row kernels'
    // blocks take 3 to 6 rows (row groups) each, so their three stages are refilled.
    shapes.push_back({Shape({14000, 520}), 1});
    // Rows that fill every vector of their team (no padding): whole warps (1024) and teams of
    // 8 lanes, four rows a warp, with refilled stages (3000 x 256).
    shapes.push_back({Shape({67, 1024}), 1});
    shapes.push_back({Shape({3000, 256}), 1});
  }
  if (op == FOp::GroupNorm) shapes.push_back({Shape({1, 16, 128, 129}), 4});  // few large groups
  uint64_t seed = 100;
  for (const auto& [s, groups] : shapes)
    for (bool affine : {true, false}) {
      if (!is_norm(op) && !affine) continue;
      SCOPED_TRACE(std::string(fop_name(op)) + " " + s.to_string() + (affine ? " affine" : " plain") +
                   " G=" + std::to_string(groups));
      const Problem p = make_problem(op, dt, s, ++seed, affine, groups);
      const Expected e = reference(p);
      const Both x = on_both(p.x, layout);
      const Problem pc = with_input(p, x.cpu), pg = with_input(p, x.gpu);
      const Tensor yc = run_public(pc, false), yg = run_public(pg, false);
      Tensor ygc;  // the composed form on the GPU, as the dispatcher runs it
      {
        ComposedOnlyGuard composed;
        ygc = run_public(pg, false);
      }
      ASSERT_TRUE(yg.device() == kGpu && yg.dtype() == dt && yg.shape() == s);
      const std::vector<double> gv = values(yg), cv = values(yc), gcv = values(ygc);
      EXPECT_TRUE(at_floor(gv, e.y, e.scale, dt, 0.5)) << "gpu vs the f64 reference";
      if (is_half(dt)) {
        EXPECT_TRUE(at_floor(gv, cv, e.scale, dt, 1.0)) << "gpu vs the cpu kernel";
        EXPECT_TRUE(at_floor(gv, gcv, e.scale, dt, 1.0)) << "gpu vs the composed form on the gpu";
      } else {
        const double tol = dt == DType::F64 ? 1e-10 : 1e-5;
        EXPECT_TRUE(at_floor(gv, cv, e.scale, DType::F64, 0.0, tol / compute_u(DType::F64)))
            << "gpu vs the cpu kernel, relative " << tol;
        EXPECT_TRUE(at_floor(gv, gcv, e.scale, DType::F64, 0.0, tol / compute_u(DType::F64)))
            << "gpu vs the composed form on the gpu, relative " << tol;
      }
      EXPECT_EQ(values(run_public(pg, false)), gv) << "a second run gives other bits";
    }
}

INSTANTIATE_TEST_SUITE_P(
    Cuda, CudaFusedForward,
    ::testing::Combine(::testing::Values(FOp::Softmax, FOp::LogSoftmax, FOp::RmsNorm,
                                         FOp::LayerNorm, FOp::GroupNorm),
                       ::testing::ValuesIn(kFloatTypes),
                       ::testing::Values(LayoutKind::Contiguous, LayoutKind::Transposed)),
    [](const ::testing::TestParamInfo<FusedParam>& i) {
      return std::string(fop_name(std::get<0>(i.param))) + "_" +
             std::string(dtype_name(std::get<1>(i.param))) + "_" +
             layout_name(std::get<2>(i.param));
    });

/// Forward and every gradient of a fused op with upstream `up` (test_fused_grad.cpp's run).
struct FusedGrads {
  std::vector<double> y, dx, dw, db;
};

FusedGrads run_grads(const Problem& in, const Tensor& up) {
  const Var x = Var::from_tensor(in.x);
  Var w, b;
  Problem v{in.op, x, in.w, in.b, in.groups};
  if (in.w.elem_count()) v.w = w = Var::from_tensor(in.w);
  if (in.b.elem_count() && in.op != FOp::RmsNorm) v.b = b = Var::from_tensor(in.b);
  const Tensor y = run_public(v, false);
  const GradStore g = (y.to_dtype(DType::F64) * up.to_dtype(DType::F64)).sum_all().backward();
  FusedGrads r;
  r.y = values(y);
  EXPECT_TRUE(g.get(x).has_value()) << "no gradient for x";
  if (g.get(x)) {
    EXPECT_EQ(g.get(x)->device(), in.x.device());
    r.dx = values(*g.get(x));
  }
  if (w.defined() && g.get(w)) r.dw = values(*g.get(w));
  if (b.defined() && g.get(b)) r.db = values(*g.get(b));
  return r;
}

using FusedBwdParam = std::tuple<FOp, DType, bool>;
class CudaFusedBackward : public CudaParamTest<FusedBwdParam> {};

TEST_P(CudaFusedBackward, GradientsOnGpuMatchCpu) {
  const auto [op, dt, transposed] = GetParam();
  const Shape s = op == FOp::GroupNorm ? Shape({3, 8, 5, 7}) : Shape({9, 37});
  const Problem p = make_problem(op, dt, s, 11, true, op == FOp::GroupNorm ? 4 : 1);
  const Tensor up = random_tensor(s, dt, 99);
  const Both x = on_both(p.x, transposed ? LayoutKind::Transposed : LayoutKind::Contiguous);
  const Problem pc = with_input(p, x.cpu), pg = with_input(p, x.gpu);
  const FusedGrads c = run_grads(pc, up), g = run_grads(pg, to_gpu(up));
  if (is_norm(op)) {
    EXPECT_FALSE(g.dw.empty()) << "no gradient for w";
  }
  if (op == FOp::LayerNorm || op == FOp::GroupNorm) {
    EXPECT_FALSE(g.db.empty()) << "no gradient for b";
  }
  if (is_half(dt)) {
    // Both at the rounding floor of the f64 gradients (the CPU's fused f64 run).
    const Problem p64{op, p.x.to_dtype(DType::F64), p.w.to_dtype(DType::F64),
                      p.b.to_dtype(DType::F64), p.groups};
    const FusedGrads r = run_grads(p64, up);
    EXPECT_TRUE(at_rounding_floor(g.y, r.y, dt)) << "y";
    EXPECT_TRUE(at_rounding_floor(g.dx, r.dx, dt)) << "dx";
    EXPECT_TRUE(at_rounding_floor(g.dw, r.dw, dt)) << "dw";
    EXPECT_TRUE(at_rounding_floor(g.db, r.db, dt)) << "db";
  } else {
    const double tol = dt == DType::F64 ? 1e-10 : 1e-5;
    // log-softmax y = (x - m) - log s: near a row's max it is -log s, and log s inherits an
    // absolute error of a few u_c from the sum's rounding (ds / s), large against a small log s
    // (measured: 3.5e-7 on -0.013 on the H200): y's error is taken against the forward test's
    // scale for log-softmax, which is at least 1.
    const double y_atol = op == FOp::LogSoftmax ? tol : tol * 1e-2;
    EXPECT_TRUE(all_close(g.y, c.y, tol, y_atol)) << "y";
    EXPECT_TRUE(all_close(g.dx, c.dx, tol, tol * 1e-2)) << "dx";
    EXPECT_TRUE(all_close(g.dw, c.dw, tol, tol * 1e-2)) << "dw";
    EXPECT_TRUE(all_close(g.db, c.db, tol, tol * 1e-2)) << "db";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cuda, CudaFusedBackward,
    ::testing::Combine(::testing::Values(FOp::Softmax, FOp::LogSoftmax, FOp::RmsNorm,
                                         FOp::LayerNorm, FOp::GroupNorm),
                       ::testing::ValuesIn(kFloatTypes), ::testing::Bool()),
    [](const ::testing::TestParamInfo<FusedBwdParam>& i) {
      return std::string(fop_name(std::get<0>(i.param))) + "_" +
             std::string(dtype_name(std::get<1>(i.param))) +
             (std::get<2>(i.param) ? "_transposed" : "_contiguous");
    });

// The dedicated softmax backward ops on the GPU (their composed forms there) against the CPU
// kernels, with the forward's saved (max, log-sum) from the CPU kernel; NaN rows included.
// Rows unaligned (33, 4099) and aligned (1024: a warp's; 16384: a block's of 1024 threads in the
// half types' softmax backward, else a cluster's), few and many (7000 rows: the pipelined kernels'
// blocks take about four each, so their stages are refilled; (200, 12000): the half types'
// 1024-thread blocks take one or two rows, their last vectors absent).
TEST_F(CudaFused, SoftmaxBackwardOpsMatchCpuKernels) {
  for (bool log : {false, true})
    for (DType dt : kFloatTypes) {
      SCOPED_TRACE(std::string(log ? "log_softmax " : "softmax ") + std::string(dtype_name(dt)));
      const OpId fwd = log ? OpId::log_softmax_last_dim : OpId::softmax_last_dim;
      const OpId bwd = log ? OpId::log_softmax_last_dim_bwd : OpId::softmax_last_dim_bwd;
      const KernelSlot& kf = op_def(fwd).kernels[static_cast<int>(DeviceKind::Cpu)];
      ASSERT_NE(kf.fn, nullptr);
      for (const auto& [R, D] : std::vector<std::pair<size_t, size_t>>{
               {6, 33}, {6, 4099}, {6, 1024}, {6, 16384}, {7000, 520}, {200, 12000}}) {
        std::vector<double> x = values(Tensor::randn(Shape({R, D}), DType::F64, kCpu, 81));
        x[4] = kNaN;
        for (size_t i = 0; i < D; ++i) x[D + i] = -kInf;
        x[2 * D + 5] = kInf;
        for (size_t i = 0; i < D; i += 4) x[3 * D + i] = -kInf;
        const Tensor xt = Tensor::from_vector(x, Shape({R, D})).to_dtype(dt);
        const Tensor dy = Tensor::randn(Shape({R, D}), dt, kCpu, 82);
        const Tensor stats = kf.fn({xt}, OpAttrs{})[1];
        const std::vector<double> want = values(dispatch1(bwd, {xt, stats, dy}));
        const Tensor got = dispatch1(bwd, {to_gpu(xt), to_gpu(stats), to_gpu(dy)});
        ASSERT_EQ(got.device(), kGpu);
        const std::vector<double> gv = values(got);
        ASSERT_EQ(gv.size(), want.size());
        const double tol = dt == DType::F64 ? 1e-12 : (dt == DType::F32 ? 1e-5 : 1e-2);
        std::vector<double> bound(want.size());
        for (size_t i = 0; i < want.size(); ++i)
          bound[i] = tol * (1.0 + (std::isfinite(want[i]) ? std::abs(want[i]) : 0.0));
        EXPECT_TRUE(within(gv, want, bound)) << R << " x " << D;
      }
    }
}

// Fused ops back to back, each reading what the one before wrote: their row kernels are
// programmatic dependent launches (cuda_common.cuh's pdl_begin), whose blocks may start while
// the kernel before them still runs. The chain and its backward (the norms' dw/db folds among
// them) give the same bits as the same ops run one at a time, the device synchronised after
// each, where a kernel that read its input before the one writing it had finished would not.
TEST_F(CudaFused, BackToBackOpsSeeTheirInputs) {
  constexpr size_t R = 4096, D = 1024;
  constexpr int kLinks = 3;  // rms_norm, softmax, layer_norm each
  for (DType dt : {DType::BF16, DType::F32}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    uint64_t seed = 90;
    auto rnd = [&](Shape sh) { return to_gpu(Tensor::randn(sh, dt, kCpu, ++seed)); };
    const Tensor x0 = rnd(Shape({R, D})), up = rnd(Shape({R, D}));
    std::vector<std::function<Tensor(const Tensor&)>> chain;
    std::vector<std::optional<Var>> w_of, b_of;  // each op's weight and bias, where it has them
    for (int i = 0; i < kLinks; ++i) {
      const Var wr = Var::from_tensor(rnd(Shape({D}))), wl = Var::from_tensor(rnd(Shape({D})));
      const Var bl = Var::from_tensor(rnd(Shape({D})));
      chain.push_back([wr](const Tensor& t) { return ops::rms_norm(t, wr, 1e-5); });
      chain.push_back([](const Tensor& t) { return ops::softmax_last_dim(t); });
      chain.push_back([wl, bl](const Tensor& t) { return ops::layer_norm(t, wl, bl, 1e-5); });
      w_of.insert(w_of.end(), {wr, std::nullopt, wl});
      b_of.insert(b_of.end(), {std::nullopt, std::nullopt, bl});
    }
    const Var x = Var::from_tensor(x0);
    Tensor y = x;
    for (const auto& f : chain) y = f(y);
    const GradStore g = y.backward(up);

    std::vector<Tensor> in{x0};  // one at a time: each op's input
    for (const auto& f : chain) {
      in.push_back(f(in.back()));
      synchronize(kGpu);
    }
    EXPECT_TRUE(same_bits(y, in.back()));
    Tensor gr = up;
    std::vector<std::optional<Tensor>> dw(chain.size()), db(chain.size());
    for (size_t k = chain.size(); k-- > 0;) {
      const Var xi = Var::from_tensor(in[k]);
      const GradStore gk = chain[k](xi).backward(gr);
      synchronize(kGpu);
      ASSERT_TRUE(gk.get(xi).has_value());
      gr = *gk.get(xi);
      if (w_of[k]) dw[k] = gk.get(*w_of[k]);
      if (b_of[k]) db[k] = gk.get(*b_of[k]);
    }
    ASSERT_TRUE(g.get(x).has_value());
    EXPECT_TRUE(same_bits(*g.get(x), gr)) << "dx";
    for (size_t k = 0; k < chain.size(); ++k) {
      SCOPED_TRACE("op " + std::to_string(k));
      if (w_of[k]) {
        const auto want = g.get(*w_of[k]);
        ASSERT_TRUE(want.has_value() && dw[k].has_value());
        EXPECT_TRUE(same_bits(*want, *dw[k])) << "dw";
      }
      if (b_of[k]) {
        const auto want = g.get(*b_of[k]);
        ASSERT_TRUE(want.has_value() && db[k].has_value());
        EXPECT_TRUE(same_bits(*want, *db[k])) << "db";
      }
    }
  }
}

// The dedicated norm backward ops on the GPU against the CPU's (kernels where each device has
// one, else their composed forms), every output asked for, with the statistics the CPU forward
// kernel saved; twice on the GPU for the same bits (dw and db reduce in a fixed order). Rows
// short and long (262147 elements: streamed), group norm with few large groups (split over
// blocks) and many small ones. Tolerance: f64 1e-10, f32 1e-5, bf16/f16 1e-2 of (1 + |ref|).
TEST_F(CudaFused, NormBackwardOpsMatchCpuAndAreDeterministic) {
  struct NormCase {
    OpId fwd, bwd;
    Shape shape;
    size_t groups;
  };
  const std::vector<NormCase> cases = {
      {OpId::rms_norm, OpId::rms_norm_bwd, Shape({37, 33}), 1},
      {OpId::rms_norm, OpId::rms_norm_bwd, Shape({3, 262147}), 1},
      {OpId::rms_norm, OpId::rms_norm_bwd, Shape({2051, 768}), 1},
      // 512 blocks of two rows: about six rows each, the pipelined rows' stages refilled
      {OpId::rms_norm, OpId::rms_norm_bwd, Shape({6000, 768}), 1},
      {OpId::layer_norm, OpId::layer_norm_bwd, Shape({37, 33}), 1},
      {OpId::layer_norm, OpId::layer_norm_bwd, Shape({3, 262147}), 1},
      {OpId::layer_norm, OpId::layer_norm_bwd, Shape({2051, 768}), 1},
      {OpId::layer_norm, OpId::layer_norm_bwd, Shape({6000, 768}), 1},
      // aligned long rows (bwd_rows_kernel, 512 threads, pipelined: the half types 2 and 4
      // vectors a thread; f32 4, 8192 in one block, 12000 in a cluster of two blocks of 6000;
      // 12000: the last vectors absent), f64's chunks; 12004: f32's 3001 vectors do not split
      // in two, 8 a thread from memory (the half types' rows are not aligned: chunks)
      {OpId::rms_norm, OpId::rms_norm_bwd, Shape({300, 8192}), 1},
      {OpId::layer_norm, OpId::layer_norm_bwd, Shape({300, 8192}), 1},
      {OpId::rms_norm, OpId::rms_norm_bwd, Shape({130, 12000}), 1},
      {OpId::layer_norm, OpId::layer_norm_bwd, Shape({130, 12000}), 1},
      {OpId::layer_norm, OpId::layer_norm_bwd, Shape({130, 12004}), 1},
      // fewer rows than the long-row kernel's blocks: the chunk kernels (the half types'
      // pipelined; 4 to 8 chunks a row), 4 rows a sums block
      {OpId::rms_norm, OpId::rms_norm_bwd, Shape({100, 8192}), 1},
      {OpId::layer_norm, OpId::layer_norm_bwd, Shape({100, 8192}), 1},
      {OpId::group_norm, OpId::group_norm_bwd, Shape({3, 8, 5, 7}), 4},
      {OpId::group_norm, OpId::group_norm_bwd, Shape({1, 16, 128, 129}), 4},
      {OpId::group_norm, OpId::group_norm_bwd, Shape({9, 64, 3, 3}), 32},
      // rows of 1000: dx teams of 64 threads (f64 128), four (two) a block
      {OpId::group_norm, OpId::group_norm_bwd, Shape({2, 8, 500}), 4},
      // whole pieces of 4096 (f64 2048) elements a channel: one cooperative launch
      // (gn_bwd_grid_kernel) ...
      {OpId::group_norm, OpId::group_norm_bwd, Shape({2, 8, 64, 64}), 4},
      {OpId::group_norm, OpId::group_norm_bwd, Shape({1, 8, 128, 128}), 2},
      // one channel, one block (f64: two): the block folds dw, then db
      {OpId::group_norm, OpId::group_norm_bwd, Shape({1, 1, 64, 64}), 1},
      // ... and too many pieces for one (512 on a 132-SM device): the pipelined sums and dx
      // kernels (gn_bwd_pipe_kernel), 2 to 4 pieces a block; with 512 channel sums a group, the
      // row sums from sums_merge_kernel
      {OpId::group_norm, OpId::group_norm_bwd, Shape({2, 64, 128, 128}), 2},
      {OpId::group_norm, OpId::group_norm_bwd, Shape({1, 512, 64, 64}), 1},
      // one pass, a cluster of blocks a row holding x and dy (gn_bwd_cluster_kernel), 256 and
      // more blocks: pieces of a channel run (the half types one a run, f32 two, f64 two in
      // 512-thread blocks) ...
      {OpId::group_norm, OpId::group_norm_bwd, Shape({16, 16, 128, 128}), 4},
      // ... and whole runs a block (the half types four, f32 two, in groups of 64 and 128
      // threads; f64 one)
      {OpId::group_norm, OpId::group_norm_bwd, Shape({16, 64, 64, 64}), 8},
  };
  uint64_t seed = 300;
  for (const NormCase& c : cases)
    for (DType dt : kFloatTypes)
      for (bool affine : {true, false}) {
        SCOPED_TRACE(std::string(op_name(c.bwd)) + " " + c.shape.to_string() + " " +
                     std::string(dtype_name(dt)) + (affine ? " affine" : " plain"));
        const bool group = c.fwd == OpId::group_norm;
        const size_t P = group ? c.shape[1] : c.shape[c.shape.rank() - 1];
        const Tensor x = random_tensor(c.shape, dt, ++seed, -2.0, 3.0);
        const Tensor dy = random_tensor(c.shape, dt, ++seed, -1.0, 1.0);
        const Tensor w = affine ? random_tensor(Shape({P}), dt, ++seed, 0.5, 1.5)
                                : Tensor::zeros(Shape({0}), dt, kCpu);
        const Tensor b = affine ? random_tensor(Shape({P}), dt, ++seed, -1.0, 1.0)
                                : Tensor::zeros(Shape({0}), dt, kCpu);
        OpAttrs fa;
        fa.f0 = kEps;
        fa.i0 = static_cast<int64_t>(c.groups);
        const KernelSlot& kf = op_def(c.fwd).kernels[static_cast<int>(DeviceKind::Cpu)];
        ASSERT_NE(kf.fn, nullptr);
        std::vector<Tensor> fin = {x, w};
        if (c.fwd != OpId::rms_norm) fin.push_back(b);
        const std::vector<Tensor> saved = kf.fn(fin, fa);  // {y, rstd} or {y, mean, rstd}
        std::vector<Tensor> in = {x, w};
        for (size_t i = 1; i < saved.size(); ++i) in.push_back(saved[i]);
        in.push_back(dy);
        OpAttrs ba;
        ba.i0 = fa.i0;
        ba.ints = {affine ? 1 : 0, affine && c.fwd != OpId::rms_norm ? 1 : 0};
        ba.dtype = dt;
        std::vector<Tensor> gin;
        for (const Tensor& t : in) gin.push_back(to_gpu(t));
        const std::vector<Tensor> want = dispatch(c.bwd, in, ba);
        const std::vector<Tensor> got = dispatch(c.bwd, gin, ba);
        const std::vector<Tensor> again = dispatch(c.bwd, gin, ba);
        ASSERT_EQ(got.size(), want.size());
        const double tol = dt == DType::F64 ? 1e-10 : (dt == DType::F32 ? 1e-5 : 1e-2);
        const char* names[] = {"dx", "dw", "db"};
        for (size_t k = 0; k < want.size(); ++k) {
          ASSERT_EQ(got[k].defined(), want[k].defined()) << names[k];
          if (!want[k].defined()) continue;
          EXPECT_EQ(got[k].device(), kGpu) << names[k];
          EXPECT_EQ(got[k].dtype(), want[k].dtype()) << names[k];
          const std::vector<double> wv = values(want[k]), gv = values(got[k]);
          ASSERT_EQ(gv.size(), wv.size()) << names[k];
          // dw and db are sums over many rows: scale the bound by the largest |ref|.
          double mx = 0;
          for (double v : wv) mx = std::max(mx, std::abs(v));
          std::vector<double> bound(wv.size());
          for (size_t i = 0; i < wv.size(); ++i)
            bound[i] = tol * (1.0 + std::abs(wv[i]) + (k ? mx : 0.0));
          EXPECT_TRUE(within(gv, wv, bound)) << names[k];
          EXPECT_EQ(values(again[k]), gv) << names[k] << ": a second run gives other bits";
        }
      }
}

// ---- gradient checks on the GPU (f64 central differences) ------------------------------------

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

/// test_grad.cpp's table (device-neutral) and the cross-device copy: the CUDA run of each.
const std::vector<GradCase>& cuda_grad_cases() {
  static const std::vector<GradCase> c = [] {
    std::vector<GradCase> v = grad_cases();
    v.push_back({"to_device", OpId::to_device, [](const std::vector<Tensor>& in) {
                   return in[0] * in[0];
                 },
                 {random_tensor(Shape({3, 5}), DType::F64, 1)}});
    return v;
  }();
  return c;
}

class CudaGradCheck : public CudaParamTest<size_t> {};

// grad_check makes the CPU inputs Vars; the function moves them to the GPU (a differentiable
// to_device), computes there and moves the result back, so the gradient crosses both ways.
TEST_P(CudaGradCheck, CentralDifferenceF64OnGpu) {
  const GradCase& gc = cuda_grad_cases()[GetParam()];
  const Fn f = gc.f;
  const Fn on_gpu = [f](const std::vector<Tensor>& in) {
    std::vector<Tensor> g;
    for (const Tensor& t : in) g.push_back(to_gpu(t));
    const Tensor y = f(g);
    EXPECT_EQ(y.device(), kGpu) << "the case did not compute on the GPU";
    return to_cpu(y);
  };
  EXPECT_TRUE(grad_check(on_gpu, gc.inputs, gc.tol)) << gc.name;
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaGradCheck,
                         ::testing::Range<size_t>(0, cuda_grad_cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& i) {
                           return cuda_grad_cases()[i.param].name;
                         });

// ---- attention_bwd: the op itself, CPU against CUDA, on the CPU forward's saved lse ----------

class CudaAttention : public OnCuda<::testing::Test> {};

// Head views (B, T, H * D) -> (B, H, T, D), as MultiHeadAttention makes them (strided).
Tensor attention_heads(const Tensor& x, size_t t, size_t d) {
  return x.reshape({2, t, 3, d}).permute({0, 2, 1, 3});
}

/// q (2, 3, T, D), k, v (2, 3, S, D) as head views, dout (2, 3, T, D) and a (2, 1, 1, S) mask
/// broadcast to the scores, of dtype dt, from seeds seed .. seed + 4.
struct AttnCase {
  Tensor q, k, v, dout, mask;
};
AttnCase attention_case(DType dt, size_t T, size_t S, size_t D, uint64_t seed) {
  return {attention_heads(random_tensor({2, T, 3 * D}, dt, seed), T, D),
          attention_heads(random_tensor({2, S, 3 * D}, dt, seed + 1), S, D),
          attention_heads(random_tensor({2, S, 3 * D}, dt, seed + 2), S, D),
          random_tensor({2, 3, T, D}, dt, seed + 3),
          random_tensor({2, 1, 1, S}, dt, seed + 4).broadcast_as({2, 3, T, S})};
}

/// The attention kernel of `kind` called directly: {out, lse} (dispatch returns only out).
std::vector<Tensor> attention_outputs(DeviceKind kind, const std::vector<Tensor>& in, double scale) {
  OpAttrs a;
  a.f0 = scale;
  return op_def(OpId::attention).kernels[static_cast<int>(kind)].fn(in, a);
}

// The kernels against the CPU's: head sizes of the register path (32, 40: kD 32 and 64; f64
// takes 40 on the plain kernels) and of the plain kernels (80), key counts within one staged tile
// and over several, query rows over two blocks, a (B, 1, 1, S) mask, strided q, k, v.
TEST_F(CudaAttention, ForwardMatchesTheCpu) {
  for (DType dt : kFloatTypes)
    for (size_t D : {size_t{32}, size_t{40}, size_t{80}})
      for (size_t S : {size_t{1}, size_t{7}, size_t{300}}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " D=" + std::to_string(D) +
                     " S=" + std::to_string(S));
        const auto [q, k, v, dout, m] = attention_case(dt, 70, S, D, 11);
        const auto cpu = attention_outputs(DeviceKind::Cpu, {q, k, v, m}, 0.15);
        const auto gpu = attention_outputs(
            DeviceKind::Cuda,
            {q.to_device(kGpu), k.to_device(kGpu), v.to_device(kGpu), m.to_device(kGpu)}, 0.15);
        const double tol = dt == DType::F64 ? 1e-12 : (dt == DType::F32 ? 1e-5 : 1e-2);
        EXPECT_TRUE(all_close(values(gpu[0].to_device(kCpu)), values(cpu[0]), tol, tol)) << "out";
        // lse is in the compute type: f32 or f64 whatever the storage.
        const double lt = dt == DType::F64 ? 1e-12 : 1e-5;
        EXPECT_TRUE(all_close(values(gpu[1].to_device(kCpu)), values(cpu[1]), lt, lt)) << "lse";
      }
}

TEST_F(CudaAttention, BackwardOpMatchesTheCpu) {
  for (DType dt : kFloatTypes)
    for (size_t D : {size_t{32}, size_t{40}, size_t{80}})
      for (size_t S : {size_t{7}, size_t{130}}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " D=" + std::to_string(D) +
                     " S=" + std::to_string(S));
        const auto [q, k, v, dout, mask] = attention_case(dt, 70, S, D, 1);
        OpAttrs a;
        a.f0 = 0.2;
        const auto saved = attention_outputs(DeviceKind::Cpu, {q, k, v, mask}, a.f0);
        const std::vector<Tensor> in = {q, k, v, mask, saved[0], saved[1], dout};
        std::vector<Tensor> gin;
        for (const Tensor& t : in) gin.push_back(t.to_device(kGpu));
        const auto cpu = dispatch(OpId::attention_bwd, in, a);
        const auto gpu = dispatch(OpId::attention_bwd, gin, a);
        const double tol = dt == DType::F64 ? 1e-10 : (dt == DType::F32 ? 1e-4 : 2e-2);
        for (size_t i = 0; i < 3; ++i)
          EXPECT_TRUE(all_close(values(gpu[i].to_device(kCpu)), values(cpu[i]), tol, tol)) << i;
      }
}

// Special rows as the CPU gives them: a row whose scores are all -inf is NaN (its lse NaN, its
// gradients NaN), a -inf score before finite ones adds nothing, S = 0 gives 0 and lse -inf.
TEST_F(CudaAttention, SpecialRowsMatchTheCpu) {
  for (DType dt : kFloatTypes)
    for (size_t D : {size_t{32}, size_t{80}}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " D=" + std::to_string(D));
      const double inf = std::numeric_limits<double>::infinity();
      const size_t T = 3, S = 5;
      const Tensor q = random_tensor({1, 1, T, D}, dt, 21), k = random_tensor({1, 1, S, D}, dt, 22);
      const Tensor v = random_tensor({1, 1, S, D}, dt, 23), dout = random_tensor({1, 1, T, D}, dt, 24);
      // Row 0: every score -inf; row 1: the first two -inf; row 2: none.
      std::vector<double> mv(T * S, 0.0);
      for (size_t s = 0; s < S; ++s) mv[s] = -inf;
      mv[S] = mv[S + 1] = -inf;
      const Tensor mask = Tensor::from_vector(mv, {1, 1, T, S}).to_dtype(dt);
      OpAttrs a;
      a.f0 = 0.3;
      const auto cpu = attention_outputs(DeviceKind::Cpu, {q, k, v, mask}, a.f0);
      const auto gpu = attention_outputs(
          DeviceKind::Cuda,
          {q.to_device(kGpu), k.to_device(kGpu), v.to_device(kGpu), mask.to_device(kGpu)}, a.f0);
      const double tol = dt == DType::F64 ? 1e-12 : (dt == DType::F32 ? 1e-5 : 1e-2);
      EXPECT_TRUE(all_close(values(gpu[0].to_device(kCpu)), values(cpu[0]), tol, tol)) << "out";
      const double lt = dt == DType::F64 ? 1e-12 : 1e-5;
      EXPECT_TRUE(all_close(values(gpu[1].to_device(kCpu)), values(cpu[1]), lt, lt)) << "lse";
      const std::vector<Tensor> in = {q, k, v, mask, cpu[0], cpu[1], dout};
      std::vector<Tensor> gin;
      for (const Tensor& t : in) gin.push_back(t.to_device(kGpu));
      const auto cb = dispatch(OpId::attention_bwd, in, a);
      const auto gb = dispatch(OpId::attention_bwd, gin, a);
      for (size_t i = 0; i < 3; ++i)
        EXPECT_TRUE(all_close(values(gb[i].to_device(kCpu)), values(cb[i]), 10 * tol, 10 * tol)) << i;
      const Tensor k0 = Tensor::zeros({1, 1, 0, D}, dt, kGpu);
      const auto empty = attention_outputs(DeviceKind::Cuda, {q.to_device(kGpu), k0, k0, Tensor()}, a.f0);
      EXPECT_EQ(values(empty[0].to_device(kCpu)), std::vector<double>(T * D, 0.0));
      EXPECT_EQ(values(empty[1].to_device(kCpu)), std::vector<double>(T, -inf));
    }
}

// bf16 (D <= 64) and f32 (D <= 32) take the tensor-core path: every operand enters as exact
// bf16 terms (f32 tensors as three), the probabilities and score gradients as two (bf16) or three
// (f32). So bf16 results are the exact ones rounded once, at test_fused_grad.cpp's floor against
// the f64 kernels fed the same (widened) inputs, and f32 results are within 128 f32 units of the
// largest value. An operand or P rounded to one bf16 term would be ~2^-9 off: past both bounds.
// D = 30 stages its tiles element by element (rows not a whole number of 16-byte loads); the
// others 16 bytes a load. The mask is (B, 1, 1, S), read once per key, or (1, 1, T, S), read
// per score.
TEST_F(CudaAttention, TensorCorePathKeepsF32Precision) {
  for (DType dt : {DType::BF16, DType::F32})
    for (size_t D : {size_t{30}, size_t{32}, size_t{40}, size_t{64}})
      for (size_t S : {size_t{37}, size_t{200}})
        for (bool per_row : {false, true}) {
          if (dt == DType::F32 && D > 32) continue;  // f32's larger heads: the register path
          SCOPED_TRACE(std::string(dtype_name(dt)) + " D=" + std::to_string(D) +
                       " S=" + std::to_string(S) + (per_row ? " (1, 1, T, S) mask" : ""));
          const auto [q, k, v, dout, key_mask] = attention_case(dt, 90, S, D, 41);
          const Tensor mask =
              per_row ? random_tensor({1, 1, 90, S}, dt, 46).broadcast_as({2, 3, 90, S}) : key_mask;
          const double scale = 1.0 / std::sqrt(static_cast<double>(D));
          auto f64 = [](const Tensor& x) { return x.to_dtype(DType::F64); };
          auto near = [&](const std::vector<double>& got, const std::vector<double>& ref) {
            if (dt == DType::BF16) return at_rounding_floor(got, ref, dt);
            double mx = 0;
            for (double r : ref) mx = std::max(mx, std::abs(r));
            return all_close(got, ref, 0.0, 128 * unit_roundoff(dt) * mx);
          };
          const auto gpu = attention_outputs(
              DeviceKind::Cuda,
              {q.to_device(kGpu), k.to_device(kGpu), v.to_device(kGpu), mask.to_device(kGpu)},
              scale);
          const auto ref =
              attention_outputs(DeviceKind::Cpu, {f64(q), f64(k), f64(v), f64(mask)}, scale);
          EXPECT_TRUE(near(values(gpu[0].to_device(kCpu)), values(ref[0]))) << "out";
          EXPECT_TRUE(all_close(values(gpu[1].to_device(kCpu)), values(ref[1]), 1e-5, 1e-5))
              << "lse";
          // The backward from the GPU's own forward outputs, against f64 from the same values.
          OpAttrs a;
          a.f0 = scale;
          const std::vector<Tensor> in = {q, k, v, mask, gpu[0].to_device(kCpu),
                                          gpu[1].to_device(kCpu), dout};
          std::vector<Tensor> gin, fin;
          for (const Tensor& t : in) {
            gin.push_back(t.to_device(kGpu));
            fin.push_back(f64(t));
          }
          const auto gb = dispatch(OpId::attention_bwd, gin, a);
          const auto fb = dispatch(OpId::attention_bwd, fin, a);
          for (size_t i = 0; i < 3; ++i)
            EXPECT_TRUE(near(values(gb[i].to_device(kCpu)), values(fb[i]))) << i;
        }
}

// Through autograd: the model's attention (ops::attention with a padding mask) on the GPU gives
// the CPU's output and gradients.
TEST_F(CudaAttention, AutogradMatchesTheCpu) {
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const size_t T = 40, D = 32;
    const Tensor xq = random_tensor({2, T, 3 * D}, dt, 31), xk = random_tensor({2, T, 3 * D}, dt, 32);
    const Tensor xv = random_tensor({2, T, 3 * D}, dt, 33);
    const Tensor mask = random_tensor({2, 1, 1, T}, dt, 34);
    auto run = [&](Device dev) {
      const Var q = Var::from_tensor(xq.to_device(dev)), k = Var::from_tensor(xk.to_device(dev));
      const Var v = Var::from_tensor(xv.to_device(dev));
      const Tensor o = ops::attention(attention_heads(q, T, D), attention_heads(k, T, D),
                                      attention_heads(v, T, D), mask.to_device(dev), 0.25);
      // Stored token major on both devices: the heads merge back as a view.
      EXPECT_TRUE(o.permute({0, 2, 1, 3}).is_contiguous()) << dev.to_string();
      GradStore g = o.sqr().sum_all().backward();
      std::vector<std::vector<double>> r = {values(o.to_device(kCpu))};
      for (const Var* x : {&q, &k, &v}) r.push_back(values(g.get(*x)->to_device(kCpu)));
      return r;
    };
    const auto c = run(kCpu), g = run(kGpu);
    const double tol = dt == DType::F32 ? 1e-4 : 3e-2;
    for (size_t i = 0; i < c.size(); ++i) EXPECT_TRUE(all_close(g[i], c[i], tol, tol)) << i;
  }
}

// ---- linear (cuBLASLt, the bias in the epilogue) ---------------------------------------------

class CudaLinear : public OnCuda<::testing::Test> {};

// bf16/f16: the f32 sum plus the bias rounded once, at test_fused_grad.cpp's floor against f64
// (matmul-then-add's second rounding would not be, where the bias cancels the product); f32:
// within f32 sums of the CPU. Shapes: odd rows, the model's (rows, 384) -> 1536, no bias, a
// strided x, leading dims, an empty inner dim (the bias alone).
TEST_F(CudaLinear, MatchesTheCpuAndRoundsOnce) {
  for (DType dt : {DType::BF16, DType::F16, DType::F32, DType::F64})
    for (const auto& [r, i, o] : std::vector<std::array<size_t, 3>>{
             {37, 70, 50}, {1024, 384, 1536}, {5, 3, 1}, {3, 0, 4}}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + std::to_string(r) + "x" +
                   std::to_string(i) + "->" + std::to_string(o));
      const Tensor x = random_tensor({r, i}, dt, 51), w = random_tensor({o, i}, dt, 52);
      const Tensor b = random_tensor({o}, dt, 53, -20.0, 20.0);
      for (bool with_b : {true, false}) {
        const Tensor bb = with_b ? b : Tensor();
        const std::vector<double> g = values(ops::linear(x.to_device(kGpu), w.to_device(kGpu),
                                                         with_b ? b.to_device(kGpu) : Tensor())
                                                 .to_device(kCpu));
        const auto f64 = [](const Tensor& t) { return t.to_dtype(DType::F64); };
        const std::vector<double> ref =
            values(ops::linear(f64(x), f64(w), with_b ? f64(b) : Tensor()));
        if (is_half(dt)) {
          EXPECT_TRUE(at_rounding_floor(g, ref, dt)) << "bias " << with_b;
        } else {
          EXPECT_TRUE(all_close(g, values(ops::linear(x, w, bb)), dt == DType::F32 ? 1e-5 : 1e-12,
                                dt == DType::F32 ? 1e-4 : 1e-10))
              << "bias " << with_b;
        }
      }
    }
  // A strided x (a transposed view) and leading dims.
  const Tensor xt = random_tensor({70, 37}, DType::BF16, 54).t();
  const Tensor w = random_tensor({50, 70}, DType::BF16, 55), b = random_tensor({50}, DType::BF16, 56);
  EXPECT_EQ(values(ops::linear(xt.to_device(kGpu), w.to_device(kGpu), b.to_device(kGpu)).to_device(kCpu)),
            values(ops::linear(xt.contiguous().to_device(kGpu), w.to_device(kGpu), b.to_device(kGpu))
                       .to_device(kCpu)));
  const Tensor x3 = random_tensor({2, 9, 70}, DType::BF16, 57);
  EXPECT_EQ(ops::linear(x3.to_device(kGpu), w.to_device(kGpu), b.to_device(kGpu)).shape(),
            Shape({2, 9, 50}));
}

// ---- adamw_step (looked up by name: the optim family is younger than this suite) -------------

std::optional<OpId> op_by_name(std::string_view name) {
  for (size_t i = 0; i < kNumOps; ++i)
    if (op_name(static_cast<OpId>(i)) == name) return static_cast<OpId>(i);
  return std::nullopt;
}

/// Sets attrs.reals where OpAttrs has that field; false where it does not.
template <class A> bool set_reals(A& a, const std::vector<double>& r) {
  if constexpr (requires { a.reals = r; }) {
    a.reals = r;
    return true;
  } else {
    return false;
  }
}

TEST_F(CudaOptim, AdamWStepMatchesCpuBitForBit) {
  const std::optional<OpId> op = op_by_name("adamw_step");
  if (!op) GTEST_SKIP() << "no adamw_step in the registry";
  OpAttrs a;
  const double b1 = 0.9, b2 = 0.999, lr = 1e-3;
  const int t = 7;
  if (!set_reals(a, {1.0 - lr * 0.01, b1, b2, 1e-8, lr / (1.0 - std::pow(b1, t)),
                     std::sqrt(1.0 - std::pow(b2, t))}))
    GTEST_SKIP() << "OpAttrs has no reals";
  for (DType dt : {DType::F32, DType::F64}) {
    if (!has_kernel(*op, kCpu, dt)) continue;
    for (const Shape& s : {Shape({1000003}), Shape({3, 7}), Shape({0})}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + s.to_string());
      const std::vector<Tensor> in = {random_tensor(s, dt, 1), random_tensor(s, dt, 2, -0.1, 0.1),
                                      random_tensor(s, dt, 3, -0.01, 0.01),
                                      random_tensor(s, dt, 4, 0.0, 1e-4), Tensor()};
      std::vector<Tensor> ing;
      for (const Tensor& x : in) ing.push_back(x.defined() ? to_gpu(x) : x);
      const std::vector<Tensor> oc = dispatch(*op, in, a), og = dispatch(*op, ing, a);
      ASSERT_EQ(oc.size(), og.size());
      for (size_t k = 0; k < oc.size(); ++k) {
        ASSERT_TRUE(gpu_result(og[k], oc[k])) << "output " << k;
        EXPECT_TRUE(same_bits(og[k], oc[k])) << "output " << k;
      }
      // In place (the optimizer's way): the same bits, written over w, m and v.
      OpAttrs ai = a;
      ai.flag = true;
      std::vector<Tensor> inp;
      for (const Tensor& x : in) inp.push_back(x.defined() ? to_gpu(x) : x);
      const std::vector<Tensor> oi = dispatch(*op, inp, ai);
      ASSERT_EQ(oi.size(), 3u);
      const size_t from[3] = {0, 2, 3};
      for (size_t k = 0; k < 3; ++k) {
        EXPECT_EQ(oi[k].data_ptr(), inp[from[k]].data_ptr()) << "in-place output " << k;
        EXPECT_TRUE(same_bits(oi[k], oc[k])) << "in-place output " << k;
      }
      // An f32 master's bf16/f16 parameter, given w' rounded in the same pass: to_dtype's bits.
      if (dt == DType::F32) {
        for (DType hd : {DType::BF16, DType::F16}) {
          std::vector<Tensor> inh;
          for (const Tensor& x : in) inh.push_back(x.defined() ? to_gpu(x) : x);
          inh[4] = Tensor::zeros(s, hd, kGpu);
          (void)dispatch(*op, inh, ai);
          EXPECT_TRUE(same_bits(inh[4], oc[0].to_dtype(hd))) << dtype_name(hd);
          // A half gradient, widened as it is read: the CPU's bits.
          std::vector<Tensor> hc = in, hg = ing;
          hc[1] = in[1].to_dtype(hd);
          hg[1] = to_gpu(hc[1]);
          const std::vector<Tensor> rc = dispatch(*op, hc, a), rg = dispatch(*op, hg, a);
          for (size_t k = 0; k < 3; ++k)
            EXPECT_TRUE(same_bits(rg[k], rc[k])) << dtype_name(hd) << " gradient, output " << k;
        }
      }
    }
  }
}

// ---- devices ------------------------------------------------------------------------------------

// Mixing a CPU and a GPU tensor in one op is an Error naming both devices.
TEST_F(CudaDevices, MixingDevicesIsAnErrorNamingBoth) {
  const Tensor c = random_tensor(Shape({3, 4}), DType::F32, 1);
  const Tensor g = random_tensor(Shape({3, 4}), DType::F32, kGpu, 2);
  const Tensor cw = random_tensor(Shape({4}), DType::F32, 3);
  const Tensor mask = Tensor::ones(Shape({3, 4}), DType::U8, kGpu);
  const Tensor idx = Tensor::from_vector(std::vector<int64_t>{0, 2}, Shape({2}));
  const std::vector<std::pair<std::string, std::function<void()>>> cases = {
      {"add", [&] { (void)(c + g); }},
      {"mul", [&] { (void)(g * c); }},
      {"maximum", [&] { (void)g.maximum(c); }},
      {"lt", [&] { (void)c.lt(g); }},
      {"matmul", [&] { (void)c.matmul(g.t()); }},
      {"mul_add", [&] { (void)g.mul_add(g, c); }},
      {"where_cond", [&] { (void)mask.where_cond(g, c); }},
      {"where_cond", [&] { (void)mask.where_cond(c, c); }},
      {"cat", [&] { (void)Tensor::cat({g, c}, 0); }},
      {"index_select", [&] { (void)g.index_select(idx, 0); }},
      {"scatter_add", [&] { (void)g.scatter_add(to_gpu(idx.reshape({2, 1}).broadcast_as({2, 4}).contiguous()),
                                                c.narrow(0, 0, 2), 0); }},
      {"layer_norm", [&] { (void)ops::layer_norm(g, cw, Tensor(), 1e-5); }},
      {"add", [&] { (void)dispatch1(OpId::add, {c, g}); }},
  };
  for (const auto& [op, f] : cases) {
    const std::string m = error_of(f);
    EXPECT_TRUE(contains(m, op)) << op << ": " << m;
    EXPECT_TRUE(contains(m, "cpu") && contains(m, "cuda:0")) << op << ": " << m;
  }
}

// A device ordinal that does not exist is an Error naming it, whichever way a tensor would get
// there.
TEST_F(CudaDevices, UnavailableOrdinalIsAnError) {
  const Device bad = Device::cuda(99);
  ASSERT_LT(device_count(DeviceKind::Cuda), 99);
  const Tensor c = random_tensor(Shape({3}), DType::F32, 1);
  for (const auto& f : std::vector<std::function<void()>>{
           [&] { (void)Tensor::zeros(Shape({2}), DType::F32, bad); },
           [&] { (void)Tensor::rand(Shape({2}), DType::F32, bad, 1); },
           [&] { (void)Tensor::arange(0, 4, 1, DType::I64, bad); },
           [&] { (void)c.to_device(bad); },
           [&] { (void)to_gpu(c).to_device(bad); },
           [&] { (void)Tensor::from_vector(std::vector<float>{1, 2}, Shape({2}), bad); }}) {
    const std::string m = error_of(f);
    EXPECT_TRUE(contains(m, "cuda:99")) << m;
  }
  // The gradient of a loss computed on the GPU arrives on the CPU source.
  const Var v = Var::from_tensor(c);
  const GradStore gs = to_cpu((to_gpu(v) * to_gpu(v)).sum_all()).backward();
  ASSERT_TRUE(gs.get(v));
  EXPECT_EQ(gs.get(v)->device(), kCpu);
  EXPECT_TRUE(same_bits(*gs.get(v), c * 2.0));
}

// ---- one large case: an f32 add of more than 2^31 bytes per operand --------------------------

TEST_F(CudaLarge, F32AddOfMoreThanTwoGiB) {
  const size_t n = (size_t{1} << 29) + 17;
  ASSERT_GT(n * sizeof(float), size_t{1} << 31);
  const Tensor a = Tensor::rand(Shape({n}), DType::F32, kCpu, 1, -1e3, 1e3);
  const Tensor b = Tensor::rand(Shape({n}), DType::F32, kCpu, 2, -1.0, 1.0);
  const Tensor want = a + b;
  const Tensor got = to_gpu(a) + to_gpu(b);
  ASSERT_TRUE(gpu_result(got, want));
  EXPECT_TRUE(same_bits(got, want));
}

// ---- coverage -------------------------------------------------------------------------------------

/// The ops this file tests (from its tables, plus those its tests name one by one).
std::set<std::string_view> tested_ops() {
  std::set<std::string_view> s;
  for (const UnarySpec& u : kUnary) s.insert(op_name(u.op));
  for (const IntUnarySpec& u : kIntUnary) s.insert(op_name(u.op));
  for (OpId op : kBinaryOps) s.insert(op_name(op));
  for (const GradCase& g : cuda_grad_cases()) s.insert(op_name(g.op));
  for (OpId op : {OpId::where_cond, OpId::mul_add, OpId::copy, OpId::to_dtype, OpId::fill,
                  OpId::arange, OpId::rand_uniform, OpId::rand_normal, OpId::sum, OpId::max,
                  OpId::min, OpId::argmax, OpId::argmin, OpId::matmul, OpId::index_select,
                  OpId::gather, OpId::scatter_add, OpId::cat, OpId::narrow, OpId::narrow_bwd,
                  OpId::reshape, OpId::permute, OpId::broadcast_as, OpId::to_device,
                  OpId::softmax_last_dim, OpId::log_softmax_last_dim, OpId::softmax_last_dim_bwd,
                  OpId::log_softmax_last_dim_bwd, OpId::rms_norm, OpId::layer_norm,
                  OpId::group_norm, OpId::rms_norm_bwd, OpId::layer_norm_bwd,
                  OpId::group_norm_bwd, OpId::gelu_erf_bwd, OpId::attention,
                  OpId::attention_bwd, OpId::linear})
    s.insert(op_name(op));
  s.insert("adamw_step");
  return s;
}

TEST_F(CudaCoverage, EveryOpHasACudaKernelOrAComposedForm) {
  for (size_t i = 0; i < kNumOps; ++i) {
    const OpId op = static_cast<OpId>(i);
    const OpDef& d = op_def(op);
    const bool view_or_transfer = op == OpId::reshape || op == OpId::permute ||
                                  op == OpId::narrow || op == OpId::broadcast_as ||
                                  op == OpId::to_device;
    const bool cuda_kernel = d.kernels[static_cast<int>(DeviceKind::Cuda)].fn != nullptr;
    EXPECT_TRUE(view_or_transfer || cuda_kernel || d.composed != nullptr)
        << op_name(op) << " has neither a CUDA kernel nor a composed form";
    if (cuda_kernel) {
      // Every dtype the CPU serves has a CUDA path too.
      const uint32_t cpu = d.kernels[static_cast<int>(DeviceKind::Cpu)].dtypes;
      const uint32_t gpu = d.kernels[static_cast<int>(DeviceKind::Cuda)].dtypes;
      for (DType dt : kAllTypes) {
        if ((cpu & dtype_bit(dt)) && !(gpu & dtype_bit(dt))) {
          EXPECT_NE(d.composed, nullptr)
              << op_name(op) << ": the CPU serves " << dtype_name(dt) << ", CUDA does not";
        }
      }
    }
  }
}

TEST_F(CudaCoverage, EveryOpIsTestedHere) {
  const std::set<std::string_view> mine = tested_ops();
  for (size_t i = 0; i < kNumOps; ++i) {
    const std::string_view name = op_name(static_cast<OpId>(i));
    EXPECT_TRUE(mine.count(name)) << name << " has no case in test_cuda.cpp";
  }
}

}  // namespace
}  // namespace taper::testing
