// norm.cu: CUDA kernels of the norm family: rms_norm, layer_norm and group_norm forward (y and
// the statistics the backward reads) and the backward ops rms_norm_bwd, layer_norm_bwd and
// group_norm_bwd, for bf16, f16, f32 and f64. The forward mirrors cpu/norm.cpp; the backward
// implements the contract of metal_fallback/composed.cpp (rms/layer/group_norm_bwd_fn).
//
// What it is: one "row" abstraction, as on the CPU: a contiguous run of L elements with its own
// statistics (rms/layer: a row of the last dim, L = D; group norm: the C/G channels x S positions
// of one (n, group), contiguous in (N, C, S), L = C/G * S). Its plans:
//   rows: a group of tpr threads (a power of two; 256 / tpr groups per block when tpr < 256)
//     holds a row in registers; forward (rms/layer/group) 16 values per thread (8 for f64, 32
//     for bf16/f16 rms: 64 bytes each), so L <= 16384 (8192 f64); rms/layer backward 8 values
//     of x and of dy (4 for f64), D <= 4096 (2048 f64), its dw/db column sums in registers (a
//     thread's columns are the same on every row it takes) folded through shared memory at the
//     end. Each element is read once, written once.
//   loops (forward): rows longer than a 256-thread group holds, of at most 32 KB, and at least
//     128 of them: a block per row reads it in steps, three times, the second and third time
//     from L2 (fwd_loop_kernel), so no row team needs more than one block.
//   clusters (forward): aligned rows of 64 to 512 KB, enough for 256 blocks (group norm's large
//     groups): a cluster of 2 to 8 blocks per row holds it in shared memory, 32 KB a block of
//     256 threads up to rows of 256 KB, else 64 KB a block of 512 (fwd_cluster_kernel); read
//     once, written once. Group norm's backward likewise where each block's slice (as many
//     vectors of x and of dy) is a piece of one channel run or whole runs, 2 to 8 blocks a row
//     (gn_bwd_cluster_kernel).
//   long rows (backward, bf16/f16/f32): aligned rows of 4097 to 16384, at least 128 of them,
//     one a block of 512 threads at a time, 128 blocks, each vector of x and dy fetched twice
//     (for the row's sums, then for dx): bf16/f16 from pipelined stages in shared memory, f32
//     from memory, the second time from the L2 (its column sums in shared memory). Each
//     element is read once from memory, written once.
//   chunks: longer rows, fewer than 128 row blocks of rows >= 4096, and the group norm
//     backward the clusters do not take. A block's registers take one chunk (forward 4096
//     elements, 2048 f64; rms/layer backward 2048, 1024 f64); a later kernel merges the
//     per-chunk partials in a fixed order: inline (each block folds its row's <= 256 partials
//     itself), else one block per row.
//   grid: the chunk plans (forward, with <= kInlineMerge chunks a row; group norm's backward,
//     with whole pieces a channel) in one cooperative launch where the device holds all their
//     blocks at once: each block keeps its chunk in registers across a grid-wide barrier, so x
//     (and dy) are read once and one launch does the work of two (small shapes: group norm
//     (1, 16, 256, 256)/4 is 256 blocks). The same operations, so the same bits, as the
//     two-kernel forms, which take the shapes with more blocks.
//   pipelined rows (aligned; forward: f64; backward: bf16, f16): the rows plan with
//     each thread's vectors copied two rows ahead into its own shared-memory slots (cp.async,
//     pipelined_rows in cuda/vec_io.cuh), so that loads stay in flight while rows reduce and
//     store; the forward's grid is then persistent (the blocks the device holds).
//   16-byte vector loads and stores wherever the pointers are 16-byte aligned and the row (or
//   channel run) length is a multiple of 16 / sizeof(T), checked at run time; scalar otherwise.
// What it is not: the composed forms (metal_fallback/composed.cpp), the rules that call the _bwd
// ops (core/src/backward.cpp), the front-end's argument checks, the reference
// (tests/ref/fused_ref.h).
//
// Shapes: rms/layer: x, y, dy, dx (R, D), w, b, dw, db (D) or empty, mean/rstd (R) (x's shape
// minus its last dim). group: x, y, dy, dx (N, C, S), w, b, dw, db (C) or empty, mean/rstd
// (N, G). Kernels and the bytes they move (n elements of s bytes; w, b, statistics and
// partials are small and go through L1/L2):
//   fwd_rows_kernel         x -> y, mean, rstd                               2 n s
//   fwd_loop_kernel         x -> y, mean, rstd (x read again from L2)        2 n s
//   fwd_cluster_kernel      x -> y, mean, rstd (x held in shared memory)     2 n s
//   fwd_chunk_stats_kernel  x -> (mean, M2) per (row, chunk)                 n s
//   fwd_merge_kernel        partials -> mean, rstd (rows of > 256 chunks)    -
//   fwd_chunk_write_kernel  x, stats -> y (x again: from L2 when it fits)    2 n s
//   fwd_chunk_grid_kernel   the two above in one cooperative launch          2 n s
//   bwd_rows_kernel         x, dy -> dx, dw/db partials (P, D), P <= 512      3 n s
//                           (the long rows: kBwdRefetch, P = 128; f32 D > 8192 in clusters
//                           of 2 blocks, P = 64)
//   bwd_chunk_sums_kernel   x, dy -> row-chunk sums, dw/db partials          2 n s
//   sums_merge_kernel       row sums of rows of > 256 partials               -
//   bwd_chunk_dx_kernel     x, dy, sums -> dx                                3 n s
//   (both chunk kernels pipelined on aligned rows: kPipe, as bwd_rows_kernel)
//   gn_bwd_sums_kernel      x, dy -> sums of u, q, dy per (n, c, piece)      2 n s
//   gn_bwd_dx_kernel        x, dy, sums -> dx                                3 n s
//   gn_bwd_grid_kernel      the two above (and dw, db) in one cooperative launch  3 n s
//   gn_bwd_pipe_kernel      either of the two above, persistent and pipelined  2 / 3 n s
//   gn_bwd_cluster_kernel   x, dy -> dx, dw/db partials (x, dy held in shared memory)  3 n s
//   col_reduce_kernel       partials -> dw, db           P D (or N C pieces) values, f32/f64
// The rows backward's partials cost P / R of a tensor per output (dw, db) in f32, written and
// read once.
//
// Precision: bf16/f16 load to f32 and round once at the store (round_to's bits, through the
// hardware conversions of cuda/vec_io.cuh); statistics and every sum are f32 for bf16, f16 and
// f32 and f64 for f64 (the f64 kernels compute in f64 only).
// Mean and variance are two-pass over the row in registers, or two-pass per chunk and merged
// with Chan's formula (cpu/norm.cpp's MeanM2); never E[x^2] - E[x]^2. rstd = 1 / sqrt(var +
// eps) (correctly rounded sqrt and divide). y = (x - mean) * rstd * w + b with cpu/norm.cpp's
// operations (one fma for w and b; group norm fma(x - mean, rstd * w[c], b[c])).
// Backward, per row of M elements, d = x - mean (rms: x), rho = rstd: u = dy rho, q = u d,
// c = sum(u w) / M (rms: 0), k = rho^2 sum(q w) / M, dx = fma(u, w, fma(d, -k, -c)) (the
// composed form's two mul_adds; rms: fma(u, w, d * -k)), dw = sum over rows of q, db = sum over
// rows of dy (group norm: per channel over n and S; its row dots are sum_c w_c sum_s u and
// sum_c w_c sum_s q, as the composed form).
// Determinism: the plans depend on the shape and dtype only (never on the device); every sum has
// a fixed tree (warp butterflies, shared-memory folds in warp order, partials folded in index
// order by a later kernel); no floating-point atomics: the same bits on every run.
// Empty inputs: nothing is launched; rows of length 0 get NaN statistics (all-ones bits, as
// 0 / 0 on the CPU); dw/db over zero rows are zeros.
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda/cuda_common.cuh"
#include "cuda/vec_io.cuh"
#include "taper/dtype.h"
#include "taper/error.h"
#include "taper/op.h"

namespace taper::cuda {
/// What norm.cu's compiles share (cuda/CMakeLists.txt builds it once per float dtype, each
/// compile holding that dtype's kernels, TAPER_NORM_PART naming it; f32's compile, without it,
/// also holds the ops' entry points and their registration), hence a named namespace.
namespace norm_part {
enum class Kind : int { kRms, kLayer, kGroup };
struct Job;
/// The forward (bwd false) or backward of `kind` on dtype T's kernels, defined by T's compile.
void run(std::type_identity<bf16>, Kind kind, bool bwd, const Job& j);
void run(std::type_identity<f16>, Kind kind, bool bwd, const Job& j);
void run(std::type_identity<float>, Kind kind, bool bwd, const Job& j);
void run(std::type_identity<double>, Kind kind, bool bwd, const Job& j);
}  // namespace norm_part
#ifdef TAPER_NORM_PART
using NormPartT = TAPER_NORM_PART;  // this compile's dtype
#else
using NormPartT = float;
#endif

namespace {
using norm_part::Kind;

constexpr int kBlock = 256;          ///< threads of the chunk kernels (and the rows' minimum)
/// Forward rows: threads per row at most (the half types' rms rows hold 32 values per thread,
/// more than the 64 registers a 1024-thread block leaves: 512; longer rows loop or take chunks).
template <class T> inline constexpr int kMaxRowThreads = is_half_v<T> ? 512 : 1024;
constexpr int kBwdMaxThreads = 512;  ///< backward rows: threads per row at most
constexpr int kBwdMaxThreadsLog2 = 9;
static_assert(1 << kBwdMaxThreadsLog2 == kBwdMaxThreads);
constexpr int64_t kTargetBlocks = 1024;  ///< about one wave of a 132-SM H200; a constant, so
                                         ///< that plans (and the bits) do not depend on the device
constexpr int64_t kBwdMaxBlocks = 512;   ///< backward rows: blocks, hence column-partial rows
constexpr int64_t kMinRowBlocks = 128;   ///< fewer row blocks than this, on long rows: chunks
constexpr int64_t kSplitMinLen = 4096;   ///< ... where "long" starts
/// fwd_loop_kernel: rows of at most this many bytes. f32 rows of 64 KB ran slower than on the
/// 1024-thread rows (H100, 4096x16384: rms 191.6 -> 202.7 us, layer 241.7 -> 263.6 us): their
/// re-reads no longer all hit the L2.
constexpr int64_t kLoopMaxBytes = 32 << 10;
/// Blocks of `bytes` of dynamic shared memory an SM holds: kSmemPerBlock over the block's bytes,
/// the 1 KB the hardware reserves a block and under 256 bytes of static shared memory. Kernels
/// bound their registers to let that many be resident.
constexpr int smem_blocks(size_t bytes) {
  return static_cast<int>(kSmemPerBlock / (bytes + 1024 + 256));
}
/// fwd_cluster_kernel: threads per block, 512, or 256 where a cluster of kMaxCluster such blocks
/// holds the row ...
constexpr int kClusterThreads = 512;
/// ... each thread holding kSliceVecs 16-byte vectors of the row: a block's slice is 64 KB (32
/// KB), three (six) blocks an SM, so that more blocks, each a step behind another, keep loads
/// in flight while others reduce ...
constexpr int kSliceVecs = 8;
template <int B> inline constexpr int64_t kSliceBytesOf = int64_t{B} * kSliceVecs * 16;
/// ... and as many blocks an SM as its shared memory holds (smem_blocks). Unbound, the group
/// norm kernels took 56 registers, two 512-thread blocks an SM (run 38's ncu: 46 % achieved
/// occupancy, 36 % of the DRAM peak, bf16 (16, 32, 256, 256)/8; run 57: that forward 83.7 ->
/// 67.1 us on an H200).
template <int B> inline constexpr int kClusterMinBlocks = smem_blocks(kSliceBytesOf<B>);
/// Blocks per row at most: 8, the portable cluster size (H100, f32 group norm (16, 32, 256,
/// 256)/8 in clusters of 16: 157.0 -> 172.6 us, slower than the chunks) ...
constexpr int kMaxCluster = 8;
/// ... and at least this many blocks in all: fewer leave most SMs idle (H100, (1, 16, 256, 256)/4
/// bf16 in 32 blocks: 13.6 -> 20.4 us).
constexpr int64_t kMinClusterBlocks = 256;
constexpr int64_t kInlineMerge = 256;    ///< more partials per row than this: a merge kernel
/// col_fold's block: X columns x Y fold lanes.
template <int X, int Y> struct ColBlock {
  static constexpr int kX = X, kY = Y;
};
/// The rows' dw and db (rms, layer: P = 1, partials of whole rows): 32 columns x 16 lanes. 8 x 64
/// gave the 4096x16384 rows 2 048 blocks of few partials each and their forward+backward 2-4 %
/// more (H100, run 84), for 1 % less at 16384x1024.
using RowsFold = ColBlock<32, 16>;
/// Group norm's (pieces of (n, channel), P > 1, each column's strided by P): 8 columns x 64
/// lanes, where 32 x 16 had a warp's 32 lanes take 32 columns of one piece, 4 P bytes apart, and
/// half a block idle on 16 channels (H100, run 84: (1, 16, 256, 256)/4 forward+backward 21.0 ->
/// 19.6 us bf16, 22.1 -> 20.4 f32; the large group norms within 1 %).
using GroupFold = ColBlock<8, 64>;

template <class T> inline constexpr int kV = kVec<T>;  ///< elements per 16-byte vector
/// Vectors per thread of the forward loops (and rms rows): 64 bytes in flight per thread in
/// every dtype (16 values; 8 for f64; 32 for the half types) ...
template <class T> inline constexpr int kRowVecs = 4;
/// ... and of every chunk kernel (16 values; 8 for f64) ...
template <class T> inline constexpr int kFwdVecs = is_half_v<T> ? 2 : 4;
/// ... and the rms/layer backward, which also keeps dy and two column sums (8 values; 4 f64).
template <class T> inline constexpr int kBwdVecs = is_half_v<T> ? 1 : 2;

__device__ __forceinline__ int64_t dmin(int64_t a, int64_t b) { return a < b ? a : b; }

// ---- loads, stores, sums -------------------------------------------------------------------

/// v = p[i, i + V) in the compute type; elements at or past n are 0. One 16-byte load when
/// `vec` (p + i is then 16-byte aligned) and the vector is whole. p is an input of the kernel
/// (read-only while it runs).
template <class T>
__device__ __forceinline__ void load_vec(const T* __restrict__ p, int64_t i, int64_t n, bool vec,
                                         compute_t<T> (&v)[kV<T>]) {
  constexpr int V = kV<T>;
  if (vec && i + V <= n) {
    load16<false>(p + i, v);
  } else {
#pragma unroll
    for (int l = 0; l < V; ++l) v[l] = i + l < n ? load_c(p[i + l]) : compute_t<T>(0);
  }
}

/// p[i, i + V) = v rounded once to T (round_to's bits; cuda/vec_io.cuh); elements at or past n
/// are not written.
template <class T>
__device__ __forceinline__ void store_vec(T* __restrict__ p, int64_t i, int64_t n, bool vec,
                                          const compute_t<T> (&v)[kV<T>]) {
  constexpr int V = kV<T>;
  if (vec && i + V <= n) {
    store16<false, true>(p + i, v);
  } else {
#pragma unroll
    for (int l = 0; l < V; ++l)
      if (i + l < n) p[i + l] = store_c<T>(v[l]);
  }
}

template <class T> __device__ __forceinline__ void zero_vec(compute_t<T> (&v)[kV<T>]) {
#pragma unroll
  for (int l = 0; l < kV<T>; ++l) v[l] = compute_t<T>(0);
}

/// Adds (v[l] - mu)^2 to m for the elements of the vector at element i that lie below n (an
/// absent element would add mean^2); a whole vector skips the per-element tests.
template <int V, class C>
__device__ __forceinline__ void add_m2(const C (&v)[V], int64_t i, int64_t n, C mu, C& m) {
  if (i + V <= n) {
#pragma unroll
    for (int l = 0; l < V; ++l) {
      const C d = v[l] - mu;
      m = fma(d, d, m);
    }
    return;
  }
#pragma unroll
  for (int l = 0; l < V; ++l) {
    if (i + l < n) {
      const C d = v[l] - mu;
      m = fma(d, d, m);
    }
  }
}

/// Butterfly over aligned groups of `width` lanes (a power of two <= 32): every lane ends with
/// its group's totals, the same bits in each lane (IEEE addition commutes). Every lane of the
/// warp must call it.
template <int K, class C> __device__ __forceinline__ void lanes_sum(C (&v)[K], int width) {
  auto step = [&](int off) {
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] += __shfl_xor_sync(0xffffffffu, v[k], off);
  };
  if (width == 32) {  // a whole warp, the common case: unrolled (the same steps, no loop)
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) step(off);
    return;
  }
  for (int off = width >> 1; off > 0; off >>= 1) step(off);
}

/// Sums over aligned groups of tpr threads (a power of two <= blockDim.x): every thread ends
/// with its group's totals. tpr > 32 folds the warps' totals in warp order through `red`
/// (blockDim.x / 32 * K values) between two barriers, so every thread of the block must call
/// it with the same tpr, and `red` may be reused right after.
template <int K, class C> __device__ __forceinline__ void group_sum(C (&v)[K], int tpr, C* red) {
  lanes_sum(v, tpr < 32 ? tpr : 32);
  if (tpr > 32) {
    const int warp = static_cast<int>(threadIdx.x) >> 5;
    if ((threadIdx.x & 31u) == 0) {
#pragma unroll
      for (int k = 0; k < K; ++k) red[warp * K + k] = v[k];
    }
    __syncthreads();
    const int nw = tpr >> 5, first = warp & ~(nw - 1);
    // The warps' totals in warp order, unrolled for the counts of 8 warps or fewer (uniform):
    // a loop over a count known at run time took its unrolled body, its remainder loop and
    // their tests (the SASS of the bf16 layer backward rows: tpr = 128, 4 warps a row).
    // More warps keep the loop (unrolled for 16 and 32 they took more registers, and spilled).
    constexpr int kRunTime = 0;  // fold's warp count: nw, known at run time only
    auto fold = [&](auto wc) {
      constexpr int W = decltype(wc)::value;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        C s = red[first * K + k];
        if constexpr (W != kRunTime) {
#pragma unroll
          for (int i = 1; i < W; ++i) s += red[(first + i) * K + k];
        } else {
          for (int i = 1; i < nw; ++i) s += red[(first + i) * K + k];
        }
        v[k] = s;
      }
    };
    if (nw == 2) fold(std::integral_constant<int, 2>{});
    else if (nw == 4) fold(std::integral_constant<int, 4>{});
    else if (nw == 8) fold(std::integral_constant<int, 8>{});
    else fold(std::integral_constant<int, kRunTime>{});
    __syncthreads();
  }
}

/// 1 / sqrt(v + eps) in the compute type (cpu/norm.cpp's rstd_of).
template <class C> __device__ __forceinline__ C rstd_of(C v, C eps) {
  return C(1) / sqrt(v + eps);
}

/// A partial sum: kL2, through L2 only (__ldcg), for partials written earlier in the same launch
/// by other blocks (the grid kernels, after their grid-wide barrier); else an ordinary load.
template <bool kL2, class C> __device__ __forceinline__ C ld_part(const C* p) {
  if constexpr (kL2) return __ldcg(p);
  else return *p;
}

/// Chan's merge of (count, mean, M2), cpu/norm.cpp's MeanM2::add.
template <class C> struct MeanM2 {
  double n;
  C mean, m2;
  __device__ __forceinline__ void add(double nb, C mb, C m2b) {
    if (nb == 0) return;
    if (n == 0) {
      n = nb;
      mean = mb;
      m2 = m2b;
      return;
    }
    const double nt = n + nb;
    // Equal counts (every merge of whole chunks): nb / nt = 0.5 and n nb / nt = n / 2 exactly
    // (n^2 exact below 2^52), so the same bits without the two f64 divisions, which sit on the
    // merge's chain of dependent steps (7 in a 64-chunk row) after the grid kernels' barrier.
    const bool half = nb == n && n < 0x1p26;
    double r1 = 0.5, r2 = 0.5 * n;
    if (!half) {
      r1 = nb / nt;
      r2 = n * nb / nt;
    }
    const C delta = mb - mean;
    mean += delta * static_cast<C>(r1);
    m2 += m2b + delta * delta * static_cast<C>(r2);
    n = nt;
  }
};

/// Shuffle tree of MeanM2 states over the warp: lane l < o takes lane l + o (the later chunks),
/// o = 16, 8, ..., 1; lane 0 ends with the warp's merge. Every lane must call it.
template <class C> __device__ __forceinline__ void chan_tree(MeanM2<C>& a) {
  for (int o = 16; o > 0; o >>= 1) {
    const double nb = __shfl_down_sync(0xffffffffu, a.n, o);
    const C mb = __shfl_down_sync(0xffffffffu, a.mean, o);
    const C m2b = __shfl_down_sync(0xffffffffu, a.m2, o);
    a.add(nb, mb, m2b);
  }
}

/// A thread's share of a row's backward sums: for k = first, first + stride, ... < np,
/// s0 += w_k a0[(r0 + k) * st] and s1 += w_k a1[(r0 + k) * st], w_k = w[ch0 + k / P] (group
/// norm's per-channel sums) or 1 (w null: the partials already hold the weights).
template <class T, bool kL2 = false>
__device__ __forceinline__ void row_sums(compute_t<T> (&s)[2], const compute_t<T>* __restrict__ a0,
                                         const compute_t<T>* __restrict__ a1, int64_t st,
                                         int64_t r0, int64_t np, int64_t first, int64_t stride,
                                         const T* __restrict__ w, int64_t ch0, int64_t P) {
  using C = compute_t<T>;
  for (int64_t k = first; k < np; k += stride) {
    const C wk = w ? load_c(w[ch0 + k / P]) : C(1);
    s[0] = fma(wk, ld_part<kL2>(a0 + (r0 + k) * st), s[0]);
    s[1] = fma(wk, ld_part<kL2>(a1 + (r0 + k) * st), s[1]);
  }
}

/// Element index -> channel run index (i / S), in 32 bits when the row allows.
__device__ __forceinline__ int64_t run_of(int64_t i, int64_t S, bool small) {
  return small ? static_cast<int64_t>(static_cast<uint32_t>(i) / static_cast<uint32_t>(S)) : i / S;
}

/// Group norm's store values of x[i, i + V) (i < hi, positions of one row): channel
/// ch0 + e / S of each element e, y = fma(x - mean, rstd * w[ch], b[ch]) (cpu/norm.cpp's
/// WriteAffineRun); a vector crosses channels only when S % V != 0.
template <class T>
__device__ __forceinline__ void group_affine(const compute_t<T> (&xv)[kV<T>],
                                             compute_t<T> (&o)[kV<T>], int64_t i, int64_t hi,
                                             int64_t S, int64_t ch0, const T* __restrict__ w,
                                             const T* __restrict__ b, compute_t<T> mu,
                                             compute_t<T> rs, bool small) {
  using C = compute_t<T>;
  int64_t cl = run_of(i, S, small);
  int64_t next = (cl + 1) * S;
  C a = w ? rs * load_c(w[ch0 + cl]) : rs;
  C c = b ? load_c(b[ch0 + cl]) : C(0);
  if (i + kV<T> <= hi && i + kV<T> <= next) {  // whole, in one channel: no per-element tests
#pragma unroll
    for (int l = 0; l < kV<T>; ++l) o[l] = fma(xv[l] - mu, a, c);
    return;
  }
#pragma unroll
  for (int l = 0; l < kV<T>; ++l) {
    const int64_t e = i + l;
    o[l] = C(0);
    if (e < hi) {
      if (e >= next) {
        do {
          ++cl;
          next += S;
        } while (e >= next);
        a = w ? rs * load_c(w[ch0 + cl]) : rs;
        c = b ? load_c(b[ch0 + cl]) : C(0);
      }
      o[l] = fma(xv[l] - mu, a, c);
    }
  }
}

/// Layer/rms store values of a vector: t = (x - mean) * rstd, then * w and + b where given (one
/// fma with both, as cpu/norm.cpp's WriteElementwise).
template <class T>
__device__ __forceinline__ void affine_vec(const compute_t<T> (&xv)[kV<T>],
                                           const compute_t<T> (&wv)[kV<T>],
                                           const compute_t<T> (&bv)[kV<T>], bool has_w, bool has_b,
                                           compute_t<T> mu, compute_t<T> rs,
                                           compute_t<T> (&o)[kV<T>]) {
#pragma unroll
  for (int l = 0; l < kV<T>; ++l) {
    const compute_t<T> t = (xv[l] - mu) * rs;
    o[l] = has_w ? (has_b ? fma(t, wv[l], bv[l]) : t * wv[l]) : (has_b ? t + bv[l] : t);
  }
}

/// affine_vec of x[i, i + V), w and b loaded from element i (those past L: zeros).
template <class T>
__device__ __forceinline__ void elem_affine(const compute_t<T> (&xv)[kV<T>],
                                            compute_t<T> (&o)[kV<T>], int64_t i, int64_t L,
                                            const T* __restrict__ w, const T* __restrict__ b,
                                            compute_t<T> mu, compute_t<T> rs, bool vec) {
  compute_t<T> wv[kV<T>], bv[kV<T>];
  zero_vec<T>(wv);
  zero_vec<T>(bv);
  if (w) load_vec(w, i, L, vec, wv);
  if (b) load_vec(b, i, L, vec, bv);
  affine_vec<T>(xv, wv, bv, w != nullptr, b != nullptr, mu, rs, o);
}

// ---- forward -------------------------------------------------------------------------------

/// One row of fwd_rows_kernel (row < R when active; an inactive row's threads still take part
/// in every group_sum): lane l of its tpr threads holds vectors l + u * tpr, u < NV. kPipe: x's
/// vectors come from the thread's slots of `stage` (slot u: vector u, where fwd_rows_kernel's
/// prefetch put it), else from global memory.
/// kAl (rms and layer rows with `vec`: x, y, w, b 16-byte aligned, L % V == 0): every vector
/// below L is whole, so the loads, the M2 pass and the stores skip the per-element tests, and
/// offsets within the row are 32-bit (the rows plan holds at most 16384 elements). Run 35's ncu
/// found the general path issuing 22-39 instructions per element, most of them 64-bit index
/// arithmetic and bounds tests.
template <class T, Kind K, int NV, bool kPipe, bool kAl>
__device__ __forceinline__ void fwd_row(const T* __restrict__ x, const T* __restrict__ w,
                                        const T* __restrict__ b, T* __restrict__ y,
                                        compute_t<T>* __restrict__ mean,
                                        compute_t<T>* __restrict__ rstd, int64_t row, bool active,
                                        int64_t L, int tpr, int lane, int64_t S, int64_t G,
                                        int64_t Cg, compute_t<T> eps, bool vec, compute_t<T>* red,
                                        const uint4* stage) {
  static_assert(!kAl || K != Kind::kGroup, "the aligned path is the rms and layer rows'");
  using C = compute_t<T>;
  constexpr int V = kV<T>;
  const int64_t off = (active ? row : 0) * L;
  const int Li = kAl ? static_cast<int>(L) : 0;  // kAl: the row's length, 32-bit
  // kRaw (the aligned rms rows): the raw words of x (from memory, or the stage's slots when
  // kPipe) and of w, loaded before the row's sums, so that w's loads wait with x's rather than
  // after them (b's stay in the store loop: registers); each pass widens x's words again (a
  // shift or a mask a value, where the widened row took twice the registers). The layer rows
  // keep x widened and load w in the store loop: raw, their three passes widened x three times
  // and w's early loads took the f32 pipelined row from 56 to 64 registers (H100, run 65:
  // bf16 16384x1024 forward +2.8 %, f32 4096x16384 +3.0 %).
  constexpr bool kRaw = kAl && K == Kind::kRms;
  uint4 xr[kRaw ? NV : 1], wr[kRaw ? NV : 1];
  C v[kRaw ? 1 : NV][V];
#pragma unroll
  for (int u = 0; u < NV; ++u) {
    if constexpr (kRaw) {
      const int i = (u * tpr + lane) * V;
      const bool in = i < Li;
      const uint4 z = make_uint4(0, 0, 0, 0);
      if constexpr (kPipe)
        xr[u] = active && in ? stage[u * static_cast<int>(blockDim.x) + threadIdx.x] : z;
      else
        xr[u] = active && in ? __ldg(reinterpret_cast<const uint4*>(x + off + i)) : z;
      wr[u] = w && in ? __ldg(reinterpret_cast<const uint4*>(w + i)) : z;
    } else {
      const int i32 = (u * tpr + lane) * V;                           // kAl
      const int64_t i = (static_cast<int64_t>(u) * tpr + lane) * V;  // otherwise
      if (!active || (kAl ? i32 >= Li : i >= L)) zero_vec<T>(v[u]);
      else if constexpr (kPipe)
        widen16<T>(stage[u * static_cast<int>(blockDim.x) + threadIdx.x], v[u]);
      else if constexpr (kAl) load16<false>(x + off + i32, v[u]);
      else load_vec(x + off, i, L, vec, v[u]);
    }
  }
  // Vector u's values (absent ones: zeros).
  auto xv = [&](int u, C(&t)[V]) {
    if constexpr (kRaw) widen16<T>(xr[u], t);
    else {
#pragma unroll
      for (int l = 0; l < V; ++l) t[l] = v[u][l];
    }
  };
  C mu = C(0), var;
  if constexpr (K == Kind::kRms) {
    C s[1] = {C(0)};
#pragma unroll
    for (int u = 0; u < NV; ++u) {
      C t[V];
      xv(u, t);
#pragma unroll
      for (int l = 0; l < V; ++l) s[0] = fma(t[l], t[l], s[0]);  // absent elements are 0
    }
    group_sum(s, tpr, red);
    var = s[0] / static_cast<C>(L);
  } else {
    C s[1] = {C(0)};
#pragma unroll
    for (int u = 0; u < NV; ++u) {
      C t[V];
      xv(u, t);
#pragma unroll
      for (int l = 0; l < V; ++l) s[0] += t[l];
    }
    group_sum(s, tpr, red);
    mu = s[0] / static_cast<C>(L);
    C m[1] = {C(0)};
#pragma unroll
    for (int u = 0; u < NV; ++u) {
      C t[V];
      xv(u, t);
      if constexpr (kAl) {
        // a whole vector (an absent one would add mu^2)
        if ((u * tpr + lane) * V < Li) add_m2(t, 0, V, mu, m[0]);
      } else {
        add_m2(t, (static_cast<int64_t>(u) * tpr + lane) * V, L, mu, m[0]);
      }
    }
    group_sum(m, tpr, red);  // red is free again: group_sum ends with a barrier
    var = m[0] / static_cast<C>(L);
  }
  const C rs = rstd_of(var, eps);
  if (!active) return;  // no barrier follows in this row
  if (lane == 0) {
    if constexpr (K != Kind::kRms) mean[row] = mu;
    rstd[row] = rs;
  }
  if constexpr (kAl) {
    // The row's start once (64-bit), offsets within it 32-bit; rms rows have no b.
    T* const yr = y + off;
    const T* const br = K == Kind::kRms ? nullptr : b;
#pragma unroll
    for (int u = 0; u < NV; ++u) {
      const int i = (u * tpr + lane) * V;
      if (i < Li) {
        C t[V], wv[V], bv[V], o[V];
        xv(u, t);
        if constexpr (kRaw) widen16<T>(wr[u], wv);
        else if (w) load16<false>(w + i, wv);
        if (br) load16<false>(br + i, bv);
        affine_vec<T>(t, wv, bv, w != nullptr, br != nullptr, mu, rs, o);
        store16<false, true>(yr + i, o);
      }
    }
  } else {
    const bool small = L <= 0xffffffffLL;
#pragma unroll
    for (int u = 0; u < NV; ++u) {
      const int64_t i = (static_cast<int64_t>(u) * tpr + lane) * V;
      if (i < L) {
        C o[V];
        C t[V];
        xv(u, t);
        if constexpr (K == Kind::kGroup)
          group_affine<T>(t, o, i, L, S, (row % G) * Cg, w, b, mu, rs, small);
        else
          elem_affine<T>(t, o, i, L, w, b, mu, rs, vec);
        store_vec(y + off, i, L, vec, o);
      }
    }
  }
}

/// Whether T's aligned forward rows take the pipelined kernel: f64's, and f32 layer_norm's of
/// 1024 threads (pipe_rows). A/B on an H100 (run 31 of docs/cuda.md), 16384x1024: f64 rms 98.6 ->
/// 93.1 us, layer 121.1 -> 107.0; bf16 rms 28.2 -> 29.6, layer 36.8 -> 35.8 (not limited by the
/// loads in flight: run 35's ncu found them issuing 22-39 instructions per element, most of them
/// not arithmetic); f32 rows are at 93-98 % of the copy already, but for layer_norm's longest
/// (4096x16384: 85 % in run 8, rms 98 %), whose one 1024-thread block an SM has no load in
/// flight through the row's two block reductions.
template <class T, Kind K>
inline constexpr bool kPipeRows =
    std::is_same_v<T, double> || (std::is_same_v<T, float> && K == Kind::kLayer);
template <class T, Kind K> constexpr bool pipe_rows(int tpr) {
  return kPipeRows<T, K> && (!std::is_same_v<T, float> || tpr == kMaxRowThreads<T>);
}
/// Stages of the pipelined forward rows (NV <= 4 vectors a thread: at most 64 bytes a stage).
constexpr int kFwdStages = 3;
/// The pipelined rows' register bound: 64 a thread (measured so in runs 31 and 34; unbounded,
/// the bf16 rms rows took 101 registers, two blocks of 256 threads per SM).
template <class T> inline constexpr int kPipeMinBlocks = 65536 / 64 / kMaxRowThreads<T>;

/// Rows held in registers. x, y: (R, L); mean, rstd: (R) (mean null for rms). Groups of tpr
/// threads (blockDim.x / tpr a block) take a row each (fwd_row). Group norm (K == kGroup): row
/// r's channels start at (r % G) * Cg, each S long.
/// kPipe (aligned rows, vec): a persistent grid whose block takes rows blockIdx.x * groups + g,
/// then gridDim.x * groups further, ..., each thread's vectors copied kFwdStages - 1 rows ahead
/// into its own slots of dynamic shared memory (kFwdStages * NV * blockDim.x 16-byte slots).
/// kWarp32: tpr_log2 is 5 (aligned rows of a whole warp), known to the compiler, which then
/// folds the lanes' index arithmetic and the row's reductions.
template <class T, Kind K, int NV, bool kPipe, bool kAl, bool kWarp32 = false>
__global__ void __launch_bounds__(kMaxRowThreads<T>, kPipe || kAl ? kPipeMinBlocks<T> : 1)
    fwd_rows_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                    T* __restrict__ y, compute_t<T>* __restrict__ mean,
                    compute_t<T>* __restrict__ rstd, int64_t R, int64_t L, int tpr_log2_arg,
                    int64_t S, int64_t G, int64_t Cg, compute_t<T> eps, bool vec) {
  pdl_begin();  // launched as a programmatic dependent launch
  using C = compute_t<T>;
  __shared__ C red[kMaxRowThreads<T> / 32];
  const int tpr_log2 = kWarp32 ? 5 : tpr_log2_arg;
  const int tpr = 1 << tpr_log2;
  const int lane = static_cast<int>(threadIdx.x) & (tpr - 1);
  const int groups = static_cast<int>(blockDim.x >> tpr_log2);
  const int g = static_cast<int>(threadIdx.x >> tpr_log2);
  if constexpr (!kPipe) {
    const int64_t row = static_cast<int64_t>(blockIdx.x) * groups + g;
    fwd_row<T, K, NV, false, kAl>(x, w, b, y, mean, rstd, row, row < R, L, tpr, lane, S, G, Cg,
                                  eps, vec, red, nullptr);
  } else {
    extern __shared__ uint4 fwd_slots[];
    const int B = static_cast<int>(blockDim.x), t = static_cast<int>(threadIdx.x);
    pipelined_rows<kFwdStages>(
        static_cast<int64_t>(blockIdx.x) * groups, static_cast<int64_t>(gridDim.x) * groups, R,
        fwd_slots, NV * B,
        [&](uint4* stage, int64_t base) {
          const int64_t row = base + g;
          if (row >= R) return;
#pragma unroll
          for (int u = 0; u < NV; ++u) {
            const int64_t i = (static_cast<int64_t>(u) * tpr + lane) * kV<T>;
            if (i < L) cp_async<16>(&stage[u * B + t], x + row * L + i);
          }
        },
        [&](const uint4* stage, int64_t base) {
          const int64_t row = base + g;
          fwd_row<T, K, NV, true, kAl>(x, w, b, y, mean, rstd, row, row < R, L, tpr, lane, S, G,
                                       Cg, eps, vec, red, stage);
        });
  }
}

/// fwd_loop_kernel's raw words of the step at lo: thread t's vectors u start at element
/// lo + u kBlock V + t V (absent ones: zero bits, which widen to +0). kLast: the row's last
/// read (evict-first, so the rows still to be re-read keep their L2 lines).
template <bool kLast, int NV, class T>
__device__ __forceinline__ void loop_load(const T* __restrict__ xr, int64_t lo, int64_t L,
                                          uint4 (&r)[NV]) {
#pragma unroll
  for (int u = 0; u < NV; ++u) {
    const int64_t i = lo + (static_cast<int64_t>(u) * kBlock + threadIdx.x) * kV<T>;
    const uint4* p = reinterpret_cast<const uint4*>(xr + i);
    r[u] = i < L ? (kLast ? __ldcs(p) : __ldg(p)) : make_uint4(0, 0, 0, 0);
  }
}

/// One pass of fwd_loop_kernel over a row: f(u, i, v) for each of the thread's vectors (i its
/// first element, whole when i < L; v its values widened), the next step's words in flight.
template <bool kLast, int NV, class T, class F>
__device__ __forceinline__ void loop_pass(const T* __restrict__ xr, int64_t L, F&& f) {
  using C = compute_t<T>;
  constexpr int V = kV<T>;
  constexpr int64_t step = static_cast<int64_t>(kBlock) * NV * V;
  uint4 cur[NV], nxt[NV];
  loop_load<kLast, NV>(xr, 0, L, cur);
  for (int64_t lo = 0; lo < L; lo += step) {
    if (lo + step < L) loop_load<kLast, NV>(xr, lo + step, L, nxt);
#pragma unroll
    for (int u = 0; u < NV; ++u) {
      C v[V];
      widen16<T>(cur[u], v);
      f(u, lo + (static_cast<int64_t>(u) * kBlock + threadIdx.x) * V, v);
    }
#pragma unroll
    for (int u = 0; u < NV; ++u) cur[u] = nxt[u];
  }
}

/// The block's total of a thread's NV accumulators (added in slot order, then group_sum).
template <int NV, class C> __device__ __forceinline__ C loop_fold(const C (&acc)[NV], C* red) {
  C s[1] = {acc[0]};
#pragma unroll
  for (int u = 1; u < NV; ++u) s[0] += acc[u];
  group_sum(s, kBlock, red);
  return s[0];
}

/// Rows too long for a team of kBlock threads to hold (at most kLoopMaxBytes, 16-byte aligned,
/// L % V == 0), many of them: block r takes row r and reads it in steps of kBlock kRowVecs
/// vectors (thread t: vectors t + u kBlock of a step, as fwd_rows_kernel's lanes), three times:
/// the sum (rms: of squares), the sum of (x - mean)^2 (layer/group; two-pass as everywhere),
/// then y. Only the first read comes from memory: the row was read microseconds earlier and the
/// rows of the blocks resident at once (132 SMs x 3 blocks x 32 KB at most, about 13 MB) stay in
/// the L2, so the kernel moves the minimal 2 n s bytes. Each pass keeps the raw words of the next
/// step in flight while it folds the current one (64 bytes per thread, 128 with the prefetch),
/// and each thread sums into kRowVecs accumulators (one per vector slot, added in a fixed order
/// at the end), so no chain of dependent adds holds the next loads back.
template <class T, Kind K>
__global__ void __launch_bounds__(kBlock, 3)
    fwd_loop_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                    T* __restrict__ y, compute_t<T>* __restrict__ mean,
                    compute_t<T>* __restrict__ rstd, int64_t L, int64_t S, int64_t G,
                    int64_t Cg, compute_t<T> eps) {
  using C = compute_t<T>;
  constexpr int V = kV<T>, NV = kRowVecs<T>;
  __shared__ C red[kBlock / 32];
  const int64_t row = blockIdx.x;  // the grid is R blocks
  const T* xr = x + row * L;
  T* yr = y + row * L;
  C acc[NV];
#pragma unroll
  for (int u = 0; u < NV; ++u) acc[u] = C(0);
  loop_pass<false, NV>(xr, L, [&](int u, int64_t, const C (&v)[V]) {  // absent: zeros
#pragma unroll
    for (int l = 0; l < V; ++l) {
      if constexpr (K == Kind::kRms) acc[u] = fma(v[l], v[l], acc[u]);
      else acc[u] += v[l];
    }
  });
  C mu = C(0), var;
  if constexpr (K == Kind::kRms) {
    var = loop_fold(acc, red) / static_cast<C>(L);
  } else {
    mu = loop_fold(acc, red) / static_cast<C>(L);
#pragma unroll
    for (int u = 0; u < NV; ++u) acc[u] = C(0);
    loop_pass<false, NV>(xr, L, [&](int u, int64_t i, const C (&v)[V]) {
      add_m2(v, i, L, mu, acc[u]);  // vectors are whole or absent
    });
    var = loop_fold(acc, red) / static_cast<C>(L);
  }
  const C rs = rstd_of(var, eps);
  if (threadIdx.x == 0) {
    if constexpr (K != Kind::kRms) mean[row] = mu;
    rstd[row] = rs;
  }
  const bool small = L <= 0xffffffffLL;
  loop_pass<true, NV>(xr, L, [&](int, int64_t i, const C (&v)[V]) {
    if (i < L) {
      C o[V];
      if constexpr (K == Kind::kGroup)
        group_affine<T>(v, o, i, L, S, (row % G) * Cg, w, b, mu, rs, small);
      else
        elem_affine<T>(v, o, i, L, w, b, mu, rs, true);
      store16<true, true>(yr + i, o);
    }
  });
}

/// A cluster's total of one value per block of B threads: block totals through distributed
/// shared memory, folded in rank order by every block (the same bits in each). `slot` (this
/// block's shared word for this reduction) must not be reused while another block may still
/// read it.
template <int B, class C>
__device__ __forceinline__ C cluster_total(C v, C* red, C* slot) {
  namespace cg = cooperative_groups;
  C s[1] = {v};
  group_sum(s, B, red);  // B known to the compiler: group_sum's fold unrolled for it
  if (threadIdx.x == 0) *slot = s[0];
  cg::cluster_group cl = cg::this_cluster();
  cl.sync();  // release / acquire: every block's total is visible
  C t = *cl.map_shared_rank(slot, 0);
  for (unsigned k = 1; k < cl.num_blocks(); ++k)
    t += *cl.map_shared_rank(slot, static_cast<int>(k));
  return t;
}

/// The row's two sums s over the kCs blocks of a cluster, each block's (every thread of it
/// holding them) written to `slots` (2 kCs values) in every block, then added in rank order by
/// each (the same bits in all). The caller alternates between two sets of slots, so that a block
/// one row ahead never writes over slots another block has still to read: it must first have
/// passed the next row's barrier, which that block reaches after its reads.
template <int kCs, class C> __device__ __forceinline__ void cluster_sums(C (&s)[2], C* slots) {
  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  const int r = static_cast<int>(cl.block_rank());
  if (threadIdx.x < static_cast<unsigned>(kCs)) {  // thread k writes into block k
    C* p = cl.map_shared_rank(slots + 2 * r, static_cast<int>(threadIdx.x));
    p[0] = s[0];
    p[1] = s[1];
  }
  cl.sync();  // release / acquire: every block's sums are in every block's slots
  C a = slots[0], b = slots[1];
#pragma unroll
  for (int k = 1; k < kCs; ++k) {
    a += slots[2 * k];
    b += slots[2 * k + 1];
  }
  s[0] = a;
  s[1] = b;
}

/// Rows longer than 64 KB and at most kMaxCluster x 64 KB (16-byte aligned, L % V == 0), enough
/// of them for kMinClusterBlocks blocks: a cluster of cs blocks of B threads per row (group
/// norm's large groups, above all), block k holding the k-th slice of `slice` <= B kSliceVecs
/// vectors in shared memory. The row is read from memory once (each thread's vectors loaded in
/// one batch, all in flight together), the sum (rms: of squares) and then the sum of
/// (x - mean)^2 are taken from shared memory and added over the cluster in rank order, and y is
/// written from shared memory: 2 n s bytes, where the chunk plan read x twice (H100, bf16
/// group norm forward (16, 512, 64, 64)/32 103.3 -> 76.4 us, (16, 32, 256, 256)/8 111.8 -> 94.4
/// us; f32 (16, 512, 64, 64)/32 150.1 -> 135.3 us).
template <class T, Kind K, int B>
__global__ void __launch_bounds__(B, kClusterMinBlocks<B>)
    fwd_cluster_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                       T* __restrict__ y, compute_t<T>* __restrict__ mean,
                       compute_t<T>* __restrict__ rstd, int64_t L, int64_t S, int64_t G,
                       int64_t Cg, compute_t<T> eps, int64_t slice) {
  namespace cg = cooperative_groups;
  using C = compute_t<T>;
  constexpr int V = kV<T>, U = kSliceVecs;
  extern __shared__ uint4 held[];  // this block's slice, raw
  __shared__ C red[B / 32];
  __shared__ C slots[2];  // this block's totals: the sum, then the sum of squares about the mean
  cg::cluster_group cl = cg::this_cluster();
  const int64_t row = blockIdx.x / cl.num_blocks();
  const int64_t nvec = L / V;
  const int64_t v0 = static_cast<int64_t>(cl.block_rank()) * slice;
  const int64_t n = v0 < nvec ? (nvec - v0 < slice ? nvec - v0 : slice) : 0;  // this slice's
  const uint4* xr = reinterpret_cast<const uint4*>(x + row * L) + v0;
  const int t = static_cast<int>(threadIdx.x);
  // Thread t holds vectors t + u B (u < U) of the slice: one batch of loads.
  C acc = C(0);
  {
    uint4 r[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = t + static_cast<int64_t>(u) * B;
      r[u] = k < n ? __ldcs(xr + k) : make_uint4(0, 0, 0, 0);  // read once: evict-first
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = t + static_cast<int64_t>(u) * B;
      if (k < n) held[k] = r[u];
      C v[V];
      widen16<T>(r[u], v);  // absent: zeros
#pragma unroll
      for (int l = 0; l < V; ++l) acc = K == Kind::kRms ? fma(v[l], v[l], acc) : acc + v[l];
    }
  }
  const C total = cluster_total<B>(acc, red, &slots[0]);
  C mu = C(0), var;
  if constexpr (K == Kind::kRms) {
    var = total / static_cast<C>(L);
  } else {
    mu = total / static_cast<C>(L);
    C m = C(0);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = t + static_cast<int64_t>(u) * B;
      if (k < n) {
        C v[V];
        widen16<T>(held[k], v);
        add_m2(v, 0, V, mu, m);  // a whole vector
      }
    }
    var = cluster_total<B>(m, red, &slots[1]) / static_cast<C>(L);
  }
  cl.barrier_arrive();  // this block's last read of another's slots is done
  const C rs = rstd_of(var, eps);
  if (cl.block_rank() == 0 && t == 0) {
    if constexpr (K != Kind::kRms) mean[row] = mu;
    rstd[row] = rs;
  }
  const bool small = L <= 0xffffffffLL;
  T* yr = y + row * L;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t k = t + static_cast<int64_t>(u) * B;
    if (k < n) {
      const int64_t i = (v0 + k) * V;
      C v[V], o[V];
      widen16<T>(held[k], v);
      if constexpr (K == Kind::kGroup)
        group_affine<T>(v, o, i, L, S, (row % G) * Cg, w, b, mu, rs, small);
      else
        elem_affine<T>(v, o, i, L, w, b, mu, rs, true);
      store16<true, true>(yr + i, o);
    }
  }
  cl.barrier_wait();  // no block leaves while another may still read its slots
}

/// The chunk of block `it` = row * nch + chunk of x (R, L), cs = kBlock * kFwdVecs * V elements:
/// thread t's vectors (u * kBlock + t) V, u < NV, into v (zeros past the row's end).
template <class T>
__device__ __forceinline__ void chunk_load(const T* __restrict__ xr, int64_t lo, int64_t hi,
                                           bool vec, compute_t<T> (&v)[kFwdVecs<T>][kV<T>]) {
#pragma unroll
  for (int u = 0; u < kFwdVecs<T>; ++u) {
    const int64_t i = lo + (static_cast<int64_t>(u) * kBlock + threadIdx.x) * kV<T>;
    if (i < hi) load_vec(xr, i, hi, vec, v[u]);
    else zero_vec<T>(v[u]);
  }
}

/// The chunk [lo, hi)'s two-pass (mean, M2) -> pm[it], pm2[it] (rms: the sum of squares ->
/// pm2[it]), from the block's registers v (chunk_load).
template <class T, Kind K>
__device__ __forceinline__ void chunk_partials(const compute_t<T> (&v)[kFwdVecs<T>][kV<T>],
                                               int64_t lo, int64_t hi, int64_t it,
                                               compute_t<T>* red, compute_t<T>* pm,
                                               compute_t<T>* pm2) {
  using C = compute_t<T>;
  constexpr int V = kV<T>, NV = kFwdVecs<T>;
  if constexpr (K == Kind::kRms) {
    C s[1] = {C(0)};
#pragma unroll
    for (int u = 0; u < NV; ++u)
#pragma unroll
      for (int l = 0; l < V; ++l) s[0] = fma(v[u][l], v[u][l], s[0]);
    group_sum(s, kBlock, red);
    if (threadIdx.x == 0) pm2[it] = s[0];
  } else {
    C s[1] = {C(0)};
#pragma unroll
    for (int u = 0; u < NV; ++u)
#pragma unroll
      for (int l = 0; l < V; ++l) s[0] += v[u][l];
    group_sum(s, kBlock, red);
    const C mu = s[0] / static_cast<C>(hi - lo);
    C m[1] = {C(0)};
#pragma unroll
    for (int u = 0; u < NV; ++u)
      add_m2(v[u], lo + (static_cast<int64_t>(u) * kBlock + threadIdx.x) * V, hi, mu, m[0]);
    group_sum(m, kBlock, red);
    if (threadIdx.x == 0) {
      pm[it] = mu;
      pm2[it] = m[0];
    }
  }
}

/// A row's statistics from its nch <= kInlineMerge chunk partials from p0 on, merged by one warp
/// (lane k folds chunks k, k + 32, ... in order, then chan_tree). kL2: partials written in this
/// launch (ld_part).
template <class C, Kind K, bool kL2>
__device__ __forceinline__ void merge_warp(const C* pm, const C* pm2, int64_t p0, int64_t nch,
                                           int64_t L, int64_t cs, C eps, C& mu, C& rs) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  C var;
  mu = C(0);
  if constexpr (K == Kind::kRms) {
    C s[1] = {C(0)};
    for (int64_t k = lane; k < nch; k += 32) s[0] += ld_part<kL2>(pm2 + p0 + k);
    lanes_sum(s, 32);
    var = s[0] / static_cast<C>(L);
  } else {
    MeanM2<C> a{0.0, C(0), C(0)};
    for (int64_t k = lane; k < nch; k += 32)
      a.add(static_cast<double>(dmin(cs, L - k * cs)), ld_part<kL2>(pm + p0 + k),
            ld_part<kL2>(pm2 + p0 + k));
    chan_tree(a);
    mu = __shfl_sync(0xffffffffu, a.mean, 0);
    var = __shfl_sync(0xffffffffu, a.m2, 0) / static_cast<C>(L);
  }
  rs = rstd_of(var, eps);
}

/// merge_warp in the block's warp 0, shared with the block through shared memory (every thread
/// must call it). Each warp merged for itself before: 8 times the Chan merges' FP64 divisions
/// (run 38's ncu: 221 K FP64 instructions in fwd_chunk_grid_kernel on (1, 16, 256, 256)/4).
template <class C, Kind K, bool kL2>
__device__ __forceinline__ void merge_chunks(const C* pm, const C* pm2, int64_t p0, int64_t nch,
                                             int64_t L, int64_t cs, C eps, C& mu, C& rs) {
  __shared__ C stat[2];
  if (threadIdx.x < 32) {
    merge_warp<C, K, kL2>(pm, pm2, p0, nch, L, cs, eps, mu, rs);
    if (threadIdx.x == 0) {
      stat[0] = mu;
      stat[1] = rs;
    }
  }
  __syncthreads();
  mu = stat[0];
  rs = stat[1];
}

/// merge_chunks for chunk c of `row`; chunk 0's block stores the row's mean (layer/group) and
/// rstd.
template <class C, Kind K, bool kL2>
__device__ __forceinline__ void merge_row(const C* pm, const C* pm2, int64_t row, int64_t c,
                                          int64_t nch, int64_t L, int64_t cs, C eps,
                                          C* __restrict__ mean, C* __restrict__ rstd, C& mu,
                                          C& rs) {
  merge_chunks<C, K, kL2>(pm, pm2, row * nch, nch, L, cs, eps, mu, rs);
  if (c == 0 && threadIdx.x == 0) {
    if constexpr (K != Kind::kRms) mean[row] = mu;
    rstd[row] = rs;
  }
}

/// y of one chunk vector at row position i < hi: the affine map of xv, as fwd_rows_kernel.
template <class T, Kind K>
__device__ __forceinline__ void chunk_store(const compute_t<T> (&xv)[kV<T>], T* __restrict__ yr,
                                            int64_t i, int64_t hi, int64_t L, int64_t S,
                                            int64_t ch0, const T* __restrict__ w,
                                            const T* __restrict__ b, compute_t<T> mu,
                                            compute_t<T> rs, bool vec) {
  compute_t<T> o[kV<T>];
  if constexpr (K == Kind::kGroup)
    group_affine<T>(xv, o, i, hi, S, ch0, w, b, mu, rs, L <= 0xffffffffLL);
  else
    elem_affine<T>(xv, o, i, L, w, b, mu, rs, vec);
  store_vec(yr, i, hi, vec, o);
}

/// Chunk statistics. x: (R, L) in chunks of cs = kBlock * kFwdVecs * V elements; block it =
/// row * nch + chunk writes the chunk's two-pass (mean, M2) to pm[it], pm2[it] (rms: the sum of
/// squares to pm2[it]).
template <class T, Kind K>
__global__ void __launch_bounds__(kBlock)
    fwd_chunk_stats_kernel(const T* __restrict__ x, int64_t L, int64_t nch, bool vec,
                           compute_t<T>* __restrict__ pm, compute_t<T>* __restrict__ pm2) {
  using C = compute_t<T>;
  constexpr int64_t cs = static_cast<int64_t>(kBlock) * kFwdVecs<T> * kV<T>;
  __shared__ C red[kBlock / 32];
  const int64_t it = blockIdx.x;
  const int64_t row = it / nch, c = it - row * nch;
  const int64_t lo = c * cs, hi = dmin(L, lo + cs);
  C v[kFwdVecs<T>][kV<T>];
  chunk_load<T>(x + row * L, lo, hi, vec, v);
  chunk_partials<T, K>(v, lo, hi, it, red, pm, pm2);
}

/// Long rows' statistics (more than kInlineMerge chunks): block `row` folds the row's chunk
/// partials (thread t: chunks t, t + kBlock, ... in order, then chan_tree per warp and over the
/// warps' results) and stores mean (layer/group) and rstd.
template <class C, Kind K>
__global__ void __launch_bounds__(kBlock)
    fwd_merge_kernel(const C* __restrict__ pm, const C* __restrict__ pm2, C* __restrict__ mean,
                     C* __restrict__ rstd, int64_t L, int64_t nch, int64_t cs, C eps) {
  const int64_t row = blockIdx.x, p0 = row * nch;
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  if constexpr (K == Kind::kRms) {
    __shared__ C red[kBlock / 32];
    C s[1] = {C(0)};
    for (int64_t k = threadIdx.x; k < nch; k += kBlock) s[0] += pm2[p0 + k];
    group_sum(s, kBlock, red);
    if (threadIdx.x == 0) rstd[row] = rstd_of(s[0] / static_cast<C>(L), eps);
  } else {
    __shared__ double wn[kBlock / 32];
    __shared__ C wm[kBlock / 32], wm2[kBlock / 32];
    MeanM2<C> a{0.0, C(0), C(0)};
    for (int64_t k = threadIdx.x; k < nch; k += kBlock)
      a.add(static_cast<double>(dmin(cs, L - k * cs)), pm[p0 + k], pm2[p0 + k]);
    chan_tree(a);
    if (lane == 0) {
      wn[warp] = a.n;
      wm[warp] = a.mean;
      wm2[warp] = a.m2;
    }
    __syncthreads();
    if (warp == 0) {
      MeanM2<C> b{0.0, C(0), C(0)};
      if (lane < kBlock / 32) b = MeanM2<C>{wn[lane], wm[lane], wm2[lane]};
      chan_tree(b);
      if (lane == 0) {
        mean[row] = b.mean;
        rstd[row] = rstd_of(b.m2 / static_cast<C>(L), eps);
      }
    }
  }
}

/// Chunk normalisation: block it = row * nch + chunk. With pm2 null the statistics are read
/// from mean/rstd (fwd_merge_kernel); else the block's warp 0 merges the row's partials
/// (merge_chunks) and chunk 0's block stores them. Then the chunk is written as in
/// fwd_rows_kernel.
template <class T, Kind K>
__global__ void __launch_bounds__(kBlock)
    fwd_chunk_write_kernel(const T* __restrict__ x, const T* __restrict__ w,
                           const T* __restrict__ b, T* __restrict__ y,
                           compute_t<T>* __restrict__ mean, compute_t<T>* __restrict__ rstd,
                           const compute_t<T>* __restrict__ pm,
                           const compute_t<T>* __restrict__ pm2, int64_t L, int64_t nch,
                           int64_t S, int64_t G, int64_t Cg, compute_t<T> eps, bool vec) {
  using C = compute_t<T>;
  constexpr int V = kV<T>, NV = kFwdVecs<T>;
  constexpr int64_t cs = static_cast<int64_t>(kBlock) * NV * V;
  const int64_t it = blockIdx.x;
  const int64_t row = it / nch, c = it - row * nch;
  const int64_t lo = c * cs, hi = dmin(L, lo + cs);
  C mu = C(0), rs;
  if (pm2 == nullptr) {  // uniform
    if constexpr (K != Kind::kRms) mu = mean[row];
    rs = rstd[row];
  } else {
    merge_row<C, K, false>(pm, pm2, row, c, nch, L, cs, eps, mean, rstd, mu, rs);
  }
  const T* xr = x + row * L;
#pragma unroll
  for (int u = 0; u < NV; ++u) {
    const int64_t i = lo + (static_cast<int64_t>(u) * kBlock + threadIdx.x) * V;
    if (i < hi) {
      C xv[V];
      load_vec(xr, i, hi, vec, xv);
      chunk_store<T, K>(xv, y + row * L, i, hi, L, S, (row % G) * Cg, w, b, mu, rs, vec);
    }
  }
}

/// The chunk plan in one launch, where its blocks all fit on the device at once (a cooperative
/// launch) and each row has at most kInlineMerge chunks: fwd_chunk_stats_kernel's partials, a
/// grid-wide barrier, then fwd_chunk_write_kernel's merge and stores from the chunk still held
/// in registers. The same operations as those two kernels (the same bits), in one launch
/// instead of two, and x read once (2 n s bytes, where the two kernels move 3 n s): the small
/// group norm (1, 16, 256, 256)/4 is 256 such blocks.
template <class T, Kind K>
__global__ void __launch_bounds__(kBlock)
    fwd_chunk_grid_kernel(const T* __restrict__ x, const T* __restrict__ w,
                          const T* __restrict__ b, T* __restrict__ y,
                          compute_t<T>* __restrict__ mean, compute_t<T>* __restrict__ rstd,
                          compute_t<T>* pm, compute_t<T>* pm2, int64_t L, int64_t nch,
                          int64_t S, int64_t G, int64_t Cg, compute_t<T> eps, bool vec) {
  using C = compute_t<T>;
  constexpr int V = kV<T>, NV = kFwdVecs<T>;
  constexpr int64_t cs = static_cast<int64_t>(kBlock) * NV * V;
  __shared__ C red[kBlock / 32];
  const int64_t it = blockIdx.x;
  const int64_t row = it / nch, c = it - row * nch;
  const int64_t lo = c * cs, hi = dmin(L, lo + cs);
  C v[NV][V];
  chunk_load<T>(x + row * L, lo, hi, vec, v);
  chunk_partials<T, K>(v, lo, hi, it, red, pm, pm2);
  cooperative_groups::this_grid().sync();  // every chunk's partials written and visible
  C mu, rs;
  merge_row<C, K, true>(pm, pm2, row, c, nch, L, cs, eps, mean, rstd, mu, rs);
#pragma unroll
  for (int u = 0; u < NV; ++u) {
    const int64_t i = lo + (static_cast<int64_t>(u) * kBlock + threadIdx.x) * V;
    if (i < hi)
      chunk_store<T, K>(v[u], y + row * L, i, hi, L, S, (row % G) * Cg, w, b, mu, rs, vec);
  }
}

// ---- backward: rms and layer norm ------------------------------------------------------------

/// Thread t's staged statistic k (0: its row's mean, 1: its rstd) in a pipelined stage whose
/// statistics start at 16-byte slot `first`: B slots, holding the B means, then the B rstds, each
/// in thread order, so that a warp's read of a statistic touches 32 consecutive words (f32). It
/// was meant to remove the 64 excess shared-memory wavefronts a warp a row that run 55's ncu
/// counted in the bf16 backward rows; run 60's source page puts them on the two 4-byte cp.async
/// copies themselves, 32 a warp (one a thread, every thread copying the same global word),
/// whatever the slots' layout.
template <class C>
__device__ __forceinline__ C* stat_slot(const uint4* stage, int first, int B, int t, int k) {
  return const_cast<C*>(reinterpret_cast<const C*>(stage + first * B)) + k * B + t;
}

/// The row's statistics into a stage (cp.async), by the first thread of each `lanes` (a power of
/// two <= 32: a warp's threads of one row) only, which stat_get hands them on to by a shuffle.
/// Every thread copying the same two words was served one thread at a time, 32 wavefronts a
/// warp instruction (run 60's excess wavefronts).
template <Kind K, class C>
__device__ __forceinline__ void stat_copy(uint4* stage, int first, int B, int lanes,
                                          const C* __restrict__ mean, const C* __restrict__ rstd,
                                          int64_t row) {
  const int t = static_cast<int>(threadIdx.x);
  if ((t & (lanes - 1)) != 0) return;
  if constexpr (K != Kind::kRms)  // rms rows keep no mean
    cp_async<sizeof(C)>(stat_slot<C>(stage, first, B, t, 0), mean + row);
  cp_async<sizeof(C)>(stat_slot<C>(stage, first, B, t, 1), rstd + row);
}
/// Statistic k of the calling thread's row from its stage (stat_copy's copy; `copied`: the
/// copier's row was copied). Every thread of the warp must call it.
template <class C>
__device__ __forceinline__ C stat_get(const uint4* stage, int first, int B, int k, int lanes,
                                      bool copied) {
  const int t = static_cast<int>(threadIdx.x);
  const C v = (t & (lanes - 1)) == 0 && copied ? *stat_slot<C>(stage, first, B, t, k) : C(0);
  return __shfl_sync(0xffffffffu, v, (t & 31) & ~(lanes - 1));
}

/// The per-element backward of one vector: d = x - mean (0 where absent), u = dy * rho; adds
/// u * w and q * w to s, and q, dy to the thread's column sums cw, cb (registers: a thread's
/// columns are the same on every row it takes); leaves d in xv and u in gv. kWhole: every
/// element is present (no tests); else the elements from `valid` on are absent.
template <bool kWhole, class T, Kind K>
__device__ __forceinline__ void bwd_vec_n(compute_t<T> (&xv)[kV<T>], compute_t<T> (&gv)[kV<T>],
                                          const compute_t<T> (&wv)[kV<T>], int valid,
                                          compute_t<T> mu, compute_t<T> rho,
                                          compute_t<T> (&s)[2], compute_t<T> (&cw)[kV<T>],
                                          compute_t<T> (&cb)[kV<T>]) {
  using C = compute_t<T>;
#pragma unroll
  for (int l = 0; l < kV<T>; ++l) {
    const bool in = kWhole || l < valid;
    const C d = in ? xv[l] - mu : C(0);
    const C u = in ? gv[l] * rho : C(0);
    const C q = u * d;
    if constexpr (K == Kind::kLayer) s[0] = fma(u, wv[l], s[0]);
    s[1] = fma(q, wv[l], s[1]);
    cw[l] += q;
    cb[l] += in ? gv[l] : C(0);
    xv[l] = d;
    gv[l] = u;
  }
}

/// bwd_vec_n for the vector at element i of a run of n: whole vectors (every vector of an
/// aligned row but those past its end) take the path without per-element tests.
template <class T, Kind K>
__device__ __forceinline__ void bwd_vec(compute_t<T> (&xv)[kV<T>], compute_t<T> (&gv)[kV<T>],
                                        const compute_t<T> (&wv)[kV<T>], int64_t i, int64_t n,
                                        compute_t<T> mu, compute_t<T> rho, compute_t<T> (&s)[2],
                                        compute_t<T> (&cw)[kV<T>], compute_t<T> (&cb)[kV<T>]) {
  if (i + kV<T> <= n) {
    bwd_vec_n<true, T, K>(xv, gv, wv, kV<T>, mu, rho, s, cw, cb);
  } else {
    const int valid = i >= n ? 0 : static_cast<int>(n - i);
    bwd_vec_n<false, T, K>(xv, gv, wv, valid, mu, rho, s, cw, cb);
  }
}

/// d = x - mean (xv) and u = dy * rho (gv) of one vector, in place: bwd_vec_n's, for a vector of
/// x and dy fetched again for its dx.
template <class T>
__device__ __forceinline__ void du_vec(compute_t<T> (&xv)[kV<T>], compute_t<T> (&gv)[kV<T>],
                                       compute_t<T> mu, compute_t<T> rho) {
#pragma unroll
  for (int l = 0; l < kV<T>; ++l) {
    xv[l] = xv[l] - mu;
    gv[l] = gv[l] * rho;
  }
}

/// dx of one vector from d (xv), u (gv), w, k and c: fma(u, w, fma(d, -k, -c)) (rms: d * -k).
template <class T, Kind K>
__device__ __forceinline__ void dx_vec(const compute_t<T> (&xv)[kV<T>],
                                       const compute_t<T> (&gv)[kV<T>],
                                       const compute_t<T> (&wv)[kV<T>], bool has_w,
                                       compute_t<T> kk, compute_t<T> cc,
                                       compute_t<T> (&o)[kV<T>]) {
  using C = compute_t<T>;
#pragma unroll
  for (int l = 0; l < kV<T>; ++l) {
    const C t = K == Kind::kRms ? xv[l] * -kk : fma(xv[l], -kk, -cc);
    o[l] = has_w ? fma(gv[l], wv[l], t) : gv[l] + t;
  }
}

template <class T>
__device__ __forceinline__ void load_w(const T* __restrict__ w, int64_t i, int64_t n, bool vec,
                                       compute_t<T> (&wv)[kV<T>]) {
  if (w) {
    load_vec(w, i, n, vec, wv);
  } else {
#pragma unroll
    for (int l = 0; l < kV<T>; ++l) wv[l] = compute_t<T>(1);
  }
}

/// Column sums in shared memory: thread t's slot e (e < E = NV * V: its vector u = e / V, lane
/// l = e % V) of array a (0: dw, 1: db) is cols[(a * E + e) * blockDim.x + t], so a warp's
/// accesses are conflict-free and no thread touches another's slots until the fold.
template <class C, int E> __device__ __forceinline__ C* col_slot(C* cols, int a, int e) {
  return cols + (a * E + e) * static_cast<int>(blockDim.x) + threadIdx.x;
}

/// Stores the calling thread's column sums (registers, E = NV V each) into its slots of the
/// wanted arrays, for fold_cols.
template <class C, int NV, int V>
__device__ __forceinline__ void put_cols(C* cols, const C (&cw)[NV][V], const C (&cb)[NV][V],
                                         bool want_w, bool want_b) {
  constexpr int E = NV * V;
#pragma unroll
  for (int u = 0; u < NV; ++u)
#pragma unroll
    for (int l = 0; l < V; ++l) {
      if (want_w) *col_slot<C, E>(cols, 0, u * V + l) = cw[u][l];
      if (want_b) *col_slot<C, E>(cols, 1, u * V + l) = cb[u][l];
    }
}

/// Array a's column sums -> p_row[lo + col]: group 0 (lanes of tpr threads) folds groups 1, 2...
/// into its own in order. Thread lane of every group holds columns lo + (lane + u * tpr) * V + l.
/// Call after a barrier that follows the last update.
template <class C, int NV, int V>
__device__ __forceinline__ void fold_cols(C* cols, int a, C* __restrict__ p_row, int64_t lo,
                                          int64_t hi, int tpr_log2) {
  constexpr int E = NV * V;
  const int tpr = 1 << tpr_log2;
  if ((static_cast<int>(threadIdx.x) >> tpr_log2) != 0) return;
  const int groups = static_cast<int>(blockDim.x) >> tpr_log2;
#pragma unroll
  for (int u = 0; u < NV; ++u) {
    const int64_t i = lo + (static_cast<int64_t>(u) * tpr + threadIdx.x) * V;
#pragma unroll
    for (int l = 0; l < V; ++l) {
      const C* slot = col_slot<C, E>(cols, a, u * V + l);
      C s = slot[0];
      for (int g = 1; g < groups; ++g) s += slot[g << tpr_log2];
      if (i + l < hi) p_row[i + l] = s;
    }
  }
}

/// bwd_rows_kernel's dynamic shared memory for the column sums: 2 * NV * V values a thread, when
/// a partial is wanted.
template <class T, int NV> constexpr size_t bwd_cols_bytes(int threads, bool want) {
  return want ? 2 * static_cast<size_t>(threads) * NV * kV<T> * sizeof(compute_t<T>) : 0;
}
/// The pipelined backward rows (the half types: bf16 16384x1024 rms and layer forward+backward
/// 9 % faster, run 31; f64, whose rows were at 80-84 % of the copy in run 8, though its 512
/// row blocks of 77 KB are not all resident at once (2 an SM): the second wave costs about 3 %
/// against the blocks' rows in one; f32 rows are at 86-88 % unpipelined): their stages, and the
/// 16-byte slots a thread has in each: NV of x, NV of dy, and one for the row's mean and rstd
/// (stat_slot: the block's slots hold the means, then the rstds, in thread order).
template <class T>
inline constexpr bool kBwdPipeRows = is_half_v<T> || std::is_same_v<T, double>;
constexpr int kBwdStages = 3;
template <int NV> inline constexpr int bwd_pipe_slots = 2 * NV + 1;
/// The long rows: rows of up to kBwdMaxThreads x kBwdLongVecs vectors (bf16/f16 and f32 D <=
/// 16384), in blocks of kBwdMaxThreads threads, one row a block at a time, kBwdLongRowBlocks
/// blocks (a constant, so that the partials and their bits do not depend on the device; at
/// least as many rows). Their NV vectors a thread are more than registers hold beside the
/// column sums, so each vector of x and dy is fetched twice (kBwdRefetch): for the row's sums,
/// then for dx. The half types' aligned rows are pipelined, and fetch both times from their
/// stage (x and dy read once from memory: 3 n s bytes, where the chunks move 5 n s); the column
/// sums reuse the stages' shared memory once the rows are done. So are f32's (kBwdLongPipe).
/// The f32 rows that do not split into two halves of whole vectors fetch from memory both
/// times, the second from the L2 (the rows in flight: 128 x 128 KB): 3 n s bytes from memory.
template <class T> inline constexpr int kBwdLongVecs = sizeof(T) <= 4 ? 32 / kV<T> : kBwdVecs<T>;
constexpr int64_t kBwdLongRowBlocks = 128;
template <class T, int NV> inline constexpr bool kBwdRefetch = NV > kBwdVecs<T>;
/// The half types' long rows keep w in shared memory past their stages (copied once a block),
/// and take 2 stages, so that the two fit (bf16 D = 16384: 147 KB of stages and 32 KB of w).
/// Run 49's ncu had them with 3 stages and w read per row and vector through an L1 that the
/// stages' 221 KB left too small for it (L1 hit rate 23 %): 40 % of their stall cycles waited
/// on L1TEX (global and local) results, at a quarter occupancy and 0.74 eligible warps a
/// scheduler (bf16 rms 4096x16384: 238.5 us, 1.64 TB/s).
template <class T, int NV, bool kPipe>
inline constexpr int kBwdRowStages = kBwdRefetch<T, NV> && kPipe ? 2 : kBwdStages;
/// A pipelined long-row block's dynamic shared memory: its kBwdRowStages stages, then w's copy
/// (w_bytes). The column sums reuse the memory after the rows.
template <class T, int NV> constexpr size_t bwd_long_smem(size_t w_bytes) {
  constexpr size_t stage = static_cast<size_t>(bwd_pipe_slots<NV>) * kBwdMaxThreads * 16;
  return kBwdRowStages<T, NV, true> * stage + w_bytes;
}
/// The long rows are pipelined where a block of kBwdMaxThreads threads holds their 2 stages and
/// w's copy: the half types' rows and f32's of up to 4 vectors a thread (D <= 8192: 147 KB of
/// stages, 32 KB of w). Longer f32 rows (D <= 16384) are split over a cluster of two such
/// blocks, each pipelining its half of every row, the row's two sums added over the cluster
/// (kBwdLongCluster). Run 52's ncu had the f32 rows, which fetched x and dy from memory a
/// vector at a time, at 0.41 eligible warps a scheduler (layer f32 4096x16384 backward 462 us,
/// 1.74 TB/s).
template <class T, int NV>
inline constexpr bool kBwdLongPipe =
    bwd_long_smem<T, NV>(static_cast<size_t>(kBwdMaxThreads) * NV * 16) <= kSmemPerBlock;
template <class T, int NV> inline constexpr int kBwdLongCluster = kBwdLongPipe<T, NV> ? 1 : 2;

/// Rows held in registers. x, dy, dx: (R, D); mean (layer), rstd: (R); pdw, pdb (or null):
/// (gridDim.x, D) column partials. Groups of tpr threads as fwd_rows_kernel; the block's groups
/// take rows blockIdx.x * gpb + g + k * gridDim.x * gpb, each thread summing q and dy of its
/// columns over its rows in registers, then folded through shared memory (dynamic:
/// bwd_cols_bytes, 2 * NV * V * blockDim.x values when a partial is wanted).
/// kPipe (aligned rows): each thread's vectors of x and dy, and its row's mean and rstd, are
/// copied kBwdStages - 1 rows ahead into its own slots of the dynamic shared memory past the
/// column sums (bwd_pipe_slots<NV> 16-byte slots a thread a stage), then a copy of w (D values,
/// where w is given); the long rows' (kBwdRefetch): at its start, kBwdRowStages of them, then
/// the copy of w; the column sums take the same memory after the rows. The long rows and f64's
/// pipelined rows are bound to 128 registers (f64's spilled 84 bytes at 64; their 256-thread
/// blocks are two an SM by shared memory either way).
template <class T, Kind K, int NV, bool kPipe, int kCs = 1>
__global__ void __launch_bounds__(kBwdMaxThreads,
                                  kBwdRefetch<T, NV> || (kPipe && sizeof(T) == 8) ? 1 : 2)
    bwd_rows_kernel(const T* __restrict__ x, const T* __restrict__ w,
                    const compute_t<T>* __restrict__ mean, const compute_t<T>* __restrict__ rstd,
                    const T* __restrict__ dy, T* __restrict__ dx, compute_t<T>* __restrict__ pdw,
                    compute_t<T>* __restrict__ pdb, int64_t R, int64_t D, int tpr_log2,
                    compute_t<T> inv_d, bool vec) {
  pdl_begin();  // launched as a programmatic dependent launch
  using C = compute_t<T>;
  constexpr int V = kV<T>;
  __shared__ C red[kBwdMaxThreads / 32 * 2];
  extern __shared__ __align__(16) unsigned char cols_raw[];
  C* cols = reinterpret_cast<C*>(cols_raw);
  const bool want_w = pdw != nullptr, want_b = pdb != nullptr;
  // kCs > 1: block `rank` of each cluster takes the rank-th slice of D / kCs columns of the
  // cluster's rows: from here on D is the slice's length, ld the rows' stride.
  const int64_t ld = D;
  int rank = 0;
  __shared__ C xch[kCs > 1 ? 2 * kCs * 2 : 1];  // the row sums' exchange, two rows' slots
  int par = 0;
  if constexpr (kCs > 1) {
    cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
    rank = static_cast<int>(cl.block_rank());
    D /= kCs;
    x += rank * D;
    dy += rank * D;
    dx += rank * D;
    if (w) w += rank * D;
    cl.sync();  // every block of the cluster running before any writes to its shared memory
  }
  // The long rows (kBwdRefetch) take a row a block of kBwdMaxThreads (run_bwd_rows): their
  // count, known to the compiler, folds the lanes' index arithmetic and unrolls group_sum's
  // fold of the row's 16 warps (at run time it took the fold's tests and loop).
  if constexpr (kBwdRefetch<T, NV>) tpr_log2 = kBwdMaxThreadsLog2;
  const int tpr = 1 << tpr_log2;
  const int gpb = static_cast<int>(blockDim.x) >> tpr_log2;
  const int g = static_cast<int>(threadIdx.x) >> tpr_log2;
  const int lane = static_cast<int>(threadIdx.x) & (tpr - 1);
  const int wlanes = tpr < 32 ? tpr : 32;  // a row's threads in one warp (stat_copy, stat_get)
  constexpr bool kRe = kBwdRefetch<T, NV>;
  constexpr bool kStaged = kRe && kPipe;  // the column sums reuse the stages' memory
  constexpr int kS = kBwdRowStages<T, NV, kPipe>;
  // The long f32 rows keep their column sums in their slots of the shared memory (col_slot,
  // where put_cols would store them), registers holding one vector's at a time: NV = 8 vectors'
  // sums took 128 registers and spilled 400 bytes. The same adds in the same order.
  constexpr bool kShCols = kRe && !kPipe;
  constexpr int E = NV * V;
  C cw[kShCols ? 1 : NV][V], cb[kShCols ? 1 : NV][V];
#pragma unroll
  for (int u = 0; u < (kShCols ? 1 : NV); ++u) {
    zero_vec<T>(cw[u]);
    zero_vec<T>(cb[u]);
  }
  if constexpr (kShCols) {
#pragma unroll
    for (int e = 0; e < E; ++e) {
      if (want_w) *col_slot<C, E>(cols, 0, e) = C(0);
      if (want_b) *col_slot<C, E>(cols, 1, e) = C(0);
    }
  }
  const int B = static_cast<int>(blockDim.x), t = static_cast<int>(threadIdx.x);
  // kPipe: the stages, past the column sums (kStaged: the column sums reuse them) ...
  auto stages = [&]() {
    return reinterpret_cast<uint4*>(
        cols_raw + (kStaged ? 0 : bwd_cols_bytes<T, NV>(B, want_w || want_b)));
  };
  // ... then w's vectors (whole vectors: the rows are aligned), copied once a block, where
  // reading w from L1 on every row was the row's most-sampled stall (run 60: the first use of
  // w's vector, long scoreboard). Its address is taken again at each use, which keeps it out of
  // the registers.
  auto w_copy = [&]() { return stages() + kS * bwd_pipe_slots<NV> * blockDim.x; };
  if constexpr (kPipe) {
    if (w) {  // uniform
      const uint4* wg = reinterpret_cast<const uint4*>(w);
      for (int64_t k = t; k < D / V; k += B) w_copy()[k] = wg[k];
      __syncthreads();  // every vector of w in place before the first row reads it
    }
  }
  // w's vector at element i < D (ones without w), from its copy when the rows keep one.
  auto get_w = [&](int64_t i, C (&wv)[V]) {
    if constexpr (kPipe) {
      if (w) {
        widen16<T>(w_copy()[i / V], wv);
        return;
      }
    }
    load_w(w, i, D, vec, wv);
  };
  // One row group's row (rb uniform across the block); stage: its slots when kPipe. Vector u of
  // x and dy is fetched into registers once (the long rows: once for the sums, again for dx).
  constexpr int NH = kRe ? 1 : NV;  // vectors of x and of dy held across the row's sums
  auto one_row = [&](int64_t rb, const uint4* stage) {
    const int64_t row = rb + g;
    const bool active = row < R;
    const int64_t off = (active ? row : 0) * ld;
    C xv[NH][V], gv[NH][V];
    auto fetch = [&](int u) {
      const int h = kRe ? 0 : u;
      const int64_t i = (static_cast<int64_t>(u) * tpr + lane) * V;
      if (active && i < D) {
        if constexpr (kPipe) {
          widen16<T>(stage[u * B + t], xv[h]);
          widen16<T>(stage[(NV + u) * B + t], gv[h]);
        } else {
          load_vec(x + off, i, D, vec, xv[h]);
          load_vec(dy + off, i, D, vec, gv[h]);
        }
      } else {
        zero_vec<T>(xv[h]);
        zero_vec<T>(gv[h]);
      }
    };
    if constexpr (!kRe) {
#pragma unroll
      for (int u = 0; u < NV; ++u) fetch(u);
    }
    C mu = C(0), rho = C(0);
    if constexpr (kPipe) {
      if constexpr (K == Kind::kLayer) mu = stat_get<C>(stage, 2 * NV, B, 0, wlanes, active);
      rho = stat_get<C>(stage, 2 * NV, B, 1, wlanes, active);
    } else if (active) {
      if constexpr (K == Kind::kLayer) mu = mean[row];
      rho = rstd[row];
    }
    C s[2] = {C(0), C(0)};
#pragma unroll
    for (int u = 0; u < NV; ++u) {
      const int h = kRe ? 0 : u, c = kShCols ? 0 : u;
      if constexpr (kRe) fetch(u);
      const int64_t i = (static_cast<int64_t>(u) * tpr + lane) * V;
      C wv[V];
      get_w(i < D ? i : 0, wv);
      if constexpr (kShCols) {
#pragma unroll
        for (int l = 0; l < V; ++l) {
          cw[0][l] = want_w ? *col_slot<C, E>(cols, 0, u * V + l) : C(0);
          cb[0][l] = want_b ? *col_slot<C, E>(cols, 1, u * V + l) : C(0);
        }
      }
      bwd_vec<T, K>(xv[h], gv[h], wv, i, active ? D : 0, mu, rho, s, cw[c], cb[c]);
      if constexpr (kShCols) {
#pragma unroll
        for (int l = 0; l < V; ++l) {
          if (want_w) *col_slot<C, E>(cols, 0, u * V + l) = cw[0][l];
          if (want_b) *col_slot<C, E>(cols, 1, u * V + l) = cb[0][l];
        }
      }
    }
    group_sum(s, tpr, red);
    if constexpr (kCs > 1) {
      cluster_sums<kCs>(s, xch + par * kCs * 2);
      par ^= 1;
    }
    const C kk = rho * rho * s[1] * inv_d;
    const C cc = s[0] * inv_d;
    if (active) {
#pragma unroll
      for (int u = 0; u < NV; ++u) {
        const int h = kRe ? 0 : u;
        const int64_t i = (static_cast<int64_t>(u) * tpr + lane) * V;
        if (i < D) {
          if constexpr (kRe) {  // x and dy again: d and u as bwd_vec made them
            fetch(u);
            du_vec<T>(xv[0], gv[0], mu, rho);
          }
          C wv[V], o[V];
          get_w(i, wv);
          dx_vec<T, K>(xv[h], gv[h], wv, w != nullptr, kk, cc, o);
          store_vec(dx + off, i, D, vec, o);
        }
      }
    }
  };
  const int64_t first = static_cast<int64_t>(blockIdx.x / kCs) * gpb;
  const int64_t step = static_cast<int64_t>(gridDim.x / kCs) * gpb;
  if constexpr (!kPipe) {
    for (int64_t rb = first; rb < R; rb += step) one_row(rb, nullptr);  // rb uniform
  } else {
    pipelined_rows<kS>(
        first, step, R, stages(), bwd_pipe_slots<NV> * B,
        [&](uint4* stage, int64_t rb) {
          const int64_t row = rb + g;
          if (row >= R) return;
#pragma unroll
          for (int u = 0; u < NV; ++u) {
            const int64_t i = (static_cast<int64_t>(u) * tpr + lane) * V;
            if (i < D) {
              cp_async<16>(&stage[u * B + t], x + row * ld + i);
              cp_async<16>(&stage[(NV + u) * B + t], dy + row * ld + i);
            }
          }
          stat_copy<K>(stage, 2 * NV, B, wlanes, mean, rstd, row);
        },
        [&](const uint4* stage, int64_t rb) { one_row(rb, stage); });
  }
  if (!want_w && !want_b) return;  // uniform
  if constexpr (kStaged) __syncthreads();  // every thread's reads of its stages are done
  if constexpr (!kShCols) put_cols(cols, cw, cb, want_w, want_b);
  __syncthreads();  // every thread's column sums are in place
  const int64_t prow = static_cast<int64_t>(blockIdx.x / kCs) * ld + rank * D;
  if (want_w) fold_cols<C, NV, V>(cols, 0, pdw + prow, 0, D, tpr_log2);
  if (want_b) fold_cols<C, NV, V>(cols, 1, pdb + prow, 0, D, tpr_log2);
}

/// The pipelined chunk kernels' prefetch (aligned rows): thread t's vectors of x and dy in
/// [lo, hi) of row `row` into its slots u * kBlock + t and (kBwdVecs + u) * kBlock + t of
/// `stage`, and the row's mean (layer) and rstd into its stat_slot past them (cp.async).
template <class T, Kind K>
__device__ __forceinline__ void bwd_chunk_prefetch(uint4* stage, const T* __restrict__ x,
                                                   const T* __restrict__ dy,
                                                   const compute_t<T>* __restrict__ mean,
                                                   const compute_t<T>* __restrict__ rstd,
                                                   int64_t row, int64_t lo, int64_t hi, int64_t D) {
  constexpr int NV = kBwdVecs<T>, B = kBlock;
  const int t = static_cast<int>(threadIdx.x);
#pragma unroll
  for (int u = 0; u < NV; ++u) {
    const int64_t i = lo + (static_cast<int64_t>(u) * B + t) * kV<T>;
    if (i < hi) {
      cp_async<16>(&stage[u * B + t], x + row * D + i);
      cp_async<16>(&stage[(NV + u) * B + t], dy + row * D + i);
    }
  }
  stat_copy<K>(stage, 2 * NV, B, 32, mean, rstd, row);
}

/// Chunked sums. x, dy: (R, D) in chunks of cb = kBlock * kBwdVecs * V; block (c, k) takes chunk
/// c of rows k, k + gridDim.y, ...: ps[(row * nch + c) * 2 + {0, 1}] = the chunk's sums of u w
/// and q w; pdw, pdb (or null): (gridDim.y, D) column partials, summed in registers and folded
/// through shared memory as in bwd_rows_kernel (one group of kBlock threads: dynamic
/// 2 * kBwdVecs * V * kBlock values).
/// kPipe (aligned rows): each thread's vectors of x and dy, and the row's mean and rstd, copied
/// kBwdStages - 1 rows ahead into its own slots of the dynamic shared memory past the column
/// sums, as bwd_rows_kernel's (gpu-wip6: these blocks waited on each row's loads after the last
/// row's barriers; bf16 4096x16384 rms/layer forward+backward at 51-56 % of the copy, run 7).
template <class T, Kind K, bool kPipe>
__global__ void __launch_bounds__(kBlock)
    bwd_chunk_sums_kernel(const T* __restrict__ x, const T* __restrict__ w,
                          const compute_t<T>* __restrict__ mean,
                          const compute_t<T>* __restrict__ rstd, const T* __restrict__ dy,
                          compute_t<T>* __restrict__ ps, compute_t<T>* __restrict__ pdw,
                          compute_t<T>* __restrict__ pdb, int64_t R, int64_t D, int64_t nch,
                          bool vec) {
  using C = compute_t<T>;
  constexpr int V = kV<T>, NV = kBwdVecs<T>, B = kBlock;
  constexpr int64_t cb = static_cast<int64_t>(kBlock) * NV * V;
  __shared__ C red[kBlock / 32 * 2];
  extern __shared__ __align__(16) unsigned char cols_raw[];
  C* cols = reinterpret_cast<C*>(cols_raw);
  const bool want_w = pdw != nullptr, want_b = pdb != nullptr;
  const int64_t c = blockIdx.x;
  const int64_t lo = c * cb, hi = dmin(D, lo + cb);
  const int t = static_cast<int>(threadIdx.x);
  C cw[NV][V], cbs[NV][V];
#pragma unroll
  for (int u = 0; u < NV; ++u) {
    zero_vec<T>(cw[u]);
    zero_vec<T>(cbs[u]);
  }
  auto one_row = [&](int64_t r, const uint4* stage) {  // r uniform
    const int64_t off = r * D;
    C xv[NV][V], gv[NV][V];
#pragma unroll
    for (int u = 0; u < NV; ++u) {
      const int64_t i = lo + (static_cast<int64_t>(u) * kBlock + t) * V;
      if (i < hi) {
        if constexpr (kPipe) {
          widen16<T>(stage[u * B + t], xv[u]);
          widen16<T>(stage[(NV + u) * B + t], gv[u]);
        } else {
          load_vec(x + off, i, hi, vec, xv[u]);
          load_vec(dy + off, i, hi, vec, gv[u]);
        }
      } else {
        zero_vec<T>(xv[u]);
        zero_vec<T>(gv[u]);
      }
    }
    const C mu = K == Kind::kLayer
                     ? (kPipe ? stat_get<C>(stage, 2 * NV, B, 0, 32, true) : mean[r])
                     : C(0);
    const C rho = kPipe ? stat_get<C>(stage, 2 * NV, B, 1, 32, true) : rstd[r];
    C s[2] = {C(0), C(0)};
#pragma unroll
    for (int u = 0; u < NV; ++u) {
      const int64_t i = lo + (static_cast<int64_t>(u) * kBlock + t) * V;
      C wv[V];
      load_w(w, i < hi ? i : lo, hi, vec, wv);
      bwd_vec<T, K>(xv[u], gv[u], wv, i, hi, mu, rho, s, cw[u], cbs[u]);
    }
    group_sum(s, kBlock, red);
    if (t == 0) {
      ps[(r * nch + c) * 2] = s[0];
      ps[(r * nch + c) * 2 + 1] = s[1];
    }
  };
  if constexpr (!kPipe) {
    for (int64_t r = blockIdx.y; r < R; r += gridDim.y) one_row(r, nullptr);
  } else {
    uint4* slots = reinterpret_cast<uint4*>(cols_raw + bwd_cols_bytes<T, NV>(B, want_w || want_b));
    pipelined_rows<kBwdStages>(
        blockIdx.y, gridDim.y, R, slots, bwd_pipe_slots<NV> * B,
        [&](uint4* stage, int64_t r) {
          if (r < R) bwd_chunk_prefetch<T, K>(stage, x, dy, mean, rstd, r, lo, hi, D);
        },
        [&](const uint4* stage, int64_t r) { one_row(r, stage); });
  }
  // One group per block: fold_cols reads only the thread's own slots (the barrier keeps its
  // contract all the same).
  if (!want_w && !want_b) return;  // uniform
  put_cols(cols, cw, cbs, want_w, want_b);
  __syncthreads();
  const int64_t prow = static_cast<int64_t>(blockIdx.y) * D;
  if (want_w) fold_cols<C, NV, V>(cols, 0, pdw + prow, lo, hi, 8);
  if (want_b) fold_cols<C, NV, V>(cols, 1, pdb + prow, lo, hi, 8);
}
static_assert(kBlock == 1 << 8, "bwd_chunk_sums_kernel passes tpr_log2 = 8");

/// Long rows' backward sums (more than kInlineMerge partials): block `row` computes row_sums
/// over the row's np partials (thread t: k = t, t + kBlock, ..., then group_sum) into
/// pre[row * 2 + {0, 1}]. Group norm (w non-null): row r's channels start at (r % G) * Cg.
template <class T>
__global__ void __launch_bounds__(kBlock)
    sums_merge_kernel(const compute_t<T>* __restrict__ a0, const compute_t<T>* __restrict__ a1,
                      int64_t st, int64_t np, const T* __restrict__ w, int64_t G, int64_t Cg,
                      int64_t P, compute_t<T>* __restrict__ pre) {
  using C = compute_t<T>;
  __shared__ C red[kBlock / 32 * 2];
  const int64_t row = blockIdx.x;
  C s[2] = {C(0), C(0)};
  row_sums<T>(s, a0, a1, st, row * np, np, threadIdx.x, kBlock, w, (row % G) * Cg, P);
  group_sum(s, kBlock, red);
  if (threadIdx.x == 0) {
    pre[row * 2] = s[0];
    pre[row * 2 + 1] = s[1];
  }
}

/// Chunked dx: item it = row * nch + c (block it; kPipe: a persistent grid whose block takes
/// items blockIdx.x, + gridDim.x, ..., each thread's vectors of x and dy and the row's mean and
/// rstd copied kBwdStages - 1 items ahead into its own slots, as bwd_chunk_sums_kernel's). The
/// row's sums come from pre (sums_merge_kernel) or, pre null, each warp folds the row's chunk
/// sums itself (row_sums with lane stride, then a butterfly); then dx of chunk c.
template <class T, Kind K, bool kPipe>
__global__ void __launch_bounds__(kBlock)
    bwd_chunk_dx_kernel(const T* __restrict__ x, const T* __restrict__ w,
                        const compute_t<T>* __restrict__ mean,
                        const compute_t<T>* __restrict__ rstd, const T* __restrict__ dy,
                        const compute_t<T>* __restrict__ ps,
                        const compute_t<T>* __restrict__ pre, T* __restrict__ dx, int64_t D,
                        int64_t nch, int64_t items, compute_t<T> inv_d, bool vec) {
  using C = compute_t<T>;
  constexpr int V = kV<T>, NV = kBwdVecs<T>, B = kBlock;
  constexpr int64_t cb = static_cast<int64_t>(kBlock) * NV * V;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int t = static_cast<int>(threadIdx.x);
  auto one = [&](int64_t it, const uint4* stage) {
    const int64_t row = it / nch, c = it - row * nch;
    const int64_t lo = c * cb, hi = dmin(D, lo + cb);
    C s[2] = {C(0), C(0)};
    if (pre) {  // uniform
      s[0] = pre[row * 2];
      s[1] = pre[row * 2 + 1];
    } else {
      row_sums<T>(s, ps, ps + 1, 2, row * nch, nch, lane, 32, nullptr, 0, 1);
      lanes_sum(s, 32);
    }
    const C mu = K == Kind::kLayer
                     ? (kPipe ? stat_get<C>(stage, 2 * NV, B, 0, 32, true) : mean[row])
                     : C(0);
    const C rho = kPipe ? stat_get<C>(stage, 2 * NV, B, 1, 32, true) : rstd[row];
    const C kk = rho * rho * s[1] * inv_d;
    const C cc = s[0] * inv_d;
    const int64_t off = row * D;
#pragma unroll
    for (int u = 0; u < NV; ++u) {
      const int64_t i = lo + (static_cast<int64_t>(u) * kBlock + t) * V;
      if (i < hi) {
        C xv[V], gv[V], wv[V], o[V];
        if constexpr (kPipe) {
          widen16<T>(stage[u * B + t], xv);
          widen16<T>(stage[(NV + u) * B + t], gv);
        } else {
          load_vec(x + off, i, hi, vec, xv);
          load_vec(dy + off, i, hi, vec, gv);
        }
        load_w(w, i, hi, vec, wv);
        du_vec<T>(xv, gv, mu, rho);
        dx_vec<T, K>(xv, gv, wv, w != nullptr, kk, cc, o);
        store_vec(dx + off, i, hi, vec, o);
      }
    }
  };
  if constexpr (!kPipe) {
    one(blockIdx.x, nullptr);
  } else {
    extern __shared__ uint4 dx_slots[];
    pipelined_rows<kBwdStages>(
        blockIdx.x, gridDim.x, items, dx_slots, bwd_pipe_slots<NV> * B,
        [&](uint4* stage, int64_t it) {
          if (it >= items) return;
          const int64_t row = it / nch, lo = (it - row * nch) * cb;
          bwd_chunk_prefetch<T, K>(stage, x, dy, mean, rstd, row, lo, dmin(D, lo + cb), D);
        },
        [&](const uint4* stage, int64_t it) { one(it, stage); });
  }
}

// ---- backward: group norm --------------------------------------------------------------------

/// gn_bwd_sums_kernel's sums of one vector: s += (u, u d, dy), u = dy rho, d = x - mean; the
/// elements from `valid` on are absent (kWhole: none is, and nothing is tested).
template <bool kWhole, class T>
__device__ __forceinline__ void gn_sums_vec(const compute_t<T> (&xv)[kV<T>],
                                            const compute_t<T> (&gv)[kV<T>], int valid,
                                            compute_t<T> mu, compute_t<T> rho,
                                            compute_t<T> (&s)[3]) {
  using C = compute_t<T>;
#pragma unroll
  for (int l = 0; l < kV<T>; ++l) {
    const bool in = kWhole || l < valid;
    const C d = in ? xv[l] - mu : C(0);
    const C u = in ? gv[l] * rho : C(0);
    s[0] += u;
    s[1] = fma(u, d, s[1]);
    s[2] += gv[l];  // 0 where absent
  }
}

/// Group norm's dx of a whole vector in one channel (weight wc, or none):
/// dx = fma(u, w, fma(d, -k, -c)), u = dy rho, d = x - mean (the composed form's two mul_adds).
template <class T>
__device__ __forceinline__ void gn_dx_vec(const compute_t<T> (&xv)[kV<T>],
                                          const compute_t<T> (&gv)[kV<T>], compute_t<T> mu,
                                          compute_t<T> rho, compute_t<T> kk, compute_t<T> cc,
                                          compute_t<T> wc, bool has_w, compute_t<T> (&o)[kV<T>]) {
#pragma unroll
  for (int l = 0; l < kV<T>; ++l) {
    const compute_t<T> t = fma(xv[l] - mu, -kk, -cc);
    const compute_t<T> uu = gv[l] * rho;
    o[l] = has_w ? fma(uu, wc, t) : uu + t;
  }
}

/// Per-channel sums. x, dy: (N, C, S), each channel run cut into P pieces of ps elements; item
/// = (n * C + ch) * P + p, taken by a group of tpu threads (blockDim.x / tpu items per block):
/// pu[item] = sum(u), pq[item] = sum(q), pdy[item] (or null) = sum(dy) over the piece, with the
/// statistics of (n, ch / Cg).
template <class T>
__global__ void __launch_bounds__(kBlock)
    gn_bwd_sums_kernel(const T* __restrict__ x, const T* __restrict__ dy,
                       const compute_t<T>* __restrict__ mean,
                       const compute_t<T>* __restrict__ rstd, compute_t<T>* __restrict__ pu,
                       compute_t<T>* __restrict__ pq, compute_t<T>* __restrict__ pdy,
                       int64_t items, int64_t Cn, int64_t S, int64_t G, int64_t Cg, int64_t P,
                       int64_t ps, int tpu_log2, bool vec) {
  using C = compute_t<T>;
  constexpr int V = kV<T>, NU = kFwdVecs<T>;
  __shared__ C red[kBlock / 32 * 3];
  const int tpu = 1 << tpu_log2;
  const int lane = static_cast<int>(threadIdx.x) & (tpu - 1);
  const int64_t item = static_cast<int64_t>(blockIdx.x) * (kBlock >> tpu_log2) +
                       (threadIdx.x >> tpu_log2);
  const bool active = item < items;
  const int64_t it = active ? item : 0;
  const int64_t nc = it / P, p = it - nc * P;
  const int64_t n = nc / Cn, ch = nc - n * Cn;
  const int64_t grp = n * G + ch / Cg;
  const T* xc = x + nc * S;
  const T* gc = dy + nc * S;
  const int64_t lo = p * ps, hi = active ? dmin(S, lo + ps) : lo;
  const C mu = mean[grp], rho = rstd[grp];
  C s[3] = {C(0), C(0), C(0)};
  const int64_t step = static_cast<int64_t>(tpu) * V * NU;
  for (int64_t i0 = lo + static_cast<int64_t>(lane) * V; i0 < hi; i0 += step) {
    C xv[NU][V], gv[NU][V];
#pragma unroll
    for (int k = 0; k < NU; ++k) {  // every load first, then the arithmetic
      const int64_t i = i0 + static_cast<int64_t>(k) * tpu * V;
      if (i < hi) {
        load_vec(xc, i, hi, vec, xv[k]);
        load_vec(gc, i, hi, vec, gv[k]);
      } else {
        zero_vec<T>(xv[k]);
        zero_vec<T>(gv[k]);
      }
    }
#pragma unroll
    for (int k = 0; k < NU; ++k) {
      const int64_t i = i0 + static_cast<int64_t>(k) * tpu * V;
      if (i + V <= hi) {
        gn_sums_vec<true, T>(xv[k], gv[k], V, mu, rho, s);
      } else {
        gn_sums_vec<false, T>(xv[k], gv[k], i >= hi ? 0 : static_cast<int>(hi - i), mu, rho, s);
      }
    }
  }
  group_sum(s, tpu, red);
  if (active && lane == 0) {
    pu[item] = s[0];
    pq[item] = s[1];
    if (pdy) pdy[item] = s[2];
  }
}

/// A group norm row's sums (row_sums over its Cg * P channel sums with w, lane stride, then a
/// butterfly) folded by one warp, the threads with `folds` (lanes `lane` 0 to 31), and shared
/// through `slot` with the rest of the team after a barrier, which every thread of the block
/// must reach. kL2: sums written in this launch (ld_part).
template <class T, bool kL2>
__device__ __forceinline__ void gn_team_sums(compute_t<T> (&r)[2], bool folds, int lane,
                                             const compute_t<T>* pu, const compute_t<T>* pq,
                                             int64_t row, int64_t Cg, int64_t P,
                                             const T* __restrict__ w, int64_t ch0,
                                             compute_t<T>* slot) {
  if (folds) {
    row_sums<T, kL2>(r, pu, pq, 1, row * Cg * P, Cg * P, lane, 32, w, ch0, P);
    lanes_sum(r, 32);
    if (lane == 0) {
      slot[0] = r[0];
      slot[1] = r[1];
    }
  }
  __syncthreads();
  r[0] = slot[0];
  r[1] = slot[1];
}

/// Group norm dx. x, dy, dx: (N * G, L) rows of L = Cg * S, in chunks of cs = tpr * kFwdVecs * V;
/// item = row * nch + chunk, taken by a group of tpr threads. The row's sums come from pre
/// (sums_merge_kernel) or, pre null, a warp folds its row's Cg * P channel sums with w
/// (row_sums with lane stride, then a butterfly): each sub-warp group its own, a team of several
/// warps its first, whose sums the others read from shared memory (each warp folded them before:
/// 8 times the loads and shuffles in the 256-thread teams); then
/// dx = fma(u, w[ch], fma(d, -k, -c)) over the chunk.
template <class T>
__global__ void __launch_bounds__(kBlock)
    gn_bwd_dx_kernel(const T* __restrict__ x, const T* __restrict__ w,
                     const compute_t<T>* __restrict__ mean, const compute_t<T>* __restrict__ rstd,
                     const T* __restrict__ dy, const compute_t<T>* __restrict__ pu,
                     const compute_t<T>* __restrict__ pq, const compute_t<T>* __restrict__ pre,
                     T* __restrict__ dx, int64_t items,
                     int64_t L, int64_t nch, int64_t S, int64_t G, int64_t Cg,
                     int64_t P, int tpr_log2, compute_t<T> inv_m, bool vec) {
  using C = compute_t<T>;
  constexpr int V = kV<T>, NV = kFwdVecs<T>;
  const int tpr = 1 << tpr_log2;
  const int lane = static_cast<int>(threadIdx.x) & (tpr - 1);
  const int64_t item = static_cast<int64_t>(blockIdx.x) * (kBlock >> tpr_log2) +
                       (threadIdx.x >> tpr_log2);
  const bool active = item < items;
  const int64_t it = active ? item : 0;
  const int64_t row = it / nch, c = it - row * nch;
  const int64_t cs = static_cast<int64_t>(tpr) * NV * V;
  const int64_t lo = c * cs, hi = dmin(L, lo + cs);
  const int64_t ch0 = (row % G) * Cg;
  C s[2] = {C(0), C(0)};
  if (pre) {  // uniform
    if (!active) return;
    s[0] = pre[row * 2];
    s[1] = pre[row * 2 + 1];
  } else {
    // The group's Cg * P sums are adjacent, from (n * Cn + ch0) * P = row * Cg * P (Cn = G Cg).
    const int mw = tpr < 32 ? tpr : 32;
    if (tpr > 32) {  // uniform: the row team's first warp folds them, the others take its sums
      __shared__ C team[kBlock / 64][2];
      gn_team_sums<T, false>(s, active && lane < 32, lane, pu, pq, row, Cg, P, w, ch0,
                             team[static_cast<int>(threadIdx.x) >> tpr_log2]);
    } else {
      if (active)
        row_sums<T>(s, pu, pq, 1, row * Cg * P, Cg * P, static_cast<int>(threadIdx.x) & (mw - 1),
                    mw, w, ch0, P);
      lanes_sum(s, mw);
    }
    if (!active) return;  // no barrier or shuffle follows
  }
  const C mu = mean[row], rho = rstd[row];
  const C kk = rho * rho * s[1] * inv_m;
  const C cc = s[0] * inv_m;
  const int64_t off = row * L;
  const bool small = L <= 0xffffffffLL;
#pragma unroll
  for (int u = 0; u < NV; ++u) {
    const int64_t i = lo + (static_cast<int64_t>(u) * tpr + lane) * V;
    if (i < hi) {
      C xv[V], gv[V], o[V];
      load_vec(x + off, i, hi, vec, xv);
      load_vec(dy + off, i, hi, vec, gv);
      int64_t cl = run_of(i, S, small);
      int64_t next = (cl + 1) * S;
      C wc = w ? load_c(w[ch0 + cl]) : C(1);
      if (i + V <= hi && i + V <= next) {  // whole, in one channel: no per-element tests
        gn_dx_vec<T>(xv, gv, mu, rho, kk, cc, wc, w != nullptr, o);
        store_vec(dx + off, i, hi, vec, o);
        continue;
      }
#pragma unroll
      for (int l = 0; l < V; ++l) {
        const int64_t e = i + l;
        o[l] = C(0);
        if (e < hi) {
          if (e >= next) {
            do {
              ++cl;
              next += S;
            } while (e >= next);
            wc = w ? load_c(w[ch0 + cl]) : C(1);
          }
          const C t = fma(xv[l] - mu, -kk, -cc);
          const C uu = gv[l] * rho;
          o[l] = w ? fma(uu, wc, t) : uu + t;
        }
      }
      store_vec(dx + off, i, hi, vec, o);
    }
  }
}

// ---- dw, db: the partials' fold ------------------------------------------------------------

/// part: (Nn, Cc, P) -> out[c] for the kColX columns from col0: the sum over (n, p) of
/// part[(n * Cc + c) * P + p], in a fixed order (lane ty folds k = n * P + p = ty, ty + kColY, ...
/// in four running sums, then a shared-memory tree over the kColY lanes), rounded once. Run by
/// kColX * kColY / kPer threads, each taking kPer lanes: the same sums and tree, so the same bits,
/// for every kPer; red's shape is the block's (RowsFold, GroupFold). Every thread of the block must
/// call it. kL2: partials written in this launch (ld_part). kBatch (col_reduce_kernel on group
/// norm's partials, P > 1): a lane first takes batches of 64 bytes, each loaded ahead of the adds
/// of the one before, its (n, p) stepped without a division: the same adds in the same order
/// (term i into sum i % 4). Run 79: that fold 11.3 -> 6.5 us, bf16 (16, 32, 256, 256)/8, where one
/// load at a time was in flight (a 64-bit division before each). Not for the rows (P = 1: 7.1-7.3
/// us, 0.4 us gained under ncu, forward+backward 1-2 % slower with twice the registers) nor the
/// grid kernel's fold (kPer 2: 82 -> 122 registers, the small group norm 13.6 % slower).
template <int kPer, bool kL2, bool kBatch = false, class C, class O, int kColY, int kColX>
__device__ __forceinline__ void col_fold(const C* part, O* __restrict__ out, int64_t Nn,
                                         int64_t Cc, int64_t P, int64_t col0,
                                         C (&red)[kColY][kColX]) {
  constexpr int kLanes = kColY / kPer;  // threads per column
  const int tx = static_cast<int>(threadIdx.x) % kColX, t0 = static_cast<int>(threadIdx.x) / kColX;
  const int64_t col = col0 + tx;
  const int64_t K = Nn * P;
  auto at = [&](int64_t k) {
    if (P == 1) return ld_part<kL2>(part + k * Cc + col);
    const int64_t n = k / P;
    return ld_part<kL2>(part + (n * Cc + col) * P + (k - n * P));
  };
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int ty = t0 + j * kLanes;
    C s0 = C(0), s1 = C(0), s2 = C(0), s3 = C(0);
    if (col < Cc) {
      int64_t k = ty;
      if constexpr (kBatch) {
        constexpr int kLoads = 64 / static_cast<int>(sizeof(C));  // a multiple of four
        if (P > 1 && k + (kLoads - 1) * kColY < K) {
          const int64_t dn = kColY / P, dp = kColY - dn * P;
          int64_t n = k / P, p = k - n * P;
          auto load_batch = [&](C (&v)[kLoads]) {
#pragma unroll
            for (int i = 0; i < kLoads; ++i) {
              v[i] = ld_part<kL2>(part + (n * Cc + col) * P + p);
              n += dn;
              p += dp;
              if (p >= P) {
                p -= P;
                ++n;
              }
            }
          };
          auto add_batch = [&](const C (&v)[kLoads]) {
#pragma unroll
            for (int i = 0; i < kLoads; i += 4) {
              s0 += v[i];
              s1 += v[i + 1];
              s2 += v[i + 2];
              s3 += v[i + 3];
            }
          };
          C v[kLoads], w[kLoads];
          load_batch(v);
          for (k += kLoads * kColY; k + (kLoads - 1) * kColY < K; k += kLoads * kColY) {
            load_batch(w);
            add_batch(v);
#pragma unroll
            for (int i = 0; i < kLoads; ++i) v[i] = w[i];
          }
          add_batch(v);
        }
      }
      for (; k + 3 * kColY < K; k += 4 * kColY) {
        s0 += at(k);
        s1 += at(k + kColY);
        s2 += at(k + 2 * kColY);
        s3 += at(k + 3 * kColY);
      }
      for (; k < K; k += kColY) s0 += at(k);
    }
    red[ty][tx] = (s0 + s1) + (s2 + s3);
  }
  __syncthreads();
  for (int h = kColY / 2; h > 0; h >>= 1) {
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int ty = t0 + j * kLanes;
      if (ty < h) red[ty][tx] += red[ty + h][tx];
    }
    __syncthreads();
  }
  if (t0 == 0 && col < Cc) out[col] = round_to<O>(red[0][tx]);
}

/// dw and db from their partials: block (x, y) folds columns x * F::kX on of dw (y = 0, when pw)
/// or db (col_fold, one lane a thread; kBatch: its batches).
template <class C, class OW, class OB, bool kBatch, class F>
__global__ void __launch_bounds__(F::kX * F::kY)
    col_reduce_kernel(const C* __restrict__ pw, OW* __restrict__ ow, const C* __restrict__ pb,
                      OB* __restrict__ ob, int64_t Nn, int64_t Cc, int64_t P) {
  pdl_begin();  // launched as a programmatic dependent launch
  __shared__ C red[F::kY][F::kX];
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * F::kX;
  if (pw != nullptr && blockIdx.y == 0) col_fold<1, false, kBatch>(pw, ow, Nn, Cc, P, col0, red);
  else col_fold<1, false, kBatch>(pb, ob, Nn, Cc, P, col0, red);
}

// ---- host side -------------------------------------------------------------------------------

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

/// Piece `item` = (n * C + ch) * P + p of the group norm backward's whole pieces (kBlock *
/// kFwdVecs * V elements, S a multiple of that): its channel run nc = n * C + ch, channel ch,
/// row (n, group) and first element lo within the run.
struct GnPiece {
  int64_t nc, ch, row, lo;
};
template <class T>
__device__ __forceinline__ GnPiece gn_piece(int64_t item, int64_t Cn, int64_t G, int64_t Cg,
                                            int64_t P) {
  constexpr int64_t ps = static_cast<int64_t>(kBlock) * kFwdVecs<T> * kV<T>;
  const int64_t nc = item / P, p = item - nc * P;
  const int64_t n = nc / Cn, ch = nc - n * Cn;
  return {nc, ch, n * G + ch / Cg, p * ps};
}

/// gn_bwd_sums_kernel's sums of a whole piece held by the block (u, q, dy) -> pu, pq, pdy (or
/// null) [item].
template <class T>
__device__ __forceinline__ void gn_piece_sums(const compute_t<T> (&xv)[kFwdVecs<T>][kV<T>],
                                              const compute_t<T> (&gv)[kFwdVecs<T>][kV<T>],
                                              compute_t<T> mu, compute_t<T> rho,
                                              compute_t<T>* red, int64_t item, compute_t<T>* pu,
                                              compute_t<T>* pq, compute_t<T>* pdy) {
  using C = compute_t<T>;
  C s[3] = {C(0), C(0), C(0)};
#pragma unroll
  for (int k = 0; k < kFwdVecs<T>; ++k) gn_sums_vec<true, T>(xv[k], gv[k], kV<T>, mu, rho, s);
  group_sum(s, kBlock, red);
  if (threadIdx.x == 0) {
    pu[item] = s[0];
    pq[item] = s[1];
    if (pdy) pdy[item] = s[2];
  }
}

/// The group norm backward in one cooperative launch, where every channel run is P whole
/// pieces of kBlock * kFwdVecs * V elements (S a multiple of that), a row has at most
/// kInlineMerge pieces and the device holds every block: block item = (n * C + ch) * P + p
/// takes gn_bwd_sums_kernel's piece (kBlock threads), waits on the whole grid, then takes
/// gn_bwd_dx_kernel's row sums and the dx of the same elements, still in registers, and the
/// first blocks fold dw and db (dw, db null: col_reduce_kernel does, after). The same
/// operations as those kernels (the same bits); x and dy read once (3 n s bytes, where the two
/// move 5 n s), one launch instead of three: the small (1, 16, 256, 256)/4 is 256 blocks.
template <class T>
__global__ void __launch_bounds__(kBlock, 2)
    gn_bwd_grid_kernel(const T* __restrict__ x, const T* __restrict__ w,
                       const compute_t<T>* __restrict__ mean,
                       const compute_t<T>* __restrict__ rstd, const T* __restrict__ dy,
                       compute_t<T>* pu, compute_t<T>* pq, compute_t<T>* pdy, T* __restrict__ dx,
                       T* __restrict__ dw, T* __restrict__ db, int64_t N, int64_t Cn, int64_t S,
                       int64_t G, int64_t Cg, int64_t P, compute_t<T> inv_m, bool vec) {
  using C = compute_t<T>;
  constexpr int V = kV<T>, NU = kFwdVecs<T>;
  constexpr int64_t ps = static_cast<int64_t>(kBlock) * NU * V;
  __shared__ C red[kBlock / 32 * 3];
  const int64_t item = blockIdx.x;
  const GnPiece pc = gn_piece<T>(item, Cn, G, Cg, P);
  const int64_t row = pc.row, lo = pc.lo, hi = lo + ps;
  const T* xc = x + pc.nc * S;
  const T* gc = dy + pc.nc * S;
  const C mu = mean[row], rho = rstd[row];
  C xv[NU][V], gv[NU][V];
#pragma unroll
  for (int k = 0; k < NU; ++k) {
    const int64_t i = lo + (static_cast<int64_t>(k) * kBlock + threadIdx.x) * V;
    load_vec(xc, i, hi, vec, xv[k]);
    load_vec(gc, i, hi, vec, gv[k]);
  }
  gn_piece_sums<T>(xv, gv, mu, rho, red, item, pu, pq, pdy);
  cooperative_groups::this_grid().sync();  // every piece's sums written and visible
  const int64_t ch0 = (row % G) * Cg;
  __shared__ C rsum[2];
  C r[2] = {C(0), C(0)};  // warp 0 folds the row's sums, as gn_bwd_dx_kernel's teams
  gn_team_sums<T, true>(r, threadIdx.x < 32, static_cast<int>(threadIdx.x), pu, pq, row, Cg, P, w,
                        ch0, rsum);
  const C kk = rho * rho * r[1] * inv_m;
  const C cc = r[0] * inv_m;
  const C wc = w ? load_c(w[pc.ch]) : C(1);
#pragma unroll
  for (int k = 0; k < NU; ++k) {
    const int64_t i = lo + (static_cast<int64_t>(k) * kBlock + threadIdx.x) * V;
    C o[V];
    gn_dx_vec<T>(xv[k], gv[k], mu, rho, kk, cc, wc, w != nullptr, o);
    store_vec(dx + pc.nc * S, i, hi, vec, o);
  }
  // dw (from pq) and db (from pdy), each column block as col_reduce_kernel's (the same bits),
  // by the first blocks: no launch of their own. Every sum they read was written before the
  // barrier above.
  using F = GroupFold;
  __shared__ C cred[F::kY][F::kX];
  const int64_t ncol = ceil_div(Cn, F::kX);
  const int64_t nw = dw ? ncol : 0, nfold = nw + (db ? ncol : 0);
  for (int64_t f = blockIdx.x; f < nfold; f += gridDim.x) {  // uniform in the block
    if (f < nw) col_fold<F::kX * F::kY / kBlock, true>(pq, dw, N, Cn, P, f * F::kX, cred);
    else col_fold<F::kX * F::kY / kBlock, true>(pdy, db, N, Cn, P, (f - nw) * F::kX, cred);
    __syncthreads();  // cred is read to the end before a further column block reuses it
  }
}

/// gn_bwd_pipe_kernel's blocks an SM: as many as its shared memory holds (the half types' two
/// vectors a thread: three), bounding the registers to that. Unbound, the dx kernels took 93
/// (bf16) and 125 (f16) registers: two blocks an SM (run 57: bf16 (16, 512, 64, 64)/32
/// forward+backward 207.9 -> 186.2 us on an H200, with the forward cluster kernel's bound).
template <class T>
inline constexpr int kGnPipeMinBlocks =
    smem_blocks(static_cast<size_t>(kBwdStages) * bwd_pipe_slots<kFwdVecs<T>> * kBlock * 16);

/// The group norm backward's two kernels where every channel run is whole pieces of kBlock *
/// kFwdVecs * V elements (S a multiple of that) and x, dy, dx are 16-byte aligned, but too many
/// for one cooperative launch: a persistent grid over the pieces, item = (n * C + ch) * P + p,
/// each thread's vectors of the piece's x and dy and the group's mean and rstd copied
/// kBwdStages - 1 items ahead into its own shared-memory slots (pipelined_rows). kDx false:
/// gn_bwd_sums_kernel's sums of the piece; true: gn_bwd_dx_kernel's dx of it (a row's chunks
/// are its channels' pieces in order, the same items), its row sums from pre, or folded by
/// warp 0 and shared. The same operations, so the same bits, as those kernels, whose one-shot
/// blocks kept little in flight: (16, 32, 256, 256)/8 bf16 at 53 % (sums) and 60 % (dx) of
/// DRAM peak in run 38's ncu.
template <class T, bool kDx>
__global__ void __launch_bounds__(kBlock, kGnPipeMinBlocks<T>)
    gn_bwd_pipe_kernel(const T* __restrict__ x, const T* __restrict__ w,
                       const compute_t<T>* __restrict__ mean,
                       const compute_t<T>* __restrict__ rstd, const T* __restrict__ dy,
                       compute_t<T>* __restrict__ pu, compute_t<T>* __restrict__ pq,
                       compute_t<T>* __restrict__ pdy, const compute_t<T>* __restrict__ pre,
                       T* __restrict__ dx, int64_t items, int64_t Cn, int64_t S, int64_t G,
                       int64_t Cg, int64_t P, compute_t<T> inv_m) {
  using C = compute_t<T>;
  constexpr int V = kV<T>, NU = kFwdVecs<T>, B = kBlock;
  extern __shared__ uint4 gn_slots[];
  __shared__ C red[kBlock / 32 * 3];
  __shared__ C team[2][2];  // the row sums, per item parity
  const int t = static_cast<int>(threadIdx.x);
  const int64_t first = blockIdx.x, stride = gridDim.x;
  pipelined_rows<kBwdStages>(
      first, stride, items, gn_slots, bwd_pipe_slots<NU> * B,
      [&](uint4* stage, int64_t item) {
        if (item >= items) return;
        const GnPiece pc = gn_piece<T>(item, Cn, G, Cg, P);
        const int64_t base = pc.nc * S + pc.lo;
#pragma unroll
        for (int k = 0; k < NU; ++k) {
          const int64_t i = base + (static_cast<int64_t>(k) * B + t) * V;
          cp_async<16>(&stage[k * B + t], x + i);
          cp_async<16>(&stage[(NU + k) * B + t], dy + i);
        }
        stat_copy<Kind::kGroup>(stage, 2 * NU, B, 32, mean, rstd, pc.row);
      },
      [&](const uint4* stage, int64_t item) {
        const GnPiece pc = gn_piece<T>(item, Cn, G, Cg, P);
        const int64_t row = pc.row;
        C xv[NU][V], gv[NU][V];
#pragma unroll
        for (int k = 0; k < NU; ++k) {
          widen16<T>(stage[k * B + t], xv[k]);
          widen16<T>(stage[(NU + k) * B + t], gv[k]);
        }
        const C mu = stat_get<C>(stage, 2 * NU, B, 0, 32, true);
        const C rho = stat_get<C>(stage, 2 * NU, B, 1, 32, true);
        if constexpr (!kDx) {
          gn_piece_sums<T>(xv, gv, mu, rho, red, item, pu, pq, pdy);
        } else {
          C r[2] = {C(0), C(0)};
          if (pre) {  // uniform
            r[0] = pre[row * 2];
            r[1] = pre[row * 2 + 1];
          } else {
            // As gn_bwd_dx_kernel's teams: warp 0 folds, the block reads its sums. A parity's
            // slots are written again two items on, after the next item's barrier.
            const int par = static_cast<int>(((item - first) / stride) & 1);
            gn_team_sums<T, false>(r, t < 32, t, pu, pq, row, Cg, P, w, (row % G) * Cg,
                                   team[par]);
          }
          const C kk = rho * rho * r[1] * inv_m;
          const C cc = r[0] * inv_m;
          const C wc = w ? load_c(w[pc.ch]) : C(1);
          const int64_t base = pc.nc * S + pc.lo;
#pragma unroll
          for (int k = 0; k < NU; ++k) {
            C o[V];
            gn_dx_vec<T>(xv[k], gv[k], mu, rho, kk, cc, wc, w != nullptr, o);
            store16<true, true>(dx + base + (static_cast<int64_t>(k) * B + t) * V, o);
          }
        }
      });
}

/// Pieces of a group norm row (one row a cluster, at most this many pieces in all): the
/// cluster's blocks' sums of u and q, gathered in every block (gn_bwd_cluster_kernel).
constexpr int kGnClusterPieces = 64;
/// gn_bwd_cluster_kernel keeps the first kGnRegVecs of a thread's vectors of x and of dy in
/// registers, the rest in shared memory (kGnHeldBytesOf a block): two 512-thread blocks an SM
/// (four of 256), where the slices of x and dy in shared memory alone left room for one (three):
/// 256 KB of rows on chip, not 128 KB (192). bf16 (16, 32, 256, 256)/8's backward, 512-thread
/// blocks in clusters of 8 holding a group, then takes 4 waves where it took 8 (H100, run 13:
/// its forward+backward at 58 % of the copy).
template <int B> inline constexpr int kGnRegVecs = B == 512 ? 1 : 2;
template <int B>
inline constexpr int64_t kGnHeldBytesOf = 2 * int64_t{B} * (kSliceVecs - kGnRegVecs<B>) * 16;
/// gn_bwd_cluster_kernel's blocks an SM: as many as its slices of x and dy leave room for.
template <int B> inline constexpr int kGnClusterMinBlocks = smem_blocks(kGnHeldBytesOf<B>);

/// The group norm backward in one pass, where a cluster of cs blocks of B threads holds a row (its
/// Cg channel runs of S) on chip (kGnRegVecs vectors a thread in registers, the rest in shared
/// memory), block r the r-th slice of B kSliceVecs vectors of x and of dy. A slice is either a
/// piece of one channel run (m = 1: P pieces a run, S a multiple of the slice) or m whole runs (P =
/// 1, the slice m runs, m a power of two dividing Cg), taken by m aligned groups of tpr = B / m
/// threads. Each group's piece k = r m + c (channel ch0 + k / P) gives its sums of u, q and dy
/// (gn_sums_vec, group_sum in the group) to the dw/db partials at ((n C + ch) P + k % P) and its
/// (sum u, sum q) to every block of the cluster (distributed shared memory); each block then folds
/// the row's Cg P pieces in order, weighted by their channels' w (row_sums' operations: the same in
/// every block), and writes dx from the slices it holds. x and dy are read once, where the two-pass
/// kernels read them twice (run 78: gn_bwd_pipe_kernel's sums 48.8 us, then dx 88.4, bf16 (16, 32,
/// 256, 256)/8).
template <class T, int B>
__global__ void __launch_bounds__(B, kGnClusterMinBlocks<B>)
    gn_bwd_cluster_kernel(const T* __restrict__ x, const T* __restrict__ w,
                          const compute_t<T>* __restrict__ mean,
                          const compute_t<T>* __restrict__ rstd, const T* __restrict__ dy,
                          compute_t<T>* __restrict__ pq, compute_t<T>* __restrict__ pdy,
                          T* __restrict__ dx, int64_t L, int64_t G, int64_t Cg, int64_t Cn,
                          int64_t P, int m_log2, compute_t<T> inv_m) {
  namespace cg = cooperative_groups;
  using C = compute_t<T>;
  static_assert(B == 256 || B == 512);
  constexpr int V = kV<T>, U = kSliceVecs, kN = B * U;  // vectors of x (and of dy) a block
  // A thread's vectors u < UR of x and dy in registers (kx, kg), the others in its own slots
  // held[(u - UR) B + t] (x) and held[kNs + (u - UR) B + t] (dy).
  constexpr int UR = kGnRegVecs<B>, kNs = B * (U - UR);
  constexpr int kLog2B = B == 256 ? 8 : 9;
  extern __shared__ uint4 held[];  // x's and dy's vectors past the registers', raw
  __shared__ C red[B / 32 * 3];
  __shared__ C slots[2 * kGnClusterPieces];  // the row's pieces' (sum u, sum q), in order
  cg::cluster_group cl = cg::this_cluster();
  const int cs = static_cast<int>(cl.num_blocks()), r = static_cast<int>(cl.block_rank());
  const int64_t row = blockIdx.x / cs, ch0 = (row % G) * Cg;
  const int t = static_cast<int>(threadIdx.x), m = 1 << m_log2, tpr = B >> m_log2;
  const int c = t >> (kLog2B - m_log2), lane = t & (tpr - 1);  // this thread's group, lane
  const int64_t k = static_cast<int64_t>(r) * m + c;           // its piece of the row
  const int64_t ch = ch0 + k / P;
  const int64_t item = ((row / G) * Cn + ch) * P + k % P;
  // The group's part of the slice: kN / m vectors from h0, its thread's vectors lane + u tpr.
  const int h0 = c * (kN >> m_log2);
  const int64_t off = row * (L / V) + static_cast<int64_t>(r) * kN + h0;
  const uint4* xr = reinterpret_cast<const uint4*>(x) + off;
  const uint4* gr = reinterpret_cast<const uint4*>(dy) + off;
  uint4 kx[UR], kg[UR];
#pragma unroll
  for (int u = 0; u < U; ++u) {  // every vector in flight at once
    const int i = lane + u * tpr;
    if (u < UR) {
      kx[u] = __ldcs(xr + i);  // read once: evict-first
      kg[u] = __ldcs(gr + i);
    } else {
      cp_async<16>(&held[(u - UR) * B + t], xr + i);
      cp_async<16>(&held[kNs + (u - UR) * B + t], gr + i);
    }
  }
  cp_async_commit();
  // Vector u of x and of dy of this thread.
  auto get = [&](int u, C (&xv)[V], C (&gv)[V]) {
    if (u < UR) {
      widen16<T>(kx[u], xv);
      widen16<T>(kg[u], gv);
    } else {
      widen16<T>(held[(u - UR) * B + t], xv);
      widen16<T>(held[kNs + (u - UR) * B + t], gv);
    }
  };
  // Every block of the cluster must have started before another writes into its shared memory
  // (run 81's racecheck: "a block that might not have entered yet"): arrive now, wait before
  // the writes, so that the loads hide the wait.
  cl.barrier_arrive();
  const C mu = mean[row], rho = rstd[row];
  const C wc = w ? load_c(w[ch]) : C(1);
  cp_async_wait<0>();  // a thread reads only the slots it copied
  C s[3] = {C(0), C(0), C(0)};
#pragma unroll
  for (int u = 0; u < U; ++u) {
    C xv[V], gv[V];
    get(u, xv, gv);
    gn_sums_vec<true, T>(xv, gv, V, mu, rho, s);
  }
  group_sum(s, tpr, red);
  cl.barrier_wait();
  if (lane == 0) {
    pq[item] = s[1];
    if (pdy) pdy[item] = s[2];
    for (int b = 0; b < cs; ++b) {  // piece k's sums into every block's slots
      C* dst = cl.map_shared_rank(slots + 2 * k, b);
      dst[0] = s[0];
      dst[1] = s[1];
    }
  }
  cl.sync();  // release / acquire: every piece's sums are in every block's slots
  C a = C(0), q = C(0);
  const int64_t np = static_cast<int64_t>(cs) * m;
  for (int64_t i = 0; i < np; ++i) {
    const C wk = w ? load_c(w[ch0 + i / P]) : C(1);
    a = fma(wk, slots[2 * i], a);
    q = fma(wk, slots[2 * i + 1], q);
  }
  // (no barrier before leaving: after cl.sync no block touches another's shared memory)
  const C kk = rho * rho * q * inv_m;
  const C cc = a * inv_m;
  uint4* dr = reinterpret_cast<uint4*>(dx) + off;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int i = lane + u * tpr;
    C xv[V], gv[V], o[V];
    get(u, xv, gv);
    gn_dx_vec<T>(xv, gv, mu, rho, kk, cc, wc, w != nullptr, o);
    store16<true, true>(reinterpret_cast<T*>(dr + i), o);
  }
}

/// A scratch tensor of n compute-type values on `like`'s device (returned to the allocator's
/// cache when `holder` goes; later work on the same stream is ordered after this use).
template <class C> C* scratch(Tensor& holder, int64_t n, const Tensor& like) {
  holder = Tensor::empty(Shape({static_cast<size_t>(n)}), dtype_of_v<C>, like.device());
  return ptr<C>(holder);
}

unsigned grid1(const char* name, int64_t blocks) {
  TAPER_CHECK(blocks <= std::numeric_limits<int32_t>::max(), name, ": too many blocks (", blocks,
              ")");
  return static_cast<unsigned>(blocks);
}

/// Blocks of kBlock threads (no dynamic shared memory) of `kernel` a cooperative launch may
/// have on `like`'s device: all it holds at once, or 0 where the device cannot launch so.
int cooperative_blocks(const void* kernel, const Tensor& like) {
  const int ordinal = like.device().ordinal();
  if (!device_props(ordinal).cooperativeLaunch) return 0;
  return resident_blocks(kernel, kBlock, 0, 1, ordinal);
}

/// Smallest l with (per << l) >= n (n >= 1).
int log2_for(int64_t n, int64_t per) {
  int l = 0;
  while ((per << l) < n) ++l;
  return l;
}

/// Calls f(std::integral_constant<int, NV>) with NV in {1, 2, 4, 8}, the smallest >= nv (<=
/// max).
template <int kMax, class F> void with_vecs(int64_t nv, F&& f) {
  if (nv <= 1) f(std::integral_constant<int, 1>{});
  else if (nv <= 2 || kMax < 4) f(std::integral_constant<int, (kMax < 2 ? kMax : 2)>{});
  else if (nv <= 4 || kMax < 8) f(std::integral_constant<int, (kMax < 4 ? kMax : 4)>{});
  else f(std::integral_constant<int, (kMax < 8 ? kMax : 8)>{});
}

}  // namespace

/// One norm call, host side: pointers are element 0 of contiguous tensors (null where absent).
struct norm_part::Job {
  const char* name = nullptr;
  const std::vector<Tensor>* in = nullptr;
  cudaStream_t st = nullptr;
  int64_t R = 0, L = 0;        ///< rows and their length
  int64_t N = 0, Cn = 0, S = 1, G = 1, Cg = 1;  ///< group norm
  double eps = 0;
  const void *x = nullptr, *w = nullptr, *b = nullptr, *dy = nullptr;
  void *y = nullptr, *mean = nullptr, *rstd = nullptr;  ///< forward out; backward: mean/rstd in
  Tensor dw, db;  ///< backward outputs (undefined when not needed)
};

namespace {
using norm_part::Job;

/// The most blocks per cluster (a power of two <= kMaxCluster) fwd_cluster_kernel<T, K, B> runs
/// with on device `ordinal` (0: none): a cluster of that size resident with a full slice (its
/// shared memory limit raised to kSliceBytesOf<B> there).
template <class T, Kind K, int B> int cluster_limit(int ordinal) {
  const void* kernel = reinterpret_cast<const void*>(&fwd_cluster_kernel<T, K, B>);
  for (int cs = kMaxCluster; cs >= 2; cs /= 2)
    if (resident_blocks(kernel, B, static_cast<size_t>(kSliceBytesOf<B>), cs, ordinal) > 0)
      return cs;
  return 0;
}

/// Vectors per thread of fwd_rows_kernel at most. The half types' rms rows take 32 values per
/// thread (H200, bf16 16384x1024: 28.1 -> 24.9 us); their group rows keep 16, which hold their
/// registers to 57, and so do their unaligned layer rows (32 values took 86, two blocks per SM,
/// and 36.1 -> 47.8 us). Their aligned layer rows (the kAl path) take 32 in 64 registers
/// (H100, bf16 16384x1024: 28.4 -> 24.4 us, 77 -> 90 % of the copy, run 41).
template <class T, Kind K> constexpr int row_vecs() {
  return K != Kind::kGroup ? kRowVecs<T> : kFwdVecs<T>;
}

template <class T, Kind K> void run_fwd(const Job& j) {
  using C = compute_t<T>;
  constexpr int V = kV<T>, NVmax = row_vecs<T, K>();
  const T* x = static_cast<const T*>(j.x);
  const T* w = static_cast<const T*>(j.w);
  const T* b = static_cast<const T*>(j.b);
  T* y = static_cast<T*>(j.y);
  C* mean = static_cast<C*>(j.mean);
  C* rstd = static_cast<C*>(j.rstd);
  const C eps = static_cast<C>(j.eps);
  const bool vec = aligned16(x) && aligned16(y) && j.L % V == 0 &&
                   (K == Kind::kGroup || ((!w || aligned16(w)) && (!b || aligned16(b))));
  const int64_t nv = ceil_div(j.L, V);
  const int tl = log2_for(nv, K == Kind::kLayer && !vec ? kFwdVecs<T> : NVmax);
  const int64_t row_bytes = j.L * static_cast<int64_t>(sizeof(T));
  // The half types' aligned rms/layer rows that a block of kMaxRowThreads holds (32 values a
  // thread) are read once by the row kernels, where the loop reads each row from L2 again.
  const bool held = K != Kind::kGroup && is_half_v<T> && vec &&
                    (int64_t{1} << tl) <= kMaxRowThreads<T>;
  if (vec && !held && (int64_t{1} << tl) > kBlock && j.R >= kMinRowBlocks &&
      row_bytes <= kLoopMaxBytes) {
    fwd_loop_kernel<T, K><<<grid1(j.name, j.R), kBlock, 0, j.st>>>(x, w, b, y, mean, rstd, j.L,
                                                                    j.S, j.G, j.Cg, eps);
    TAPER_CUDA_CHECK_LAUNCH(j.name, *j.in);
    return;
  }
  constexpr int64_t kSlice = kSliceBytesOf<kClusterThreads>;  // the larger blocks' slice
  if (vec && row_bytes > kSlice && row_bytes <= kMaxCluster * kSlice) {
    // Blocks of 256 threads (32 KB slices) where a cluster of kMaxCluster holds the row, else 512.
    auto clustered = [&](auto bc) {
      constexpr int B = decltype(bc)::value;
      int cs = 2;
      while (cs * kSliceBytesOf<B> < row_bytes) cs *= 2;
      if (cs > kMaxCluster || j.R * cs < kMinClusterBlocks ||
          cs > cluster_limit<T, K, B>((*j.in)[0].device().ordinal()))
        return false;
      const int64_t slice = ceil_div(ceil_div(j.L, V), cs);  // vectors per block
      launch_clustered(j.name, *j.in, &fwd_cluster_kernel<T, K, B>, grid1(j.name, j.R * cs), B,
                       cs, static_cast<size_t>(slice) * 16, j.st, x, w, b, y, mean, rstd, j.L,
                       j.S, j.G, j.Cg, eps, slice);
      return true;
    };
    if (clustered(std::integral_constant<int, kClusterThreads / 2>{}) ||
        clustered(std::integral_constant<int, kClusterThreads>{}))
      return;
  }
  bool rows = (int64_t{1} << tl) <= kMaxRowThreads<T>;
  if (rows) {
    const int tpr = 1 << tl;
    const int threads = std::max(kBlock, tpr);
    const int64_t blocks = ceil_div(j.R, threads / tpr);
    if (blocks < kMinRowBlocks && j.L >= kSplitMinLen) rows = false;
    if (rows) {
      with_vecs<NVmax>(ceil_div(nv, tpr), [&](auto nvc) {
        constexpr int NV = decltype(nvc)::value;
        // The aligned rms and layer rows take fwd_row's kAl path.
        auto run = [&](auto al) {
          constexpr bool kAl = decltype(al)::value;
          if constexpr (kPipeRows<T, K>) {
            if (vec && pipe_rows<T, K>(tpr)) {
              auto* kernel = &fwd_rows_kernel<T, K, NV, true, kAl>;
              const size_t smem = static_cast<size_t>(kFwdStages) * NV * threads * 16;
              const int resident = resident_blocks(reinterpret_cast<const void*>(kernel), threads,
                                                   smem, 1, (*j.in)[0].device().ordinal());
              if (resident > 0) {
                launch_clustered<true>(j.name, *j.in, kernel,
                                       grid1(j.name, std::min<int64_t>(blocks, resident)),
                                       threads, 1, smem, j.st, x, w, b, y, mean, rstd, j.R, j.L,
                                       tl, j.S, j.G, j.Cg, eps, vec);
                return;
              }
            }
          }
          auto* kernel = &fwd_rows_kernel<T, K, NV, false, kAl>;
          if constexpr (kAl)
            if (tl == 5) kernel = &fwd_rows_kernel<T, K, NV, false, kAl, true>;
          launch_clustered<true>(j.name, *j.in, kernel, grid1(j.name, blocks), threads, 1, 0,
                                 j.st, x, w, b, y, mean, rstd, j.R, j.L, tl, j.S, j.G, j.Cg, eps,
                                 vec);
        };
        if constexpr (K != Kind::kGroup) {
          if (vec) {
            run(std::true_type{});
            return;
          }
        }
        run(std::false_type{});
      });
      return;
    }
  }
  constexpr int64_t cs = static_cast<int64_t>(kBlock) * kFwdVecs<T> * V;
  const int64_t nch = ceil_div(j.L, cs);
  const int64_t items = j.R * nch;
  Tensor hm, hm2;
  C* pm = K == Kind::kRms ? nullptr : scratch<C>(hm, items, (*j.in)[0]);
  C* pm2 = scratch<C>(hm2, items, (*j.in)[0]);
  const unsigned grid = grid1(j.name, items);
  if (nch <= kInlineMerge) {  // one cooperative launch, where the device holds every block
    auto* kernel = &fwd_chunk_grid_kernel<T, K>;
    if (items <= cooperative_blocks(reinterpret_cast<const void*>(kernel), (*j.in)[0])) {
      launch_cooperative(j.name, *j.in, kernel, grid, kBlock, j.st, x, w, b, y, mean, rstd, pm,
                         pm2, j.L, nch, j.S, j.G, j.Cg, eps, vec);
      return;
    }
  }
  fwd_chunk_stats_kernel<T, K><<<grid, kBlock, 0, j.st>>>(x, j.L, nch, vec, pm, pm2);
  TAPER_CUDA_CHECK_LAUNCH(j.name, *j.in);
  const bool merge = nch > kInlineMerge;  // else each write block merges its row's few chunks
  if (merge) {
    fwd_merge_kernel<C, K><<<grid1(j.name, j.R), kBlock, 0, j.st>>>(pm, pm2, mean, rstd, j.L,
                                                                    nch, cs, eps);
    TAPER_CUDA_CHECK_LAUNCH(j.name, *j.in);
  }
  fwd_chunk_write_kernel<T, K><<<grid, kBlock, 0, j.st>>>(
      x, w, b, y, mean, rstd, merge ? nullptr : pm, merge ? nullptr : pm2, j.L, nch, j.S, j.G,
      j.Cg, eps, vec);
  TAPER_CUDA_CHECK_LAUNCH(j.name, *j.in);
}

/// dw, db from their partials (Nn, Cc, P) (null: not wanted).
template <class C, class OW, class F>
void fold_partials(const Job& j, const C* pw, const C* pb, int64_t Nn, int64_t Cc, int64_t P) {
  if (!pw && !pb) return;
  const dim3 grid(grid1(j.name, ceil_div(Cc, F::kX)), (pw ? 1u : 0u) + (pb ? 1u : 0u));
  OW* ow = pw ? ptr<OW>(j.dw) : nullptr;
  auto launch = [&](auto btag) {
    using OB = decltype(btag);
    OB* ob = pb ? ptr<OB>(j.db) : nullptr;
    // The batches for group norm's pieces (P > 1) only: the rows' partials are whole rows.
    auto* kernel = &col_reduce_kernel<C, OW, OB, false, F>;
    if constexpr (std::is_same_v<F, GroupFold>)
      if (P > 1) kernel = &col_reduce_kernel<C, OW, OB, true, F>;
    launch_grid<true>(j.name, *j.in, kernel, grid, F::kX * F::kY, 1, 0, j.st, pw, ow, pb, ob,
                      Nn, Cc, P);
  };
  if (!pb) {
    launch(OW{});
    return;
  }
  visit_dtype(j.db.dtype(), [&](auto tag) {
    using OB = decltype(tag);
    if constexpr (std::is_same_v<OB, bf16> || std::is_same_v<OB, f16> ||
                  std::is_same_v<OB, float> || std::is_same_v<OB, double>)
      launch(OB{});
  });
}

template <class T, Kind K> void run_bwd_rows(const Job& j) {
  using C = compute_t<T>;
  constexpr int V = kV<T>, NVmax = kBwdVecs<T>;
  const T* x = static_cast<const T*>(j.x);
  const T* w = static_cast<const T*>(j.w);
  const T* dy = static_cast<const T*>(j.dy);
  T* dx = static_cast<T*>(j.y);
  const C* mean = static_cast<const C*>(j.mean);
  const C* rstd = static_cast<const C*>(j.rstd);
  const Tensor& like = (*j.in)[0];
  const C inv_d = static_cast<C>(1.0 / static_cast<double>(j.L));
  const bool vec = aligned16(x) && aligned16(dy) && aligned16(dx) && (!w || aligned16(w)) &&
                   j.L % V == 0;
  const bool need_w = j.dw.defined(), need_b = j.db.defined();
  const int64_t nv = ceil_div(j.L, V);
  const int tl = log2_for(nv, NVmax);
  bool rows = (int64_t{1} << tl) <= kBwdMaxThreads;
  if (rows) {
    const int tpr = 1 << tl;
    const int threads = std::max(kBlock, tpr);
    const int gpb = threads / tpr;
    const int64_t row_blocks = ceil_div(j.R, gpb);
    if (row_blocks < kMinRowBlocks && j.L >= kSplitMinLen) rows = false;
    if (rows) {
      const int64_t P = std::min(row_blocks, kBwdMaxBlocks);
      Tensor hw, hb;
      C* pdw = need_w ? scratch<C>(hw, P * j.L, like) : nullptr;
      C* pdb = need_b ? scratch<C>(hb, P * j.L, like) : nullptr;
      with_vecs<NVmax>(ceil_div(nv, tpr), [&](auto nvc) {
        constexpr int NV = decltype(nvc)::value;
        const size_t smem = bwd_cols_bytes<T, NV>(threads, need_w || need_b);
        if constexpr (kBwdPipeRows<T>) {
          if (vec) {
            auto* kernel = &bwd_rows_kernel<T, K, NV, true>;
            const size_t all = smem +
                               static_cast<size_t>(kBwdStages) * bwd_pipe_slots<NV> * threads * 16 +
                               (w ? static_cast<size_t>(j.L) * sizeof(T) : 0);  // w's copy
            if (resident_blocks(reinterpret_cast<const void*>(kernel), threads, all, 1,
                                like.device().ordinal()) > 0) {
              launch_clustered<true>(j.name, *j.in, kernel, static_cast<unsigned>(P), threads, 1,
                                     all, j.st, x, w, mean, rstd, dy, dx, pdw, pdb, j.R, j.L, tl,
                                     inv_d, vec);
              return;
            }
          }
        }
        launch_clustered<true>(j.name, *j.in, &bwd_rows_kernel<T, K, NV, false>,
                               static_cast<unsigned>(P), threads, 1, smem, j.st, x, w, mean, rstd,
                               dy, dx, pdw, pdb, j.R, j.L, tl, inv_d, vec);
      });
      fold_partials<C, T, RowsFold>(j, pdw, pdb, P, j.L, 1);
      return;
    }
  }
  // The long aligned rows (kBwdLongVecs), where the device holds a block (a cluster) with its
  // shared memory: pipelined where it holds their stages (kBwdLongPipe; f32 rows past that in
  // clusters of two, kBwdLongCluster, where they split into whole vectors), else not.
  if constexpr (kBwdLongVecs<T> > NVmax) {
    const int64_t tn = kBwdMaxThreads;
    if (vec && nv <= tn * kBwdLongVecs<T> && j.R >= kBwdLongRowBlocks) {
      bool done = false;
      // One launch with NV vectors a thread, in clusters of kCs blocks; false when the device
      // does not hold it.
      auto launch = [&](auto nvc, auto pipec, auto csc) {
        constexpr int NV = decltype(nvc)::value, kCs = decltype(csc)::value;
        constexpr bool kPipe = decltype(pipec)::value;
        auto* kernel = &bwd_rows_kernel<T, K, NV, kPipe, kCs>;
        const int64_t L = j.L / kCs;  // a block's columns
        const size_t cols = bwd_cols_bytes<T, NV>(kBwdMaxThreads, need_w || need_b);
        const size_t wsh = w ? static_cast<size_t>(L) * sizeof(T) : 0;
        const size_t all = kPipe ? std::max(cols, bwd_long_smem<T, NV>(wsh)) : cols;
        if (resident_blocks(reinterpret_cast<const void*>(kernel), kBwdMaxThreads, all, kCs,
                            like.device().ordinal()) < kCs)
          return false;
        constexpr int64_t P = kBwdLongRowBlocks / kCs;  // partial rows: one a cluster
        // A row a block: the kernel takes tpr = kBwdMaxThreads as known (kBwdRefetch)
        static_assert(kBwdRefetch<T, NV>, "the long rows' kernels take their tpr as known");
        TAPER_ASSERT(log2_for(ceil_div(nv, kCs), NV) == kBwdMaxThreadsLog2);
        Tensor hw, hb;
        C* pdw = need_w ? scratch<C>(hw, P * j.L, like) : nullptr;
        C* pdb = need_b ? scratch<C>(hb, P * j.L, like) : nullptr;
        launch_clustered<true>(j.name, *j.in, kernel, static_cast<unsigned>(kBwdLongRowBlocks),
                               kBwdMaxThreads, kCs, all, j.st, x, w, mean, rstd, dy, dx, pdw, pdb,
                               j.R, j.L, kBwdMaxThreadsLog2, inv_d, vec);
        fold_partials<C, T, RowsFold>(j, pdw, pdb, P, j.L, 1);
        return true;
      };
      using std::integral_constant;
      with_vecs<kBwdLongVecs<T>>(ceil_div(nv, tn), [&](auto nvc) {
        constexpr int NV = decltype(nvc)::value;
        if constexpr (NV > NVmax) {
          constexpr int kCs = kBwdLongCluster<T, NV>;
          if constexpr (kCs > 1 && kBwdLongPipe<T, NV / kCs>) {
            if (nv % kCs == 0)
              done = launch(integral_constant<int, NV / kCs>{}, std::true_type{},
                            integral_constant<int, kCs>{});
          }
          if (!done)
            done = launch(nvc, integral_constant<bool, kBwdLongPipe<T, NV>>{},
                          integral_constant<int, 1>{});
        }
      });
      if (done) return;
    }
  }
  // Chunks: (nch, sets) blocks for the sums, each set of rows one partial row of dw/db (at most
  // a quarter of the rows, so the partials stay small against the tensors).
  constexpr int64_t cb = static_cast<int64_t>(kBlock) * NVmax * V;
  const int64_t nch = ceil_div(j.L, cb);
  int64_t sets = std::max<int64_t>(1, ceil_div(kTargetBlocks, nch));
  if (need_w || need_b) sets = std::min(sets, ceil_div(j.R, 4));
  sets = std::min({sets, j.R, int64_t{65535}});
  Tensor hs, hw, hb;
  C* ps = scratch<C>(hs, j.R * nch * 2, like);
  C* pdw = need_w ? scratch<C>(hw, sets * j.L, like) : nullptr;
  C* pdb = need_b ? scratch<C>(hb, sets * j.L, like) : nullptr;
  const dim3 grid(grid1(j.name, nch), static_cast<unsigned>(sets));
  const size_t smem =
      need_w || need_b ? 2 * static_cast<size_t>(kBlock) * NVmax * V * sizeof(C) : 0;
  // Aligned half-type rows: the pipelined kernels, where the device takes their shared memory
  // (the sums on the same grid, whose sets fix the partials' order; the dx in a persistent
  // grid). Run 40 (H100), 4096x16384 forward+backward: rms bf16 392.5 -> 362.7 us with them,
  // but f32 641.7 -> 681.2 and layer f32 672.9 -> 720.9, so f32 and f64 keep the one-shot ones.
  const size_t stages = static_cast<size_t>(kBwdStages) * bwd_pipe_slots<NVmax> * kBlock * 16;
  const int ordinal = like.device().ordinal();
  const bool pipe = vec && sizeof(T) == 2;
  const bool pipe_sums =
      pipe && resident_blocks(reinterpret_cast<const void*>(&bwd_chunk_sums_kernel<T, K, true>),
                             kBlock, smem + stages, 1, ordinal) > 0;
  if (pipe_sums) {
    bwd_chunk_sums_kernel<T, K, true><<<grid, kBlock, smem + stages, j.st>>>(
        x, w, mean, rstd, dy, ps, pdw, pdb, j.R, j.L, nch, vec);
  } else {
    bwd_chunk_sums_kernel<T, K, false><<<grid, kBlock, smem, j.st>>>(
        x, w, mean, rstd, dy, ps, pdw, pdb, j.R, j.L, nch, vec);
  }
  TAPER_CUDA_CHECK_LAUNCH(j.name, *j.in);
  Tensor hpre;
  C* pre = nullptr;
  if (nch > kInlineMerge) {
    pre = scratch<C>(hpre, j.R * 2, like);
    sums_merge_kernel<T><<<grid1(j.name, j.R), kBlock, 0, j.st>>>(ps, ps + 1, 2, nch, nullptr, 1,
                                                                  1, 1, pre);
    TAPER_CUDA_CHECK_LAUNCH(j.name, *j.in);
  }
  const int64_t items = j.R * nch;
  const int pipe_dx =
      pipe ? resident_blocks(reinterpret_cast<const void*>(&bwd_chunk_dx_kernel<T, K, true>),
                             kBlock, stages, 1, ordinal)
           : 0;
  if (pipe_dx > 0) {
    bwd_chunk_dx_kernel<T, K, true>
        <<<grid1(j.name, std::min<int64_t>(items, pipe_dx)), kBlock, stages, j.st>>>(
            x, w, mean, rstd, dy, ps, pre, dx, j.L, nch, items, inv_d, vec);
  } else {
    bwd_chunk_dx_kernel<T, K, false><<<grid1(j.name, items), kBlock, 0, j.st>>>(
        x, w, mean, rstd, dy, ps, pre, dx, j.L, nch, items, inv_d, vec);
  }
  TAPER_CUDA_CHECK_LAUNCH(j.name, *j.in);
  fold_partials<C, T, RowsFold>(j, pdw, pdb, sets, j.L, 1);
}

/// group_norm_bwd by gn_bwd_cluster_kernel<T, B>, where its slices fit the rows (a piece of a
/// channel run or whole runs each, 2 to kMaxCluster a row, kMinClusterBlocks in all) and the
/// device holds such a cluster; false: another plan.
template <class T, int B> bool gn_bwd_clustered(const Job& j) {
  using C = compute_t<T>;
  constexpr int V = kV<T>;
  constexpr int64_t kN = int64_t{B} * kSliceVecs;  // vectors of a block's slice
  const T* x = static_cast<const T*>(j.x);
  const T* dy = static_cast<const T*>(j.dy);
  T* dx = static_cast<T*>(j.y);
  if (!aligned16(x) || !aligned16(dy) || !aligned16(dx) || j.S % V != 0) return false;
  const int64_t run = j.S / V;  // vectors of a channel run
  int64_t P = 1, m = 1;        // pieces of a run; runs of a slice
  if (run % kN == 0) P = run / kN;
  else if (kN % run == 0) m = kN / run;
  else return false;
  if (m > B || (m & (m - 1)) != 0 || j.Cg % m != 0) return false;
  const int64_t pieces = j.Cg * P, cs = pieces / m;  // a row's pieces and blocks
  if (cs < 2 || cs > kMaxCluster || pieces > kGnClusterPieces || j.R * cs < kMinClusterBlocks)
    return false;
  const size_t smem = static_cast<size_t>(kGnHeldBytesOf<B>);
  const Tensor& like = (*j.in)[0];
  if (resident_blocks(reinterpret_cast<const void*>(&gn_bwd_cluster_kernel<T, B>), B, smem,
                      static_cast<int>(cs), like.device().ordinal()) == 0)
    return false;
  const int64_t items = j.N * j.Cn * P;
  Tensor hq, hdy;
  C* pq = scratch<C>(hq, items, like);
  C* pdy = j.db.defined() ? scratch<C>(hdy, items, like) : nullptr;
  const C inv_m = static_cast<C>(1.0 / static_cast<double>(j.L));
  launch_clustered(j.name, *j.in, &gn_bwd_cluster_kernel<T, B>, grid1(j.name, j.R * cs), B,
                   static_cast<int>(cs), smem, j.st, x, static_cast<const T*>(j.w),
                   static_cast<const C*>(j.mean), static_cast<const C*>(j.rstd), dy, pq, pdy,
                   dx, j.L, j.G, j.Cg, j.Cn, P, log2_for(m, 1), inv_m);
  fold_partials<C, T, GroupFold>(j, j.dw.defined() ? pq : nullptr, pdy, j.N, j.Cn, P);
  return true;
}

template <class T> void run_bwd_group(const Job& j) {
  // One pass where clusters hold the rows: blocks of 256 threads (four an SM), else 512 (two).
  if (gn_bwd_clustered<T, kClusterThreads / 2>(j) || gn_bwd_clustered<T, kClusterThreads>(j))
    return;
  using C = compute_t<T>;
  constexpr int V = kV<T>, NU = kFwdVecs<T>;
  const T* x = static_cast<const T*>(j.x);
  const T* w = static_cast<const T*>(j.w);
  const T* dy = static_cast<const T*>(j.dy);
  T* dx = static_cast<T*>(j.y);
  const C* mean = static_cast<const C*>(j.mean);
  const C* rstd = static_cast<const C*>(j.rstd);
  const Tensor& like = (*j.in)[0];
  const bool need_b = j.db.defined();
  // Sums: a channel run is one item of tpu threads, or P pieces of one block each.
  constexpr int64_t ps_max = static_cast<int64_t>(kBlock) * NU * V;
  const int64_t P = ceil_div(j.S, ps_max);
  const int64_t ps = P > 1 ? ps_max : j.S;
  const int tpu_log2 = P > 1 ? 8 : log2_for(ceil_div(j.S, V * NU), 1);
  const int64_t items = j.N * j.Cn * P;
  const bool vec_s = aligned16(x) && aligned16(dy) && j.S % V == 0;
  Tensor hu, hq, hdy;
  C* pu = scratch<C>(hu, items, like);
  C* pq = scratch<C>(hq, items, like);
  C* pdy = need_b ? scratch<C>(hdy, items, like) : nullptr;
  const C inv_m = static_cast<C>(1.0 / static_cast<double>(j.L));
  if (j.S % ps_max == 0 && j.Cg * P <= kInlineMerge) {  // one cooperative launch, if it fits
    auto* kernel = &gn_bwd_grid_kernel<T>;
    if (items <= cooperative_blocks(reinterpret_cast<const void*>(kernel), like)) {
      // dw and db folded in the same launch, where db has x's dtype (always, through the
      // front end); else by col_reduce_kernel after it.
      const bool fold = !need_b || j.db.dtype() == like.dtype();
      T* dw = fold && j.dw.defined() ? ptr<T>(j.dw) : nullptr;
      T* db = fold && need_b ? ptr<T>(j.db) : nullptr;
      launch_cooperative(j.name, *j.in, kernel, grid1(j.name, items), kBlock, j.st, x, w, mean,
                         rstd, dy, pu, pq, pdy, dx, dw, db, j.N, j.Cn, j.S, j.G, j.Cg, P, inv_m,
                         aligned16(x) && aligned16(dy) && aligned16(dx));
      if (!fold)
        fold_partials<C, T, GroupFold>(j, j.dw.defined() ? pq : nullptr, pdy, j.N, j.Cn, P);
      return;
    }
  }
  // Whole aligned pieces, too many for one launch: the pipelined kernels, in grids of the
  // blocks the device holds.
  const bool whole = j.S % ps_max == 0 && aligned16(x) && aligned16(dy) && aligned16(dx);
  const size_t pipe_smem = static_cast<size_t>(kBwdStages) * bwd_pipe_slots<NU> * kBlock * 16;
  const int ordinal = like.device().ordinal();
  const int pipe_sums =
      whole ? resident_blocks(reinterpret_cast<const void*>(&gn_bwd_pipe_kernel<T, false>),
                              kBlock, pipe_smem, 1, ordinal)
            : 0;
  const int pipe_dx =
      whole ? resident_blocks(reinterpret_cast<const void*>(&gn_bwd_pipe_kernel<T, true>), kBlock,
                              pipe_smem, 1, ordinal)
            : 0;
  if (pipe_sums > 0) {
    gn_bwd_pipe_kernel<T, false>
        <<<grid1(j.name, std::min<int64_t>(items, pipe_sums)), kBlock, pipe_smem, j.st>>>(
            x, w, mean, rstd, dy, pu, pq, pdy, nullptr, dx, items, j.Cn, j.S, j.G, j.Cg, P,
            inv_m);
  } else {
    gn_bwd_sums_kernel<T>
        <<<grid1(j.name, ceil_div(items, kBlock >> tpu_log2)), kBlock, 0, j.st>>>(
            x, dy, mean, rstd, pu, pq, pdy, items, j.Cn, j.S, j.G, j.Cg, P, ps, tpu_log2, vec_s);
  }
  TAPER_CUDA_CHECK_LAUNCH(j.name, *j.in);
  // dx: rows of L in chunks of tpr threads' registers.
  const int tl = std::min(8, log2_for(ceil_div(j.L, V), NU));
  const int64_t cs = (int64_t{1} << tl) * NU * V;
  const int64_t nch = ceil_div(j.L, cs);
  const int64_t dx_items = j.R * nch;
  const bool vec_l = aligned16(x) && aligned16(dy) && aligned16(dx) && j.L % V == 0;
  Tensor hpre;
  C* pre = nullptr;
  if (j.Cg * P > kInlineMerge) {
    pre = scratch<C>(hpre, j.R * 2, like);
    sums_merge_kernel<T><<<grid1(j.name, j.R), kBlock, 0, j.st>>>(pu, pq, 1, j.Cg * P, w, j.G,
                                                                  j.Cg, P, pre);
    TAPER_CUDA_CHECK_LAUNCH(j.name, *j.in);
  }
  if (pipe_dx > 0) {  // its items are the sums' (whole pieces: a row's chunks in order)
    gn_bwd_pipe_kernel<T, true>
        <<<grid1(j.name, std::min<int64_t>(items, pipe_dx)), kBlock, pipe_smem, j.st>>>(
            x, w, mean, rstd, dy, pu, pq, pdy, pre, dx, items, j.Cn, j.S, j.G, j.Cg, P, inv_m);
  } else {
    gn_bwd_dx_kernel<T><<<grid1(j.name, ceil_div(dx_items, kBlock >> tl)), kBlock, 0, j.st>>>(
        x, w, mean, rstd, dy, pu, pq, pre, dx, dx_items, j.L, nch, j.S, j.G, j.Cg, P, tl, inv_m,
        vec_l);
  }
  TAPER_CUDA_CHECK_LAUNCH(j.name, *j.in);
  fold_partials<C, T, GroupFold>(j, j.dw.defined() ? pq : nullptr, pdy, j.N, j.Cn, P);
}

}  // namespace

void norm_part::run(std::type_identity<NormPartT>, Kind kind, bool bwd, const Job& j) {
  using T = NormPartT;
  switch (kind) {
    case Kind::kRms: bwd ? run_bwd_rows<T, Kind::kRms>(j) : run_fwd<T, Kind::kRms>(j); break;
    case Kind::kLayer:
      bwd ? run_bwd_rows<T, Kind::kLayer>(j) : run_fwd<T, Kind::kLayer>(j);
      break;
    case Kind::kGroup: bwd ? run_bwd_group<T>(j) : run_fwd<T, Kind::kGroup>(j); break;
  }
}

#ifndef TAPER_NORM_PART
namespace {

template <class T> constexpr bool kIsFloatT =
    std::is_same_v<T, bf16> || std::is_same_v<T, f16> || std::is_same_v<T, float> ||
    std::is_same_v<T, double>;

/// Checks an optional parameter (w or b): x's dtype, `len` elements, contiguous.
void check_param(const char* name, const char* what, const Tensor& p, const Tensor& x,
                 int64_t len) {
  TAPER_CHECK(p.dtype() == x.dtype() && static_cast<int64_t>(p.elem_count()) == len, name, ": ",
              what, " must be ", dtype_name(x.dtype()), " with ", len, " elements; got ",
              dtype_name(p.dtype()), " ", p.shape().to_string());
  TAPER_ASSERT(p.is_contiguous());
}

void fill_bytes(const Tensor& t, int byte) {
  if (present(t))
    TAPER_CUDA_CHECK(cudaMemsetAsync(t.data_ptr(), byte, t.elem_count() * dtype_size(t.dtype()),
                                     stream_of(t)));
}

/// x's shape without its last dim (the per-row statistics' shape).
Shape rows_shape(const Tensor& x) {
  std::vector<size_t> d = x.dims();
  if (!d.empty()) d.pop_back();
  return Shape(d);
}

/// The (R, L) view of x and, for group norm, (N, C, S, G); statistics' shape.
void plan_rows(Kind kind, const char* name, const Tensor& x, const OpAttrs& a, Job& j,
               Shape& stat_shape) {
  if (kind == Kind::kGroup) {
    TAPER_CHECK(x.rank() >= 2 && a.i0 > 0, name, ": needs x of rank >= 2 and num_groups > 0; got ",
                x.shape().to_string(), " and ", a.i0);
    j.N = static_cast<int64_t>(x.dims()[0]);
    j.Cn = static_cast<int64_t>(x.dims()[1]);
    j.G = a.i0;
    TAPER_CHECK(j.Cn % j.G == 0, name, ": ", j.Cn, " channels do not split into ", j.G,
                " groups");
    j.S = 1;
    for (size_t k = 2; k < x.rank(); ++k) j.S *= static_cast<int64_t>(x.dims()[k]);
    j.Cg = j.Cn / j.G;
    j.R = j.N * j.G;
    j.L = j.Cg * j.S;
    stat_shape = Shape({static_cast<size_t>(j.N), static_cast<size_t>(j.G)});
  } else {
    j.L = x.rank() ? static_cast<int64_t>(x.dims().back()) : 1;
    stat_shape = rows_shape(x);
    j.R = static_cast<int64_t>(stat_shape.elem_count());
  }
}

/// rms_norm: in = {x, w}, out {y, rstd}; layer_norm / group_norm: in = {x, w, b}, out
/// {y, mean, rstd}; attrs.f0 = eps, attrs.i0 = num_groups (group norm).
std::vector<Tensor> norm_fwd(Kind kind, const char* name, const std::vector<Tensor>& in,
                             const OpAttrs& a) {
  const Tensor& x = in[0];
  TAPER_ASSERT(x.is_contiguous());
  Job j;
  j.name = name;
  j.in = &in;
  j.st = stream_of(x);
  j.eps = a.f0;
  Shape stat_shape;
  plan_rows(kind, name, x, a, j, stat_shape);
  const int64_t plen = kind == Kind::kGroup ? j.Cn : j.L;
  if (present(in, 1)) {
    check_param(name, "w", in[1], x, plen);
    j.w = in[1].data_ptr();
  }
  if (kind != Kind::kRms && present(in, 2)) {
    check_param(name, "b", in[2], x, plen);
    j.b = in[2].data_ptr();
  }
  const DType sd = stat_dtype(x.dtype());
  Tensor y = new_output(x.shape(), x.dtype(), x);
  Tensor mean = kind == Kind::kRms ? Tensor() : new_output(stat_shape, sd, x);
  Tensor rstd = new_output(stat_shape, sd, x);
  std::vector<Tensor> out = kind == Kind::kRms ? std::vector<Tensor>{y, rstd}
                                               : std::vector<Tensor>{y, mean, rstd};
  if (j.R == 0) return out;
  if (j.L == 0) {  // statistics of nothing: NaN (all-ones bits), as 0 / 0 on the CPU
    fill_bytes(mean, 0xff);
    fill_bytes(rstd, 0xff);
    return out;
  }
  j.x = x.data_ptr();
  j.y = y.data_ptr();
  j.mean = mean.defined() ? mean.data_ptr() : nullptr;
  j.rstd = rstd.data_ptr();
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (kIsFloatT<T>) norm_part::run(std::type_identity<T>{}, kind, false, j);
  });
  return out;
}

/// rms_norm_bwd: in = {x, w, rstd, dy} -> {dx, dw}; layer/group_norm_bwd: in = {x, w, mean,
/// rstd, dy} -> {dx, dw, db}. attrs.ints = {need dw, need db}; db in attrs.dtype.
std::vector<Tensor> norm_bwd(Kind kind, const char* name, const std::vector<Tensor>& in,
                             const OpAttrs& a) {
  const Tensor& x = in[0];
  TAPER_ASSERT(x.is_contiguous());
  const bool rms = kind == Kind::kRms;
  const Tensor& rstd = in[rms ? 2 : 3];
  const Tensor& dy = in[rms ? 3 : 4];
  Job j;
  j.name = name;
  j.in = &in;
  j.st = stream_of(x);
  Shape stat_shape;
  plan_rows(kind, name, x, a, j, stat_shape);
  const DType sd = stat_dtype(x.dtype());
  TAPER_CHECK(dy.shape() == x.shape() && dy.dtype() == x.dtype(), name, ": dy ",
              dy.shape().to_string(), " ", dtype_name(dy.dtype()), " must match x ",
              x.shape().to_string(), " ", dtype_name(x.dtype()));
  TAPER_CHECK(rstd.dtype() == sd && static_cast<int64_t>(rstd.elem_count()) == j.R, name,
              ": rstd must be ", dtype_name(sd), " with ", j.R, " elements; got ",
              dtype_name(rstd.dtype()), " ", rstd.shape().to_string());
  if (!rms)
    TAPER_CHECK(in[2].dtype() == sd && static_cast<int64_t>(in[2].elem_count()) == j.R, name,
                ": mean must be ", dtype_name(sd), " with ", j.R, " elements; got ",
                dtype_name(in[2].dtype()), " ", in[2].shape().to_string());
  const int64_t plen = kind == Kind::kGroup ? j.Cn : j.L;
  const bool hw = present(in, 1);
  if (hw) {
    check_param(name, "w", in[1], x, plen);
    j.w = in[1].data_ptr();
  }
  const bool need_w = hw && a.ints.size() > 0 && a.ints[0] != 0;
  const bool need_b = !rms && a.ints.size() > 1 && a.ints[1] != 0;
  TAPER_CHECK(!need_b || is_float(a.dtype), name, ": db dtype must be a float dtype, got ",
              dtype_name(a.dtype));
  const Shape pshape({static_cast<size_t>(plen)});
  Tensor dx = new_output(x.shape(), x.dtype(), x);
  if (need_w) j.dw = new_output(pshape, in[1].dtype(), x);
  if (need_b) j.db = new_output(pshape, a.dtype, x);
  std::vector<Tensor> out = rms ? std::vector<Tensor>{dx, j.dw}
                                : std::vector<Tensor>{dx, j.dw, j.db};
  if (x.elem_count() == 0) {  // no rows, or rows of nothing: dw/db are empty sums
    fill_bytes(j.dw, 0);
    fill_bytes(j.db, 0);
    return out;
  }
  TAPER_ASSERT(dy.is_contiguous() && rstd.is_contiguous() && (rms || in[2].is_contiguous()));
  j.x = x.data_ptr();
  j.dy = dy.data_ptr();
  j.y = dx.data_ptr();
  j.mean = rms ? nullptr : in[2].data_ptr();
  j.rstd = rstd.data_ptr();
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (kIsFloatT<T>) norm_part::run(std::type_identity<T>{}, kind, true, j);
  });
  return out;
}

std::vector<Tensor> rms_norm_kernel(const std::vector<Tensor>& in, const OpAttrs& a) {
  return norm_fwd(Kind::kRms, "rms_norm", in, a);
}
std::vector<Tensor> layer_norm_kernel(const std::vector<Tensor>& in, const OpAttrs& a) {
  return norm_fwd(Kind::kLayer, "layer_norm", in, a);
}
std::vector<Tensor> group_norm_kernel(const std::vector<Tensor>& in, const OpAttrs& a) {
  return norm_fwd(Kind::kGroup, "group_norm", in, a);
}
std::vector<Tensor> rms_norm_bwd_kernel(const std::vector<Tensor>& in, const OpAttrs& a) {
  return norm_bwd(Kind::kRms, "rms_norm_bwd", in, a);
}
std::vector<Tensor> layer_norm_bwd_kernel(const std::vector<Tensor>& in, const OpAttrs& a) {
  return norm_bwd(Kind::kLayer, "layer_norm_bwd", in, a);
}
std::vector<Tensor> group_norm_bwd_kernel(const std::vector<Tensor>& in, const OpAttrs& a) {
  return norm_bwd(Kind::kGroup, "group_norm_bwd", in, a);
}

struct NormRegistrar {
  NormRegistrar() {
    register_kernel(OpId::rms_norm, DeviceKind::Cuda, kFloatDTypes, &rms_norm_kernel, true);
    register_kernel(OpId::layer_norm, DeviceKind::Cuda, kFloatDTypes, &layer_norm_kernel, true);
    register_kernel(OpId::group_norm, DeviceKind::Cuda, kFloatDTypes, &group_norm_kernel, true);
    register_kernel(OpId::rms_norm_bwd, DeviceKind::Cuda, kFloatDTypes, &rms_norm_bwd_kernel,
                    true);
    register_kernel(OpId::layer_norm_bwd, DeviceKind::Cuda, kFloatDTypes, &layer_norm_bwd_kernel,
                    true);
    register_kernel(OpId::group_norm_bwd, DeviceKind::Cuda, kFloatDTypes, &group_norm_bwd_kernel,
                    true);
  }
};
const NormRegistrar g_norm_registrar;

}  // namespace
#endif  // TAPER_NORM_PART
}  // namespace taper::cuda
