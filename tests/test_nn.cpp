// test_nn.cpp: the nn layer's modules and losses.
//
// What it is: each module against its functional form or a host f64 reference (Linear,
// Embedding, the norms against the composed ops, Dropout's mask statistics and determinism, the
// activations, MultiHeadAttention against a per-head f64 loop, TransformerEncoderLayer post-LN
// and pre-LN against the same maths assembled from functional ops); the gradient of every
// module's parameters by central differences in f64; the Module tree (dotted names, BERT's keys,
// dtype moves, train/eval); the losses against f64 references and by gradient check; and two
// small models trained on fixed synthetic tasks to a stated loss.
// What it is not: optimizers (test_optim.cpp) or checkpoints (test_safetensors.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "taper/composed.h"
#include "taper/nn.h"
#include "tests/test_util.h"

namespace taper {
namespace {

using namespace taper::nn;
namespace F = taper::nn::functional;
using testing::all_close;
using testing::contains;
using testing::error_of;
using testing::grad_check;
using testing::random_tensor;
using testing::test_devices;
using testing::values;

// ---- helpers ----------------------------------------------------------------------------------

/// Sets every parameter of `m` to fresh random values (so norms do not sit at weight 1, bias 0).
void randomize(Module& m, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  NoGradGuard ng;
  for (auto& [name, p] : m.named_parameters())
    p.set(random_tensor(p.shape(), p.dtype(), seed++, lo, hi));
}

/// Central differences (4-point stencil, as testing::grad_check) of sum(f() * r) with respect
/// to every parameter of `m`, in f64, against the gradient backward() gives.
::testing::AssertionResult module_grad_check(Module& m, const std::function<Tensor()>& f,
                                             double tol = 1e-6, double step = 1e-4) {
  m.to(DType::F64);
  Tensor probe;
  {
    NoGradGuard ng;
    probe = random_tensor(f().shape(), DType::F64, 4242, -1.0, 1.0);
  }
  auto scalar = [&] {
    NoGradGuard ng;
    return (f() * probe).sum_all().item();
  };
  GradStore gs = (f() * probe).sum_all().backward();
  for (auto& named : m.named_parameters()) {
    const auto& name = named.first;
    auto& p = named.second;  // not a structured binding: clang 14 cannot capture one
    const std::optional<Tensor> g = gs.get(p);
    if (!g) return ::testing::AssertionFailure() << "no gradient reached " << name;
    if (g->shape() != p.shape())
      return ::testing::AssertionFailure() << "gradient of " << name << " has shape "
                                           << g->shape().to_string();
    const std::vector<double> analytic = g->to_vector<double>();
    const std::vector<double> x = p.to_vector<double>();
    const Tensor original = p.value();
    for (size_t i = 0; i < x.size(); ++i) {
      const double h = step * std::max(1.0, std::abs(x[i]));
      auto at = [&](double delta) {
        std::vector<double> xv = x;
        xv[i] += delta;
        p.set(Tensor::from_vector(xv, p.shape()));
        return scalar();
      };
      const double num = (-at(2 * h) + 8 * at(h) - 8 * at(-h) + at(-2 * h)) / (12 * h);
      p.set(original);
      if (std::abs(num - analytic[i]) > tol * std::max(1.0, std::abs(num)))
        return ::testing::AssertionFailure() << name << "[" << i << "]: analytic " << analytic[i]
                                             << " numeric " << num;
    }
  }
  return ::testing::AssertionSuccess();
}

/// x W^T + b on the host. x: (n, in), w: (out, in).
std::vector<double> host_linear(const std::vector<double>& x, const std::vector<double>& w,
                                const std::vector<double>& b, size_t n, size_t in, size_t out) {
  std::vector<double> y(n * out);
  for (size_t r = 0; r < n; ++r)
    for (size_t o = 0; o < out; ++o) {
      double acc = b.empty() ? 0.0 : b[o];
      for (size_t k = 0; k < in; ++k) acc += x[r * in + k] * w[o * in + k];
      y[r * out + o] = acc;
    }
  return y;
}

constexpr double kF32Tol = 1e-5;

// ---- Module tree ------------------------------------------------------------------------------

TEST(NnModule, DottedNamesAndContainers) {
  manual_seed(1);
  Module root;
  auto lin = root.register_module("a.b.lin", std::make_shared<Linear>(3, 2));
  root.register_parameter("scale", Tensor::ones({2}, DType::F32));
  root.register_buffer("ids", Tensor::zeros({4}, DType::I64));
  root.register_buffer("scratch", Tensor::zeros({4}, DType::F32), /*persistent=*/false);
  std::vector<std::string> names;
  for (auto& [n, p] : root.named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"scale", "a.b.lin.weight", "a.b.lin.bias"}));
  EXPECT_EQ(root.child("a.b.lin").get(), lin.get());
  EXPECT_EQ(root.child("a.nope"), nullptr);
  EXPECT_EQ(root.parameter("a.b.lin.weight").id(), lin->weight.id());
  EXPECT_THROW(root.parameter("a.b.lin.nope"), Error);
  EXPECT_EQ(root.num_parameters(), 3u * 2 + 2 + 2);
  std::vector<std::string> sd;
  for (auto& [n, t] : root.state_dict()) sd.push_back(n);
  EXPECT_EQ(sd, (std::vector<std::string>{"scale", "a.b.lin.weight", "a.b.lin.bias", "ids"}));
  EXPECT_EQ(root.named_buffers().size(), 2u);
  std::vector<std::string> mods;
  for (auto& [n, m] : root.named_modules()) mods.push_back(n);
  EXPECT_EQ(mods, (std::vector<std::string>{"a", "a.b", "a.b.lin"}));
  // Names are unique per module, whatever the kind.
  EXPECT_THROW(root.register_parameter("ids", Tensor::ones({1}, DType::F32)), Error);
  EXPECT_THROW(root.register_module("a.b.lin", std::make_shared<ReLU>()), Error);
  EXPECT_THROW(root.register_parameter("", Tensor::ones({1}, DType::F32)), Error);
  EXPECT_THROW(root.register_parameter("x", Tensor::ones({1}, DType::I64)), Error);
  EXPECT_THROW(root.forward(Tensor::ones({1}, DType::F32)), Error);
}

TEST(NnModule, TrainEvalPropagates) {
  Sequential seq({std::make_shared<Linear>(2, 2), std::make_shared<Dropout>(0.5)});
  EXPECT_TRUE(seq[1]->is_training());
  seq.eval();
  EXPECT_FALSE(seq.is_training());
  EXPECT_FALSE(seq[1]->is_training());
  seq.train();
  EXPECT_TRUE(seq[1]->is_training());
}

TEST(NnModule, ToDtypeKeepsIdentityAndMembers) {
  manual_seed(2);
  Linear lin(4, 3);
  const uint64_t id = lin.weight.id();
  const std::vector<double> before = values(lin.weight);
  Var held = lin.parameters()[0];
  lin.to(DType::F64);
  EXPECT_EQ(lin.weight.dtype(), DType::F64);
  EXPECT_EQ(held.dtype(), DType::F64);  // every handle sees the move
  EXPECT_EQ(lin.weight.id(), id);
  EXPECT_EQ(values(lin.weight), before);  // f32 -> f64 is exact
  lin.to(DType::BF16);
  EXPECT_EQ(lin.bias.dtype(), DType::BF16);
  // To every test device and back: the same Vars (held handles follow) and the same values.
  const std::vector<double> bf = values(lin.weight);
  for (Device dev : test_devices()) {
    lin.to(dev);
    EXPECT_EQ(lin.weight.device(), dev);
    EXPECT_EQ(held.device(), dev);
    EXPECT_EQ(lin.weight.id(), id);
    lin.to(Device::cpu());
    EXPECT_EQ(held.device(), Device::cpu());
    EXPECT_EQ(values(lin.weight), bf);
  }
}

TEST(NnModule, SeedMakesInitDeterministic) {
  manual_seed(7);
  Linear a(5, 4);
  manual_seed(7);
  Linear b(5, 4);
  Linear c(5, 4);
  EXPECT_EQ(values(a.weight), values(b.weight));
  EXPECT_NE(values(a.weight), values(c.weight));
  // PyTorch's default bound 1/sqrt(in).
  for (double v : values(a.weight)) EXPECT_LE(std::abs(v), 1.0 / std::sqrt(5.0));
}

TEST(NnModule, TransformerLayerHasBertKeys) {
  TransformerEncoderLayer layer(TransformerEncoderLayerOptions(8, 2).dim_feedforward(16));
  std::vector<std::string> names;
  for (auto& [n, p] : layer.named_parameters()) names.push_back(n);
  const std::vector<std::string> bert = {
      "attention.self.query.weight",       "attention.self.query.bias",
      "attention.self.key.weight",         "attention.self.key.bias",
      "attention.self.value.weight",       "attention.self.value.bias",
      "attention.output.dense.weight",     "attention.output.dense.bias",
      "attention.output.LayerNorm.weight", "attention.output.LayerNorm.bias",
      "intermediate.dense.weight",         "intermediate.dense.bias",
      "output.dense.weight",               "output.dense.bias",
      "output.LayerNorm.weight",           "output.LayerNorm.bias"};
  EXPECT_EQ(names, bert);
  ModuleList list;
  list.push_back(std::make_shared<TransformerEncoderLayer>(TransformerEncoderLayerOptions(8, 2)));
  EXPECT_EQ(list.named_parameters()[0].first, "0.attention.self.query.weight");
  EXPECT_NE(list.at<TransformerEncoderLayer>(0), nullptr);
  EXPECT_THROW(list.at<Linear>(0), Error);
}

// ---- layers against their functional forms ----------------------------------------------------

TEST(NnLinear, MatchesHostReference) {
  manual_seed(3);
  for (bool bias : {true, false}) {
    Linear lin(LinearOptions(5, 3).bias(bias));
    EXPECT_EQ(lin.weight.dims(), (std::vector<size_t>{3, 5}));  // (out, in) as PyTorch
    EXPECT_EQ(lin.bias.defined(), bias);
    const Tensor x = random_tensor({2, 4, 5}, DType::F32, 11);
    const Tensor y = lin(x);
    EXPECT_EQ(y.dims(), (std::vector<size_t>{2, 4, 3}));
    const auto ref = host_linear(values(x), values(lin.weight),
                                 bias ? values(lin.bias) : std::vector<double>{}, 8, 5, 3);
    EXPECT_TRUE(all_close(values(y), ref, kF32Tol, kF32Tol));
    EXPECT_EQ(values(F::linear(x, lin.weight, lin.bias)), values(y));
  }
  // A 1-D input and a non-contiguous one.
  Linear lin(4, 2);
  const Tensor x = random_tensor({4}, DType::F32, 12);
  EXPECT_TRUE(all_close(values(lin(x)),
                        host_linear(values(x), values(lin.weight), values(lin.bias), 1, 4, 2),
                        kF32Tol, kF32Tol));
  const Tensor xt = random_tensor({4, 3}, DType::F32, 13).t();  // (3, 4) transposed view
  EXPECT_TRUE(all_close(values(lin(xt)),
                        host_linear(values(xt), values(lin.weight), values(lin.bias), 3, 4, 2),
                        kF32Tol, kF32Tol));
  EXPECT_THROW(lin(random_tensor({2, 5}, DType::F32, 1)), Error);
}

TEST(NnEmbedding, PicksRows) {
  manual_seed(4);
  Embedding emb(10, 3);
  const Tensor ids = Tensor::from_vector(std::vector<int64_t>{3, 0, 9, 3, 7, 1}, {2, 3});
  const Tensor y = emb(ids);
  EXPECT_EQ(y.dims(), (std::vector<size_t>{2, 3, 3}));
  const auto w = values(emb.weight), got = values(y);
  const int64_t idv[] = {3, 0, 9, 3, 7, 1};
  for (size_t i = 0; i < 6; ++i)
    for (size_t j = 0; j < 3; ++j) EXPECT_EQ(got[i * 3 + j], w[idv[i] * 3 + j]);
  const Tensor u = Tensor::from_vector(std::vector<uint32_t>{9, 0}, {2});
  EXPECT_EQ(values(emb(u))[0], w[27]);
  EXPECT_THROW(emb(Tensor::from_vector(std::vector<int64_t>{10}, {1})), Error);
  EXPECT_THROW(emb(random_tensor({2}, DType::F32, 1)), Error);
}

TEST(NnNorms, MatchComposedForms) {
  manual_seed(5);
  for (DType dt : {DType::F32, DType::F64}) {
    const double tol = dt == DType::F64 ? 1e-12 : 1e-5;
    LayerNorm ln(LayerNormOptions(6).eps(1e-12).dtype(dt));
    randomize(ln, 20);
    const Tensor x = random_tensor({3, 4, 6}, dt, 21);
    EXPECT_TRUE(all_close(values(ln(x)),
                          values(composed::layer_norm(x, ln.weight, ln.bias, 1e-12)), tol, tol));
    RmsNorm rn(RmsNormOptions(6).dtype(dt));
    randomize(rn, 22);
    EXPECT_TRUE(
        all_close(values(rn(x)), values(composed::rms_norm(x, rn.weight, 1e-6)), tol, tol));
    GroupNorm gn(GroupNormOptions(2, 4).dtype(dt));
    randomize(gn, 23);
    const Tensor xg = random_tensor({2, 4, 5}, dt, 24);
    EXPECT_TRUE(all_close(values(gn(xg)),
                          values(composed::group_norm(xg, 2, gn.weight, gn.bias, 1e-5)), tol, tol));
  }
  // Without affine parameters.
  LayerNorm plain(LayerNormOptions(4).elementwise_affine(false));
  EXPECT_TRUE(plain.named_parameters().empty());
  const Tensor x = random_tensor({2, 4}, DType::F32, 25);
  EXPECT_TRUE(all_close(values(plain(x)), values(composed::layer_norm(x, Tensor(), Tensor(), 1e-5)),
                        1e-5, 1e-5));
  LayerNorm nobias(LayerNormOptions(4).bias(false));
  EXPECT_EQ(nobias.named_parameters().size(), 1u);
  EXPECT_THROW(plain(random_tensor({2, 5}, DType::F32, 1)), Error);
  EXPECT_THROW(GroupNorm(GroupNormOptions(3, 4)), Error);
}

TEST(NnActivations, MatchHostFormulas) {
  const Tensor x = random_tensor({50}, DType::F64, 30, -4.0, 4.0);
  const auto xv = values(x);
  std::vector<double> erf_ref, tanh_ref, silu_ref, relu_ref, th_ref;
  for (double v : xv) {
    erf_ref.push_back(0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))));
    tanh_ref.push_back(
        0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v))));
    silu_ref.push_back(v / (1.0 + std::exp(-v)));
    relu_ref.push_back(v > 0 ? v : 0.0);
    th_ref.push_back(std::tanh(v));
  }
  const double tol = 1e-12;
  EXPECT_TRUE(all_close(values(GELU()(x)), erf_ref, tol, tol));
  EXPECT_TRUE(all_close(values(GELU(GeluApproximation::Tanh)(x)), tanh_ref, tol, tol));
  EXPECT_TRUE(all_close(values(SiLU()(x)), silu_ref, tol, tol));
  EXPECT_TRUE(all_close(values(ReLU()(x)), relu_ref, tol, tol));
  EXPECT_TRUE(all_close(values(Tanh()(x)), th_ref, tol, tol));
}

TEST(NnDropout, MaskStatisticsScaleAndDeterminism) {
  const size_t n = 20000;
  const Tensor x = random_tensor({n}, DType::F32, 40, 0.5, 1.5);  // never zero
  const auto xv = values(x);
  Dropout d(DropoutOptions(0.3).seed(99));
  const uint64_t first_seed = d.next_mask_seed();
  const auto y1 = values(d(x));
  size_t zeros = 0;
  for (size_t i = 0; i < n; ++i) {
    if (y1[i] == 0.0) {
      ++zeros;
    } else {
      EXPECT_NEAR(y1[i], xv[i] / 0.7, 1e-6) << i;
    }
  }
  // Binomial(n, 0.3): sd = sqrt(n * 0.21) ~ 65; allow 5 sd.
  EXPECT_NEAR(double(zeros), 0.3 * n, 5 * std::sqrt(n * 0.21));
  // A second call draws a new mask; the same seed and call count repeat it.
  const auto y2 = values(d(x));
  EXPECT_NE(y1, y2);
  Dropout again(DropoutOptions(0.3).seed(99));
  EXPECT_EQ(again.next_mask_seed(), first_seed);
  EXPECT_EQ(values(again(x)), y1);
  EXPECT_EQ(values(F::dropout(x, 0.3, first_seed)), y1);
  again.set_calls(1);
  EXPECT_EQ(values(again(x)), y2);
  // Eval mode and p = 0 are the identity; p = 1 zeroes.
  d.eval();
  EXPECT_EQ(values(d(x)), xv);
  EXPECT_EQ(values(Dropout(0.0)(x)), xv);
  for (double v : values(Dropout(1.0)(x))) EXPECT_EQ(v, 0.0);
  EXPECT_THROW(Dropout(1.5), Error);
  // Gradient: the kept elements' scale, zero elsewhere.
  Var xv_var = Var::from_tensor(x);
  Dropout g(DropoutOptions(0.5).seed(5));
  const Tensor y = g(xv_var);
  const auto grad = values(*y.sum_all().backward().get(xv_var));
  const auto yv = values(y);
  for (size_t i = 0; i < n; i += 97) EXPECT_EQ(grad[i], yv[i] == 0.0 ? 0.0 : 2.0);
}

// ---- attention --------------------------------------------------------------------------------

/// Multi-head attention on the host in f64. x*: (B, T|S, E) flattened; weights from the module;
/// mask: additive (B, S) per batch row or empty; causal as in functional::causal_mask.
std::vector<double> host_mha(MultiHeadAttention& m, const std::vector<double>& xq,
                             const std::vector<double>& xkv, size_t b, size_t t, size_t s,
                             const std::vector<double>& mask, bool causal) {
  const size_t e = m.options().embed_dim(), h = m.options().num_heads(), d = e / h;
  auto proj = [&](Linear& l, const std::vector<double>& x, size_t rows) {
    return host_linear(x, values(l.weight), values(l.bias), rows, e, e);
  };
  const auto q = proj(*m.query, xq, b * t), k = proj(*m.key, xkv, b * s),
             v = proj(*m.value, xkv, b * s);
  std::vector<double> ctx(b * t * e, 0.0);
  for (size_t bi = 0; bi < b; ++bi)
    for (size_t hi = 0; hi < h; ++hi)
      for (size_t ti = 0; ti < t; ++ti) {
        std::vector<double> sc(s);
        double mx = -std::numeric_limits<double>::infinity();
        for (size_t si = 0; si < s; ++si) {
          double acc = 0.0;
          for (size_t di = 0; di < d; ++di)
            acc += q[(bi * t + ti) * e + hi * d + di] * k[(bi * s + si) * e + hi * d + di];
          acc /= std::sqrt(double(d));
          if (!mask.empty()) acc += mask[bi * s + si];
          if (causal && si + t > ti + s) acc = -std::numeric_limits<double>::infinity();
          sc[si] = acc;
          mx = std::max(mx, acc);
        }
        double z = 0.0;
        for (double& c : sc) z += (c = std::exp(c - mx));
        for (size_t di = 0; di < d; ++di) {
          double acc = 0.0;
          for (size_t si = 0; si < s; ++si) acc += sc[si] / z * v[(bi * s + si) * e + hi * d + di];
          ctx[(bi * t + ti) * e + hi * d + di] = acc;
        }
      }
  return host_linear(ctx, values(m.out->weight), values(m.out->bias), b * t, e, e);
}

TEST(NnAttention, MatchesHostReference) {
  manual_seed(50);
  const size_t b = 2, t = 5, e = 8;
  MultiHeadAttention mha(MultiHeadAttentionOptions(e, 2));
  const Tensor x = random_tensor({b, t, e}, DType::F32, 51);
  const auto ref = host_mha(mha, values(x), values(x), b, t, t, {}, false);
  EXPECT_TRUE(all_close(values(mha(x)), ref, 1e-5, 1e-5));
  // A padding mask: batch 1 masks its last two keys.
  const Tensor am = Tensor::from_vector(std::vector<int64_t>{1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, {b, t});
  const Tensor mask = F::padding_mask(am, DType::F32);
  EXPECT_EQ(mask.dims(), (std::vector<size_t>{b, 1, 1, t}));
  const auto mv = values(mask);
  EXPECT_EQ(mv[0], 0.0);
  EXPECT_EQ(mv[9], -1e9f);
  const auto ref_mask = host_mha(mha, values(x), values(x), b, t, t, mv, false);
  EXPECT_TRUE(all_close(values(mha(x, mask)), ref_mask, 1e-5, 1e-5));
  // Cross-attention with a different key length.
  const Tensor kv = random_tensor({b, 3, e}, DType::F32, 52);
  EXPECT_TRUE(all_close(values(mha.forward(x, kv, kv)),
                        host_mha(mha, values(x), values(kv), b, t, 3, {}, false), 1e-5, 1e-5));
  EXPECT_THROW(mha(random_tensor({b, t, 6}, DType::F32, 1)), Error);
  EXPECT_THROW(MultiHeadAttention(MultiHeadAttentionOptions(8, 3)), Error);
}

TEST(NnAttention, CausalMatchesHostReference) {
  manual_seed(53);
  MultiHeadAttention mha(MultiHeadAttentionOptions(6, 3).causal(true).dtype(DType::F64));
  const Tensor x = random_tensor({1, 4, 6}, DType::F64, 54);
  EXPECT_TRUE(all_close(values(mha(x)), host_mha(mha, values(x), values(x), 1, 4, 4, {}, true),
                        1e-12, 1e-12));
  const auto cm = values(F::causal_mask(2, 3, DType::F32));
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(cm, (std::vector<double>{0, 0, -inf, 0, 0, 0}));
  // The first output position depends on the first input only.
  const Tensor x2 = Tensor::cat({x.narrow(1, 0, 1), random_tensor({1, 3, 6}, DType::F64, 55)}, 1);
  EXPECT_EQ(values(mha(x).narrow(1, 0, 1)), values(mha(x2).narrow(1, 0, 1)));
}

TEST(NnAttention, DropoutOnlyInTraining) {
  manual_seed(56);
  MultiHeadAttention mha(MultiHeadAttentionOptions(4, 2).dropout(0.5));
  const Tensor x = random_tensor({1, 6, 4}, DType::F32, 57);
  const auto a = values(mha(x)), b2 = values(mha(x));
  EXPECT_NE(a, b2);  // a fresh mask per call
  mha.eval();
  EXPECT_EQ(values(mha(x)), values(mha(x)));
}

/// q, k, v (2, 3, 64, 4) of `dt` tracking gradients and a padding mask that keeps every token.
struct AttnInputs {
  static constexpr size_t b = 2, h = 3, t = 64, d = 4;
  Var q, k, v;
  Tensor mask;
  explicit AttnInputs(DType dt)
      : q(Var::from_tensor(random_tensor({b, h, t, d}, dt, 70))),
        k(Var::from_tensor(random_tensor({b, h, t, d}, dt, 71))),
        v(Var::from_tensor(random_tensor({b, h, t, d}, dt, 72))),
        mask(F::padding_mask(Tensor::ones({b, t}, DType::U8), dt)) {}
};

// A recorded attention keeps no (B, H, T, S) tensor: the fused op (ops::attention, used when
// there is no dropout) keeps q, k, v, the mask (here (B, 1, 1, S)), its output and the row
// log-sum-exp (B, H, T); the backward recomputes the probabilities row by row. (The composed
// form kept two score-sized tensors: the masked scores and softmax's output.)
TEST(NnAttention, GraphKeepsNoScoreSizedTensor) {
  const Device cpu = Device::cpu();
  const AttnInputs in(DType::F32);
  const auto& [q, k, v, mask] = in;
  constexpr size_t b = AttnInputs::b, h = AttnInputs::h, t = AttnInputs::t, d = AttnInputs::d;
  const size_t scores = b * h * t * t * sizeof(float), small = b * h * t * d * sizeof(float);
  const size_t base = memory_stats(cpu).in_use;
  const Tensor o = F::scaled_dot_product_attention(q, k, v, mask);
  const size_t held = memory_stats(cpu).in_use - base;
  // The output and the row statistics (B, H, T): far below one score-sized tensor.
  EXPECT_GE(held, small);
  EXPECT_LT(held, 2 * small) << held << " bytes; scores would be " << scores;
  EXPECT_LT(held, scores / 4);
  GradStore g = o.sum_all().backward();
  EXPECT_TRUE(g.get(q) && g.get(k) && g.get(v));
}

// With dropout the composed path stays: its masked scores and softmax output are kept.
TEST(NnAttention, DropoutGraphKeepsTwoScoreSizedTensors) {
  const Device cpu = Device::cpu();
  const AttnInputs in(DType::F32);
  const auto& [q, k, v, mask] = in;
  constexpr size_t b = AttnInputs::b, h = AttnInputs::h, t = AttnInputs::t;
  const size_t scores = b * h * t * t * sizeof(float);
  const size_t base = memory_stats(cpu).in_use;
  const Tensor o = F::scaled_dot_product_attention(q, k, v, mask, false, 0.1, 5);
  const size_t held = memory_stats(cpu).in_use - base;
  EXPECT_GE(held, 2 * scores);
  GradStore g = o.sum_all().backward();
  EXPECT_TRUE(g.get(q) && g.get(k) && g.get(v));
}

// A device with no attention kernel (here: the CPU's forced off) takes the matmul + fused
// softmax path in the input dtype, not the op's f32 composed form: the same values as that path
// written out, and two score-sized tensors kept.
TEST(NnAttention, WithoutAnAttentionKernelTheMatmulSoftmaxPathRuns) {
  const Device cpu = Device::cpu();
  const AttnInputs in(DType::BF16);
  const auto& [q, k, v, mask] = in;
  constexpr size_t b = AttnInputs::b, h = AttnInputs::h, t = AttnInputs::t;
  const ComposedOnlyGuard only({OpId::attention});
  const size_t base = memory_stats(cpu).in_use;
  const Tensor o = F::scaled_dot_product_attention(q, k, v, mask);
  EXPECT_GE(memory_stats(cpu).in_use - base, 2 * b * h * t * t * sizeof(uint16_t));
  const Tensor w = ops::softmax_last_dim((q * 0.5).matmul(k.transpose(-2, -1)) + mask);
  EXPECT_EQ(values(o), values(w.matmul(v)));
}

/// The encoder layer assembled from functional ops and the layer's parameters.
Tensor encoder_reference(TransformerEncoderLayer& l, const Tensor& x, const Tensor& mask) {
  const auto& o = l.options();
  const size_t b = x.dim(0), t = x.dim(1), e = o.d_model(), h = o.nhead();
  MultiHeadAttention& a = *l.attention;
  auto attn = [&](const Tensor& y) {
    auto heads = [&](const Tensor& z) {
      return z.reshape({b, t, h, e / h}).permute({0, 2, 1, 3});
    };
    const Tensor ctx = F::scaled_dot_product_attention(
        heads(F::linear(y, a.query->weight, a.query->bias)),
        heads(F::linear(y, a.key->weight, a.key->bias)),
        heads(F::linear(y, a.value->weight, a.value->bias)), mask);
    return F::linear(ctx.permute({0, 2, 1, 3}).reshape({b, t, e}), a.out->weight, a.out->bias);
  };
  auto ln = [&](LayerNorm& n, const Tensor& y) {
    return ops::layer_norm(y, n.weight, n.bias, o.layer_norm_eps());
  };
  auto ffn = [&](const Tensor& y) {
    return F::linear(F::linear(y, l.intermediate->weight, l.intermediate->bias).gelu_erf(),
                     l.output->weight, l.output->bias);
  };
  if (o.norm_first()) {
    const Tensor y = x + attn(ln(*l.attention_norm, x));
    return y + ffn(ln(*l.output_norm, y));
  }
  const Tensor y = ln(*l.attention_norm, x + attn(x));
  return ln(*l.output_norm, y + ffn(y));
}

TEST(NnTransformer, PostAndPreLnMatchFunctionalForm) {
  for (bool pre : {false, true}) {
    manual_seed(60);
    TransformerEncoderLayer layer(
        TransformerEncoderLayerOptions(8, 2).dim_feedforward(12).norm_first(pre).layer_norm_eps(1e-12));
    randomize(layer, 61);
    layer.eval();
    const Tensor x = random_tensor({2, 3, 8}, DType::F32, 62);
    const Tensor am = Tensor::from_vector(std::vector<int64_t>{1, 1, 1, 1, 1, 0}, {2, 3});
    const Tensor mask = F::padding_mask(am, DType::F32);
    EXPECT_TRUE(all_close(values(layer(x, mask)), values(encoder_reference(layer, x, mask)), 1e-5,
                          1e-5))
        << (pre ? "pre-LN" : "post-LN");
    // Post-LN output rows are normalised (before the affine part): check with unit affine.
  }
}

TEST(NnTransformer, DropoutChangesTrainingOutputOnly) {
  manual_seed(63);
  TransformerEncoderLayer layer(TransformerEncoderLayerOptions(8, 2).dropout(0.2));
  const Tensor x = random_tensor({1, 4, 8}, DType::F32, 64);
  const auto a = values(layer(x));
  EXPECT_NE(a, values(layer(x)));
  layer.eval();
  EXPECT_EQ(values(layer(x)), values(layer(x)));
}

// ---- gradients of every module's parameters (f64 central differences) -------------------------

TEST(NnGrad, Linear) {
  manual_seed(70);
  Linear lin(3, 2);
  const Tensor x = random_tensor({4, 3}, DType::F64, 71);
  EXPECT_TRUE(module_grad_check(lin, [&] { return lin(x); }));
  // The input gradient through the functional form.
  EXPECT_TRUE(grad_check([](const std::vector<Tensor>& in) { return F::linear(in[0], in[1], in[2]); },
                         {random_tensor({2, 3, 3}, DType::F64, 72), random_tensor({2, 3}, DType::F64, 73),
                          random_tensor({2}, DType::F64, 74)}));
}

TEST(NnGrad, Embedding) {
  manual_seed(75);
  Embedding emb(5, 3);
  const Tensor ids = Tensor::from_vector(std::vector<int64_t>{4, 1, 4, 0}, {2, 2});  // fan-in on 4
  EXPECT_TRUE(module_grad_check(emb, [&] { return emb(ids); }));
}

TEST(NnGrad, Norms) {
  manual_seed(76);
  LayerNorm ln(4);
  const Tensor x = random_tensor({3, 4}, DType::F64, 77);
  EXPECT_TRUE(module_grad_check(ln, [&] { return ln(x); }));
  RmsNorm rn(4);
  EXPECT_TRUE(module_grad_check(rn, [&] { return rn(x); }));
  GroupNorm gn(GroupNormOptions(2, 4));
  const Tensor xg = random_tensor({2, 4, 3}, DType::F64, 78);
  EXPECT_TRUE(module_grad_check(gn, [&] { return gn(xg); }));
}

TEST(NnGrad, MultiHeadAttention) {
  manual_seed(79);
  MultiHeadAttention mha(MultiHeadAttentionOptions(4, 2));
  const Tensor x = random_tensor({1, 3, 4}, DType::F64, 80);
  const Tensor mask = F::padding_mask(Tensor::from_vector(std::vector<int64_t>{1, 1, 0}, {1, 3}),
                                      DType::F64);
  EXPECT_TRUE(module_grad_check(mha, [&] { return mha(x, mask); }));
  MultiHeadAttention causal(MultiHeadAttentionOptions(4, 2).causal(true));
  EXPECT_TRUE(module_grad_check(causal, [&] { return causal(x); }));
}

TEST(NnGrad, TransformerEncoderLayer) {
  for (bool pre : {false, true}) {
    manual_seed(81);
    TransformerEncoderLayer layer(
        TransformerEncoderLayerOptions(4, 2).dim_feedforward(6).norm_first(pre).dropout(0.0)
            .attention_dropout(0.0));
    randomize(layer, 82, -0.5, 0.5);
    const Tensor x = random_tensor({1, 3, 4}, DType::F64, 83);
    EXPECT_TRUE(module_grad_check(layer, [&] { return layer(x); }, 1e-6)) << (pre ? "pre" : "post");
  }
}

TEST(NnGrad, SequentialMlp) {
  manual_seed(84);
  Sequential mlp({std::make_shared<Linear>(3, 4), std::make_shared<GELU>(),
                  std::make_shared<Linear>(4, 4), std::make_shared<SiLU>(),
                  std::make_shared<Linear>(4, 2), std::make_shared<Tanh>()});
  const Tensor x = random_tensor({2, 3}, DType::F64, 85);
  EXPECT_TRUE(module_grad_check(mlp, [&] { return mlp(x); }));
}

// ---- losses -----------------------------------------------------------------------------------

/// Cross entropy per row on the host, with label smoothing; NaN-free rows only.
std::vector<double> host_ce(const std::vector<double>& logits, const std::vector<int64_t>& tgt,
                            size_t c, double smoothing) {
  std::vector<double> out;
  for (size_t r = 0; r < tgt.size(); ++r) {
    const double* l = &logits[r * c];
    double mx = *std::max_element(l, l + c), z = 0.0;
    for (size_t j = 0; j < c; ++j) z += std::exp(l[j] - mx);
    const double lse = mx + std::log(z);
    double mean_lp = 0.0;
    for (size_t j = 0; j < c; ++j) mean_lp += (l[j] - lse) / double(c);
    out.push_back((1 - smoothing) * (lse - l[tgt[r]]) - smoothing * mean_lp);
  }
  return out;
}

TEST(NnLoss, CrossEntropyMatchesHost) {
  const size_t n = 6, c = 5;
  const Tensor logits = random_tensor({2, 3, c}, DType::F64, 90, -3.0, 3.0);
  const std::vector<int64_t> tv = {0, 4, -100, 2, 1, 3};
  const Tensor tgt = Tensor::from_vector(tv, {2, 3});
  for (double s : {0.0, 0.1}) {
    std::vector<int64_t> safe = tv;
    safe[2] = 0;
    auto per = host_ce(values(logits), safe, c, s);
    per[2] = 0.0;
    const Tensor none =
        cross_entropy(logits, tgt, CrossEntropyOptions().label_smoothing(s).reduction(Reduction::None));
    EXPECT_EQ(none.dims(), (std::vector<size_t>{2, 3}));
    EXPECT_TRUE(all_close(values(none), per, 1e-12, 1e-12));
    const double sum = std::accumulate(per.begin(), per.end(), 0.0);
    EXPECT_NEAR(cross_entropy(logits, tgt, CrossEntropyOptions().label_smoothing(s).reduction(Reduction::Sum)).item(),
                sum, 1e-12);
    EXPECT_NEAR(cross_entropy(logits, tgt, CrossEntropyOptions().label_smoothing(s)).item(),
                sum / double(n - 1), 1e-12);  // the mean skips the ignored target
  }
  // u32 targets, a custom ignore index, f32 logits.
  const Tensor l32 = logits.to_dtype(DType::F32);
  const Tensor t32 = Tensor::from_vector(std::vector<uint32_t>{0, 4, 7, 2, 1, 3}, {2, 3});
  EXPECT_NEAR(cross_entropy(l32, t32, CrossEntropyOptions().ignore_index(7)).item(),
              cross_entropy(logits, tgt).item(), 1e-5);
  // Everything ignored: NaN, as PyTorch.
  const Tensor all_ignored = Tensor::full({2, 3}, -100, DType::I64);
  EXPECT_TRUE(std::isnan(cross_entropy(logits, all_ignored).item()));
  EXPECT_THROW(cross_entropy(logits, Tensor::full({2, 3}, 5, DType::I64)), Error);
  EXPECT_THROW(cross_entropy(logits, Tensor::full({3, 2}, 0, DType::I64)), Error);
  EXPECT_THROW(cross_entropy(logits, tgt, CrossEntropyOptions().label_smoothing(2.0)), Error);
}

TEST(NnLoss, CrossEntropyGradient) {
  const Tensor tgt = Tensor::from_vector(std::vector<int64_t>{2, -100, 0}, {3});
  for (double s : {0.0, 0.2})
    EXPECT_TRUE(grad_check(
        [&](const std::vector<Tensor>& in) {
          return cross_entropy(in[0], tgt, CrossEntropyOptions().label_smoothing(s));
        },
        {random_tensor({3, 4}, DType::F64, 91)}));
  // Mean reduction: d/dlogits = (softmax - onehot) / kept, zero on the ignored row.
  const Tensor logits = random_tensor({3, 4}, DType::F64, 92);
  Var lv = Var::from_tensor(logits);
  const auto g = values(*cross_entropy(lv, tgt).backward().get(lv));
  const auto sm = values(ops::softmax_last_dim(logits));
  for (size_t j = 0; j < 4; ++j) {
    EXPECT_NEAR(g[j], (sm[j] - (j == 2)) / 2, 1e-14);
    EXPECT_EQ(g[4 + j], 0.0);
  }
}

// Issue 15 item 8: a reduced loss is a rank-0 tensor, as PyTorch (cross_entropy and nll_loss
// returned shape (1), mse_loss ()); its backward starts from a () gradient.
TEST(NnLoss, ReducedLossesAreRankZero) {
  const Tensor logits = random_tensor({4, 3}, DType::F32, 96);
  const Tensor tgt = Tensor::from_vector(std::vector<int64_t>{2, 0, 1, -100}, {4});
  for (Reduction r : {Reduction::Mean, Reduction::Sum}) {
    EXPECT_EQ(cross_entropy(logits, tgt, CrossEntropyOptions().reduction(r)).rank(), 0u);
    EXPECT_EQ(cross_entropy(logits, tgt, CrossEntropyOptions().reduction(r).label_smoothing(0.1))
                  .rank(), 0u);
    EXPECT_EQ(nll_loss(logits, tgt, NllLossOptions().reduction(r)).rank(), 0u);
    EXPECT_EQ(mse_loss(logits, logits * 2.0, r).rank(), 0u);
  }
  EXPECT_EQ((logits.sum_all() / 3.0).rank(), 0u);
  EXPECT_EQ((3.0 / logits.sum_all()).rank(), 0u);
  Var v = Var::from_tensor(logits);
  const Tensor l = cross_entropy(v, tgt);
  EXPECT_EQ(l.backward(Tensor::ones({}, DType::F32)).get(v)->dims(), logits.dims());
}

// Targets on the logits' device: the same losses and gradients as CPU targets; on a GPU the
// host never reads them (no wait per step), and a bad target surfaces at the next
// synchronisation as gather's Error naming the index and the class count.
TEST(NnLoss, TargetsOnEveryDeviceGiveTheCpuLoss) {
  const Tensor logits = random_tensor({2, 3, 5}, DType::F32, 97, -3.0, 3.0);
  const Tensor t64 = Tensor::from_vector(std::vector<int64_t>{0, 4, -100, 2, 1, 3}, {2, 3});
  const Tensor t32 = Tensor::from_vector(std::vector<uint32_t>{0, 4, 7, 2, 1, 3}, {2, 3});
  const Tensor u32 = Tensor::from_vector(std::vector<uint32_t>{0, 4, 1, 2, 1, 3}, {2, 3});
  for (Device dev : test_devices()) {
    SCOPED_TRACE(dev.to_string());
    const Tensor ld = logits.to_device(dev);
    for (const auto& [tgt, ignore] : std::vector<std::pair<Tensor, int64_t>>{
             {t64, -100}, {t32, 7}, {u32, -100}}) {
      for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None})
        for (double smooth : {0.0, 0.1}) {
          const auto o = CrossEntropyOptions().ignore_index(ignore).reduction(r)
                             .label_smoothing(smooth);
          const Tensor want = cross_entropy(logits, tgt, o);
          Var lv = Var::from_tensor(ld);
          const Tensor got = cross_entropy(lv, tgt.to_device(dev), o);
          EXPECT_EQ(got.dims(), want.dims());
          EXPECT_TRUE(all_close(values(got), values(want), 1e-6, 1e-6));
          Var lc = Var::from_tensor(logits);
          const auto gw = values(*cross_entropy(lc, tgt, o).sum_all().backward().get(lc));
          EXPECT_TRUE(all_close(values(*got.sum_all().backward().get(lv)), gw, 1e-6, 1e-7));
        }
      const auto no = NllLossOptions().ignore_index(ignore);
      EXPECT_NEAR(nll_loss(ld, tgt.to_device(dev), no).item(), nll_loss(logits, tgt, no).item(),
                  1e-6);
    }
    const Tensor bad = Tensor::from_vector(std::vector<int64_t>{0, 5, 1, 2, 3, 4}, {2, 3});
    if (dev.is_cpu()) {
      const std::string e = error_of([&] { (void)cross_entropy(ld, bad); });
      EXPECT_TRUE(contains(e, "cross_entropy") && contains(e, "target 5")) << e;
    } else {
      Tensor l;
      EXPECT_NO_THROW(l = cross_entropy(ld, bad.to_device(dev)));  // nothing waited for
      const std::string e = error_of([&] { (void)l.item(); });
      EXPECT_TRUE(contains(e, "gather") && contains(e, "index 5") && contains(e, "size 5")) << e;
      EXPECT_NEAR(cross_entropy(ld, t64.to_device(dev)).item(), cross_entropy(logits, t64).item(),
                  1e-6);  // the error was reported once; the device goes on
    }
  }
}

TEST(NnLoss, NllAndMse) {
  const Tensor lp = ops::log_softmax_last_dim(random_tensor({4, 3}, DType::F64, 93));
  const Tensor tgt = Tensor::from_vector(std::vector<int64_t>{2, 0, 1, 1}, {4});
  const auto l = values(lp);
  const double want = -(l[2] + l[3] + l[7] + l[10]) / 4;
  EXPECT_NEAR(nll_loss(lp, tgt).item(), want, 1e-14);
  EXPECT_NEAR(nll_loss(lp, tgt, NllLossOptions().reduction(Reduction::Sum)).item(), want * 4, 1e-13);
  EXPECT_NEAR(nll_loss(lp, Tensor::from_vector(std::vector<int64_t>{2, 0, -100, -100}, {4})).item(),
              -(l[2] + l[3]) / 2, 1e-14);
  const Tensor a = random_tensor({3, 2}, DType::F64, 94), b = random_tensor({3, 2}, DType::F64, 95);
  const auto av = values(a), bv = values(b);
  double sq = 0.0;
  for (size_t i = 0; i < 6; ++i) sq += (av[i] - bv[i]) * (av[i] - bv[i]);
  EXPECT_NEAR(mse_loss(a, b).item(), sq / 6, 1e-14);
  EXPECT_NEAR(mse_loss(a, b, Reduction::Sum).item(), sq, 1e-14);
  EXPECT_EQ(mse_loss(a, b, Reduction::None).dims(), a.dims());
  EXPECT_TRUE(grad_check([](const std::vector<Tensor>& in) { return mse_loss(in[0], in[1]); },
                         {a, b}));
  EXPECT_THROW(mse_loss(a, random_tensor({2, 3}, DType::F64, 1)), Error);
}

// ---- training on fixed synthetic tasks --------------------------------------------------------

// XOR of the signs of two coordinates (not linearly separable), 128 points in [-1, 1]^2; a
// 2-32-2 GELU MLP with AdamW (lr 1e-2) must bring the mean cross entropy from ~0.7 below 0.1
// within 400 full-batch steps.
TEST(NnTrain, MlpLearnsXor) {
  manual_seed(100);
  const size_t n = 128;
  const Tensor x = Tensor::rand({n, 2}, DType::F32, Device::cpu(), 101, -1.0, 1.0);
  const auto xv = values(x);
  std::vector<int64_t> labels(n);
  for (size_t i = 0; i < n; ++i) labels[i] = (xv[2 * i] > 0) != (xv[2 * i + 1] > 0);
  const Tensor y = Tensor::from_vector(labels, {n});
  Sequential mlp({std::make_shared<Linear>(2, 32), std::make_shared<GELU>(),
                  std::make_shared<Linear>(32, 2)});
  AdamW opt(mlp.parameters(), AdamWOptions(1e-2).weight_decay(0.0));
  double loss = 0.0;
  int steps = 0;
  for (; steps < 400; ++steps) {
    const Tensor l = cross_entropy(mlp(x), y);
    loss = l.item();
    if (steps == 0) {
      EXPECT_GT(loss, 0.5);
    }
    if (loss < 0.1) break;
    opt.step(l.backward());
  }
  EXPECT_LT(loss, 0.1) << "after " << steps << " steps";
}

// Sequences of 6 tokens: a [CLS] token 0, then 5 tokens from 1..6, where class-1 sequences
// have a 7 at a random position. Only the [CLS] position's output feeds the linear head, so
// the evidence must travel through attention. Embedding + one post-LN encoder layer (E 16, 2
// heads) with AdamW and a warm-up/cosine schedule must bring the mean cross entropy from ~0.7
// below 0.1 within 300 steps.
TEST(NnTrain, TinyTransformerClassifier) {
  manual_seed(200);
  const size_t n = 64, t = 6, e = 16, vocab = 8;
  std::vector<int64_t> ids(n * t), labels(n);
  uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  for (size_t i = 0; i < n; ++i) {
    ids[i * t] = 0;
    for (size_t j = 1; j < t; ++j) ids[i * t + j] = static_cast<int64_t>(1 + next() % 6);
    labels[i] = static_cast<int64_t>(i % 2);
    if (labels[i]) ids[i * t + 1 + next() % (t - 1)] = 7;
  }
  const Tensor x = Tensor::from_vector(ids, {n, t});
  const Tensor y = Tensor::from_vector(labels, {n});
  Module model;
  auto emb = model.register_module("embeddings", std::make_shared<Embedding>(vocab, e));
  auto layer = model.register_module(
      "layer", std::make_shared<TransformerEncoderLayer>(
                   TransformerEncoderLayerOptions(e, 2).dim_feedforward(32).dropout(0.0).attention_dropout(0.0)));
  auto head = model.register_module("head", std::make_shared<Linear>(e, 2));
  AdamW opt(model.parameters(), AdamWOptions(1e-2).weight_decay(0.0));
  WarmupCosineSchedule sched(1e-2, 10, 300);
  double loss = 0.0;
  int steps = 0;
  for (; steps < 300; ++steps) {
    sched.apply(opt);
    const Tensor h = layer->forward((*emb)(x));
    const Tensor l = cross_entropy((*head)(h.narrow(1, 0, 1).reshape({n, e})), y);
    loss = l.item();
    if (steps == 0) {
      EXPECT_GT(loss, 0.5);
    }
    if (loss < 0.1) break;
    opt.step(l.backward());
  }
  EXPECT_LT(loss, 0.1) << "after " << steps << " steps";
}

}  // namespace
}  // namespace taper
