// test_hooks.cpp: the CPU backend's test hooks that are not Highway code: taper's thread pool
// and the kernels' thresholds, for tests and benches, which include no cpu/ header.
//
// What it is: thin definitions of functions declared in tests/cpu_hooks.h (not included here:
// cpu/ includes core/ alone; the signatures must match that header). The Highway hooks live in
// the translation units of their kernels (copy_cast.cpp, softmax.cpp), next to HWY_EXPORT.
// What it is not: public API (taper::num_threads / set_num_threads are, in taper/device.h).
#include <cstddef>

#include "cpu/cpu_common.h"

namespace taper::cpu {

void parallel_for_for_test(size_t n, size_t grain, detail::RangeFn fn, void* ctx) {
  if (n == 0) return;
  detail::parallel_for_impl(n, grain < 1 ? 1 : grain, fn, ctx);
}

size_t stream_store_bytes_for_test() { return kStreamStoreBytes; }

}  // namespace taper::cpu
