// backward.cpp: every backward formula, in one place, next to its op's name.
//
// Each rule gets the op's inputs, its forward outputs (saved tensors included) and the output
// gradients, and returns one gradient per input, built from tensor ops so it runs on any device.
// Beside each rule, SAVES says which of those values it reads (bits of SavedValues, autograd.h):
// a recorded node keeps only these alive, and of the rest only shapes, dtypes, devices and edges.
// A rule that reads a value its SAVES leaves out fails at once (dispatch refuses value-free
// tensors), so the two cannot drift apart silently.
// Gradients of broadcast inputs are summed by broadcast_as's own rule (the front-end broadcasts
// explicitly). The norm rules read the saved mean/rstd (f32 for half types and f32, f64 for
// f64), compute in that dtype, and cast each gradient to its input's dtype once.
#include <cmath>
#include <numbers>

#include "taper/autograd.h"
#include "taper/op.h"

namespace taper {
namespace {

using Tensors = std::vector<Tensor>;
#define BWD(name) \
  Tensors bwd_##name(const Tensors& in, const Tensors& out, const Tensors& g, const OpAttrs& a)
#define SAVES(name) SavedValues saves_##name([[maybe_unused]] const Tensors& in)

Tensor mask_as(const Tensor& m, DType dt) { return m.to_dtype(dt); }
/// Whether input i gets a gradient (a Var or a graph result): a rule computes no other, so a
/// frozen weight costs no product or reduction.
bool needs(const Tensors& in, size_t i) { return in[i].defined() && in[i].tracks_grad(); }

// SAVES helpers: input bits, output bits.
constexpr uint32_t kIn0 = 1u, kIn1 = 2u, kIn2 = 4u;
constexpr uint32_t kOut0 = 1u, kOut1 = 2u, kOut2 = 4u;
constexpr SavedValues reads(uint32_t inputs, uint32_t outputs = 0) { return {inputs, outputs}; }
constexpr SavedValues kNothing{};
/// A product's operands: each is read only for the other's gradient.
SavedValues reads_crosswise(const Tensors& in) {
  return reads((needs(in, 1) ? kIn0 : 0u) | (needs(in, 0) ? kIn1 : 0u));
}
/// op(x, in[k]) where in[k] may be the binary op's scalar operand (undefined: attrs.f0).
Tensor with_operand(OpId op, const Tensor& x, const Tensors& in, size_t k, const OpAttrs& a) {
  return dispatch1(op, {x, in[k]}, a);
}

// ---- views and copies ----
// Views and copies read only shapes, dtypes and devices.
SAVES(reshape) { return kNothing; }
BWD(reshape) { return {g[0].reshape(in[0].shape())}; }
SAVES(permute) { return kNothing; }
BWD(permute) {
  std::vector<size_t> inv(a.ints.size());
  for (size_t i = 0; i < a.ints.size(); ++i) inv[static_cast<size_t>(a.ints[i])] = i;
  return {g[0].permute(inv)};
}
SAVES(narrow) { return kNothing; }
BWD(narrow) {
  OpAttrs b;
  b.i0 = a.i0;
  b.ints = a.ints;  // {start, full_len}
  return {dispatch1(OpId::narrow_bwd, {g[0]}, b)};
}
SAVES(narrow_bwd) { return kNothing; }
BWD(narrow_bwd) {
  return {g[0].narrow(a.i0, static_cast<size_t>(a.ints[0]), in[0].shape()[a.i0])};
}
SAVES(broadcast_as) { return kNothing; }
BWD(broadcast_as) {
  const Shape& s = in[0].shape();
  const Shape& t = g[0].shape();
  const size_t lead = t.rank() - s.rank();
  std::vector<int64_t> dims;
  for (size_t i = 0; i < t.rank(); ++i)
    if (i < lead || (s[i - lead] == 1 && t[i] != 1)) dims.push_back(static_cast<int64_t>(i));
  if (dims.empty()) return {g[0].reshape(s)};
  return {g[0].sum(dims, true).reshape(s)};
}
SAVES(to_device) { return kNothing; }
BWD(to_device) { return {g[0].to_device(in[0].device())}; }
SAVES(copy) { return kNothing; }
BWD(copy) { return {g[0]}; }
SAVES(to_dtype) { return kNothing; }
BWD(to_dtype) { return {g[0].to_dtype(in[0].dtype())}; }

// ---- unary ----
SAVES(neg) { return kNothing; }
BWD(neg) { return {g[0].neg()}; }
SAVES(abs) { return reads(kIn0); }
BWD(abs) {
  const Tensor& x = in[0];
  const Tensor sign = mask_as(x.gt(0.0), x.dtype()) - mask_as(x.lt(0.0), x.dtype());
  return {g[0] * sign};
}
// The rules written with the output read only it: the input is not kept for them.
SAVES(exp) { return reads(0, kOut0); }
BWD(exp) { return {g[0] * out[0]}; }
SAVES(log) { return reads(kIn0); }
BWD(log) { return {g[0] / in[0]}; }
SAVES(sqrt) { return reads(0, kOut0); }
BWD(sqrt) { return {g[0] / out[0] * 0.5}; }
SAVES(rsqrt) { return reads(0, kOut0); }
BWD(rsqrt) { return {g[0] * out[0] * out[0] * out[0] * -0.5}; }
SAVES(recip) { return reads(0, kOut0); }
BWD(recip) { return {-(g[0] * out[0] * out[0])}; }
SAVES(sqr) { return reads(kIn0); }
BWD(sqr) { return {g[0] * in[0] * 2.0}; }
SAVES(tanh) { return reads(0, kOut0); }
BWD(tanh) { return {g[0] * (1.0 - out[0] * out[0])}; }
SAVES(sigmoid) { return reads(0, kOut0); }
BWD(sigmoid) { return {g[0] * out[0] * (1.0 - out[0])}; }
SAVES(relu) { return reads(kIn0); }
BWD(relu) { return {g[0] * mask_as(in[0].gt(0.0), in[0].dtype())}; }
SAVES(gelu) { return reads(kIn0); }
BWD(gelu) {
  // y = 0.5 x (1 + tanh(u)), u = c (x + 0.044715 x^3)
  const Tensor& x = in[0];
  const double c = std::sqrt(2.0 / std::numbers::pi);
  const Tensor x2 = x * x;
  const Tensor t = ((x + x2 * x * 0.044715) * c).tanh();
  const Tensor du = (x2 * (3.0 * 0.044715) + 1.0) * c;
  const Tensor d = (t + 1.0) * 0.5 + x * 0.5 * (1.0 - t * t) * du;
  return {g[0] * d};
}
// One pass (gelu_erf_bwd: Phi(x) + x phi(x) in f64, rounded once) instead of a dozen ops over the
// activation; its composed form (metal_fallback/) is the old formula.
SAVES(gelu_erf) { return reads(kIn0); }
BWD(gelu_erf) { return {dispatch1(OpId::gelu_erf_bwd, {in[0], g[0]})}; }
SAVES(silu) { return reads(kIn0); }
BWD(silu) {
  const Tensor s = in[0].sigmoid();
  return {g[0] * s * (1.0 + in[0] * (1.0 - s))};
}
SAVES(sin) { return reads(kIn0); }
BWD(sin) { return {g[0] * in[0].cos()}; }
SAVES(cos) { return reads(kIn0); }
BWD(cos) { return {-(g[0] * in[0].sin())}; }
SAVES(powf) { return reads(kIn0); }
BWD(powf) { return {g[0] * in[0].powf(a.f0 - 1.0) * a.f0}; }
SAVES(affine) { return kNothing; }
BWD(affine) { return {g[0] * a.f0}; }
SAVES(clamp) { return reads(kIn0); }
BWD(clamp) {
  const Tensor& x = in[0];
  const Tensor inside = x.ge(a.f0).mul(x.le(a.f1));
  return {g[0] * mask_as(inside, x.dtype())};
}

// ---- binary ----
// One operand of a binary op may be its scalar attribute (an undefined input, attrs.f0): it gets
// no gradient, and the rules read it through with_operand.
SAVES(add) { return kNothing; }
BWD(add) { return {needs(in, 0) ? g[0] : Tensor(), needs(in, 1) ? g[0] : Tensor()}; }
SAVES(sub) { return kNothing; }
BWD(sub) { return {needs(in, 0) ? g[0] : Tensor(), needs(in, 1) ? g[0].neg() : Tensor()}; }
SAVES(mul) { return reads_crosswise(in); }
BWD(mul) {
  return {needs(in, 0) ? with_operand(OpId::mul, g[0], in, 1, a) : Tensor(),
          needs(in, 1) ? with_operand(OpId::mul, g[0], in, 0, a) : Tensor()};
}
SAVES(div) {
  return reads(needs(in, 0) || needs(in, 1) ? kIn1 : 0u, needs(in, 1) ? kOut0 : 0u);
}
BWD(div) {
  return {needs(in, 0) ? with_operand(OpId::div, g[0], in, 1, a) : Tensor(),
          needs(in, 1) ? -(g[0] * out[0] / in[1]) : Tensor()};
}
// Ties: the gradient goes to the first operand. `ge_first` is the comparison in[0] >= in[1]
// (maximum) or in[0] <= in[1] (minimum); with a scalar first operand s it is x <= s or x >= s.
Tensors select_bwd(OpId ge_first, OpId flipped, const Tensors& in, const Tensors& g,
                   const OpAttrs& a) {
  const Tensor m = in[0].defined() ? dispatch1(ge_first, {in[0], in[1]}, a)
                                   : dispatch1(flipped, {in[1], Tensor()}, a);
  return {needs(in, 0) ? m.where_cond(g[0], 0.0) : Tensor(),
          needs(in, 1) ? m.where_cond(0.0, g[0]) : Tensor()};
}
SAVES(maximum) { return reads(kIn0 | kIn1); }
BWD(maximum) { return select_bwd(OpId::ge, OpId::le, in, g, a); }
SAVES(minimum) { return reads(kIn0 | kIn1); }
BWD(minimum) { return select_bwd(OpId::le, OpId::ge, in, g, a); }
SAVES(mul_add) { return reads_crosswise(in); }
BWD(mul_add) {
  return {needs(in, 0) ? g[0] * in[1] : Tensor(), needs(in, 1) ? g[0] * in[0] : Tensor(),
          needs(in, 2) ? g[0] : Tensor()};
}
SAVES(where_cond) { return reads(kIn0); }
BWD(where_cond) {
  return {Tensor(), needs(in, 1) ? in[0].where_cond(g[0], 0.0) : Tensor(),
          needs(in, 2) ? in[0].where_cond(0.0, g[0]) : Tensor()};
}

// ---- reductions ----
Tensor expand_reduced(const Tensor& gy, const Tensor& x, const OpAttrs& a) {
  std::vector<size_t> kd = x.dims();
  for (int64_t d : a.ints) kd[static_cast<size_t>(d)] = 1;
  return gy.reshape(Shape(kd)).broadcast_as(x.shape());
}
SAVES(sum) { return kNothing; }
BWD(sum) { return {expand_reduced(g[0], in[0], a)}; }
Tensors minmax_bwd(const Tensors& in, const Tensors& out, const Tensors& g, const OpAttrs& a) {
  // Ties share the gradient equally, so the gradient sums to the output gradient.
  const Tensor& x = in[0];
  const Tensor hit = mask_as(x.eq(expand_reduced(out[0], x, a)), x.dtype());
  const Tensor count = hit.sum(a.ints, true);
  return {hit * expand_reduced(g[0], x, a) / count.broadcast_as(x.shape())};
}
SAVES(max) { return reads(kIn0, kOut0); }
BWD(max) { return minmax_bwd(in, out, g, a); }
SAVES(min) { return reads(kIn0, kOut0); }
BWD(min) { return minmax_bwd(in, out, g, a); }

// ---- matmul ----
SAVES(matmul) { return reads_crosswise(in); }
BWD(matmul) {
  return {needs(in, 0) ? g[0].matmul(in[1].t()) : Tensor(),
          needs(in, 1) ? in[0].t().matmul(g[0]) : Tensor()};
}

// ---- indexing ----
// The index rules read the indices; of the source, only its shape and device.
SAVES(index_select) { return reads(kIn1); }
BWD(index_select) {
  const Tensor& x = in[0];
  const size_t d = static_cast<size_t>(a.i0);
  std::vector<size_t> ishape(x.rank(), 1);
  ishape[d] = in[1].elem_count();
  const Tensor idx = in[1].reshape(Shape(ishape)).broadcast_as(g[0].shape());
  return {Tensor::zeros(x.shape(), g[0].dtype(), x.device()).scatter_add(idx, g[0], a.i0),
          Tensor()};
}
SAVES(gather) { return reads(kIn1); }
BWD(gather) {
  return {Tensor::zeros(in[0].shape(), g[0].dtype(), in[0].device()).scatter_add(in[1], g[0], a.i0),
          Tensor()};
}
SAVES(scatter_add) { return reads(kIn1); }
BWD(scatter_add) {
  return {needs(in, 0) ? g[0] : Tensor(), Tensor(),
          needs(in, 2) ? g[0].gather(in[1], a.i0) : Tensor()};
}
SAVES(cat) { return kNothing; }
BWD(cat) {
  Tensors out_g;
  size_t start = 0;
  for (const Tensor& t : in) {
    const size_t len = t.shape()[static_cast<size_t>(a.i0)];
    out_g.push_back(g[0].narrow(a.i0, start, len));
    start += len;
  }
  return out_g;
}

// ---- fused ----
// The softmax rules pass x and the saved row stats (out[1]: (..., 2) = (max m, log sum exp(x - m)),
// f32 for half types and f32, f64 for f64), not the output y: the bwd kernels recompute
// y = exp((x - m) - l) in the compute type, so a bf16/f16 y's own rounding never enters dx (the
// cancellation in dy - sum would magnify it), nor does the rounding of a large log-sum-exp.
// The node keeps x and the stats, not y.
SAVES(softmax_last_dim) { return reads(kIn0, kOut1); }
BWD(softmax_last_dim) {
  return {dispatch1(OpId::softmax_last_dim_bwd, {in[0], out[1], g[0]})};
}
SAVES(log_softmax_last_dim) { return reads(kIn0, kOut1); }
BWD(log_softmax_last_dim) {
  return {dispatch1(OpId::log_softmax_last_dim_bwd, {in[0], out[1], g[0]})};
}


// The norm rules call the dedicated backward ops (kernels where a device has them, else the
// composed formulas of metal_fallback/composed.cpp): in = {x, w or empty, [mean,] rstd, dy},
// out = {dx, dw, db}. attrs.ints = {need dw, need db}: a frozen weight or bias skips its
// reduction; attrs.dtype is the bias's dtype (db is rounded once to it).
OpAttrs norm_bwd_attrs(const OpAttrs& a, const Tensor& w, const Tensor& b, const Tensor& x) {
  OpAttrs r = a;
  r.ints = {present(w) && w.tracks_grad() ? 1 : 0, present(b) && b.tracks_grad() ? 1 : 0};
  r.dtype = present(b) ? b.dtype() : x.dtype();
  return r;
}
// The norms read x, the weight and the saved statistics; of the bias, only whether it is there.
SAVES(rms_norm) { return reads(kIn0 | kIn1, kOut1); }
BWD(rms_norm) {
  const Tensors r = dispatch(OpId::rms_norm_bwd, {in[0], in[1], out[1], g[0]},
                             norm_bwd_attrs(a, in[1], Tensor(), in[0]));
  return {r[0], r[1]};
}
SAVES(layer_norm) { return reads(kIn0 | kIn1, kOut1 | kOut2); }
BWD(layer_norm) {
  return dispatch(OpId::layer_norm_bwd, {in[0], in[1], out[1], out[2], g[0]},
                  norm_bwd_attrs(a, in[1], in[2], in[0]));
}
SAVES(group_norm) { return reads(kIn0 | kIn1, kOut1 | kOut2); }
BWD(group_norm) {
  return dispatch(OpId::group_norm_bwd, {in[0], in[1], out[1], out[2], g[0]},
                  norm_bwd_attrs(a, in[1], in[2], in[0]));
}

// Linear: y = x w^T + b; the bias's gradient is the column sums of g (add's broadcast rule).
SAVES(linear) { return reads_crosswise(in); }
BWD(linear) {
  return {needs(in, 0) ? g[0].matmul(in[1]) : Tensor(),
          needs(in, 1) ? g[0].t().matmul(in[0]) : Tensor(),
          needs(in, 2) ? g[0].sum({0}) : Tensor()};
}

// Attention: the rule passes q, k, v, mask, the output and the saved row log-sum-exp lse
// (B, H, T) to attention_bwd, which recomputes the probabilities P = exp(scale q k^T + mask -
// lse) row by row: the node keeps nothing of size (B, H, T, S). Only a mask that itself tracks
// gradients (rare: masks are data) costs the (B, H, T, S) gradient of the scores here, dS =
// P (dout v^T - rowsum(dout out)), in the stat dtype, summed to the mask's shape by the
// broadcast_as rule of the front-end's view.
constexpr uint32_t kIn3 = 8u;
SAVES(attention) { return reads(kIn0 | kIn1 | kIn2 | kIn3, kOut0 | kOut1); }
BWD(attention) {
  const Tensors r = dispatch(OpId::attention_bwd,
                             {in[0], in[1], in[2], in[3], out[0], out[1], g[0]}, a);
  Tensor dmask;
  if (needs(in, 3)) {
    const DType sd = stat_dtype(in[0].dtype());
    const Tensor q = in[0].to_dtype(sd), k = in[1].to_dtype(sd), v = in[2].to_dtype(sd);
    const Tensor dout = g[0].to_dtype(sd), o = out[0].to_dtype(sd);
    const Tensor s = (q * a.f0).matmul(k.t()) + in[3].to_dtype(sd);
    const Tensor p = (s - out[1].unsqueeze(-1)).exp();
    const Tensor ds = p * (dout.matmul(v.t()) - (dout * o).sum({-1}, true));
    dmask = ds;
    // A mask given to dispatch unbroadcast (ops::attention broadcasts it as a view first):
    // summed over its broadcast dims, as broadcast_as's rule does.
    const Shape& ms = in[3].shape();
    const size_t lead = 4 - ms.rank();
    std::vector<int64_t> dims;
    for (size_t i = 0; i < 4; ++i)
      if (i < lead || (ms[i - lead] == 1 && dmask.dim(static_cast<int64_t>(i)) != 1))
        dims.push_back(static_cast<int64_t>(i));
    if (!dims.empty()) dmask = dmask.sum(dims, true);
    dmask = dmask.reshape(ms).to_dtype(in[3].dtype());
  }
  return {needs(in, 0) ? r[0] : Tensor(), needs(in, 1) ? r[1] : Tensor(),
          needs(in, 2) ? r[2] : Tensor(), dmask};
}

#undef BWD
#undef SAVES

// Ops marked non-differentiable in the table: no rule (the coverage test checks both ways).
constexpr BwdFn bwd_fill = nullptr, bwd_arange = nullptr, bwd_rand_uniform = nullptr,
                bwd_rand_normal = nullptr, bwd_eq = nullptr, bwd_ne = nullptr, bwd_lt = nullptr,
                bwd_le = nullptr, bwd_gt = nullptr, bwd_ge = nullptr, bwd_argmax = nullptr,
                bwd_argmin = nullptr, bwd_softmax_last_dim_bwd = nullptr,
                bwd_log_softmax_last_dim_bwd = nullptr, bwd_adamw_step = nullptr,
                bwd_rms_norm_bwd = nullptr, bwd_layer_norm_bwd = nullptr,
                bwd_group_norm_bwd = nullptr, bwd_gelu_erf_bwd = nullptr, bwd_attention_bwd = nullptr;
constexpr SavesFn saves_fill = nullptr, saves_arange = nullptr, saves_rand_uniform = nullptr,
                  saves_rand_normal = nullptr, saves_eq = nullptr, saves_ne = nullptr,
                  saves_lt = nullptr, saves_le = nullptr, saves_gt = nullptr, saves_ge = nullptr,
                  saves_argmax = nullptr, saves_argmin = nullptr,
                  saves_softmax_last_dim_bwd = nullptr, saves_log_softmax_last_dim_bwd = nullptr,
                  saves_adamw_step = nullptr, saves_rms_norm_bwd = nullptr,
                  saves_layer_norm_bwd = nullptr, saves_group_norm_bwd = nullptr,
                  saves_gelu_erf_bwd = nullptr, saves_attention_bwd = nullptr;

}  // namespace

BwdFn backward_rule(OpId op) {
  switch (op) {
#define TAPER_X(name, arity, nout, nsaved, diff, attrs) \
  case OpId::name:                       \
    return bwd_##name;
    TAPER_OPS(TAPER_X)
#undef TAPER_X
    case OpId::Count: break;
  }
  return nullptr;
}

SavesFn saved_values_rule(OpId op) {
  switch (op) {
#define TAPER_X(name, arity, nout, nsaved, diff, attrs) \
  case OpId::name:                                    \
    return saves_##name;
    TAPER_OPS(TAPER_X)
#undef TAPER_X
    case OpId::Count: break;
  }
  return nullptr;
}

}  // namespace taper
