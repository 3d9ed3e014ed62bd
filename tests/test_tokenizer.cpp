// test_tokenizer.cpp: the BERT uncased WordPiece tokenizer of the fine-tuning example
// (examples/finetune/tokenizer.h). Parity: token ids of every tricky string in
// tests/data/tokenizer_reference.txt, and of the sentences in tests/data/embedding_reference.txt,
// equal those of Hugging Face `tokenizers` (written once by scripts/make_reference.py); those
// need the model's vocab.txt (bash scripts/fetch_model.sh) and skip without it. The normaliser,
// word-piece rules, truncation, padding and masks are also tested on a small in-memory
// vocabulary, which needs no download.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "examples/finetune/tokenizer.h"
#include "taper/error.h"

namespace {

namespace fs = std::filesystem;
using taper::finetune::Padding;
using taper::finetune::WordPieceTokenizer;

fs::path test_data_dir() { return fs::path(__FILE__).parent_path() / "data"; }

fs::path vocab_path() {
  if (const char* env = std::getenv("TAPER_MODEL_DIR")) return fs::path(env) / "vocab.txt";
  return fs::path(__FILE__).parent_path().parent_path() / ".models/all-MiniLM-L6-v2/vocab.txt";
}

// The model's tokenizer, loaded once; nullptr when the model has not been fetched.
const WordPieceTokenizer* model_tokenizer() {
  static const std::optional<WordPieceTokenizer> tok = []() -> std::optional<WordPieceTokenizer> {
    if (!fs::exists(vocab_path())) return std::nullopt;
    return WordPieceTokenizer::from_file(vocab_path());
  }();
  return tok ? &*tok : nullptr;
}

#define REQUIRE_MODEL()                                                                     \
  const WordPieceTokenizer* tok = model_tokenizer();                                        \
  if (!tok) GTEST_SKIP() << "no vocab at " << vocab_path() << ": run `bash scripts/fetch_model.sh`"

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

std::vector<uint32_t> parse_ids(std::istringstream& in) {
  std::vector<uint32_t> ids;
  for (unsigned long v; in >> v;) ids.push_back(static_cast<uint32_t>(v));
  return ids;
}

struct RefCase {
  std::string name, text;
  size_t max_len = 0;  // 0: no truncation
  std::vector<uint32_t> ids;
};

std::vector<RefCase> load_reference() {
  std::ifstream f(test_data_dir() / "tokenizer_reference.txt");
  std::vector<RefCase> cases;
  for (std::string line; std::getline(f, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream in(line);
    std::string key;
    in >> key;
    if (key == "case") {
      cases.emplace_back();
      in >> cases.back().name;
    } else if (key == "text_hex") {
      std::string hex;
      in >> hex;
      cases.back().text = from_hex(hex);
    } else if (key == "max_len") {
      in >> cases.back().max_len;
    } else if (key == "ids") {
      cases.back().ids = parse_ids(in);
    }
  }
  return cases;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

class TokenizerParity : public ::testing::TestWithParam<RefCase> {};

TEST_P(TokenizerParity, IdsEqualHuggingFaceTokenizers) {
  REQUIRE_MODEL();
  const RefCase& c = GetParam();
  ASSERT_FALSE(c.ids.empty());
  const auto enc = tok->encode(c.text, c.max_len ? c.max_len : 100000, /*pad=*/false);
  EXPECT_EQ(enc.ids, c.ids) << "pieces: " << join(tok->tokenize_to_strings(c.text));
  EXPECT_EQ(enc.length, c.ids.size());
}

INSTANTIATE_TEST_SUITE_P(Reference, TokenizerParity, ::testing::ValuesIn(load_reference()),
                         [](const ::testing::TestParamInfo<RefCase>& info) { return info.param.name; });

TEST(Tokenizer, ReferenceFileCoversTheTrickyCases) {
  const std::vector<RefCase> cases = load_reference();
  EXPECT_GE(cases.size(), 30u);
  for (const char* name : {"accents", "punctuation", "digits", "long_known_words", "word_101_chars", "empty",
                           "cjk", "emoji", "mixed_case", "truncated_16"}) {
    bool found = false;
    for (const auto& c : cases) found = found || c.name == name;
    EXPECT_TRUE(found) << name;
  }
}

// The token ids sentence-transformers fed its model for the embedding reference.
TEST(Tokenizer, EmbeddingReferenceIds) {
  REQUIRE_MODEL();
  std::ifstream f(test_data_dir() / "embedding_reference.txt");
  std::string sentence;
  int checked = 0;
  for (std::string line; std::getline(f, line);) {
    std::istringstream in(line);
    std::string key;
    in >> key;
    if (key == "sentence_hex") {
      std::string hex;
      in >> hex;
      sentence = from_hex(hex);
    } else if (key == "ids") {
      EXPECT_EQ(tok->encode(sentence, 256, false).ids, parse_ids(in)) << sentence;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 8);
}

TEST(Tokenizer, ModelPaddingMaskAndBatch) {
  REQUIRE_MODEL();
  EXPECT_EQ(tok->vocab_size(), 30522u);
  EXPECT_EQ(tok->cls_id(), 101u);
  EXPECT_EQ(tok->sep_id(), 102u);
  EXPECT_EQ(tok->pad_id(), 0u);
  EXPECT_EQ(tok->unk_id(), 100u);
  const auto e = tok->encode("Hello, world!", 8);
  EXPECT_EQ(e.ids, (std::vector<uint32_t>{101, 7592, 1010, 2088, 999, 102, 0, 0}));
  EXPECT_EQ(e.attention_mask, (std::vector<uint8_t>{1, 1, 1, 1, 1, 1, 0, 0}));
  EXPECT_EQ(e.length, 6u);
}

// ---- Without the model: a small vocabulary ---------------------------------------------------

WordPieceTokenizer small_tokenizer() {
  return WordPieceTokenizer({"[PAD]", "[UNK]", "[CLS]", "[SEP]", "un", "##aff", "##able", "aff", "##a",
                             "##b", "a", "b", ",", "!", "cafe", "世", "界", "hello", "##ll", "##o", "he"});
}

TEST(Tokenizer, BasicTokenizeNormalises) {
  const WordPieceTokenizer t = small_tokenizer();
  using V = std::vector<std::string>;
  EXPECT_EQ(t.basic_tokenize("Café Ünïcödé naïve"), (V{"cafe", "unicode", "naive"}));
  EXPECT_EQ(t.basic_tokenize("e\xcc\x81 \xe1\xba\xbf"), (V{"e", "e"}));  // combining acute; ế
  EXPECT_EQ(t.basic_tokenize("Hello,World!"), (V{"hello", ",", "world", "!"}));
  EXPECT_EQ(t.basic_tokenize("a$b+c<d=e>f^g`h|i~j"),
            (V{"a", "$", "b", "+", "c", "<", "d", "=", "e", ">", "f", "^", "g", "`", "h", "|", "i", "~", "j"}));
  EXPECT_EQ(t.basic_tokenize("hello\xe4\xb8\x96\xe7\x95\x8c!"), (V{"hello", "世", "界", "!"}));
  EXPECT_EQ(t.basic_tokenize("\xe2\x80\x9cquoted\xe2\x80\x9d \xe2\x80\x94 x\xe2\x80\xa6"),  // “quoted” — x…
            (V{"\xe2\x80\x9c", "quoted", "\xe2\x80\x9d", "\xe2\x80\x94", "x", "\xe2\x80\xa6"}));
  // Controls, U+FFFD, zero-width space (Cf) and soft hyphen vanish; \t \n U+3000 U+00A0 split.
  const char raw[] = "ze\xe2\x80\x8bro\x07x\0y\xef\xbf\xbd\tb\n\xe3\x80\x80" "c\xc2\xa0" "d";
  EXPECT_EQ(t.basic_tokenize(std::string(raw, sizeof(raw) - 1)), (V{"zeroxy", "b", "c", "d"}));
  EXPECT_EQ(t.basic_tokenize("\xce\xa3\xce\x9f\xce\xa6\xce\x99\xce\x91 \xd0\x81\xd0\xbb\xd0\xba\xd0\xb0"),  // ΣΟΦΙΑ Ёлка
            (V{"\xcf\x83\xce\xbf\xcf\x86\xce\xb9\xce\xb1", "\xd0\xb5\xd0\xbb\xd0\xba\xd0\xb0"}));
  EXPECT_EQ(t.basic_tokenize("\xc4\xb0stanbul"), (V{"istanbul"}));  // İ: I + U+0307, mark dropped
  EXPECT_EQ(t.basic_tokenize("\xed\x95\x9c"), (V{"\xe1\x84\x92\xe1\x85\xa1\xe1\x86\xab"}));  // 한 -> jamo
  EXPECT_EQ(t.basic_tokenize("\xef\xbc\xa1"), (V{"\xef\xbd\x81"}));  // fullwidth A lower-cased, not folded
  EXPECT_EQ(t.basic_tokenize("bad\xff\xc3utf8"), (V{"badutf8"}));   // malformed bytes dropped
  EXPECT_TRUE(t.basic_tokenize("").empty());
  EXPECT_TRUE(t.basic_tokenize(" \t\n\r ").empty());
}

TEST(Tokenizer, WordPiecesGreedyLongestFirst) {
  const WordPieceTokenizer t = small_tokenizer();
  using V = std::vector<std::string>;
  EXPECT_EQ(t.tokenize_to_strings("unaffable"), (V{"un", "##aff", "##able"}));
  EXPECT_EQ(t.tokenize_to_strings("hello"), (V{"hello"}));            // whole word beats he ##ll ##o
  EXPECT_EQ(t.tokenize_to_strings("hellollo"), (V{"hello", "##ll", "##o"}));
  EXPECT_EQ(t.tokenize_to_strings("abab"), (V{"a", "##b", "##a", "##b"}));
  EXPECT_EQ(t.tokenize_to_strings("unaffablex, Café!"), (V{"[UNK]", ",", "cafe", "!"}));  // no piece for x
  EXPECT_EQ(t.tokenize_to_strings(std::string(100, 'a')).size(), 100u);  // a ##a ... : 100 chars is allowed
  EXPECT_EQ(t.tokenize_to_strings(std::string(101, 'a')), (V{"[UNK]"}));
  EXPECT_EQ(t.tokenize_to_strings("b " + std::string(101, 'a') + " b"), (V{"b", "[UNK]", "b"}));
  EXPECT_EQ(t.token_to_id("aff"), 7u);
  EXPECT_EQ(t.token_to_id("nope"), t.unk_id());
  EXPECT_EQ(t.id_to_token(4), "un");
  EXPECT_THROW(t.id_to_token(999), taper::Error);
}

TEST(Tokenizer, TruncationPaddingAndMasks) {
  const WordPieceTokenizer t = small_tokenizer();
  const auto full = t.encode("a b a b a", 16, /*pad=*/false);
  EXPECT_EQ(full.ids, (std::vector<uint32_t>{2, 10, 11, 10, 11, 10, 3}));
  EXPECT_EQ(full.attention_mask, std::vector<uint8_t>(7, 1));
  const auto cut = t.encode("a b a b a", 4);
  EXPECT_EQ(cut.ids, (std::vector<uint32_t>{2, 10, 11, 3}));
  EXPECT_EQ(cut.length, 4u);
  const auto padded = t.encode("a", 5);
  EXPECT_EQ(padded.ids, (std::vector<uint32_t>{2, 10, 3, 0, 0}));
  EXPECT_EQ(padded.attention_mask, (std::vector<uint8_t>{1, 1, 1, 0, 0}));
  EXPECT_EQ(t.encode("", 4).ids, (std::vector<uint32_t>{2, 3, 0, 0}));
  EXPECT_EQ(t.encode("a b", 2).ids, (std::vector<uint32_t>{2, 3}));
  EXPECT_THROW(t.encode("a", 1), taper::Error);

  const std::vector<std::string> texts = {"a", "a b a b a b a b", ""};
  const auto b = t.encode_batch(texts, 6, Padding::ToLongest);
  EXPECT_EQ(b.batch, 3u);
  EXPECT_EQ(b.seq_len, 6u);  // the longest row, truncated to 6
  const auto m = t.encode_batch(texts, 6, Padding::ToMaxLen);
  EXPECT_EQ(m.seq_len, 6u);
  const auto s = t.encode_batch({"a", "b a"}, 10, Padding::ToLongest);
  EXPECT_EQ(s.seq_len, 4u);
  EXPECT_EQ(s.ids, (std::vector<uint32_t>{2, 10, 3, 0, 2, 11, 10, 3}));
  EXPECT_EQ(s.attention_mask, (std::vector<uint8_t>{1, 1, 1, 0, 1, 1, 1, 1}));
  EXPECT_EQ(s.lengths, (std::vector<size_t>{3, 4}));
  for (size_t r = 0; r < texts.size(); ++r) {
    const auto e = t.encode(texts[r], 6);
    EXPECT_EQ(std::vector<uint32_t>(m.ids.begin() + static_cast<long>(r * 6), m.ids.begin() + static_cast<long>(r * 6 + 6)), e.ids);
    EXPECT_EQ(m.lengths[r], e.length);
  }
}

TEST(Tokenizer, BadVocabularies) {
  try {
    WordPieceTokenizer::from_file("/nonexistent/vocab.txt");
    ADD_FAILURE() << "no error for a missing vocabulary";
  } catch (const taper::Error& e) {
    EXPECT_NE(std::string(e.what()).find("scripts/fetch_model.sh"), std::string::npos) << e.what();
  }
  EXPECT_THROW(WordPieceTokenizer({"[PAD]", "[UNK]", "[CLS]", "a"}), taper::Error);  // no [SEP]
}

}  // namespace
