// test_fused.cpp: forward precision tests of the fused ops (softmax_last_dim, log_softmax_last_dim,
// rms_norm, layer_norm, group_norm) and the dedicated softmax backward kernels, against the scalar
// f64 references of tests/ref/fused_ref.h and against the composed forms.
//
// What it is: kernel vs reference (every op x bf16/f16/f32/f64 x rows of length 1, 7, 33, 1000,
// 4099 and few/many rows x contiguous/transposed inputs), fused vs composed, special values, the
// saved statistics (norms: mean/rstd; softmax: lse) with their dtypes, shapes and values, rows
// split across threads, and the large precision cases of issue 3.
// What it is not: gradient checks and backward precision of the norms (autograd's tests).
//
// The bound used everywhere ("the rounding floor"): for an output whose f64 reference is r,
//   |got - r| <= ulp_T(r) / 2 + kNoise * u_c * scale
// where ulp_T(r) is the spacing of the output dtype T at r (so ulp/2 is the error of rounding r
// once), u_c the unit roundoff of the compute type (2^-24 for bf16/f16/f32, 2^-53 for f64), and
// scale the magnitude of the terms the output is computed from (|y| (1 + |x - max|) for softmax,
// |y| for rms_norm, |x - max| + |log sum| + 1 for log-softmax, (|x| + |mean|) * rstd * |w| + |b|
// for layer/group norm).
// For bf16/f16 the second term is ~2^-16 of the first: an output may differ from the correctly
// rounded reference only where r lies within f32 noise of a rounding tie, never by double rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "taper/composed.h"
#include "tests/cpu_hooks.h"
#include "tests/fused_cases.h"
#include "tests/ref/fused_ref.h"
#include "tests/test_util.h"

namespace taper {
namespace {

using testing::at_floor;
using testing::compute_u;
using testing::Expected;
using testing::FOp;
using testing::fop_name;
using testing::for_each_target;
using testing::is_norm;
using testing::kEps;
using testing::kNoise;
using testing::LayoutKind;
using testing::make_problem;
using testing::Problem;
using testing::reference;
using testing::run_public;
using testing::test_devices;
using testing::ThreadsGuard;
using testing::ulp_at;
using testing::unit_roundoff;
using testing::values;
using testing::with_input;
using testing::with_layout;

TAPER_COVERS(Forward, OpId::softmax_last_dim, OpId::log_softmax_last_dim,
             OpId::softmax_last_dim_bwd, OpId::log_softmax_last_dim_bwd, OpId::rms_norm,
             OpId::layer_norm, OpId::group_norm);

OpId op_id(FOp op) {
  switch (op) {
    case FOp::Softmax: return OpId::softmax_last_dim;
    case FOp::LogSoftmax: return OpId::log_softmax_last_dim;
    case FOp::RmsNorm: return OpId::rms_norm;
    case FOp::LayerNorm: return OpId::layer_norm;
    case FOp::GroupNorm: return OpId::group_norm;
  }
  return OpId::Count;
}

/// Every output of the CPU kernel, saved statistics included (inputs made contiguous, as the
/// dispatcher does for kernels registered needs_contiguous).
std::vector<Tensor> run_kernel(const Problem& p) {
  const KernelSlot& k = op_def(op_id(p.op)).kernels[static_cast<int>(DeviceKind::Cpu)];
  EXPECT_NE(k.fn, nullptr) << fop_name(p.op) << " has no CPU kernel";
  OpAttrs a;
  a.f0 = kEps;
  a.i0 = static_cast<int64_t>(p.groups);
  std::vector<Tensor> in = {p.x.contiguous()};
  if (p.op == FOp::RmsNorm) in.push_back(p.w.contiguous());
  if (p.op == FOp::LayerNorm || p.op == FOp::GroupNorm) {
    in.push_back(p.w.contiguous());
    in.push_back(p.b.contiguous());
  }
  return k.fn(in, a);
}

/// Fused and composed against the reference, and against each other (f64: 1e-10 relative to
/// the scale; f32: 1e-5; halves: one ulp, both being one rounding of nearly the same f32 value).
void check_problem(const Problem& p, const Expected& e) {
  const DType dt = p.x.dtype();
  const std::vector<double> fused = values(run_public(p, false));
  const std::vector<double> comp = values(run_public(p, true));
  EXPECT_TRUE(at_floor(fused, e.y, e.scale, dt)) << "fused vs reference";
  // The composed form rounds between its own f32 steps (sum, mean, rsqrt kernels): same floor.
  EXPECT_TRUE(at_floor(comp, e.y, e.scale, dt)) << "composed vs reference";
  if (dt == DType::F64 || dt == DType::F32) {
    const double tol = dt == DType::F64 ? 1e-10 : 1e-5;
    EXPECT_TRUE(at_floor(fused, comp, e.scale, DType::F64, 0.0, tol / compute_u(DType::F64)))
        << "fused vs composed, relative " << tol;
  } else {
    EXPECT_TRUE(at_floor(fused, comp, e.scale, dt, 1.0)) << "fused vs composed";
  }
}

// ---- every op x dtype x layout over the row lengths ------------------------------------------

using FwdParam = std::tuple<FOp, DType, LayoutKind>;

class FusedForward : public ::testing::TestWithParam<FwdParam> {};

TEST_P(FusedForward, MatchesReferenceAndComposed) {
  const auto [op, dt, layout] = GetParam();
  uint64_t seed = 100;
  std::vector<Shape> shapes;
  if (op == FOp::GroupNorm) {
    // (N, C, *) with groups chosen below: group lengths 1, 14, 66, 2000, 12297, 80000.
    shapes = {Shape({3, 4}), Shape({2, 6, 7}), Shape({1, 8, 33}), Shape({2, 4, 10, 100}),
              Shape({1, 6, 4099}), Shape({67, 4, 7}), Shape({1, 2, 40000})};
  } else {
    for (size_t D : {1, 7, 33, 1000, 4099})
      for (size_t R : {1, 3, 67}) shapes.push_back(Shape({R, D}));
  }
  for (const Shape& s : shapes) {
    size_t groups = 1;
    if (op == FOp::GroupNorm) groups = s[1] == 4 && s.rank() == 2 ? 4 : (s[1] % 3 == 0 ? 3 : 2);
    for (bool affine : {true, false}) {
      if (!is_norm(op) && !affine) continue;
      Problem p = make_problem(op, dt, s, ++seed, affine, groups);
      SCOPED_TRACE(std::string(fop_name(op)) + " " + std::string(dtype_name(dt)) + " " +
                   s.to_string() + (affine ? " affine" : " plain") + " G=" +
                   std::to_string(groups) + " " + testing::layout_name(layout));
      const Expected e = reference(p);
      p.x = with_layout(p.x, layout);
      check_problem(p, e);
    }
  }
}

std::string fwd_name(const ::testing::TestParamInfo<FwdParam>& info) {
  return std::string(fop_name(std::get<0>(info.param))) + "_" +
         std::string(dtype_name(std::get<1>(info.param))) + "_" +
         testing::layout_name(std::get<2>(info.param));
}

constexpr DType kDTypes[] = {DType::BF16, DType::F16, DType::F32, DType::F64};

INSTANTIATE_TEST_SUITE_P(
    Fused, FusedForward,
    ::testing::Combine(::testing::Values(FOp::Softmax, FOp::LogSoftmax, FOp::RmsNorm,
                                         FOp::LayerNorm, FOp::GroupNorm),
                       ::testing::ValuesIn(kDTypes),
                       ::testing::Values(LayoutKind::Contiguous, LayoutKind::Transposed)),
    fwd_name);

// ---- rows split across threads, and rows longer than the kernels' scratch and chunks ---------

class FusedLongRows : public ::testing::TestWithParam<DType> {};

/// A shape whose output just passes cpu::kStreamStoreBytes, so the kernels write it with
/// streaming stores; rows (groups) of odd length, so most rows start off the vector alignment.
Shape streamed_shape(FOp op, DType dt) {
  const size_t need = cpu::stream_store_bytes_for_test() / dtype_size(dt) + 1;  // elements
  if (op == FOp::GroupNorm) return Shape({2, 6, (need / 12 + 1) | 1});  // rows of 6 x odd S
  return Shape({need / 1001 + 1, 1001});
}

TEST_P(FusedLongRows, AnyThreadCount) {
  const DType dt = GetParam();
  ThreadsGuard guard;
  for (size_t threads : {size_t{1}, size_t{4}}) {
    set_num_threads(threads);
    for (FOp op : {FOp::Softmax, FOp::LogSoftmax, FOp::RmsNorm, FOp::LayerNorm, FOp::GroupNorm}) {
      // One row of 262147 (split inside the row), 2 rows of 100003, 9 rows of 40000 (whole rows
      // longer than the softmax scratch, statistics over several chunks).
      const std::vector<Shape> shapes =
          op == FOp::GroupNorm
              ? std::vector<Shape>{Shape({1, 4, 65537}), Shape({2, 2, 100003}), Shape({9, 2, 20000})}
              : std::vector<Shape>{Shape({1, 262147}), Shape({2, 100003}), Shape({9, 40000})};
      std::vector<Shape> all = shapes;
      if (threads > 1) all.push_back(streamed_shape(op, dt));
      for (const Shape& s : all) {
        const size_t groups = op == FOp::GroupNorm ? (s[1] == 4 ? 2 : 1) : 1;
        const Problem p = make_problem(op, dt, s, 7 + threads, true, groups);
        SCOPED_TRACE(std::string(fop_name(op)) + " " + s.to_string() + " threads " +
                     std::to_string(threads));
        const Expected e = reference(p);
        EXPECT_TRUE(at_floor(values(run_public(p, false)), e.y, e.scale, dt));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fused, FusedLongRows, ::testing::ValuesIn(kDTypes),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

// ---- saved statistics ------------------------------------------------------------------------

class FusedStats : public ::testing::TestWithParam<DType> {};

TEST_P(FusedStats, DtypeShapeAndValues) {
  const DType dt = GetParam();
  const DType want = dt == DType::F64 ? DType::F64 : DType::F32;
  struct C {
    FOp op;
    Shape shape;
    size_t groups;
    std::vector<size_t> stat_dims;
  };
  const C cases[] = {{FOp::RmsNorm, Shape({2, 3, 50}), 1, {2, 3}},
                     {FOp::LayerNorm, Shape({2, 3, 50}), 1, {2, 3}},
                     {FOp::LayerNorm, Shape({1, 20000}), 1, {1}},
                     {FOp::GroupNorm, Shape({2, 6, 5, 5}), 3, {2, 3}},
                     {FOp::GroupNorm, Shape({1, 4, 9000}), 2, {1, 2}}};
  for (const C& c : cases) {
    SCOPED_TRACE(std::string(fop_name(c.op)) + " " + c.shape.to_string());
    // An offset of 16 makes a statistic rounded to bf16/f16 visibly wrong (ulp 1/8 there).
    const Problem p = make_problem(c.op, dt, c.shape, 33, true, c.groups, 16.0);
    const Expected e = reference(p);
    const std::vector<Tensor> out = run_kernel(p);
    ASSERT_EQ(out.size(), c.op == FOp::RmsNorm ? 2u : 3u);
    EXPECT_TRUE(at_floor(values(out[0]), e.y, e.scale, dt));
    for (size_t k = 1; k < out.size(); ++k) {
      EXPECT_EQ(out[k].dtype(), want);
      EXPECT_EQ(out[k].dims(), c.stat_dims);
    }
    const std::vector<double>& ref_rstd = e.rstd;
    EXPECT_TRUE(testing::all_close(values(out.back()), ref_rstd, kNoise * compute_u(dt), 0.0))
        << "rstd";
    if (c.op != FOp::RmsNorm) {
      EXPECT_TRUE(testing::all_close(values(out[1]), e.mean, kNoise * compute_u(dt), 0.0))
          << "mean";
    }
  }
}

// The softmax forwards save (m, l) = (max, log sum exp(x - max)) per row, shape (..., 2), in f32
// (f64 for f64), computed once per row whether the row is whole or split across threads: m is
// the row's max exactly, m + l its log-sum-exp.
TEST_P(FusedStats, SoftmaxLse) {
  const DType dt = GetParam();
  const DType want = dt == DType::F64 ? DType::F64 : DType::F32;
  ThreadsGuard guard;
  for (size_t threads : {size_t{1}, size_t{4}}) {
    set_num_threads(threads);
    for (const Shape& s : {Shape({2, 3, 50}), Shape({7}), Shape({3, 4099}), Shape({2, 100003})}) {
      for (FOp op : {FOp::Softmax, FOp::LogSoftmax}) {
        SCOPED_TRACE(std::string(fop_name(op)) + " " + s.to_string() + " threads " +
                     std::to_string(threads));
        Problem p;
        p.op = op;
        // An offset of 16: an lse rounded to bf16/f16 would be off by up to 1/16 (bf16).
        p.x = Tensor::randn(s, dt, Device::cpu(), 35, 16.0, 3.0);
        const std::vector<double> x = values(p.x);
        const size_t D = s[s.rank() - 1], R = x.size() / D;
        const std::vector<Tensor> out = run_kernel(p);
        ASSERT_EQ(out.size(), 2u);
        const Expected e = reference(p);
        EXPECT_TRUE(at_floor(values(out[0]), e.y, e.scale, dt));
        EXPECT_EQ(out[1].dtype(), want);
        std::vector<size_t> dims = s.dims();
        dims.back() = 2;
        EXPECT_EQ(out[1].dims(), dims);
        const std::vector<double> st = values(out[1]);
        std::vector<double> lse(R);
        for (size_t r = 0; r < R; ++r) {
          EXPECT_EQ(st[2 * r], *std::max_element(x.begin() + r * D, x.begin() + (r + 1) * D));
          lse[r] = st[2 * r] + st[2 * r + 1];
        }
        EXPECT_TRUE(testing::all_close(lse, ref::logsumexp(x, R, D), kNoise * compute_u(dt),
                                       kNoise * compute_u(dt)));
      }
    }
  }
  set_num_threads(guard.saved);
  for (FOp op : {FOp::Softmax, FOp::LogSoftmax}) {  // rows of nothing: m = -inf, l = 0
    Problem p;
    p.op = op;
    p.x = Tensor::zeros(Shape({3, 0}), dt);
    const std::vector<Tensor> out = run_kernel(p);
    ASSERT_EQ(out.size(), 2u);
    EXPECT_EQ(out[0].elem_count(), 0u);
    const double inf = std::numeric_limits<double>::infinity();
    EXPECT_EQ(values(out[1]), (std::vector<double>{-inf, 0, -inf, 0, -inf, 0}));
  }
}

INSTANTIATE_TEST_SUITE_P(Fused, FusedStats, ::testing::ValuesIn(kDTypes),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

// ---- special values --------------------------------------------------------------------------

class FusedSpecial : public ::testing::TestWithParam<DType> {};

TEST_P(FusedSpecial, SoftmaxInfNaNRows) {
  const DType dt = GetParam();
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (size_t D : {size_t{5}, size_t{37}, size_t{40000}}) {
    SCOPED_TRACE("D = " + std::to_string(D));
    std::vector<double> x = values(Tensor::randn(Shape({6, D}), DType::F64, Device::cpu(), 5));
    for (size_t i = 0; i < D; i += 2) x[0 * D + i] = -inf;  // some -inf: fine
    for (size_t i = 0; i < D; ++i) x[1 * D + i] = -inf;     // all -inf: NaN, as PyTorch
    x[2 * D + D / 2] = nan;                                 // a NaN: the row is NaN
    x[3 * D + D - 1] = inf;                                 // +inf: inf - inf, NaN
    x[4 * D + 0] = -inf;                                    // row 5 stays ordinary
    const Tensor xt = Tensor::from_vector(x, Shape({6, D})).to_dtype(dt);
    for (FOp op : {FOp::Softmax, FOp::LogSoftmax}) {
      Problem p;
      p.op = op;
      p.x = xt;
      const Expected e = reference(p);
      for (size_t i = 0; i < D; ++i) {
        ASSERT_TRUE(std::isnan(e.y[1 * D + i]) && std::isnan(e.y[2 * D + i]) &&
                    std::isnan(e.y[3 * D + i]));
      }
      for (Device dev : test_devices()) {  // the reference on the CPU, the kernels everywhere
        SCOPED_TRACE(dev.to_string());
        Problem pd = p;
        pd.x = xt.to_device(dev);
        const std::vector<double> fused = values(run_public(pd, false));
        const std::vector<double> comp = values(run_public(pd, true));
        EXPECT_TRUE(at_floor(fused, e.y, e.scale, dt)) << fop_name(op) << " fused";
        EXPECT_TRUE(at_floor(comp, e.y, e.scale, dt)) << fop_name(op) << " composed";
        EXPECT_EQ(fused[0], op == FOp::Softmax ? 0.0 : -inf);
      }
    }
  }
}

TEST_P(FusedSpecial, NormConstantRowsAndGroups) {
  const DType dt = GetParam();
  // Rows of one repeated value: variance 0, rstd = 1/sqrt(eps), output b (layer/group) and
  // x/sqrt(x^2 + eps) * w (rms), finite.
  for (double c : {1.5, -0.1, 1000.0}) {
    for (size_t D : {size_t{1}, size_t{7}, size_t{4099}, size_t{20000}}) {
      SCOPED_TRACE("value " + std::to_string(c) + " D " + std::to_string(D));
      for (FOp op : {FOp::RmsNorm, FOp::LayerNorm, FOp::GroupNorm}) {
        Problem p = make_problem(op, dt, op == FOp::GroupNorm ? Shape({2, 4, D}) : Shape({3, D}),
                                 9, true, 2);
        p.x = Tensor::full(p.x.shape(), c, dt);
        const Expected e = reference(p);
        for (Device dev : test_devices()) {
          SCOPED_TRACE(dev.to_string());
          const Problem pd = with_input(p, p.x.to_device(dev));
          const std::vector<double> got = values(run_public(pd, false));
          for (double v : got) ASSERT_TRUE(std::isfinite(v)) << fop_name(op);
          EXPECT_TRUE(at_floor(got, e.y, e.scale, dt)) << fop_name(op) << " fused";
          EXPECT_TRUE(at_floor(values(run_public(pd, true)), e.y, e.scale, dt))
              << fop_name(op) << " composed";
          if (op != FOp::RmsNorm && c == 1.5) {  // the mean is exact: y is b to the bit
            const std::vector<double> b = values(p.b);
            const size_t P = b.size(), S = op == FOp::GroupNorm ? D : 1;
            for (size_t i = 0; i < got.size(); ++i)
              ASSERT_EQ(got[i], b[(i / S) % P]) << fop_name(op) << " at " << i;
          }
        }
      }
    }
  }
}

TEST_P(FusedSpecial, NormNaNInputMakesItsRowNaN) {
  // A NaN in x makes its row's (group's) statistics and every output of the row NaN, and leaves
  // the other rows as they were: the stores round NaN as round_to does (cuda/vec_io.cuh).
  const DType dt = GetParam();
  for (FOp op : {FOp::RmsNorm, FOp::LayerNorm, FOp::GroupNorm}) {
    Problem p = make_problem(op, dt, op == FOp::GroupNorm ? Shape({2, 4, 40}) : Shape({3, 80}),
                             4, true, 2);
    std::vector<double> x = values(p.x);
    x[5] = std::numeric_limits<double>::quiet_NaN();
    p.x = Tensor::from_vector(x, p.x.shape()).to_dtype(dt);
    const Expected e = reference(p);
    for (Device dev : test_devices()) {
      SCOPED_TRACE(dev.to_string());
      const Problem pd = with_input(p, p.x.to_device(dev));
      const std::vector<double> got = values(run_public(pd, false));
      EXPECT_TRUE(at_floor(got, e.y, e.scale, dt)) << fop_name(op);
      for (size_t i = 0; i < 80; ++i) ASSERT_TRUE(std::isnan(got[i])) << fop_name(op) << " at " << i;
      for (size_t i = 80; i < got.size(); ++i)
        ASSERT_TRUE(std::isfinite(got[i])) << fop_name(op) << " at " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fused, FusedSpecial, ::testing::ValuesIn(kDTypes),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

// ---- softmax backward kernels ----------------------------------------------------------------

// The bwd kernels take (x, stats, dy), stats the forward's saved (m, l) = (max, log sum
// exp(x - m)), and recompute y = exp((x - m) - l) in the compute type. Their reference is the f64
// gradient of x alone (ref::softmax_bwd(x, dy)), so the bound accounts for the compute-type error
// of that y: a relative u_c (1 + |x - m| + |l|) (x - m, l rounded, the subtraction, exp), carried
// through the sum and the product.

using BwdParam = std::tuple<bool, DType>;
class SoftmaxBwdKernel : public ::testing::TestWithParam<BwdParam> {};

const KernelSlot& cpu_kernel(OpId id) {
  return op_def(id).kernels[static_cast<int>(DeviceKind::Cpu)];
}

OpId fwd_of(bool log) { return log ? OpId::log_softmax_last_dim : OpId::softmax_last_dim; }
OpId bwd_of(bool log) { return log ? OpId::log_softmax_last_dim_bwd : OpId::softmax_last_dim_bwd; }

/// The f64 reference of a softmax (log-softmax) backward and the per-element scale of its
/// rounding-floor bound: y recomputed in the compute type carries (1 + |x - m| + |l|) u_c.
struct BwdExpected {
  std::vector<double> dx, scale;
};

BwdExpected softmax_bwd_reference(const Tensor& x, const Tensor& dy, bool log) {
  const size_t R = x.dims()[0], D = x.dims()[1];
  const std::vector<double> xv = values(x), dyv = values(dy);
  const std::vector<double> lv = ref::logsumexp(xv, R, D);
  BwdExpected e;
  e.dx = log ? ref::log_softmax_bwd(xv, dyv, D) : ref::softmax_bwd(xv, dyv, D);
  e.scale.resize(xv.size());
  for (size_t r = 0; r < R; ++r) {
    const double m = *std::max_element(xv.begin() + r * D, xv.begin() + (r + 1) * D);
    double acc = 0, acc_abs = 0;  // the row's sum and the bound on its error, in u_c units
    const double l = lv[r] - m;
    for (size_t i = 0; i < D; ++i) {
      const size_t j = r * D + i;
      const double y = std::exp(xv[j] - lv[r]);
      const double a = 1.0 + std::abs(xv[j] - m) + std::abs(l);
      acc += log ? dyv[j] : dyv[j] * y;
      acc_abs += log ? std::abs(dyv[j]) : std::abs(dyv[j] * y) * a;
    }
    for (size_t i = 0; i < D; ++i) {
      const size_t j = r * D + i;
      const double y = std::exp(xv[j] - lv[r]);
      const double a = 1.0 + std::abs(xv[j] - m) + std::abs(l);
      e.scale[j] = log ? std::abs(dyv[j]) + y * (a * std::abs(acc) + acc_abs)
                       : y * (a * std::abs(dyv[j] - acc) + acc_abs);
    }
  }
  return e;
}

TEST_P(SoftmaxBwdKernel, MatchesReference) {
  const auto [log, dt] = GetParam();
  const OpId id = bwd_of(log);
  const KernelSlot& k = cpu_kernel(id);
  const KernelSlot& kf = cpu_kernel(fwd_of(log));
  ASSERT_NE(k.fn, nullptr);
  ASSERT_NE(kf.fn, nullptr);
  ThreadsGuard guard;
  uint64_t seed = 500;
  for (size_t threads : {size_t{1}, size_t{4}}) {
    set_num_threads(threads);
    std::vector<Shape> shapes;
    for (size_t D : {1, 7, 33, 1000, 4099})
      for (size_t R : {1, 3, 67}) shapes.push_back(Shape({R, D}));
    shapes.push_back(Shape({1, 262147}));
    shapes.push_back(Shape({9, 40000}));
    if (threads > 1) shapes.push_back(streamed_shape(FOp::Softmax, dt));  // streamed dx
    for (const Shape& s : shapes) {
      SCOPED_TRACE(s.to_string() + " threads " + std::to_string(threads));
      const size_t R = s[0], D = s[1];
      const Tensor x = Tensor::randn(s, dt, Device::cpu(), ++seed, 0.0, 2.0);
      const Tensor dy = Tensor::randn(s, dt, Device::cpu(), ++seed);
      const std::vector<Tensor> fwd = kf.fn({x}, OpAttrs{});
      ASSERT_EQ(fwd.size(), 2u);
      const Tensor& stats = fwd[1];
      const BwdExpected e = softmax_bwd_reference(x, dy, log);
      const std::vector<Tensor> out = k.fn({x, stats, dy}, OpAttrs{});
      ASSERT_EQ(out.size(), 1u);
      EXPECT_EQ(out[0].dtype(), dt);
      EXPECT_TRUE(out[0].shape() == s);
      EXPECT_TRUE(at_floor(values(out[0]), e.dx, e.scale, dt));
      if (R > 1 && D > 1 && R * D < 100000) {  // transposed x and dy, via dispatch
        const Tensor dxt = dispatch1(id, {with_layout(x, LayoutKind::Transposed), stats,
                                          with_layout(dy, LayoutKind::Transposed)});
        EXPECT_TRUE(at_floor(values(dxt), e.dx, e.scale, dt)) << "transposed";
      }
    }
  }
}

// The dedicated backward ops have a composed form too (metal_fallback/), which a device without
// their kernel runs: forced with ComposedOnlyGuard, it gives the kernel's gradient, NaN rows
// included.
TEST_P(SoftmaxBwdKernel, ComposedFallbackMatchesKernel) {
  const auto [log, dt] = GetParam();
  const double inf = std::numeric_limits<double>::infinity();
  const size_t D = 33;
  std::vector<double> x = values(Tensor::randn(Shape({6, D}), DType::F64, Device::cpu(), 81));
  x[4] = std::numeric_limits<double>::quiet_NaN();
  for (size_t i = 0; i < D; ++i) x[D + i] = -inf;
  x[2 * D + 5] = inf;
  for (size_t i = 0; i < D; i += 4) x[3 * D + i] = -inf;
  const Tensor xt = Tensor::from_vector(x, Shape({6, D})).to_dtype(dt);
  const Tensor dy = Tensor::randn(Shape({6, D}), dt, Device::cpu(), 82);
  const Tensor stats = cpu_kernel(fwd_of(log)).fn({xt}, OpAttrs{})[1];
  const std::vector<double> kernel = values(dispatch1(bwd_of(log), {xt, stats, dy}));
  std::vector<double> composed;
  {
    ComposedOnlyGuard guard({bwd_of(log)});
    composed = values(dispatch1(bwd_of(log), {xt, stats, dy}));
  }
  ASSERT_EQ(kernel.size(), composed.size());
  for (size_t i = 0; i < kernel.size(); ++i) {
    ASSERT_EQ(std::isnan(kernel[i]), std::isnan(composed[i])) << "at " << i;
    if (std::isnan(kernel[i])) continue;
    // Both compute in f32 (f64) and round once; their sums differ in order only.
    const double tol = dt == DType::F64 ? 1e-12 : (dt == DType::F32 ? 1e-5 : 1e-2);
    EXPECT_NEAR(kernel[i], composed[i], tol * (1.0 + std::abs(kernel[i]))) << "at " << i;
  }
}

// A forward row that is NaN (a NaN, all -inf, a +inf) saves a non-finite max (NaN, -inf, +inf)
// and has a NaN gradient row; the other rows, -inf entries included, stay finite. Whole rows and
// rows split across threads.
TEST_P(SoftmaxBwdKernel, NaNRowsWhereTheForwardIsNaN) {
  const auto [log, dt] = GetParam();
  const double inf = std::numeric_limits<double>::infinity();
  ThreadsGuard guard;
  set_num_threads(4);
  for (size_t D : {size_t{9}, size_t{40000}}) {
    SCOPED_TRACE("D = " + std::to_string(D));
    std::vector<double> x = values(Tensor::randn(Shape({5, D}), DType::F64, Device::cpu(), 8));
    x[0 * D + 4] = std::numeric_limits<double>::quiet_NaN();
    for (size_t i = 0; i < D; ++i) x[1 * D + i] = -inf;
    x[2 * D + D - 1] = inf;
    for (size_t i = 0; i < D; i += 3) x[3 * D + i] = -inf;
    const Tensor xt = Tensor::from_vector(x, Shape({5, D})).to_dtype(dt);
    const Tensor dy = Tensor::randn(Shape({5, D}), dt, Device::cpu(), 9);
    const std::vector<Tensor> fwd = cpu_kernel(fwd_of(log)).fn({xt}, OpAttrs{});
    const std::vector<double> st = values(fwd[1]), y = values(fwd[0]);  // (m, l) per row
    EXPECT_TRUE(std::isnan(st[0]));
    EXPECT_EQ(st[2], -inf);
    EXPECT_EQ(st[4], inf);
    EXPECT_TRUE(std::isfinite(st[6]) && std::isfinite(st[8]));
    const std::vector<double> dx =
        values(cpu_kernel(bwd_of(log)).fn({xt, fwd[1], dy}, OpAttrs{})[0]);
    for (size_t i = 0; i < dx.size(); ++i) {
      ASSERT_EQ(std::isnan(dx[i]), std::isnan(y[i])) << "at " << i;
      ASSERT_EQ(std::isnan(dx[i]), i < 3 * D) << "at " << i;
      ASSERT_TRUE(std::isnan(dx[i]) || std::isfinite(dx[i])) << "at " << i;
    }
    if (!log) {
      EXPECT_EQ(dx[3 * D], 0.0);  // y = 0 at -inf: no gradient
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fused, SoftmaxBwdKernel,
                         ::testing::Combine(::testing::Bool(), ::testing::ValuesIn(kDTypes)),
                         [](const ::testing::TestParamInfo<BwdParam>& i) {
                           return std::string(std::get<0>(i.param) ? "log_softmax_" : "softmax_") +
                                  std::string(dtype_name(std::get<1>(i.param)));
                         });

// ---- the large precision cases of issue 3 ----------------------------------------------------

// Softmax is invariant to a constant added to a row, and so should be its gradient's precision:
// f32 logits near 1000 and 10000 give the same relative error as logits near 0. (Recomputing y
// from a saved f32 log-sum-exp instead of the pair (max, log-sum) gave 2.4e-5 and 4.4e-4.)
TEST(FusedPrecision, F32SoftmaxGradientIndependentOfLogitOffset) {
  for (bool log : {false, true}) {
    for (double offset : {0.0, 1000.0, 10000.0}) {
      SCOPED_TRACE(std::string(log ? "log_softmax" : "softmax") + " offset " +
                   std::to_string(offset));
      const Shape s({64, 1000});
      const Tensor x = Tensor::randn(s, DType::F32, Device::cpu(), 77, offset, 1.0);
      const Tensor up = Tensor::randn(s, DType::F32, Device::cpu(), 78);
      const Var xv = Var::from_tensor(x);
      const Tensor y = log ? ops::log_softmax_last_dim(xv) : ops::softmax_last_dim(xv);
      const std::vector<double> got = values(*y.backward(up).get(xv));
      const std::vector<double> xd = values(x), upd = values(up);
      const std::vector<double> want =
          log ? ref::log_softmax_bwd(xd, upd, 1000) : ref::softmax_bwd(xd, upd, 1000);
      double err = 0, mag = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        err = std::max(err, std::abs(got[i] - want[i]));
        mag = std::max(mag, std::abs(want[i]));
      }
      EXPECT_LE(err / mag, 1e-6);
    }
  }
}

// bf16 softmax of (4096, 32768) randn*4: every output is the f64 reference rounded once to bf16,
// except where the reference lies within f32 noise (kNoise * 2^-24 relative) of a rounding tie.
TEST(FusedPrecision, Bf16SoftmaxLargeRoundsOnce) {
  const size_t R = 4096, D = 32768;
  const Tensor x = Tensor::randn(Shape({R, D}), DType::BF16, Device::cpu(), 2024, 0.0, 4.0);
  const Tensor y = ops::softmax_last_dim(x);
  ASSERT_TRUE(y.is_contiguous());
  const Tensor xc = x.contiguous();
  const bf16* xp = xc.data<bf16>();
  const bf16* yp = y.data<bf16>();
  size_t bad = 0, not_nearest = 0;
  double worst_ulps = 0;
  std::vector<double> e(D);
  for (size_t r = 0; r < R; ++r) {
    double m = -std::numeric_limits<double>::infinity(), s = 0;
    for (size_t i = 0; i < D; ++i) m = std::max(m, static_cast<double>(xp[r * D + i]));
    for (size_t i = 0; i < D; ++i) s += (e[i] = std::exp(static_cast<double>(xp[r * D + i]) - m));
    for (size_t i = 0; i < D; ++i) {
      const double ref = e[i] / s, got = static_cast<double>(yp[r * D + i]);
      const double ulp = ulp_at(DType::BF16, ref), err = std::abs(got - ref);
      worst_ulps = std::max(worst_ulps, err / ulp);
      if (err > 0.5 * ulp) ++not_nearest;
      if (err > 0.5 * ulp + kNoise * std::ldexp(ref, -24)) ++bad;
    }
  }
  EXPECT_EQ(bad, 0u) << "outputs beyond ulp/2 + f32 noise; worst " << worst_ulps << " ulp";
  // Where the reference is not near a tie the rounding is exact: only a sliver may differ.
  EXPECT_LT(not_nearest, R * D / 1000) << "worst " << worst_ulps << " ulp";
  RecordProperty("not_nearest", std::to_string(not_nearest));
}

// f16 group norm on (1, 16, 256, 256), 4 groups of 262144 elements: finite, at the rounding floor.
TEST(FusedPrecision, F16GroupNormLargeGroups) {
  const Problem p = make_problem(FOp::GroupNorm, DType::F16, Shape({1, 16, 256, 256}), 77, true, 4);
  const Expected e = reference(p);
  const std::vector<double> got = values(run_public(p, false));
  for (double v : got) ASSERT_TRUE(std::isfinite(v));
  EXPECT_TRUE(at_floor(got, e.y, e.scale, DType::F16));
  const std::vector<Tensor> out = run_kernel(p);
  EXPECT_EQ(out[1].dtype(), DType::F32);
  EXPECT_TRUE(testing::all_close(values(out[2]), e.rstd, kNoise * compute_u(DType::F16), 0.0));
}

// bf16 layer norm and group norm of inputs offset by +1 and +16 (large mean, small variance):
// forward at the bf16 rounding floor, statistics in f32 at f32 accuracy.
TEST(FusedPrecision, Bf16NormsWithOffsetInput) {
  for (double offset : {1.0, 16.0}) {
    for (FOp op : {FOp::LayerNorm, FOp::GroupNorm}) {
      SCOPED_TRACE(std::string(fop_name(op)) + " offset " + std::to_string(offset));
      const Shape s = op == FOp::LayerNorm ? Shape({256, 1024}) : Shape({4, 32, 16, 16});
      const Problem p = make_problem(op, DType::BF16, s, 11, true, 8, offset);
      const Expected e = reference(p);
      EXPECT_TRUE(at_floor(values(run_public(p, false)), e.y, e.scale, DType::BF16));
      EXPECT_TRUE(at_floor(values(run_public(p, true)), e.y, e.scale, DType::BF16)) << "composed";
      const std::vector<Tensor> out = run_kernel(p);
      EXPECT_TRUE(testing::all_close(values(out[1]), e.mean, kNoise * compute_u(DType::BF16), 0.0));
      EXPECT_TRUE(testing::all_close(values(out[2]), e.rstd, kNoise * compute_u(DType::BF16), 0.0));
    }
  }
}

// ---- every Highway target --------------------------------------------------------------------

// The tests above run on the best target of this CPU; these repeat the kernels' core checks with
// dispatch restricted to each compiled target in turn (SSE4 and the scalar target have no FMA,
// narrower vectors and other pairings of the stores).

// The softmax family's exp (cpu/simd_exp-inl.h): within 2 ulp of exp from ln of the smallest
// normal (rounded down) to 0, 0 below it, NaN kept, exp(-inf) = 0, exp(0) = exp(-0) = 1. f32: every
// 4099th f32 of [-87.34, 0) and the edges; f64: 2^16 points spread over [-708.4, 0) and powers of
// two down to 2^-60.
TEST(FusedTargets, SoftmaxExpWithinTwoUlp) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dt : {DType::F32, DType::F64}) {
    SCOPED_TRACE(dtype_name(dt));
    const bool f32 = dt == DType::F32;
    const double lo = f32 ? -0x1.5d58ap+6 : -0x1.6232bdd7abcd3p+9;
    std::vector<double> t = {0.0, -0.0, -1e-30, -0.5, -1.0, -10.0, lo, -inf, nan, -1e30};
    for (double e : {lo, f32 ? -88.0 : -709.0, f32 ? -103.0 : -745.0, -1e4}) t.push_back(e);
    for (double v : {std::nextafter(lo, 0.0), std::nextafter(lo, -inf)}) t.push_back(v);
    if (f32) {
      t.back() = static_cast<double>(std::nextafter(static_cast<float>(lo), -100.0f));
      t[t.size() - 2] = static_cast<double>(std::nextafter(static_cast<float>(lo), 0.0f));
      for (uint32_t b = 0x80000001u; b < 0xc2aeac50u; b += 4099) {
        float f;
        std::memcpy(&f, &b, sizeof f);
        t.push_back(f);
      }
    } else {
      for (int i = 0; i < 65536; ++i) t.push_back(lo * (i + 0.5) / 65536);
      for (int k = 1; k <= 60; ++k) t.push_back(-std::ldexp(1.0, -k));
    }
    const size_t n = t.size();
    for_each_target([&](int64_t target) {
      std::vector<double> got(n);
      if (f32) {
        std::vector<float> tf(t.begin(), t.end()), yf(n);
        ASSERT_EQ(cpu::softmax_exp_for_test(tf.data(), yf.data(), dt, n), target);
        got.assign(yf.begin(), yf.end());
      } else {
        ASSERT_EQ(cpu::softmax_exp_for_test(t.data(), got.data(), dt, n), target);
      }
      double worst = 0;
      for (size_t i = 0; i < n; ++i) {
        const double ti = f32 ? static_cast<double>(static_cast<float>(t[i])) : t[i];
        SCOPED_TRACE("exp(" + std::to_string(ti) + ")");
        if (std::isnan(ti)) {
          ASSERT_TRUE(std::isnan(got[i]));
        } else if (ti < lo) {
          ASSERT_EQ(got[i], 0.0);
        } else {
          const double want = static_cast<double>(std::exp(static_cast<long double>(ti)));
          const double ulps = std::abs(got[i] - want) / ulp_at(dt, want);
          worst = std::max(worst, ulps);
          ASSERT_LE(ulps, 2.0) << "got " << got[i] << " want " << want;
        }
      }
      ASSERT_EQ(got[0], 1.0);
      ASSERT_EQ(got[1], 1.0);
      RecordProperty(std::string("worst_ulp_") + std::string(dtype_name(dt)) + "_" +
                         cpu::simd_target_name(target),
                     std::to_string(worst));
    });
  }
}

// Every fused op and dtype, forward (fused against the reference and the composed form) and the
// softmax backward kernels, on odd shapes, on each target.
TEST(FusedTargets, KernelsMatchReference) {
  for_each_target([&](int64_t) {
    uint64_t seed = 900;
    for (FOp op : {FOp::Softmax, FOp::LogSoftmax, FOp::RmsNorm, FOp::LayerNorm, FOp::GroupNorm}) {
      for (DType dt : kDTypes) {
        const std::vector<Shape> shapes = op == FOp::GroupNorm
                                              ? std::vector<Shape>{Shape({2, 6, 7}), Shape({1, 4, 1001})}
                                              : std::vector<Shape>{Shape({3, 33}), Shape({2, 1001})};
        for (const Shape& s : shapes) {
          SCOPED_TRACE(std::string(fop_name(op)) + " " + std::string(dtype_name(dt)) + " " +
                       s.to_string());
          const Problem p = make_problem(op, dt, s, ++seed, true, 2);
          check_problem(p, reference(p));
          if (is_norm(op)) continue;
          const bool log = op == FOp::LogSoftmax;
          const Tensor dy = Tensor::randn(s, dt, Device::cpu(), ++seed);
          const std::vector<Tensor> fwd = cpu_kernel(fwd_of(log)).fn({p.x}, OpAttrs{});
          const BwdExpected e = softmax_bwd_reference(p.x, dy, log);
          const Tensor dx = cpu_kernel(bwd_of(log)).fn({p.x, fwd[1], dy}, OpAttrs{})[0];
          EXPECT_TRUE(at_floor(values(dx), e.dx, e.scale, dt)) << "backward";
        }
      }
    }
  });
}

}  // namespace
}  // namespace taper
