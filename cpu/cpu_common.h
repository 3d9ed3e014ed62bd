// cpu_common.h: what every CPU kernel family shares: the thread pool's parallel_for, per-thread
// scratch buffers, strided iteration over several operands, and output allocation.
//
// What it is not: SIMD code (each family's .cpp holds its Highway kernels; half-type SIMD
// conversions live in simd_half-inl.h).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "taper/op.h"
#include "taper/tensor.h"

namespace taper::cpu {

// compute_t<T> (f32 for bf16/f16/f32, f64 for f64) is taper::compute_t, in taper/portable.h.

/// Threads used by parallel_for (and BLAS): TAPER_NUM_THREADS, else the hardware's count.
size_t num_threads();
/// Changes the thread count (also BLAS's).
void set_num_threads(size_t n);

namespace detail {
using RangeFn = void (*)(void* ctx, size_t begin, size_t end);
void parallel_for_impl(size_t n, size_t grain, RangeFn fn, void* ctx);
}  // namespace detail

/// Runs f(begin, end) over [0, n) split into at most num_threads() chunks of at least `grain`
/// items; the calling thread takes a chunk. Runs inline when n <= grain or already inside a
/// parallel region (no oversubscription).
template <class F> void parallel_for(size_t n, size_t grain, F&& f) {
  if (n == 0) return;
  auto tramp = [](void* ctx, size_t b, size_t e) { (*static_cast<F*>(ctx))(b, e); };
  detail::parallel_for_impl(n, grain < 1 ? 1 : grain, tramp, const_cast<void*>(static_cast<const void*>(&f)));
}

/// A per-thread scratch buffer of at least n elements of C (grown, never shrunk), for kernels'
/// rows in their compute type; `kSlot` keeps the buffers a kernel holds at once apart.
template <class C, int kSlot = 0> C* thread_scratch(size_t n) {
  static thread_local std::vector<C> scratch;
  if (scratch.size() < n) scratch.resize(n);
  return scratch.data();
}

/// Iteration over the elements of `shape` for N operands with their own strides: dims are
/// coalesced (adjacent dims that are dense for every operand merge), and the innermost dim is
/// handed to the caller as a run of `inner` elements with per-operand inner strides.
template <size_t N> struct StridedLoop {
  std::vector<size_t> outer_dims;                   ///< coalesced dims except the innermost
  std::array<std::vector<int64_t>, N> outer_strides;
  size_t inner = 1;                                 ///< length of the innermost run
  std::array<int64_t, N> inner_stride{};            ///< per operand
  size_t outer_count = 1;                           ///< number of inner runs

  StridedLoop(const Shape& shape, const std::array<const std::vector<int64_t>*, N>& strides);
  /// Element offsets (relative to each operand's base) of the start of run `r`.
  std::array<int64_t, N> offsets(size_t r) const;
};

template <size_t N>
StridedLoop<N>::StridedLoop(const Shape& shape,
                            const std::array<const std::vector<int64_t>*, N>& strides) {
  // Drop size-1 dims, then merge dim i into i+1 when every operand has st[i] == st[i+1]*dim[i+1].
  std::vector<size_t> dims;
  std::array<std::vector<int64_t>, N> st;
  for (size_t i = 0; i < shape.rank(); ++i) {
    if (shape[i] == 1) continue;
    dims.push_back(shape[i]);
    for (size_t k = 0; k < N; ++k) st[k].push_back((*strides[k])[i]);
  }
  std::vector<size_t> cd;
  std::array<std::vector<int64_t>, N> cs;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (!cd.empty()) {
      bool merge = true;
      for (size_t k = 0; k < N; ++k)
        if (cs[k].back() != st[k][i] * static_cast<int64_t>(dims[i])) merge = false;
      if (merge) {
        cd.back() *= dims[i];
        for (size_t k = 0; k < N; ++k) cs[k].back() = st[k][i];
        continue;
      }
    }
    cd.push_back(dims[i]);
    for (size_t k = 0; k < N; ++k) cs[k].push_back(st[k][i]);
  }
  if (cd.empty()) {
    inner = 1;
    for (size_t k = 0; k < N; ++k) inner_stride[k] = 1;
    return;
  }
  inner = cd.back();
  for (size_t k = 0; k < N; ++k) inner_stride[k] = cs[k].back();
  cd.pop_back();
  for (size_t k = 0; k < N; ++k) {
    cs[k].pop_back();
    outer_strides[k] = cs[k];
  }
  outer_dims = cd;
  for (size_t d : cd) outer_count *= d;
}

template <size_t N> std::array<int64_t, N> StridedLoop<N>::offsets(size_t r) const {
  std::array<int64_t, N> off{};
  for (size_t i = outer_dims.size(); i-- > 0;) {
    const size_t idx = r % outer_dims[i];
    r /= outer_dims[i];
    for (size_t k = 0; k < N; ++k) off[k] += static_cast<int64_t>(idx) * outer_strides[k][i];
  }
  return off;
}

/// A new contiguous CPU tensor (uninitialised).
inline Tensor new_output(const Shape& shape, DType dt) {
  return Tensor::empty(shape, dt, Device::cpu());
}

/// Grain (elements) below which elementwise work is not worth splitting across threads.
inline constexpr size_t kElemGrain = 1 << 15;

/// How a row-wise kernel (softmax, the norms) splits R rows of length L into tasks.
struct RowSplit {
  size_t chunk;    ///< elements of a row per task (L: whole rows)
  size_t nchunks;  ///< tasks per row (1: whole rows)
};
/// Whole rows when there are enough of them to keep every thread busy (R >= 2 threads) or a row
/// is too short to split; otherwise about four tasks a thread, each chunk a multiple of 64 of at
/// least 4096 elements and at most max_chunk (a chunk's passes stay in cache). The split depends
/// on the shape only, planned for kPlanThreads threads whatever the count: the chunks' partial
/// statistics are combined in chunk order, so the results are the same bits at any thread count
/// (with num_threads() here, a few long rows gave statistics whose last bits moved with it).
inline constexpr size_t kPlanThreads = 8;
inline RowSplit split_rows(size_t R, size_t L, size_t max_chunk) {
  constexpr size_t kMinSplitChunk = 4096;  // the smallest chunk worth a task of its own
  const size_t T = kPlanThreads;
  if (R == 0 || R >= 2 * T || L < 2 * kMinSplitChunk) return {L, 1};
  const size_t per_row = (4 * T + R - 1) / R;
  size_t chunk = (L + per_row - 1) / per_row;
  chunk = std::min(std::max(kMinSplitChunk, (chunk + 63) / 64 * 64), max_chunk);
  const size_t nchunks = (L + chunk - 1) / chunk;
  if (nchunks <= 1) return {L, 1};
  return {chunk, nchunks};
}

/// Outputs of at least this many bytes are written with streaming (non-temporal) stores by the
/// fused kernels: past the last-level cache they would be evicted before any reader came, so
/// writing around the cache saves the read-for-ownership of every line (on the 2-core dev
/// machine a scaled copy of 64 MiB went from ~50 to ~68 GB/s). Smaller outputs stay cached for
/// the op that reads them next.
inline constexpr size_t kStreamStoreBytes = size_t{16} << 20;
/// Whether a kernel writes `out` with streaming stores (kStreamStoreBytes).
inline bool use_stream_stores(const Tensor& out) {
  return out.elem_count() * dtype_size(out.dtype()) >= kStreamStoreBytes;
}
/// Rows up to this many bytes are prefetched one row ahead while the current row is computed.
inline constexpr size_t kPrefetchRowBytes = size_t{256} << 10;

}  // namespace taper::cpu
