// data.h: the fine-tuning task: which of Jane Austen's six novels a passage comes from.
//
// What it is: the novels (character vectors of lines in janeaustenr's lazy-load database) cut
// into passages of a fixed number of consecutive words, labelled by novel, and split into train
// and test by a hash of (novel, passage index), so the split never depends on the run's seed,
// batch or thread count; plus the deterministic batch order of the training loop.
// What it is not: tokenisation (tokenizer.h) or the model (bert.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace taper::finetune {

/// One labelled passage.
struct Passage {
  std::string text;
  uint32_t label = 0;  ///< index into Corpus::class_names
  size_t index = 0;    ///< position of the passage within its novel
};

/// How the novels are cut and split.
struct CorpusOptions {
  /// Words per passage (consecutive, across line breaks; the last partial window is dropped).
  size_t words_per_passage = 48;
  /// Passages whose hash falls below this many per mille go to the test set.
  uint32_t test_per_mille = 50;
};

/// The six novels as passages.
struct Corpus {
  std::vector<std::string> class_names;  ///< janeaustenr's variable names, label order
  std::vector<Passage> train, test;
};

/// janeaustenr's variable names of the six novels, in label order.
const std::vector<std::string>& austen_novels();

/// Cuts one novel's lines into passages of `words` words. Lines without a lower-case letter
/// (chapter and volume headings, "THE END") are left out, so a heading never gives a label away.
std::vector<Passage> make_passages(const std::vector<std::string>& lines, uint32_t label,
                                   size_t words);

/// Whether passage `index` of novel `label` is a test passage (a fixed 64-bit hash).
bool is_test_passage(uint32_t label, size_t index, uint32_t test_per_mille);

/// Reads the six novels from janeaustenr's data folder (holding Rdata.rdx / Rdata.rdb) and cuts
/// and splits them. Throws taper::Error naming the folder and `scripts/fetch_data.sh` when the
/// database is absent.
Corpus load_austen(const std::filesystem::path& data_dir, const CorpusOptions& options = {});

/// The training order: position `i` of step `step` (batch `batch`) is train example
/// `order(seed, step * batch + i)`, where each epoch over the `n` examples is a fresh
/// Fisher-Yates permutation seeded by (seed, epoch). A pure function of its arguments, so a
/// resumed run sees the same batches as an uninterrupted one.
class BatchOrder {
 public:
  BatchOrder(size_t n, uint64_t seed) : n_(n), seed_(seed) {}
  /// The train indices of step `step`.
  std::vector<size_t> batch(int64_t step, size_t batch_size);

 private:
  const std::vector<size_t>& permutation(uint64_t epoch);
  size_t n_;
  uint64_t seed_;
  uint64_t cached_epoch_ = ~0ull;
  std::vector<size_t> perm_;
};

/// splitmix64: the mixing function behind the split and the batch order.
uint64_t mix64(uint64_t x);

}  // namespace taper::finetune
