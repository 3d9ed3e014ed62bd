// safetensors.h: reading and writing the safetensors format.
//
// The format: an 8-byte little-endian header length N, N bytes of JSON header (an object
// mapping each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}, plus an optional
// "__metadata__" object of strings; padded with spaces), then the data section, where each
// tensor occupies [begin, end) row-major, little-endian, the ranges tiling it exactly.
//
// What it is: a reader that validates the whole header before anything is read
// (strict JSON; header length within the file and <= 100 MB; known dtypes; offsets in range,
// non-overlapping and covering the data exactly; byte sizes equal to dtype size * prod(shape),
// without overflow), so a corrupt file gives a taper::Error naming the file and the tensor and
// never an out-of-bounds read; and a writer. Dtypes: BF16, F16, F32, F64, I64, U8, U32.
// A file is read with pread from a descriptor kept open, never mapped: a file truncated after
// `open` gives an Error at `get` naming the file and the tensor (a mapping would die of SIGBUS);
// a file rewritten in place after `open` gives whatever bytes it then holds.
// What it is not: zero-copy: `get` reads a tensor's bytes into a new tensor (only those bytes).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "taper/tensor.h"

namespace taper::safetensors {

/// Largest header accepted, as the reference implementation.
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

/// Where one tensor lies in the data section.
struct TensorInfo {
  DType dtype;
  std::vector<size_t> shape;
  uint64_t begin;  ///< byte offset in the data section
  uint64_t end;
};

/// The format's dtype name ("F32", "BF16", ...).
const char* dtype_tag(DType dt);

/// An open, validated safetensors file (or in-memory image). Cheap to copy (shared descriptor).
class File {
 public:
  /// Opens `path` and validates its header; throws Error naming the file (and tensor).
  static File open(const std::string& path);
  /// Validates an in-memory image; `name` stands for the file name in errors.
  static File from_bytes(std::vector<uint8_t> bytes, const std::string& name = "<memory>");

  /// The file name given to open (or from_bytes).
  const std::string& path() const { return path_; }
  /// Tensor names in data order.
  const std::vector<std::string>& names() const { return names_; }
  bool contains(const std::string& name) const { return infos_.count(name) != 0; }
  /// Throws Error naming the file when there is no such tensor.
  const TensorInfo& info(const std::string& name) const;
  /// A new tensor holding a copy of the named tensor's data, on `dev`.
  Tensor get(const std::string& name, Device dev = Device::cpu()) const;
  /// The `__metadata__` entries.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// Bytes of the header (the JSON, padding included) and of the data section.
  uint64_t header_bytes() const { return header_len_; }
  uint64_t data_bytes() const { return data_len_; }

 private:
  struct Image;
  File() = default;
  void parse();
  std::shared_ptr<Image> image_;
  std::string path_;
  uint64_t header_len_ = 0, data_len_ = 0;
  std::vector<std::string> names_;
  std::map<std::string, TensorInfo> infos_;
  std::map<std::string, std::string> metadata_;
};

/// Every tensor of a file, in data order.
std::vector<std::pair<std::string, Tensor>> load(const std::string& path,
                                                 Device dev = Device::cpu());

/// The bytes of a safetensors file holding `tensors` (names unique). Tensors are laid out by
/// decreasing element size, then in the given order, so each is aligned to its element size;
/// the header is padded with spaces to a multiple of 8 bytes.
std::vector<uint8_t> serialize(const std::vector<std::pair<std::string, Tensor>>& tensors,
                               const std::map<std::string, std::string>& metadata = {});

/// Writes `serialize(tensors, metadata)` to `path` (through a temporary file renamed into
/// place, so a crash never leaves a half-written checkpoint under the name).
void save(const std::vector<std::pair<std::string, Tensor>>& tensors, const std::string& path,
          const std::map<std::string, std::string>& metadata = {});

}  // namespace taper::safetensors
