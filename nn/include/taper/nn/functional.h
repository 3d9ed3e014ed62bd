// functional.h: the stateless forms of the layers (`taper::nn::functional`).
//
// What it is: the maths of each layer as a function of its inputs and weights, built from
// public tensor ops and the fused ops, so a module's forward is its functional form applied to
// its parameters (and the tests check exactly that). What it is not: parameter storage.
// Shape letters: B batch, T query length, S key length, H heads, D head dim, E model dim.
#pragma once

#include <cstdint>

#include "taper/tensor.h"

namespace taper::nn::functional {

/// y = x W^T + b. x: (..., in), w: (out, in), b: (out) or undefined.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = Tensor());

/// Rows of `w` picked by `ids`. ids: any shape, i64 or u32; w: (num, dim) -> (*ids, dim).
Tensor embedding(const Tensor& ids, const Tensor& w);

/// Inverted dropout: zeroes each element with probability `p` and scales the rest by 1/(1-p).
/// The mask is counter-based (`Tensor::rand` with `seed`), so the same seed gives the same mask
/// on every thread count and device. Identity when `!training` or `p == 0`.
Tensor dropout(const Tensor& x, double p, uint64_t seed, bool training = true);

/// Additive causal mask (T, S): 0 where key j <= query i + (S - T), -inf above.
Tensor causal_mask(size_t t, size_t s, DType dt, Device dev = Device::cpu());

/// Additive key-padding mask (B, 1, 1, S) from a (B, S) 0/1 attention mask (any dtype): 0 where
/// the mask is 1, a large negative value where it is 0 (the dtype's lowest finite value for
/// the half types, -1e9 otherwise, so a row never becomes all -inf).
Tensor padding_mask(const Tensor& attention_mask, DType dt);

/// softmax(q k^T / sqrt(D) + mask) v. q: (B, H, T, D), k, v: (B, H, S, D); mask: additive,
/// broadcastable to (B, H, T, S), or undefined. `causal` adds `causal_mask(T, S)`. Dropout on
/// the attention weights when `dropout_p > 0` (seeded as `dropout`). Without dropout this is the
/// fused `ops::attention` (the causal mask folded into the additive one), which keeps no
/// (B, H, T, S) tensor for the backward; with dropout, the composed scores, the fused
/// `ops::softmax_last_dim` and the product (q scaled first: T*D multiplies, not T*S).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& mask = Tensor(), bool causal = false,
                                    double dropout_p = 0.0, uint64_t dropout_seed = 0);

}  // namespace taper::nn::functional
