// test_grad.cpp: a central-difference gradient check in f64 for every differentiable op, driven
// by one table (the coverage test requires every differentiable registry entry to be in it),
// which the CUDA suite (test_cuda.cpp) runs again on the GPU.
#include <gtest/gtest.h>

#include <cmath>

#include "taper/composed.h"
#include "tests/test_util.h"

namespace taper::testing {
namespace {

Tensor r(const Shape& s, uint64_t seed, double lo = -2.0, double hi = 2.0) {
  return random_tensor(s, DType::F64, seed, lo, hi);
}
Tensor idx(std::vector<int64_t> v, const Shape& s) { return Tensor::from_vector(v, s); }
/// A tensor a case captures, on the device of its input x (the CUDA suite runs the table too).
Tensor on(const Tensor& t, const Tensor& x) { return t.to_device(x.device()); }

std::vector<GradCase> make_cases() {
  std::vector<GradCase> c;
  auto un = [&](std::string n, OpId op, auto fn, Tensor x, double tol = 1e-6) {
    c.push_back({n, op, [fn](const std::vector<Tensor>& v) { return fn(v[0]); }, {x}, tol});
  };
  auto bin = [&](std::string n, OpId op, auto fn, Tensor a, Tensor b) {
    c.push_back({n, op, [fn](const std::vector<Tensor>& v) { return fn(v[0], v[1]); }, {a, b}});
  };
  const Shape s({3, 5});
  un("reshape", OpId::reshape, [](const Tensor& x) { return x.reshape({5, 3}); }, r(s, 1));
  un("permute", OpId::permute, [](const Tensor& x) { return x.permute({2, 0, 1}); }, r({2, 3, 4}, 2));
  un("narrow", OpId::narrow, [](const Tensor& x) { return x.narrow(1, 1, 3); }, r(s, 3));
  un("broadcast_as", OpId::broadcast_as, [](const Tensor& x) { return x.broadcast_as({2, 3, 5}); },
     r({3, 1}, 4));
  un("copy", OpId::copy, [](const Tensor& x) { return x.t().contiguous(); }, r(s, 5));
  un("to_dtype", OpId::to_dtype,
     [](const Tensor& x) { return x.to_dtype(DType::F32).to_dtype(DType::F64); }, r(s, 6), 1e-2);
  un("neg", OpId::neg, [](const Tensor& x) { return x.neg(); }, r(s, 7));
  un("abs", OpId::abs, [](const Tensor& x) { return x.abs(); }, away_from_zero(s, 8));
  un("exp", OpId::exp, [](const Tensor& x) { return x.exp(); }, r(s, 9));
  un("log", OpId::log, [](const Tensor& x) { return x.log(); }, r(s, 10, 0.3, 3.0));
  un("sqrt", OpId::sqrt, [](const Tensor& x) { return x.sqrt(); }, r(s, 11, 0.3, 3.0));
  un("rsqrt", OpId::rsqrt, [](const Tensor& x) { return x.rsqrt(); }, r(s, 12, 0.3, 3.0));
  un("recip", OpId::recip, [](const Tensor& x) { return x.recip(); }, away_from_zero(s, 13));
  un("sqr", OpId::sqr, [](const Tensor& x) { return x.sqr(); }, r(s, 14));
  un("tanh", OpId::tanh, [](const Tensor& x) { return x.tanh(); }, r(s, 15));
  un("sigmoid", OpId::sigmoid, [](const Tensor& x) { return x.sigmoid(); }, r(s, 16));
  un("relu", OpId::relu, [](const Tensor& x) { return x.relu(); }, away_from_zero(s, 17));
  un("gelu", OpId::gelu, [](const Tensor& x) { return x.gelu(); }, r(s, 18, -4, 4));
  un("gelu_erf", OpId::gelu_erf, [](const Tensor& x) { return x.gelu_erf(); }, r(s, 19, -4, 4));
  un("silu", OpId::silu, [](const Tensor& x) { return x.silu(); }, r(s, 20, -4, 4));
  un("sin", OpId::sin, [](const Tensor& x) { return x.sin(); }, r(s, 21, -4, 4));
  un("cos", OpId::cos, [](const Tensor& x) { return x.cos(); }, r(s, 22, -4, 4));
  un("powf", OpId::powf, [](const Tensor& x) { return x.powf(2.5); }, r(s, 23, 0.3, 3.0));
  un("affine", OpId::affine, [](const Tensor& x) { return x.affine(-1.5, 0.25); }, r(s, 24));
  un("clamp", OpId::clamp, [](const Tensor& x) { return x.clamp(-0.9, 1.1); }, r(s, 25));
  bin("add", OpId::add, [](const Tensor& a, const Tensor& b) { return a + b; }, r(s, 26), r({5}, 27));
  bin("sub", OpId::sub, [](const Tensor& a, const Tensor& b) { return a - b; }, r(s, 28), r({3, 1}, 29));
  bin("mul", OpId::mul, [](const Tensor& a, const Tensor& b) { return a * b; }, r(s, 30), r(s, 31));
  bin("div", OpId::div, [](const Tensor& a, const Tensor& b) { return a / b; }, r(s, 32),
      away_from_zero(s, 33));
  bin("maximum", OpId::maximum, [](const Tensor& a, const Tensor& b) { return a.maximum(b); },
      r(s, 34), r(s, 35));
  bin("minimum", OpId::minimum, [](const Tensor& a, const Tensor& b) { return a.minimum(b); },
      r(s, 36), r(s, 37));
  {
    Tensor mask = r(s, 38).gt(Tensor::zeros(Shape({1}), DType::F64));
    bin("where_cond", OpId::where_cond,
        [mask](const Tensor& a, const Tensor& b) { return on(mask, a).where_cond(a, b); }, r(s, 39),
        r({5}, 40));
  }
  // A scalar operand (an op attribute) gets no gradient; the tensor operand gets the right one.
  un("div_scalar", OpId::div, [](const Tensor& x) { return x / 1.7; }, r(s, 76));
  un("scalar_div", OpId::div, [](const Tensor& x) { return 1.7 / x; }, away_from_zero(s, 77));
  un("maximum_scalar", OpId::maximum, [](const Tensor& x) { return x.maximum(0.3); }, r(s, 78));
  un("minimum_scalar", OpId::minimum, [](const Tensor& x) { return x.minimum(0.3); }, r(s, 79));
  {
    Tensor mask = r(s, 80).gt(0.0);
    un("where_cond_scalar_false", OpId::where_cond,
       [mask](const Tensor& x) { return on(mask, x).where_cond(x, -0.5); }, r(s, 81));
    un("where_cond_scalar_true", OpId::where_cond,
       [mask](const Tensor& x) { return on(mask, x).where_cond(0.5, x); }, r(s, 82));
  }
  c.push_back({"mul_add", OpId::mul_add,
               [](const std::vector<Tensor>& v) { return v[0].mul_add(v[1], v[2]); },
               {r(s, 73), r({3, 1}, 74), r({5}, 75)}});
  un("sum", OpId::sum, [](const Tensor& x) { return x.sum({0, 2}, true); }, r({2, 3, 4}, 41));
  un("max", OpId::max, [](const Tensor& x) { return x.max({1}); }, r({4, 6}, 42));
  un("min", OpId::min, [](const Tensor& x) { return x.min({0}); }, r({4, 6}, 43));
  bin("matmul", OpId::matmul, [](const Tensor& a, const Tensor& b) { return a.matmul(b); },
      r({2, 3, 4}, 44), r({4, 5}, 45));
  bin("matmul_t", OpId::matmul, [](const Tensor& a, const Tensor& b) { return a.matmul(b.t()); },
      r({3, 4}, 46), r({5, 4}, 47));
  {
    Tensor i = idx({2, 0, 2, 1}, {4});
    un("index_select", OpId::index_select,
       [i](const Tensor& x) { return x.index_select(on(i, x), 0); }, r({3, 5}, 48));
    Tensor gi = idx({0, 2, 1, 1, 0, 2}, {3, 2});
    un("gather", OpId::gather, [gi](const Tensor& x) { return x.gather(on(gi, x), 1); },
       r({3, 3}, 49));
    bin("scatter_add", OpId::scatter_add,
        [gi](const Tensor& x, const Tensor& src) { return x.scatter_add(on(gi, x), src, 1); },
        r({3, 3}, 50), r({3, 2}, 51));
  }
  bin("cat", OpId::cat, [](const Tensor& a, const Tensor& b) { return Tensor::cat({a, b}, 1); },
      r({3, 2}, 52), r({3, 4}, 53));
  un("narrow_bwd", OpId::narrow_bwd,
     [](const Tensor& g) {
       OpAttrs a;
       a.i0 = 1;
       a.ints = {2, 7};
       return dispatch1(OpId::narrow_bwd, {g}, a);
     },
     r({3, 4}, 54));
  un("softmax_last_dim", OpId::softmax_last_dim,
     [](const Tensor& x) { return ops::softmax_last_dim(x); }, r({3, 7}, 55));
  un("log_softmax_last_dim", OpId::log_softmax_last_dim,
     [](const Tensor& x) { return ops::log_softmax_last_dim(x); }, r({3, 7}, 56));
  c.push_back({"rms_norm", OpId::rms_norm,
               [](const std::vector<Tensor>& v) { return ops::rms_norm(v[0], v[1], 1e-5); },
               {r({4, 6}, 57), r({6}, 58)}});
  c.push_back({"layer_norm", OpId::layer_norm,
               [](const std::vector<Tensor>& v) {
                 return ops::layer_norm(v[0], v[1], v[2], 1e-5);
               },
               {r({4, 6}, 59), r({6}, 60), r({6}, 61)}});
  c.push_back({"group_norm", OpId::group_norm,
               [](const std::vector<Tensor>& v) {
                 return ops::group_norm(v[0], 2, v[1], v[2], 1e-5);
               },
               {r({2, 4, 3}, 62), r({4}, 63), r({4}, 64)}});
  c.push_back({"rms_norm_composed", OpId::rms_norm,
               [](const std::vector<Tensor>& v) { return composed::rms_norm(v[0], v[1], 1e-5); },
               {r({4, 6}, 65), r({6}, 66)}});
  c.push_back({"layer_norm_composed", OpId::layer_norm,
               [](const std::vector<Tensor>& v) {
                 return composed::layer_norm(v[0], v[1], v[2], 1e-5);
               },
               {r({4, 6}, 67), r({6}, 68), r({6}, 69)}});
  c.push_back({"group_norm_composed", OpId::group_norm,
               [](const std::vector<Tensor>& v) {
                 return composed::group_norm(v[0], 2, v[1], v[2], 1e-5);
               },
               {r({2, 4, 3}, 70), r({4}, 71), r({4}, 72)}});
  c.push_back({"linear", OpId::linear,
               [](const std::vector<Tensor>& v) { return ops::linear(v[0], v[1], v[2]); },
               {r({2, 3, 4}, 94), r({5, 4}, 95), r({5}, 96)}});
  c.push_back({"linear_composed", OpId::linear,
               [](const std::vector<Tensor>& v) { return composed::linear(v[0], v[1], v[2]); },
               {r({3, 4}, 97), r({5, 4}, 98), r({5}, 99)}});
  // Attention: q (B, H, T, D), k, v (B, H, S, D); the mask (B, 1, 1, S) tracks gradients too
  // (summed over its broadcast dims); head views as MultiHeadAttention makes them.
  c.push_back({"attention", OpId::attention,
               [](const std::vector<Tensor>& v) {
                 return ops::attention(v[0], v[1], v[2], v[3], 0.6);
               },
               {r({2, 2, 3, 4}, 83), r({2, 2, 5, 4}, 84), r({2, 2, 5, 4}, 85),
                r({2, 1, 1, 5}, 86, -1.0, 1.0)}});
  c.push_back({"attention_no_mask_head_views", OpId::attention,
               [](const std::vector<Tensor>& v) {
                 auto heads = [](const Tensor& z, size_t t) {
                   return z.reshape({2, t, 2, 3}).permute({0, 2, 1, 3});
                 };
                 return ops::attention(heads(v[0], 4), heads(v[1], 3), heads(v[2], 3), Tensor(),
                                       0.5);
               },
               {r({2, 4, 6}, 87), r({2, 3, 6}, 88), r({2, 3, 6}, 89)}});
  c.push_back({"attention_composed", OpId::attention,
               [](const std::vector<Tensor>& v) {
                 return composed::attention(v[0], v[1], v[2], v[3], 0.6);
               },
               {r({1, 2, 3, 4}, 90), r({1, 2, 5, 4}, 91), r({1, 2, 5, 4}, 92),
                r({3, 5}, 93, -1.0, 1.0)}});
  return c;
}


class GradCheck : public ::testing::TestWithParam<size_t> {};

TEST_P(GradCheck, CentralDifferenceF64) {
  const GradCase& gc = grad_cases()[GetParam()];
  EXPECT_TRUE(grad_check(gc.f, gc.inputs, gc.tol)) << gc.name;
}

INSTANTIATE_TEST_SUITE_P(Ops, GradCheck, ::testing::Range<size_t>(0, grad_cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& i) {
                           return grad_cases()[i.param].name;
                         });

const bool kNoted = [] {
  for (const GradCase& gc : grad_cases()) note_cases(CaseKind::Gradient, {gc.op});
  return true;
}();

}  // namespace

const std::vector<GradCase>& grad_cases() {
  static const std::vector<GradCase> c = make_cases();
  return c;
}

}  // namespace taper::testing
