// fuzz_common.h: what the fuzz targets share: a finding check, a reader of the fuzz input as a
// stream of choices, a private scratch folder for readers that take paths, and one catch for
// "an Error is a fine answer, any other exception is a finding".
//
// What it is not: a harness of its own; libFuzzer drives every target (LLVMFuzzerTestOneInput).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <string_view>

#include "taper/error.h"

// UBSan's report with a stack (each target includes this header from its one source file).
extern "C" const char* __ubsan_default_options() { return "print_stacktrace=1"; }

namespace taper::fuzz {

/// A finding: prints the message and aborts, which libFuzzer records as a crash (and saves
/// the input). For broken invariants, not for a taper::Error, which is a fine answer.
[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "\n==FUZZ FINDING== %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

#define TAPER_FUZZ_CHECK(cond, ...)                                                         \
  do {                                                                                      \
    if (!(cond))                                                                            \
      ::taper::fuzz::finding(::taper::detail::str_cat(__FILE__, ":", __LINE__, ": ", #cond, \
                                                      ": " __VA_OPT__(, ) __VA_ARGS__));    \
  } while (0)

/// Runs `f`; a taper::Error is an answer (returns false), anything else thrown is a finding
/// (the design promises taper::Error for every misuse). Returns true when `f` returned.
template <class F>
bool guarded(const char* what, F&& f) {
  try {
    f();
    return true;
  } catch (const taper::Error&) {
    return false;
  } catch (const std::exception& e) {
    finding(std::string(what) + ": an exception that is not a taper::Error: " + e.what());
  } catch (...) {
    finding(std::string(what) + ": a non-std exception");
  }
}

/// The fuzz input read as a stream of choices; past the end every read gives 0, so each input
/// (however short) is one deterministic program.
class Choices {
 public:
  Choices(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  bool empty() const { return i_ >= n_; }
  size_t left() const { return n_ - i_; }
  uint8_t u8() { return i_ < n_ ? p_[i_++] : 0; }
  uint16_t u16() { return static_cast<uint16_t>(u8() | (u8() << 8)); }
  uint32_t u32() { return u16() | (uint32_t{u16()} << 16); }
  uint64_t u64() { return u32() | (uint64_t{u32()} << 32); }
  /// In [0, n); 0 when n == 0.
  size_t below(size_t n) {
    if (n == 0) return 0;
    return n <= 256 ? u8() % n : (n <= 65536 ? u16() % n : u64() % n);
  }
  bool coin() { return u8() & 1; }
  /// True about once in `n` reads.
  bool one_in(unsigned n) { return u8() % n == 0; }
  /// Up to `max` raw bytes of what is left.
  std::string_view bytes(size_t max) {
    const size_t k = std::min(max, left());
    std::string_view s(reinterpret_cast<const char*>(p_ + i_), k);
    i_ += k;
    return s;
  }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t i_ = 0;
};

/// A folder of this process's own, made on first use and removed at a normal exit, for readers
/// that only take paths: under $TAPER_FUZZ_SCRATCH when set (scripts/fuzz.sh sets it, and removes
/// what a crashed run leaves), else under /dev/shm where there is one (on ext4, rewriting a
/// truncated file flushes it to disk at close, which would make file-based targets several times
/// slower), else under $TMPDIR or /tmp.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const char* t = std::getenv("TMPDIR");
    const char* s = std::getenv("TAPER_FUZZ_SCRATCH");
    std::string base = t && *t ? t : "/tmp";
    if (access("/dev/shm", W_OK | X_OK) == 0) base = "/dev/shm";
    if (s && *s) base = s;
    std::string tmpl = base + "/taper-fuzz-XXXXXX";
    if (!mkdtemp(tmpl.data())) finding("cannot make a scratch folder under " + tmpl);
    std::filesystem::path p(tmpl);
    static const std::filesystem::path to_remove = p;
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(to_remove, ec);
    });
    return p;
  }();
  return dir;
}

/// Writes `bytes` to `scratch_dir() / name` and returns the path.
inline std::filesystem::path write_scratch(const std::string& name, std::string_view bytes) {
  const std::filesystem::path p = scratch_dir() / name;
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  if (!f) finding("cannot write " + p.string());
  return p;
}

}  // namespace taper::fuzz
