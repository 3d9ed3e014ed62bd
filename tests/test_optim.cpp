// test_optim.cpp: SGD, AdamW, gradient clipping, accumulation, learning-rate schedules and
// optimizer state.
//
// What it is: steps against values computed by hand (the numbers in the comments), the fused
// AdamW loop against its composed form, f32 master weights and moments for bf16/f16
// parameters, parameter groups, skipped parameters, state save/restore.
// What it is not: training a model (test_nn.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "taper/nn.h"
#include "tests/test_util.h"

namespace taper {
namespace {

using namespace taper::nn;
using testing::all_close;
using testing::random_tensor;
using testing::values;
using testing::test_devices;

Var scalar_var(double v, DType dt = DType::F64) {
  return Var::from_tensor(Tensor::full({1}, v, dt));
}

GradStore grad_of(const Var& p, double g) {
  GradStore gs;
  gs.insert(p, Tensor::full(p.shape(), g, p.dtype(), p.device()));
  return gs;
}

TEST(NnOptim, SgdPlain) {
  Var p = Var::from_tensor(Tensor::from_vector(std::vector<double>{1, 2, -3}, {3}));
  SGD opt({p}, SGDOptions(0.1));
  GradStore gs;
  gs.insert(p, Tensor::from_vector(std::vector<double>{0.1, -0.2, 0.3}, {3}));
  const uint64_t id = p.id();
  opt.step(gs);
  EXPECT_TRUE(all_close(values(p), {0.99, 2.02, -3.03}, 1e-15, 0));
  EXPECT_EQ(p.id(), id);  // same leaf, new value
  EXPECT_EQ(opt.step_count(), 1);
}

TEST(NnOptim, SgdMomentumNesterovWeightDecay) {
  // lr 0.1, momentum 0.9, weight decay 0.1, Nesterov; p0 = 1, g = 0.5 then -0.25:
  //   d1 = 0.5 + 0.1*1 = 0.6; b1 = 0.6; p1 = 1 - 0.1*(0.6 + 0.9*0.6) = 0.886
  //   d2 = -0.25 + 0.1*0.886 = -0.1614; b2 = 0.9*0.6 - 0.1614 = 0.3786
  //   p2 = 0.886 - 0.1*(-0.1614 + 0.9*0.3786) = 0.868066
  Var p = scalar_var(1.0);
  SGD opt({p}, SGDOptions(0.1).momentum(0.9).weight_decay(0.1).nesterov(true));
  opt.step(grad_of(p, 0.5));
  EXPECT_NEAR(p.item(), 0.886, 1e-15);
  opt.step(grad_of(p, -0.25));
  EXPECT_NEAR(p.item(), 0.868066, 1e-15);
  // Plain momentum with dampening 0.5 (the first step stores g undamped, as PyTorch):
  //   p1 = 1 - 0.1*0.6 = 0.94; d2 = -0.25 + 0.094 = -0.156; b2 = 0.54 - 0.078 = 0.462
  //   p2 = 0.94 - 0.0462 = 0.8938
  Var q = scalar_var(1.0);
  SGD opt2({q}, SGDOptions(0.1).momentum(0.9).dampening(0.5).weight_decay(0.1));
  opt2.step(grad_of(q, 0.5));
  EXPECT_NEAR(q.item(), 0.94, 1e-15);
  opt2.step(grad_of(q, -0.25));
  EXPECT_NEAR(q.item(), 0.8938, 1e-15);
  EXPECT_THROW(SGD({q}, SGDOptions(-1.0)), Error);
  EXPECT_THROW(SGD({q}, SGDOptions(0.1).nesterov(true)), Error);
}

TEST(NnOptim, AdamWHandComputed) {
  // lr 0.1, betas (0.9, 0.999), eps 1e-8, weight decay 0.1; p0 = 1, g = 0.5 then -0.25:
  //   step 1: p = 0.99; m = 0.05; v = 0.00025; bias-corrected m/bc1 = 0.5, sqrt(v/bc2) = 0.5
  //           p = 0.99 - 0.1 * 0.5 / (0.5 + 1e-8) = 0.890000002
  //   step 2: p = 0.890000002 * 0.99; m = 0.02; v = 0.00031225
  //           p = 0.8544662986878463
  for (bool fused : {true, false}) {
    Var p = scalar_var(1.0);
    AdamW opt({p}, AdamWOptions(0.1).weight_decay(0.1).fused(fused));
    opt.step(grad_of(p, 0.5));
    EXPECT_NEAR(p.item(), 0.890000002, 1e-15) << fused;
    opt.step(grad_of(p, -0.25));
    EXPECT_NEAR(p.item(), 0.8544662986878463, 1e-15) << fused;
  }
}

TEST(NnOptim, AdamWFusedMatchesComposed) {
  // The adamw_step op (its kernel), the op's composed form (ComposedOnlyGuard) and the
  // tensor-op update (fused(false)) do the same operations in the same order: the same bits, on
  // every device of test_devices().
  // Parameters that share one storage are updated through new values; parameters of their own
  // in place (a half parameter then takes its rounding inside the fused op).
  for (Device dev : test_devices()) {
    for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
      for (bool shared : {true, false}) {
      SCOPED_TRACE(dev.to_string() + " " + std::string(dtype_name(dt)) +
                   (shared ? " shared" : " own storage"));
      const Tensor init = random_tensor({37, 5}, dt, dev, 1);
      auto make = [&] { return Var::from_tensor(shared ? init : init * 1.0); };
      Var a = make(), b = make(), c = make();
      const AdamWOptions o = AdamWOptions(3e-2).weight_decay(0.05);
      AdamW fa({a}, AdamWOptions(o).fused(true)), fb({b}, AdamWOptions(o).fused(false)),
          fc({c}, AdamWOptions(o).fused(true));
      for (int s = 0; s < 5; ++s) {
        const Tensor g = random_tensor({37, 5}, dt, dev, 10 + s);
        GradStore ga, gb, gc;
        ga.insert(a, g);
        gb.insert(b, g);
        gc.insert(c, g);
        fa.step(ga);
        fb.step(gb);
        ComposedOnlyGuard composed({OpId::adamw_step});
        fc.step(gc);
      }
      EXPECT_EQ(values(a), values(b));
      EXPECT_EQ(values(a), values(c));
      EXPECT_NE(values(a), values(init));
      }
    }
  }
}

TAPER_COVERS(Forward, OpId::adamw_step);

TEST(NnOptim, HalfParametersKeepF32MasterAndMoments) {
  // bf16 has 8 bits of precision: 1 - 0.001 rounds back to 1 (f16, 11 bits: 1 - 0.0001 does).
  // With an f32 master copy the steps add up: after 10 steps the master is 1 - 10 lr and the
  // parameter its rounding, e.g. bf16(0.99) = 0.98828125.
  for (DType dt : {DType::BF16, DType::F16}) {
    const double lr = dt == DType::BF16 ? 1e-3 : 1e-4;
    Var p = scalar_var(1.0, dt);
    SGD opt({p}, SGDOptions(lr));
    opt.step(grad_of(p, 1.0));
    EXPECT_EQ(p.item(), 1.0) << dtype_name(dt);
    for (int i = 0; i < 9; ++i) opt.step(grad_of(p, 1.0));
    const float m = static_cast<float>(1.0 - 10 * lr);
    const double want = dt == DType::BF16 ? double(float(bf16(m))) : double(float(f16(m)));
    EXPECT_NE(want, 1.0);
    EXPECT_EQ(p.item(), want) << dtype_name(dt);
    EXPECT_EQ(p.dtype(), dt);
    bool has_master = false;
    for (auto& [k, t] : opt.state_dict())
      if (k == "0.master") {
        has_master = true;
        EXPECT_EQ(t.dtype(), DType::F32);
        EXPECT_NEAR(t.item(), 1.0 - 10 * lr, 1e-6);
      }
    EXPECT_TRUE(has_master);
  }
  Var p = Var::from_tensor(random_tensor({4}, DType::BF16, 3));
  AdamW opt({p});
  GradStore gs;
  gs.insert(p, random_tensor({4}, DType::BF16, 4));
  opt.step(gs);
  for (auto& [k, t] : opt.state_dict()) {
    if (k == "0.exp_avg" || k == "0.exp_avg_sq" || k == "0.master") {
      EXPECT_EQ(t.dtype(), DType::F32) << k;
    }
  }
}

TEST(NnOptim, SkipsParametersWithoutGradientAndHonoursGroups) {
  Var a = scalar_var(1.0), b = scalar_var(1.0), c = scalar_var(1.0);
  AdamW opt(std::vector<ParamGroup>{{{a, b}, std::nullopt}, {{c}, 0.0}},
            AdamWOptions(0.1).weight_decay(0.5));
  GradStore gs;
  gs.insert(a, Tensor::full({1}, 0.0, DType::F64));
  gs.insert(c, Tensor::full({1}, 0.0, DType::F64));
  opt.step(gs);
  EXPECT_NEAR(a.item(), 0.95, 1e-15);  // decay only (zero gradient): 1 - 0.1*0.5
  EXPECT_EQ(b.item(), 1.0);            // no gradient: untouched, no decay
  EXPECT_EQ(c.item(), 1.0);            // group without decay
  EXPECT_EQ(opt.parameters().size(), 3u);
  EXPECT_THROW(AdamW({a, a}), Error);
}

// Issue 15 item 3: an optimizer step between a forward and its backward. The backward is the
// recorded graph's: the gradient at the weights the forward used, the same as without the step.
TEST(NnOptim, StepBetweenForwardAndBackwardKeepsTheGraphsWeights) {
  for (Device dev : test_devices()) {
    SCOPED_TRACE(dev.to_string());
    const Tensor x = random_tensor({4, 3}, DType::F32, dev, 1);
    Var w = Var::from_tensor(random_tensor({3, 2}, DType::F32, dev, 2));
    const std::vector<double> w0 = values(w);
    const auto loss = [&] { return x.matmul(w).tanh().sum_all(); };
    const std::vector<double> want = values(*loss().backward().get(w));
    const Tensor l = loss();
    AdamW opt({w}, AdamWOptions(0.5));
    opt.step(grad_of(w, 1.0));
    ASSERT_NE(values(w), w0);  // the step changed the weights
    EXPECT_EQ(values(*l.backward().get(w)), want);
  }
}

// Parameters are updated in their own storage (a captured cuda::Graph reads them there), unless
// something else reads that storage: a graph recorded before the step, or a view.
TEST(NnOptim, UpdatesInPlaceUnlessSomethingElseReadsTheParameter) {
  for (Device dev : test_devices()) {
    for (DType dt : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(dev.to_string() + " " + std::string(dtype_name(dt)));
      const Tensor x = random_tensor({4, 3}, dt, dev, 1);
      Var w = Var::from_tensor(random_tensor({3, 2}, dt, dev, 2).to_dtype(dt) * 1.0);
      const auto loss = [&] { return x.matmul(w).tanh().sum_all(); };
      AdamW adam({w}, AdamWOptions(0.5));
      SGD sgd({w}, SGDOptions(0.25));
      for (Optimizer* opt : std::vector<Optimizer*>{&adam, &sgd}) {
        const void* at = w.data_ptr();
        const std::vector<double> before = values(w);
        opt->step(loss().backward());  // the graph is released: the storage is w's alone
        EXPECT_EQ(w.data_ptr(), at);
        EXPECT_NE(values(w), before);
        const Tensor pending = (w * w).sum_all();  // w * w's rule reads w: holds its storage
        const std::vector<double> seen = values(w);
        opt->step(grad_of(w, 1.0));
        EXPECT_NE(w.data_ptr(), at);  // a new value: the recorded graph keeps the old one
        EXPECT_NE(values(w), seen);
        const Tensor view = w.value().t();  // a view shares the storage
        const void* at2 = w.data_ptr();
        opt->step(grad_of(w, 1.0));
        EXPECT_NE(w.data_ptr(), at2);
        EXPECT_TRUE(view.defined() && pending.defined());
      }
      // x is frozen: x @ w's rule reads x (for dw), not w, so its graph holds no w.
      const Tensor frozen = loss();
      const void* at = w.data_ptr();
      adam.step(grad_of(w, 1.0));
      EXPECT_EQ(w.data_ptr(), at);
    }
  }
}

TEST(NnOptim, AccumulateThenStepEqualsSummedStep) {
  Var a = scalar_var(2.0), b = scalar_var(2.0);
  SGD oa({a}, SGDOptions(0.5)), ob({b}, SGDOptions(0.5));
  oa.accumulate(grad_of(a, 0.25));
  oa.accumulate(grad_of(a, 0.5));
  oa.step();
  ob.step(grad_of(b, 0.75));
  EXPECT_EQ(a.item(), b.item());
  EXPECT_EQ(a.item(), 2.0 - 0.375);
  oa.zero_grad();
  EXPECT_EQ(oa.accumulated().size(), 0u);
  oa.step();  // nothing accumulated: nothing moves
  EXPECT_EQ(a.item(), 2.0 - 0.375);
}

TEST(NnOptim, ClipGradNorm) {
  Var a = Var::from_tensor(Tensor::zeros({2}, DType::F32));
  Var b = Var::from_tensor(Tensor::zeros({1}, DType::F64));
  GradStore gs;
  gs.insert(a, Tensor::from_vector(std::vector<float>{3, 0}, {2}));
  gs.insert(b, Tensor::from_vector(std::vector<double>{4}, {1}));
  EXPECT_DOUBLE_EQ(clip_grad_norm({a, b}, gs, 10.0), 5.0);
  EXPECT_EQ(values(*gs.get(a))[0], 3.0);  // under the limit: unchanged
  EXPECT_DOUBLE_EQ(clip_grad_norm({a, b}, gs, 1.0), 5.0);
  const double coef = 1.0 / (5.0 + 1e-6);
  EXPECT_NEAR(values(*gs.get(a))[0], 3.0 * coef, 1e-7);
  EXPECT_NEAR(values(*gs.get(b))[0], 4.0 * coef, 1e-15);
  EXPECT_NEAR(clip_grad_norm({a, b}, gs, 1.0), 1.0, 1e-6);
}

TEST(NnOptim, Schedules) {
  WarmupCosineSchedule cos(1.0, 4, 14, 0.1);
  EXPECT_DOUBLE_EQ(cos.lr_at(0), 0.25);
  EXPECT_DOUBLE_EQ(cos.lr_at(3), 1.0);
  EXPECT_DOUBLE_EQ(cos.lr_at(4), 1.0);
  EXPECT_NEAR(cos.lr_at(9), 0.1 + 0.9 * 0.5, 1e-15);  // half-way: cos(pi/2) = 0
  EXPECT_DOUBLE_EQ(cos.lr_at(14), 0.1);
  EXPECT_DOUBLE_EQ(cos.lr_at(100), 0.1);
  WarmupLinearSchedule lin(2.0, 0, 10);
  EXPECT_DOUBLE_EQ(lin.lr_at(0), 2.0);
  EXPECT_DOUBLE_EQ(lin.lr_at(5), 1.0);
  EXPECT_DOUBLE_EQ(lin.lr_at(10), 0.0);
  Var p = scalar_var(0.0);
  SGD opt({p}, SGDOptions(9.0));
  EXPECT_DOUBLE_EQ(lin.apply(opt), 2.0);
  opt.step(grad_of(p, 1.0));
  EXPECT_DOUBLE_EQ(lin.apply(opt), 1.8);
  EXPECT_DOUBLE_EQ(opt.lr(), 1.8);
  EXPECT_THROW(WarmupLinearSchedule(1.0, 5, 2), Error);
}

TEST(NnOptim, StateDictRestoresExactly) {
  for (DType dt : {DType::F32, DType::BF16}) {
    const Tensor init = random_tensor({6}, dt, 7);
    Var a = Var::from_tensor(init);
    AdamW oa({a}, AdamWOptions(0.05));
    auto step = [&](Optimizer& o, Var& v, int s) {
      GradStore gs;
      gs.insert(v, random_tensor({6}, dt, 100 + s));
      o.step(gs);
    };
    for (int s = 0; s < 3; ++s) step(oa, a, s);
    const auto state = oa.state_dict();
    Var b = Var::from_tensor(a.value());
    AdamW ob({b}, AdamWOptions(0.05));
    ob.load_state_dict(state);
    EXPECT_EQ(ob.step_count(), 3);
    for (int s = 3; s < 6; ++s) {
      step(oa, a, s);
      step(ob, b, s);
    }
    EXPECT_EQ(values(a), values(b)) << dtype_name(dt);
    // A wrong shape or a missing key is an error naming the key.
    Var c = Var::from_tensor(random_tensor({5}, dt, 1));
    AdamW oc({c});
    EXPECT_THROW(oc.load_state_dict(state), Error);
    EXPECT_THROW(ob.load_state_dict({}), Error);
  }
}

}  // namespace
}  // namespace taper
