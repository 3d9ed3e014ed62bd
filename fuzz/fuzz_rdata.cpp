// fuzz_rdata.cpp: libFuzzer target for the R serialisation and lazy-load database reader
// (examples/finetune/rdata.h).
//
// Input: a mode byte, then bytes. Mode % 4 == 0: the bytes are an XDR serialisation, given to
// unserialize. 1: an .rds file (gzip, 4-byte length + zlib, or plain XDR) read with read_rds.
// 2: a lazy-load database, [2-byte big-endian length L][L bytes of Rdata.rdx][Rdata.rdb], opened
// with LazyLoadDb and every variable read (get, get_strings). 3: a compressed stream given to
// inflate_any (with the announced size of the next two bytes, 0 for none), then unserialize.
// Checks: a taper::Error or a value, and a value's accessors (length, names, attr, at) keep to
// its contents. Anything else (a crash, a sanitizer report, another exception type) is a finding.
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "examples/finetune/rdata.h"
#include "fuzz/fuzz_common.h"

using namespace taper;
using finetune::RType;
using finetune::RValue;

namespace {

// Walks a value (iteratively: a deep value must not take the harness's stack) and uses each
// accessor, so every element is touched.
void walk(const RValue& root) {
  std::vector<const RValue*> todo{&root};
  size_t seen = 0;
  while (!todo.empty() && seen < 100000) {
    const RValue* v = todo.back();
    todo.pop_back();
    ++seen;
    const size_t n = v->length();
    switch (v->type) {
      case RType::Lgl:
      case RType::Int:
        TAPER_FUZZ_CHECK(n == v->ints.size(), "int length");
        break;
      case RType::Real:
        TAPER_FUZZ_CHECK(n == v->reals.size(), "real length");
        break;
      case RType::Cplx:
        TAPER_FUZZ_CHECK(n * 2 == v->reals.size(), "complex length");
        break;
      case RType::Str:
        TAPER_FUZZ_CHECK(n == v->strings.size(), "string length");
        break;
      case RType::Raw:
        TAPER_FUZZ_CHECK(n == v->raw.size(), "raw length");
        break;
      case RType::Vec:
      case RType::Expr:
      case RType::List:
        TAPER_FUZZ_CHECK(n == v->items.size(), "list length");
        break;
      default:
        break;
    }
    if (v->type == RType::List)
      TAPER_FUZZ_CHECK(v->tags.size() == v->items.size(), "pairlist tags and items differ");
    const std::vector<std::string> names = v->names();
    for (size_t i = 0; i < names.size() && i < v->items.size() && i < 8; ++i)
      fuzz::guarded("RValue::at", [&] { (void)v->at(names[i]); });
    (void)v->attr("names");
    for (const auto& item : v->items) {
      TAPER_FUZZ_CHECK(item != nullptr, "a null list item");
      todo.push_back(item.get());
    }
    for (const auto& [k, a] : v->attributes) {
      TAPER_FUZZ_CHECK(a != nullptr, "a null attribute");
      todo.push_back(a.get());
    }
  }
}

void lazy_load(std::string_view rest) {
  if (rest.size() < 2) return;
  const size_t l = (static_cast<uint8_t>(rest[0]) << 8) | static_cast<uint8_t>(rest[1]);
  rest.remove_prefix(2);
  const std::string_view rdx = rest.substr(0, std::min(l, rest.size()));
  const std::string_view rdb = rest.substr(rdx.size());
  fuzz::write_scratch("Rdata.rdx", rdx);
  fuzz::write_scratch("Rdata.rdb", rdb);
  fuzz::guarded("LazyLoadDb", [&] {
    const finetune::LazyLoadDb db(fuzz::scratch_dir());
    for (const std::string& name : db.names()) {
      TAPER_FUZZ_CHECK(db.contains(name), "names() lists what contains() denies: ", name);
      fuzz::guarded("LazyLoadDb::get", [&] { walk(db.get(name)); });
      fuzz::guarded("LazyLoadDb::get_strings", [&] { (void)db.get_strings(name); });
    }
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::span<const uint8_t> rest(data + 1, size - 1);
  const std::string_view text(reinterpret_cast<const char*>(rest.data()), rest.size());
  try {
    switch (data[0] % 4) {
      case 0:
        fuzz::guarded("unserialize", [&] { walk(finetune::unserialize(rest)); });
        break;
      case 1: {
        const auto path = fuzz::write_scratch("x.rds", text);
        fuzz::guarded("read_rds", [&] { walk(finetune::read_rds(path)); });
        break;
      }
      case 2:
        lazy_load(text);
        break;
      case 3: {
        if (rest.size() < 2) break;
        const size_t expected = (size_t{rest[0]} << 8) | rest[1];
        fuzz::guarded("inflate_any", [&] {
          const std::vector<uint8_t> plain =
              finetune::inflate_any(rest.subspan(2), "fuzz", expected);
          if (expected) TAPER_FUZZ_CHECK(plain.size() == expected, "inflated to another size");
          walk(finetune::unserialize(plain));
        });
        break;
      }
    }
  } catch (const std::exception& e) {
    fuzz::finding(std::string("an exception escaped: ") + e.what());
  }
  return 0;
}
