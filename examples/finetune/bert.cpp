// bert.cpp: BertModel (bert.h): config.json, loading by name, the forward and the pooling.
#include "examples/finetune/bert.h"

#include <cctype>
#include <fstream>
#include <sstream>
#include <unordered_set>

#include "taper/autograd.h"
#include "taper/error.h"
#include "taper/nn/functional.h"
#include "taper/nn/safetensors.h"
#include "taper/ops.h"

namespace taper::finetune {

namespace fs = std::filesystem;

namespace {

// The raw value of `"key": value` in a flat JSON object (a number, or a string without its
// quotes); empty when absent. config.json is flat, so no full JSON parser is needed here.
std::string json_raw(const std::string& text, const std::string& key) {
  const std::string quoted = "\"" + key + "\"";
  size_t at = 0;
  while ((at = text.find(quoted, at)) != std::string::npos) {
    size_t p = at + quoted.size();
    while (p < text.size() && std::isspace(static_cast<unsigned char>(text[p]))) ++p;
    if (p >= text.size() || text[p] != ':') {
      at = p;
      continue;
    }
    ++p;
    while (p < text.size() && std::isspace(static_cast<unsigned char>(text[p]))) ++p;
    if (p < text.size() && text[p] == '"') {
      const size_t end = text.find('"', p + 1);
      return end == std::string::npos ? std::string() : text.substr(p + 1, end - p - 1);
    }
    size_t end = p;
    while (end < text.size() && text[end] != ',' && text[end] != '}' &&
           !std::isspace(static_cast<unsigned char>(text[end])))
      ++end;
    return text.substr(p, end - p);
  }
  return {};
}

std::string missing_model_hint(const fs::path& file) {
  return "model file " + file.string() +
         " not found: fetch all-MiniLM-L6-v2 with `bash scripts/fetch_model.sh` (or pass "
         "--model-dir)";
}

}  // namespace

BertConfig BertConfig::from_json_file(const fs::path& path) {
  TAPER_CHECK(fs::exists(path), missing_model_hint(path));
  std::ifstream f(path);
  TAPER_CHECK(f.good(), "BertConfig: cannot read ", path.string());
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  auto size = [&](const char* key, size_t& out) {
    const std::string v = json_raw(text, key);
    TAPER_CHECK(!v.empty(), "BertConfig: ", path.string(), " has no \"", key, "\"");
    try {
      out = static_cast<size_t>(std::stoull(v));
    } catch (const std::exception&) {
      throw Error(detail::str_cat("BertConfig: ", path.string(), ": \"", key, "\" is '", v,
                                  "', not a size"));
    }
  };
  auto real = [&](const char* key, double& out) {
    const std::string v = json_raw(text, key);
    if (v.empty()) return;  // optional: keep the default
    try {
      out = std::stod(v);
    } catch (const std::exception&) {
      throw Error(detail::str_cat("BertConfig: ", path.string(), ": \"", key, "\" is '", v,
                                  "', not a number"));
    }
  };
  const std::string type = json_raw(text, "model_type");
  TAPER_CHECK(type == "bert", "BertConfig: ", path.string(), " is a '", type,
              "' config, not a BERT one (model_type \"bert\")");
  const std::string act = json_raw(text, "hidden_act");
  TAPER_CHECK(act.empty() || act == "gelu", "BertConfig: ", path.string(), ": hidden_act '", act,
              "' is not supported (only \"gelu\", the exact erf form)");
  const std::string pos = json_raw(text, "position_embedding_type");
  TAPER_CHECK(pos.empty() || pos == "absolute", "BertConfig: ", path.string(),
              ": position_embedding_type '", pos, "' is not supported (only \"absolute\")");
  BertConfig c;
  size("vocab_size", c.vocab_size);
  size("hidden_size", c.hidden_size);
  size("num_hidden_layers", c.num_hidden_layers);
  size("num_attention_heads", c.num_attention_heads);
  size("intermediate_size", c.intermediate_size);
  size("max_position_embeddings", c.max_position_embeddings);
  size("type_vocab_size", c.type_vocab_size);
  real("layer_norm_eps", c.layer_norm_eps);
  real("hidden_dropout_prob", c.hidden_dropout_prob);
  return c;
}

BertModel::BertModel(const BertConfig& c, DType dtype) : Module("BertModel"), config_(c), dtype_(dtype) {
  TAPER_CHECK(c.num_attention_heads > 0 && c.hidden_size % c.num_attention_heads == 0,
              "BertModel: hidden_size ", c.hidden_size, " is not a multiple of ",
              c.num_attention_heads, " heads");
  const size_t e = c.hidden_size;
  word_embeddings = register_module(
      "embeddings.word_embeddings",
      std::make_shared<nn::Embedding>(nn::EmbeddingOptions(c.vocab_size, e).dtype(dtype)));
  position_embeddings = register_module(
      "embeddings.position_embeddings",
      std::make_shared<nn::Embedding>(nn::EmbeddingOptions(c.max_position_embeddings, e).dtype(dtype)));
  token_type_embeddings = register_module(
      "embeddings.token_type_embeddings",
      std::make_shared<nn::Embedding>(nn::EmbeddingOptions(c.type_vocab_size, e).dtype(dtype)));
  embeddings_norm = register_module(
      "embeddings.LayerNorm",
      std::make_shared<nn::LayerNorm>(nn::LayerNormOptions(e).eps(c.layer_norm_eps).dtype(dtype)));
  embeddings_dropout =
      register_module("embeddings.dropout", std::make_shared<nn::Dropout>(c.hidden_dropout_prob));
  for (size_t i = 0; i < c.num_hidden_layers; ++i) {
    layers.push_back(register_module(
        "encoder.layer." + std::to_string(i),
        std::make_shared<nn::TransformerEncoderLayer>(
            nn::TransformerEncoderLayerOptions(e, c.num_attention_heads)
                .dim_feedforward(c.intermediate_size)
                .dropout(c.hidden_dropout_prob)
                .attention_dropout(c.attention_probs_dropout_prob)
                .layer_norm_eps(c.layer_norm_eps)
                .activation(nn::Activation::Gelu)
                .dtype(dtype))));
  }
}

std::string bert_key_from_hf(const std::string& key) {
  std::string k = key;
  if (k.rfind("bert.", 0) == 0) k = k.substr(5);
  // Not part of the encoder: HF's position_ids buffer (an arange) and the pooler, which
  // sentence-transformers' mean pooling does not use.
  if (k == "embeddings.position_ids" || k.rfind("pooler.", 0) == 0) return {};
  return k;
}

void BertModel::load_pretrained(const fs::path& path) {
  TAPER_CHECK(fs::exists(path), missing_model_hint(path));
  const safetensors::File file = safetensors::File::open(path.string());
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const std::string& key : file.names()) {
    const std::string k = bert_key_from_hf(key);
    if (!k.empty()) tensors.emplace_back(k, file.get(key));
  }
  // Strict: a missing encoder weight, or a key of some other architecture, is an error.
  // (Appended rather than `"'" + ... + "'"`: GCC 12 warns falsely (-Wrestrict) on the latter.)
  std::string source = "'";
  source.append(path.string()).append("'");
  load_state_dict(tensors, nn::LoadOptions().strict(true).convert_dtype(true), source);
}

std::shared_ptr<BertModel> BertModel::from_pretrained(const fs::path& dir, DType dtype) {
  const fs::path weights = dir / "model.safetensors";
  TAPER_CHECK(fs::exists(weights), missing_model_hint(weights));
  auto model = std::make_shared<BertModel>(BertConfig::from_json_file(dir / "config.json"), dtype);
  model->load_pretrained(weights);
  model->eval();  // as HuggingFace's from_pretrained: dropout off until the caller says train()
  return model;
}

std::vector<std::shared_ptr<nn::Dropout>> BertModel::dropouts() const {
  std::vector<std::shared_ptr<nn::Dropout>> out{embeddings_dropout};
  for (const auto& l : layers) {
    out.push_back(l->dropout1);
    out.push_back(l->dropout2);
  }
  return out;
}

Tensor BertModel::embed(const Tensor& ids) {
  TAPER_CHECK(ids.rank() == 2, "BertModel: ids must be (B, T), got ", ids.shape().to_string());
  const size_t t = ids.dim(1);
  TAPER_CHECK(t <= config_.max_position_embeddings, "BertModel: ", t,
              " tokens exceed max_position_embeddings ", config_.max_position_embeddings);
  // Positions 0..T-1 and token type 0 are the first rows of their tables: narrow views that
  // broadcast over the batch (no index tensors to build).
  const Tensor words = word_embeddings->forward(ids);                         // (B, T, E)
  const Tensor types = token_type_embeddings->weight.narrow(0, 0, 1);         // (1, E)
  const Tensor pos = position_embeddings->weight.narrow(0, 0, t);             // (T, E)
  const Tensor x = (words + types) + pos;
  return embeddings_dropout->forward(embeddings_norm->forward(x));
}

Tensor BertModel::additive_mask(const Tensor& attention_mask, size_t b, size_t t) const {
  if (!attention_mask.defined()) return Tensor();
  TAPER_CHECK(attention_mask.rank() == 2 && attention_mask.dim(0) == b && attention_mask.dim(1) == t,
              "BertModel: attention mask ", attention_mask.shape().to_string(), " must be (", b,
              ", ", t, ")");
  return nn::functional::padding_mask(attention_mask, dtype_);  // (B, 1, 1, T)
}

Tensor BertModel::forward(const Tensor& ids) { return forward(ids, Tensor()); }

Tensor BertModel::forward(const Tensor& ids, const Tensor& attention_mask) {
  Tensor h = embed(ids);
  const Tensor mask = additive_mask(attention_mask, ids.dim(0), ids.dim(1));
  for (auto& layer : layers) h = layer->forward(h, mask);
  return h;
}

std::vector<Tensor> BertModel::hidden_states(const Tensor& ids, const Tensor& attention_mask) {
  std::vector<Tensor> out{embed(ids)};
  const Tensor mask = additive_mask(attention_mask, ids.dim(0), ids.dim(1));
  for (auto& layer : layers) out.push_back(layer->forward(out.back(), mask));
  return out;
}

Tensor BertModel::encode(const Tensor& ids, const Tensor& attention_mask) {
  const Tensor mask = attention_mask.defined()
                          ? attention_mask
                          : Tensor::ones(ids.shape(), DType::F32, ids.device());
  return l2_normalize(mean_pool(forward(ids, attention_mask), mask));
}

Tensor mean_pool(const Tensor& hidden, const Tensor& attention_mask) {
  TAPER_CHECK(hidden.rank() == 3 && attention_mask.rank() == 2 &&
                  attention_mask.dim(0) == hidden.dim(0) && attention_mask.dim(1) == hidden.dim(1),
              "mean_pool: hidden ", hidden.shape().to_string(), " and mask ",
              attention_mask.shape().to_string(), " must be (B, T, E) and (B, T)");
  const Tensor m = attention_mask.to_dtype(hidden.dtype()).unsqueeze(-1);  // (B, T, 1)
  const Tensor sum = (hidden * m).sum({1});                                // (B, E)
  const Tensor count = m.sum({1}).clamp(1e-9, 1e30);                       // (B, 1)
  return sum / count;
}

Tensor l2_normalize(const Tensor& x) {
  const Tensor norm = x.sqr().sum({-1}, /*keepdim=*/true).sqrt().clamp(1e-12, 1e30);
  return x / norm;
}

}  // namespace taper::finetune
