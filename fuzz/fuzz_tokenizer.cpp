// fuzz_tokenizer.cpp: libFuzzer target for the BERT WordPiece tokenizer
// (examples/finetune/tokenizer.h).
//
// Input: one control byte, then bytes. Control bit 7 clear: the bytes are text (any bytes, UTF-8
// or not) for a tokenizer over a small built-in vocabulary, and control & 0x7F is `max_len`
// (0 and 1 must be refused with an Error). Bit 7 set: the bytes are a vocab.txt, loaded with
// from_file (an Error when it lacks a special token), and the tokenizer it gives runs over a fixed
// sample and over the file's own text. Checks: ids within the vocabulary, tokenize_to_strings
// naming the same ids, encode's [CLS] pieces [SEP] [PAD]... layout and mask, encode_batch's rows
// equal to encode's. Anything else (a crash, a sanitizer report, another exception type, a broken
// invariant) is a finding.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "examples/finetune/tokenizer.h"
#include "fuzz/fuzz_common.h"

using namespace taper;
using finetune::Padding;
using finetune::WordPieceTokenizer;

namespace {

const WordPieceTokenizer& builtin() {
  static const std::unique_ptr<WordPieceTokenizer> tok = [] {
    std::vector<std::string> v = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
    for (char c = 'a'; c <= 'z'; ++c) {
      v.emplace_back(1, c);
      v.push_back(std::string("##") + c);
    }
    for (char c = '0'; c <= '9'; ++c) {
      v.emplace_back(1, c);
      v.push_back(std::string("##") + c);
    }
    for (char c : std::string_view("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")) v.emplace_back(1, c);
    for (const char* w :
         {"the",        "quick",        "brown",        "fox",          "jump",
          "##s",        "##ed",         "##ing",        "un",           "##able",
          "pride",      "and",          "prejudice",    "##ly",         "austen",
          "emma",       "\xE4\xB8\xAD", "\xE6\x96\x87", "\xC3\x9F",     "\xCE\xB1",
          "##\xCE\xB2", "\xD1\x8F",     "##\xD1\x8F",   "\xE2\x80\x94", "\xE2\x80\x9C"})
      v.emplace_back(w);
    return std::make_unique<WordPieceTokenizer>(std::move(v));
  }();
  return *tok;
}

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

void check(const WordPieceTokenizer& tok, std::string_view text, size_t max_len) {
  const size_t vs = tok.vocab_size();
  for (const std::string& w : tok.basic_tokenize(text)) {
    TAPER_FUZZ_CHECK(!w.empty(), "basic_tokenize gave an empty word");
    for (char c : w) TAPER_FUZZ_CHECK(!is_ascii_space(c), "a word holds whitespace");
  }
  const std::vector<uint32_t> ids = tok.tokenize(text);
  const std::vector<std::string> strs = tok.tokenize_to_strings(text);
  TAPER_FUZZ_CHECK(strs.size() == ids.size(), "tokenize_to_strings has another length");
  for (size_t i = 0; i < ids.size(); ++i) {
    TAPER_FUZZ_CHECK(ids[i] < vs, "id ", ids[i], " outside a vocabulary of ", vs);
    TAPER_FUZZ_CHECK(tok.token_to_id(strs[i]) == ids[i], "a piece's string maps to another id");
    TAPER_FUZZ_CHECK(tok.id_to_token(ids[i]) == strs[i], "id_to_token differs");
  }

  for (bool pad : {true, false}) {
    finetune::Encoding e;
    if (!fuzz::guarded("encode", [&] { e = tok.encode(text, max_len, pad); })) {
      TAPER_FUZZ_CHECK(max_len < 2, "encode refused max_len ", max_len);
      continue;
    }
    TAPER_FUZZ_CHECK(max_len >= 2, "encode accepted max_len ", max_len);
    const size_t want_len = std::min(ids.size(), max_len - 2) + 2;
    TAPER_FUZZ_CHECK(e.length == want_len, "encode length ", e.length, ", expected ", want_len);
    TAPER_FUZZ_CHECK(e.ids.size() == (pad ? max_len : e.length), "encode size");
    TAPER_FUZZ_CHECK(e.attention_mask.size() == e.ids.size(), "mask size");
    TAPER_FUZZ_CHECK(e.ids.front() == tok.cls_id() && e.ids[e.length - 1] == tok.sep_id(),
                     "encode is not [CLS] ... [SEP]");
    for (size_t i = 0; i < e.ids.size(); ++i) {
      TAPER_FUZZ_CHECK(e.attention_mask[i] == (i < e.length ? 1 : 0), "mask at ", i);
      if (i >= e.length) TAPER_FUZZ_CHECK(e.ids[i] == tok.pad_id(), "padding at ", i);
      if (i > 0 && i + 1 < e.length) TAPER_FUZZ_CHECK(e.ids[i] == ids[i - 1], "piece at ", i);
    }
  }

  if (max_len < 2) return;
  std::vector<std::string> lines;
  for (size_t at = 0; at <= text.size() && lines.size() < 16;) {
    const size_t nl = text.find('\n', at);
    const size_t end = nl == std::string_view::npos ? text.size() : nl;
    lines.emplace_back(text.substr(at, end - at));
    at = end + 1;
  }
  for (Padding p : {Padding::ToMaxLen, Padding::ToLongest}) {
    const finetune::BatchEncoding b = tok.encode_batch(lines, max_len, p);
    TAPER_FUZZ_CHECK(b.batch == lines.size() && b.lengths.size() == b.batch, "batch size");
    TAPER_FUZZ_CHECK(b.ids.size() == b.batch * b.seq_len && b.attention_mask.size() == b.ids.size(),
                     "batch buffers");
    TAPER_FUZZ_CHECK(b.seq_len <= max_len, "seq_len ", b.seq_len, " > max_len ", max_len);
    for (size_t r = 0; r < b.batch; ++r) {
      const finetune::Encoding e = tok.encode(lines[r], max_len, false);
      TAPER_FUZZ_CHECK(b.lengths[r] == e.length && e.length <= b.seq_len, "row length");
      for (size_t i = 0; i < b.seq_len; ++i) {
        const uint32_t want = i < e.length ? e.ids[i] : tok.pad_id();
        TAPER_FUZZ_CHECK(b.ids[r * b.seq_len + i] == want, "batch id at ", r, ", ", i);
        TAPER_FUZZ_CHECK(b.attention_mask[r * b.seq_len + i] == (i < e.length ? 1 : 0),
                         "batch mask at ", r, ", ", i);
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t control = data[0];
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if (!(control & 0x80)) {
    check(builtin(), rest, control & 0x7F);
    return 0;
  }
  const auto path = fuzz::write_scratch("vocab.txt", rest);
  std::unique_ptr<WordPieceTokenizer> tok;
  if (!fuzz::guarded("from_file", [&] {
        tok = std::make_unique<WordPieceTokenizer>(WordPieceTokenizer::from_file(path));
      }))
    return 0;
  check(*tok, "The quick brown fox jumped! Caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 unjumpable", 16);
  check(*tok, rest, 2 + (control & 0x3F));
  return 0;
}
