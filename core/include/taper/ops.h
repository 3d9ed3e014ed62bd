// ops.h: the fused ops (`taper::ops`) and their composed forms (`taper::composed`).
//
// Fused: one kernel per device, differentiable through a bwd hook (softmax has a dedicated
// backward kernel; the norms' backward is composed from primitives on f32/f64 statistics).
// Composed: the same maths from primitive ops only (metal_fallback/), the fallback on any device
// without a fused kernel and the reference in tests and benches.
// Weight and bias may be an undefined or empty Tensor for "no affine".
#pragma once

#include <cstddef>

#include "taper/tensor.h"

namespace taper::ops {
/// softmax over the last dim. x: (..., D)
Tensor softmax_last_dim(const Tensor& x);
/// log-softmax over the last dim. x: (..., D)
Tensor log_softmax_last_dim(const Tensor& x);
/// x / sqrt(mean(x^2) + eps) * w. x: (..., D), w: (D) or empty
Tensor rms_norm(const Tensor& x, const Tensor& w, double eps);
/// (x - mean) / sqrt(var + eps) * w + b over the last dim. x: (..., D), w, b: (D) or empty
Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps);
/// Group norm of (N, C, *) over C/num_groups channels and all spatial positions; w, b: (C).
Tensor group_norm(const Tensor& x, size_t num_groups, const Tensor& w, const Tensor& b,
                  double eps);
}  // namespace taper::ops

namespace taper::composed {
Tensor softmax_last_dim(const Tensor& x);
Tensor log_softmax_last_dim(const Tensor& x);
Tensor rms_norm(const Tensor& x, const Tensor& w, double eps);
Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps);
Tensor group_norm(const Tensor& x, size_t num_groups, const Tensor& w, const Tensor& b,
                  double eps);
}  // namespace taper::composed
