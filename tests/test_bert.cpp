// test_bert.cpp: the BertModel of the fine-tuning example (examples/finetune/bert.h) and its
// data side (examples/finetune/data.h).
//
// Parity (needs the model: bash scripts/fetch_model.sh; skips without it): the sentence
// embeddings of tests/data/embedding_reference.txt (sentence-transformers, written once by
// scripts/make_reference.py) to cosine >= 0.9999 in f32, one sentence at a time and as one
// padded batch; the hidden states of "Short." after the embedding block and after the last
// layer; bf16 to a looser cosine. Without a download: a small random BERT (names, loading by
// name with HF's extra keys, padding invariance, gradients reaching every parameter), the
// config reader's errors, and the passage cutting, split and batch order of data.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "examples/finetune/bert.h"
#include "examples/finetune/data.h"
#include "taper/nn/safetensors.h"
#include "taper/taper.h"

namespace {

namespace fs = std::filesystem;
using namespace taper;
using taper::finetune::BatchOrder;
using taper::finetune::BertConfig;
using taper::finetune::BertModel;

fs::path test_data_dir() { return fs::path(__FILE__).parent_path() / "data"; }

fs::path model_dir() {
  if (const char* env = std::getenv("TAPER_MODEL_DIR")) return fs::path(env);
  return fs::path(__FILE__).parent_path().parent_path() / ".models/all-MiniLM-L6-v2";
}

// The pretrained model in `dt`, loaded once per dtype; nullptr when it has not been fetched.
BertModel* pretrained(DType dt) {
  static std::shared_ptr<BertModel> f32, bf16;
  std::shared_ptr<BertModel>& m = dt == DType::F32 ? f32 : bf16;
  if (!m && fs::exists(model_dir() / "model.safetensors")) {
    m = BertModel::from_pretrained(model_dir(), dt);  // in eval mode (tested below)
  }
  return m.get();
}

#define REQUIRE_MODEL(dt)                                                                        \
  BertModel* model = pretrained(dt);                                                            \
  if (!model)                                                                                   \
  GTEST_SKIP() << "no model at " << model_dir() << ": run `bash scripts/fetch_model.sh`"

struct RefSentence {
  std::string text;
  std::vector<uint32_t> ids;
  std::vector<double> embedding;
};

struct Reference {
  std::vector<RefSentence> sentences;
  std::vector<double> hidden_embeddings, hidden_last;  // "Short.": (4, 384) row-major
  size_t hidden_rows = 0, hidden_cols = 0;
};

const Reference& reference() {
  static const Reference ref = [] {
    Reference r;
    std::ifstream f(test_data_dir() / "embedding_reference.txt");
    std::vector<double>* matrix = nullptr;
    size_t rows_left = 0;
    for (std::string line; std::getline(f, line);) {
      if (line.empty() || line[0] == '#') continue;
      std::istringstream in(line);
      if (rows_left > 0) {
        for (double v; in >> v;) matrix->push_back(v);
        --rows_left;
        continue;
      }
      std::string key;
      in >> key;
      if (key == "sentence_hex") {
        std::string hex, text;
        in >> hex;
        for (size_t i = 0; i + 1 < hex.size(); i += 2)
          text.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
        r.sentences.push_back(RefSentence{text, {}, {}});
      } else if (key == "ids") {
        for (unsigned long v; in >> v;) r.sentences.back().ids.push_back(static_cast<uint32_t>(v));
      } else if (key == "embedding") {
        for (double v; in >> v;) r.sentences.back().embedding.push_back(v);
      } else if (key == "hidden_embeddings" || key == "hidden_last") {
        in >> r.hidden_rows >> r.hidden_cols;
        matrix = key == "hidden_embeddings" ? &r.hidden_embeddings : &r.hidden_last;
        rows_left = r.hidden_rows;
      }
    }
    return r;
  }();
  return ref;
}

double cosine(const std::vector<double>& a, const std::vector<double>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    ab += a[i] * b[i];
    aa += a[i] * a[i];
    bb += b[i] * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

std::vector<double> as_doubles(const Tensor& t) { return t.to_vector<double>(); }

// One sentence's ids as a (1, T) u32 tensor.
Tensor ids_tensor(const std::vector<uint32_t>& ids) {
  return Tensor::from_vector(ids, Shape({1, ids.size()}));
}

// A padded (B, T) batch of the reference ids and its mask.
std::pair<Tensor, Tensor> padded_batch(const std::vector<RefSentence>& ss) {
  size_t t = 0;
  for (const auto& s : ss) t = std::max(t, s.ids.size());
  std::vector<uint32_t> ids(ss.size() * t, 0);
  std::vector<uint8_t> mask(ss.size() * t, 0);
  for (size_t r = 0; r < ss.size(); ++r)
    for (size_t j = 0; j < ss[r].ids.size(); ++j) {
      ids[r * t + j] = ss[r].ids[j];
      mask[r * t + j] = 1;
    }
  return {Tensor::from_vector(ids, Shape({ss.size(), t})),
          Tensor::from_vector(mask, Shape({ss.size(), t}))};
}

// ---- parity with sentence-transformers ------------------------------------------------------------

TEST(BertParity, ReferenceFileIsComplete) {
  const Reference& r = reference();
  ASSERT_EQ(r.sentences.size(), 8u);
  for (const auto& s : r.sentences) {
    EXPECT_GE(s.ids.size(), 3u) << s.text;
    EXPECT_EQ(s.embedding.size(), 384u) << s.text;
  }
  EXPECT_EQ(r.hidden_rows, 4u);
  EXPECT_EQ(r.hidden_embeddings.size(), 4u * 384u);
  EXPECT_EQ(r.hidden_last.size(), 4u * 384u);
}

// from_pretrained returns the model in eval mode, as HuggingFace's does: dropout off, so a
// freshly loaded model embeds the same sentence the same way twice (the parity tests below rely
// on it too: they never call eval()).
TEST(BertParity, FromPretrainedIsInEvalMode) {
  REQUIRE_MODEL(DType::F32);
  EXPECT_FALSE(model->is_training());
  NoGradGuard ng;
  const RefSentence& s = reference().sentences.at(0);
  const Tensor mask = Tensor::ones(ids_tensor(s.ids).shape(), DType::U8);
  EXPECT_EQ(as_doubles(model->encode(ids_tensor(s.ids), mask)),
            as_doubles(model->encode(ids_tensor(s.ids), mask)));
}

TEST(BertParity, SentenceEmbeddingsOneByOneF32) {
  REQUIRE_MODEL(DType::F32);
  NoGradGuard ng;
  for (const RefSentence& s : reference().sentences) {
    const Tensor ids = ids_tensor(s.ids);
    const Tensor mask = Tensor::ones(ids.shape(), DType::U8);
    const Tensor e = model->encode(ids, mask);
    ASSERT_EQ(e.dims(), (std::vector<size_t>{1, 384}));
    const std::vector<double> got = as_doubles(e);
    EXPECT_GE(cosine(got, s.embedding), 0.9999) << s.text;
    double max_err = 0;
    for (size_t i = 0; i < got.size(); ++i) max_err = std::max(max_err, std::abs(got[i] - s.embedding[i]));
    // Unit vectors with components ~0.05; taper is at ~1.3e-7 (f32 rounding), tanh-GELU at 3e-4.
    EXPECT_LT(max_err, 1e-5) << s.text;
  }
}

TEST(BertParity, SentenceEmbeddingsPaddedBatchF32) {
  REQUIRE_MODEL(DType::F32);
  NoGradGuard ng;
  const auto& ss = reference().sentences;
  const auto [ids, mask] = padded_batch(ss);
  const std::vector<double> got = as_doubles(model->encode(ids, mask));
  for (size_t r = 0; r < ss.size(); ++r) {
    const std::vector<double> row(got.begin() + r * 384, got.begin() + (r + 1) * 384);
    EXPECT_GE(cosine(row, ss[r].embedding), 0.9999) << ss[r].text;
  }
}

// Layer by layer for "Short.": the embedding block's output and the last layer's output.
TEST(BertParity, HiddenStatesOfShortF32) {
  REQUIRE_MODEL(DType::F32);
  NoGradGuard ng;
  const Reference& ref = reference();
  const auto it = std::find_if(ref.sentences.begin(), ref.sentences.end(),
                               [](const RefSentence& s) { return s.text == "Short."; });
  ASSERT_NE(it, ref.sentences.end());
  ASSERT_EQ(it->ids.size(), ref.hidden_rows);
  const Tensor ids = ids_tensor(it->ids);
  const std::vector<Tensor> hs = model->hidden_states(ids, Tensor::ones(ids.shape(), DType::U8));
  ASSERT_EQ(hs.size(), 7u);
  auto check = [&](const Tensor& h, const std::vector<double>& want, const char* what, double atol) {
    ASSERT_EQ(h.dims(), (std::vector<size_t>{1, ref.hidden_rows, ref.hidden_cols})) << what;
    const std::vector<double> got = as_doubles(h);
    double max_err = 0;
    for (size_t i = 0; i < got.size(); ++i) max_err = std::max(max_err, std::abs(got[i] - want[i]));
    EXPECT_LT(max_err, atol) << what;
    for (size_t r = 0; r < ref.hidden_rows; ++r) {
      const std::vector<double> a(got.begin() + r * ref.hidden_cols, got.begin() + (r + 1) * ref.hidden_cols);
      const std::vector<double> b(want.begin() + r * ref.hidden_cols, want.begin() + (r + 1) * ref.hidden_cols);
      EXPECT_GE(cosine(a, b), 0.99999) << what << " token " << r;
    }
  };
  // Observed: 4.8e-7 and 1.5e-6 (values of magnitude ~1); tanh-GELU would give 1.9e-3.
  check(hs.front(), ref.hidden_embeddings, "after the embedding LayerNorm", 1e-5);
  check(hs.back(), ref.hidden_last, "after the last layer", 5e-5);
  // forward() is the last hidden state.
  EXPECT_EQ(as_doubles(model->forward(ids)), as_doubles(hs.back()));
}

TEST(BertParity, SentenceEmbeddingsBF16) {
  REQUIRE_MODEL(DType::BF16);
  NoGradGuard ng;
  EXPECT_EQ(model->word_embeddings->weight.dtype(), DType::BF16);
  const auto& ss = reference().sentences;
  const auto [ids, mask] = padded_batch(ss);
  const Tensor e = model->encode(ids, mask);
  EXPECT_EQ(e.dtype(), DType::BF16);
  const std::vector<double> got = as_doubles(e);
  for (size_t r = 0; r < ss.size(); ++r) {
    const std::vector<double> row(got.begin() + r * 384, got.begin() + (r + 1) * 384);
    // bf16 keeps 8 significant bits through 6 layers; the direction survives (1 - cos ~8e-5).
    EXPECT_GE(cosine(row, ss[r].embedding), 0.999) << ss[r].text;
  }
}

// ---- without the download: a small random BERT ---------------------------------------------------

BertConfig tiny_config() {
  BertConfig c;
  c.vocab_size = 50;
  c.hidden_size = 16;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.intermediate_size = 32;
  c.max_position_embeddings = 12;
  c.hidden_dropout_prob = 0.0;
  return c;
}

TEST(BertModel, ParameterNamesAreHuggingFaces) {
  nn::manual_seed(3);
  BertModel m(tiny_config());
  std::set<std::string> names;
  for (const auto& [n, p] : m.named_parameters()) names.insert(n);
  EXPECT_EQ(names.size(), 5u + 16u * 2u);
  for (const char* n : {"embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
                        "embeddings.token_type_embeddings.weight", "embeddings.LayerNorm.weight",
                        "embeddings.LayerNorm.bias", "encoder.layer.0.attention.self.query.weight",
                        "encoder.layer.0.attention.self.key.bias",
                        "encoder.layer.0.attention.self.value.weight",
                        "encoder.layer.0.attention.output.dense.weight",
                        "encoder.layer.0.attention.output.LayerNorm.weight",
                        "encoder.layer.1.intermediate.dense.weight", "encoder.layer.1.output.dense.bias",
                        "encoder.layer.1.output.LayerNorm.bias"})
    EXPECT_TRUE(names.count(n)) << n;
  EXPECT_EQ(m.parameter("encoder.layer.1.intermediate.dense.weight").dims(),
            (std::vector<size_t>{32, 16}));
}

// A file as HF writes it (`bert.` prefix, the pooler, the position_ids buffer) loads by name;
// an unknown key or a missing weight is an error naming it.
TEST(BertModel, LoadsHuggingFaceKeysByName) {
  nn::manual_seed(4);
  BertModel src(tiny_config());
  std::vector<std::pair<std::string, Tensor>> file;
  for (const auto& [n, t] : src.state_dict()) file.emplace_back("bert." + n, t);
  file.emplace_back("bert.embeddings.position_ids",
                    Tensor::arange(0, 12, 1, DType::I64).reshape(Shape({1, 12})));
  file.emplace_back("bert.pooler.dense.weight", Tensor::zeros({16, 16}, DType::F32));
  file.emplace_back("bert.pooler.dense.bias", Tensor::zeros({16}, DType::F32));
  const fs::path dir = fs::temp_directory_path() / ("taper_bert_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path path = dir / "model.safetensors";
  safetensors::save(file, path.string());

  nn::manual_seed(5);
  BertModel dst(tiny_config(), DType::F64);  // converts F32 -> F64 on load
  dst.load_pretrained(path);
  for (const auto& [n, p] : dst.named_parameters()) {
    EXPECT_EQ(p.dtype(), DType::F64) << n;
    EXPECT_EQ(as_doubles(p), as_doubles(src.parameter(n))) << n;
  }

  auto expect_error = [&](const std::vector<std::pair<std::string, Tensor>>& tensors, const char* needle) {
    safetensors::save(tensors, path.string());
    BertModel m(tiny_config());
    try {
      m.load_pretrained(path);
      ADD_FAILURE() << "no error; expected one naming " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto extra = file;
  extra.emplace_back("cls.predictions.bias", Tensor::zeros({50}, DType::F32));
  expect_error(extra, "cls.predictions.bias");
  auto missing = file;
  missing.erase(std::remove_if(missing.begin(), missing.end(),
                               [](const auto& kv) { return kv.first == "bert.encoder.layer.1.output.dense.weight"; }),
                missing.end());
  expect_error(missing, "encoder.layer.1.output.dense.weight");
  fs::remove_all(dir);

  try {
    BertModel::from_pretrained(dir);
    ADD_FAILURE() << "no error for a missing model folder";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scripts/fetch_model.sh"), std::string::npos) << e.what();
  }
}

// Padding positions change neither the real tokens' states nor the pooled embedding.
TEST(BertModel, PaddingDoesNotChangeTheEmbedding) {
  nn::manual_seed(6);
  BertModel m(tiny_config(), DType::F64);
  m.eval();
  NoGradGuard ng;
  const std::vector<uint32_t> short_ids = {1, 7, 9, 2};
  const std::vector<uint32_t> padded_ids = {1, 7, 9, 2, 0, 0, 0};
  const Tensor a = m.encode(ids_tensor(short_ids), Tensor::ones({1, 4}, DType::U8));
  const Tensor b = m.encode(ids_tensor(padded_ids),
                            Tensor::from_vector(std::vector<uint8_t>{1, 1, 1, 1, 0, 0, 0}, Shape({1, 7})));
  const std::vector<double> va = as_doubles(a), vb = as_doubles(b);
  ASSERT_EQ(va.size(), 16u);
  double norm = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    EXPECT_NEAR(va[i], vb[i], 1e-12) << i;
    norm += va[i] * va[i];
  }
  EXPECT_NEAR(norm, 1.0, 1e-12);  // L2-normalised
  // Without a mask every token counts: a different embedding.
  const std::vector<double> vc = as_doubles(m.encode(ids_tensor(padded_ids), Tensor()));
  double diff = 0;
  for (size_t i = 0; i < va.size(); ++i) diff = std::max(diff, std::abs(va[i] - vc[i]));
  EXPECT_GT(diff, 1e-3);
}

TEST(BertModel, GradientsReachEveryParameter) {
  nn::manual_seed(7);
  BertModel m(tiny_config());
  m.train();
  const Tensor ids = Tensor::from_vector(std::vector<uint32_t>{1, 5, 6, 2, 1, 8, 2, 0}, Shape({2, 4}));
  const Tensor mask = Tensor::from_vector(std::vector<uint8_t>{1, 1, 1, 1, 1, 1, 1, 0}, Shape({2, 4}));
  const Tensor target = Tensor::randn({2, 16}, DType::F32, Device::cpu(), 9);
  const GradStore g = (m.encode(ids, mask) * target).sum_all().backward();
  for (const auto& [n, p] : m.named_parameters()) {
    const auto grad = g.get(p);
    ASSERT_TRUE(grad.has_value()) << n;
    EXPECT_EQ(grad->dims(), p.dims()) << n;
    double mx = 0;
    for (double v : as_doubles(*grad)) {
      ASSERT_TRUE(std::isfinite(v)) << n;
      mx = std::max(mx, std::abs(v));
    }
    EXPECT_GT(mx, 0.0) << n;
  }
}

TEST(BertModel, MeanPoolAndNormalize) {
  const Tensor h = Tensor::from_vector(std::vector<double>{1, 2, 3, 4, 100, 100}, Shape({1, 3, 2}));
  const Tensor m = Tensor::from_vector(std::vector<uint8_t>{1, 1, 0}, Shape({1, 3}));
  EXPECT_EQ(as_doubles(finetune::mean_pool(h, m)), (std::vector<double>{2, 3}));
  const std::vector<double> n = as_doubles(finetune::l2_normalize(
      Tensor::from_vector(std::vector<double>{3, 4, 0, 0}, Shape({2, 2}))));
  EXPECT_NEAR(n[0], 0.6, 1e-15);
  EXPECT_NEAR(n[1], 0.8, 1e-15);
  EXPECT_EQ(n[2], 0.0);  // a zero row stays zero (eps), not NaN
}

TEST(BertConfig, ReadsConfigJsonAndRejectsOthers) {
  const fs::path dir = fs::temp_directory_path() / ("taper_bert_cfg_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto write = [&](const std::string& text) {
    std::ofstream(dir / "config.json") << text;
    return dir / "config.json";
  };
  const BertConfig c = BertConfig::from_json_file(write(R"({
  "model_type": "bert", "hidden_act": "gelu", "hidden_size": 384, "intermediate_size": 1536,
  "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "num_attention_heads": 12,
  "num_hidden_layers": 6, "type_vocab_size": 2, "vocab_size": 30522, "hidden_dropout_prob": 0.1})"));
  EXPECT_EQ(c.hidden_size, 384u);
  EXPECT_EQ(c.num_hidden_layers, 6u);
  EXPECT_EQ(c.vocab_size, 30522u);
  EXPECT_DOUBLE_EQ(c.layer_norm_eps, 1e-12);
  auto expect_error = [&](const std::string& text, const char* needle) {
    try {
      BertConfig::from_json_file(write(text));
      ADD_FAILURE() << "no error for " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(R"({"model_type": "gpt2", "hidden_size": 8})", "not a BERT");
  expect_error(R"({"model_type": "bert", "hidden_act": "relu"})", "hidden_act");
  expect_error(R"({"model_type": "bert", "hidden_size": 8})", "has no \"vocab_size\"");
  fs::remove_all(dir);
  try {
    BertConfig::from_json_file(dir / "config.json");
    ADD_FAILURE() << "no error for a missing config";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scripts/fetch_model.sh"), std::string::npos) << e.what();
  }
}

// The model's pretrained files, when present, have exactly the encoder's keys plus the extras
// that load_pretrained ignores.
TEST(BertModel, PretrainedFileKeys) {
  const fs::path p = model_dir() / "model.safetensors";
  if (!fs::exists(p)) GTEST_SKIP() << "no model at " << model_dir() << ": run `bash scripts/fetch_model.sh`";
  const safetensors::File f = safetensors::File::open(p.string());
  BertModel m(BertConfig::from_json_file(model_dir() / "config.json"));
  std::set<std::string> want;
  for (const auto& [n, t] : m.named_parameters()) want.insert(n);
  std::set<std::string> got;
  for (const auto& n : f.names())
    if (const std::string k = finetune::bert_key_from_hf(n); !k.empty()) got.insert(k);
  EXPECT_EQ(got, want);
}

// ---- the data side -------------------------------------------------------------------------------

TEST(FinetuneData, PassagesSkipHeadingsAndSpanLines) {
  const std::vector<std::string> lines = {"VOLUME I", "", "CHAPTER I", "", "one two three",
                                          "four five", "", "CHAPTER II", "six seven eight nine ten"};
  const auto ps = finetune::make_passages(lines, 3, 4);
  ASSERT_EQ(ps.size(), 2u);  // 10 words -> two passages of 4, the partial one dropped
  EXPECT_EQ(ps[0].text, "one two three four");
  EXPECT_EQ(ps[1].text, "five six seven eight");
  EXPECT_EQ(ps[0].label, 3u);
  EXPECT_EQ(ps[1].index, 1u);
}

TEST(FinetuneData, SplitIsAFixedFraction) {
  size_t test = 0;
  const size_t n = 20000;
  for (size_t i = 0; i < n; ++i) test += finetune::is_test_passage(static_cast<uint32_t>(i % 6), i / 6, 50);
  EXPECT_NEAR(static_cast<double>(test) / n, 0.05, 0.006);
  // Independent of anything but (label, index).
  EXPECT_EQ(finetune::is_test_passage(2, 17, 50), finetune::is_test_passage(2, 17, 50));
  EXPECT_FALSE(finetune::is_test_passage(2, 17, 0));
  EXPECT_TRUE(finetune::is_test_passage(2, 17, 1000));
}

TEST(FinetuneData, BatchOrderIsAPermutationPerEpochAndResumable) {
  const size_t n = 37, b = 5;
  BatchOrder order(n, 11);
  std::vector<size_t> first_epoch;
  for (int64_t s = 0; s * static_cast<int64_t>(b) < static_cast<int64_t>(n); ++s)
    for (size_t i : order.batch(s, b)) first_epoch.push_back(i);
  first_epoch.resize(n);
  std::vector<size_t> sorted = first_epoch;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(sorted[i], i);
  // A fresh order (a resumed run) gives the same batch for the same step, epochs later too.
  BatchOrder again(n, 11);
  EXPECT_EQ(again.batch(23, b), order.batch(23, b));
  EXPECT_EQ(again.batch(3, b), BatchOrder(n, 11).batch(3, b));
  EXPECT_NE(BatchOrder(n, 12).batch(0, b), BatchOrder(n, 11).batch(0, b));
  // Epochs differ.
  EXPECT_NE(order.batch(0, n), order.batch(1, n));
}

TEST(FinetuneData, AustenCorpus) {
  const fs::path dir = fs::path(__FILE__).parent_path().parent_path() /
                       ".data/janeaustenr/usr/lib/R/site-library/janeaustenr/data";
  if (!fs::exists(dir / "Rdata.rdx")) GTEST_SKIP() << "no data at " << dir << ": run `bash scripts/fetch_data.sh`";
  const finetune::Corpus c = finetune::load_austen(dir);
  ASSERT_EQ(c.class_names.size(), 6u);
  EXPECT_GT(c.train.size(), 10000u);
  EXPECT_GT(c.test.size(), 500u);
  EXPECT_LT(c.test.size(), 1000u);
  std::vector<size_t> per_class(6, 0);
  for (const auto& p : c.test) ++per_class.at(p.label);
  for (size_t k = 0; k < 6; ++k) EXPECT_GT(per_class[k], 30u) << c.class_names[k];
  for (const auto& p : c.train) {
    ASSERT_EQ(std::count(p.text.begin(), p.text.end(), ' '), 47);
    ASSERT_EQ(p.text.find("CHAPTER"), std::string::npos) << p.text;
  }
  try {
    finetune::load_austen(dir / "nope");
    ADD_FAILURE() << "no error for a missing data folder";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scripts/fetch_data.sh"), std::string::npos) << e.what();
  }
}

}  // namespace
