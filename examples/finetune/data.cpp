// data.cpp: Jane Austen's novels as labelled passages, the train/test split and the batch order.
#include "examples/finetune/data.h"

#include <cctype>
#include <sstream>

#include "examples/finetune/rdata.h"
#include "taper/error.h"

namespace taper::finetune {

namespace fs = std::filesystem;

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

const std::vector<std::string>& austen_novels() {
  static const std::vector<std::string> names = {"emma",       "mansfieldpark",  "northangerabbey",
                                                 "persuasion", "prideprejudice", "sensesensibility"};
  return names;
}

std::vector<Passage> make_passages(const std::vector<std::string>& lines, uint32_t label,
                                   size_t words) {
  TAPER_CHECK(words > 0, "make_passages: words per passage must be > 0");
  std::vector<Passage> out;
  std::string text;
  size_t count = 0;
  for (const std::string& line : lines) {
    bool has_lower = false;
    for (char c : line) has_lower |= std::islower(static_cast<unsigned char>(c)) != 0;
    if (!has_lower) continue;
    std::istringstream in(line);
    for (std::string w; in >> w;) {
      if (count) text += ' ';
      text += w;
      if (++count == words) {
        out.push_back(Passage{std::move(text), label, out.size()});
        text.clear();
        count = 0;
      }
    }
  }
  return out;
}

bool is_test_passage(uint32_t label, size_t index, uint32_t test_per_mille) {
  const uint64_t h = mix64(mix64(0xa05735ull + label) ^ static_cast<uint64_t>(index));
  return h % 1000 < test_per_mille;
}

Corpus load_austen(const fs::path& data_dir, const CorpusOptions& options) {
  TAPER_CHECK(fs::exists(data_dir / "Rdata.rdx") && fs::exists(data_dir / "Rdata.rdb"),
              "Jane Austen data not found in ", data_dir.string(),
              " (no Rdata.rdx/Rdata.rdb): fetch it with `bash scripts/fetch_data.sh` (or pass "
              "--data-dir)");
  const LazyLoadDb db(data_dir);
  Corpus c;
  c.class_names = austen_novels();
  for (uint32_t label = 0; label < c.class_names.size(); ++label) {
    const std::vector<std::string> lines = db.get_strings(c.class_names[label]);
    for (Passage& p : make_passages(lines, label, options.words_per_passage)) {
      auto& dst = is_test_passage(label, p.index, options.test_per_mille) ? c.test : c.train;
      dst.push_back(std::move(p));
    }
  }
  return c;
}

const std::vector<size_t>& BatchOrder::permutation(uint64_t epoch) {
  if (epoch == cached_epoch_) return perm_;
  perm_.resize(n_);
  for (size_t i = 0; i < n_; ++i) perm_[i] = i;
  uint64_t state = mix64(seed_ ^ mix64(epoch + 0x6a09e667ull));
  for (size_t i = n_; i > 1; --i) {
    state = mix64(state);
    std::swap(perm_[i - 1], perm_[state % i]);
  }
  cached_epoch_ = epoch;
  return perm_;
}

std::vector<size_t> BatchOrder::batch(int64_t step, size_t batch_size) {
  TAPER_CHECK(n_ > 0, "BatchOrder: no training examples");
  std::vector<size_t> out;
  out.reserve(batch_size);
  for (size_t i = 0; i < batch_size; ++i) {
    const uint64_t g = static_cast<uint64_t>(step) * batch_size + i;
    out.push_back(permutation(g / n_)[g % n_]);
  }
  return out;
}

}  // namespace taper::finetune
