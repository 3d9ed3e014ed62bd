// test_fused_grad.cpp: the backward side of the fused ops: fused against composed (f64 and f32),
// half-type gradients at the rounding floor of the f64 reference, the f16 group norm that
// overflows elsewhere, bf16 norms on offset inputs, non-contiguous inputs and upstream
// gradients, and the composed fallback when a device has no kernel.
#include <gtest/gtest.h>

#include <cmath>

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

// Runs op forward, then backward with upstream `up` (same shape as y), collecting gradients.
Result run(Op op, Inputs in, const Tensor& up, bool composed_path, bool transposed_x = false) {
  Var x = Var::from_tensor(transposed_x ? with_layout(in.x, LayoutKind::Transposed) : in.x);
  Var w, b;
  Inputs vin{x, Tensor(), Tensor()};
  if (in.w.defined()) vin.w = w = Var::from_tensor(in.w);
  if (in.b.defined() && op != Op::Rms) vin.b = b = Var::from_tensor(in.b);
  Tensor y = apply(op, vin, composed_path);
  GradStore g = (y.to_dtype(DType::F64) * up.to_dtype(DType::F64)).sum_all().backward();
  // The loss above sends exactly `up` (as f64, then cast to y's dtype) into y.
  Result r;
  r.y = values(y);
  r.dx = values(*g.get(x));
  if (w.defined()) r.dw = values(*g.get(w));
  if (b.defined()) r.db = values(*g.get(b));
  return r;
}

// |got - ref| <= k*u*|ref| + slack*u*max|ref|: within the rounding of the reference to the
// dtype (u its unit roundoff), plus an absolute slack far below one ulp of the largest value.
::testing::AssertionResult at_rounding_floor(const std::vector<double>& got,
                                             const std::vector<double>& ref, DType dt,
                                             double k = 1.01, double slack = 1e-2) {
  double mx = 0;
  for (double v : ref)
    if (std::isfinite(v)) mx = std::max(mx, std::abs(v));
  const double u = unit_roundoff(dt);
  return all_close(got, ref, k * u, slack * u * mx);
}

// ---- fused vs composed, f64 and f32 ----

class FusedVsComposed : public ::testing::TestWithParam<std::tuple<Op, DType>> {};

TEST_P(FusedVsComposed, ForwardAndEveryGradient) {
  const auto [op, dt] = GetParam();
  const Shape s = op == Op::Group ? Shape({3, 8, 5, 7}) : Shape({9, 37});
  Inputs in = make_inputs(op, s, dt, 11);
  const Tensor up = random_tensor(s, dt, 99);
  Result f = run(op, in, up, false);
  Result c = run(op, in, up, true);
  const double tol = dt == DType::F64 ? 1e-10 : 1e-5;
  EXPECT_TRUE(all_close(f.y, c.y, tol, tol * 1e-2)) << op_str(op) << " y";
  EXPECT_TRUE(all_close(f.dx, c.dx, tol, tol * 1e-2)) << op_str(op) << " dx";
  EXPECT_TRUE(all_close(f.dw, c.dw, tol, tol * 1e-2)) << op_str(op) << " dw";
  EXPECT_TRUE(all_close(f.db, c.db, tol, tol * 1e-2)) << op_str(op) << " db";
  if (has_affine(op)) {
    EXPECT_FALSE(f.dw.empty());
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
  Result got = run(op, in, up, false, transposed);
  EXPECT_TRUE(at_rounding_floor(got.y, ref.y, dt)) << "y";
  // Softmax included: its backward recomputes y from x and the saved f32 lse, so the half-type
  // rounding of the stored y never reaches dx.
  EXPECT_TRUE(at_rounding_floor(got.dx, ref.dx, dt)) << "dx";
  EXPECT_TRUE(at_rounding_floor(got.dw, ref.dw, dt)) << "dw";
  EXPECT_TRUE(at_rounding_floor(got.db, ref.db, dt)) << "db";
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
  Result got = run(Op::Group, in, up, false);
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

class Bf16Offset : public ::testing::TestWithParam<std::tuple<Op, double>> {};

TEST_P(Bf16Offset, GradientsAtRoundingFloor) {
  // Large mean, small variance: statistics rounded to bf16 would be far off.
  const auto [op, offset] = GetParam();
  const Shape s = op == Op::Group ? Shape({2, 8, 16, 16}) : Shape({32, 256});
  Inputs in = make_inputs(op, s, DType::BF16, 41, offset);
  const Tensor up = random_tensor(s, DType::BF16, 43);
  Inputs in64{in.x.to_dtype(DType::F64), in.w.to_dtype(DType::F64), in.b.to_dtype(DType::F64)};
  Result ref = run(op, in64, up, false);
  Result got = run(op, in, up, false);
  EXPECT_TRUE(at_rounding_floor(got.y, ref.y, DType::BF16)) << "y";
  EXPECT_TRUE(at_rounding_floor(got.dx, ref.dx, DType::BF16)) << "dx";
  EXPECT_TRUE(at_rounding_floor(got.dw, ref.dw, DType::BF16)) << "dw";
  EXPECT_TRUE(at_rounding_floor(got.db, ref.db, DType::BF16)) << "db";
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
