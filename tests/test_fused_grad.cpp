// test_fused_grad.cpp: the backward side of the fused ops: fused against composed (f64 and f32),
// half-type gradients at the rounding floor of the f64 reference, the f16 group norm that
// overflows elsewhere, bf16 norms on offset inputs, non-contiguous inputs and upstream
// gradients, and the composed fallback when a device has no kernel. The autograd cases (fused
// against composed, the half types' floors, the f16 group norm and bf16 offset seed cases) run on
// every test device: the CPU, and each GPU present, against the same f64 CPU reference.
#include <gtest/gtest.h>

#include <cmath>

#include "taper/composed.h"
#include "tests/test_util.h"

namespace taper::testing {
namespace {

enum class Op { Softmax, LogSoftmax, Rms, Layer, Group };
const char* op_str(Op op) {
  switch (op) {
    case Op::Softmax: return "softmax";
    case Op::LogSoftmax: return "log_softmax";
    case Op::Rms: return "rms_norm";
    case Op::Layer: return "layer_norm";
    case Op::Group: return "group_norm";
  }
  return "?";
}

struct Inputs {
  Tensor x, w, b;
};

Tensor apply(Op op, const Inputs& in, bool composed_path) {
  switch (op) {
    case Op::Softmax:
      return composed_path ? composed::softmax_last_dim(in.x) : ops::softmax_last_dim(in.x);
    case Op::LogSoftmax:
      return composed_path ? composed::log_softmax_last_dim(in.x)
                           : ops::log_softmax_last_dim(in.x);
    case Op::Rms:
      return composed_path ? composed::rms_norm(in.x, in.w, 1e-5) : ops::rms_norm(in.x, in.w, 1e-5);
    case Op::Layer:
      return composed_path ? composed::layer_norm(in.x, in.w, in.b, 1e-5)
                           : ops::layer_norm(in.x, in.w, in.b, 1e-5);
    case Op::Group:
      return composed_path ? composed::group_norm(in.x, 4, in.w, in.b, 1e-5)
                           : ops::group_norm(in.x, 4, in.w, in.b, 1e-5);
  }
  return Tensor();
}

bool has_affine(Op op) { return op == Op::Rms || op == Op::Layer || op == Op::Group; }

Inputs make_inputs(Op op, const Shape& s, DType dt, uint64_t seed, double offset = 0.0) {
  const size_t c = op == Op::Group ? s[1] : s[s.rank() - 1];
  Inputs in;
  in.x = random_tensor(s, DType::F64, seed, -2.0, 2.0).affine(1.0, offset).to_dtype(dt);
  if (has_affine(op)) {
    in.w = random_tensor({c}, DType::F64, seed + 1, 0.5, 1.5).to_dtype(dt);
    in.b = random_tensor({c}, DType::F64, seed + 2, -0.5, 0.5).to_dtype(dt);
  }
  return in;
}

struct Result {
  std::vector<double> y, dx, dw, db;
};

// Runs op forward on `dev` (inputs and `up` copied there), then backward with upstream `up`
// (same shape as y), collecting gradients.
Result run(Op op, Inputs in, const Tensor& up, bool composed_path, bool transposed_x = false,
           Device dev = Device::cpu()) {
  const Tensor xd = in.x.to_device(dev);
  Var x = Var::from_tensor(transposed_x ? with_layout(xd, LayoutKind::Transposed) : xd);
  Var w, b;
  Inputs vin{x, Tensor(), Tensor()};
  if (in.w.defined()) vin.w = w = Var::from_tensor(in.w.to_device(dev));
  if (in.b.defined() && op != Op::Rms) vin.b = b = Var::from_tensor(in.b.to_device(dev));
  Tensor y = apply(op, vin, composed_path);
  GradStore g =
      (y.to_dtype(DType::F64) * up.to_device(dev).to_dtype(DType::F64)).sum_all().backward();
  // The loss above sends exactly `up` (as f64, then cast to y's dtype) into y.
  Result r;
  r.y = values(y);
  r.dx = values(*g.get(x));
  if (w.defined()) r.dw = values(*g.get(w));
  if (b.defined()) r.db = values(*g.get(b));
  return r;
}

// ---- fused vs composed, f64 and f32 ----

class FusedVsComposed : public ::testing::TestWithParam<std::tuple<Op, DType>> {};

// On every test device: the fused op's kernels against its composed form on that device.
TEST_P(FusedVsComposed, ForwardAndEveryGradient) {
  const auto [op, dt] = GetParam();
  const Shape s = op == Op::Group ? Shape({3, 8, 5, 7}) : Shape({9, 37});
  Inputs in = make_inputs(op, s, dt, 11);
  const Tensor up = random_tensor(s, dt, 99);
  for (Device dev : test_devices()) {
    SCOPED_TRACE(dev.to_string());
    Result f = run(op, in, up, false, false, dev);
    Result c = run(op, in, up, true, false, dev);
    const double tol = dt == DType::F64 ? 1e-10 : 1e-5;
    EXPECT_TRUE(all_close(f.y, c.y, tol, tol * 1e-2)) << op_str(op) << " y";
    EXPECT_TRUE(all_close(f.dx, c.dx, tol, tol * 1e-2)) << op_str(op) << " dx";
    EXPECT_TRUE(all_close(f.dw, c.dw, tol, tol * 1e-2)) << op_str(op) << " dw";
    EXPECT_TRUE(all_close(f.db, c.db, tol, tol * 1e-2)) << op_str(op) << " db";
    if (has_affine(op)) {
      EXPECT_FALSE(f.dw.empty());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, FusedVsComposed,
    ::testing::Combine(::testing::Values(Op::Softmax, Op::LogSoftmax, Op::Rms, Op::Layer, Op::Group),
                       ::testing::Values(DType::F64, DType::F32)),
    [](const auto& i) {
      return std::string(op_str(std::get<0>(i.param))) + "_" +
             std::string(dtype_name(std::get<1>(i.param)));
    });

// ---- half types: gradients at the rounding floor of the f64 reference ----

class HalfGrad : public ::testing::TestWithParam<std::tuple<Op, DType, bool>> {};

TEST_P(HalfGrad, AtRoundingFloorOfF64Reference) {
  const auto [op, dt, transposed] = GetParam();
  const Shape s = op == Op::Group ? Shape({2, 8, 6, 5}) : Shape({17, 64});
  Inputs in = make_inputs(op, s, dt, 21);
  const Tensor up = random_tensor(s, dt, 77);
  Inputs in64{in.x.to_dtype(DType::F64), in.w.defined() ? in.w.to_dtype(DType::F64) : Tensor(),
              in.b.defined() ? in.b.to_dtype(DType::F64) : Tensor()};
  Result ref = run(op, in64, up, false);
  for (Device dev : test_devices()) {  // the f64 reference on the CPU, the case on every device
    SCOPED_TRACE(dev.to_string());
    Result got = run(op, in, up, false, transposed, dev);
    EXPECT_TRUE(at_rounding_floor(got.y, ref.y, dt)) << "y";
    // Softmax included: its backward recomputes y from x and the saved f32 lse, so the
    // half-type rounding of the stored y never reaches dx.
    EXPECT_TRUE(at_rounding_floor(got.dx, ref.dx, dt)) << "dx";
    EXPECT_TRUE(at_rounding_floor(got.dw, ref.dw, dt)) << "dw";
    EXPECT_TRUE(at_rounding_floor(got.db, ref.db, dt)) << "db";
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, HalfGrad,
    ::testing::Combine(::testing::Values(Op::Softmax, Op::LogSoftmax, Op::Rms, Op::Layer, Op::Group),
                       ::testing::Values(DType::BF16, DType::F16), ::testing::Bool()),
    [](const auto& i) {
      return std::string(op_str(std::get<0>(i.param))) + "_" +
             std::string(dtype_name(std::get<1>(i.param))) +
             (std::get<2>(i.param) ? "_transposed" : "_contiguous");
    });

// ---- the cases other frameworks get wrong ----

TEST(FusedGrad, F16GroupNormLargeGroupsStaysFinite) {
  // 65 536 elements per group, upstream gradient of ones.
  const Shape s({1, 16, 256, 256});
  Inputs in = make_inputs(Op::Group, s, DType::F16, 31);
  const Tensor up = Tensor::ones(s, DType::F16);
  Inputs in64{in.x.to_dtype(DType::F64), in.w.to_dtype(DType::F64), in.b.to_dtype(DType::F64)};
  Result ref = run(Op::Group, in64, up, false);
  for (Device dev : test_devices()) {
    SCOPED_TRACE(dev.to_string());
    Result got = run(Op::Group, in, up, false, false, dev);
    for (double v : got.y) ASSERT_TRUE(std::isfinite(v));
    for (double v : got.dx) ASSERT_TRUE(std::isfinite(v));
    for (double v : got.dw) ASSERT_TRUE(std::isfinite(v));
    EXPECT_TRUE(at_rounding_floor(got.y, ref.y, DType::F16)) << "y";
    // dx cancels to ~0 for a ones upstream; its floor is set by the f32 terms it is made of.
    EXPECT_TRUE(at_rounding_floor(got.dx, ref.dx, DType::F16)) << "dx";
    EXPECT_TRUE(at_rounding_floor(got.dw, ref.dw, DType::F16)) << "dw";
    // The bias gradient is 65 536 per channel, beyond the f16 maximum: inf, never NaN.
    for (double v : got.db) {
      EXPECT_FALSE(std::isnan(v));
      EXPECT_TRUE(std::isinf(v) && v > 0);
    }
  }
}

class Bf16Offset : public ::testing::TestWithParam<std::tuple<Op, double>> {};

TEST_P(Bf16Offset, GradientsAtRoundingFloor) {
  // Large mean, small variance: statistics rounded to bf16 would be far off.
  const auto [op, offset] = GetParam();
  const Shape s = op == Op::Group ? Shape({2, 8, 16, 16}) : Shape({32, 256});
  Inputs in = make_inputs(op, s, DType::BF16, 41, offset);
  const Tensor up = random_tensor(s, DType::BF16, 43);
  Inputs in64{in.x.to_dtype(DType::F64), in.w.to_dtype(DType::F64), in.b.to_dtype(DType::F64)};
  Result ref = run(op, in64, up, false);
  for (Device dev : test_devices()) {
    SCOPED_TRACE(dev.to_string());
    Result got = run(op, in, up, false, false, dev);
    EXPECT_TRUE(at_rounding_floor(got.y, ref.y, DType::BF16)) << "y";
    EXPECT_TRUE(at_rounding_floor(got.dx, ref.dx, DType::BF16)) << "dx";
    EXPECT_TRUE(at_rounding_floor(got.dw, ref.dw, DType::BF16)) << "dw";
    EXPECT_TRUE(at_rounding_floor(got.db, ref.db, DType::BF16)) << "db";
  }
}

INSTANTIATE_TEST_SUITE_P(All, Bf16Offset,
                         ::testing::Combine(::testing::Values(Op::Layer, Op::Group),
                                            ::testing::Values(1.0, 16.0)),
                         [](const auto& i) {
                           return std::string(op_str(std::get<0>(i.param))) + "_plus" +
                                  std::to_string(static_cast<int>(std::get<1>(i.param)));
                         });

TEST(FusedGrad, SavedStatisticsAreF32ForHalvesAndF64ForF64) {
  for (DType dt : {DType::BF16, DType::F16, DType::F32, DType::F64}) {
    Inputs in = make_inputs(Op::Layer, {4, 8}, dt, 51);
    Var x = Var::from_tensor(in.x);
    Tensor y = ops::layer_norm(x, in.w, in.b, 1e-5);
    const auto& node = y.impl_ptr()->grad_fn;
    ASSERT_TRUE(node);
    ASSERT_EQ(node->outputs.size(), 3u);
    const DType want = dt == DType::F64 ? DType::F64 : DType::F32;
    EXPECT_EQ(node->outputs[1].dtype(), want) << dtype_name(dt);
    EXPECT_EQ(node->outputs[2].dtype(), want) << dtype_name(dt);
    // The softmax forwards save (max, log-sum) per row (x's shape, last dim 2) for the backward.
    for (Op op : {Op::Softmax, Op::LogSoftmax}) {
      Tensor ys = apply(op, Inputs{x, Tensor(), Tensor()}, false);
      const auto& n = ys.impl_ptr()->grad_fn;
      ASSERT_TRUE(n);
      ASSERT_EQ(n->outputs.size(), 2u) << op_str(op);
      EXPECT_EQ(n->outputs[1].dtype(), want) << op_str(op) << " " << dtype_name(dt);
      EXPECT_EQ(n->outputs[1].dims(), (std::vector<size_t>{4, 2})) << op_str(op);
    }
  }
}

TEST(FusedGrad, NonContiguousUpstreamGradient) {
  for (Op op : {Op::Softmax, Op::LogSoftmax, Op::Rms, Op::Layer, Op::Group}) {
    const Shape s = op == Op::Group ? Shape({2, 8, 3, 4}) : Shape({6, 10});
    Inputs in = make_inputs(op, s, DType::F64, 61);
    const Tensor up_c = random_tensor(s, DType::F64, 62);
    const Tensor up_t = with_layout(up_c, LayoutKind::Transposed);
    ASSERT_FALSE(up_t.is_contiguous());
    Result a = run(op, in, up_c, false);
    Result b = run(op, in, up_t, false, true);
    EXPECT_TRUE(all_close(b.dx, a.dx, 1e-12, 1e-14)) << op_str(op);
    EXPECT_TRUE(all_close(b.dw, a.dw, 1e-12, 1e-14)) << op_str(op);
  }
}

// ---- the dedicated norm backward ops (rms_norm_bwd, layer_norm_bwd, group_norm_bwd) ----------

// Called directly: in = {x, w or empty, [mean,] rstd, dy}, the statistics from the forward
// kernel, attrs.ints = {need dw, need db}. The shapes reach every plan of cpu/norm.cpp's backward:
// whole rows in tasks (few and many tasks), rows split in column chunks (too few rows, or rows
// too long for the cache), whole groups, and groups split over (n, c, chunk) items.

OpId bwd_op(Op op) {
  return op == Op::Rms ? OpId::rms_norm_bwd
                       : (op == Op::Layer ? OpId::layer_norm_bwd : OpId::group_norm_bwd);
}
OpId fwd_op(Op op) {
  return op == Op::Rms ? OpId::rms_norm : (op == Op::Layer ? OpId::layer_norm : OpId::group_norm);
}

struct BwdCase {
  Shape shape;
  size_t groups = 1;  // group norm only
};

std::vector<BwdCase> bwd_cases(Op op) {
  if (op == Op::Group) {
    return {{Shape({3, 8, 5, 7}), 4},   {Shape({2, 6, 7}), 3},        {Shape({16, 8, 3, 5}), 4},
            {Shape({32, 4, 10}), 1},    {Shape({1, 4, 9001}), 2},     {Shape({8, 32, 64, 64}), 8},
            {Shape({1, 16, 256, 256}), 4}};
  }
  return {{Shape({1, 1})},   {Shape({3, 7})},      {Shape({9, 37})},       {Shape({67, 33})},
          {Shape({300, 1000})}, {Shape({5, 4099})}, {Shape({16, 20000})}, {Shape({2, 100003})}};
}

std::string case_name(Op op, const BwdCase& c) {
  return std::string(op_str(op)) + " " + c.shape.to_string() +
         (op == Op::Group ? " G=" + std::to_string(c.groups) : "");
}

/// The backward op's inputs for x, w (undefined: none) and dy, with the forward kernel's
/// statistics, and its attrs.
struct BwdProblem {
  std::vector<Tensor> in;
  OpAttrs attrs;
};

BwdProblem bwd_problem(Op op, const Tensor& x, const Tensor& w, const Tensor& dy, size_t groups,
                       bool need_dw = true, bool need_db = true) {
  const Tensor wt = w.defined() ? w : Tensor::zeros(Shape({0}), x.dtype());
  OpAttrs fa;
  fa.f0 = 1e-5;
  fa.i0 = static_cast<int64_t>(groups);
  std::vector<Tensor> fin = {x.contiguous(), wt};
  if (op != Op::Rms) fin.push_back(Tensor::zeros(Shape({0}), x.dtype()));
  const std::vector<Tensor> f = op_def(fwd_op(op)).kernels[0].fn(fin, fa);
  BwdProblem p;
  p.in = op == Op::Rms ? std::vector<Tensor>{x, wt, f[1], dy}
                       : std::vector<Tensor>{x, wt, f[1], f[2], dy};
  p.attrs.ints = {need_dw ? 1 : 0, need_db ? 1 : 0};
  p.attrs.dtype = x.dtype();
  p.attrs.i0 = static_cast<int64_t>(groups);
  return p;
}

Inputs bwd_inputs(Op op, const BwdCase& c, DType dt, uint64_t seed) {
  Inputs in = make_inputs(op, c.shape, dt, seed, 0.5);
  std::vector<double> w = values(in.w);
  for (size_t i = 0; i < w.size(); i += 3) w[i] = -w[i];  // signed weights
  in.w = Tensor::from_vector(w, Shape({w.size()})).to_dtype(dt);
  return in;
}

std::vector<std::vector<double>> all_values(const std::vector<Tensor>& out) {
  std::vector<std::vector<double>> v;
  for (const Tensor& t : out) v.push_back(t.defined() ? values(t) : std::vector<double>());
  return v;
}

// |got - ref| <= tol * (|ref| + max|ref|): relative to the output's magnitude.
::testing::AssertionResult close_rel(const std::vector<double>& got, const std::vector<double>& ref,
                                     double tol) {
  double mx = 0;
  for (double v : ref)
    if (std::isfinite(v)) mx = std::max(mx, std::abs(v));
  return all_close(got, ref, tol, tol * mx);
}

/// The size of dx's terms (u * w, d * k, c are all about rho |dy| |w|): max rstd * max|dy| *
/// max|w|. dx's rounding noise is relative to it, not to dx, which cancels to ~0 for rows of one
/// element (layer norm: exactly 0).
double dx_scale(Op op, const BwdProblem& p) {
  auto max_abs = [](const Tensor& t) {
    double m = 0;
    for (double v : values(t)) m = std::max(m, std::abs(v));
    return m;
  };
  const double w = p.in[1].elem_count() ? max_abs(p.in[1]) : 1.0;
  return max_abs(p.in[op == Op::Rms ? 2 : 3]) * max_abs(p.in.back()) * w;
}

const std::vector<OpId> kNormBwdOps = {OpId::rms_norm_bwd, OpId::layer_norm_bwd,
                                       OpId::group_norm_bwd};

class NormBwdVsComposed : public ::testing::TestWithParam<std::tuple<Op, DType>> {};

TEST_P(NormBwdVsComposed, KernelMatchesComposedBackward) {
  const auto [op, dt] = GetParam();
  ASSERT_TRUE(has_kernel(bwd_op(op), Device::cpu(), dt));
  const double tol = dt == DType::F64 ? 1e-10 : 1e-5;
  uint64_t seed = 300;
  for (const BwdCase& c : bwd_cases(op)) {
    for (bool affine : {true, false}) {
      SCOPED_TRACE(case_name(op, c) + (affine ? " affine" : " plain"));
      const Inputs in = bwd_inputs(op, c, dt, ++seed);
      const Tensor dy = random_tensor(c.shape, dt, ++seed);
      const BwdProblem p = bwd_problem(op, in.x, affine ? in.w : Tensor(), dy, c.groups);
      const auto fused = all_values(dispatch(bwd_op(op), p.in, p.attrs));
      std::vector<std::vector<double>> comp;
      {
        ComposedOnlyGuard guard(kNormBwdOps);
        comp = all_values(dispatch(bwd_op(op), p.in, p.attrs));
      }
      ASSERT_EQ(fused.size(), comp.size());
      EXPECT_TRUE(all_close(fused[0], comp[0], tol, tol * dx_scale(op, p))) << "dx";
      EXPECT_EQ(fused[1].empty(), !affine) << "dw";
      EXPECT_TRUE(close_rel(fused[1], comp[1], tol)) << "dw";
      if (op != Op::Rms) {
        EXPECT_FALSE(fused[2].empty()) << "db";
        EXPECT_TRUE(close_rel(fused[2], comp[2], tol)) << "db";
      }
      // Transposed x and dy (the dispatcher makes them contiguous): the same bits.
      if (c.shape.elem_count() <= 300000 && c.shape[c.shape.rank() - 1] > 1) {
        std::vector<Tensor> tin = p.in;
        tin[0] = with_layout(tin[0], LayoutKind::Transposed);
        tin.back() = with_layout(tin.back(), LayoutKind::Transposed);
        ASSERT_FALSE(tin[0].is_contiguous());
        EXPECT_EQ(all_values(dispatch(bwd_op(op), tin, p.attrs)), fused) << "transposed";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, NormBwdVsComposed,
                         ::testing::Combine(::testing::Values(Op::Rms, Op::Layer, Op::Group),
                                            ::testing::Values(DType::F64, DType::F32)),
                         [](const auto& i) {
                           return std::string(op_str(std::get<0>(i.param))) + "_" +
                                  std::string(dtype_name(std::get<1>(i.param)));
                         });

// bf16/f16: the kernel's gradients at the rounding floor of the composed f64 backward on the
// same (exactly widened) inputs.
class NormBwdHalf : public ::testing::TestWithParam<std::tuple<Op, DType>> {};

TEST_P(NormBwdHalf, AtRoundingFloorOfF64Composed) {
  const auto [op, dt] = GetParam();
  uint64_t seed = 700;
  for (const BwdCase& c : bwd_cases(op)) {
    SCOPED_TRACE(case_name(op, c));
    const Inputs in = bwd_inputs(op, c, dt, ++seed);
    const Tensor dy = random_tensor(c.shape, dt, ++seed);
    const BwdProblem p = bwd_problem(op, in.x, in.w, dy, c.groups);
    const auto got = all_values(dispatch(bwd_op(op), p.in, p.attrs));
    const BwdProblem p64 = bwd_problem(op, in.x.to_dtype(DType::F64), in.w.to_dtype(DType::F64),
                                       dy.to_dtype(DType::F64), c.groups);
    std::vector<std::vector<double>> ref;
    {
      ComposedOnlyGuard guard(kNormBwdOps);
      ref = all_values(dispatch(bwd_op(op), p64.in, p64.attrs));
    }
    // dx: the rounding floor plus the f32 noise of its terms (64 u_f32 of their size).
    const double noise = 64 * std::ldexp(1.0, -24) * dx_scale(op, p);
    EXPECT_TRUE(all_close(got[0], ref[0], 1.01 * unit_roundoff(dt), noise)) << "dx";
    EXPECT_TRUE(at_rounding_floor(got[1], ref[1], dt)) << "dw";
    if (op != Op::Rms) {
      EXPECT_TRUE(at_rounding_floor(got[2], ref[2], dt)) << "db";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, NormBwdHalf,
                         ::testing::Combine(::testing::Values(Op::Rms, Op::Layer, Op::Group),
                                            ::testing::Values(DType::BF16, DType::F16)),
                         [](const auto& i) {
                           return std::string(op_str(std::get<0>(i.param))) + "_" +
                                  std::string(dtype_name(std::get<1>(i.param)));
                         });

// f16 group norm (1, 16, 256, 256) / 4 with a ones upstream, on the op itself: dx and dw finite
// at the f16 floor of the f64 composed backward, db = 65536 per channel, beyond f16: inf.
TEST(NormBwd, F16GroupNormOnesUpstreamFinite) {
  const BwdCase c{Shape({1, 16, 256, 256}), 4};
  const Inputs in = bwd_inputs(Op::Group, c, DType::F16, 31);
  const Tensor ones = Tensor::ones(c.shape, DType::F16);
  const BwdProblem p = bwd_problem(Op::Group, in.x, in.w, ones, 4);
  const auto got = all_values(dispatch(OpId::group_norm_bwd, p.in, p.attrs));
  const BwdProblem p64 = bwd_problem(Op::Group, in.x.to_dtype(DType::F64),
                                     in.w.to_dtype(DType::F64), ones.to_dtype(DType::F64), 4);
  std::vector<std::vector<double>> ref;
  {
    ComposedOnlyGuard guard({OpId::group_norm_bwd});
    ref = all_values(dispatch(OpId::group_norm_bwd, p64.in, p64.attrs));
  }
  for (size_t k : {0, 1})
    for (double v : got[k]) ASSERT_TRUE(std::isfinite(v)) << (k ? "dw" : "dx");
  EXPECT_TRUE(at_rounding_floor(got[0], ref[0], DType::F16)) << "dx";
  EXPECT_TRUE(at_rounding_floor(got[1], ref[1], DType::F16)) << "dw";
  for (double v : got[2]) EXPECT_TRUE(std::isinf(v) && v > 0) << "db";
}

// The same bits for 1, 2, 3 and 8 threads, every dtype and plan (the task decomposition and the
// order of every sum depend on the shape alone).
TEST(NormBwd, BitIdenticalAcrossThreadCounts) {
  ThreadsGuard guard;
  uint64_t seed = 900;
  for (Op op : {Op::Rms, Op::Layer, Op::Group}) {
    const std::vector<BwdCase> cases =
        op == Op::Group
            ? std::vector<BwdCase>{{Shape({16, 8, 3, 5}), 4}, {Shape({8, 32, 16, 16}), 8},
                                   {Shape({1, 4, 9001}), 2}, {Shape({1, 16, 256, 256}), 4}}
            : std::vector<BwdCase>{{Shape({300, 1000})}, {Shape({5, 4099})}, {Shape({1, 65537})}};
    for (DType dt : {DType::BF16, DType::F16, DType::F32, DType::F64}) {
      for (const BwdCase& c : cases) {
        SCOPED_TRACE(case_name(op, c) + " " + std::string(dtype_name(dt)));
        const Inputs in = bwd_inputs(op, c, dt, ++seed);
        const BwdProblem p = bwd_problem(op, in.x, in.w, random_tensor(c.shape, dt, ++seed),
                                         c.groups);
        std::vector<std::vector<double>> first;
        for (size_t threads : {1, 2, 3, 8}) {
          set_num_threads(threads);
          const auto got = all_values(dispatch(bwd_op(op), p.in, p.attrs));
          if (threads == 1) {
            first = got;
          } else {
            EXPECT_EQ(got, first) << threads << " threads";
          }
        }
      }
    }
  }
}

// A frozen weight (and bias): attrs.ints = {0, 0} computes no dw/db (undefined outputs), the same
// dx to the bit; {1, 0} only dw. Through autograd, a weight that is not a Var gets no gradient.
TEST(NormBwd, FrozenWeightSkipsReductions) {
  for (Op op : {Op::Rms, Op::Layer, Op::Group}) {
    for (DType dt : {DType::BF16, DType::F32, DType::F64}) {
      SCOPED_TRACE(std::string(op_str(op)) + " " + std::string(dtype_name(dt)));
      const BwdCase c = op == Op::Group ? BwdCase{Shape({2, 8, 6, 5}), 4} : BwdCase{Shape({17, 64})};
      const Inputs in = bwd_inputs(op, c, dt, 61);
      const Tensor dy = random_tensor(c.shape, dt, 62);
      const auto all = dispatch(bwd_op(op), bwd_problem(op, in.x, in.w, dy, c.groups).in,
                                bwd_problem(op, in.x, in.w, dy, c.groups).attrs);
      for (const Tensor& t : all) ASSERT_TRUE(t.defined());
      for (bool keep_dw : {false, true}) {
        const BwdProblem p = bwd_problem(op, in.x, in.w, dy, c.groups, keep_dw, false);
        const std::vector<Tensor> out = dispatch(bwd_op(op), p.in, p.attrs);
        EXPECT_EQ(values(out[0]), values(all[0])) << "dx";
        EXPECT_EQ(out[1].defined(), keep_dw) << "dw";
        if (keep_dw) {
          EXPECT_EQ(values(out[1]), values(all[1])) << "dw";
        }
        if (op != Op::Rms) {
          EXPECT_FALSE(out[2].defined()) << "db";
        }
      }
      Var x = Var::from_tensor(in.x);
      const Tensor y = apply(op, Inputs{x, in.w, in.b}, false);
      GradStore g = y.backward(dy);
      ASSERT_TRUE(g.get(x).has_value());
      EXPECT_EQ(values(*g.get(x)), values(all[0])) << "dx through autograd";
    }
  }
}

// Zero-size inputs: no rows, rows of nothing, no channels, no positions: empty dx, dw/db zero
// (sums over nothing), never a division by zero.
TEST(NormBwd, ZeroSizeInputs) {
  for (DType dt : {DType::F32, DType::BF16, DType::F64}) {
    SCOPED_TRACE(dtype_name(dt));
    const DType sd = dt == DType::F64 ? DType::F64 : DType::F32;
    for (size_t R : {0, 3}) {
      const size_t D = R ? 0 : 5;
      const Tensor x = Tensor::zeros(Shape({R, D}), dt);
      const Tensor w = Tensor::ones(Shape({D}), dt);
      const Tensor st = Tensor::zeros(Shape({R}), sd);
      OpAttrs a;
      a.ints = {1, 1};
      a.dtype = dt;
      const auto r = dispatch(OpId::rms_norm_bwd, {x, w, st, x}, a);
      EXPECT_EQ(r[0].dims(), x.dims());
      const auto l = dispatch(OpId::layer_norm_bwd, {x, w, st, st, x}, a);
      EXPECT_EQ(l[0].dims(), x.dims());
      ASSERT_TRUE(l[2].defined());
      EXPECT_EQ(values(l[2]), std::vector<double>(D, 0.0)) << "db";
      if (D) {  // w present: dw is D zeros
        EXPECT_EQ(values(r[1]), std::vector<double>(D, 0.0)) << "rms dw";
        EXPECT_EQ(values(l[1]), std::vector<double>(D, 0.0)) << "layer dw";
      }
    }
    for (const Shape& s : {Shape({0, 4, 3}), Shape({2, 4, 0}), Shape({2, 0, 3})}) {
      SCOPED_TRACE(s.to_string());
      const size_t C = s[1], G = C ? 2 : 1;
      const Tensor x = Tensor::zeros(s, dt);
      const Tensor st = Tensor::zeros(Shape({s[0], G}), sd);
      OpAttrs a;
      a.ints = {1, 1};
      a.dtype = dt;
      a.i0 = static_cast<int64_t>(G);
      const auto g = dispatch(OpId::group_norm_bwd, {x, Tensor::ones(Shape({C}), dt), st, st, x}, a);
      EXPECT_EQ(g[0].dims(), s.dims());
      EXPECT_EQ(values(g[2]), std::vector<double>(C, 0.0)) << "db";
      if (C) {
        EXPECT_EQ(values(g[1]), std::vector<double>(C, 0.0)) << "dw";
      }
    }
  }
}

TAPER_COVERS(Forward, OpId::rms_norm_bwd, OpId::layer_norm_bwd, OpId::group_norm_bwd);

// ---- fallback: a device without a kernel runs the composed form, forward and backward ----

TEST(FusedFallback, MissingKernelRunsComposedForwardAndBackward) {
  for (OpId id : {OpId::softmax_last_dim, OpId::log_softmax_last_dim, OpId::rms_norm,
                  OpId::layer_norm, OpId::group_norm}) {
    const Op op = id == OpId::softmax_last_dim       ? Op::Softmax
                  : id == OpId::log_softmax_last_dim ? Op::LogSoftmax
                  : id == OpId::rms_norm             ? Op::Rms
                  : id == OpId::layer_norm           ? Op::Layer
                                                     : Op::Group;
    const Shape s = op == Op::Group ? Shape({2, 8, 3, 4}) : Shape({6, 10});
    Inputs in = make_inputs(op, s, DType::F64, 71);
    const Tensor up = random_tensor(s, DType::F64, 72);
    Result fused = run(op, in, up, false);
    // Take the CPU kernel away, as on a device that has none.
    KernelSlot saved = op_def(id).kernels[0];
    op_def(id).kernels[0] = KernelSlot{};
    Var x = Var::from_tensor(in.x);
    Tensor y = apply(op, Inputs{x, in.w, in.b}, false);
    const bool composed_graph = y.impl_ptr()->grad_fn && y.impl_ptr()->grad_fn->op != id;
    Result fb = run(op, in, up, false);
    op_def(id).kernels[0] = saved;
    EXPECT_TRUE(composed_graph) << op_str(op);
    EXPECT_TRUE(all_close(fb.y, fused.y, 1e-10, 1e-13)) << op_str(op);
    EXPECT_TRUE(all_close(fb.dx, fused.dx, 1e-10, 1e-13)) << op_str(op);
    EXPECT_TRUE(all_close(fb.dw, fused.dw, 1e-10, 1e-13)) << op_str(op);
  }
}

TEST(FusedFallback, ComposedOnlyGuardForcesTheComposedPath) {
  Var x = Var::from_tensor(random_tensor({4, 8}, DType::F32, 81));
  {
    ComposedOnlyGuard g({OpId::softmax_last_dim});
    Tensor y = ops::softmax_last_dim(x);
    EXPECT_NE(y.impl_ptr()->grad_fn->op, OpId::softmax_last_dim);
  }
  Tensor y = ops::softmax_last_dim(x);
  EXPECT_EQ(y.impl_ptr()->grad_fn->op, OpId::softmax_last_dim);
}

TAPER_COVERS(Forward, OpId::softmax_last_dim_bwd, OpId::log_softmax_last_dim_bwd);

}  // namespace
}  // namespace taper::testing
