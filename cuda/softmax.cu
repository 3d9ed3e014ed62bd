// softmax.cu: CUDA kernels of softmax_last_dim, log_softmax_last_dim and their dedicated
// backward ops (softmax_last_dim_bwd, log_softmax_last_dim_bwd), for bf16, f16, f32 and f64,
// with the contract of cpu/softmax.cpp (which states it in full).
//
// What it is: per-row kernels over contiguous (R, D) data (registered needs_contiguous).
// What it is not: autograd (core/ holds the bwd hooks that call the *_bwd ops), the composed
// forms (metal_fallback/composed.cpp) or the reference (tests/ref/fused_ref.h).
//
// Shapes: x, y, dy, dx: (R, D), R rows of D elements; stats: (R, 2), per row (m, l) = (max,
// log sum exp(x - m)) in the compute type C = compute_t<T> (f32 for bf16/f16/f32, f64 for f64).
// Forward in = {x}, out = {y, stats}: softmax y = exp(x - m) * (1 / s), log-softmax
// y = (x - m) - l, s = sum exp(x - m), l = log s. Backward in = {x, stats, dy}, out = {dx}, with
// y recomputed as exp((x - m) - l): softmax dx = y * (dy - sum(dy * y)), log-softmax
// dx = dy - y * sum(dy) (cpu/softmax.cpp says why y is recomputed rather than read).
//
// Kernels: a row's threads (its "team") each hold kVec-element virtual vectors t, t + G,
// t + 2G, ... of the row (G threads, thread t; vector j = elements [j kVec, j kVec + kVec)),
// loaded with one 16-byte access when the row is aligned (x, out, dy 16-byte aligned and
// D % kVec == 0), element by element otherwise: the same vectors either way, so the order of the
// adds, and the bits, do not depend on alignment.
//   on chip (D <= 2048 kNv kVec: 65536 elements, f64 32768; the softmax backward half that):
//     the row stays in registers, kNv vectors per thread (32 compute values, f64 16; the softmax
//     backward keeps y and dy, 16 (8) each). G = the power of two that covers the row:
//       G <= 32: G lanes of a warp per row, 256 / G rows per 256-thread block (warp shuffles);
//       G = 64..256: one block of G threads per row;
//       G = 512..2048: a cluster of G / 256 blocks of 256 threads (at most 8, the portable
//         cluster size), the row split across it, block totals exchanged through distributed
//         shared memory.
//   streamed (longer rows): a cluster of 8 blocks of 512 threads per row, block k taking the k-th
//     eighth of the row; pass 1 reads it once keeping a running (max, sum) per thread (each step
//     of 4 vectors per thread is folded in by the exact rescaling merge sum_a exp(m_a - m) +
//     sum_b exp(m_b - m)), pass 2 reads it again and writes. The 264 blocks resident on an H200
//     (2 per SM) stream 33 rows at a time, so for rows up to ~1.2 MB (600 K bf16, 300 K f32
//     elements) the second read finds its slice still in the 50 MB L2; longer rows read it again
//     from memory.
//   Aligned and unaligned rows take separate instantiations, so that the element-wise
//   fallback's guards do not cost the vector kernels registers.
//   pipelined (aligned on-chip rows of bf16, f16 and f64): the same teams and vectors, in a
//     persistent grid (the blocks the device holds, each taking rows first, first + stride, ...),
//     each thread copying its own vectors kStages - 1 rows ahead into its own shared-memory
//     slots with cp.async; without it an SM has only its resident rows' loads in flight, and
//     none while they reduce and store.
// Bytes moved (s = sizeof(T), n = R D): forward 2ns + 2R sizeof(C) (x read, y written, stats);
// softmax and log-softmax backward 3ns + 2R sizeof(C) (x, dy read, dx written). Streamed rows
// read x (forward), x and dy (softmax backward) or dy (log-softmax backward) a second time, from
// L2 while it holds them.
//
// Determinism: every row's plan depends on (D, dtype, op) only (a persistent grid's size depends
// on the device, but not which threads hold which values); each thread folds its values in a fixed
// order, warps by fixed shuffle trees, blocks by a fixed fold of the warp totals in shared memory,
// clusters by every block folding the block totals in rank order: no atomics, the same bits on
// every run.
//
// Precision: C throughout (bf16/f16 widen exactly to f32; f64 is f64 with f64 constants, exp and
// log), rounded once at the store: round_to<T>, or for bf16/f16 the hardware conversions, which
// give round_to's bits for every value but NaN (NaN goes through round_to; cuda/vec_io.cuh).
// exp is the CUDA library's expf / exp (2 ulp, 1 ulp; --fmad=false leaves its own fmas alone)
// for f32 and f64 data, and for bf16/f16 data the hardware's ex2.approx (exp_ns_half: a few f32
// ulp, far below the half types' rounding), with results below the smallest normal (x - m below
// ln FLT_MIN, resp. ln DBL_MIN) flushed to 0 as the CPU's ExpNoSubnormal does. The CPU's MulAdd
// / NegMulAdd are fmas here too (sum dy * y, dy - y * sum dy).
// Special values as the CPU: a row with a NaN, an all -inf row or a row holding +inf gives NaN
// everywhere (written explicitly); its saved m is NaN, -inf, +inf respectively (NaN wins when a
// row holds both a NaN and an infinity) and l = 0; rows of length 0 save (-inf, 0). The backward
// writes NaN over every row whose saved m is not finite.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "cuda/cuda_common.cuh"
#include "cuda/vec_io.cuh"
#include "taper/dtype.h"
#include "taper/error.h"

namespace taper::cuda {
namespace {

namespace cg = cooperative_groups;

enum class Kind : int { kFwd, kFwdLog, kBwd, kBwdLog };
constexpr bool is_log(Kind k) { return k == Kind::kFwdLog || k == Kind::kBwdLog; }
constexpr bool is_bwd(Kind k) { return k == Kind::kBwd || k == Kind::kBwdLog; }

/// Vectors per thread on chip: 32 compute values (f64: 16, the same 128 bytes of registers);
/// half as many for the softmax backward, which keeps two arrays (y and dy).
template <class T, Kind K>
inline constexpr int kNv = (sizeof(compute_t<T>) == 8 ? 16 : 32) / (K == Kind::kBwd ? 2 : 1) /
                           kVec<T>;
constexpr int kWarpBlock = 256;      ///< threads per block of the warp-team kernel
constexpr int kRowBlock = 256;       ///< most threads per block of an on-chip row
constexpr int kMaxTeam = 2048;       ///< most threads an on-chip row is spread over (8 blocks)
constexpr int kStreamBlock = 512;    ///< threads per block of the streamed rows
constexpr int kStreamCluster = 8;    ///< blocks per streamed row (the portable cluster limit)
/// Vectors per thread per step of a streamed pass: 4, but at most 16 compute values per array
/// in the backward, which keeps two arrays (x and dy) live (halves: 2).
template <class T, Kind K> constexpr int stream_nv() {
  const int most = (is_bwd(K) ? 16 : 32) / kVec<T>;
  return most < 4 ? most : 4;
}
constexpr int64_t kMaxGrid = int64_t{1} << 30;  ///< more rows loop (grid stride)
/// Arrays an on-chip row brings in: x (forward), x and dy (backward).
template <Kind K> inline constexpr int kArrays = is_bwd(K) ? 2 : 1;
/// 16-byte slots a thread has in each stage of the pipelined rows: its on-chip vectors of each
/// array, and in the backward one for the row's saved (m, l).
template <class T, Kind K>
inline constexpr int kSlots = kArrays<K> * kNv<T, K> + (is_bwd(K) ? 1 : 0);
/// Stages of the pipelined rows (kStages - 1 rows in flight while one is computed) and the
/// resident blocks their register bound is set for, per kernel: kWarp for warp_rows_pipe_kernel,
/// else block_rows_pipe_kernel. A/B on an H100 (docs/cuda.md, runs 30 to 35):
/// - the half types' warp rows: 3 stages, 3 blocks (72-80 registers; 64 bytes a thread a stage
///   forward, 80 backward: 48-60 KB a block). At 4 blocks (64 registers) bf16 16384x1024 lost
///   3.5 % (23.5 -> 24.3 us);
/// - the half types' block (cluster) rows: 4 blocks (64 registers, no spills), 3 stages forward
///   (48 KB a block), 2 backward (40 KB, so that four fit): bf16 4096x16384 forward 123.4 ->
///   114.4 us, forward+backward 318.6 -> 293.2 against 3 blocks and 3 stages;
/// - f64: 2 stages (128-144 bytes a thread: 64-72 KB), 2 blocks (its rows spill at three).
/// Run 36: the block rows take blocks of up to kPipeRowBlock = 512 threads, so that a row of
/// 512 threads (bf16 4096x16384 forward) is one block and reduces through the block's barriers,
/// where it took a cluster of two and three cluster barriers a row; the register bound is kept
/// at 64 for the half types (two such blocks an SM) and 128 for f64 (one).
template <class T, Kind K, bool kWarp>
inline constexpr int kStages = !is_half_v<T> ? 2 : (is_bwd(K) && !kWarp ? 2 : 3);
constexpr int kPipeRowBlock = 512;
template <class T, bool kWarp>
inline constexpr int kPipeMinBlocks = sizeof(T) == 8 ? (kWarp ? 2 : 1) : (kWarp ? 3 : 2);
/// The pipelined block rows' most threads a block, and the blocks an SM their register bound is
/// set for. The half types' softmax backward takes blocks of 1024 threads, one an SM (the same
/// 64 registers as two of 512): a row of 1024 threads (bf16 8193 <= D <= 16384) is one block
/// and reduces through the block's barriers. Run 49's ncu (H100, bf16 4096x16384): as a cluster
/// of two 512-thread blocks its warps spent a third of their stalls on the cluster barrier's
/// memory fence, 165.6 us at 2.34 TB/s, where the forward's one-block rows took 2.44.
template <class T, Kind K>
inline constexpr int kPipeMaxThreads = is_half_v<T> && K == Kind::kBwd ? 1024 : kPipeRowBlock;
template <class T, Kind K>
inline constexpr int kPipeBlockMin =
    kPipeMaxThreads<T, K> == kPipeRowBlock ? kPipeMinBlocks<T, false> : 1;
/// Whether T's aligned on-chip rows take the pipelined kernels. f32 does not: its rows were at
/// 90-100 % of the copy already, and pipelined they lost up to 11 % (H100, run 30 of
/// docs/cuda.md: 4096x16384 forward 195.8 -> 216.6 us), while bf16 gained 19-26 % and f64 17-21 %.
template <class T> inline constexpr bool kPipeRows = !std::is_same_v<T, float>;
template <class T, Kind K, bool kWarp> constexpr size_t pipe_smem(int threads) {
  return static_cast<size_t>(kStages<T, K, kWarp>) * kSlots<T, K> * threads * 16;
}
/// Threads a block of the pipelined block rows: kPipeMaxThreads, or kRowBlock where that many
/// threads' stages would pass the 227 KB a block may have on sm_90 (f64 log_softmax backward:
/// 2 stages x 17 slots x 512 x 16 B = 278 KB; run 36 found it refused and run unpipelined).
template <class T, Kind K>
inline constexpr int kPipeBlock =
    pipe_smem<T, K, false>(kPipeMaxThreads<T, K>) <= kSmemPerBlock ? kPipeMaxThreads<T, K>
                                                                    : kRowBlock;

// ---- scalar helpers (overloaded on the compute type: no float in the f64 path) ---------------

__device__ __forceinline__ float exp_c(float t) { return expf(t); }
__device__ __forceinline__ double exp_c(double t) { return exp(t); }
__device__ __forceinline__ float log_c(float v) { return logf(v); }
__device__ __forceinline__ double log_c(double v) { return log(v); }
__device__ __forceinline__ float max_c(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double max_c(double a, double b) { return fmax(a, b); }
__device__ __forceinline__ float fma_c(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ double fma_c(double a, double b, double c) { return fma(a, b, c); }

/// exp(t) for t <= 0 with results below the smallest normal flushed to 0: the CPU's
/// ExpNoSubnormal thresholds (ln FLT_MIN, ln DBL_MIN rounded down). NaN stays NaN, -inf gives 0.
/// Branch-free: exp is computed for every t and the flush is one select (setp + selp in asm, so
/// that the compiler cannot sink the exp under a branch; as a branch, each element paid a
/// divergence frame and rematerialised constants, about 8 issue slots, next to the exp's 8).
__device__ __forceinline__ float exp_ns(float t) {
  const float e = expf(t);
  float r;
  asm("{\n\t.reg .pred p;\n\tsetp.lt.f32 p, %1, %2;\n\tselp.f32 %0, 0f00000000, %3, p;\n\t}"
      : "=f"(r)
      : "f"(t), "f"(-0x1.5d58ap+6f), "f"(e));
  return r;
}
__device__ __forceinline__ double exp_ns(double t) {
  const double e = exp(t);
  double r;
  asm("{\n\t.reg .pred p;\n\tsetp.lt.f64 p, %1, %2;\n\tselp.f64 %0, 0d0000000000000000, %3, p;\n\t}"
      : "=d"(r)
      : "d"(t), "d"(-0x1.6232bdd7abcd3p+9), "d"(e));
  return r;
}

/// exp(t) for t <= 0 of a softmax over T data, with exp_ns's flush (exp_ns_half for bf16/f16).
template <class T> __device__ __forceinline__ compute_t<T> exp_y(compute_t<T> t) {
  if constexpr (is_half_v<T>) return exp_ns_half(t);
  else return exp_ns(t);
}

template <class C> __device__ __forceinline__ C inf_c() {
  return std::numeric_limits<C>::infinity();
}
template <class C> __device__ __forceinline__ C nan_c() {
  return std::numeric_limits<C>::quiet_NaN();
}

/// A running (max, sum exp(x - max)) of the streamed forward; s NaN marks a NaN seen.
template <class C> struct MaxSum {
  C m, s;
};

__device__ __forceinline__ float shfl_down(float v, int off, int width) {
  return __shfl_down_sync(0xffffffffu, v, off, width);
}
__device__ __forceinline__ double shfl_down(double v, int off, int width) {
  return __shfl_down_sync(0xffffffffu, v, off, width);
}
template <class C> __device__ __forceinline__ MaxSum<C> shfl_down(MaxSum<C> v, int off, int width) {
  return MaxSum<C>{shfl_down(v.m, off, width), shfl_down(v.s, off, width)};
}
__device__ __forceinline__ float shfl_idx(float v, int lane, int width) {
  return __shfl_sync(0xffffffffu, v, lane, width);
}
__device__ __forceinline__ double shfl_idx(double v, int lane, int width) {
  return __shfl_sync(0xffffffffu, v, lane, width);
}

struct MaxOp {
  template <class C> __device__ __forceinline__ C operator()(C a, C b) const { return max_c(a, b); }
};
struct AddOp {
  template <class C> __device__ __forceinline__ C operator()(C a, C b) const { return a + b; }
};
/// Merges two running (max, sum) states: +inf absorbs (keeping a NaN mark), two empty states
/// (max -inf) add their marks, otherwise each sum is rescaled to the larger max (one factor is
/// exp(0) = 1, as in the CPU's MaxSum::add).
struct MergeOp {
  template <class C>
  __device__ __forceinline__ MaxSum<C> operator()(MaxSum<C> a, MaxSum<C> b) const {
    const C inf = inf_c<C>();
    if (a.m == inf || b.m == inf)
      return MaxSum<C>{inf, std::isnan(a.s) || std::isnan(b.s) ? nan_c<C>() : C(0)};
    const C m = max_c(a.m, b.m);
    if (m == -inf) return MaxSum<C>{m, a.s + b.s};
    return MaxSum<C>{m, a.s * exp_c(a.m - m) + b.s * exp_c(b.m - m)};
  }
};

// ---- teams: the threads of one row ----------------------------------------------------------

/// G (a power of two <= 32) aligned lanes of one warp. Every lane of the warp must call
/// all_reduce (groups of rows past R included).
struct WarpTeam {
  int size;  ///< G
  int rank;  ///< this thread's index in the row's team
  /// Every lane of the group gets op over the group: a down tree to the group's first lane,
  /// then a broadcast, so all lanes hold the same bits.
  template <class S, class Op> __device__ __forceinline__ S all_reduce(S v, Op op, int) const {
    for (int off = size >> 1; off > 0; off >>= 1) v = op(v, shfl_down(v, off, size));
    return shfl_idx(v, 0, size);
  }
  __device__ __forceinline__ void release() const {}
  __device__ __forceinline__ void wait() const {}
};

/// One block, or a cluster of `cs` blocks, per row. Every thread of the cluster must call
/// all_reduce with the same slot sequence per row, then release() after the row's last one and
/// wait() before the next row (or exit): the cluster barrier keeps a block's slots alive until
/// every block has read them.
struct ClusterTeam {
  int size;      ///< blockDim.x * cs
  int rank;      ///< block rank * blockDim.x + threadIdx.x
  unsigned cs;   ///< blocks in the cluster
  unsigned block;  ///< this block's rank in the cluster
  unsigned char* red;  ///< shared: 32 states, the warp totals
  unsigned char* xch;  ///< shared: 2 states, this block's totals (slot 0, 1)
  template <class S, class Op> __device__ __forceinline__ S all_reduce(S v, Op op, int slot) const {
    S* warp_tot = reinterpret_cast<S*>(red);
    for (int off = 16; off > 0; off >>= 1) v = op(v, shfl_down(v, off, 32));
    if ((threadIdx.x & 31u) == 0) warp_tot[threadIdx.x >> 5] = v;
    __syncthreads();
    S r = warp_tot[0];
    const int warps = static_cast<int>(blockDim.x >> 5);
    for (int w = 1; w < warps; ++w) r = op(r, warp_tot[w]);
    __syncthreads();  // warp_tot is free for the next reduction
    if (cs > 1) {
      S* mine = reinterpret_cast<S*>(xch) + slot;
      if (threadIdx.x == 0) *mine = r;
      cg::this_cluster().sync();  // release / acquire: every block's total is visible
      r = *cg::this_cluster().map_shared_rank(mine, 0);
      for (unsigned k = 1; k < cs; ++k)
        r = op(r, *cg::this_cluster().map_shared_rank(mine, static_cast<int>(k)));
    }
    return r;
  }
  __device__ __forceinline__ void release() const {
    if (cs > 1) cg::this_cluster().barrier_arrive();
  }
  __device__ __forceinline__ void wait() const {
    if (cs > 1) cg::this_cluster().barrier_wait();
  }
};

// ---- loads and stores ------------------------------------------------------------------------

/// Virtual vector at element i0 of a row of n elements; elements at or past n get `fill`. I: int
/// on chip (rows of at most 2^16 elements), int64_t when streamed.
/// vec: the row is aligned and n % kVec == 0 (so a vector that starts below n is whole).
template <bool kLast, class T, class I>
__device__ __forceinline__ void load_any(const T* row, I i0, I n, bool vec,
                                         compute_t<T> fill, compute_t<T> (&v)[kVec<T>]) {
  if (vec && i0 < n) {
    load16<kLast>(row + i0, v);
  } else {
#pragma unroll
    for (int l = 0; l < kVec<T>; ++l) v[l] = i0 + l < n ? load_c(row[i0 + l]) : fill;
  }
}

/// Stores the elements of the virtual vector at i0 that lie below n (vec: as load_any).
/// kMayNaN = false: the caller knows no value is NaN (store16).
template <bool kLast, bool kMayNaN, class T, class I>
__device__ __forceinline__ void store_any(T* row, I i0, I n, bool vec,
                                          const compute_t<T> (&v)[kVec<T>]) {
  if (i0 >= n) return;
  if (vec) {
    store16<kLast, kMayNaN>(row + i0, v);
  } else {
#pragma unroll
    for (int l = 0; l < kVec<T>; ++l)
      if (i0 + l < n) row[i0 + l] = store_c<T, kMayNaN>(v[l]);
  }
}

/// A thread's NV on-chip vectors of a row: vector k starts at element (t + k G) kVec.
template <class T, int NV>
__device__ __forceinline__ void load_row(const T* row, int n, int t, int G, bool vec,
                                         compute_t<T> fill, compute_t<T> (&v)[NV][kVec<T>]) {
#pragma unroll
  for (int k = 0; k < NV; ++k) load_any<false>(row, (t + k * G) * kVec<T>, n, vec, fill, v[k]);
}

/// The thread's slot of vector k of array `arr` in a pipeline stage (prefetch_row's layout).
template <class T, Kind K>
__device__ __forceinline__ const uint4& slot(const uint4* stage, int arr, int k) {
  return stage[(arr * kNv<T, K> + k) * static_cast<int>(blockDim.x) +
               static_cast<int>(threadIdx.x)];
}

/// A thread's NV on-chip vectors of array `arr`, as load_row: from its slots of a pipeline stage
/// (kPipe; the row is aligned, and prefetch_row filled the slots past the row with `fill`, so
/// every slot is read whatever n is) or from `row` in global memory.
template <bool kPipe, bool kAl, class T, Kind K, int NV>
__device__ __forceinline__ void get_row(const uint4* stage, int arr, const T* row, int n, int t,
                                        int G, compute_t<T> fill,
                                        compute_t<T> (&v)[NV][kVec<T>]) {
  if constexpr (kPipe) {
#pragma unroll
    for (int k = 0; k < NV; ++k) widen16<T>(slot<T, K>(stage, arr, k), v[k]);
  } else {
    load_row<T, NV>(row, n, t, G, kAl, fill, v);
  }
}

/// Writes a thread's on-chip vectors: element (k, l) gets f(k, l, x_kl), x_kl the element of
/// `src` there when kSrc (0 otherwise), loaded vector by vector as it is written (kPipe: from
/// array 0 of the thread's slots in `stage`). kMayNaN = false: f is never NaN (store_any).
template <bool kSrc, bool kMayNaN, class T, int NV, bool kPipe = false, Kind K = Kind::kFwd,
          class F>
__device__ __forceinline__ void write_row(T* out, const T* src, int n, int t, int G, bool vec,
                                          F f, const uint4* stage = nullptr) {
  using C = compute_t<T>;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int i0 = (t + k * G) * kVec<T>;
    if (i0 >= n) continue;
    C xv[kVec<T>];
    if constexpr (kSrc && kPipe) {
      widen16<T>(slot<T, K>(stage, 0, k), xv);
    } else if constexpr (kSrc) {
      load_any<false>(src, i0, n, vec, C(0), xv);
    } else {
#pragma unroll
      for (int l = 0; l < kVec<T>; ++l) xv[l] = C(0);
    }
    C o[kVec<T>];
#pragma unroll
    for (int l = 0; l < kVec<T>; ++l) o[l] = f(k, l, xv[l]);
    store_any<false, kMayNaN>(out, i0, n, vec, o);
  }
}

/// The kernels' operands: x, dy (backward), out (y or dx), stats (written by the forward, read
/// by the backward), R rows of D elements; vec: every row is 16-byte aligned.
template <class T> struct RowArgs {
  const T* x;
  const T* dy;
  T* out;
  compute_t<T>* st;
  int64_t R, D;
  bool vec;
};

// ---- on-chip rows ----------------------------------------------------------------------------

/// One row (row < R when active) held in registers by `team`. Every thread of the team runs the
/// same reductions whatever its row holds (inactive rows too); only memory accesses are guarded.
/// kPipe: the row's inputs (x, dy, the saved stats) are in the thread's slots of `stage`, where
/// prefetch_row put them; otherwise they are read from global memory.
template <class T, Kind K, bool kAl, class Team, bool kPipe = false>
__device__ __forceinline__ void onchip_row(const RowArgs<T>& a, int64_t row, bool active,
                                           const Team& team, const uint4* stage = nullptr) {
  using C = compute_t<T>;
  constexpr int V = kVec<T>, NV = kNv<T, K>;
  const int G = team.size, t = team.rank;
  const int n = active ? static_cast<int>(a.D) : 0;  // an inactive row has no elements
  const int64_t off = active ? row * a.D : 0;
  const T* xr = a.x + off;
  T* outr = a.out + off;
  const C inf = inf_c<C>(), nanv = nan_c<C>();

  if constexpr (!is_bwd(K)) {
    C v[NV][V];
    get_row<kPipe, kAl, T, K, NV>(stage, 0, xr, n, t, G, -inf, v);
    C m = -inf;
#pragma unroll
    for (int k = 0; k < NV; ++k)
#pragma unroll
      for (int l = 0; l < V; ++l) m = max_c(m, v[k][l]);  // fmax: NaN is found below
    m = team.all_reduce(m, MaxOp{}, 0);
    const bool finite = std::isfinite(m);
    // Finite max: s = sum exp(x - m), NaN when the row holds a NaN (the padding's exp is 0).
    // Otherwise s counts the NaNs (the row's y is NaN either way; s tells the saved max).
    C s = 0;
    if (finite) {
#pragma unroll
      for (int k = 0; k < NV; ++k)
#pragma unroll
        for (int l = 0; l < V; ++l) {
          const C e = exp_y<T>(v[k][l] - m);
          if constexpr (!is_log(K)) v[k][l] = e;
          s += e;
        }
    } else {
#pragma unroll
      for (int k = 0; k < NV; ++k)
#pragma unroll
        for (int l = 0; l < V; ++l) s += v[k][l] != v[k][l] ? C(1) : C(0);
    }
    s = team.all_reduce(s, AddOp{}, 1);
    team.release();
    const bool nan_row = finite ? std::isnan(s) : (s > C(0) || std::isnan(m));
    const bool ok = finite && !nan_row;
    const C lse = ok ? log_c(s) : C(0);  // s >= 1: the max term is exp(0)
    if (active && t == 0) {
      a.st[2 * row] = nan_row ? nanv : m;
      a.st[2 * row + 1] = lse;
    }
    // An ok row has no NaN and a finite max: y = exp(x - m) / s with s >= 1, or (x - m) - lse
    // with x finite or -inf, is never NaN, so its stores skip the NaN test.
    if (!ok) {
      write_row<false, true, T, NV>(outr, xr, n, t, G, kAl, [&](int, int, C) { return nanv; });
    } else if constexpr (is_log(K)) {
      write_row<false, false, T, NV>(outr, xr, n, t, G, kAl,
                                     [&](int k, int l, C) { return (v[k][l] - m) - lse; });
    } else {
      const C inv = C(1) / s;
      write_row<false, false, T, NV>(outr, xr, n, t, G, kAl,
                                     [&](int k, int l, C) { return v[k][l] * inv; });
    }
    team.wait();
  } else {
    C m0 = C(0), l0 = C(0);
    if (active) {
      // the saved (m, l): the slot past the arrays' (prefetch_row's layout), or global memory
      const C* sv = kPipe ? reinterpret_cast<const C*>(&slot<T, K>(stage, kArrays<K>, 0))
                          : a.st + 2 * row;
      m0 = sv[0];
      l0 = sv[1];
    }
    const bool ok = std::isfinite(m0);  // else the forward row was NaN (NaN, all -inf, +inf)
    const C m = ok ? m0 : C(0), l = ok ? l0 : C(0);
    const int nl = ok ? n : 0;  // a NaN row loads nothing
    const T* dyr = a.dy + off;
    if constexpr (K == Kind::kBwd) {
      C y[NV][V], g[NV][V];
      get_row<kPipe, kAl, T, K, NV>(stage, 0, xr, nl, t, G, -inf, y);  // padding: y = 0
      get_row<kPipe, kAl, T, K, NV>(stage, 1, dyr, nl, t, G, C(0), g);
      C s = 0;
#pragma unroll
      for (int k = 0; k < NV; ++k)
#pragma unroll
        for (int l2 = 0; l2 < V; ++l2) {
          y[k][l2] = exp_y<T>((y[k][l2] - m) - l);
          s = fma_c(y[k][l2], g[k][l2], s);
        }
      s = team.all_reduce(s, AddOp{}, 0);
      team.release();
      if (!ok) {
        write_row<false, true, T, NV>(outr, xr, n, t, G, kAl, [&](int, int, C) { return nanv; });
      } else {
        write_row<false, true, T, NV>(outr, xr, n, t, G, kAl,
                                      [&](int k, int l2, C) { return y[k][l2] * (g[k][l2] - s); });
      }
    } else {
      C g[NV][V];
      get_row<kPipe, kAl, T, K, NV>(stage, 1, dyr, nl, t, G, C(0), g);
      C s = 0;
#pragma unroll
      for (int k = 0; k < NV; ++k)
#pragma unroll
        for (int l2 = 0; l2 < V; ++l2) s += g[k][l2];
      s = team.all_reduce(s, AddOp{}, 0);
      team.release();
      if (!ok) {
        write_row<false, true, T, NV>(outr, xr, n, t, G, kAl, [&](int, int, C) { return nanv; });
      } else {
        write_row<true, true, T, NV, kPipe, K>(
            outr, xr, n, t, G, kAl,
            [&](int k, int l2, C xv) { return fma_c(-exp_y<T>((xv - m) - l), s, g[k][l2]); },
            stage);
      }
    }
    team.wait();
  }
}

/// Rows of D <= 32 kNv kVec: G = 2^glog2 lanes per row, 256 / G rows per block.
template <class T, Kind K, bool kAl>
__global__ void __launch_bounds__(kWarpBlock, 3) warp_rows_kernel(RowArgs<T> a, int glog2) {
  pdl_begin();
  const int G = 1 << glog2;
  const int rows_per_block = kWarpBlock >> glog2;
  const WarpTeam team{G, static_cast<int>(threadIdx.x) & (G - 1)};
  const int group = static_cast<int>(threadIdx.x) >> glog2;
  // base is uniform across the block: every lane reaches every shuffle.
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * rows_per_block; base < a.R;
       base += static_cast<int64_t>(gridDim.x) * rows_per_block) {
    const int64_t row = base + group;
    onchip_row<T, K, kAl>(a, row, row < a.R, team);
  }
}

/// Rows of up to kMaxTeam kNv kVec elements: one block (cluster of blocks) of blockDim.x * cs
/// threads per row; grid = clusters * cs, cluster c takes rows c, c + clusters, ...
template <class T, Kind K, bool kAl>
__global__ void __launch_bounds__(kRowBlock, 3) block_rows_kernel(RowArgs<T> a) {
  pdl_begin();
  __shared__ alignas(16) unsigned char red[32 * sizeof(MaxSum<compute_t<T>>)];
  __shared__ alignas(16) unsigned char xch[2 * sizeof(MaxSum<compute_t<T>>)];
  const unsigned cs = cg::this_cluster().num_blocks(), blk = cg::this_cluster().block_rank();
  const ClusterTeam team{static_cast<int>(blockDim.x * cs),
                         static_cast<int>(blk * blockDim.x + threadIdx.x), cs, blk, red, xch};
  const int64_t clusters = gridDim.x / cs;
  for (int64_t row = blockIdx.x / cs; row < a.R; row += clusters)  // uniform per cluster
    onchip_row<T, K, kAl>(a, row, true, team);
}

// ---- pipelined on-chip rows (aligned) -------------------------------------------------------
//
// The kernels above issue a row's loads, then wait for them with nothing else in flight: each
// SM has only its resident rows' bytes on the way, and their reductions and stores leave the
// memory idle. The pipelined kernels are persistent (a grid of the blocks the device holds, each
// taking rows first, first + stride, ...) and copy the rows kStages - 1 iterations ahead into
// shared memory with cp.async, each thread its own vectors into its own slots, so that no
// barrier is needed between the copy and the read. A row's arithmetic, and so its bits, is the
// same as in the kernels above.

/// Issues the cp.async copies of one row (row < R when active) into the calling thread's slots
/// of `stage`: its on-chip vectors of x (and dy), and in the backward the row's saved (m, l).
/// The slots of vectors past the row (all of them when inactive) get get_row's fill, x's -inf
/// and dy's 0, as plain shared stores, so that get_row reads every slot without a test.
template <class T, Kind K>
__device__ __forceinline__ void prefetch_row(uint4* stage, const RowArgs<T>& a, int64_t row,
                                             bool active, int t, int G) {
  constexpr int V = kVec<T>, NV = kNv<T, K>;
  const int n = active ? static_cast<int>(a.D) : 0;
  const int B = static_cast<int>(blockDim.x);
  uint4* mine = stage + threadIdx.x;
  if (n < NV * G * V) {  // a short row (or none): the padding slots (uniform across the team)
#pragma unroll
    for (int arr = 0; arr < kArrays<K>; ++arr) {
      const uint4 fill = splat16<T>(arr == 0 ? -inf_c<compute_t<T>>() : compute_t<T>(0));
#pragma unroll
      for (int k = 0; k < NV; ++k)
        if ((t + k * G) * V >= n) mine[(arr * NV + k) * B] = fill;
    }
  }
  if (!active) return;
  const int64_t off = row * a.D + t * V;
  const bool whole = n >= NV * G * V;  // every vector is in the row: no test each
#pragma unroll
  for (int arr = 0; arr < kArrays<K>; ++arr) {
    const T* p = (arr == 0 ? a.x : a.dy) + off;
    if (whole) {
#pragma unroll
      for (int k = 0; k < NV; ++k) cp_async<16>(&mine[(arr * NV + k) * B], p + k * G * V);
    } else {
#pragma unroll
      for (int k = 0; k < NV; ++k)
        if ((t + k * G) * V < n) cp_async<16>(&mine[(arr * NV + k) * B], p + k * G * V);
    }
  }
  if constexpr (is_bwd(K))
    cp_async<static_cast<int>(2 * sizeof(compute_t<T>))>(&mine[kArrays<K> * NV * B],
                                                          a.st + 2 * row);
}

/// Rows base + group, base + stride + group, ... (base < R) through onchip_row, each row's
/// copies issued kStages - 1 rows ahead. `base` and `stride` are uniform across the team.
template <class T, Kind K, class Team>
__device__ __forceinline__ void pipe_rows(const RowArgs<T>& a, int64_t base, int64_t stride,
                                          int group, const Team& team) {
  extern __shared__ uint4 pipe_smem_[];
  const int t = team.rank, G = team.size;
  pipelined_rows<kStages<T, K, std::is_same_v<Team, WarpTeam>>>(
      base, stride, a.R, pipe_smem_, kSlots<T, K> * static_cast<int>(blockDim.x),
      [&](uint4* stage, int64_t b) {
        prefetch_row<T, K>(stage, a, b + group, b + group < a.R, t, G);
      },
      [&](const uint4* stage, int64_t b) {
        onchip_row<T, K, true, Team, true>(a, b + group, b + group < a.R, team, stage);
      });
}

/// warp_rows_kernel's rows, pipelined: G = 2^glog2 lanes per row, 256 / G rows per block.
/// kWarp32: glog2 is 5 (rows of a whole warp, the long ones), known to the compiler, which then
/// folds the team's index arithmetic and unrolls its reductions.
template <class T, Kind K, bool kWarp32>
__global__ void __launch_bounds__(kWarpBlock, kPipeMinBlocks<T, true>)
    warp_rows_pipe_kernel(RowArgs<T> a, int glog2_arg) {
  pdl_begin();
  const int glog2 = kWarp32 ? 5 : glog2_arg;
  const int rows_per_block = kWarpBlock >> glog2;
  const WarpTeam team{1 << glog2, static_cast<int>(threadIdx.x) & ((1 << glog2) - 1)};
  pipe_rows<T, K>(a, static_cast<int64_t>(blockIdx.x) * rows_per_block,
                  static_cast<int64_t>(gridDim.x) * rows_per_block,
                  static_cast<int>(threadIdx.x) >> glog2, team);
}

/// block_rows_kernel's rows, pipelined: one block (cluster of blocks) per row.
template <class T, Kind K>
__global__ void __launch_bounds__(kPipeMaxThreads<T, K>, kPipeBlockMin<T, K>)
    block_rows_pipe_kernel(RowArgs<T> a) {
  pdl_begin();
  __shared__ alignas(16) unsigned char red[32 * sizeof(MaxSum<compute_t<T>>)];
  __shared__ alignas(16) unsigned char xch[2 * sizeof(MaxSum<compute_t<T>>)];
  const unsigned cs = cg::this_cluster().num_blocks(), blk = cg::this_cluster().block_rank();
  const ClusterTeam team{static_cast<int>(blockDim.x * cs),
                         static_cast<int>(blk * blockDim.x + threadIdx.x), cs, blk, red, xch};
  pipe_rows<T, K>(a, blockIdx.x / cs, gridDim.x / cs, 0, team);
}

// ---- streamed rows ---------------------------------------------------------------------------

/// NU vectors of one step: vector j + u * B (u < NU) of the row, those at or past hi filled.
template <bool kLast, int NU, class T>
__device__ __forceinline__ void load_step(const T* row, int64_t D, int64_t j, int64_t hi, int B,
                                          bool vec, compute_t<T> fill,
                                          compute_t<T> (&v)[NU][kVec<T>]) {
#pragma unroll
  for (int u = 0; u < NU; ++u) {
    const int64_t jj = j + static_cast<int64_t>(u) * B;
    if (jj < hi) {
      load_any<kLast>(row, jj * kVec<T>, D, vec, fill, v[u]);
    } else {
#pragma unroll
      for (int l = 0; l < kVec<T>; ++l) v[u][l] = fill;
    }
  }
}

template <bool kMayNaN, int NU, class T>
__device__ __forceinline__ void store_step(T* row, int64_t D, int64_t j, int64_t hi, int B,
                                           bool vec, const compute_t<T> (&v)[NU][kVec<T>]) {
#pragma unroll
  for (int u = 0; u < NU; ++u) {
    const int64_t jj = j + static_cast<int64_t>(u) * B;
    if (jj < hi) store_any<true, kMayNaN>(row, jj * kVec<T>, D, vec, v[u]);
  }
}

/// One row streamed by a cluster: block b takes virtual vectors [lo, hi), the b-th of cs equal
/// slices; thread tid folds vectors lo + tid + u B + i step (u < NU) in steps of B NU vectors.
template <class T, Kind K, bool kAl>
__device__ __forceinline__ void stream_row(const RowArgs<T>& a, int64_t row,
                                           const ClusterTeam& team) {
  using C = compute_t<T>;
  constexpr int V = kVec<T>, NU = stream_nv<T, K>();
  const int B = static_cast<int>(blockDim.x);
  const int64_t D = a.D, nvec = ceil_div(D, V);
  const int64_t per = ceil_div(nvec, team.cs);
  const int64_t lo = per * team.block < nvec ? per * team.block : nvec;
  const int64_t hi = lo + per < nvec ? lo + per : nvec;
  const int64_t step = static_cast<int64_t>(B) * NU;
  const int64_t j0 = lo + threadIdx.x;
  const T* xr = a.x + row * D;
  T* outr = a.out + row * D;
  const C inf = inf_c<C>(), nanv = nan_c<C>();
  C o[NU][V];

  if constexpr (!is_bwd(K)) {
    MaxSum<C> acc{-inf, C(0)};
    for (int64_t j = j0; j < hi; j += step) {
      C v[NU][V];
      load_step<false, NU>(xr, D, j, hi, B, kAl, -inf, v);
      C cm = -inf;
#pragma unroll
      for (int u = 0; u < NU; ++u)
#pragma unroll
        for (int l = 0; l < V; ++l) cm = max_c(cm, v[u][l]);
      if (std::isfinite(cm) && acc.m != inf) {
        // Merge the step's (max, sum) in; a NaN in the step makes the sum NaN, and NaN stays.
        const C mm = max_c(acc.m, cm);
        C cs = 0;
#pragma unroll
        for (int u = 0; u < NU; ++u)
#pragma unroll
          for (int l = 0; l < V; ++l) cs += exp_y<T>(v[u][l] - mm);
        acc.s = acc.s * exp_c(acc.m - mm) + cs;  // acc.m = -inf: 0 * 0
        acc.m = mm;
      } else {
        // No finite max in the step (all -inf or NaN, or a +inf), or +inf seen before: the
        // row's y is NaN; only +inf and NaN marks are kept.
        if (cm == inf) acc.m = inf;
#pragma unroll
        for (int u = 0; u < NU; ++u)
#pragma unroll
          for (int l = 0; l < V; ++l)
            if (v[u][l] != v[u][l]) acc.s = nanv;
      }
    }
    acc = team.all_reduce(acc, MergeOp{}, 0);
    team.release();
    const bool nan_row = std::isnan(acc.s);
    const bool ok = !nan_row && std::isfinite(acc.m);
    const C m = acc.m, lse = ok ? log_c(acc.s) : C(0);
    if (team.rank == 0) {
      a.st[2 * row] = nan_row ? nanv : m;
      a.st[2 * row + 1] = lse;
    }
    const C inv = ok ? C(1) / acc.s : C(0);
    for (int64_t j = j0; j < hi; j += step) {
      if (ok) {
        load_step<true, NU>(xr, D, j, hi, B, kAl, C(0), o);
#pragma unroll
        for (int u = 0; u < NU; ++u)
#pragma unroll
          for (int l = 0; l < V; ++l)
            o[u][l] = is_log(K) ? (o[u][l] - m) - lse : exp_y<T>(o[u][l] - m) * inv;
        store_step<false, NU>(outr, D, j, hi, B, kAl, o);  // an ok row: no NaN (onchip_row)
      } else {
#pragma unroll
        for (int u = 0; u < NU; ++u)
#pragma unroll
          for (int l = 0; l < V; ++l) o[u][l] = nanv;
        store_step<true, NU>(outr, D, j, hi, B, kAl, o);
      }
    }
    team.wait();
  } else {
    const T* dyr = a.dy + row * D;
    const C m0 = a.st[2 * row], l0 = a.st[2 * row + 1];
    const bool ok = std::isfinite(m0);
    const C m = ok ? m0 : C(0), l = ok ? l0 : C(0);
    C s = 0;
    for (int64_t j = j0; ok && j < hi; j += step) {
      C g[NU][V];
      load_step<false, NU>(dyr, D, j, hi, B, kAl, C(0), g);
      if constexpr (K == Kind::kBwd) {
        C y[NU][V];
        load_step<false, NU>(xr, D, j, hi, B, kAl, -inf, y);
#pragma unroll
        for (int u = 0; u < NU; ++u)
#pragma unroll
          for (int l2 = 0; l2 < V; ++l2) s = fma_c(exp_y<T>((y[u][l2] - m) - l), g[u][l2], s);
      } else {
#pragma unroll
        for (int u = 0; u < NU; ++u)
#pragma unroll
          for (int l2 = 0; l2 < V; ++l2) s += g[u][l2];
      }
    }
    s = team.all_reduce(s, AddOp{}, 0);
    team.release();
    for (int64_t j = j0; j < hi; j += step) {
      if (ok) {
        C g[NU][V];
        load_step<true, NU>(dyr, D, j, hi, B, kAl, C(0), g);
        load_step<true, NU>(xr, D, j, hi, B, kAl, C(0), o);
#pragma unroll
        for (int u = 0; u < NU; ++u)
#pragma unroll
          for (int l2 = 0; l2 < V; ++l2) {
            const C y = exp_y<T>((o[u][l2] - m) - l);
            o[u][l2] = K == Kind::kBwd ? y * (g[u][l2] - s) : fma_c(-y, s, g[u][l2]);
          }
      } else {
#pragma unroll
        for (int u = 0; u < NU; ++u)
#pragma unroll
          for (int l2 = 0; l2 < V; ++l2) o[u][l2] = nanv;
      }
      store_step<true, NU>(outr, D, j, hi, B, kAl, o);
    }
    team.wait();
  }
}

/// Rows longer than on chip: a cluster of kStreamCluster blocks of kStreamBlock threads per row.
template <class T, Kind K, bool kAl>
__global__ void __launch_bounds__(kStreamBlock, 2) stream_rows_kernel(RowArgs<T> a) {
  pdl_begin();
  __shared__ alignas(16) unsigned char red[32 * sizeof(MaxSum<compute_t<T>>)];
  __shared__ alignas(16) unsigned char xch[2 * sizeof(MaxSum<compute_t<T>>)];
  const unsigned cs = cg::this_cluster().num_blocks(), blk = cg::this_cluster().block_rank();
  const ClusterTeam team{static_cast<int>(blockDim.x * cs),
                         static_cast<int>(blk * blockDim.x + threadIdx.x), cs, blk, red, xch};
  const int64_t clusters = gridDim.x / cs;
  for (int64_t row = blockIdx.x / cs; row < a.R; row += clusters)  // uniform per cluster
    stream_row<T, K, kAl>(a, row, team);
}

/// Rows of length 0: (m, l) = (-inf, 0), as the CPU's save_stats(false, -inf, 1).
template <class C> __global__ void empty_rows_kernel(C* __restrict__ st, int64_t R) {
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < R;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    st[2 * r] = -inf_c<C>();
    st[2 * r + 1] = C(0);
  }
}

// ---- host side -------------------------------------------------------------------------------

/// launch_clustered (cuda_common.cuh) for a grid of at most kMaxGrid blocks, a programmatic
/// dependent launch: every kernel it launches calls pdl_begin first.
template <class... P>
void launch(const char* name, const std::vector<Tensor>& in, void (*kernel)(P...), int64_t blocks,
            int threads, int cs, size_t smem, cudaStream_t st, P... args) {
  launch_clustered<true>(name, in, kernel, static_cast<unsigned>(blocks), threads, cs, smem, st,
                         args...);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

/// Picks the kernel for rows of D > 0 elements and launches it over R > 0 rows (kAl: a.vec).
template <class T, Kind K, bool kAl>
void run_rows_al(const char* name, const std::vector<Tensor>& in, const RowArgs<T>& a,
              cudaStream_t st) {
  const int64_t nvec = ceil_div(a.D, kVec<T>);
  const int64_t need = ceil_div(nvec, kNv<T, K>);  // threads that hold the row on chip
  int64_t G = 1;
  while (G < need) G <<= 1;
  if (G <= 32) {
    int glog2 = 0;
    while ((int64_t{1} << glog2) < G) ++glog2;
    const int64_t blocks = std::min(ceil_div(a.R, kWarpBlock >> glog2), kMaxGrid);
    if constexpr (kAl && kPipeRows<T>) {
      const size_t smem = pipe_smem<T, K, true>(kWarpBlock);
      auto* kernel = glog2 == 5 ? &warp_rows_pipe_kernel<T, K, true>
                                : &warp_rows_pipe_kernel<T, K, false>;
      const int resident = resident_blocks(reinterpret_cast<const void*>(kernel), kWarpBlock,
                                           smem, 1, in[0].device().ordinal());
      if (resident > 0) {
        launch(name, in, kernel, std::min<int64_t>(blocks, resident), kWarpBlock, 1, smem, st, a,
               glog2);
        return;
      }
    }
    launch(name, in, &warp_rows_kernel<T, K, kAl>, blocks, kWarpBlock, 1, 0, st, a, glog2);
    return;
  }
  if (G <= kMaxTeam) {
    if constexpr (kAl && kPipeRows<T>) {
      // One block of G <= kPipeBlock threads, or a cluster of such blocks.
      const int threads = static_cast<int>(std::min<int64_t>(G, kPipeBlock<T, K>));
      const int cs = static_cast<int>(G / threads);
      const size_t smem = pipe_smem<T, K, false>(threads);
      auto* kernel = &block_rows_pipe_kernel<T, K>;
      const int resident = resident_blocks(reinterpret_cast<const void*>(kernel), threads, smem,
                                           cs, in[0].device().ordinal());
      if (resident >= cs) {
        const int64_t blocks = std::min(a.R, kMaxGrid / cs) * cs;
        launch(name, in, kernel, std::min<int64_t>(blocks, resident), threads, cs, smem, st, a);
        return;
      }
    }
    // One block of G <= 256 threads, or a cluster of up to 8 (the portable limit) such blocks.
    const int threads = static_cast<int>(std::min<int64_t>(G, kRowBlock));
    const int cs = static_cast<int>(G / threads);
    const int64_t blocks = std::min(a.R, kMaxGrid / cs) * cs;
    launch(name, in, &block_rows_kernel<T, K, kAl>, blocks, threads, cs, 0, st, a);
    return;
  }
  const int64_t blocks = std::min(a.R, kMaxGrid / kStreamCluster) * kStreamCluster;
  launch(name, in, &stream_rows_kernel<T, K, kAl>, blocks, kStreamBlock, kStreamCluster, 0, st,
         a);
}

/// The aligned rows (16-byte vectors) and the others take separate kernels: the element-wise
/// fallback's guards and addresses would otherwise cost the aligned kernels registers.
template <class T, Kind K>
void run_rows(const char* name, const std::vector<Tensor>& in, const RowArgs<T>& a,
              cudaStream_t st) {
  if (a.vec) run_rows_al<T, K, true>(name, in, a, st);
  else run_rows_al<T, K, false>(name, in, a, st);
}

int64_t last_dim(const Tensor& t) {
  return t.rank() == 0 ? 1 : static_cast<int64_t>(t.dims().back());
}
/// The saved stats' shape: x's shape with its last dim replaced by 2 (m, l).
Shape stats_shape(const Tensor& x) {
  std::vector<size_t> d = x.dims();
  if (!d.empty()) d.pop_back();
  d.push_back(2);
  return Shape(d);
}

/// in = {x}. Returns {y, stats}.
std::vector<Tensor> fwd_kernel(const char* name, const std::vector<Tensor>& in, bool log) {
  const Tensor& x = in[0];
  TAPER_ASSERT(x.is_contiguous());
  Tensor y = new_output(x.shape(), x.dtype(), x);
  Tensor stats = new_output(stats_shape(x), stat_dtype(x.dtype()), x);
  const int64_t D = last_dim(x);
  const int64_t R = static_cast<int64_t>(stats.elem_count() / 2);
  if (R == 0) return {y, stats};
  const cudaStream_t st = stream_of(x);
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_integral_v<T>) {
      using C = compute_t<T>;
      if (D == 0) {
        const int dev = x.device().ordinal();
        empty_rows_kernel<C><<<grid_for(static_cast<size_t>(R), dev), kThreads, 0, st>>>(
            ptr<C>(stats), R);
        TAPER_CUDA_CHECK_LAUNCH(name, in);
        return;
      }
      RowArgs<T> a{ptr<const T>(x), nullptr, ptr<T>(y), ptr<C>(stats), R, D, false};
      a.vec = D % kVec<T> == 0 && aligned16(a.x) && aligned16(a.out);
      if (log) run_rows<T, Kind::kFwdLog>(name, in, a, st);
      else run_rows<T, Kind::kFwd>(name, in, a, st);
    }
  });
  return {y, stats};
}

/// in = {x, stats, dy}: the forward's input and saved stats, the upstream gradient. Returns {dx}.
std::vector<Tensor> bwd_kernel(const char* name, const std::vector<Tensor>& in, bool log) {
  const Tensor& x = in[0];
  const Tensor& stats = in[1];
  const Tensor& dy = in[2];
  TAPER_ASSERT(x.is_contiguous() && stats.is_contiguous() && dy.is_contiguous());
  TAPER_ASSERT(x.shape() == dy.shape() && x.dtype() == dy.dtype());
  TAPER_ASSERT(stats.dtype() == stat_dtype(x.dtype()) && stats.shape() == stats_shape(x));
  Tensor dx = new_output(x.shape(), x.dtype(), x);
  const int64_t D = last_dim(x);
  const int64_t R = static_cast<int64_t>(stats.elem_count() / 2);
  if (R == 0 || D == 0) return {dx};
  const cudaStream_t st = stream_of(x);
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_integral_v<T>) {
      using C = compute_t<T>;
      RowArgs<T> a{ptr<const T>(x), ptr<const T>(dy), ptr<T>(dx), ptr<C>(stats), R, D, false};
      a.vec = D % kVec<T> == 0 && aligned16(a.x) && aligned16(a.dy) && aligned16(a.out);
      if (log) run_rows<T, Kind::kBwdLog>(name, in, a, st);
      else run_rows<T, Kind::kBwd>(name, in, a, st);
    }
  });
  return {dx};
}

std::vector<Tensor> softmax_kernel(const std::vector<Tensor>& in, const OpAttrs&) {
  return fwd_kernel("softmax_last_dim", in, false);
}
std::vector<Tensor> log_softmax_kernel(const std::vector<Tensor>& in, const OpAttrs&) {
  return fwd_kernel("log_softmax_last_dim", in, true);
}
std::vector<Tensor> softmax_bwd_kernel(const std::vector<Tensor>& in, const OpAttrs&) {
  return bwd_kernel("softmax_last_dim_bwd", in, false);
}
std::vector<Tensor> log_softmax_bwd_kernel(const std::vector<Tensor>& in, const OpAttrs&) {
  return bwd_kernel("log_softmax_last_dim_bwd", in, true);
}

struct SoftmaxRegistrar {
  SoftmaxRegistrar() {
    register_kernel(OpId::softmax_last_dim, DeviceKind::Cuda, kFloatDTypes, &softmax_kernel,
                    /*needs_contiguous=*/true);
    register_kernel(OpId::log_softmax_last_dim, DeviceKind::Cuda, kFloatDTypes,
                    &log_softmax_kernel, /*needs_contiguous=*/true);
    register_kernel(OpId::softmax_last_dim_bwd, DeviceKind::Cuda, kFloatDTypes,
                    &softmax_bwd_kernel, /*needs_contiguous=*/true);
    register_kernel(OpId::log_softmax_last_dim_bwd, DeviceKind::Cuda, kFloatDTypes,
                    &log_softmax_bwd_kernel, /*needs_contiguous=*/true);
  }
};
const SoftmaxRegistrar g_softmax_registrar;

}  // namespace
}  // namespace taper::cuda
