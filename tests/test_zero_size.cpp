// test_zero_size.cpp: every registry op, forward and backward, on zero-size shapes (issue 15,
// item 2: the norm backwards died of SIGFPE on a last dim, N or C of 0).
//
// What it is: a table of cases, each a call through the public API on inputs with a zero dim
// (no rows, rows of nothing, empty middle dims, zero-length views of non-empty tensors, empty
// index lists), with the outcome it must have: a result of a given shape, or a taper::Error
// (a max over an empty dim has no value; on a GPU an index Error comes at the next
// synchronisation, as every bad index there). Float inputs are Vars in every float dtype, on every
// test device; where the result tracks gradients, the backward of its sum must give every input
// a finite gradient of its own shape. A crash fails the whole run. The table names the registry
// ops each case reaches, forward or backward, and ZeroSize.EveryOpHasACase fails for an op that
// none reaches, so a new op needs a zero-size case.
// What it is not: a test of values (the op suites check those; here only a few are pinned:
// sums over nothing are 0, a product over an empty inner dim is zeros).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "taper/nn.h"
#include "tests/test_util.h"

namespace taper::testing {
namespace {

using In = std::vector<Tensor>;
using Fn = std::function<Tensor(const In&, Device)>;

struct Case {
  std::string name;
  std::vector<OpId> ops;     ///< registry ops reached, forward or backward
  std::vector<Shape> in;     ///< float inputs, of the dtype under test
  Fn f;
  std::optional<Shape> out;  ///< the result's shape; nullopt: the call must throw taper::Error
  std::vector<double> values = {};  ///< when given, the result's values
  /// Inputs that may get no gradient: a norm's weight and bias of no elements read as "no
  /// affine" (ops.h: w (D) or empty), so nothing flows to them.
  std::vector<size_t> may_lack_grad = {};
};

Tensor idx(std::vector<int64_t> v, const Shape& s, Device dev) {
  return Tensor::from_vector(v, s, dev);
}

std::vector<Case> cases() {
  using O = OpId;
  std::vector<Case> c;
  const auto add = [&](Case k) { c.push_back(std::move(k)); };
  // ---- creation ----
  add({"zeros(0,3)", {O::fill}, {}, [](const In&, Device d) {
         return Tensor::zeros({0, 3}, DType::F32, d); }, Shape({0, 3})});
  add({"full(3,0)", {O::fill}, {}, [](const In&, Device d) {
         return Tensor::full({3, 0}, 2.0, DType::F32, d); }, Shape({3, 0})});
  add({"arange(2,2)", {O::arange}, {}, [](const In&, Device d) {
         return Tensor::arange(2, 2, 1, DType::F32, d); }, Shape({0})});
  add({"rand(0,4)", {O::rand_uniform}, {}, [](const In&, Device d) {
         return Tensor::rand({0, 4}, DType::F32, d, 1); }, Shape({0, 4})});
  add({"randn(2,0,3)", {O::rand_normal}, {}, [](const In&, Device d) {
         return Tensor::randn({2, 0, 3}, DType::F32, d, 1); }, Shape({2, 0, 3})});
  // ---- views, copies, casts, moves ----
  add({"reshape (0,3)->(3,0)", {O::reshape}, {Shape({0, 3})},
       [](const In& x, Device) { return x[0].reshape({3, 0}); }, Shape({3, 0})});
  add({"reshape (0,3)->(0)", {O::reshape}, {Shape({0, 3})},
       [](const In& x, Device) { return x[0].reshape({0}); }, Shape({0})});
  add({"reshape (0,3)->(2) is an Error", {O::reshape}, {Shape({0, 3})},
       [](const In& x, Device) { return x[0].reshape({2}); }, std::nullopt});
  add({"transpose (2,0,3)", {O::permute}, {Shape({2, 0, 3})},
       [](const In& x, Device) { return x[0].transpose(0, 2); }, Shape({3, 0, 2})});
  add({"narrow (3,4) to (3,0)", {O::narrow, O::narrow_bwd}, {Shape({3, 4})},
       [](const In& x, Device) { return x[0].narrow(1, 2, 0); }, Shape({3, 0})});
  add({"narrow (0,5) to (0,2)", {O::narrow, O::narrow_bwd}, {Shape({0, 5})},
       [](const In& x, Device) { return x[0].narrow(1, 1, 2); }, Shape({0, 2})});
  add({"broadcast (1,0)->(3,0)", {O::broadcast_as}, {Shape({1, 0})},
       [](const In& x, Device) { return x[0].broadcast_as({3, 0}); }, Shape({3, 0})});
  add({"broadcast (3)->(0,3)", {O::broadcast_as, O::sum}, {Shape({3})},
       [](const In& x, Device) { return x[0].broadcast_as({0, 3}); }, Shape({0, 3})});
  add({"contiguous of a transposed (3,0)", {O::copy}, {Shape({3, 0})},
       [](const In& x, Device) { return x[0].t().contiguous(); }, Shape({0, 3})});
  add({"to_dtype (0,3)", {O::to_dtype}, {Shape({0, 3})},
       [](const In& x, Device) { return x[0].to_dtype(DType::F64); }, Shape({0, 3})});
  add({"to_device and back (2,0)", {O::to_device}, {Shape({2, 0})},
       [](const In& x, Device d) {
         const Device other = d.is_cpu() && device_available(DeviceKind::Cuda) ? Device::cuda(0)
                                                                               : Device::cpu();
         return x[0].to_device(other).to_device(d);
       }, Shape({2, 0})});
  // ---- unary ----
  const std::vector<std::pair<O, std::function<Tensor(const Tensor&)>>> unary = {
      {O::neg, [](const Tensor& t) { return t.neg(); }},
      {O::abs, [](const Tensor& t) { return t.abs(); }},
      {O::exp, [](const Tensor& t) { return t.exp(); }},
      {O::log, [](const Tensor& t) { return t.log(); }},
      {O::sqrt, [](const Tensor& t) { return t.sqrt(); }},
      {O::rsqrt, [](const Tensor& t) { return t.rsqrt(); }},
      {O::recip, [](const Tensor& t) { return t.recip(); }},
      {O::sqr, [](const Tensor& t) { return t.sqr(); }},
      {O::tanh, [](const Tensor& t) { return t.tanh(); }},
      {O::sigmoid, [](const Tensor& t) { return t.sigmoid(); }},
      {O::relu, [](const Tensor& t) { return t.relu(); }},
      {O::gelu, [](const Tensor& t) { return t.gelu(); }},
      {O::gelu_erf, [](const Tensor& t) { return t.gelu_erf(); }},
      {O::silu, [](const Tensor& t) { return t.silu(); }},
      {O::sin, [](const Tensor& t) { return t.sin(); }},
      {O::cos, [](const Tensor& t) { return t.cos(); }},
      {O::powf, [](const Tensor& t) { return t.powf(1.5); }},
      {O::affine, [](const Tensor& t) { return t.affine(2.0, 1.0); }},
      {O::clamp, [](const Tensor& t) { return t.clamp(-1.0, 1.0); }},
  };
  for (const auto& [op, unary_fn] : unary) {
    const auto fn = unary_fn;  // a copy: clang 14 cannot capture a structured binding
    const std::string name(op_name(op));
    add({name + " (2,0,3)", {op}, {Shape({2, 0, 3})},
         [fn](const In& x, Device) { return fn(x[0]); }, Shape({2, 0, 3})});
    add({name + " of a zero-length narrow", {op},
         {Shape({3, 4})}, [fn](const In& x, Device) { return fn(x[0].narrow(1, 1, 0)); },
         Shape({3, 0})});
  }
  add({"gelu_erf backward (2,0,3)", {O::gelu_erf, O::gelu_erf_bwd}, {Shape({2, 0, 3})},
       [](const In& x, Device) { return x[0].gelu_erf(); }, Shape({2, 0, 3})});
  // ---- binary, ternary ----
  const std::vector<std::pair<O, std::function<Tensor(const Tensor&, const Tensor&)>>> binary = {
      {O::add, [](const Tensor& a, const Tensor& b) { return a.add(b); }},
      {O::sub, [](const Tensor& a, const Tensor& b) { return a.sub(b); }},
      {O::mul, [](const Tensor& a, const Tensor& b) { return a.mul(b); }},
      {O::div, [](const Tensor& a, const Tensor& b) { return a.div(b); }},
      {O::maximum, [](const Tensor& a, const Tensor& b) { return a.maximum(b); }},
      {O::minimum, [](const Tensor& a, const Tensor& b) { return a.minimum(b); }},
      {O::eq, [](const Tensor& a, const Tensor& b) { return a.eq(b); }},
      {O::ne, [](const Tensor& a, const Tensor& b) { return a.ne(b); }},
      {O::lt, [](const Tensor& a, const Tensor& b) { return a.lt(b); }},
      {O::le, [](const Tensor& a, const Tensor& b) { return a.le(b); }},
      {O::gt, [](const Tensor& a, const Tensor& b) { return a.gt(b); }},
      {O::ge, [](const Tensor& a, const Tensor& b) { return a.ge(b); }},
  };
  const std::vector<std::pair<Shape, Shape>> pairs = {
      {Shape({0, 3}), Shape({0, 3})}, {Shape({0, 3}), Shape({3})}, {Shape({3, 0}), Shape({1, 0})},
      {Shape({2, 0, 3}), Shape({0, 3})}, {Shape({0, 3}), Shape({})}};
  for (const auto& [op, binary_fn] : binary)
    for (const auto& [a, b] : pairs) {
      const auto fn = binary_fn;  // a copy: clang 14 cannot capture a structured binding
      const Shape out = a.rank() >= b.rank() ? a : b;
      add({std::string(op_name(op)) + " " + a.to_string() + " " + b.to_string(), {op, O::sum},
           {a, b}, [fn](const In& x, Device) { return fn(x[0], x[1]); }, out});
    }
  add({"(0,3) + (2,3) is an Error", {O::add}, {Shape({0, 3}), Shape({2, 3})},
       [](const In& x, Device) { return x[0] + x[1]; }, std::nullopt});
  add({"where_cond (0,3)", {O::where_cond, O::gt}, {Shape({0, 3}), Shape({3})},
       [](const In& x, Device) { return x[0].gt(x[1]).where_cond(x[0], x[1]); }, Shape({0, 3})});
  add({"mul_add (3,0)", {O::mul_add}, {Shape({3, 0}), Shape({3, 0}), Shape({1, 0})},
       [](const In& x, Device) { return x[0].mul_add(x[1], x[2]); }, Shape({3, 0})});
  // ---- reductions ----
  add({"sum (3,0) over dim 1", {O::sum}, {Shape({3, 0})},
       [](const In& x, Device) { return x[0].sum({1}); }, Shape({3}), {0, 0, 0}});
  add({"sum (3,0) over dim 0 keepdim", {O::sum}, {Shape({3, 0})},
       [](const In& x, Device) { return x[0].sum({0}, true); }, Shape({1, 0})});
  add({"sum_all (2,0,3)", {O::sum}, {Shape({2, 0, 3})},
       [](const In& x, Device) { return x[0].sum_all(); }, Shape({}), {0}});
  add({"mean (0,3) over dim 1", {O::sum}, {Shape({0, 3})},
       [](const In& x, Device) { return x[0].mean({1}); }, Shape({0})});
  for (O op : {O::max, O::min}) {
    const bool mx = op == O::max;
    add({std::string(op_name(op)) + " (0,3) over dim 1", {op}, {Shape({0, 3})},
         [mx](const In& x, Device) { return mx ? x[0].max({1}) : x[0].min({1}); }, Shape({0})});
    add({std::string(op_name(op)) + " (3,0) over the empty dim is an Error", {op},
         {Shape({3, 0})},
         [mx](const In& x, Device) { return mx ? x[0].max({1}) : x[0].min({1}); }, std::nullopt});
  }
  for (O op : {O::argmax, O::argmin}) {
    const bool mx = op == O::argmax;
    add({std::string(op_name(op)) + " (0,3) over dim 1", {op}, {Shape({0, 3})},
         [mx](const In& x, Device) { return mx ? x[0].argmax(1) : x[0].argmin(1); },
         Shape({0})});
    add({std::string(op_name(op)) + " (3,0) over the empty dim is an Error", {op},
         {Shape({3, 0})},
         [mx](const In& x, Device) { return mx ? x[0].argmax(1) : x[0].argmin(1); },
         std::nullopt});
  }
  // ---- matmul ----
  add({"matmul (0,3)(3,4)", {O::matmul}, {Shape({0, 3}), Shape({3, 4})},
       [](const In& x, Device) { return x[0].matmul(x[1]); }, Shape({0, 4})});
  add({"matmul (3,0)(0,2): zeros", {O::matmul}, {Shape({3, 0}), Shape({0, 2})},
       [](const In& x, Device) { return x[0].matmul(x[1]); }, Shape({3, 2}),
       std::vector<double>(6, 0.0)});
  add({"matmul (3,4)(4,0)", {O::matmul}, {Shape({3, 4}), Shape({4, 0})},
       [](const In& x, Device) { return x[0].matmul(x[1]); }, Shape({3, 0})});
  add({"matmul (0,2,3)(0,3,4)", {O::matmul}, {Shape({0, 2, 3}), Shape({0, 3, 4})},
       [](const In& x, Device) { return x[0].matmul(x[1]); }, Shape({0, 2, 4})});
  add({"matmul (2,3,0)(2,0,4) transposed", {O::matmul}, {Shape({2, 0, 3}), Shape({2, 0, 4})},
       [](const In& x, Device) { return x[0].transpose(1, 2).matmul(x[1]); }, Shape({2, 3, 4})});
  // ---- index ops, cat ----
  add({"index_select no indices", {O::index_select, O::scatter_add}, {Shape({3, 4})},
       [](const In& x, Device d) { return x[0].index_select(idx({}, Shape({0}), d), 0); },
       Shape({0, 4})});
  add({"index_select from (0,4)", {O::index_select}, {Shape({0, 4})},
       [](const In& x, Device d) { return x[0].index_select(idx({}, Shape({0}), d), 0); },
       Shape({0, 4})});
  add({"index_select rows of nothing", {O::index_select}, {Shape({3, 0})},
       [](const In& x, Device d) { return x[0].index_select(idx({2, 0}, Shape({2}), d), 0); },
       Shape({2, 0})});
  add({"index_select any index of an empty dim is an Error", {O::index_select}, {Shape({0, 4})},
       [](const In& x, Device d) { return x[0].index_select(idx({0}, Shape({1}), d), 0); },
       std::nullopt});
  add({"gather (3,0) index", {O::gather}, {Shape({3, 4})},
       [](const In& x, Device d) { return x[0].gather(idx({}, Shape({3, 0}), d), 1); },
       Shape({3, 0})});
  add({"gather from (0,4)", {O::gather}, {Shape({0, 4})},
       [](const In& x, Device d) { return x[0].gather(idx({}, Shape({0, 2}), d), 1); },
       Shape({0, 2})});
  add({"scatter_add of nothing", {O::scatter_add, O::gather}, {Shape({3, 4}), Shape({0, 4})},
       [](const In& x, Device d) { return x[0].scatter_add(idx({}, Shape({0, 4}), d), x[1], 0); },
       Shape({3, 4})});
  add({"cat (0,3) (2,3)", {O::cat, O::narrow}, {Shape({0, 3}), Shape({2, 3})},
       [](const In& x, Device) { return Tensor::cat({x[0], x[1]}, 0); }, Shape({2, 3})});
  add({"cat (3,0) (3,2) on dim 1", {O::cat}, {Shape({3, 0}), Shape({3, 2})},
       [](const In& x, Device) { return Tensor::cat({x[0], x[1]}, 1); }, Shape({3, 2})});
  add({"stack (0,3) (0,3)", {O::cat, O::reshape}, {Shape({0, 3}), Shape({0, 3})},
       [](const In& x, Device) { return Tensor::stack({x[0], x[1]}, 0); }, Shape({2, 0, 3})});
  // ---- fused ----
  for (const Shape& s : {Shape({0, 5}), Shape({3, 0}), Shape({2, 0, 4})}) {
    add({"softmax_last_dim " + s.to_string(), {O::softmax_last_dim, O::softmax_last_dim_bwd},
         {s}, [](const In& x, Device) { return ops::softmax_last_dim(x[0]); }, s});
    add({"log_softmax_last_dim " + s.to_string(),
         {O::log_softmax_last_dim, O::log_softmax_last_dim_bwd}, {s},
         [](const In& x, Device) { return ops::log_softmax_last_dim(x[0]); }, s});
    const Shape w({s[s.rank() - 1]});
    const std::vector<size_t> wb = w[0] ? std::vector<size_t>{} : std::vector<size_t>{1, 2};
    add({"rms_norm " + s.to_string(), {O::rms_norm, O::rms_norm_bwd}, {s, w},
         [](const In& x, Device) { return ops::rms_norm(x[0], x[1], 1e-5); }, s, {}, wb});
    add({"layer_norm " + s.to_string(), {O::layer_norm, O::layer_norm_bwd}, {s, w, w},
         [](const In& x, Device) { return ops::layer_norm(x[0], x[1], x[2], 1e-5); }, s, {}, wb});
    add({"layer_norm without affine " + s.to_string(), {O::layer_norm, O::layer_norm_bwd}, {s},
         [](const In& x, Device) { return ops::layer_norm(x[0], Tensor(), Tensor(), 1e-5); }, s});
  }
  for (const auto& sg : std::vector<std::pair<Shape, size_t>>{
           {Shape({0, 4, 3}), 2}, {Shape({2, 0, 3}), 1}, {Shape({2, 4, 0}), 2},
           {Shape({2, 4, 0, 5}), 4}}) {
    const Shape& s = sg.first;
    const size_t g = sg.second;
    const Shape w({s[1]});
    add({"group_norm " + s.to_string() + " groups " + std::to_string(g),
         {O::group_norm, O::group_norm_bwd}, {s, w, w},
         [g](const In& x, Device) { return ops::group_norm(x[0], g, x[1], x[2], 1e-5); }, s, {},
         s[1] ? std::vector<size_t>{} : std::vector<size_t>{1, 2}});
  }
  add({"group_norm C = 0 in 2 groups of none, no affine", {O::group_norm, O::group_norm_bwd},
       {Shape({2, 0, 3})},
       [](const In& x, Device) { return ops::group_norm(x[0], 2, Tensor(), Tensor(), 1e-5); },
       Shape({2, 0, 3})});
  // ---- linear: x (R, in), w (out, in), b (out), each of R, in, out zero in turn ----
  for (const auto& [r, i, o] : std::vector<std::array<size_t, 3>>{{0, 3, 4}, {2, 0, 4}, {2, 3, 0}}) {
    const Shape xs({r, i}), ws({o, i}), bs({o});
    // A bias of no elements reads as none (ops.h), so it may get no gradient.
    add({"linear x " + xs.to_string() + " w " + ws.to_string(), {O::linear}, {xs, ws, bs},
         [](const In& x, Device) { return ops::linear(x[0], x[1], x[2]); }, Shape({r, o}), {},
         o ? std::vector<size_t>{} : std::vector<size_t>{2}});
  }
  // ---- attention: q (B, H, T, D), k, v (B, H, S, D), each of B, T, S, D zero in turn ----
  for (const auto& [b, t, sl, d] : std::vector<std::array<size_t, 4>>{
           {0, 3, 4, 5}, {2, 0, 4, 5}, {2, 3, 0, 5}, {2, 3, 4, 0}}) {
    const Shape q({b, 2, t, d}), kv({b, 2, sl, d});
    // No keys: every output row is an empty sum, 0 (as the composed product is).
    std::vector<double> vals;
    if (sl == 0) vals.assign(q.elem_count(), 0.0);
    add({"attention q " + q.to_string() + " k, v " + kv.to_string(),
         {O::attention, O::attention_bwd}, {q, kv, kv},
         [](const In& x, Device) { return ops::attention(x[0], x[1], x[2], Tensor(), 0.5); }, q,
         vals});
  }
  add({"attention with no queries and a (B, 1, 1, S) mask", {O::attention, O::attention_bwd},
       {Shape({2, 2, 0, 5}), Shape({2, 2, 4, 5}), Shape({2, 2, 4, 5}), Shape({2, 1, 1, 4})},
       [](const In& x, Device) { return ops::attention(x[0], x[1], x[2], x[3], 0.5); },
       Shape({2, 2, 0, 5})});
  // ---- optimizer ----
  add({"AdamW step on (0,3) and (3,0) parameters", {O::adamw_step},
       {Shape({0, 3}), Shape({3, 0})},
       [](const In& x, Device) {
         std::vector<Var> ps;
         GradStore gs;
         for (const Tensor& t : x) {
           ps.push_back(Var::from_tensor(t.detach()));
           gs.insert(ps.back(), Tensor::zeros(t.shape(), t.dtype(), t.device()));
         }
         nn::AdamW opt(ps, nn::AdamWOptions(0.1));
         opt.step(gs);
         return ps[0].value();
       }, Shape({0, 3})});
  return c;
}

TEST(ZeroSize, EveryOpHasACase) {
  std::vector<bool> seen(kNumOps, false);
  for (const Case& k : cases())
    for (OpId op : k.ops) seen[static_cast<size_t>(op)] = true;
  for (size_t i = 0; i < kNumOps; ++i)
    EXPECT_TRUE(seen[i]) << "op " << op_name(static_cast<OpId>(i)) << " has no zero-size case";
}

// Each device runs every case twice: with its kernels, and with every fused op forced to its
// composed form (what a device without the fused kernel runs).
TEST(ZeroSize, ForwardAndBackwardOnEveryDeviceAndFloatDtype) {
  size_t ran = 0;
  for (Device dev : test_devices())
    for (bool composed : {false, true})
      for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::F64})
        for (const Case& k : cases()) {
          if (k.in.empty() && dt != DType::F32) continue;  // creation cases: one dtype of their own
          SCOPED_TRACE(k.name + " " + std::string(dtype_name(dt)) + " on " + dev.to_string() +
                       (composed ? " (composed forms)" : ""));
          std::optional<ComposedOnlyGuard> only;
          if (composed) only.emplace();
          std::vector<Tensor> in;
          uint64_t seed = 1;
          for (const Shape& s : k.in)
            in.push_back(Var::from_tensor(random_tensor(s, dt, dev, seed++, 0.5, 2.0)));
          Tensor y;
          std::string err;
          try {
            y = k.f(in, dev);
            // A device that checks indices in its kernels raises at the next synchronisation.
            if (!k.out) synchronize(dev);
          } catch (const Error& e) {
            err = e.what();
          }
          ++ran;
          if (!k.out) {
            EXPECT_FALSE(err.empty()) << "expected a taper::Error, got a result";
            continue;
          }
          ASSERT_TRUE(err.empty()) << err;
          EXPECT_EQ(y.dims(), k.out->dims());
          if (!k.values.empty()) {
            EXPECT_EQ(values(y), k.values);
          }
          if (!is_float(y.dtype()) || !y.tracks_grad()) continue;
          GradStore g;
          try {
            g = y.sum_all().backward();
          } catch (const Error& e) {
            ADD_FAILURE() << "backward: " << e.what();
            continue;
          }
          for (size_t i = 0; i < in.size(); ++i) {
            const std::optional<Tensor> gi = g.get(in[i]);
            if (!gi && std::count(k.may_lack_grad.begin(), k.may_lack_grad.end(), i)) continue;
            ASSERT_TRUE(gi.has_value()) << "input " << i << " got no gradient";
            EXPECT_EQ(gi->dims(), in[i].dims()) << "input " << i;
            for (double v : values(*gi))
              ASSERT_TRUE(std::isfinite(v)) << "input " << i << ": " << v;
          }
        }
  EXPECT_GT(ran, 300u);
}

}  // namespace
}  // namespace taper::testing
