// error.h: `taper::Error`, the one exception type of the public API.
//
// Every misuse (shape, dtype or device mismatch, bad dim, bad file) throws it, with a message
// that names the op and the offending shapes/dtypes. Internal invariants use TAPER_ASSERT.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace taper {

/// The exception thrown for every user-facing error.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

namespace detail {
template <class... Args> std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void assert_fail(const char* expr, const char* file, int line);
}  // namespace detail

}  // namespace taper

/// Throws taper::Error with the streamed message when `cond` is false.
#define TAPER_CHECK(cond, ...)                                               \
  do {                                                                       \
    if (!(cond)) throw ::taper::Error(::taper::detail::str_cat(__VA_ARGS__)); \
  } while (0)

/// Internal invariant: aborts with file and line (never for user input).
#define TAPER_ASSERT(cond) \
  do {                     \
    if (!(cond)) ::taper::detail::assert_fail(#cond, __FILE__, __LINE__); \
  } while (0)
