// cpu_hooks.h: the test hooks of the CPU backend, the only way tests and benches reach cpu/
// internals (nothing outside cpu/ includes a cpu/ header; Layering.NothingOutsideCpuIncludesCpu
// checks it): run the SIMD conversions and the softmax exp on a chosen Highway target, run a
// baseline on taper's thread pool, read a kernel threshold a test must cross.
//
// What it is: declarations only, one per function; the definitions are in cpu/copy_cast.cpp,
// cpu/softmax.cpp and cpu/test_hooks.cpp, which do not include this header (cpu/ includes core/
// alone). A definition whose parameters drift from its declaration here fails the link of
// taper_tests; the linker does not see return types, so change one in both places.
// What it is not: public API (taper/taper.h is), nor the scalar references (tests/ref/).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "taper/dtype.h"

namespace taper::cpu {

// ---- Highway dispatch (defined in cpu/copy_cast.cpp) ------------------------------------------

/// The Highway targets copy_cast.cpp was compiled for that this CPU supports (best first).
std::vector<int64_t> simd_targets_for_test();
/// Restricts dynamic dispatch (of every Highway kernel) to `target`; 0 restores the default.
void set_simd_target_for_test(int64_t target);
/// Printable name of a target from simd_targets_for_test().
const char* simd_target_name(int64_t target);
/// Converts n contiguous elements between two float dtypes with the SIMD path of to_dtype on the
/// current dispatch target (simd_half-inl.h's LoadAs/StoreFrom, tails included); returns the
/// target that ran.
int64_t convert_contiguous_for_test(const void* src, DType from, void* dst, DType to, size_t n);
/// convert_contiguous_for_test from f32 to bf16 or f16 (`to`), as raw bits.
int64_t convert_f32_to_half_for_test(const float* src, uint16_t* dst, size_t n, DType to);

// ---- the softmax exp (defined in cpu/softmax.cpp) ---------------------------------------------

/// y[0, n) = the softmax kernels' exp (ExpNoSubnormal of simd_exp-inl.h) of t[0, n), f32 or f64
/// (`dt`), on the current dispatch target; returns it.
int64_t softmax_exp_for_test(const void* t, void* y, DType dt, size_t n);

// ---- thread pool and thresholds (defined in cpu/test_hooks.cpp) -------------------------------

/// cpu::parallel_for with a plain function: fn(ctx, begin, end) over [0, n) split into at most
/// num_threads() chunks of at least `grain` items on taper's pool, the caller taking a chunk.
void parallel_for_for_test(size_t n, size_t grain, void (*fn)(void* ctx, size_t begin, size_t end),
                           void* ctx);
/// cpu::kStreamStoreBytes: the fused kernels write outputs of at least this many bytes with
/// streaming (non-temporal) stores.
size_t stream_store_bytes_for_test();

}  // namespace taper::cpu

namespace taper::testing {

/// Runs f(begin, end) over [0, n) on taper's thread pool, as cpu::parallel_for does (for the
/// benches' plain-C++ baselines, which must split work the way taper's kernels do).
template <class F> void parallel_for(size_t n, size_t grain, F&& f) {
  using Fn = std::remove_reference_t<F>;
  auto tramp = [](void* ctx, size_t b, size_t e) { (*static_cast<Fn*>(ctx))(b, e); };
  cpu::parallel_for_for_test(n, grain, tramp, const_cast<void*>(static_cast<const void*>(&f)));
}

}  // namespace taper::testing
