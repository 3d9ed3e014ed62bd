// error.cpp: the handler behind TAPER_ASSERT (error.h): an internal invariant that failed
// prints the expression and file:line, then aborts. What it is not: user errors, which throw
// taper::Error through TAPER_CHECK and never abort.
#include <cstdio>
#include <cstdlib>

#include "taper/error.h"

namespace taper {

namespace detail {
void assert_fail(const char* expr, const char* file, int line) {
  std::fprintf(stderr, "taper: internal assertion failed: %s at %s:%d\n", expr, file, line);
  std::abort();
}
}  // namespace detail

}  // namespace taper
