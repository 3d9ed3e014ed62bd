// test_safetensors.cpp: the safetensors reader and writer, and Module::save/load.
//
// What it is: a round trip for every dtype through a real file; a file truncated after open; a file written
// by taper checked byte by byte against the format (8-byte little-endian header length, JSON
// header with dtype/shape/data_offsets and __metadata__, space padding, data layout); a
// hand-written reference file parsed; one case per header validation rule, each checking that
// the Error names the file and the tensor; a randomized mutation test (thousands of corrupted
// images: bit flips, truncations, header edits with and without a consistent length prefix)
// that must only ever succeed or throw taper::Error; and Module::save/load (strict, non-strict,
// prefix, dtype conversion, atomic failure).
// What it is not: a test of the optimizers' state (test_optim.cpp).
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "taper/nn.h"
#include "tests/test_util.h"

namespace taper {
namespace {

using namespace taper::nn;
using testing::error_of;
using testing::random_tensor;
using testing::values;
namespace st = taper::safetensors;

/// A scratch directory removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("taper_st_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
  static inline int counter_ = 0;
};

std::vector<uint8_t> raw_bytes(const Tensor& t) {
  std::vector<uint8_t> out(t.elem_count() * dtype_size(t.dtype()));
  if (!out.empty()) t.copy_to_host(out.data(), t.dtype());
  return out;
}

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

/// A file image: little-endian length of `header`, `header`, then `data`.
std::vector<uint8_t> image(const std::string& header, const std::vector<uint8_t>& data = {}) {
  std::vector<uint8_t> out;
  out.reserve(8 + header.size() + data.size());
  const uint64_t n = header.size();
  for (int k = 0; k < 8; ++k) out.push_back(static_cast<uint8_t>(n >> (8 * k)));
  for (const char c : header) out.push_back(static_cast<uint8_t>(c));
  for (const uint8_t c : data) out.push_back(c);
  return out;
}

/// One tensor of every dtype, small odd shapes, values that use the whole width of the type.
std::vector<std::pair<std::string, Tensor>> every_dtype() {
  std::vector<std::pair<std::string, Tensor>> ts;
  ts.emplace_back("u8", Tensor::from_vector(std::vector<uint8_t>{0, 1, 127, 128, 255}, {5}));
  ts.emplace_back("u32", Tensor::from_vector(std::vector<uint32_t>{0, 1, 0xdeadbeef, 0xffffffff}, {2, 2}));
  ts.emplace_back("i64", Tensor::from_vector(std::vector<int64_t>{-1, INT64_MIN, INT64_MAX}, {3, 1}));
  ts.emplace_back("bf16", random_tensor({2, 3, 2}, DType::BF16, 1));
  ts.emplace_back("f16", random_tensor({7}, DType::F16, 2));
  ts.emplace_back("f32", random_tensor({3, 3}, DType::F32, 3));
  ts.emplace_back("f64", random_tensor({1, 2}, DType::F64, 4));
  ts.emplace_back("scalar", Tensor::full({}, 2.5, DType::F32));
  ts.emplace_back("empty", Tensor::zeros({0, 4}, DType::F32));
  return ts;
}

// ---- round trip and format --------------------------------------------------------------------

TEST(NnSafetensors, RoundTripEveryDtypeThroughAFile) {
  TempDir dir;
  const auto ts = every_dtype();
  const std::string path = dir.file("all.safetensors");
  st::save(ts, path, {{"format", "pt"}, {"note", "quote \" and \\ and \n newline"}});
  const st::File f = st::File::open(path);
  EXPECT_EQ(f.names().size(), ts.size());
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "quote \" and \\ and \n newline");
  for (const auto& [name, t] : ts) {
    ASSERT_TRUE(f.contains(name)) << name;
    EXPECT_EQ(f.info(name).dtype, t.dtype()) << name;
    const Tensor back = f.get(name);
    EXPECT_EQ(back.shape(), t.shape()) << name;
    EXPECT_EQ(back.dtype(), t.dtype()) << name;
    EXPECT_EQ(raw_bytes(back), raw_bytes(t)) << name;
  }
  const auto all = st::load(path);
  EXPECT_EQ(all.size(), ts.size());
  // Non-contiguous tensors are written in row-major order.
  const Tensor base = random_tensor({3, 4}, DType::F32, 9);
  st::save({{"t", base.t()}}, path);
  EXPECT_EQ(values(st::File::open(path).get("t")), values(base.t()));
  EXPECT_THROW(st::save({{"a", base}, {"a", base}}, path), Error);
  EXPECT_THROW(st::save({{"__metadata__", base}}, path), Error);
  EXPECT_THROW(st::save({{std::string("bad\xff"), base}}, path), Error);
  EXPECT_THROW(st::save({{"a", base}}, dir.file("no/such/dir/x.safetensors")), Error);
}

// save writes a temporary of its own beside the target and renames it: a user's file named
// "<path>.tmp" is neither overwritten nor deleted, and nothing else is left in the folder.
TEST(NnSafetensors, SaveLeavesAUsersTmpFileAlone) {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  write_file(path + ".tmp", {'m', 'i', 'n', 'e'});
  st::save({{"a", random_tensor({2, 3}, DType::F32, 4)}}, path);
  std::ifstream f(path + ".tmp", std::ios::binary);
  const std::string kept((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(kept, "mine");
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(path).parent_path())) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 2u);  // the saved file and the user's
  EXPECT_EQ(st::File::open(path).names(), std::vector<std::string>{"a"});
}

// Issue 15 item 7: a file truncated after it was opened. A mapped reader died of SIGBUS on the
// next get; now the read comes up short and the Error names the file and the tensor. Tensors
// still wholly inside the shortened file read as before.
TEST(NnSafetensors, FileTruncatedAfterOpenIsAnErrorNotSigbus) {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  const Tensor a = random_tensor({4, 1024}, DType::F32, 1);
  const Tensor b = random_tensor({64, 1024}, DType::F32, 2);
  st::save({{"a", a}, {"b", b}}, path);
  const st::File f = st::File::open(path);
  const uint64_t keep = 8 + f.header_bytes() + f.info("a").end + 100;  // a whole, b cut short
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(keep)), 0);
  EXPECT_EQ(values(f.get("a")), values(a));
  const std::string e = error_of([&] { (void)f.get("b"); });
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("tensor 'b'"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated after it was opened"), std::string::npos) << e;
  ASSERT_EQ(::truncate(path.c_str(), 0), 0);
  EXPECT_NE(error_of([&] { (void)f.get("a"); }).find("truncated"), std::string::npos);
  EXPECT_THROW(st::File::open(path), Error);  // reopened: too short to hold a header
}

TEST(NnSafetensors, WrittenBytesFollowTheFormat) {
  const Tensor a = Tensor::from_vector(std::vector<float>{1.0f, 2.0f}, {2});
  const Tensor b = Tensor::from_vector(std::vector<uint8_t>{1, 2, 3}, {3});
  // U8 first in the list, F32 first in the file: larger elements first keeps alignment.
  const std::vector<uint8_t> bytes = st::serialize({{"b", b}, {"a", a}}, {{"format", "pt"}});
  std::string header =
      "{\"__metadata__\":{\"format\":\"pt\"},"
      "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[8,11]}}";
  while (header.size() % 8) header += ' ';
  ASSERT_EQ(bytes.size(), 8 + header.size() + 11);
  uint64_t n = 0;
  for (int k = 7; k >= 0; --k) n = (n << 8) | bytes[k];
  EXPECT_EQ(n, header.size());
  EXPECT_EQ(std::string(bytes.begin() + 8, bytes.begin() + 8 + long(n)), header);
  const uint8_t data[11] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x40, 1, 2, 3};
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + n, data, 11), 0);
  // save() writes exactly serialize()'s bytes.
  TempDir dir;
  st::save({{"b", b}, {"a", a}}, dir.file("x.st"), {{"format", "pt"}});
  std::ifstream in(dir.file("x.st"), std::ios::binary);
  const std::vector<uint8_t> on_disk((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(on_disk, bytes);
}

TEST(NnSafetensors, ParsesAHandWrittenReferenceFile) {
  // As written by the reference implementation for {"ids": int64 [1, -2], "weight": float16
  // [[1, -2], [0.5, 65504]]} with metadata {"format": "pt"}, plus a rank-0 u8 tensor whose
  // name uses escapes, whitespace between tokens and trailing space padding.
  const std::string header =
      "{\"__metadata__\": {\"format\": \"pt\"},\n"
      " \"ids\": {\"dtype\": \"I64\", \"shape\": [2], \"data_offsets\": [0, 16]},\n"
      " \"weight\": {\"shape\": [2, 2], \"dtype\": \"F16\", \"data_offsets\": [16, 24]},\n"
      " \"na\\u00efve\\t\\/\\ud83d\\ude00\": {\"dtype\": \"U8\", \"shape\": [], \"data_offsets\": [24, 25]}}   ";
  const std::vector<uint8_t> data = {1, 0, 0, 0, 0, 0, 0, 0,                           // 1
                                     0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,   // -2
                                     0x00, 0x3c, 0x00, 0xc0, 0x00, 0x38, 0xff, 0x7b,   // f16
                                     42};
  const st::File f = st::File::from_bytes(image(header, data), "ref.safetensors");
  EXPECT_EQ(f.names(), (std::vector<std::string>{"ids", "weight", "na\xc3\xaf" "ve\t/\xf0\x9f\x98\x80"}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.get("ids").to_vector<int64_t>(), (std::vector<int64_t>{1, -2}));
  const Tensor w = f.get("weight");
  EXPECT_EQ(w.dtype(), DType::F16);
  EXPECT_EQ(w.dims(), (std::vector<size_t>{2, 2}));
  EXPECT_EQ(values(w), (std::vector<double>{1.0, -2.0, 0.5, 65504.0}));
  const Tensor s = f.get(f.names()[2]);
  EXPECT_EQ(s.rank(), 0u);
  EXPECT_EQ(s.to_vector<uint8_t>(), std::vector<uint8_t>{42});
  EXPECT_EQ(f.header_bytes(), header.size());
  EXPECT_EQ(f.data_bytes(), data.size());
  EXPECT_THROW(f.get("nope"), Error);
  // An empty file: just "{}".
  EXPECT_TRUE(st::File::from_bytes(image("{}")).names().empty());
}

// ---- validation: one case per rule ------------------------------------------------------------

/// Expects from_bytes to throw an Error whose message contains every one of `needles`.
void expect_error(const std::vector<uint8_t>& bytes, std::vector<std::string> needles) {
  needles.push_back("'bad.safetensors'");  // the file is always named
  try {
    st::File::from_bytes(bytes, "bad.safetensors");
    ADD_FAILURE() << "no error; wanted: " << needles[0];
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "message: " << msg << "\nmissing: " << n;
  }
}

std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
         ",\"data_offsets\":" + offsets + "}";
}

TEST(NnSafetensors, ValidationNamesFileAndTensor) {
  const std::vector<uint8_t> d8(8, 0);
  // Size and length prefix.
  expect_error({1, 2, 3}, {"truncated"});
  expect_error({}, {"truncated"});
  {
    auto b = image("{}");
    b[0] = 200;  // header length 200 in a 10-byte file
    expect_error(b, {"larger than the file"});
    std::vector<uint8_t> huge(8, 0);
    huge[4] = 1;  // 2^32 bytes
    expect_error(huge, {"exceeds the limit"});
    std::vector<uint8_t> max(8, 0xff);
    expect_error(max, {"exceeds the limit"});
  }
  // Malformed JSON.
  for (const char* h : {"", "[]", "{", "{\"a\":", "{\"a\" 1}", "{\"a\":{}}x", "{'a':1}",
                        "{\"a\":tru}", "{\"a\":null}", "{\"a\":1.5}", "{\"a\":01}",
                        "{\"a\":\"\\x\"}", "{\"a\":\"\\ud800\"}", "{\"a\":\"\x01\"}",
                        "{\"a\":\"\xc0\xaf\"}", "{\"a\":[1,]}", "{\"a\":99999999999999999999}",
                        "{,}", " {}"})
    expect_error(image(h), {"header"});
  {
    std::string deep = "{\"a\":";
    for (int i = 0; i < 10000; ++i) deep += "[";
    expect_error(image(deep), {"nesting"});
  }
  expect_error(image("{\"a\":1,\"a\":2}"), {"duplicate key"});
  // Entries.
  expect_error(image("{" + entry("w", "F32", "[2]", "[0,8]") + "," +
                     entry("w", "F32", "[2]", "[8,16]") + "}", std::vector<uint8_t>(16)),
               {"duplicate key \"w\""});
  expect_error(image("{\"w\":[1]}"), {"tensor 'w'", "must be an object"});
  expect_error(image("{" + entry("w", "F8", "[2]", "[0,2]") + "}", {0, 0}),
               {"tensor 'w'", "unknown or unsupported dtype \"F8\""});
  expect_error(image("{" + entry("w", "BOOL", "[2]", "[0,2]") + "}", {0, 0}), {"tensor 'w'", "BOOL"});
  expect_error(image("{\"w\":{\"dtype\":\"F32\",\"shape\":[2]}}", d8), {"tensor 'w'", "data_offsets"});
  expect_error(image("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", d8),
               {"tensor 'w'", "unknown field 'x'"});
  expect_error(image("{\"w\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,8]}}", d8),
               {"tensor 'w'", "dtype must be a string"});
  expect_error(image("{" + entry("w", "F32", "[-2]", "[0,8]") + "}", d8), {"tensor 'w'", "shape"});
  expect_error(image("{" + entry("w", "F32", "[\"2\"]", "[0,8]") + "}", d8), {"tensor 'w'", "shape"});
  expect_error(image("{" + entry("w", "F32", "2", "[0,8]") + "}", d8), {"tensor 'w'", "shape"});
  expect_error(image("{" + entry("w", "F32", "[2]", "[0]") + "}", d8), {"tensor 'w'", "data_offsets"});
  expect_error(image("{" + entry("w", "F32", "[2]", "[0,-8]") + "}", d8), {"tensor 'w'", "data_offsets"});
  expect_error(image("{" + entry("w", "F32", "[2]", "[8,0]") + "}", d8), {"tensor 'w'", "end before"});
  // Byte size against offsets (and overflow of the byte size).
  expect_error(image("{" + entry("w", "F32", "[3]", "[0,8]") + "}", d8),
               {"tensor 'w'", "hold 8 bytes but F32 (3) needs 12"});
  expect_error(image("{" + entry("w", "F64", "[4294967296,4294967296]", "[0,8]") + "}", d8),
               {"tensor 'w'", "overflows"});
  // Offsets out of range, overlapping, leaving a gap, not covering the data.
  expect_error(image("{" + entry("w", "F32", "[4]", "[0,16]") + "}", d8),
               {"tensor 'w'", "out of range", "8 bytes"});
  expect_error(image("{" + entry("w", "F32", "[2]", "[0,8]") + "," + entry("v", "F32", "[1]", "[4,8]") +
                     "}", d8),
               {"tensor 'v'", "overlap"});
  expect_error(image("{" + entry("w", "F32", "[1]", "[4,8]") + "}", d8), {"tensor 'w'", "gap"});
  expect_error(image("{" + entry("w", "F32", "[1]", "[0,4]") + "}", d8), {"cover 4 bytes of a 8-byte"});
  expect_error(image("{}", {1}), {"cover 0 bytes of a 1-byte"});
  // Metadata.
  expect_error(image("{\"__metadata__\":{\"a\":1}}"),
               {"__metadata__ entry 'a' must be a string, got an integer"});
  expect_error(image("{\"__metadata__\":[]}"), {"__metadata__ must be an object"});
  // A missing file.
  EXPECT_THROW(st::File::open("/nonexistent/taper.safetensors"), Error);
}

// ---- randomized mutation test -----------------------------------------------------------------

/// Reads every tensor of an image; true when it parsed. Anything but taper::Error escapes.
bool try_read(const std::vector<uint8_t>& bytes) {
  try {
    // An exact-size copy, so any read past the end is a heap overflow the sanitizer sees.
    const st::File f = st::File::from_bytes(std::vector<uint8_t>(bytes.begin(), bytes.end()), "m");
    for (const std::string& n : f.names()) {
      const Tensor t = f.get(n);
      EXPECT_EQ(t.elem_count() * dtype_size(t.dtype()), f.info(n).end - f.info(n).begin);
    }
    return true;
  } catch (const Error&) {
    return false;
  }
}

void set_length(std::vector<uint8_t>& b, uint64_t n) {
  for (int k = 0; k < 8; ++k) b[k] = static_cast<uint8_t>(n >> (8 * k));
}

TEST(NnSafetensors, MutatedFilesNeverCrash) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<uint8_t> base = st::serialize(every_dtype(), {{"format", "pt"}});
  uint64_t hlen = 0;
  for (int k = 7; k >= 0; --k) hlen = (hlen << 8) | base[k];
  ASSERT_TRUE(try_read(base));
  std::mt19937_64 rng(20240601);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  const std::string alphabet = "{}[]\",:0123456789-. \\eEuFIU\x80\xff";
  const char* numbers[] = {"0", "1", "-1", "7", "4294967296", "18446744073709551615",
                           "9223372036854775807", "99999999999999999999", "1e3", "8"};
  const int kKinds = 8, kPerKind = 500;
  int ok[kKinds] = {}, rejected[kKinds] = {};
  for (int kind = 0; kind < kKinds; ++kind) {
    for (int it = 0; it < kPerKind; ++it) {
      std::vector<uint8_t> b = base;
      std::string h(b.begin() + 8, b.begin() + 8 + long(hlen));
      switch (kind) {
        case 0:  // bit flips in the length prefix and header
          for (size_t k = 1 + pick(3); k > 0; --k) b[pick(8 + hlen)] ^= uint8_t(1u << pick(8));
          break;
        case 1:  // bit flips anywhere
          for (size_t k = 1 + pick(4); k > 0; --k) b[pick(b.size())] ^= uint8_t(1u << pick(8));
          break;
        case 2:  // truncation
          b.resize(pick(b.size()));
          break;
        case 3:  // header byte replaced by a JSON-ish character, length unchanged
          for (size_t k = 1 + pick(2); k > 0; --k) b[8 + pick(hlen)] = uint8_t(alphabet[pick(alphabet.size())]);
          break;
        case 4: {  // a byte inserted or deleted in the header, length prefix kept consistent
          const size_t at = pick(h.size());
          if (rng() & 1) h.erase(at, 1);
          else h.insert(at, 1, alphabet[pick(alphabet.size())]);
          std::vector<uint8_t> nb = image(h);
          nb.insert(nb.end(), b.begin() + 8 + long(hlen), b.end());
          b = nb;
          break;
        }
        case 5: {  // a number of the header replaced (shape or offset), length consistent
          std::vector<size_t> digits;
          for (size_t i = 0; i < h.size(); ++i)
            if (h[i] >= '0' && h[i] <= '9' && (i == 0 || h[i - 1] < '0' || h[i - 1] > '9')) digits.push_back(i);
          const size_t at = digits[pick(digits.size())];
          size_t end = at;
          while (end < h.size() && h[end] >= '0' && h[end] <= '9') ++end;
          h.replace(at, end - at, numbers[pick(std::size(numbers))]);
          std::vector<uint8_t> nb = image(h);
          nb.insert(nb.end(), b.begin() + 8 + long(hlen), b.end());
          b = nb;
          break;
        }
        case 6: {  // a chunk of the header removed (keys, brackets), length consistent
          const size_t at = pick(h.size());
          h.erase(at, 1 + pick(std::min<size_t>(40, h.size() - at)));
          std::vector<uint8_t> nb = image(h);
          nb.insert(nb.end(), b.begin() + 8 + long(hlen), b.end());
          b = nb;
          break;
        }
        case 7:  // a wrong length prefix
          set_length(b, (rng() & 1) ? rng() : hlen + pick(17) - 8);
          break;
      }
      (try_read(b) ? ok : rejected)[kind]++;
    }
  }
  // Every kind of corruption was caught at least sometimes; flips in the data section and
  // padding are harmless, so some mutants parse.
  for (int kind = 0; kind < kKinds; ++kind) EXPECT_GT(rejected[kind], 0) << "kind " << kind;
  EXPECT_GT(ok[1], 0);
  // The mmap path on a sample written to disk (truncations and flips).
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  for (int it = 0; it < 100; ++it) {
    std::vector<uint8_t> b = base;
    if (it % 2) b.resize(pick(b.size()));
    else b[pick(8 + hlen)] ^= uint8_t(1u << pick(8));
    write_file(path, b);
    try {
      const st::File f = st::File::open(path);
      for (const std::string& n : f.names()) (void)f.get(n);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
    }
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(secs, 20.0) << "the mutation test must stay within CI's budget";
}

// ---- Module::save / load ----------------------------------------------------------------------

std::shared_ptr<Sequential> small_model(uint64_t seed, DType dt = DType::F32) {
  manual_seed(seed);
  auto m = std::make_shared<Sequential>();
  m->push_back(std::make_shared<Linear>(LinearOptions(3, 4).dtype(dt)));
  m->push_back(std::make_shared<LayerNorm>(LayerNormOptions(4).dtype(dt)));
  m->push_back(std::make_shared<Linear>(LinearOptions(4, 2).bias(false).dtype(dt)));
  m->register_buffer("steps", Tensor::from_vector(std::vector<int64_t>{42}, {1}));
  return m;
}

TEST(NnModuleIo, SaveLoadRoundTrip) {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  auto a = small_model(1);
  a->save(path, {{"format", "pt"}});
  auto b = small_model(2);
  b->register_buffer("scratch", Tensor::zeros({1}, DType::F32), /*persistent=*/false);
  ASSERT_NE(values(a->parameter("0.weight")), values(b->parameter("0.weight")));
  replace_value(b->named_buffers()[0].second, Tensor::from_vector(std::vector<int64_t>{0}, {1}));
  const Var w = b->parameter("0.weight");
  const LoadReport rep = b->load(path);
  EXPECT_TRUE(rep.missing.empty() && rep.unexpected.empty() && rep.converted.empty());
  for (auto& [n, p] : a->named_parameters()) EXPECT_EQ(values(p), values(b->parameter(n))) << n;
  EXPECT_EQ(b->named_buffers()[0].second.to_vector<int64_t>()[0], 42);  // buffers load too
  EXPECT_EQ(w.id(), b->parameter("0.weight").id());                     // identities kept
  EXPECT_EQ(values(w), values(a->parameter("0.weight")));
  const st::File f = st::File::open(path);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_TRUE(f.contains("1.weight") && f.contains("2.weight") && !f.contains("2.bias"));
}

TEST(NnModuleIo, StrictReportsMissingAndUnexpectedWithoutModifying) {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  auto a = small_model(1);
  auto tensors = a->state_dict();
  tensors.erase(tensors.begin());  // drop "0.weight"
  tensors.emplace_back("head.weight", Tensor::zeros({2}, DType::F32));
  st::save(tensors, path);
  auto b = small_model(2);
  const auto before = values(b->parameter("0.bias"));
  try {
    b->load(path);
    ADD_FAILURE() << "strict load of a mismatching file succeeded";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("0.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("head.weight"), std::string::npos) << msg;
  }
  EXPECT_EQ(values(b->parameter("0.bias")), before);  // nothing was loaded
  const LoadReport rep = b->load(path, LoadOptions().strict(false));
  EXPECT_EQ(rep.missing, std::vector<std::string>{"0.weight"});
  EXPECT_EQ(rep.unexpected, std::vector<std::string>{"head.weight"});
  EXPECT_EQ(values(b->parameter("0.bias")), values(a->parameter("0.bias")));
  EXPECT_NE(rep.to_string().find("head.weight"), std::string::npos);
}

TEST(NnModuleIo, ShapeDtypeAndPrefix) {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  auto a = small_model(1);
  // Saved as bf16 under a "bert." prefix, with an extra head the model lacks.
  std::vector<std::pair<std::string, Tensor>> ts;
  for (auto& [n, t] : a->state_dict())
    ts.emplace_back("bert." + n, is_float(t.dtype()) ? t.to_dtype(DType::BF16) : t);
  ts.emplace_back("cls.weight", Tensor::zeros({1}, DType::F32));
  st::save(ts, path);
  auto b = small_model(2);
  try {
    b->load(path, LoadOptions().strict(false).prefix("bert."));
    ADD_FAILURE() << "a bf16 file loaded into f32 without convert_dtype";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bert.0.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("convert_dtype"), std::string::npos) << e.what();
  }
  const LoadReport rep = b->load(path, LoadOptions().strict(false).prefix("bert.").convert_dtype(true));
  EXPECT_EQ(rep.unexpected, std::vector<std::string>{"cls.weight"});
  EXPECT_EQ(rep.converted.size(), 5u);  // every float tensor; the i64 buffer matched as is
  EXPECT_EQ(b->parameter("0.weight").dtype(), DType::F32);
  EXPECT_EQ(values(b->parameter("0.weight")),
            values(a->parameter("0.weight").value().to_dtype(DType::BF16)));
  // A shape mismatch is always an error, naming the key and both shapes.
  st::save({{"0.weight", Tensor::zeros({4, 4}, DType::F32)}}, path);
  try {
    b->load(path, LoadOptions().strict(false));
    ADD_FAILURE();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'0.weight'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(4, 4)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(4, 3)"), std::string::npos) << msg;
  }
  // From tensors in memory, into a bf16 model.
  auto c = small_model(3, DType::BF16);
  const LoadReport r2 = c->load_state_dict(a->state_dict(), LoadOptions().convert_dtype(true));
  EXPECT_EQ(r2.converted.size(), 5u);
  EXPECT_EQ(c->parameter("1.bias").dtype(), DType::BF16);
}

}  // namespace
}  // namespace taper
