// attention.h: MultiHeadAttention and TransformerEncoderLayer.
//
// What it is: the attention block and the encoder layer of BERT, with BERT's parameter names so
// a HuggingFace BERT checkpoint loads by name:
//   MultiHeadAttention:  self.query, self.key, self.value, output.dense   (each .weight, .bias)
//   TransformerEncoderLayer:
//     attention.self.{query,key,value}, attention.output.dense, attention.output.LayerNorm,
//     intermediate.dense, output.dense, output.LayerNorm
// (HF's BertLayer; `encoder.layer.N.` in front of each inside a BertModel).
// What it is not: embeddings, pooling or a whole model (those are built from these).
// Shape letters: B batch, T query length, S key length, H heads, D head dim, E model dim.
#pragma once

#include <cstdint>

#include "taper/nn/layers.h"

namespace taper::nn {

/// Options of `MultiHeadAttention`.
struct MultiHeadAttentionOptions {
  MultiHeadAttentionOptions(size_t embed_dim, size_t num_heads)
      : embed_dim_(embed_dim), num_heads_(num_heads) {}
  TAPER_ARG(size_t, embed_dim);
  TAPER_ARG(size_t, num_heads);
  /// Biases on the four projections.
  TAPER_ARG(bool, bias) = true;
  /// Dropout on the attention weights (training mode only).
  TAPER_ARG(double, dropout) = 0.0;
  /// Mask out keys after the query position (decoder-style).
  TAPER_ARG(bool, causal) = false;
  TAPER_ARG(DType, dtype) = DType::F32;
};

/// Multi-head attention with q, k, v and output projections; scale 1/sqrt(D); the softmax is
/// the fused `ops::softmax_last_dim`.
class MultiHeadAttention : public Module {
 public:
  explicit MultiHeadAttention(const MultiHeadAttentionOptions& options);
  /// Self-attention without a mask. x: (B, T, E) -> (B, T, E).
  Tensor forward(const Tensor& x) override;
  /// query: (B, T, E), key/value: (B, S, E); mask additive, broadcastable to (B, H, T, S)
  /// (e.g. `functional::padding_mask`), or undefined. -> (B, T, E).
  Tensor forward(const Tensor& query, const Tensor& key, const Tensor& value,
                 const Tensor& mask = Tensor());
  /// Self-attention with a mask.
  Tensor forward(const Tensor& x, const Tensor& mask) { return forward(x, x, x, mask); }
  using Module::operator();
  Tensor operator()(const Tensor& x, const Tensor& mask) { return forward(x, x, x, mask); }
  const MultiHeadAttentionOptions& options() const { return options_; }

  std::shared_ptr<Linear> query, key, value, out;

 private:
  MultiHeadAttentionOptions options_;
  uint64_t dropout_seed_;
  uint64_t calls_ = 0;
};

/// The feed-forward activation of `TransformerEncoderLayer`.
enum class Activation { Gelu, GeluTanh, Relu };

/// Options of `TransformerEncoderLayer`.
struct TransformerEncoderLayerOptions {
  TransformerEncoderLayerOptions(size_t d_model, size_t nhead)
      : d_model_(d_model), nhead_(nhead), dim_feedforward_(4 * d_model) {}
  TAPER_ARG(size_t, d_model);
  TAPER_ARG(size_t, nhead);
  TAPER_ARG(size_t, dim_feedforward);
  /// Dropout after attention and after the feed-forward block (hidden_dropout_prob in BERT).
  TAPER_ARG(double, dropout) = 0.1;
  /// Dropout on the attention weights (attention_probs_dropout_prob in BERT).
  TAPER_ARG(double, attention_dropout) = 0.1;
  TAPER_ARG(double, layer_norm_eps) = 1e-5;
  TAPER_ARG(Activation, activation) = Activation::Gelu;
  /// Pre-LN (norm before each block) instead of BERT's post-LN.
  TAPER_ARG(bool, norm_first) = false;
  TAPER_ARG(bool, causal) = false;
  TAPER_ARG(DType, dtype) = DType::F32;
};

/// A transformer encoder layer (BERT's BertLayer).
///   post-LN: x = LN1(x + drop(attn(x))); x = LN2(x + drop(W2 act(W1 x)))
///   pre-LN:  x = x + drop(attn(LN1(x))); x = x + drop(W2 act(W1 LN2(x)))
class TransformerEncoderLayer : public Module {
 public:
  explicit TransformerEncoderLayer(const TransformerEncoderLayerOptions& options);
  /// x: (B, T, E) -> (B, T, E).
  Tensor forward(const Tensor& x) override { return forward(x, Tensor()); }
  /// mask: additive, broadcastable to (B, H, T, T), or undefined.
  Tensor forward(const Tensor& x, const Tensor& mask);
  using Module::operator();
  Tensor operator()(const Tensor& x, const Tensor& mask) { return forward(x, mask); }
  const TransformerEncoderLayerOptions& options() const { return options_; }

  std::shared_ptr<MultiHeadAttention> attention;
  std::shared_ptr<LayerNorm> attention_norm;  ///< attention.output.LayerNorm
  std::shared_ptr<Linear> intermediate;       ///< intermediate.dense
  std::shared_ptr<Linear> output;             ///< output.dense
  std::shared_ptr<LayerNorm> output_norm;     ///< output.LayerNorm
  std::shared_ptr<Dropout> dropout1, dropout2;

 private:
  Tensor activation(const Tensor& x) const;
  TransformerEncoderLayerOptions options_;
};

}  // namespace taper::nn
