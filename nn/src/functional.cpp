// functional.cpp: the stateless layer maths (functional.h), from public tensor ops and the fused
// ops only.
#include "taper/nn/functional.h"

#include <cmath>
#include <limits>

#include "taper/op.h"
#include "taper/ops.h"

namespace taper::nn::functional {

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) { return ops::linear(x, w, b); }

Tensor embedding(const Tensor& ids, const Tensor& w) {
  TAPER_CHECK(w.rank() == 2, "embedding: weight must be (num, dim), got ", w.shape().to_string());
  TAPER_CHECK(ids.dtype() == DType::I64 || ids.dtype() == DType::U32,
              "embedding: ids must be i64 or u32, got ", dtype_name(ids.dtype()), " ",
              ids.shape().to_string());
  Tensor rows = w.index_select(ids.rank() == 1 ? ids : ids.flatten_all(), 0);
  std::vector<size_t> dims = ids.dims();
  dims.push_back(w.dim(1));
  return rows.reshape(Shape(dims));
}

Tensor dropout(const Tensor& x, double p, uint64_t seed, bool training) {
  TAPER_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability must be in [0, 1], got ", p);
  TAPER_CHECK(is_float(x.dtype()), "dropout: needs a float input, got ", dtype_name(x.dtype()));
  if (!training || p == 0.0) return x;
  if (p == 1.0) return x * 0.0;
  // Half types draw in f32, so the keep probability is not quantised to 2^-8 (bf16) steps.
  const DType ddt = stat_dtype(x.dtype());
  const Tensor u = Tensor::rand(x.shape(), ddt, x.device(), seed);
  const Tensor keep = u.ge(p);  // P(keep) = 1 - p
  return keep.where_cond(x * (1.0 / (1.0 - p)), 0.0);
}

Tensor causal_mask(size_t t, size_t s, DType dt, Device dev) {
  TAPER_CHECK(is_float(dt), "causal_mask: needs a float dtype, got ", dtype_name(dt));
  std::vector<float> m(t * s, 0.0f);
  // Query i sees keys up to i + (s - t): with a cache of s - t earlier keys, the diagonal moves.
  for (size_t i = 0; i < t; ++i)
    for (size_t j = 0; j < s; ++j)
      if (j + t > i + s) m[i * s + j] = -std::numeric_limits<float>::infinity();
  return Tensor::from_vector(m, Shape({t, s})).to_dtype(dt).to_device(dev);
}

Tensor padding_mask(const Tensor& attention_mask, DType dt) {
  TAPER_CHECK(attention_mask.rank() == 2, "padding_mask: attention mask must be (B, S), got ",
              attention_mask.shape().to_string());
  TAPER_CHECK(is_float(dt), "padding_mask: needs a float dtype, got ", dtype_name(dt));
  double big = -1e9;
  if (dt == DType::F16) big = -65504.0;
  if (dt == DType::BF16) big = -3.3895313892515355e38;  // lowest finite bf16
  const DType cdt = stat_dtype(dt);
  const Tensor m = attention_mask.to_dtype(cdt);
  const Tensor add = (1.0 - m) * big;
  return add.to_dtype(dt).reshape(
      Shape({attention_mask.dim(0), 1, 1, attention_mask.dim(1)}));
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& mask, bool causal, double dropout_p,
                                    uint64_t dropout_seed) {
  TAPER_CHECK(q.rank() == 4 && k.rank() == 4 && v.rank() == 4,
              "scaled_dot_product_attention: q, k, v must be (B, H, T, D), got ",
              q.shape().to_string(), ", ", k.shape().to_string(), ", ", v.shape().to_string());
  TAPER_CHECK(q.dim(3) == k.dim(3) && k.dim(2) == v.dim(2),
              "scaled_dot_product_attention: q ", q.shape().to_string(), ", k ",
              k.shape().to_string(), ", v ", v.shape().to_string(), " do not fit together");
  const size_t d = q.dim(3), t = q.dim(2), s = k.dim(2);
  const double scale = d ? 1.0 / std::sqrt(static_cast<double>(d)) : 1.0;
  // Without dropout, the fused op: no (B, H, T, S) tensor is kept for the backward (the causal
  // mask folds into the additive mask). A mask that does not broadcast to (B, H, T, S) by
  // itself (or v with its own head size) takes the path below, and so does a device with no
  // attention kernel: matmuls in the input dtype and the fused softmax are faster there than the
  // op's composed form (f32 scores, softmax from primitives), which is its reference.
  const bool mask_fits =
      !mask.defined() || broadcasts_to(mask.shape(), Shape({q.dim(0), q.dim(1), t, s}));
  if (!(dropout_p > 0.0) && v.dim(3) == d && k.dim(0) == q.dim(0) && k.dim(1) == q.dim(1) &&
      runs_kernel(OpId::attention, q.device(), q.dtype()) && mask_fits) {
    Tensor m = mask.defined() ? mask.to_dtype(q.dtype()) : Tensor();
    if (causal) {
      const Tensor c = causal_mask(t, s, q.dtype(), q.device());
      m = m.defined() ? m + c : c;
    }
    return ops::attention(q, k, v, m, scale);
  }
  Tensor scores = (q * scale).matmul(k.transpose(-2, -1));  // (B, H, T, S)
  if (mask.defined()) scores = scores + mask.to_dtype(scores.dtype());
  if (causal) scores = scores + causal_mask(t, s, scores.dtype(), scores.device());
  Tensor w = ops::softmax_last_dim(scores);
  if (dropout_p > 0.0) w = dropout(w, dropout_p, dropout_seed, true);
  return w.matmul(v);
}

}  // namespace taper::nn::functional
