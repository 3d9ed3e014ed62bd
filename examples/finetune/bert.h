// bert.h: BERT (HF's BertModel layout) built from taper's nn layers, as all-MiniLM-L6-v2 uses it,
// and sentence-transformers' pooling (mean over the attention mask, then L2 normalisation).
//
// What it is: embeddings (word + position + token type, LayerNorm, dropout), N post-LN encoder
// layers (nn::TransformerEncoderLayer, exact-erf GELU), loading by name from a HuggingFace
// safetensors file (keys `embeddings.word_embeddings.weight`, `encoder.layer.0.attention.self.
// query.weight`, ...; a `bert.` prefix is accepted too), in f32 or bf16.
// What it is not: the pooler (BertPooler, unused by sentence-transformers: its keys are ignored
// on load), pair inputs (token type ids are all 0), or a tokenizer (tokenizer.h).
// Shape letters: B batch, T tokens, E hidden size.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "taper/nn/attention.h"
#include "taper/nn/layers.h"
#include "taper/nn/module.h"

namespace taper::finetune {

/// The hyper-parameters of config.json that the model needs.
struct BertConfig {
  size_t vocab_size = 30522;
  size_t hidden_size = 384;
  size_t num_hidden_layers = 6;
  size_t num_attention_heads = 12;
  size_t intermediate_size = 1536;
  size_t max_position_embeddings = 512;
  size_t type_vocab_size = 2;
  double layer_norm_eps = 1e-12;
  double hidden_dropout_prob = 0.1;
  /// Attention-probability dropout. Off by default in this example: nn::MultiHeadAttention's
  /// mask counter cannot be restored, so a resumed run would not be exact with it on.
  double attention_probs_dropout_prob = 0.0;

  /// Reads a HuggingFace config.json (a flat object of numbers and strings). Throws
  /// taper::Error naming the file when it is missing, not a BERT config (model_type "bert",
  /// hidden_act "gelu", absolute positions), or lacks a size.
  static BertConfig from_json_file(const std::filesystem::path& path);
  /// all-MiniLM-L6-v2's values (the defaults above).
  static BertConfig minilm_l6() { return BertConfig(); }
};

/// BERT's encoder. Parameter names are those of HF's BertModel without the pooler.
class BertModel : public nn::Module {
 public:
  explicit BertModel(const BertConfig& config, DType dtype = DType::F32);

  /// Loads `model.safetensors` (and checks it against the config by shape): every parameter must
  /// be present, under its own name or with a `bert.` prefix; the pooler and
  /// `embeddings.position_ids` are ignored, any other extra key is an error. Converts the file's
  /// dtype to the model's. Throws taper::Error naming the file and keys.
  void load_pretrained(const std::filesystem::path& safetensors_path);
  /// A model built from `dir/config.json` and loaded from `dir/model.safetensors`. Throws
  /// taper::Error naming the missing file and `scripts/fetch_model.sh` when one is absent.
  static std::shared_ptr<BertModel> from_pretrained(const std::filesystem::path& dir,
                                                    DType dtype = DType::F32);

  /// ids: (B, T) u32 or i64 -> last hidden state (B, T, E), every token attended.
  Tensor forward(const Tensor& ids) override;
  /// ids: (B, T); attention_mask: (B, T), 1 for real tokens and 0 for padding (any dtype), or
  /// undefined -> last hidden state (B, T, E).
  Tensor forward(const Tensor& ids, const Tensor& attention_mask);
  /// The embedding block's output followed by every layer's output: num_hidden_layers + 1
  /// tensors (B, T, E), as HF's `output_hidden_states`.
  std::vector<Tensor> hidden_states(const Tensor& ids, const Tensor& attention_mask);
  /// word + position + token-type(0) embeddings, LayerNorm, dropout. ids: (B, T) -> (B, T, E).
  Tensor embed(const Tensor& ids);
  /// sentence-transformers' sentence embedding: l2_normalize(mean_pool(forward(ids, mask), mask)).
  /// -> (B, E).
  Tensor encode(const Tensor& ids, const Tensor& attention_mask);

  const BertConfig& config() const { return config_; }
  DType dtype() const { return dtype_; }
  /// Number of training-mode dropout masks drawn per forward (to resume a run exactly).
  std::vector<std::shared_ptr<nn::Dropout>> dropouts() const;

  std::shared_ptr<nn::Embedding> word_embeddings, position_embeddings, token_type_embeddings;
  std::shared_ptr<nn::LayerNorm> embeddings_norm;  ///< embeddings.LayerNorm
  std::shared_ptr<nn::Dropout> embeddings_dropout;
  std::vector<std::shared_ptr<nn::TransformerEncoderLayer>> layers;  ///< encoder.layer.N

 private:
  Tensor additive_mask(const Tensor& attention_mask, size_t b, size_t t) const;
  BertConfig config_;
  DType dtype_;
};

/// Mean of `hidden` (B, T, E) over the positions where `attention_mask` (B, T) is 1, as
/// sentence-transformers' Pooling(mode mean): sum(h * m) / max(sum(m), 1e-9). -> (B, E).
Tensor mean_pool(const Tensor& hidden, const Tensor& attention_mask);
/// x / max(||x||_2, 1e-12) over the last dim (torch.nn.functional.normalize). x: (B, E).
Tensor l2_normalize(const Tensor& x);

/// The BertModel's name under which a checkpoint key `key` of a HF file is loaded ("" to skip).
std::string bert_key_from_hf(const std::string& key);

}  // namespace taper::finetune
