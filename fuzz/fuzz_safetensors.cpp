// fuzz_safetensors.cpp: libFuzzer target for the safetensors reader (taper/nn/safetensors.h).
//
// Input: a whole file image, given to File::from_bytes. Either it throws taper::Error, or every
// tensor it lists can be read with `get` (dtype, shape and byte size as `info` says), and the
// file written back by `serialize` parses again to the same names, dtypes, shapes, bytes and
// metadata. Anything else (a crash, a sanitizer report, another exception type, a round trip
// that differs) is a finding. File::open shares the parser; only the source of bytes differs.
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "fuzz/fuzz_common.h"
#include "taper/nn/safetensors.h"
#include "taper/taper.h"

using namespace taper;
namespace st = taper::safetensors;

namespace {

struct Loaded {
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, std::string> metadata;
};

// Every tensor of `f`, checked against its info.
Loaded read_all(const st::File& f) {
  Loaded out;
  out.metadata = f.metadata();
  TAPER_FUZZ_CHECK(f.names().size() <= f.header_bytes(), "more tensors than header bytes");
  uint64_t total = 0;
  for (const std::string& name : f.names()) {
    TAPER_FUZZ_CHECK(f.contains(name), "a listed name is not contained: ", name);
    const st::TensorInfo& ti = f.info(name);
    TAPER_FUZZ_CHECK(ti.begin <= ti.end && ti.end <= f.data_bytes(), "info out of range");
    Tensor t = f.get(name);
    TAPER_FUZZ_CHECK(t.dtype() == ti.dtype, "get's dtype differs from info's");
    TAPER_FUZZ_CHECK(t.dims() == ti.shape, "get's shape differs from info's");
    TAPER_FUZZ_CHECK(t.is_contiguous(), "get returned a strided tensor");
    TAPER_FUZZ_CHECK(t.elem_count() * dtype_size(t.dtype()) == ti.end - ti.begin,
                     "byte size differs from the data offsets");
    total += ti.end - ti.begin;
    out.tensors.emplace_back(name, t);
  }
  TAPER_FUZZ_CHECK(total == f.data_bytes(), "tensors do not cover the data section");
  return out;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.dims() != b.dims()) return false;
  const size_t n = a.elem_count() * dtype_size(a.dtype());
  return n == 0 || std::memcmp(a.data_ptr(), b.data_ptr(), n) == 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  Loaded first;
  if (!fuzz::guarded("File::from_bytes", [&] { first = read_all(st::File::from_bytes(bytes)); }))
    return 0;
  // What parsed must survive a write and a read.
  std::vector<uint8_t> again;
  if (!fuzz::guarded("serialize", [&] { again = st::serialize(first.tensors, first.metadata); }))
    return 0;  // e.g. a name serialize refuses; the reader accepted it, which is allowed
  Loaded second;
  const bool ok =
      fuzz::guarded("re-read", [&] { second = read_all(st::File::from_bytes(again, "again")); });
  TAPER_FUZZ_CHECK(ok, "serialize wrote a file the reader refuses");
  TAPER_FUZZ_CHECK(second.metadata == first.metadata, "metadata changed in a round trip");
  TAPER_FUZZ_CHECK(second.tensors.size() == first.tensors.size(), "tensor count changed");
  std::map<std::string, Tensor> by_name(second.tensors.begin(), second.tensors.end());
  for (const auto& [name, t] : first.tensors) {
    auto it = by_name.find(name);
    TAPER_FUZZ_CHECK(it != by_name.end(), "tensor lost in a round trip: ", name);
    TAPER_FUZZ_CHECK(same_bytes(t, it->second), "tensor changed in a round trip: ", name);
  }
  return 0;
}
