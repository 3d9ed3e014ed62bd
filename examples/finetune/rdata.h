// rdata.h: a reader of R's serialisation format and of R's lazy-load databases
// (`Rdata.rdx` / `Rdata.rdb`, what an R package with `LazyData: true` installs), enough to load
// the character vectors of Debian's r-cran-janeaustenr (the six novels) without R.
//
// What it is: XDR (big-endian binary, header "X\n") serialisation, versions 2 and 3; the SEXP
// types NIL, SYMSXP, LISTSXP (pairlists, flattened into items + tags), LGLSXP, INTSXP, REALSXP,
// CPLXSXP, STRSXP, CHARSXP (UTF-8, Latin-1 converted to UTF-8, ASCII, bytes, NA_STRING),
// VECSXP/EXPRSXP, RAWSXP, references to symbols (REFSXP), attributes and tags, long vectors,
// and the ALTREP classes compact_intseq, compact_realseq and wrap_*; the lazy-load index
// (.rdx: gzip or 4-byte length + zlib) and entries (.rdb: zlib, or the typed '0'/'Z' forms).
// What it is not: environments, closures, language objects, byte code, ASCII ("A\n") or native
// ("B\n") formats, bzip2/xz-compressed databases: those throw taper::Error naming the type.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace taper::finetune {

/// R's SEXP type codes (the low 8 bits of a serialised item's flags) that the reader knows.
enum class RType : int {
  Nil = 0, Sym = 1, List = 2, Lgl = 10, Int = 13, Real = 14, Cplx = 15, Str = 16, Vec = 19,
  Expr = 20, Raw = 24,
};

/// The name R gives a SEXP type code ("STRSXP"), or "type N" for codes it does not name.
std::string rtype_name(int type);

/// R's NA_integer_ and NA_logical (both INT_MIN).
inline constexpr int32_t kRNaInt = INT32_MIN;

/// One unserialised R object. Pairlists are flattened: `items` holds the CARs and `tags` the TAG
/// names ("" where untagged). Attributes are kept by name, in file order.
struct RValue {
  RType type = RType::Nil;
  std::vector<int32_t> ints;                        ///< LGLSXP, INTSXP (NA = kRNaInt)
  std::vector<double> reals;                        ///< REALSXP; CPLXSXP as (re, im) pairs
  std::vector<std::optional<std::string>> strings;  ///< STRSXP in UTF-8; nullopt = NA_STRING
  std::vector<uint8_t> raw;                         ///< RAWSXP
  std::vector<std::shared_ptr<RValue>> items;       ///< VECSXP, EXPRSXP, LISTSXP
  std::vector<std::string> tags;                    ///< LISTSXP tags, parallel to items
  std::string symbol;                               ///< SYMSXP: the symbol's name
  std::vector<std::pair<std::string, std::shared_ptr<RValue>>> attributes;

  /// Number of elements (0 for NULL and symbols).
  size_t length() const;
  /// The attribute called `name`, or nullptr.
  const RValue* attr(std::string_view name) const;
  /// The `names` attribute as strings (NA as ""), or the tags of a pairlist; empty when none.
  std::vector<std::string> names() const;
  /// The element called `name` of a named list; throws taper::Error when absent.
  const RValue& at(std::string_view name) const;
};

/// Parses one XDR serialisation ("X\n" header, version 2 or 3). `what` names the source in
/// errors. Throws taper::Error on truncated or malformed input and on unsupported types.
RValue unserialize(std::span<const uint8_t> bytes, std::string_view what = "R data");

/// Inflates a gzip stream or a zlib stream (detected from the first bytes). Throws on corrupt
/// input.
std::vector<uint8_t> inflate_any(std::span<const uint8_t> bytes, std::string_view what,
                                 size_t expected_size = 0);

/// Reads a whole file; throws taper::Error naming the path when it cannot be read.
std::vector<uint8_t> read_file_bytes(const std::filesystem::path& path);

/// Reads an .rds file (gzip-compressed or plain XDR serialisation) into an RValue.
RValue read_rds(const std::filesystem::path& path);

/// An R lazy-load database: `<prefix>.rdx` (the index) and `<prefix>.rdb` (the objects).
class LazyLoadDb {
 public:
  /// Opens `dir/Rdata.rdx` + `dir/Rdata.rdb` when `path` is a directory, else
  /// `path.rdx` + `path.rdb` (with or without the extension). Reads only the index.
  explicit LazyLoadDb(const std::filesystem::path& path);

  /// Names of the variables in the database, sorted.
  std::vector<std::string> names() const;
  /// Whether the database holds a variable called `name`.
  bool contains(std::string_view name) const;
  /// Unserialises the variable `name`; throws taper::Error if absent or corrupt.
  RValue get(std::string_view name) const;
  /// The variable `name` as a character vector, NA as ""; throws unless it is a STRSXP.
  std::vector<std::string> get_strings(std::string_view name) const;

 private:
  std::filesystem::path rdb_path_;
  int compression_ = 1;  // the index's `compressed` entry: 1 zlib, 2 bzip2, 3 xz (typed)
  std::map<std::string, std::pair<int64_t, int64_t>, std::less<>> variables_;  // offset, length
};

}  // namespace taper::finetune
