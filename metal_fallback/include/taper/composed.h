// composed.h: `taper::composed`, the composed form of every fused op of ops.h, from primitive
// tensor ops only (metal_fallback/composed.cpp).
//
// What it is: the same maths as `taper::ops` with the same signatures, built from exp, log,
// rsqrt, + - * /, max/sum with keepdim, reshape and to_dtype. Each primitive records its own
// autograd edge, so these forms are differentiable on any device that has the primitives. They
// are the registry's fallback for a fused op with no kernel on a device, and the reference the
// fused kernels are tested and benched against. bf16/f16 compute in f32 and round once to the
// input dtype; f32 and f64 compute in their own dtype.
// What it is not: fast (each step is a pass over memory), or the argument checks of `taper::ops`:
// x must have a float dtype and w, b x's dtype and device, unchecked here; a weight that does not
// reshape to (D) raises that reshape's Error. taper/taper.h does not include this header (core
// knows nothing of metal_fallback/); the installed package ships it beside core's headers.
//
// Shapes: x (..., D) for the last-dim ops; (N, C, *) for group_norm; w, b (D) or (C), or an
// undefined or empty Tensor for "no affine".
#pragma once

#include <cstddef>

#include "taper/tensor.h"

namespace taper::composed {

/// exp(x - max) / sum(exp(x - max)) over the last dim; x: (..., D), float dtype.
Tensor softmax_last_dim(const Tensor& x);
/// (x - max) - log(sum(exp(x - max))) over the last dim; x: (..., D), float dtype.
Tensor log_softmax_last_dim(const Tensor& x);
/// x * rsqrt(mean(x^2) + eps) * w over the last dim; x: (..., D), w: (D) or empty.
Tensor rms_norm(const Tensor& x, const Tensor& w, double eps);
/// (x - mean) * rsqrt(var + eps) * w + b over the last dim, the variance two-pass (of the
/// centred values); x: (..., D), w, b: (D) or empty.
Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps);
/// Normalises each of `num_groups` groups of C / num_groups channels over the group's channels
/// and all spatial positions, then * w + b per channel; x: (N, C, *), w, b: (C) or empty.
/// Throws Error when x has rank < 2 or num_groups is 0 or does not divide C.
Tensor group_norm(const Tensor& x, size_t num_groups, const Tensor& w, const Tensor& b,
                  double eps);
/// x w^T + b: matmul, then add (two roundings in bf16/f16, as the ops themselves); x (R, in),
/// w (out, in), b (out) or undefined.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b);
/// softmax(scale * q k^T + mask) v, the scores (B, H, T, S) materialised; q: (B, H, T, D),
/// k, v: (B, H, S, D), mask broadcastable to (B, H, T, S) or undefined/empty.
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                 double scale);

}  // namespace taper::composed
