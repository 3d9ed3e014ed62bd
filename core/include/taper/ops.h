// ops.h: the fused ops (`taper::ops`): one kernel per device, differentiable through a dedicated
// backward op (softmax_last_dim_bwd, rms_norm_bwd, ...), each with a kernel per device too.
//
// Precision: bf16/f16 compute in f32 and round once, to nearest-even; f64 is f64 throughout.
// Where a device has no kernel for an op, the registry runs its composed form (metal_fallback/,
// declared in taper/composed.h as `taper::composed` with the same signatures).
// Every op checks its arguments and throws taper::Error naming the op and the offending shapes,
// dtypes or devices: x must have a float dtype (bf16, f16, f32, f64); a weight or bias must have
// x's dtype and device. Weight and bias may be an undefined or empty Tensor for "no affine".
#pragma once

#include <cstddef>

#include "taper/tensor.h"

namespace taper::ops {

/// Softmax over the last dim, the row max subtracted first; a row of all -inf gives NaN.
/// x: (..., D), rank >= 1; the result has x's shape and dtype.
Tensor softmax_last_dim(const Tensor& x);
/// log(softmax(x)) over the last dim, computed as (x - max) - log(sum(exp(x - max))).
/// x: (..., D), rank >= 1; the result has x's shape and dtype.
Tensor log_softmax_last_dim(const Tensor& x);
/// x / sqrt(mean(x^2) + eps) * w over the last dim. x: (..., D), rank >= 1; w: (D) or empty;
/// eps >= 0 (else Error).
Tensor rms_norm(const Tensor& x, const Tensor& w, double eps);
/// (x - mean) / sqrt(var + eps) * w + b over the last dim (biased variance, two-pass).
/// x: (..., D), rank >= 1; w, b: (D) or empty; eps >= 0 (else Error).
Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps);
/// Group norm: x: (N, C, *) split into `num_groups` groups of C / num_groups channels, each
/// normalised over its channels and all spatial positions, then * w + b per channel; w, b: (C)
/// or empty. Error when rank < 2, num_groups is 0, does not divide C or exceeds it (65536 when
/// C = 0), or eps < 0.
Tensor group_norm(const Tensor& x, size_t num_groups, const Tensor& w, const Tensor& b,
                  double eps);
/// Fused linear layer: x w^T + b, the bias added before the one rounding where the device has a
/// linear kernel (the CPU's; CUDA's for bf16/f16/f32, cuBLASLt's bias epilogue), else matmul
/// then add (in bf16/f16 two roundings). x: (..., in), w: (out, in), b: (out) or
/// undefined/empty for none, all of one float dtype and device. The result is (..., out).
/// Differentiable in x, w and b.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b);
/// Fused scaled dot-product attention: softmax(scale * q k^T + mask) v over the last dim, the
/// row max subtracted first, without materialising the (B, H, T, S) scores. q: (B, H, T, D),
/// k and v: (B, H, S, D), all of one float dtype and device (any strides); mask: additive, of
/// q's dtype, rank <= 4 and broadcastable to (B, H, T, S), or undefined/empty for none. A query
/// row whose scores are all -inf gives NaN, as softmax does. The result has q's shape and dtype.
/// Differentiable in q, k, v and mask; the backward recomputes the probabilities from the saved
/// row log-sum-exp (B, H, T) (f32 for bf16/f16/f32, f64 for f64).
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                 double scale);

}  // namespace taper::ops
