// test_attention.cpp: the fused attention op (ops::attention) and its backward op
// (attention_bwd): the CPU kernels against the scalar f64 reference of tests/ref/fused_ref.h
// and against the composed forms (metal_fallback/composed.cpp), forward and backward.
//
// What it is: every float dtype x (T, S) in {1, 7, 33, 130}^2 with D cycling through
// {1, 8, 32, 64} and the mask through none / (B, 1, 1, S) / (1, 1, T, S), on contiguous inputs
// and on head views made as MultiHeadAttention makes them (reshape + permute); the saved lse;
// rows whose scores are all -inf (NaN, as softmax); thread-count independence; argument errors.
// What it is not: the f64 central-difference gradient checks (test_grad.cpp), the zero-size
// cases (test_zero_size.cpp) or the memory of a recorded graph (test_nn.cpp).
//
// Tolerances: the reference runs in f64 on the same (rounded) inputs. bf16/f16 round each output
// once from f32: |got - ref| <= u_T |ref| (half an ulp) + atol, atol covering the f32 noise of
// sums over up to 130 terms; against the composed form, which rounds once too, 2 u_T |ref|
// (one ulp either way). f32: 5e-5 relative and absolute (scores up to ~30 enter exp; their f32
// error is amplified by |score|); f64: 1e-11. The backward reference reads the forward output
// the op stored (rounded, for the half types), as the kernels do for D = rowsum(dout * out).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "taper/composed.h"
#include "tests/ref/fused_ref.h"
#include "tests/test_util.h"

namespace taper {
namespace {

using testing::all_close;
using testing::ThreadsGuard;
using testing::unit_roundoff;
using testing::values;

TAPER_COVERS(Forward, OpId::attention, OpId::attention_bwd);

enum class MaskKind { None, Keys, Queries };  // none, (B, 1, 1, S), (1, 1, T, S)

struct Case {
  size_t B = 2, H = 3, T, S, D;
  MaskKind mask;
  bool head_views;
};

struct Tol {
  double rtol, atol;
};
Tol fwd_tol(DType dt) {
  if (dt == DType::F64) return {1e-11, 1e-11};
  if (dt == DType::F32) return {5e-5, 5e-5};
  return {unit_roundoff(dt), 1e-4};
}
Tol bwd_tol(DType dt) {
  if (dt == DType::F64) return {1e-10, 1e-10};
  if (dt == DType::F32) return {1e-4, 1e-4};
  return {unit_roundoff(dt), 5e-4};
}
Tol vs_composed(Tol t, DType dt) {
  if (dt == DType::BF16 || dt == DType::F16) t.rtol *= 2;
  return t;
}

/// q, k, v (B, H, *, D) and the mask, in dtype dt. Head views: (B, T, H * D) data seen as
/// (B, H, T, D) through reshape + permute (strides (T H D, D, H D, 1)).
struct Inputs {
  Tensor q, k, v, mask;
};
Tensor heads(const Tensor& base, size_t B, size_t H, size_t T, size_t D) {
  return base.reshape({B, T, H, D}).permute({0, 2, 1, 3});
}
Tensor make(const Case& c, size_t rows, DType dt, uint64_t seed) {
  if (!c.head_views)
    return testing::random_tensor({c.B, c.H, rows, c.D}, DType::F64, seed).to_dtype(dt);
  return heads(testing::random_tensor({c.B, rows, c.H * c.D}, DType::F64, seed).to_dtype(dt),
               c.B, c.H, rows, c.D);
}
Inputs make_inputs(const Case& c, DType dt, uint64_t seed) {
  Inputs in;
  in.q = make(c, c.T, dt, seed);
  in.k = make(c, c.S, dt, seed + 1);
  in.v = make(c, c.S, dt, seed + 2);
  if (c.mask == MaskKind::Keys)
    in.mask = testing::random_tensor({c.B, 1, 1, c.S}, DType::F64, seed + 3, -3.0, 1.0).to_dtype(dt);
  if (c.mask == MaskKind::Queries)
    in.mask = testing::random_tensor({1, 1, c.T, c.S}, DType::F64, seed + 3, -3.0, 1.0).to_dtype(dt);
  return in;
}
double scale_of(const Case& c) { return 1.0 / std::sqrt(static_cast<double>(c.D)); }
std::vector<double> full_mask(const Case& c, const Tensor& m) {
  if (!m.defined()) return {};
  return values(m.broadcast_as({c.B, c.H, c.T, c.S}));
}

std::vector<Case> cases() {
  const size_t ts[] = {1, 7, 33, 130};
  const size_t ds[] = {1, 8, 32, 64};
  const MaskKind ms[] = {MaskKind::None, MaskKind::Keys, MaskKind::Queries};
  std::vector<Case> r;
  for (size_t i = 0; i < 4; ++i)
    for (size_t j = 0; j < 4; ++j) {
      Case c;
      c.T = ts[i];
      c.S = ts[j];
      c.D = ds[(i + j) % 4];
      c.mask = ms[(i + 2 * j) % 3];
      c.head_views = (i + j) % 2 == 1;
      r.push_back(c);
    }
  return r;
}
std::string describe(const Case& c, DType dt) {
  return std::string(dtype_name(dt)) + " T=" + std::to_string(c.T) + " S=" + std::to_string(c.S) +
         " D=" + std::to_string(c.D) + " mask=" + std::to_string(static_cast<int>(c.mask)) +
         (c.head_views ? " head views" : " contiguous");
}

class FusedAttention : public ::testing::TestWithParam<DType> {};

TEST_P(FusedAttention, ForwardMatchesReferenceAndComposed) {
  const DType dt = GetParam();
  uint64_t seed = 300;
  for (const Case& c : cases()) {
    SCOPED_TRACE(describe(c, dt));
    const Inputs in = make_inputs(c, dt, seed += 10);
    const double sc = scale_of(c);
    const Tensor o = ops::attention(in.q, in.k, in.v, in.mask, sc);
    ASSERT_EQ(o.shape(), in.q.shape());
    ASSERT_EQ(o.dtype(), dt);
    const ref::AttentionFwd r = ref::attention_fwd(values(in.q), values(in.k), values(in.v),
                                                   full_mask(c, in.mask), c.B * c.H, c.T, c.S,
                                                   c.D, sc);
    const Tol t = fwd_tol(dt);
    EXPECT_TRUE(all_close(values(o), r.out, t.rtol, t.atol)) << "kernel vs reference";
    Tensor comp;
    {
      ComposedOnlyGuard g({OpId::attention});
      comp = ops::attention(in.q, in.k, in.v, in.mask, sc);
    }
    const Tol tc = vs_composed(t, dt);
    EXPECT_TRUE(all_close(values(o), values(comp), tc.rtol, tc.atol)) << "kernel vs composed";
    // The saved row log-sum-exp: (B, H, T) in the stat dtype.
    OpAttrs a;
    a.f0 = sc;
    const Tensor m = in.mask.defined() ? in.mask.broadcast_as({c.B, c.H, c.T, c.S}) : Tensor();
    const auto outs = op_def(OpId::attention).kernels[static_cast<int>(DeviceKind::Cpu)].fn(
        {in.q, in.k, in.v, m}, a);
    ASSERT_EQ(outs.size(), 2u);
    EXPECT_EQ(outs[1].shape(), Shape({c.B, c.H, c.T}));
    EXPECT_EQ(outs[1].dtype(), stat_dtype(dt));
    const double lt = dt == DType::F64 ? 1e-12 : 1e-5;
    EXPECT_TRUE(all_close(values(outs[1]), r.lse, lt, lt)) << "lse";
  }
}

TEST_P(FusedAttention, BackwardMatchesReferenceAndComposed) {
  const DType dt = GetParam();
  uint64_t seed = 700;
  for (const Case& c : cases()) {
    SCOPED_TRACE(describe(c, dt));
    const Inputs in = make_inputs(c, dt, seed += 10);
    const double sc = scale_of(c);
    const Tensor dout = make(c, c.T, dt, seed + 5);
    auto grads = [&](bool composed_path) {
      std::unique_ptr<ComposedOnlyGuard> g;
      if (composed_path) g = std::make_unique<ComposedOnlyGuard>(std::vector<OpId>{OpId::attention_bwd});
      const Var q = Var::from_tensor(in.q), k = Var::from_tensor(in.k), v = Var::from_tensor(in.v);
      const Tensor o = ops::attention(q, k, v, in.mask, sc);
      GradStore gs = o.backward(dout);
      return std::vector<Tensor>{o, *gs.get(q), *gs.get(k), *gs.get(v)};
    };
    const std::vector<Tensor> kg = grads(false), cg = grads(true);
    const ref::AttentionBwd r =
        ref::attention_bwd(values(in.q), values(in.k), values(in.v), full_mask(c, in.mask),
                           values(kg[0]), values(dout), c.B * c.H, c.T, c.S, c.D, sc);
    const Tol t = bwd_tol(dt), tc = vs_composed(t, dt);
    const std::vector<double>* refs[] = {&r.dq, &r.dk, &r.dv};
    const char* names[] = {"dq", "dk", "dv"};
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(kg[i + 1].dtype(), dt);
      EXPECT_TRUE(all_close(values(kg[i + 1]), *refs[i], t.rtol, t.atol))
          << names[i] << " kernel vs reference";
      EXPECT_TRUE(all_close(values(kg[i + 1]), values(cg[i + 1]), tc.rtol, tc.atol))
          << names[i] << " kernel vs composed attention_bwd";
    }
  }
}

// A query row whose scores are all -inf gives NaN, as softmax does, on both paths; its
// gradient is NaN too, and the other rows are untouched in the forward.
TEST_P(FusedAttention, AllMinusInfRowIsNaN) {
  const DType dt = GetParam();
  const Case c{1, 2, 5, 7, 8, MaskKind::Queries, false};
  const Inputs in0 = make_inputs(c, dt, 41);
  std::vector<double> mv = values(in0.mask);
  for (size_t s = 0; s < c.S; ++s) mv[2 * c.S + s] = -std::numeric_limits<double>::infinity();
  const Tensor mask = Tensor::from_vector(mv, Shape({1, 1, c.T, c.S})).to_dtype(dt);
  const double sc = 0.3;
  for (bool composed_path : {false, true}) {
    SCOPED_TRACE(composed_path ? "composed" : "kernel");
    std::unique_ptr<ComposedOnlyGuard> g;
    if (composed_path) g = std::make_unique<ComposedOnlyGuard>();
    const Var q = Var::from_tensor(in0.q);
    const Tensor o = ops::attention(q, in0.k, in0.v, mask, sc);
    const std::vector<double> ov = values(o);
    for (size_t h = 0; h < c.H; ++h)
      for (size_t t = 0; t < c.T; ++t)
        for (size_t d = 0; d < c.D; ++d)
          EXPECT_EQ(std::isnan(ov[(h * c.T + t) * c.D + d]), t == 2) << h << " " << t << " " << d;
    const std::vector<double> dq = values(*o.backward(Tensor::ones(o.shape(), dt)).get(q));
    for (size_t h = 0; h < c.H; ++h)
      for (size_t d = 0; d < c.D; ++d) EXPECT_TRUE(std::isnan(dq[(h * c.T + 2) * c.D + d]));
  }
}

// The work is split per head, each head's operations fixed: any thread count gives the same bits.
TEST_P(FusedAttention, AnyThreadCountSameBits) {
  const DType dt = GetParam();
  const Case c{3, 5, 33, 130, 32, MaskKind::Keys, true};
  const Inputs in = make_inputs(c, dt, 77);
  const Tensor dout = make(c, c.T, dt, 78);
  ThreadsGuard tg;
  std::vector<std::vector<double>> first;
  for (size_t n : {size_t{1}, size_t{3}, size_t{8}}) {
    set_num_threads(n);
    const Var q = Var::from_tensor(in.q), k = Var::from_tensor(in.k), v = Var::from_tensor(in.v);
    const Tensor o = ops::attention(q, k, v, in.mask, 0.2);
    GradStore g = o.backward(dout);
    const std::vector<std::vector<double>> now = {values(o), values(*g.get(q)), values(*g.get(k)),
                                                  values(*g.get(v))};
    if (first.empty()) first = now;
    for (size_t i = 0; i < now.size(); ++i)
      EXPECT_EQ(std::memcmp(now[i].data(), first[i].data(), now[i].size() * sizeof(double)), 0)
          << "output " << i << " at " << n << " threads";
  }
}

// out, dq, dk and dv are stored token major, (B, T, H, D), and returned as (B, H, T, D) views:
// merging the heads back into (B, T, H D), as MultiHeadAttention does, is a view, not a copy,
// and so is the gradient of head views made from (B, T, H D) projections.
TEST_P(FusedAttention, HeadsMergeBackWithoutACopy) {
  const DType dt = GetParam();
  const Case c{2, 3, 7, 9, 8, MaskKind::Keys, true};
  const Inputs in = make_inputs(c, dt, 91);
  const Var q = Var::from_tensor(in.q), k = Var::from_tensor(in.k), v = Var::from_tensor(in.v);
  const Tensor o = ops::attention(q, k, v, in.mask, 0.3);
  EXPECT_EQ(o.shape(), Shape({c.B, c.H, c.T, c.D}));
  EXPECT_TRUE(o.permute({0, 2, 1, 3}).is_contiguous());
  const Tensor merged = o.permute({0, 2, 1, 3}).reshape({c.B, c.T, c.H * c.D});
  EXPECT_EQ(merged.data_ptr(), o.data_ptr());
  GradStore g = o.backward(make(c, c.T, dt, 92));
  for (const Var* x : {&q, &k, &v}) EXPECT_TRUE(g.get(*x)->permute({0, 2, 1, 3}).is_contiguous());
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FusedAttention,
                         ::testing::Values(DType::BF16, DType::F16, DType::F32, DType::F64),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

TEST(FusedAttentionErrors, NameTheOpShapesAndDtypes) {
  const Tensor q = Tensor::zeros({2, 3, 4, 8}, DType::F32, Device::cpu());
  const Tensor k = Tensor::zeros({2, 3, 5, 8}, DType::F32, Device::cpu());
  auto err = [](auto f) { return testing::error_of(f); };
  std::string e = err([&] { ops::attention(q, k.narrow(3, 0, 4), k, Tensor(), 1.0); });
  EXPECT_TRUE(testing::contains(e, "attention") && testing::contains(e, "(2, 3, 5, 4)")) << e;
  e = err([&] { ops::attention(q, k, k.to_dtype(DType::F64), Tensor(), 1.0); });
  EXPECT_TRUE(testing::contains(e, "attention") && testing::contains(e, "f64")) << e;
  e = err([&] { ops::attention(q.reshape({6, 4, 8}), k, k, Tensor(), 1.0); });
  EXPECT_TRUE(testing::contains(e, "attention") && testing::contains(e, "(6, 4, 8)")) << e;
  e = err([&] {
    ops::attention(q, k, k, Tensor::zeros({2, 1, 4, 3}, DType::F32, Device::cpu()), 1.0);
  });
  EXPECT_TRUE(testing::contains(e, "mask") && testing::contains(e, "(2, 1, 4, 3)")) << e;
  e = err([&] {
    ops::attention(q, k, k, Tensor::zeros({5}, DType::F64, Device::cpu()), 1.0);
  });
  EXPECT_TRUE(testing::contains(e, "mask") && testing::contains(e, "f64")) << e;
  e = err([&] { ops::attention(q.to_dtype(DType::I64), k, k, Tensor(), 1.0); });
  EXPECT_TRUE(testing::contains(e, "attention") && testing::contains(e, "i64")) << e;
}

}  // namespace
}  // namespace taper
