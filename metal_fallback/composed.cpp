// composed.cpp: the composed forms of the fused ops (taper::composed), written only with
// primitive tensor ops, and their registration as the fallback of each fused registry entry.
//
// What it is: the same maths as the fused kernels (cpu/softmax.cpp, cpu/norm.cpp) from exp, log,
// rsqrt, add/sub/mul/div, max/sum reductions with keepdim, reshape and to_dtype; each primitive
// records its own autograd edge, so these forms are differentiable on any device that has the
// primitives. bf16/f16 inputs are upcast to f32 first, computed in f32 and cast back once (one
// rounding, as the fused kernels). Also the reference the fused ops are tested and benched
// against.
// The composed forms of the backward ops (gelu_erf_bwd, softmax_last_dim_bwd, ..., group_norm_bwd) are the
// backward formulas from primitive ops: what runs where a device has no kernel for them, and the
// reference their kernels are tested against.
// What it is not: fast (every step is a pass over memory).
//
// Shape letters: x (..., D) for softmax, rms_norm, layer_norm; (N, C, *) for group_norm with G
// groups; w, b (D) or (C), or empty for no affine.
#include <cstddef>
#include <vector>

#include "taper/composed.h"
#include "taper/op.h"

namespace taper::composed {
namespace {


/// `t` in its compute dtype (a no-op unless `t` is bf16/f16).
Tensor upcast(const Tensor& t) {
  const DType c = stat_dtype(t.dtype());  // float inputs only
  return c == t.dtype() ? t : t.to_dtype(c);
}

/// `t` back in `dt`, rounded once.
Tensor downcast(const Tensor& t, DType dt) { return t.dtype() == dt ? t : t.to_dtype(dt); }

/// Sum over the last dim divided by its length, kept as a size-1 dim.
Tensor mean_last(const Tensor& t) {
  return t.sum({-1}, /*keepdim=*/true) / static_cast<double>(t.dim(-1));
}

/// The row max kept as a size-1 dim; rows of no elements give 0 (unused: they have no elements
/// to shift), where max itself has nothing to reduce.
Tensor max_last(const Tensor& t) {
  return t.dim(-1) == 0 ? t.sum({-1}, /*keepdim=*/true) : t.max({-1}, /*keepdim=*/true);
}

/// y * w + b with w, b of shape `pshape` broadcast against y (each optional).
Tensor affine(Tensor y, const Tensor& w, const Tensor& b, const Shape& pshape) {
  if (present(w)) y = y * upcast(w).reshape(pshape);
  if (present(b)) y = y + upcast(b).reshape(pshape);
  return y;
}

}  // namespace

Tensor softmax_last_dim(const Tensor& x) {
  const Tensor xc = upcast(x);
  const Tensor e = (xc - max_last(xc)).exp();
  return downcast(e / e.sum({-1}, /*keepdim=*/true), x.dtype());
}

Tensor log_softmax_last_dim(const Tensor& x) {
  const Tensor xc = upcast(x);
  const Tensor z = xc - max_last(xc);
  return downcast(z - z.exp().sum({-1}, /*keepdim=*/true).log(), x.dtype());
}

Tensor rms_norm(const Tensor& x, const Tensor& w, double eps) {
  const Tensor xc = upcast(x);
  const Tensor rstd = (mean_last(xc * xc) + eps).rsqrt();
  return downcast(affine(xc * rstd, w, Tensor(), Shape({x.dim(-1)})), x.dtype());
}

Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  const Tensor xc = upcast(x);
  const Tensor xm = xc - mean_last(xc);  // two-pass: the variance of the centred values
  const Tensor rstd = (mean_last(xm * xm) + eps).rsqrt();
  const Shape pshape({x.dim(-1)});
  return downcast(affine(xm * rstd, w, b, pshape), x.dtype());
}

Tensor group_norm(const Tensor& x, size_t num_groups, const Tensor& w, const Tensor& b,
                  double eps) {
  TAPER_CHECK(x.rank() >= 2 && num_groups > 0 && x.dim(1) % num_groups == 0,
              "group_norm (composed): ", x.shape().to_string(), " does not split into ",
              num_groups, " groups of channels");
  const size_t N = x.dim(0), C = x.dim(1), G = num_groups;
  size_t S = 1;  // spatial positions per channel
  for (size_t k = 2; k < x.rank(); ++k) S *= x.dim(static_cast<int64_t>(k));
  const size_t per_group = C / G * S;  // statistics run over C/G channels x S positions
  const Tensor xg = upcast(x).reshape(Shape({N, G, per_group}));
  const Tensor xm = xg - mean_last(xg);
  const Tensor rstd = (mean_last(xm * xm) + eps).rsqrt();
  const Tensor y = (xm * rstd).reshape(x.shape());
  // w, b as (C, 1, ..., 1): they broadcast over N and the spatial dims.
  std::vector<size_t> pdims(x.rank() - 1, 1);
  pdims[0] = C;
  return downcast(affine(y, w, b, Shape(pdims)), x.dtype());
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  const Tensor y = x.matmul(w.t());
  return present(b) ? y + b : y;
}

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                 double scale) {
  Tensor s = (upcast(q) * scale).matmul(upcast(k).t());  // (B, H, T, S)
  // An empty mask means none, unless the scores are empty too and the mask is their (B, H, T, S)
  // view (ops::attention's with T = 0): then it is added, and gets its (empty-sum) gradient.
  if (present(mask) || (mask.defined() && s.elem_count() == 0 && mask.rank() == 4))
    s = s + upcast(mask);
  // No keys (S = 0): empty weights, so out = 0 (and gradient 0), as the kernels give.
  const Tensor w = s.dim(-1) == 0 ? s : softmax_last_dim(s);
  return downcast(w.matmul(upcast(v)), q.dtype());
}

namespace {

// Registry adaptors: the op's inputs and attrs in, the user-visible outputs out.
std::vector<Tensor> softmax_fn(const std::vector<Tensor>& in, const OpAttrs&) {
  return {softmax_last_dim(in[0])};
}
std::vector<Tensor> log_softmax_fn(const std::vector<Tensor>& in, const OpAttrs&) {
  return {log_softmax_last_dim(in[0])};
}
Tensor arg(const std::vector<Tensor>& in, size_t i) { return in.size() > i ? in[i] : Tensor(); }
std::vector<Tensor> rms_norm_fn(const std::vector<Tensor>& in, const OpAttrs& a) {
  return {rms_norm(in[0], arg(in, 1), a.f0)};
}
std::vector<Tensor> layer_norm_fn(const std::vector<Tensor>& in, const OpAttrs& a) {
  return {layer_norm(in[0], arg(in, 1), arg(in, 2), a.f0)};
}
std::vector<Tensor> group_norm_fn(const std::vector<Tensor>& in, const OpAttrs& a) {
  return {group_norm(in[0], static_cast<size_t>(a.i0), arg(in, 1), arg(in, 2), a.f0)};
}

/// gelu_erf_bwd, in = {x, g}: g (Phi(x) + x phi(x)) in the compute dtype, Phi = gelu_erf(x) / x
/// (1/2 where |x| < 1e-30), phi = exp(-x^2/2) / sqrt(2 pi); rounded once to x's dtype. (+-inf
/// give NaN here, where the kernels give their limits g and 0.)
std::vector<Tensor> gelu_erf_bwd_fn(const std::vector<Tensor>& in, const OpAttrs&) {
  const Tensor x = upcast(in[0]), g = upcast(in[1]);
  const Tensor small = x.abs().lt(1e-30);
  const Tensor cdf = small.where_cond(0.5, x.gelu_erf() / small.where_cond(1.0, x));
  const Tensor pdf = (x * x * -0.5).exp() * 0.3989422804014327;  // 1 / sqrt(2 pi)
  return {downcast(g * (cdf + x * pdf), in[0].dtype())};
}

/// The dedicated softmax backward ops, in = {x, stats, dy}, stats (..., 2) = (max m, log-sum l)
/// saved by the forward kernel in the compute dtype: y = exp((x - m) - l), then
/// dx = y (dy - sum(dy y)) (softmax) or dy - y sum(dy) (log-softmax), rounded once to x's dtype.
/// A forward row that was NaN has a non-finite m; adding m - m (NaN there, 0 elsewhere) makes
/// its gradient row NaN, as the kernels do.
std::vector<Tensor> softmax_bwd_from_stats(const std::vector<Tensor>& in, bool log) {
  const Tensor xc = upcast(in[0]), dy = upcast(in[2]);
  const Tensor m = in[1].narrow(-1, 0, 1), l = in[1].narrow(-1, 1, 1);
  const Tensor y = ((xc - m) - l).exp();
  const Tensor dx = log ? dy - y * dy.sum({-1}, /*keepdim=*/true)
                        : y * (dy - (dy * y).sum({-1}, /*keepdim=*/true));
  return {downcast(dx + (m - m), in[0].dtype())};
}
std::vector<Tensor> softmax_bwd_fn(const std::vector<Tensor>& in, const OpAttrs&) {
  return softmax_bwd_from_stats(in, false);
}
std::vector<Tensor> log_softmax_bwd_fn(const std::vector<Tensor>& in, const OpAttrs&) {
  return softmax_bwd_from_stats(in, true);
}

// The norm backward ops from primitive ops, in the stat dtype (f32 for half types and f32, f64
// for f64), over "rows" (a row of the last dim; group norm: a group of M = C/G * S elements),
// with d = x - mean (rms norm: d = x), rho = rstd, gw = gy * w:
//   dx = rho * (gw - m1 - xhat * m2),  xhat = d * rho,  m1 = mean_row(gw) (0 for rms norm),
//   m2 = mean_row(gw * xhat),  dw = sum over rows of gy * xhat,  db = sum over rows of gy.
// They are computed from u = gy * rho and q = u * d, which carry every sum:
//   dw = sum_rows(q),  rho * m1 = (u . w) / M,  rho^2 * m2 = rho * (q . w) / M  (row dots),
//   dx = u * w + t,  t = -(d * k + c),  k = rho^2 * (q . w) / M,  c = (u . w) / M,
// t and dx each one mul_add pass. The row dots with w are matrix-vector products (one read of
// u or q; no u * w product to materialize first); d stays centred, so a large mean does not
// cancel in dx. in = {x, w or empty, [mean,] rstd, dy}; attrs.ints = {need dw, need db},
// attrs.dtype = db's dtype. Returns {dx, dw, db} (undefined where not needed).
Tensor norm_t(const Tensor& d, const Tensor& k, const Tensor& c) {
  return c.defined() ? d.mul_add(k.neg(), c.neg()) : d * k.neg();
}
/// u * wb + t; `wb` is w shaped to broadcast against u (undefined: no weight).
Tensor norm_dx(const Tensor& u, const Tensor& wb, const Tensor& t) {
  return wb.defined() ? u.mul_add(wb, t) : u + t;
}
bool need(const OpAttrs& a, size_t i) { return a.ints.size() > i && a.ints[i] != 0; }

std::vector<Tensor> rms_norm_bwd_fn(const std::vector<Tensor>& in, const OpAttrs& a) {
  const Tensor &x = in[0], &w = in[1];
  const DType sd = stat_dtype(x.dtype());
  const size_t dim = x.dim(-1), rows = x.elem_count() / dim;
  const Shape rd({rows, dim});
  const Tensor d = x.to_dtype(sd).reshape(rd);
  const Tensor rho = in[2].reshape(Shape({rows, 1}));
  const Tensor u = in[3].to_dtype(sd).reshape(rd) * rho;
  const Tensor q = u * d;
  const Tensor ws = present(w) ? w.to_dtype(sd).reshape(Shape({dim, 1})) : Tensor();
  const Tensor qw = present(w) ? q.matmul(ws) : q.sum({1}, true);  // (rows, 1)
  const Tensor k = rho * rho * qw * (1.0 / static_cast<double>(dim));
  const Tensor wb = present(w) ? ws.reshape(Shape({dim})) : Tensor();
  const Tensor dx = norm_dx(u, wb, norm_t(d, k, Tensor()));
  std::vector<Tensor> r = {dx.reshape(x.shape()).to_dtype(x.dtype()), Tensor()};
  if (present(w) && need(a, 0)) r[1] = q.sum({0}).to_dtype(w.dtype());
  return r;
}

std::vector<Tensor> layer_norm_bwd_fn(const std::vector<Tensor>& in, const OpAttrs& a) {
  const Tensor &x = in[0], &w = in[1];
  const DType sd = stat_dtype(x.dtype());
  const size_t dim = x.dim(-1), rows = x.elem_count() / dim;
  const Shape rd({rows, dim}), col({rows, 1});
  const Tensor gy = in[4].to_dtype(sd).reshape(rd);
  const Tensor d = x.to_dtype(sd).reshape(rd) - in[2].reshape(col);
  const Tensor rho = in[3].reshape(col);
  const Tensor u = gy * rho;
  const Tensor q = u * d;
  const Tensor ws = present(w) ? w.to_dtype(sd).reshape(Shape({dim, 1})) : Tensor();
  const double inv = 1.0 / static_cast<double>(dim);
  const Tensor qw = present(w) ? q.matmul(ws) : q.sum({1}, true);
  const Tensor uw_sum = present(w) ? u.matmul(ws) : u.sum({1}, true);
  const Tensor wb = present(w) ? ws.reshape(Shape({dim})) : Tensor();
  const Tensor dx = norm_dx(u, wb, norm_t(d, rho * rho * qw * inv, uw_sum * inv));
  std::vector<Tensor> r = {dx.reshape(x.shape()).to_dtype(x.dtype()), Tensor(), Tensor()};
  if (present(w) && need(a, 0)) r[1] = q.sum({0}).to_dtype(w.dtype());
  if (need(a, 1)) r[2] = gy.sum({0}).to_dtype(a.dtype);
  return r;
}

std::vector<Tensor> group_norm_bwd_fn(const std::vector<Tensor>& in, const OpAttrs& a) {
  // x: (N, C, *) viewed as (N, G, M) per group and (N, C, S) per channel, M = C/G * S;
  // mean, rstd: (N, G). The sums over S are row reductions (no permuted copy); the group dots
  // with w come from them: sum_c w_c * (sum_s u, resp. q).
  const Tensor &x = in[0], &w = in[1];
  const DType sd = stat_dtype(x.dtype());
  const size_t n = x.dim(0), c = x.dim(1), groups = static_cast<size_t>(a.i0);
  const size_t spatial = x.elem_count() / (n * c), m = x.elem_count() / (n * groups);
  const Shape grouped({n, groups, m}), chan({n, c, spatial});
  const Tensor gy = in[4].to_dtype(sd).reshape(grouped);
  const Tensor rho = in[3].unsqueeze(-1);  // (N, G, 1)
  const Tensor d = x.to_dtype(sd).reshape(grouped) - in[2].unsqueeze(-1);
  const Tensor u = gy * rho;
  const Tensor q = u * d;
  const Tensor ws = present(w) ? w.to_dtype(sd) : Tensor();
  const Tensor u_c = u.reshape(chan).sum({2});  // (N, C)
  const Tensor q_c = q.reshape(chan).sum({2});  // (N, C)
  auto group_dot = [&](const Tensor& per_chan) {  // (N, C) -> (N, G, 1): sum_c w_c * per_chan
    const Tensor t = present(w) ? per_chan * ws : per_chan;
    return t.reshape(Shape({n, groups, c / groups})).sum({2}, true);
  };
  const double inv = 1.0 / static_cast<double>(m);
  const Tensor k = rho * rho * group_dot(q_c) * inv, cm = group_dot(u_c) * inv;  // (N, G, 1)
  const Tensor wb = present(w) ? ws.reshape(Shape({1, c, 1})) : Tensor();
  const Tensor dx = norm_dx(u.reshape(chan), wb, norm_t(d, k, cm).reshape(chan));
  std::vector<Tensor> r = {dx.reshape(x.shape()).to_dtype(x.dtype()), Tensor(), Tensor()};
  if (present(w) && need(a, 0)) r[1] = q_c.sum({0}).to_dtype(w.dtype());
  if (need(a, 1)) r[2] = gy.reshape(chan).sum({2}).sum({0}).to_dtype(a.dtype);
  return r;
}

/// The AdamW update from primitive ops, in = {w, g, m, v}, attrs.reals = {decay, b1, b2, eps,
/// step_size, bc2_sqrt}: the same operations in the same order as cpu/optim.cpp's kernel. In
/// place (attrs.flag) the results are copied over w, m and v, which are returned. in[4], when
/// present (a bf16/f16 parameter of the f32 master w), receives w' rounded once.
std::vector<Tensor> adamw_step_fn(const std::vector<Tensor>& in, const OpAttrs& a) {
  const Tensor &w = in[0], &m = in[2], &v = in[3];
  const Tensor g = in[1].to_dtype(w.dtype());  // a half gradient of an f32 master widens exactly
  const std::vector<double>& r = a.reals;
  const Tensor m1 = m + (g - m) * (1.0 - r[1]);
  const Tensor v1 = v * r[2] + (g * g) * (1.0 - r[2]);
  const Tensor w1 = w * r[0] - (m1 / (v1.sqrt() / r[5] + r[3])) * r[4];
  if (present(in, 4)) in[4].copy_from(w1);
  if (!a.flag) return {w1, m1, v1};
  w.copy_from(w1);
  m.copy_from(m1);
  v.copy_from(v1);
  return {w, m, v};
}

std::vector<Tensor> linear_fn(const std::vector<Tensor>& in, const OpAttrs&) {
  return {linear(in[0], in[1], arg(in, 2))};
}

std::vector<Tensor> attention_fn(const std::vector<Tensor>& in, const OpAttrs& a) {
  return {attention(in[0], in[1], in[2], arg(in, 3), a.f0)};
}

/// attention_bwd, in = {q, k, v, mask or undefined, out, lse, dout}, lse (B, H, T) in the stat
/// dtype: P = exp(scale q k^T + mask - lse) recomputed, D = rowsum(dout out),
/// dS = P (dout v^T - D), dq = scale dS k, dk = scale dS^T q, dv = P^T dout; in the stat dtype
/// (f32 for half types, f64 for f64), each gradient rounded once to its input's dtype. A forward
/// row that was NaN (all -inf scores) has a non-finite lse: its P row is NaN, and so are dq's row
/// and every dk, dv row it touches, as the composed forward's own gradient would be.
std::vector<Tensor> attention_bwd_fn(const std::vector<Tensor>& in, const OpAttrs& a) {
  const Tensor q = upcast(in[0]), k = upcast(in[1]), v = upcast(in[2]);
  const Tensor o = upcast(in[4]), dout = upcast(in[6]);
  Tensor s = (q * a.f0).matmul(k.t());
  if (present(in, 3)) s = s + upcast(in[3]);
  const Tensor p = (s - in[5].unsqueeze(-1)).exp();
  const Tensor ds = p * (dout.matmul(v.t()) - (dout * o).sum({-1}, /*keepdim=*/true));
  return {downcast(ds.matmul(k) * a.f0, in[0].dtype()),
          downcast(ds.t().matmul(q) * a.f0, in[1].dtype()),
          downcast(p.t().matmul(dout), in[2].dtype())};
}

struct Registrar {
  Registrar() {
    register_composed(OpId::adamw_step, &adamw_step_fn);
    register_composed(OpId::softmax_last_dim, &softmax_fn);
    register_composed(OpId::log_softmax_last_dim, &log_softmax_fn);
    register_composed(OpId::gelu_erf_bwd, &gelu_erf_bwd_fn);
    register_composed(OpId::softmax_last_dim_bwd, &softmax_bwd_fn);
    register_composed(OpId::log_softmax_last_dim_bwd, &log_softmax_bwd_fn);
    register_composed(OpId::rms_norm, &rms_norm_fn);
    register_composed(OpId::layer_norm, &layer_norm_fn);
    register_composed(OpId::group_norm, &group_norm_fn);
    register_composed(OpId::rms_norm_bwd, &rms_norm_bwd_fn);
    register_composed(OpId::layer_norm_bwd, &layer_norm_bwd_fn);
    register_composed(OpId::group_norm_bwd, &group_norm_bwd_fn);
    register_composed(OpId::linear, &linear_fn);
    register_composed(OpId::attention, &attention_fn);
    register_composed(OpId::attention_bwd, &attention_bwd_fn);
  }
};
const Registrar registrar;

}  // namespace
}  // namespace taper::composed
