// tokenizer.h: the BERT uncased WordPiece tokenizer (what all-MiniLM-L6-v2 uses), in C++, token
// for token equal to Hugging Face `tokenizers`' BertNormalizer + BertPreTokenizer + WordPiece +
// the [CLS] ... [SEP] template (tests/test_tokenizer.cpp checks that on tricky strings).
//
// What it does, in order (as `tokenizers` 0.15 does):
//  1. clean text: drop U+0000, U+FFFD and control characters (Cc other than \t \n \r, Cf, Co);
//     map White_Space to ' ';
//  2. put spaces around CJK ideographs (the ranges of `tokenizers`, which stop Extension B..E
//     at U+2B73F/U+2B81F and resume at U+2B920), so each becomes its own word;
//  3. strip accents: canonical decomposition (NFD; Hangul algorithmically) then drop nonspacing
//     marks (Mn); lower-case with the simple Unicode mappings;
//  4. split on whitespace and isolate punctuation (ASCII punctuation, including $ + < = > ^ ` | ~,
//     and every Unicode P* character) as single-character words;
//  5. WordPiece: greedy longest-match-first pieces, "##" for continuations; a word with more
//     than 100 code points, or one that cannot be covered by pieces, becomes [UNK].
// Unicode coverage: every script. The tables (unicode_tables.inc, generated from the Unicode
// 15.0 database by gen_unicode_tables.sh) reproduce what `tokenizers` 0.15 uses: categories and
// canonical decompositions as of Unicode 8.0 (characters assigned later are letters to it, so
// they are here too), lower-casing and White_Space of recent Unicode. Checked equal to
// `tokenizers` on every code point below U+323B0 and on the whole Jane Austen corpus. NFD's
// canonical reordering is not done: it only reorders marks, and the Mn ones are dropped anyway.
// Malformed UTF-8 bytes are dropped (each becomes U+FFFD, which step 1 removes).
// What it is not: a cased or accent-keeping tokenizer, pair encoding (token type ids), offsets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace taper::finetune {

/// One encoded text: `length` real tokens ([CLS] pieces... [SEP]) then [PAD] up to the padded size.
struct Encoding {
  std::vector<uint32_t> ids;            ///< token ids, padded with [PAD]
  std::vector<uint8_t> attention_mask;  ///< 1 for real tokens, 0 for padding
  size_t length = 0;                    ///< number of real tokens, [CLS] and [SEP] included
};

/// A batch of encodings, row-major (batch, seq_len), ready for a U32 tensor.
struct BatchEncoding {
  size_t batch = 0, seq_len = 0;
  std::vector<uint32_t> ids;            ///< (batch, seq_len)
  std::vector<uint8_t> attention_mask;  ///< (batch, seq_len)
  std::vector<size_t> lengths;          ///< real tokens per row
};

/// How a batch is padded: to `max_len` always, or to the longest row of the batch.
enum class Padding { ToMaxLen, ToLongest };

/// The BERT uncased WordPiece tokenizer over a `vocab.txt` (one token per line, id = line index).
class WordPieceTokenizer {
 public:
  /// Loads `vocab.txt`; throws taper::Error when the file is missing or lacks [CLS], [SEP], [PAD]
  /// or [UNK].
  static WordPieceTokenizer from_file(const std::filesystem::path& vocab_txt);
  /// Builds from tokens in id order; throws taper::Error when a special token is missing.
  explicit WordPieceTokenizer(std::vector<std::string> vocab);

  /// Steps 1-4: the normalised words and punctuation marks, in UTF-8.
  std::vector<std::string> basic_tokenize(std::string_view text) const;
  /// Step 5 over the words of `basic_tokenize`: word-piece ids without [CLS]/[SEP].
  std::vector<uint32_t> tokenize(std::string_view text) const;
  /// The word-piece strings of `tokenize` (for messages and debugging).
  std::vector<std::string> tokenize_to_strings(std::string_view text) const;

  /// [CLS] pieces [SEP], truncated so the whole fits in `max_len` (>= 2) tokens, then padded
  /// with [PAD] to `max_len` when `pad` is true.
  Encoding encode(std::string_view text, size_t max_len, bool pad = true) const;
  /// `encode` for each text; rows padded to `max_len` or to the longest row.
  BatchEncoding encode_batch(const std::vector<std::string>& texts, size_t max_len,
                             Padding padding = Padding::ToMaxLen) const;

  /// Number of tokens in the vocabulary.
  size_t vocab_size() const { return vocab_.size(); }
  /// The id of `token`, or the [UNK] id when it is not in the vocabulary.
  uint32_t token_to_id(std::string_view token) const;
  /// The token of `id`; throws taper::Error when out of range.
  const std::string& id_to_token(uint32_t id) const;
  uint32_t cls_id() const { return cls_; }
  uint32_t sep_id() const { return sep_; }
  uint32_t pad_id() const { return pad_; }
  uint32_t unk_id() const { return unk_; }

  /// Words longer than this many code points become [UNK] (BERT's max_input_chars_per_word).
  static constexpr size_t kMaxCharsPerWord = 100;

 private:
  void word_pieces(std::u32string_view word, std::vector<uint32_t>& out) const;

  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::vector<std::string> vocab_;
  std::unordered_map<std::string, uint32_t, StringHash, std::equal_to<>> ids_;
  uint32_t cls_ = 0, sep_ = 0, pad_ = 0, unk_ = 0;
};

}  // namespace taper::finetune
