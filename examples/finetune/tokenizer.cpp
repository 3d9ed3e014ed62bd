// tokenizer.cpp: the BERT uncased WordPiece tokenizer (see tokenizer.h for the steps and the
// Unicode coverage). Text is decoded from UTF-8 to code points once, normalised one code point at
// a time (every BertNormalizer step maps one input code point to zero or more output ones), split
// into words, and each word is matched against the vocabulary as UTF-8.
#include "examples/finetune/tokenizer.h"

#include <algorithm>
#include <fstream>

#include <taper/error.h>

namespace taper::finetune {
namespace {

using taper::detail::str_cat;

struct CategoryRange {
  char32_t lo, hi;
  uint8_t cls;
};
struct LowerRun {
  char32_t lo, hi;
  uint8_t stride;
  int32_t delta;
};
struct StripDecomp {
  char32_t cp;
  char32_t out[4];  // up to 3 code points, 0-terminated
};

#include "examples/finetune/unicode_tables.inc"

constexpr uint8_t kClsControl = 1, kClsMark = 2, kClsPunct = 3;

uint8_t category(char32_t c) {
  const auto* end = std::end(kCategoryRanges);
  const auto* it = std::upper_bound(std::begin(kCategoryRanges), end, c,
                                    [](char32_t v, const CategoryRange& r) { return v < r.lo; });
  if (it == std::begin(kCategoryRanges)) return 0;
  --it;
  return c <= it->hi ? it->cls : 0;
}

char32_t to_lower(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  const auto* it = std::upper_bound(std::begin(kLowerRuns), std::end(kLowerRuns), c,
                                    [](char32_t v, const LowerRun& r) { return v < r.lo; });
  if (it == std::begin(kLowerRuns)) return c;
  --it;
  if (c > it->hi || (c - it->lo) % it->stride != 0) return c;
  return static_cast<char32_t>(static_cast<int32_t>(c) + it->delta);
}

const StripDecomp* find_decomp(char32_t c) {
  const auto* it = std::lower_bound(std::begin(kStripDecomp), std::end(kStripDecomp), c,
                                    [](const StripDecomp& d, char32_t v) { return d.cp < v; });
  return (it != std::end(kStripDecomp) && it->cp == c) ? it : nullptr;
}

// Unicode White_Space (PropList.txt), which is what Rust's char::is_whitespace tests.
bool is_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// The CJK ranges of `tokenizers` (normalizers/bert.rs). Note 0x2B920, not BERT's 0x2B820:
// U+2B820..U+2B91F are not split off there, so not here either.
bool is_cjk(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

bool is_punct(char32_t c) {
  if (c < 0x80) {
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
           (c >= 0x7B && c <= 0x7E);
  }
  return category(c) == kClsPunct;
}

// Decodes UTF-8; malformed sequences (bad lead or continuation bytes, overlongs, surrogates,
// values past U+10FFFF) become U+FFFD, which the normaliser then drops.
std::u32string decode_utf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    if (b0 < 0x80) {
      out.push_back(b0);
      ++i;
      continue;
    }
    size_t len = 0;
    char32_t cp = 0, min = 0;
    if ((b0 & 0xE0) == 0xC0) { len = 2; cp = b0 & 0x1F; min = 0x80; }
    else if ((b0 & 0xF0) == 0xE0) { len = 3; cp = b0 & 0x0F; min = 0x800; }
    else if ((b0 & 0xF8) == 0xF0) { len = 4; cp = b0 & 0x07; min = 0x10000; }
    bool ok = len != 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xC0) != 0x80) ok = false;
      else cp = (cp << 6) | (b & 0x3F);
    }
    if (ok && (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))) ok = false;
    out.push_back(ok ? cp : 0xFFFD);
    i += ok ? len : 1;
  }
  return out;
}

void append_utf8(char32_t c, std::string& out) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string to_utf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(c, out);
  return out;
}

// Strip accents then lower-case one code point (BertNormalizer's order), appending the result.
void strip_and_lower(char32_t c, std::u32string& out) {
  constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
  constexpr char32_t kVCount = 21, kTCount = 28, kSCount = 11172;
  if (c >= kSBase && c < kSBase + kSCount) {  // Hangul syllable: L V (T) jamo, none of them Mn
    const char32_t s = c - kSBase;
    out.push_back(kLBase + s / (kVCount * kTCount));
    out.push_back(kVBase + (s % (kVCount * kTCount)) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  if (c >= 0xC0) {
    if (const StripDecomp* d = find_decomp(c)) {
      for (const char32_t* p = d->out; *p; ++p) out.push_back(to_lower(*p));
      return;
    }
    if (category(c) == kClsMark) return;
  }
  out.push_back(to_lower(c));
}

// Steps 1-4 of tokenizer.h: the words of `text`, as code points.
std::vector<std::u32string> split_words(std::string_view text) {
  const std::u32string in = decode_utf8(text);
  std::u32string norm;
  norm.reserve(in.size());
  for (char32_t c : in) {
    if (c == 0 || c == 0xFFFD) continue;
    if (c == '\t' || c == '\n' || c == '\r') { norm.push_back(' '); continue; }
    if (c >= 0x7F || c < 0x20) {
      if (category(c) == kClsControl) continue;
      if (is_whitespace(c)) { norm.push_back(' '); continue; }
    }
    if (is_cjk(c)) {
      norm.push_back(' ');
      strip_and_lower(c, norm);
      norm.push_back(' ');
      continue;
    }
    strip_and_lower(c, norm);
  }
  std::vector<std::u32string> words;
  std::u32string cur;
  for (char32_t c : norm) {
    if (is_whitespace(c)) {
      if (!cur.empty()) words.push_back(std::move(cur)), cur.clear();
    } else if (is_punct(c)) {
      if (!cur.empty()) words.push_back(std::move(cur)), cur.clear();
      words.emplace_back(1, c);
    } else {
      cur.push_back(c);
    }
  }
  if (!cur.empty()) words.push_back(std::move(cur));
  return words;
}

}  // namespace

WordPieceTokenizer WordPieceTokenizer::from_file(const std::filesystem::path& vocab_txt) {
  std::ifstream f(vocab_txt);
  if (!f) {
    throw taper::Error(str_cat("tokenizer: cannot open vocabulary ", vocab_txt.string(),
                               " (bash scripts/fetch_model.sh downloads the model files)"));
  }
  std::vector<std::string> vocab;
  std::string line;
  while (std::getline(f, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    vocab.push_back(line);
  }
  if (f.bad()) throw taper::Error(str_cat("tokenizer: error reading ", vocab_txt.string()));
  return WordPieceTokenizer(std::move(vocab));
}

WordPieceTokenizer::WordPieceTokenizer(std::vector<std::string> vocab) : vocab_(std::move(vocab)) {
  ids_.reserve(vocab_.size());
  for (size_t i = 0; i < vocab_.size(); ++i) ids_.emplace(vocab_[i], static_cast<uint32_t>(i));
  auto special = [&](const char* name) {
    const auto it = ids_.find(std::string_view(name));
    if (it == ids_.end()) {
      throw taper::Error(str_cat("tokenizer: the vocabulary (", vocab_.size(), " tokens) has no ", name,
                                 " token: not a BERT vocab.txt"));
    }
    return it->second;
  };
  cls_ = special("[CLS]");
  sep_ = special("[SEP]");
  pad_ = special("[PAD]");
  unk_ = special("[UNK]");
}

uint32_t WordPieceTokenizer::token_to_id(std::string_view token) const {
  const auto it = ids_.find(token);
  return it == ids_.end() ? unk_ : it->second;
}

const std::string& WordPieceTokenizer::id_to_token(uint32_t id) const {
  if (id >= vocab_.size()) {
    throw taper::Error(str_cat("tokenizer: id ", id, " is outside the vocabulary of ", vocab_.size()));
  }
  return vocab_[id];
}

void WordPieceTokenizer::word_pieces(std::u32string_view word, std::vector<uint32_t>& out) const {
  if (word.size() > kMaxCharsPerWord) {
    out.push_back(unk_);
    return;
  }
  // Byte offset of every code point in the UTF-8 form, so candidates are substrings.
  std::string utf8;
  std::vector<size_t> offs;
  offs.reserve(word.size() + 1);
  for (char32_t c : word) {
    offs.push_back(utf8.size());
    append_utf8(c, utf8);
  }
  offs.push_back(utf8.size());
  const size_t first = out.size();
  std::string candidate;
  size_t start = 0;
  while (start < word.size()) {
    size_t end = word.size();
    bool found = false;
    for (; end > start; --end) {
      candidate.assign(start > 0 ? "##" : "");
      candidate.append(utf8, offs[start], offs[end] - offs[start]);
      if (const auto it = ids_.find(std::string_view(candidate)); it != ids_.end()) {
        out.push_back(it->second);
        found = true;
        break;
      }
    }
    if (!found) {  // no piece covers what is left: the whole word is unknown
      out.resize(first);
      out.push_back(unk_);
      return;
    }
    start = end;
  }
}

std::vector<std::string> WordPieceTokenizer::basic_tokenize(std::string_view text) const {
  std::vector<std::string> out;
  for (const auto& w : split_words(text)) out.push_back(to_utf8(w));
  return out;
}

std::vector<uint32_t> WordPieceTokenizer::tokenize(std::string_view text) const {
  std::vector<uint32_t> ids;
  for (const auto& w : split_words(text)) word_pieces(w, ids);
  return ids;
}

std::vector<std::string> WordPieceTokenizer::tokenize_to_strings(std::string_view text) const {
  std::vector<std::string> out;
  for (uint32_t id : tokenize(text)) out.push_back(vocab_[id]);
  return out;
}

Encoding WordPieceTokenizer::encode(std::string_view text, size_t max_len, bool pad) const {
  if (max_len < 2) {
    throw taper::Error(str_cat("tokenizer: encode needs max_len >= 2 for [CLS] and [SEP], got ", max_len));
  }
  std::vector<uint32_t> pieces = tokenize(text);
  if (pieces.size() > max_len - 2) pieces.resize(max_len - 2);
  Encoding e;
  e.length = pieces.size() + 2;
  e.ids.reserve(pad ? max_len : e.length);
  e.ids.push_back(cls_);
  e.ids.insert(e.ids.end(), pieces.begin(), pieces.end());
  e.ids.push_back(sep_);
  e.attention_mask.assign(e.length, 1);
  if (pad) {
    e.ids.resize(max_len, pad_);
    e.attention_mask.resize(max_len, 0);
  }
  return e;
}

BatchEncoding WordPieceTokenizer::encode_batch(const std::vector<std::string>& texts, size_t max_len,
                                               Padding padding) const {
  std::vector<Encoding> rows;
  rows.reserve(texts.size());
  size_t longest = 0;
  for (const auto& t : texts) {
    rows.push_back(encode(t, max_len, /*pad=*/false));
    longest = std::max(longest, rows.back().length);
  }
  BatchEncoding b;
  b.batch = texts.size();
  b.seq_len = padding == Padding::ToMaxLen ? max_len : longest;
  b.ids.assign(b.batch * b.seq_len, pad_);
  b.attention_mask.assign(b.batch * b.seq_len, 0);
  for (size_t r = 0; r < rows.size(); ++r) {
    std::copy(rows[r].ids.begin(), rows[r].ids.end(), b.ids.begin() + static_cast<std::ptrdiff_t>(r * b.seq_len));
    std::fill_n(b.attention_mask.begin() + static_cast<std::ptrdiff_t>(r * b.seq_len), rows[r].length, 1);
    b.lengths.push_back(rows[r].length);
  }
  return b;
}

}  // namespace taper::finetune
