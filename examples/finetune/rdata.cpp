// rdata.cpp: R's XDR unserialiser and lazy-load database reader (see rdata.h for the scope).
// Follows src/main/serialize.c of R (ReadItem / UnpackFlags / ReadLENGTH) and
// lazyLoadDBfetch / R_decompress1..3 in src/main/serialize.c + src/main/connections.c.
#include "examples/finetune/rdata.h"

#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <fstream>

#include <taper/error.h>

namespace taper::finetune {
namespace {

using taper::detail::str_cat;

// Special codes of the serialisation stream (serialize.c), not SEXP types of live objects.
constexpr int kRefSxp = 255, kNilValueSxp = 254, kGlobalEnvSxp = 253, kUnboundValueSxp = 252,
              kMissingArgSxp = 251, kBaseNamespaceSxp = 250, kNamespaceSxp = 249,
              kPackageSxp = 248, kPersistSxp = 247, kEmptyEnvSxp = 242, kBaseEnvSxp = 241,
              kAltrepSxp = 238;
// CHARSXP encoding bits of the `levels` field (Defn.h).
constexpr int kBytesMask = 1 << 1, kLatin1Mask = 1 << 2, kUtf8Mask = 1 << 3, kAsciiMask = 1 << 6;
// Crafted input must not overflow the stack (even a sanitizer build's larger frames on a small
// thread stack): data sets nest a few levels deep, so 200 is generous.
constexpr int kMaxDepth = 200;

std::string latin1_to_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back(static_cast<char>(0xC0 | (c >> 6)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
  }
  return out;
}

class Reader {
 public:
  Reader(std::span<const uint8_t> bytes, std::string_view what) : p_(bytes), what_(what) {}

  RValue read_top() {
    if (p_.size() < 2) fail("too short for a serialisation header");
    if (p_[0] == 'A' && p_[1] == '\n') fail("ASCII serialisation (\"A\\n\") is not supported");
    if (p_[0] == 'B' && p_[1] == '\n') fail("native binary serialisation (\"B\\n\") is not supported");
    if (p_[0] != 'X' || p_[1] != '\n') fail("not an XDR serialisation (expected header \"X\\n\")");
    pos_ = 2;
    const int32_t version = read_int();
    read_int();  // the writer's R version
    read_int();  // the minimal reader version
    if (version == 3) {
      const int32_t nelen = read_int();
      if (nelen < 0 || nelen > 256) fail(str_cat("bad native-encoding length ", nelen));
      need(static_cast<size_t>(nelen));
      pos_ += static_cast<size_t>(nelen);
    } else if (version != 2) {
      fail(str_cat("serialisation version ", version, " (only 2 and 3 are supported)"));
    }
    RValue v = read_item(0);
    return v;
  }

  size_t position() const { return pos_; }

 private:
  [[noreturn]] void fail(const std::string& msg) const {
    throw taper::Error(str_cat("rdata: ", what_, ": ", msg, " (at byte ", pos_, ")"));
  }
  void need(size_t n) const {
    if (n > p_.size() - pos_) fail(str_cat("truncated: needs ", n, " more bytes, ", p_.size() - pos_, " left"));
  }
  int32_t read_int() {
    need(4);
    const uint32_t u = (uint32_t{p_[pos_]} << 24) | (uint32_t{p_[pos_ + 1]} << 16) |
                       (uint32_t{p_[pos_ + 2]} << 8) | uint32_t{p_[pos_ + 3]};
    pos_ += 4;
    return static_cast<int32_t>(u);
  }
  double read_double() {
    need(8);
    uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u = (u << 8) | p_[pos_ + static_cast<size_t>(i)];
    pos_ += 8;
    return std::bit_cast<double>(u);
  }
  // ReadLENGTH: -1 announces a long vector whose length follows as two ints (upper, lower).
  size_t read_length() {
    const int32_t len = read_int();
    if (len >= 0) return static_cast<size_t>(len);
    if (len != -1) fail(str_cat("negative vector length ", len));
    const auto hi = static_cast<uint32_t>(read_int());
    const auto lo = static_cast<uint32_t>(read_int());
    const uint64_t n = (uint64_t{hi} << 32) | lo;
    // Every element takes at least one byte, so a length beyond the input is corrupt; checking
    // here keeps a crafted length from triggering a huge allocation.
    if (n > p_.size()) fail(str_cat("vector length ", n, " exceeds the input size"));
    return static_cast<size_t>(n);
  }
  // A length in elements of `elem` bytes each must fit in what is left.
  void check_elems(size_t n, size_t elem) const {
    if (n > (p_.size() - pos_) / elem) fail(str_cat("vector of ", n, " elements is truncated"));
  }

  std::shared_ptr<RValue> read_ptr(int depth) {
    return std::make_shared<RValue>(read_item(depth));
  }

  // Reads a pairlist (the flags of its first cell already read) into `out`, iterating along the
  // CDR chain so that long pairlists do not recurse.
  void read_pairlist(int flags, RValue& out, int depth) {
    out.type = RType::List;
    for (;;) {
      const bool has_attr = flags & (1 << 9), has_tag = flags & (1 << 10);
      if (has_attr) {
        RValue a = read_item(depth + 1);  // attributes of a cell: kept on the first cell only
        if (out.items.empty()) take_attributes(a, out);
      }
      std::string tag;
      if (has_tag) {
        RValue t = read_item(depth + 1);
        if (t.type != RType::Sym) fail("a pairlist tag is not a symbol");
        tag = std::move(t.symbol);
      }
      out.tags.push_back(std::move(tag));
      out.items.push_back(read_ptr(depth + 1));
      flags = read_int();
      const int type = flags & 0xFF;
      if (type == kNilValueSxp) return;
      if (type != static_cast<int>(RType::List)) {
        fail(str_cat("a pairlist ends in ", rtype_name(type), " instead of NULL"));
      }
    }
  }

  void take_attributes(RValue& attr_list, RValue& target) {
    if (attr_list.type == RType::Nil) return;
    if (attr_list.type != RType::List) fail("attributes are not a pairlist");
    for (size_t i = 0; i < attr_list.items.size(); ++i) {
      target.attributes.emplace_back(attr_list.tags[i], attr_list.items[i]);
    }
  }

  RValue read_item(int depth) {
    if (depth > kMaxDepth) fail("objects nested too deeply");
    const int32_t flags = read_int();
    const int type = flags & 0xFF;
    const int levels = flags >> 12;
    const bool has_attr = flags & (1 << 9);
    RValue v;
    switch (type) {
      case kNilValueSxp:
        return v;
      case kRefSxp: {
        int32_t index = flags >> 8;
        if (index == 0) index = read_int();
        if (index < 1 || static_cast<size_t>(index) > refs_.size()) {
          fail(str_cat("reference ", index, " to an unknown object (", refs_.size(), " known)"));
        }
        return refs_[static_cast<size_t>(index) - 1];
      }
      case kGlobalEnvSxp: case kUnboundValueSxp: case kMissingArgSxp: case kBaseNamespaceSxp:
      case kEmptyEnvSxp: case kBaseEnvSxp: case kNamespaceSxp: case kPackageSxp:
      case kPersistSxp:
        fail(str_cat("environments and namespaces (code ", type, ") are not supported"));
      case static_cast<int>(RType::Sym): {
        RValue name = read_item(depth + 1);
        if (name.type != RType::Str || name.strings.size() != 1 || !name.strings[0]) {
          fail("a symbol's name is not a string");
        }
        v.type = RType::Sym;
        v.symbol = *name.strings[0];
        refs_.push_back(v);
        return v;
      }
      case static_cast<int>(RType::List):
        read_pairlist(flags, v, depth);
        return v;
      case kAltrepSxp:
        return read_altrep(depth);
      case 9: {  // CHARSXP: returned as a length-1 STRSXP so callers see one shape
        const int32_t len = read_int();
        v.type = RType::Str;
        if (len == -1) {
          v.strings.emplace_back(std::nullopt);
        } else {
          if (len < 0) fail(str_cat("negative string length ", len));
          need(static_cast<size_t>(len));
          std::string s(reinterpret_cast<const char*>(p_.data() + pos_), static_cast<size_t>(len));
          pos_ += static_cast<size_t>(len);
          if ((levels & kLatin1Mask) && !(levels & (kUtf8Mask | kAsciiMask | kBytesMask))) {
            s = latin1_to_utf8(s);
          }
          v.strings.emplace_back(std::move(s));
        }
        if (has_attr) read_item(depth + 1);  // R reads and drops a CHARSXP's attributes
        return v;
      }
      case static_cast<int>(RType::Lgl):
      case static_cast<int>(RType::Int): {
        v.type = static_cast<RType>(type);
        const size_t n = read_length();
        check_elems(n, 4);
        v.ints.resize(n);
        for (auto& x : v.ints) x = read_int();
        break;
      }
      case static_cast<int>(RType::Real):
      case static_cast<int>(RType::Cplx): {
        v.type = static_cast<RType>(type);
        const size_t n = read_length() * (type == static_cast<int>(RType::Cplx) ? 2 : 1);
        check_elems(n, 8);
        v.reals.resize(n);
        for (auto& x : v.reals) x = read_double();
        break;
      }
      case static_cast<int>(RType::Str): {
        v.type = RType::Str;
        const size_t n = read_length();
        check_elems(n, 4);
        v.strings.reserve(n);
        for (size_t i = 0; i < n; ++i) {
          RValue s = read_item(depth + 1);
          if (s.type != RType::Str || s.strings.size() != 1) {
            fail(str_cat("element ", i, " of a character vector is a ", rtype_name(static_cast<int>(s.type))));
          }
          v.strings.push_back(std::move(s.strings[0]));
        }
        break;
      }
      case static_cast<int>(RType::Vec):
      case static_cast<int>(RType::Expr): {
        v.type = static_cast<RType>(type);
        const size_t n = read_length();
        check_elems(n, 4);
        v.items.reserve(n);
        for (size_t i = 0; i < n; ++i) v.items.push_back(read_ptr(depth + 1));
        break;
      }
      case static_cast<int>(RType::Raw): {
        v.type = RType::Raw;
        const size_t n = read_length();
        need(n);
        v.raw.assign(p_.begin() + static_cast<std::ptrdiff_t>(pos_),
                     p_.begin() + static_cast<std::ptrdiff_t>(pos_ + n));
        pos_ += n;
        break;
      }
      default:
        fail(str_cat("unsupported SEXP type ", rtype_name(type)));
    }
    if (has_attr) {
      RValue a = read_item(depth + 1);
      take_attributes(a, v);
    }
    return v;
  }

  // ALTREP_SXP: info (pairlist: class symbol, package symbol, type), state, attributes.
  RValue read_altrep(int depth) {
    RValue info = read_item(depth + 1);
    RValue state = read_item(depth + 1);
    RValue attr = read_item(depth + 1);
    if (info.type != RType::List || info.items.empty() || info.items[0]->type != RType::Sym) {
      fail("malformed ALTREP class information");
    }
    const std::string& cls = info.items[0]->symbol;
    RValue v;
    if (cls == "compact_intseq" || cls == "compact_realseq") {
      // State: REALSXP (n, first, step); R writes the integer form as doubles too.
      if (state.type != RType::Real || state.reals.size() != 3) fail(str_cat("malformed ", cls, " state"));
      const double n = state.reals[0], first = state.reals[1], step = state.reals[2];
      if (!(n >= 0) || n > static_cast<double>(p_.size()) * 64) fail(str_cat("bad ", cls, " length ", n));
      const auto count = static_cast<size_t>(n);
      if (cls == "compact_intseq") {
        v.type = RType::Int;
        v.ints.resize(count);
        for (size_t i = 0; i < count; ++i) {
          const double x = first + step * static_cast<double>(i);
          // An integer sequence must stay in int32 (R's own range; a cast past it is undefined).
          if (!(x >= -2147483647.0 && x <= 2147483647.0)) fail(str_cat("bad ", cls, " value ", x));
          v.ints[i] = static_cast<int32_t>(x);
        }
      } else {
        v.type = RType::Real;
        v.reals.resize(count);
        for (size_t i = 0; i < count; ++i) v.reals[i] = first + step * static_cast<double>(i);
      }
    } else if (cls.rfind("wrap_", 0) == 0) {
      // State: pairlist (wrapped object . metadata).
      if (state.type != RType::List || state.items.empty()) fail(str_cat("malformed ", cls, " state"));
      v = *state.items[0];
    } else {
      fail(str_cat("unsupported ALTREP class ", cls));
    }
    take_attributes(attr, v);
    return v;
  }

  std::span<const uint8_t> p_;
  std::string_view what_;
  size_t pos_ = 0;
  std::vector<RValue> refs_;  // the reference table: symbols, in reading order (1-based in R)
};

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// zlib's inflate with automatic gzip/zlib header detection (windowBits 15 + 32).
std::vector<uint8_t> inflate_stream(std::span<const uint8_t> in, std::string_view what,
                                    size_t expected_size) {
  // Deflate cannot expand data by more than about 1032:1, so a larger announced size is a
  // corrupt header; refusing it keeps a flipped bit from allocating gigabytes.
  if (expected_size > in.size() * 1040 + 1024) {
    throw taper::Error(str_cat("rdata: ", what, ": the header announces ", expected_size, " bytes from ",
                               in.size(), " compressed ones: corrupt"));
  }
  z_stream zs{};
  if (inflateInit2(&zs, 15 + 32) != Z_OK) throw taper::Error(str_cat("rdata: ", what, ": zlib init failed"));
  std::vector<uint8_t> out;
  out.resize(expected_size ? expected_size : std::max<size_t>(in.size() * 4, 1024));
  zs.next_in = const_cast<Bytef*>(in.data());
  zs.avail_in = static_cast<uInt>(in.size());
  size_t produced = 0;
  int rc = Z_OK;
  while (rc != Z_STREAM_END) {
    if (produced == out.size()) {
      if (expected_size) break;  // more output than the header announced: corrupt
      out.resize(out.size() * 2);
    }
    zs.next_out = out.data() + produced;
    zs.avail_out = static_cast<uInt>(std::min<size_t>(out.size() - produced, 1u << 30));
    const uInt before = zs.avail_out;
    rc = inflate(&zs, Z_NO_FLUSH);
    produced += before - zs.avail_out;
    if (rc == Z_STREAM_END) break;
    if (rc != Z_OK && !(rc == Z_BUF_ERROR && zs.avail_out == 0)) {
      const std::string msg = zs.msg ? zs.msg : "error " + std::to_string(rc);
      inflateEnd(&zs);
      throw taper::Error(str_cat("rdata: ", what, ": corrupt compressed data (zlib: ", msg, ")"));
    }
    if (rc == Z_BUF_ERROR && zs.avail_in == 0 && zs.avail_out != 0) break;
  }
  inflateEnd(&zs);
  if (rc != Z_STREAM_END) {
    throw taper::Error(str_cat("rdata: ", what, ": compressed data is truncated or longer than announced"));
  }
  if (expected_size && produced != expected_size) {
    throw taper::Error(str_cat("rdata: ", what, ": inflated to ", produced, " bytes, the header says ", expected_size));
  }
  out.resize(produced);
  return out;
}

}  // namespace

std::string rtype_name(int type) {
  switch (type) {
    case 0: return "NILSXP";
    case 1: return "SYMSXP";
    case 2: return "LISTSXP";
    case 3: return "CLOSXP";
    case 4: return "ENVSXP";
    case 5: return "PROMSXP";
    case 6: return "LANGSXP";
    case 7: return "SPECIALSXP";
    case 8: return "BUILTINSXP";
    case 9: return "CHARSXP";
    case 10: return "LGLSXP";
    case 13: return "INTSXP";
    case 14: return "REALSXP";
    case 15: return "CPLXSXP";
    case 16: return "STRSXP";
    case 17: return "DOTSXP";
    case 19: return "VECSXP";
    case 20: return "EXPRSXP";
    case 21: return "BCODESXP";
    case 22: return "EXTPTRSXP";
    case 23: return "WEAKREFSXP";
    case 24: return "RAWSXP";
    case 25: return "S4SXP";
    default: return "type " + std::to_string(type);
  }
}

size_t RValue::length() const {
  switch (type) {
    case RType::Lgl: case RType::Int: return ints.size();
    case RType::Real: return reals.size();
    case RType::Cplx: return reals.size() / 2;
    case RType::Str: return strings.size();
    case RType::Raw: return raw.size();
    case RType::Vec: case RType::Expr: case RType::List: return items.size();
    default: return 0;
  }
}

const RValue* RValue::attr(std::string_view name) const {
  for (const auto& [k, v] : attributes) {
    if (k == name) return v.get();
  }
  return nullptr;
}

std::vector<std::string> RValue::names() const {
  std::vector<std::string> out;
  if (const RValue* n = attr("names"); n && n->type == RType::Str) {
    for (const auto& s : n->strings) out.push_back(s.value_or(""));
  } else if (type == RType::List) {
    out = tags;
  }
  return out;
}

const RValue& RValue::at(std::string_view name) const {
  const std::vector<std::string> n = names();
  for (size_t i = 0; i < n.size() && i < items.size(); ++i) {
    if (n[i] == name) return *items[i];
  }
  throw taper::Error(str_cat("rdata: the list has no element named '", name, "'"));
}

RValue unserialize(std::span<const uint8_t> bytes, std::string_view what) {
  Reader r(bytes, what);
  return r.read_top();
}

std::vector<uint8_t> inflate_any(std::span<const uint8_t> bytes, std::string_view what,
                                 size_t expected_size) {
  return inflate_stream(bytes, what, expected_size);
}

std::vector<uint8_t> read_file_bytes(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw taper::Error(str_cat("rdata: cannot open ", path.string()));
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) throw taper::Error(str_cat("rdata: error reading ", path.string()));
  return bytes;
}

namespace {

// An .rds/.rdx file: gzip (saveRDS), R's 4-byte length + zlib form, or plain XDR.
std::vector<uint8_t> decode_container(const std::vector<uint8_t>& bytes, const std::string& what) {
  if (bytes.size() >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b) return inflate_stream(bytes, what, 0);
  if (bytes.size() >= 2 && bytes[1] == '\n' && (bytes[0] == 'X' || bytes[0] == 'A' || bytes[0] == 'B')) {
    return bytes;
  }
  if (bytes.size() >= 6 && bytes[4] == 0x78) {  // 0x78: the first byte of a zlib stream
    return inflate_stream(std::span(bytes).subspan(4), what, be32(bytes.data()));
  }
  throw taper::Error(str_cat("rdata: ", what, ": neither gzip, zlib nor an XDR serialisation"));
}

}  // namespace

RValue read_rds(const std::filesystem::path& path) {
  const std::string what = path.string();
  return unserialize(decode_container(read_file_bytes(path), what), what);
}

LazyLoadDb::LazyLoadDb(const std::filesystem::path& path) {
  std::filesystem::path prefix = path;
  if (std::filesystem::is_directory(path)) {
    prefix = path / "Rdata";
  } else if (path.extension() == ".rdx" || path.extension() == ".rdb") {
    prefix = path;
    prefix.replace_extension();
  }
  std::filesystem::path rdx = prefix;
  rdx += ".rdx";
  rdb_path_ = prefix;
  rdb_path_ += ".rdb";
  if (!std::filesystem::exists(rdx) || !std::filesystem::exists(rdb_path_)) {
    throw taper::Error(str_cat("rdata: lazy-load database not found: expected ", rdx.string(), " and ",
                               rdb_path_.string()));
  }
  const RValue index = read_rds(rdx);
  const std::string what = rdx.string();
  if (index.type != RType::Vec) throw taper::Error(str_cat("rdata: ", what, ": the index is not a list"));
  const RValue* vars = nullptr;
  const std::vector<std::string> top = index.names();
  for (size_t i = 0; i < top.size() && i < index.items.size(); ++i) {
    if (top[i] == "variables") vars = index.items[i].get();
    if (top[i] == "compressed") {
      const RValue& c = *index.items[i];
      if (c.type == RType::Lgl || c.type == RType::Int) {
        if (!c.ints.empty()) compression_ = c.ints[0];
      } else if (c.type == RType::Real && !c.reals.empty()) {
        const double r = c.reals[0];
        compression_ = (r >= 0 && r <= 1000) ? static_cast<int>(r) : -1;  // -1: refused below
      }
    }
  }
  if (!vars || vars->type != RType::Vec) {
    throw taper::Error(str_cat("rdata: ", what, ": the index has no 'variables' list"));
  }
  const std::vector<std::string> names = vars->names();
  if (names.size() != vars->items.size()) {
    throw taper::Error(str_cat("rdata: ", what, ": 'variables' has ", vars->items.size(), " entries and ",
                               names.size(), " names"));
  }
  for (size_t i = 0; i < names.size(); ++i) {
    const RValue& key = *vars->items[i];
    int64_t off = -1, len = -1;
    if (key.type == RType::Int && key.ints.size() == 2) {
      off = key.ints[0];
      len = key.ints[1];
    } else if (key.type == RType::Real && key.reals.size() == 2) {
      // Doubles outside [0, 2^62] (or NaN) stay -1: a bad key, not an undefined cast.
      const auto as_i64 = [](double r) {
        return r >= 0 && r <= 4611686018427387904.0 ? static_cast<int64_t>(r) : int64_t{-1};
      };
      off = as_i64(key.reals[0]);
      len = as_i64(key.reals[1]);
    }
    if (off < 0 || len < 0) {
      throw taper::Error(str_cat("rdata: ", what, ": bad (offset, length) key for '", names[i], "'"));
    }
    variables_[names[i]] = {off, len};
  }
}

std::vector<std::string> LazyLoadDb::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : variables_) out.push_back(k);
  return out;
}

bool LazyLoadDb::contains(std::string_view name) const { return variables_.find(name) != variables_.end(); }

RValue LazyLoadDb::get(std::string_view name) const {
  const auto it = variables_.find(name);
  if (it == variables_.end()) {
    std::string known;
    for (const auto& [k, v] : variables_) known += (known.empty() ? "" : ", ") + k;
    throw taper::Error(str_cat("rdata: ", rdb_path_.string(), " has no variable '", name, "' (it has: ", known, ")"));
  }
  const auto [off, len] = it->second;
  const std::string what = str_cat(rdb_path_.string(), " [", name, "]");
  std::ifstream f(rdb_path_, std::ios::binary);
  if (!f) throw taper::Error(str_cat("rdata: cannot open ", rdb_path_.string()));
  f.seekg(0, std::ios::end);
  const auto file_size = static_cast<int64_t>(f.tellg());
  if (len < 5 || off > file_size || len > file_size - off) {  // no off + len overflow
    throw taper::Error(str_cat("rdata: ", what, ": entry (", off, ", ", len, ") lies outside the file of ",
                               file_size, " bytes"));
  }
  std::vector<uint8_t> buf(static_cast<size_t>(len));
  f.seekg(off);
  f.read(reinterpret_cast<char*>(buf.data()), len);
  if (!f) throw taper::Error(str_cat("rdata: ", what, ": read failed"));

  // Every entry starts with the inflated size (4 bytes, big-endian); compression 2 and 3 add a
  // type byte: '0' stored, 'Z' zlib, '2' bzip2, 'X' xz (R_decompress2/3).
  const size_t out_len = be32(buf.data());
  std::vector<uint8_t> plain;
  if (compression_ == 1) {
    plain = inflate_stream(std::span(buf).subspan(4), what, out_len);
  } else if (compression_ == 2 || compression_ == 3) {
    const char kind = static_cast<char>(buf[4]);
    if (kind == '0') {
      plain.assign(buf.begin() + 5, buf.end());
      if (plain.size() != out_len) {
        throw taper::Error(str_cat("rdata: ", what, ": stored entry of ", plain.size(), " bytes, the header says ",
                                   out_len));
      }
    } else if (kind == 'Z') {
      plain = inflate_stream(std::span(buf).subspan(5), what, out_len);
    } else {
      throw taper::Error(str_cat("rdata: ", what, ": ", kind == '2' ? "bzip2" : kind == 'X' ? "xz" : "unknown",
                                 " compression (type byte '", kind, "') is not supported"));
    }
  } else if (compression_ == 0) {
    plain = std::move(buf);
  } else {
    throw taper::Error(str_cat("rdata: ", what, ": unknown compression ", compression_));
  }
  return unserialize(plain, what);
}

std::vector<std::string> LazyLoadDb::get_strings(std::string_view name) const {
  RValue v = get(name);
  if (v.type != RType::Str) {
    throw taper::Error(str_cat("rdata: '", name, "' is a ", rtype_name(static_cast<int>(v.type)),
                               ", not a character vector"));
  }
  std::vector<std::string> out;
  out.reserve(v.strings.size());
  for (auto& s : v.strings) out.push_back(s ? std::move(*s) : std::string());
  return out;
}

}  // namespace taper::finetune
