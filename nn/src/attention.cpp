// attention.cpp: MultiHeadAttention and TransformerEncoderLayer (BERT's layout and names).
#include "taper/nn/attention.h"

#include "seed_mix.h"
#include "taper/nn/functional.h"

namespace taper::nn {

MultiHeadAttention::MultiHeadAttention(const MultiHeadAttentionOptions& o)
    : Module("MultiHeadAttention"), options_(o), dropout_seed_(next_seed()) {
  TAPER_CHECK(o.num_heads() > 0 && o.embed_dim() % o.num_heads() == 0,
              "MultiHeadAttention: embed_dim ", o.embed_dim(), " is not a multiple of num_heads ",
              o.num_heads());
  TAPER_CHECK(o.dropout() >= 0.0 && o.dropout() <= 1.0,
              "MultiHeadAttention: dropout must be in [0, 1], got ", o.dropout());
  const LinearOptions lo = LinearOptions(o.embed_dim(), o.embed_dim()).bias(o.bias()).dtype(o.dtype());
  // BERT's names: BertAttention = self {query, key, value} + output {dense}.
  query = register_module("self.query", std::make_shared<Linear>(lo));
  key = register_module("self.key", std::make_shared<Linear>(lo));
  value = register_module("self.value", std::make_shared<Linear>(lo));
  out = register_module("output.dense", std::make_shared<Linear>(lo));
}

Tensor MultiHeadAttention::forward(const Tensor& x) { return forward(x, x, x, Tensor()); }

Tensor MultiHeadAttention::forward(const Tensor& query_in, const Tensor& key_in,
                                   const Tensor& value_in, const Tensor& mask) {
  const size_t e = options_.embed_dim(), h = options_.num_heads(), d = e / h;
  TAPER_CHECK(query_in.rank() == 3 && query_in.dim(2) == e && key_in.rank() == 3 &&
                  key_in.dim(2) == e && value_in.rank() == 3 && value_in.dim(2) == e &&
                  key_in.dim(0) == query_in.dim(0) && value_in.dim(0) == query_in.dim(0) &&
                  key_in.dim(1) == value_in.dim(1),
              "MultiHeadAttention(", e, ", ", h, "): query ", query_in.shape().to_string(),
              ", key ", key_in.shape().to_string(), ", value ", value_in.shape().to_string(),
              " must be (B, T, ", e, "), (B, S, ", e, "), (B, S, ", e, ")");
  const size_t b = query_in.dim(0), t = query_in.dim(1), s = key_in.dim(1);
  // (B, T, E) -> (B, H, T, D) as a view; the matmuls take the strides.
  auto heads = [&](const Tensor& x, size_t len) {
    return x.reshape(Shape({b, len, h, d})).permute({0, 2, 1, 3});
  };
  const Tensor q = heads(query->forward(query_in), t);
  const Tensor k = heads(key->forward(key_in), s);
  const Tensor v = heads(value->forward(value_in), s);
  double p = 0.0;
  uint64_t seed = 0;
  if (is_training() && options_.dropout() > 0.0) {
    p = options_.dropout();
    seed = detail::mix_seed(dropout_seed_ ^ detail::mix_seed(calls_++));
  }
  const Tensor o = functional::scaled_dot_product_attention(q, k, v, mask, options_.causal(), p, seed);
  return out->forward(o.permute({0, 2, 1, 3}).reshape(Shape({b, t, e})));
}

TransformerEncoderLayer::TransformerEncoderLayer(const TransformerEncoderLayerOptions& o)
    : Module("TransformerEncoderLayer"), options_(o) {
  const size_t e = o.d_model();
  attention = register_module(
      "attention", std::make_shared<MultiHeadAttention>(MultiHeadAttentionOptions(e, o.nhead())
                                                            .dropout(o.attention_dropout())
                                                            .causal(o.causal())
                                                            .dtype(o.dtype())));
  const LayerNormOptions ln = LayerNormOptions(e).eps(o.layer_norm_eps()).dtype(o.dtype());
  attention_norm = register_module("attention.output.LayerNorm", std::make_shared<LayerNorm>(ln));
  dropout1 = register_module("attention.output.dropout", std::make_shared<Dropout>(o.dropout()));
  intermediate = register_module(
      "intermediate.dense",
      std::make_shared<Linear>(LinearOptions(e, o.dim_feedforward()).dtype(o.dtype())));
  output = register_module(
      "output.dense",
      std::make_shared<Linear>(LinearOptions(o.dim_feedforward(), e).dtype(o.dtype())));
  output_norm = register_module("output.LayerNorm", std::make_shared<LayerNorm>(ln));
  dropout2 = register_module("output.dropout", std::make_shared<Dropout>(o.dropout()));
}

Tensor TransformerEncoderLayer::activation(const Tensor& x) const {
  switch (options_.activation()) {
    case Activation::GeluTanh: return x.gelu();
    case Activation::Relu: return x.relu();
    case Activation::Gelu: break;
  }
  return x.gelu_erf();
}

Tensor TransformerEncoderLayer::forward(const Tensor& x, const Tensor& mask) {
  auto ffn = [&](const Tensor& y) { return output->forward(activation(intermediate->forward(y))); };
  if (options_.norm_first()) {
    Tensor y = x + dropout1->forward(attention->forward(attention_norm->forward(x), mask));
    return y + dropout2->forward(ffn(output_norm->forward(y)));
  }
  Tensor y = attention_norm->forward(x + dropout1->forward(attention->forward(x, mask)));
  return output_norm->forward(y + dropout2->forward(ffn(y)));
}

}  // namespace taper::nn
