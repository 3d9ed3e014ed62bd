// threads_child.cpp: a program for Threads.BadEnvironmentValueIsAnErrorNamingTheVariable
// (test_core.cpp), which runs it with a bad TAPER_NUM_THREADS: TAPER_NUM_THREADS is read when the
// thread pool starts, once per process. Prints the Error the first use of the pool raises and
// exits 0; exits 1 when there was none.
#include <cstdio>

#include "taper/taper.h"

int main() {
  try {
    std::printf("threads: %zu\n", taper::num_threads());
  } catch (const taper::Error& e) {
    std::printf("%s\n", e.what());
    return 0;
  }
  return 1;
}
