// reduce.cu: CUDA kernels of the reduce family: sum, max, min over a set of dims, argmax and
// argmin over one dim (OpId::sum/max/min/argmax/argmin), mirroring cpu/reduce.cpp.
//
// Shapes: the (contiguous) input is viewed as x: (O, R, I), O = the kept dims before the reduced
// ones, R = the reduced dims (adjacent, flattened), I = the kept dims after them; out: (O, I).
// Reduced dims that are not adjacent ({0, 2} of rank 3) are first brought together by one
// permuting copy, as on the CPU (rows of x's last dim; slow for long strides: about 0.5 TB/s on
// (1024, 1024, 256) over {0, 2}, against 4.3 TB/s for the adjacent cases below).
//   I == 1 (rows): a group of tpr threads (a power of two, 1..256, from R) per row, 16-byte
//     vector loads; long rows with few outputs (sum_all) are split into chunks, one group per
//     chunk, whose partials a second kernel combines (two pass).
//   I > 1 (columns): a block of bx columns x by row lanes (bx = 32 once I >= 32), threads across
//     columns so every row is one coalesced segment; when O * ceil(I / bx) blocks cannot fill
//     the device, R is split across blocks and a second kernel combines the partials.
//
// Determinism: every plan (tpr, chunks, splits, block shape) depends on the shape and dtype only,
// never on the device, and each thread's elements, the order it folds them in and the combining
// trees (warp shuffles, shared memory, the partials' fold) are fixed: no atomics, the same bits on
// every run and every GPU. max/min/argmax/argmin pick under a total order, so their results do
// not depend on the tree at all and equal the CPU's exactly (but see ±0 below); integer sums wrap,
// which is associative, so they are exact too.
//
// Precision: bf16/f16/f32 sums add at most 16 (f32 rows), 32 (half rows) or 8 (columns) values
// in f32, then carry on in f64 (thread totals, the trees and the partials), rounded once to the
// output dtype; f64 is f64 throughout. The CPU folds 2048-element blocks in f32 lanes and adds the
// block sums in f64, so the two differ only in f32 rounding: expect |gpu - cpu| within a few ulp
// of the result, bounded by ~1e-5 * sum(|x|) for f32 (and by the output rounding for halves).
// NaN: max/min give NaN (the canonical quiet NaN, as the CPU); argmax and argmin give the index of
// the first NaN. Ties: the first index. ±0: max(-0, +0) = +0 and min(-0, +0) = -0 whatever the
// order (the CPU's SIMD max keeps whichever zero its lanes saw last, so the sign of a zero result
// may differ; the values compare equal).
//
// What it is not: mean (the front-end scales a sum), the backward rules (core/backward.cpp), or
// argument checks (the front-end normalises the dims: sorted, unique, non-empty).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "cuda/cuda_common.cuh"
#include "taper/dtype.h"
#include "taper/error.h"

namespace taper::cuda {
namespace {

constexpr int kBlock = 256;     ///< threads per block of every kernel here
constexpr int kUnroll = 4;      ///< 16-byte vectors a row thread loads before it adds any
constexpr int kColUnroll = 8;   ///< rows a column thread loads before it adds any
constexpr int kMinSteps = 4;    ///< a chunk / split gives each thread at least this many steps
/// Blocks a plan aims for before it splits rows or columns: about one full wave of a 132-SM
/// H200 (8 blocks of 256 per SM). A constant, so that plans do not depend on the device.
constexpr int64_t kTargetBlocks = 1024;
constexpr int64_t kMaxRowSplits = 4096;
constexpr int64_t kMaxColSplits = 65535;  // gridDim.y
constexpr int64_t kNone = std::numeric_limits<int64_t>::max();  ///< an arg state with no element

inline int ceil_log2(int64_t v) {
  int l = 0;
  while ((int64_t{1} << l) < v) ++l;
  return l;
}

template <class T> inline constexpr bool kIsFloat = !std::is_integral_v<T>;

/// The value a kernel compares or adds in: compute_t<T> for floats, T itself for integers.
template <class T> using value_t = std::conditional_t<kIsFloat<T>, compute_t<T>, T>;

template <class T> __device__ __forceinline__ value_t<T> load_value(T v) {
  if constexpr (kIsFloat<T>) return widen(v);
  else return v;
}

template <class V> __device__ __forceinline__ bool is_nan(V v) {
  if constexpr (std::is_floating_point_v<V>) return v != v;
  else return false;
}

template <class V> __device__ __forceinline__ V quiet_nan() {
  if constexpr (std::is_same_v<V, double>) return f64_from_bits(0x7ff8000000000000ull);
  else return f32_from_bits(0x7fc00000u);
}

// ---- the three reductions: state (Acc), the per-step chain (Part), combine, finish ----------
// first(v, i) starts a step's chain with element v (index i along the reduced dims); add(p, v, i)
// folds the next element into it (a step's elements come in increasing index order); flush(a, p)
// folds a finished chain into the thread's state; merge(a, b) combines two states (a from the
// lower lanes); finish(a) is the output value.

/// Sum: floats chain in compute_t (f32 for the halves and f32) over one step, then f64; integers
/// add in u64 and are truncated to their width at the end (the same as wrapping every add).
template <class T> struct SumOp {
  using Acc = std::conditional_t<kIsFloat<T>, double, uint64_t>;
  using Part = std::conditional_t<kIsFloat<T>, compute_t<T>, uint64_t>;
  using Out = T;
  bool is_max;  // unused; keeps the three ops alike
  __device__ __forceinline__ Acc identity() const { return Acc(0); }
  __device__ __forceinline__ Part first(T v, int64_t) const {
    if constexpr (kIsFloat<T>) return widen(v);
    else return static_cast<uint64_t>(v);
  }
  __device__ __forceinline__ Part add(Part p, T v, int64_t i) const { return p + first(v, i); }
  __device__ __forceinline__ Acc flush(Acc a, Part p) const { return a + static_cast<Acc>(p); }
  __device__ __forceinline__ Acc merge(Acc a, Acc b) const { return a + b; }
  __device__ __forceinline__ Out finish(Acc a) const {
    if constexpr (kIsFloat<T>) return round_to<T>(a);
    else return static_cast<T>(a);
  }
};

/// Max (is_max) or min. NaN absorbs; otherwise the larger (smaller), +0 above -0: a total order,
/// so the result is the same for any tree.
template <class T> struct ExtremeOp {
  using V = value_t<T>;
  using Acc = V;
  using Part = V;
  using Out = T;
  bool is_max;
  __device__ __forceinline__ Acc identity() const {
    if constexpr (kIsFloat<T>)
      return is_max ? -std::numeric_limits<V>::infinity() : std::numeric_limits<V>::infinity();
    else
      return is_max ? std::numeric_limits<V>::lowest() : std::numeric_limits<V>::max();
  }
  __device__ __forceinline__ Part first(T v, int64_t) const { return load_value(v); }
  __device__ __forceinline__ Acc merge(Acc a, Acc b) const {
    if constexpr (kIsFloat<T>) {
      if (is_nan(a)) return a;
      if (is_nan(b)) return b;
      if (b == a) return (std::signbit(a) != std::signbit(b) && std::signbit(a) == is_max) ? b : a;
    }
    return (is_max ? b > a : b < a) ? b : a;
  }
  __device__ __forceinline__ Part add(Part p, T v, int64_t) const { return merge(p, load_value(v)); }
  __device__ __forceinline__ Acc flush(Acc a, Part p) const { return merge(a, p); }
  __device__ __forceinline__ Out finish(Acc a) const {
    if constexpr (kIsFloat<T>) return round_to<T>(is_nan(a) ? quiet_nan<V>() : a);  // exact
    else return a;
  }
};

/// An argmax/argmin state: the best value so far and its index (kNone: no element yet).
template <class V> struct ArgAcc {
  V v;
  int64_t i;
};

/// Argmax (is_max) or argmin: the first NaN, else the first index of the extreme. merge picks
/// the least under (NaN first, then by value, then by index), a total order: any tree gives the
/// CPU's answer.
template <class T> struct ArgOp {
  using V = value_t<T>;
  using Acc = ArgAcc<V>;
  using Part = Acc;
  using Out = int64_t;
  bool is_max;
  __device__ __forceinline__ Acc identity() const { return Acc{V(0), kNone}; }
  __device__ __forceinline__ Part first(T v, int64_t i) const { return Acc{load_value(v), i}; }
  __device__ __forceinline__ Acc merge(Acc a, Acc b) const {
    if (b.i == kNone) return a;
    if (a.i == kNone) return b;
    if constexpr (kIsFloat<T>) {
      const bool an = is_nan(a.v), bn = is_nan(b.v);
      if (an || bn) {
        if (an && bn) return b.i < a.i ? b : a;
        return an ? a : b;
      }
    }
    if (is_max ? b.v > a.v : b.v < a.v) return b;
    if (is_max ? a.v > b.v : a.v < b.v) return a;
    return b.i < a.i ? b : a;  // equal values (-0 == +0 too): the first index
  }
  /// i is past every index in p, so equal values keep p; a NaN replaces only a non-NaN.
  __device__ __forceinline__ Part add(Part p, T v, int64_t i) const {
    const V w = load_value(v);
    bool take = is_max ? w > p.v : w < p.v;
    if constexpr (kIsFloat<T>) take = take || (is_nan(w) && !is_nan(p.v));
    return take ? Acc{w, i} : p;
  }
  __device__ __forceinline__ Acc flush(Acc a, Part p) const { return merge(a, p); }
  __device__ __forceinline__ Out finish(Acc a) const { return a.i == kNone ? 0 : a.i; }
};

// ---- warp shuffles of the states -----------------------------------------------------------

template <class V> __device__ __forceinline__ V shfl_down(V v, int off) {
  if constexpr (sizeof(V) < 4)
    return static_cast<V>(__shfl_down_sync(0xffffffffu, static_cast<unsigned>(v), off));
  else if constexpr (std::is_same_v<V, int64_t>)
    return static_cast<int64_t>(__shfl_down_sync(0xffffffffu, static_cast<long long>(v), off));
  else if constexpr (std::is_same_v<V, uint64_t>)
    return static_cast<uint64_t>(
        __shfl_down_sync(0xffffffffu, static_cast<unsigned long long>(v), off));
  else
    return __shfl_down_sync(0xffffffffu, v, off);
}
template <class V> __device__ __forceinline__ ArgAcc<V> shfl_down(ArgAcc<V> a, int off) {
  return ArgAcc<V>{shfl_down(a.v, off), shfl_down(a.i, off)};
}

/// Tree over aligned groups of `width` lanes (a power of two <= 32): lane 0 of each group ends
/// with merge over its group, always in the same pairing. Every lane of the warp must call it.
template <class Op>
__device__ __forceinline__ typename Op::Acc warp_tree(const Op& op, typename Op::Acc a,
                                                      int width) {
  for (int off = width >> 1; off > 0; off >>= 1) a = op.merge(a, shfl_down(a, off));
  return a;
}

// ---- kernels -------------------------------------------------------------------------------

/// x: (rows, n) -> out: (rows) when splits == 1, else partial: (rows, splits) of Acc.
/// Group g (tpr threads) handles segment g = (row, chunk): virtual vectors [chunk * chunk_vecs,
/// +chunk_vecs) of kVec elements counted from the row's first element, so the grouping of the
/// adds does not depend on alignment; aligned rows load each vector in one 16-byte load.
template <class T, class Op>
__global__ void __launch_bounds__(kBlock)
    reduce_rows_kernel(const T* __restrict__ x, int64_t rows, int64_t n, int tpr_log2,
                       int64_t chunk_vecs, int64_t splits, Op op, typename Op::Out* __restrict__ out,
                       typename Op::Acc* __restrict__ partial) {
  using Acc = typename Op::Acc;
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  const int tpr = 1 << tpr_log2;
  const int lane = static_cast<int>(threadIdx.x) & (tpr - 1);
  const int64_t seg = static_cast<int64_t>(blockIdx.x) * (kBlock >> tpr_log2) +
                      (static_cast<int>(threadIdx.x) >> tpr_log2);
  const bool active = seg < rows * splits;
  const int64_t row = !active ? 0 : (splits == 1 ? seg : seg / splits);
  const int64_t chunk = seg - row * splits;
  Acc acc = op.identity();
  if (active) {
    const T* xr = x + row * n;
    const int64_t nfull = n / kVec;        // whole vectors
    const int64_t nv = ceil_div(n, kVec);  // and a partial last one
    const int64_t v0 = chunk * chunk_vecs;
    const int64_t v1 = v0 + chunk_vecs < nv ? v0 + chunk_vecs : nv;
    const int64_t full_end = v1 < nfull ? v1 : nfull;
    const bool aligned = (reinterpret_cast<uintptr_t>(xr) & 15u) == 0;
    const int64_t step = static_cast<int64_t>(kUnroll) << tpr_log2;
    int64_t j = v0 + lane;
    for (; j + static_cast<int64_t>(kUnroll - 1) * tpr < full_end; j += step) {
      T e[kUnroll][kVec];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const T* p = xr + (j + static_cast<int64_t>(u) * tpr) * kVec;
        if (aligned) {
          const uint4 w = __ldg(reinterpret_cast<const uint4*>(p));
          memcpy(&e[u][0], &w, 16);
        } else {
#pragma unroll
          for (int l = 0; l < kVec; ++l) e[u][l] = p[l];
        }
      }
      typename Op::Part part = op.first(e[0][0], j * kVec);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i0 = (j + static_cast<int64_t>(u) * tpr) * kVec;
#pragma unroll
        for (int l = (u == 0 ? 1 : 0); l < kVec; ++l) part = op.add(part, e[u][l], i0 + l);
      }
      acc = op.flush(acc, part);
    }
    // The last step: up to kUnroll vectors, some absent or partial (scalar loads, bounded by n).
    if (j < v1) {  // element j * kVec < n: vector j exists
      typename Op::Part part = op.first(xr[j * kVec], j * kVec);
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t jj = j + static_cast<int64_t>(u) * tpr;
        if (jj >= v1) break;
        for (int l = (u == 0 ? 1 : 0); l < kVec; ++l) {
          const int64_t i = jj * kVec + l;
          if (i < n) part = op.add(part, xr[i], i);
        }
      }
      acc = op.flush(acc, part);
    }
  }
  acc = warp_tree(op, acc, tpr < 32 ? tpr : 32);
  if (tpr > 32) {  // uniform across the block: every thread reaches the barrier
    __shared__ Acc warp_acc[kBlock / 32];
    const int warp = static_cast<int>(threadIdx.x) >> 5;
    if ((threadIdx.x & 31u) == 0) warp_acc[warp] = acc;
    __syncthreads();
    if (lane < 32) {  // the group's first warp, whole
      acc = lane < (tpr >> 5) ? warp_acc[warp + lane] : op.identity();
      acc = warp_tree(op, acc, tpr >> 5);
    }
  }
  if (active && lane == 0) {
    if (splits == 1) out[row] = op.finish(acc);
    else partial[seg] = acc;  // seg == row * splits + chunk
  }
}

/// x: (outer, red, inner) -> out: (outer, inner) when gridDim.y == 1, else partial:
/// (outer, gridDim.y, inner). Block: bx columns (tx) x by row lanes (ty); blockIdx.y takes rows
/// [y * rows_per_split, +rows_per_split); lane ty folds rows r0 + ty + k * by in order, the by
/// lanes are combined by a fixed shared-memory tree.
template <class T, class Op>
__global__ void __launch_bounds__(kBlock)
    reduce_cols_kernel(const T* __restrict__ x, int64_t outer, int64_t red, int64_t inner,
                       int bx_log2, int64_t tiles, int64_t rows_per_split, Op op,
                       typename Op::Out* __restrict__ out, typename Op::Acc* __restrict__ partial) {
  using Acc = typename Op::Acc;
  __shared__ Acc lanes[kBlock];
  const int bx = 1 << bx_log2, by = kBlock >> bx_log2;
  const int tx = static_cast<int>(threadIdx.x) & (bx - 1);
  const int ty = static_cast<int>(threadIdx.x) >> bx_log2;
  const int64_t splits = gridDim.y, split = blockIdx.y;
  const int64_t r0 = split * rows_per_split;
  const int64_t r1 = r0 + rows_per_split < red ? r0 + rows_per_split : red;
  for (int64_t b = blockIdx.x; b < outer * tiles; b += gridDim.x) {  // uniform per block
    const int64_t o = b / tiles;
    const int64_t c = (b - o * tiles) * bx + tx;
    Acc acc = op.identity();
    if (c < inner) {
      const T* xc = x + o * red * inner + c;
      int64_t r = r0 + ty;
      for (; r + static_cast<int64_t>(kColUnroll - 1) * by < r1;
           r += static_cast<int64_t>(kColUnroll) * by) {
        T e[kColUnroll];
#pragma unroll
        for (int u = 0; u < kColUnroll; ++u) e[u] = xc[(r + static_cast<int64_t>(u) * by) * inner];
        typename Op::Part part = op.first(e[0], r);
#pragma unroll
        for (int u = 1; u < kColUnroll; ++u)
          part = op.add(part, e[u], r + static_cast<int64_t>(u) * by);
        acc = op.flush(acc, part);
      }
      if (r < r1) {
        typename Op::Part part = op.first(xc[r * inner], r);
        for (int u = 1; u < kColUnroll; ++u) {
          const int64_t rr = r + static_cast<int64_t>(u) * by;
          if (rr >= r1) break;
          part = op.add(part, xc[rr * inner], rr);
        }
        acc = op.flush(acc, part);
      }
    }
    lanes[threadIdx.x] = acc;
    __syncthreads();
    for (int h = by >> 1; h > 0; h >>= 1) {
      if (ty < h) lanes[threadIdx.x] = op.merge(lanes[threadIdx.x], lanes[threadIdx.x + h * bx]);
      __syncthreads();
    }
    if (ty == 0 && c < inner) {
      if (splits == 1) out[o * inner + c] = op.finish(lanes[tx]);
      else partial[(o * splits + split) * inner + c] = lanes[tx];
    }
    __syncthreads();  // lanes is reused by the next b
  }
}

/// partial: (outer, splits, inner) -> out: (outer, inner), one warp per output: lane l folds
/// splits l, l + 32, ... in order, then a fixed warp tree.
template <class Op>
__global__ void __launch_bounds__(kBlock)
    combine_partials_kernel(const typename Op::Acc* __restrict__ partial, int64_t outer,
                            int64_t inner, int64_t splits, Op op,
                            typename Op::Out* __restrict__ out) {
  using Acc = typename Op::Acc;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t nout = outer * inner;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kBlock / 32);
  for (int64_t w = (static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x) >> 5; w < nout;
       w += warps) {  // uniform per warp
    const int64_t o = w / inner, i = w - o * inner;
    Acc acc = op.identity();
    for (int64_t s = lane; s < splits; s += 32) acc = op.merge(acc, partial[(o * splits + s) * inner + i]);
    acc = warp_tree(op, acc, 32);
    if (lane == 0) out[w] = op.finish(acc);
  }
}

/// dst: (rows, inner) contiguous = the permuted view of src: row r starts at outer's offset of r,
/// its elements `stride` apart (1 in the reduce family's permutations: x's last dim stays last).
/// Block: bx element lanes x by row lanes, so the row offsets are computed once per row.
template <class E>
__global__ void __launch_bounds__(kBlock)
    permute_rows_kernel(E* __restrict__ dst, const E* __restrict__ src, Strided<1> outer,
                        int64_t rows, int64_t inner, int64_t stride, int bx_log2) {
  const int bx = 1 << bx_log2, by = kBlock >> bx_log2;
  const int tx = static_cast<int>(threadIdx.x) & (bx - 1);
  const int ty = static_cast<int>(threadIdx.x) >> bx_log2;
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * by + ty; r < rows;
       r += static_cast<int64_t>(gridDim.y) * by) {
    int64_t off[1];
    outer.offsets(r, off);
    E* d = dst + r * inner;
    const E* s = src + off[0];
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * bx + tx; c < inner;
         c += static_cast<int64_t>(gridDim.x) * bx)
      d[c] = s[c * stride];
  }
}

// ---- host side -----------------------------------------------------------------------------

/// Scratch bytes on `like`'s device (freed to the cache when the Tensor goes; later work on the
/// same stream is ordered after this use).
Tensor scratch(size_t bytes, const Tensor& like) {
  return Tensor::empty(Shape({bytes}), DType::U8, like.device());
}

/// Runs the reduction of x: (O, R, I), R >= 1, into out: (O, I).
template <class T, class Op>
void run_reduce(const char* name, const std::vector<Tensor>& in, const Op& op, const T* x,
                int64_t O, int64_t R, int64_t I, typename Op::Out* out, const Tensor& like) {
  using Acc = typename Op::Acc;
  const cudaStream_t st = stream_of(like);
  Tensor part_buf;
  Acc* partial = nullptr;
  int64_t splits = 1;
  if (I == 1) {
    constexpr int64_t kVec = 16 / static_cast<int64_t>(sizeof(T));
    const int64_t nv = ceil_div(R, kVec);
    // Threads per row: enough for one step of kUnroll vectors each, at most one block.
    int tpr_log2 = 0;
    while (tpr_log2 < 8 && (static_cast<int64_t>(kUnroll) << tpr_log2) < nv) ++tpr_log2;
    const int64_t groups = kBlock >> tpr_log2;
    const int64_t step = static_cast<int64_t>(kUnroll) << tpr_log2;
    int64_t chunk_vecs = nv;
    if (tpr_log2 == 8 && O < kTargetBlocks) {  // few long rows: chunks, then combine (two pass)
      const int64_t most = std::max<int64_t>(1, nv / (step * kMinSteps));
      splits = std::min({ceil_div(kTargetBlocks, O), most, kMaxRowSplits});
      chunk_vecs = ceil_div(ceil_div(nv, splits), step) * step;
      splits = ceil_div(nv, chunk_vecs);
    }
    const int64_t blocks = ceil_div(O * splits, groups);
    TAPER_CHECK(blocks <= std::numeric_limits<int32_t>::max(), name, ": too many rows (", O, ")");
    if (splits > 1) {
      part_buf = scratch(static_cast<size_t>(O * splits) * sizeof(Acc), like);
      partial = static_cast<Acc*>(part_buf.data_ptr());
    }
    reduce_rows_kernel<T, Op><<<static_cast<unsigned>(blocks), kBlock, 0, st>>>(
        x, O, R, tpr_log2, chunk_vecs, splits, op, out, partial);
    TAPER_CUDA_CHECK_LAUNCH(name, in);
  } else {
    const int bx_log2 = I >= 32 ? 5 : ceil_log2(I);
    const int64_t by = kBlock >> bx_log2;
    const int64_t tiles = ceil_div(I, int64_t{1} << bx_log2);
    const int64_t base = O * tiles;
    const int64_t step = by * kColUnroll;
    int64_t rows_per_split = R;
    if (base < kTargetBlocks) {  // few column tiles: split R across blocks, then combine
      const int64_t most = std::max<int64_t>(1, R / (step * kMinSteps));
      splits = std::min({ceil_div(kTargetBlocks, base), most, kMaxColSplits});
      rows_per_split = ceil_div(ceil_div(R, splits), step) * step;
      splits = ceil_div(R, rows_per_split);
    }
    if (splits > 1) {
      part_buf = scratch(static_cast<size_t>(O * splits * I) * sizeof(Acc), like);
      partial = static_cast<Acc*>(part_buf.data_ptr());
    }
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>(base, std::numeric_limits<int32_t>::max())),
                    static_cast<unsigned>(splits));
    reduce_cols_kernel<T, Op><<<grid, kBlock, 0, st>>>(x, O, R, I, bx_log2, tiles, rows_per_split,
                                                       op, out, partial);
    TAPER_CUDA_CHECK_LAUNCH(name, in);
  }
  if (splits > 1) {
    const int64_t nout = O * I;
    const int64_t blocks = std::min<int64_t>(ceil_div(nout, kBlock / 32), 1 << 20);
    combine_partials_kernel<Op><<<static_cast<unsigned>(blocks), kBlock, 0, st>>>(
        partial, O, I, splits, op, out);
    TAPER_CUDA_CHECK_LAUNCH(name, in);
  }
}

/// A contiguous copy of x with its dims permuted by `order` (out dim i = x dim order[i]).
Tensor permuted_copy(const char* name, const std::vector<Tensor>& in, const Tensor& x,
                     const std::vector<size_t>& order) {
  std::vector<size_t> dims(order.size());
  std::vector<int64_t> src_strides(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    dims[i] = x.dims()[order[i]];
    src_strides[i] = x.strides()[order[i]];
  }
  const Shape shape(dims);
  Tensor y = new_output(shape, x.dtype(), x);
  const int64_t n = static_cast<int64_t>(shape.elem_count());
  if (n == 0) return y;
  // Coalesced over src alone: y is dense, so row-major order is y's element order.
  const Strided<1> s = make_strided<1>(shape, {&src_strides});
  Strided<1> outer;
  int64_t inner = 1, stride = 1;
  if (s.rank > 0) {
    outer.rank = s.rank - 1;
    for (int k = 0; k < outer.rank; ++k) {
      outer.dims[k] = s.dims[k];
      outer.strides[0][k] = s.strides[0][k];
    }
    inner = s.dims[s.rank - 1];
    stride = s.strides[0][s.rank - 1];
  }
  outer.set_divisors();
  const int64_t rows = n / inner;
  int bx_log2 = 0;
  while (bx_log2 < 8 && (int64_t{1} << bx_log2) < inner) ++bx_log2;
  const dim3 grid(
      static_cast<unsigned>(std::min<int64_t>(ceil_div(inner, int64_t{1} << bx_log2), 65535)),
      static_cast<unsigned>(std::min<int64_t>(ceil_div(rows, kBlock >> bx_log2), 65535)));
  const cudaStream_t st = stream_of(x);
  auto launch = [&](auto tag) {
    using E = decltype(tag);
    permute_rows_kernel<E><<<grid, kBlock, 0, st>>>(ptr<E>(y), ptr<const E>(x), outer, rows,
                                                    inner, stride, bx_log2);
    TAPER_CUDA_CHECK_LAUNCH(name, in);
  };
  switch (dtype_size(x.dtype())) {
    case 1: launch(uint8_t{}); break;
    case 2: launch(uint16_t{}); break;
    case 4: launch(uint32_t{}); break;
    default: launch(uint64_t{}); break;
  }
  return y;
}

enum Kind : int { kSum = 0, kMax = 1, kMin = 2 };

/// sum/max/min (arg == false) or argmax/argmin (arg == true) of in[0] over attrs.ints.
std::vector<Tensor> reduce_kernel(const char* name, int kind, bool arg,
                                  const std::vector<Tensor>& in, const OpAttrs& attrs) {
  Tensor x = in[0];
  const std::vector<int64_t>& rd = attrs.ints;
  const size_t rank = x.rank();
  TAPER_ASSERT(!rd.empty() && rank > 0);
  std::vector<bool> reduced(rank, false);
  for (int64_t d : rd) {
    TAPER_ASSERT(d >= 0 && static_cast<size_t>(d) < rank);
    reduced[static_cast<size_t>(d)] = true;
  }
  std::vector<size_t> out_dims;
  for (size_t i = 0; i < rank; ++i)
    if (!reduced[i] || attrs.flag) out_dims.push_back(reduced[i] ? 1 : x.dims()[i]);
  Tensor out = new_output(Shape(out_dims), arg ? DType::I64 : x.dtype(), x);
  if (out.elem_count() == 0) return {out};

  // Bring non-adjacent reduced dims together: kept dims before the last reduced one, then the
  // reduced dims, then the kept dims after it; the kept dims keep their order, so out's layout
  // is unchanged.
  const size_t first = static_cast<size_t>(rd.front()), last = static_cast<size_t>(rd.back());
  size_t lo = first, hi = last + 1;
  if (hi - lo != rd.size()) {
    std::vector<size_t> order;
    for (size_t i = 0; i < last; ++i)
      if (!reduced[i]) order.push_back(i);
    lo = order.size();
    for (int64_t d : rd) order.push_back(static_cast<size_t>(d));
    hi = order.size();
    for (size_t i = last + 1; i < rank; ++i) order.push_back(i);
    x = permuted_copy(name, in, x, order);
  }
  TAPER_ASSERT(x.is_contiguous());
  int64_t O = 1, R = 1, I = 1;
  for (size_t i = 0; i < rank; ++i) {
    const int64_t n = static_cast<int64_t>(x.dims()[i]);
    if (i < lo) O *= n;
    else if (i < hi) R *= n;
    else I *= n;
  }
  if (R == 0) {  // sum over an empty dim (the front-end rejects max/min/arg there): zeros
    TAPER_CHECK(kind == kSum && !arg, name, ": cannot reduce an empty dim of ",
                in[0].shape().to_string());
    TAPER_CUDA_CHECK(cudaMemsetAsync(out.data_ptr(), 0, out.elem_count() * dtype_size(out.dtype()),
                                     stream_of(out)));  // +0.0 and integer 0 are all-zero bits
    return {out};
  }
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* xp = ptr<const T>(x);
    if (arg) {
      run_reduce<T>(name, in, ArgOp<T>{kind == kMax}, xp, O, R, I, ptr<int64_t>(out), x);
    } else if (kind == kSum) {
      run_reduce<T>(name, in, SumOp<T>{false}, xp, O, R, I, ptr<T>(out), x);
    } else {
      run_reduce<T>(name, in, ExtremeOp<T>{kind == kMax}, xp, O, R, I, ptr<T>(out), x);
    }
  });
  return {out};
}

std::vector<Tensor> sum_kernel(const std::vector<Tensor>& in, const OpAttrs& a) {
  return reduce_kernel("sum", kSum, false, in, a);
}
std::vector<Tensor> max_kernel(const std::vector<Tensor>& in, const OpAttrs& a) {
  return reduce_kernel("max", kMax, false, in, a);
}
std::vector<Tensor> min_kernel(const std::vector<Tensor>& in, const OpAttrs& a) {
  return reduce_kernel("min", kMin, false, in, a);
}
std::vector<Tensor> argmax_kernel(const std::vector<Tensor>& in, const OpAttrs& a) {
  TAPER_ASSERT(a.ints.size() == 1);
  return reduce_kernel("argmax", kMax, true, in, a);
}
std::vector<Tensor> argmin_kernel(const std::vector<Tensor>& in, const OpAttrs& a) {
  TAPER_ASSERT(a.ints.size() == 1);
  return reduce_kernel("argmin", kMin, true, in, a);
}

// The kernels index the input as a dense (O, R, I) array: the dispatcher makes it contiguous
// (as on the CPU).
struct ReduceRegistrar {
  ReduceRegistrar() {
    register_kernel(OpId::sum, DeviceKind::Cuda, kAllDTypes, &sum_kernel, true);
    register_kernel(OpId::max, DeviceKind::Cuda, kAllDTypes, &max_kernel, true);
    register_kernel(OpId::min, DeviceKind::Cuda, kAllDTypes, &min_kernel, true);
    register_kernel(OpId::argmax, DeviceKind::Cuda, kAllDTypes, &argmax_kernel, true);
    register_kernel(OpId::argmin, DeviceKind::Cuda, kAllDTypes, &argmin_kernel, true);
  }
};
const ReduceRegistrar g_reduce_registrar;

}  // namespace
}  // namespace taper::cuda
