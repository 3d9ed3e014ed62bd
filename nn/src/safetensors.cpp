// safetensors.cpp: the validating reader and the writer (safetensors.h).
//
// Validation order: size >= 8; header length <= 100 MB and within the file; the header is
// strict JSON (json.cpp) whose top level is an object; each entry has exactly dtype, shape and
// data_offsets of the right types; byte sizes are computed with overflow checks; then the
// ranges, sorted, must tile [0, data length) exactly. Only then is any tensor data touched, and
// every read lies inside [begin, end) of a range proven to lie in the file as it was opened.
// Files are read with pread, not mapped: a file truncated after open gives a short read (an
// Error naming the file and the tensor), where a mapping would kill the process with SIGBUS.
#include "taper/nn/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "json.h"

namespace taper::safetensors {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data; big-endian hosts would need byte swaps");

namespace {

/// "an integer", "an object", "an array", "a string": a JSON kind with its article.
std::string with_article(const char* kind) {
  return std::string(std::strchr("aeiou", kind[0]) ? "an " : "a ") + kind;
}

struct DTypeTag {
  const char* tag;
  DType dtype;
};
constexpr DTypeTag kTags[] = {{"BF16", DType::BF16}, {"F16", DType::F16}, {"F32", DType::F32},
                              {"F64", DType::F64},   {"I64", DType::I64}, {"U8", DType::U8},
                              {"U32", DType::U32}};

[[noreturn]] void fail_file(const std::string& file, const std::string& what) {
  throw Error("safetensors: '" + file + "': " + what);
}
[[noreturn]] void fail_tensor(const std::string& file, const std::string& tensor,
                              const std::string& what) {
  throw Error("safetensors: '" + file + "': tensor '" + tensor + "': " + what);
}

// Checked a * b for sizes; false on overflow.
bool mul_ok(uint64_t a, uint64_t b, uint64_t* out) {
  if (a != 0 && b > UINT64_MAX / a) return false;
  *out = a * b;
  return true;
}

uint64_t read_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int k = 7; k >= 0; --k) v = (v << 8) | p[k];
  return v;
}

}  // namespace

const char* dtype_tag(DType dt) {
  for (const DTypeTag& t : kTags)
    if (t.dtype == dt) return t.tag;
  return "?";
}

// The bytes of a file: an open descriptor (read with pread) and its size at open, or an owned
// vector (from_bytes).
struct File::Image {
  int fd = -1;
  uint64_t size = 0;
  std::vector<uint8_t> owned;
  Image() = default;
  Image(const Image&) = delete;
  Image& operator=(const Image&) = delete;
  ~Image() {
    if (fd >= 0) ::close(fd);
  }
  // Copies bytes [off, off + n) (inside `size`) to dst. `what` names the tensor (or the header)
  // in the error a file that shrank since open gives.
  void read(uint64_t off, void* dst, uint64_t n, const std::string& path,
            const std::string& what) const {
    if (fd < 0) {
      if (n) std::memcpy(dst, owned.data() + off, n);
      return;
    }
    auto* out = static_cast<uint8_t*>(dst);
    uint64_t done = 0;
    while (done < n) {
      const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n - done, 1u << 30));
      const ssize_t r = ::pread(fd, out + done, chunk, static_cast<off_t>(off + done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0)
        throw Error("safetensors: '" + path + "': " + what + ": read failed at byte " +
                    std::to_string(off + done) + ": " + std::strerror(errno));
      if (r == 0) {
        struct stat st;
        const long long now = fstat(fd, &st) == 0 ? static_cast<long long>(st.st_size) : -1;
        throw Error("safetensors: '" + path + "': " + what + ": the file was truncated after it "
                    "was opened (it had " + std::to_string(size) + " bytes, now " +
                    std::to_string(now) + "; the data needs bytes up to " +
                    std::to_string(off + n) + "): open it again");
      }
      done += static_cast<uint64_t>(r);
    }
  }
};

File File::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_file(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    fail_file(path, std::string("cannot stat: ") + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail_file(path, "not a regular file");
  }
  auto img = std::make_shared<Image>();
  img->fd = fd;  // closed by the Image
  img->size = static_cast<uint64_t>(st.st_size);
  File f;
  f.image_ = std::move(img);
  f.path_ = path;
  f.parse();
  return f;
}

File File::from_bytes(std::vector<uint8_t> bytes, const std::string& name) {
  auto img = std::make_shared<Image>();
  img->owned = std::move(bytes);
  img->size = img->owned.size();
  File f;
  f.image_ = std::move(img);
  f.path_ = name;
  f.parse();
  return f;
}

void File::parse() {
  const uint64_t size = image_->size;
  if (size < 8)
    fail_file(path_, "truncated: " + std::to_string(size) +
                         " bytes; a safetensors file starts with an 8-byte header length");
  uint8_t len[8];
  image_->read(0, len, 8, path_, "the header length");
  const uint64_t n = read_le64(len);
  if (n > kMaxHeaderBytes)
    fail_file(path_, "header length " + std::to_string(n) + " exceeds the limit of " +
                         std::to_string(kMaxHeaderBytes) + " bytes");
  if (n > size - 8)
    fail_file(path_, "header length " + std::to_string(n) + " is larger than the file (" +
                         std::to_string(size) + " bytes): truncated or corrupt");
  header_len_ = n;
  data_len_ = size - 8 - n;
  std::string head(n, '\0');
  image_->read(8, head.data(), n, path_, "the header");
  const std::string_view text(head);
  if (n == 0 || text[0] != '{') fail_file(path_, "the header does not start with '{'");

  nn::json::Value root;
  try {
    root = nn::json::parse(text);
  } catch (const nn::json::ParseError& e) {
    fail_file(path_, std::string("malformed JSON header: ") + e.what());
  }
  if (root.kind != nn::json::Value::Kind::Object)
    fail_file(path_, "the header is not a JSON object");

  struct Entry {
    std::string name;
    TensorInfo info;
  };
  std::vector<Entry> entries;
  for (const auto& [name, v] : root.object) {
    if (name == "__metadata__") {
      if (v.kind != nn::json::Value::Kind::Object)
        fail_file(path_, std::string("__metadata__ must be an object of strings, got ") +
                             with_article(v.kind_name()));
      for (const auto& [k, s] : v.object) {
        if (s.kind != nn::json::Value::Kind::String)
          fail_file(path_, "__metadata__ entry '" + k + "' must be a string, got " +
                               with_article(s.kind_name()));
        metadata_[k] = s.str;
      }
      continue;
    }
    if (v.kind != nn::json::Value::Kind::Object)
      fail_tensor(path_, name, std::string("entry must be an object, got ") + with_article(v.kind_name()));
    const nn::json::Value* dt = nullptr;
    const nn::json::Value* shape = nullptr;
    const nn::json::Value* offs = nullptr;
    for (const auto& [k, f] : v.object) {
      if (k == "dtype") dt = &f;
      else if (k == "shape") shape = &f;
      else if (k == "data_offsets") offs = &f;
      else fail_tensor(path_, name, "unknown field '" + k + "'");
    }
    if (!dt || !shape || !offs)
      fail_tensor(path_, name, "entry needs \"dtype\", \"shape\" and \"data_offsets\"");
    if (dt->kind != nn::json::Value::Kind::String)
      fail_tensor(path_, name, "dtype must be a string");
    Entry e;
    e.name = name;
    bool known = false;
    for (const DTypeTag& t : kTags)
      if (dt->str == t.tag) {
        e.info.dtype = t.dtype;
        known = true;
      }
    if (!known)
      fail_tensor(path_, name, "unknown or unsupported dtype \"" + dt->str +
                                   "\" (supported: BF16, F16, F32, F64, I64, U8, U32)");
    if (shape->kind != nn::json::Value::Kind::Array)
      fail_tensor(path_, name, "shape must be an array of integers");
    uint64_t bytes = dtype_size(e.info.dtype);
    bool overflow = false;
    for (const nn::json::Value& s : shape->array) {
      if (s.kind != nn::json::Value::Kind::Int || s.integer < 0)
        fail_tensor(path_, name, "shape must be an array of non-negative integers");
      e.info.shape.push_back(static_cast<size_t>(s.integer));
      if (!mul_ok(bytes, static_cast<uint64_t>(s.integer), &bytes)) overflow = true;
    }
    if (overflow) fail_tensor(path_, name, "byte size of the shape overflows");
    if (offs->kind != nn::json::Value::Kind::Array || offs->array.size() != 2 ||
        offs->array[0].kind != nn::json::Value::Kind::Int ||
        offs->array[1].kind != nn::json::Value::Kind::Int || offs->array[0].integer < 0 ||
        offs->array[1].integer < 0)
      fail_tensor(path_, name, "data_offsets must be [begin, end], two non-negative integers");
    e.info.begin = static_cast<uint64_t>(offs->array[0].integer);
    e.info.end = static_cast<uint64_t>(offs->array[1].integer);
    if (e.info.begin > e.info.end)
      fail_tensor(path_, name, "data_offsets [" + std::to_string(e.info.begin) + ", " +
                                   std::to_string(e.info.end) + "] end before they begin");
    if (e.info.end > data_len_)
      fail_tensor(path_, name, "data_offsets [" + std::to_string(e.info.begin) + ", " +
                                   std::to_string(e.info.end) + "] are out of range: the data "
                                   "section has " + std::to_string(data_len_) + " bytes");
    if (e.info.end - e.info.begin != bytes)
      fail_tensor(path_, name, "data_offsets [" + std::to_string(e.info.begin) + ", " +
                                   std::to_string(e.info.end) + "] hold " +
                                   std::to_string(e.info.end - e.info.begin) + " bytes but " +
                                   dt->str + " " + Shape(e.info.shape).to_string() + " needs " +
                                   std::to_string(bytes));
    entries.push_back(std::move(e));
  }
  // The ranges must tile the data section: sorted, each starts where the previous ended.
  std::vector<size_t> order(entries.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return entries[a].info.begin != entries[b].info.begin
               ? entries[a].info.begin < entries[b].info.begin
               : entries[a].info.end < entries[b].info.end;
  });
  uint64_t at = 0;
  for (size_t i : order) {
    const Entry& e = entries[i];
    if (e.info.begin != at)
      fail_tensor(path_, e.name,
                  "data_offsets [" + std::to_string(e.info.begin) + ", " +
                      std::to_string(e.info.end) + "] " +
                      (e.info.begin < at ? "overlap the previous tensor" : "leave a gap") +
                      " (expected to begin at " + std::to_string(at) + ")");
    at = e.info.end;
  }
  if (at != data_len_)
    fail_file(path_, "the tensors cover " + std::to_string(at) + " bytes of a " +
                         std::to_string(data_len_) + "-byte data section");
  for (size_t i : order) {
    names_.push_back(entries[i].name);
    infos_.emplace(entries[i].name, std::move(entries[i].info));
  }
}

const TensorInfo& File::info(const std::string& name) const {
  auto it = infos_.find(name);
  if (it == infos_.end()) fail_tensor(path_, name, "no such tensor in the file");
  return it->second;
}

Tensor File::get(const std::string& name, Device dev) const {
  const TensorInfo& ti = info(name);
  Tensor t = Tensor::empty(Shape(ti.shape), ti.dtype, Device::cpu());
  const uint64_t nbytes = ti.end - ti.begin;
  // parse() proved 8 + header + end <= size (the size at open).
  image_->read(8 + header_len_ + ti.begin, t.data_ptr(), nbytes, path_, "tensor '" + name + "'");
  return dev.is_cpu() ? t : t.to_device(dev);
}

std::vector<std::pair<std::string, Tensor>> load(const std::string& path, Device dev) {
  const File f = File::open(path);
  std::vector<std::pair<std::string, Tensor>> out;
  for (const std::string& n : f.names()) out.emplace_back(n, f.get(n, dev));
  return out;
}

std::vector<uint8_t> serialize(const std::vector<std::pair<std::string, Tensor>>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::map<std::string, int> seen;
  for (const auto& [name, t] : tensors) {
    TAPER_CHECK(name != "__metadata__", "safetensors::save: '__metadata__' is not a tensor name");
    TAPER_CHECK(seen.emplace(name, 0).second, "safetensors::save: tensor '", name,
                "' appears twice");
    TAPER_CHECK(t.defined(), "safetensors::save: tensor '", name, "' is undefined");
    try {
      (void)nn::json::parse(nn::json::quote(name));
    } catch (const nn::json::ParseError&) {
      throw Error("safetensors::save: tensor name '" + name + "' is not valid UTF-8");
    }
  }
  // Larger elements first: with an 8-byte-aligned data section every tensor is then aligned to
  // its element size.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return dtype_size(tensors[a].second.dtype()) > dtype_size(tensors[b].second.dtype());
  });
  std::string h = "{";
  bool first = true;
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    for (const auto& [k, v] : metadata) {
      if (!first) h += ',';
      h += nn::json::quote(k);
      h += ':';
      h += nn::json::quote(v);
      first = false;
    }
    h += "}";
    first = false;
  }
  uint64_t at = 0;
  for (size_t i : order) {
    const auto& [name, t] = tensors[i];
    const uint64_t nb = t.elem_count() * dtype_size(t.dtype());
    if (!first) h += ',';
    h += nn::json::quote(name);
    h += ":{\"dtype\":\"";
    h += dtype_tag(t.dtype());
    h += "\",\"shape\":[";
    for (size_t k = 0; k < t.rank(); ++k) {
      if (k) h += ',';
      h += std::to_string(t.dims()[k]);
    }
    h += "],\"data_offsets\":[" + std::to_string(at) + "," + std::to_string(at + nb) + "]}";
    at += nb;
    first = false;
  }
  h += "}";
  while (h.size() % 8) h += ' ';
  std::vector<uint8_t> out(8 + h.size() + at);
  const uint64_t n = h.size();
  for (int k = 0; k < 8; ++k) out[k] = static_cast<uint8_t>(n >> (8 * k));
  std::memcpy(out.data() + 8, h.data(), h.size());
  uint8_t* data = out.data() + 8 + h.size();
  for (size_t i : order) {
    const Tensor& t = tensors[i].second;
    const size_t nb = t.elem_count() * dtype_size(t.dtype());
    if (nb) t.copy_to_host(data, t.dtype());
    data += nb;
  }
  return out;
}

void save(const std::vector<std::pair<std::string, Tensor>>& tensors, const std::string& path,
          const std::map<std::string, std::string>& metadata) {
  const std::vector<uint8_t> bytes = serialize(tensors, metadata);
  // A temporary of a unique name beside the target (never a user's own "path.tmp"), renamed over
  // it once written: a failed save leaves the old file as it was.
  static std::atomic<unsigned> counter{0};
  int fd = -1;
  std::string tmp;
  for (int attempt = 0; fd < 0 && attempt < 100; ++attempt) {
    tmp = path + ".tmp." + std::to_string(getpid()) + "." + std::to_string(counter++);
    fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);  // 0666 & ~umask
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) throw Error("safetensors::save: '" + path + "': cannot create a temporary file '" +
                          tmp + "': " + std::strerror(errno));
  FILE* f = fdopen(fd, "wb");
  if (!f) {
    const int e = errno;
    close(fd);
    std::remove(tmp.c_str());
    throw Error("safetensors::save: '" + path + "': cannot open '" + tmp + "': " + std::strerror(e));
  }
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed) {
    std::remove(tmp.c_str());
    throw Error("safetensors::save: '" + path + "': write failed (disk full?)");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    throw Error("safetensors::save: '" + path + "': cannot rename the temporary file: " +
                std::strerror(e));
  }
}

}  // namespace taper::safetensors
