// fused_case.h: the fused ops' benchmark cases, shared by bench_fused.cpp (CPU) and bench_cuda.cpp
// (CUDA): an op at a shape and dtype, the pieces of its name, the minimal bytes one call must
// move, and the call of its fused or composed form.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "taper/composed.h"
#include "taper/taper.h"

namespace taper::bench {

enum class Op { Softmax, RmsNorm, LayerNorm, GroupNorm };

struct Case {
  Op op;
  std::vector<size_t> shape;
  size_t groups = 0;  // group norm only
  DType dt;
};

inline constexpr double kEps = 1e-5;

inline const char* op_name(Op op) {
  switch (op) {
    case Op::Softmax: return "softmax";
    case Op::RmsNorm: return "rms_norm";
    case Op::LayerNorm: return "layer_norm";
    case Op::GroupNorm: return "group_norm";
  }
  return "?";
}

/// The fused forward op and its dedicated backward op.
inline std::pair<OpId, OpId> op_ids(Op op) {
  switch (op) {
    case Op::Softmax: return {OpId::softmax_last_dim, OpId::softmax_last_dim_bwd};
    case Op::RmsNorm: return {OpId::rms_norm, OpId::rms_norm_bwd};
    case Op::LayerNorm: return {OpId::layer_norm, OpId::layer_norm_bwd};
    case Op::GroupNorm: return {OpId::group_norm, OpId::group_norm_bwd};
  }
  return {OpId::softmax_last_dim, OpId::softmax_last_dim_bwd};
}

/// The dims joined by 'x'; group norm's carries its group count: 8x32x64x64_g8.
inline std::string shape_name(const Case& c) {
  std::string s;
  // Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on "literal" + string.
  for (size_t i = 0; i < c.shape.size(); ++i) {
    if (i) s += 'x';
    s += std::to_string(c.shape[i]);
  }
  if (c.op == Op::GroupNorm) {
    s += "_g";
    s += std::to_string(c.groups);
  }
  return s;
}

inline size_t numel(const std::vector<size_t>& s) {
  size_t n = 1;
  for (size_t d : s) n *= d;
  return n;
}

/// Length of the affine parameters: the last dim (rms/layer norm), the channels (group norm).
inline size_t param_len(const Case& c) {
  return c.op == Op::GroupNorm ? c.shape[1] : c.shape.back();
}

/// Minimal bytes of one call, s = dtype size, n = elements of x, p = param_len:
///   softmax    fwd: read x, write y                              2ns
///              fwd_bwd: + read y, dy, write dx                   5ns
///   rms_norm   fwd: read x, w, write y                           2ns + ps
///              fwd_bwd: + read dy, x, w, write dx, dw            5ns + 3ps
///   layer_norm fwd: read x, w, b, write y                        2ns + 2ps
///              fwd_bwd: + read dy, x, w, write dx, dw, db        5ns + 5ps
///   group_norm as layer_norm with p = channels                   2ns + 2ps / 5ns + 5ps
/// The per-row (per-group) statistics saved for the backward are not counted: they are
/// rows x 4 (or 8) bytes, under 0.1% of the traffic at every benched shape.
inline double minimal_bytes(const Case& c, bool bwd) {
  const double s = static_cast<double>(dtype_size(c.dt));
  const double n = static_cast<double>(numel(c.shape));
  const double p = static_cast<double>(param_len(c));
  switch (c.op) {
    case Op::Softmax: return bwd ? 5 * n * s : 2 * n * s;
    case Op::RmsNorm: return bwd ? 5 * n * s + 3 * p * s : 2 * n * s + p * s;
    case Op::LayerNorm:
    case Op::GroupNorm: return bwd ? 5 * n * s + 5 * p * s : 2 * n * s + 2 * p * s;
  }
  return 0;
}

/// The case's op on x (w, b where it takes them): its fused form or its composed one.
inline Tensor apply(const Case& c, bool fused, const Tensor& x, const Tensor& w,
                    const Tensor& b) {
  namespace F = ops;
  namespace C = composed;
  switch (c.op) {
    case Op::Softmax: return fused ? F::softmax_last_dim(x) : C::softmax_last_dim(x);
    case Op::RmsNorm: return fused ? F::rms_norm(x, w, kEps) : C::rms_norm(x, w, kEps);
    case Op::LayerNorm:
      return fused ? F::layer_norm(x, w, b, kEps) : C::layer_norm(x, w, b, kEps);
    case Op::GroupNorm:
      return fused ? F::group_norm(x, c.groups, w, b, kEps)
                   : C::group_norm(x, c.groups, w, b, kEps);
  }
  return {};
}

}  // namespace taper::bench
