// fused_ops.cpp: the public entry points of the fused ops (taper::ops): argument checks with
// messages that name the op, shapes and dtypes, then dispatch (kernel, or composed fallback).
#include <cmath>
#include <string>

#include "taper/op.h"
#include "taper/ops.h"

namespace taper::ops {
namespace {


void check_float(const char* op, const Tensor& x) {
  TAPER_CHECK(is_float(x.dtype()), op, ": needs a float input, got ", dtype_name(x.dtype()), " ",
              x.shape().to_string());
}

void check_affine(const char* op, const char* what, const Tensor& p, const Tensor& x,
                  size_t want) {
  if (!present(p)) return;
  TAPER_CHECK(p.rank() == 1 && p.dim(0) == want, op, ": ", what, " ", p.shape().to_string(),
              " must be (", want, ") for input ", x.shape().to_string());
  TAPER_CHECK(p.dtype() == x.dtype(), op, ": ", what, " dtype ", dtype_name(p.dtype()),
              " differs from input dtype ", dtype_name(x.dtype()));
  TAPER_CHECK(p.device() == x.device(), op, ": ", what, " on ", p.device().to_string(),
              ", input on ", x.device().to_string());
}

void check_last_dim(const char* op, const Tensor& x) {
  check_float(op, x);
  TAPER_CHECK(x.rank() >= 1, op, ": needs rank >= 1, got ", x.shape().to_string());
}

void check_eps(const char* op, double eps) {
  TAPER_CHECK(eps >= 0.0, op, ": eps must be >= 0, got ", eps);
}

}  // namespace

Tensor softmax_last_dim(const Tensor& x) {
  check_last_dim("softmax_last_dim", x);
  return dispatch1(OpId::softmax_last_dim, {x});
}

Tensor log_softmax_last_dim(const Tensor& x) {
  check_last_dim("log_softmax_last_dim", x);
  return dispatch1(OpId::log_softmax_last_dim, {x});
}

Tensor rms_norm(const Tensor& x, const Tensor& w, double eps) {
  check_last_dim("rms_norm", x);
  check_eps("rms_norm", eps);
  check_affine("rms_norm", "weight", w, x, x.dim(-1));
  OpAttrs a;
  a.f0 = eps;
  return dispatch1(OpId::rms_norm, {x, w}, a);
}

Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  check_last_dim("layer_norm", x);
  check_eps("layer_norm", eps);
  check_affine("layer_norm", "weight", w, x, x.dim(-1));
  check_affine("layer_norm", "bias", b, x, x.dim(-1));
  OpAttrs a;
  a.f0 = eps;
  return dispatch1(OpId::layer_norm, {x, w, b}, a);
}

Tensor group_norm(const Tensor& x, size_t num_groups, const Tensor& w, const Tensor& b,
                  double eps) {
  check_float("group_norm", x);
  check_eps("group_norm", eps);
  TAPER_CHECK(x.rank() >= 2, "group_norm: needs (N, C, *) input, got ", x.shape().to_string());
  TAPER_CHECK(num_groups > 0 && x.dim(1) % num_groups == 0 &&
                  num_groups <= (x.dim(1) ? x.dim(1) : size_t{65536}),  // C = 0: any G divides it
              "group_norm: ", x.dim(1), " channels of ", x.shape().to_string(),
              " do not split into ", num_groups, " groups");
  check_affine("group_norm", "weight", w, x, x.dim(1));
  check_affine("group_norm", "bias", b, x, x.dim(1));
  OpAttrs a;
  a.f0 = eps;
  a.i0 = static_cast<int64_t>(num_groups);
  return dispatch1(OpId::group_norm, {x, w, b}, a);
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  const char* op = "linear";
  TAPER_CHECK(x.defined() && w.defined(), op, ": x and w must be defined");
  check_float(op, x);
  TAPER_CHECK(w.rank() == 2, op, ": weight must be (out, in), got ", w.shape().to_string(),
              " for input ", x.shape().to_string());
  TAPER_CHECK(x.rank() >= 1 && x.dim(-1) == w.dim(1), op, ": input ", x.shape().to_string(),
              " does not end in in_features ", w.dim(1), " of weight ", w.shape().to_string());
  TAPER_CHECK(w.dtype() == x.dtype(), op, ": weight dtype ", dtype_name(w.dtype()),
              " differs from input dtype ", dtype_name(x.dtype()));
  TAPER_CHECK(w.device() == x.device(), op, ": weight on ", w.device().to_string(), ", input on ",
              x.device().to_string());
  check_affine(op, "bias", b, x, w.dim(0));
  const size_t in = w.dim(1), out = w.dim(0);
  // One (rows, in) x (in, out) product whatever the leading dims.
  const Tensor x2 = x.rank() == 2 ? x : x.reshape(Shape({in ? x.elem_count() / in : 0, in}));
  const Tensor y = dispatch1(OpId::linear, {x2, w, present(b) ? b : Tensor()});
  if (x.rank() == 2) return y;
  std::vector<size_t> dims = x.dims();
  dims.back() = out;
  return y.reshape(Shape(dims));
}

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                 double scale) {
  const char* op = "attention";
  auto shapes = [&] {
    return q.shape().to_string() + ", k " + k.shape().to_string() + ", v " +
           v.shape().to_string() +
           (present(mask) ? ", mask " + mask.shape().to_string() : std::string());
  };
  TAPER_CHECK(q.defined() && k.defined() && v.defined(), op, ": q, k and v must be defined");
  check_float(op, q);
  TAPER_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype() &&
                  (!present(mask) || mask.dtype() == q.dtype()),
              op, ": dtypes differ: q ", dtype_name(q.dtype()), ", k ", dtype_name(k.dtype()),
              ", v ", dtype_name(v.dtype()),
              present(mask) ? std::string(", mask ") + std::string(dtype_name(mask.dtype()))
                            : std::string());
  TAPER_CHECK(k.device() == q.device() && v.device() == q.device() &&
                  (!present(mask) || mask.device() == q.device()),
              op, ": q on ", q.device().to_string(), ", k on ", k.device().to_string(), ", v on ",
              v.device().to_string());
  TAPER_CHECK(q.rank() == 4 && k.rank() == 4 && v.rank() == 4, op,
              ": q, k, v must be (B, H, T, D), (B, H, S, D), (B, H, S, D); got q ", shapes());
  const size_t B = q.dim(0), H = q.dim(1), T = q.dim(2), D = q.dim(3), S = k.dim(2);
  TAPER_CHECK(k.dim(0) == B && k.dim(1) == H && k.dim(3) == D && v.shape() == k.shape(), op,
              ": q (B, H, T, D), k and v (B, H, S, D) do not fit together: q ", shapes());
  TAPER_CHECK(std::isfinite(scale), op, ": scale must be finite, got ", scale);
  Tensor m;
  if (present(mask)) {
    const Shape full({B, H, T, S});
    TAPER_CHECK(broadcasts_to(mask.shape(), full), op, ": mask ", mask.shape().to_string(),
                " does not broadcast to the scores (B, H, T, S) = ", full.to_string(),
                " of q ", shapes());
    // A view (stride 0 along broadcast dims): its gradient, if it has one, is summed by
    // broadcast_as's rule, and the kernels read it through the strides.
    m = mask.shape() == full ? mask : mask.broadcast_as(full);
  }
  OpAttrs a;
  a.f0 = scale;
  return dispatch1(OpId::attention, {q, k, v, m}, a);
}

}  // namespace taper::ops
