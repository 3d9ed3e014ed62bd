// attention.cu: CUDA kernels of the fused attention op and its backward op (attention,
// attention_bwd), for bf16, f16, f32 and f64, with the contract of cpu/attention.cpp (which
// states it in full).
//
// What it is: three paths, picked by dtype and head size D.
// - Tensor cores (bf16 D <= 64, f32 D <= 32): blocks of 64 query rows (forward, dq) or key rows
//   (dk, dv), a warp per 16 rows, mma.sync m16n8k16 on bf16 term sums with f32 accumulators;
//   the other side's rows staged in shared memory 64 at a time, 16 bytes a load where the
//   layout allows. The forward is an online softmax (each score computed once).
// - Registers (the other dtypes, D <= 64; f64 D <= 32): a thread per row, its dots FMAs from
//   staged tiles.
// - Plain (larger heads): a block per row, the keys in chunks through shared memory.
// The backward runs dq (and D_t = sum dout * out, kept in a (B, H, T) scratch), then dk and dv,
// each summing over the other side's rows in row order. No (B, H, T, S) tensor, no atomics:
// the same bits every run. Runs 25, 26 and 28 (docs/cuda.md) checked every path against the CPU
// kernels and under compute-sanitizer.
// What it is not: at the tensor cores' rate. Run 28 (ncu, H100) measured the bf16 forward at
// 83 us, dq at 116 us and dk/dv at 147 us at (128, 12, 128, 32): issue-bound on the element-wise
// work between the products (about 50 instructions a score), with 2 to 4 blocks of 4 warps per
// SM (the registers).
//
// Shapes: q (B, H, T, D), k, v (B, H, S, D), any strides; mask broadcast to (B, H, T, S) by
// strides (0 along broadcast dims) or absent; out (B, H, T, D), lse (B, H, T) in the compute
// type C (f32 for bf16/f16/f32, f64 for f64); out, dq, dk, dv stored token major (tok_row).
// Precision: C throughout, each output rounded once at the store (round_to). Special values as
// the CPU: an all -inf row gives NaN (exp(-inf - -inf)), S = 0 gives out 0 and lse -inf.
#include <cmath>
#include <limits>
#include <mutex>
#include <type_traits>
#include <vector>

#include "cuda/cuda_common.cuh"
#include "cuda/vec_io.cuh"

namespace taper::cuda {
namespace {

constexpr int kBlock = 128;    ///< threads per block (a power of two: the reduction tree)
constexpr int kChunk = 256;    ///< keys (forward, dq) or queries (dk, dv) per shared chunk
constexpr int kDGroup = 4;     ///< output dims per thread per pass: kBlock * kDGroup per pass

struct Strides4 {
  int64_t s[4];
};

template <class T> struct AttnArgs {
  const T* q;
  const T* k;
  const T* v;
  const T* mask;  ///< null: none
  const T* o;     ///< backward: the forward output
  const T* dout;  ///< backward
  Strides4 qs, ks, vs, ms, os, dos;
  bool vq, vk, vv, vdo;  ///< the tensor-core path may read q, k, v, dout rows 16 bytes a load
  int64_t nb, nh, nt, ns, nd;  ///< B, H, T, S, D
  double scale;
};

template <class T>
__device__ __forceinline__ const T* at(const T* p, const Strides4& st, int64_t b, int64_t h,
                                       int64_t r) {
  return p + b * st.s[0] + h * st.s[1] + r * st.s[2];
}

/// Offset of row r (of n: T query rows or S key rows) of head (b, h) in an output stored token
/// major, (B, n, H, D) contiguous: out, dq, dk and dv, which the op returns as (B, H, n, D) views,
/// so that merging the heads back, (B, n, H D), is a view too.
__device__ __forceinline__ int64_t tok_row(int64_t b, int64_t h, int64_t r, int64_t n, int64_t nh,
                                           int64_t nd) {
  return ((b * n + r) * nh + h) * nd;
}

/// sum_d x[d] y[d] in C over nd dims of two rows with element strides sx, sy, in d order.
template <class T, class C = compute_t<T>>
__device__ __forceinline__ C strided_dot(const T* x, int64_t sx, const T* y, int64_t sy,
                                         int64_t nd) {
  C r = 0;
  for (int64_t d = 0; d < nd; ++d) r += widen(x[d * sx]) * widen(y[d * sy]);
  return r;
}

/// acc[j] += sum_{i < n} w[i] x(b, h, r0 + i, d_j) in i order, for this thread's kDGroup dims
/// d_j = d0 + tid + j kBlock (those below nd).
template <class T, class C>
__device__ __forceinline__ void add_weighted_rows(C (&acc)[kDGroup], const C* w, int64_t n,
                                                  const T* x, const Strides4& st, int64_t b,
                                                  int64_t h, int64_t r0, int64_t d0, int64_t nd) {
#pragma unroll
  for (int j = 0; j < kDGroup; ++j) {
    const int64_t d = d0 + threadIdx.x + j * kBlock;
    if (d < nd)
      for (int64_t i = 0; i < n; ++i) acc[j] += w[i] * widen(at(x, st, b, h, r0 + i)[d * st.s[3]]);
  }
}

/// scale * (q_t . k_s) + mask[t, s] in C.
template <class T, class C>
__device__ __forceinline__ C score(const AttnArgs<T>& a, int64_t b, int64_t h, int64_t t,
                                   int64_t s) {
  const C dot = strided_dot(at(a.q, a.qs, b, h, t), a.qs.s[3], at(a.k, a.ks, b, h, s), a.ks.s[3],
                            a.nd);
  C x = static_cast<C>(a.scale) * dot;
  if (a.mask) x += widen(at(a.mask, a.ms, b, h, t)[s * a.ms.s[3]]);
  return x;
}

/// Block-wide reduction of one value per thread by a fixed tree (max or sum).
template <class C, bool kMax> __device__ C block_reduce(C v, C* red) {
  red[threadIdx.x] = v;
  __syncthreads();
  for (int w = kBlock / 2; w > 0; w /= 2) {
    if (static_cast<int>(threadIdx.x) < w) {
      const C o = red[threadIdx.x + w];
      const C m = red[threadIdx.x];
      red[threadIdx.x] = kMax ? (o > m ? o : m) : m + o;
    }
    __syncthreads();
  }
  const C r = red[0];
  __syncthreads();
  return r;
}

template <class T> __global__ void __launch_bounds__(kBlock) attn_fwd_kernel(AttnArgs<T> a,
                                                                              T* out,
                                                                              compute_t<T>* lse) {
  using C = compute_t<T>;
  __shared__ C e[kChunk];
  __shared__ C red[kBlock];
  const int64_t row = blockIdx.x;  // (b, h, t)
  const int64_t t = row % a.nt, bh = row / a.nt, b = bh / a.nh, h = bh % a.nh;
  T* orow = out + tok_row(b, h, t, a.nt, a.nh, a.nd);
  if (a.ns == 0) {
    for (int64_t d = threadIdx.x; d < a.nd; d += kBlock) orow[d] = round_to<T>(C(0));
    if (threadIdx.x == 0) lse[row] = -std::numeric_limits<C>::infinity();
    return;
  }
  C m = -std::numeric_limits<C>::infinity();
  for (int64_t s = threadIdx.x; s < a.ns; s += kBlock) {
    const C x = score<T, C>(a, b, h, t, s);
    m = x > m ? x : m;  // a NaN score is found by the sum
  }
  m = block_reduce<C, true>(m, red);
  C sum_part = 0;
  for (int64_t d0 = 0; d0 < a.nd || d0 == 0; d0 += kBlock * kDGroup) {
    C acc[kDGroup];
#pragma unroll
    for (int j = 0; j < kDGroup; ++j) acc[j] = 0;
    for (int64_t c0 = 0; c0 < a.ns; c0 += kChunk) {
      const int64_t n = a.ns - c0 < kChunk ? a.ns - c0 : kChunk;
      for (int64_t i = threadIdx.x; i < n; i += kBlock) {
        const C x = exp(score<T, C>(a, b, h, t, c0 + i) - m);
        e[i] = x;
        if (d0 == 0) sum_part += x;
      }
      __syncthreads();
      add_weighted_rows(acc, e, n, a.v, a.vs, b, h, c0, d0, a.nd);
      __syncthreads();
    }
    if (d0 == 0) sum_part = block_reduce<C, false>(sum_part, red);  // every thread: the row sum
#pragma unroll
    for (int j = 0; j < kDGroup; ++j) {
      const int64_t d = d0 + threadIdx.x + j * kBlock;
      if (d < a.nd) orow[d] = round_to<T>(acc[j] / sum_part);
    }
    if (d0 == 0 && threadIdx.x == 0) lse[row] = m + log(sum_part);
    if (a.nd == 0) break;
  }
}

/// dq rows: dS_s = P_s (dout . v_s - D_t), dq = scale sum_s dS_s k_s; writes D_t to rowdot.
template <class T>
__global__ void __launch_bounds__(kBlock) attn_bwd_dq_kernel(AttnArgs<T> a,
                                                             const compute_t<T>* lse, T* dq,
                                                             compute_t<T>* rowdot) {
  using C = compute_t<T>;
  __shared__ C ds[kChunk];
  __shared__ C red[kBlock];
  const int64_t row = blockIdx.x;
  const int64_t t = row % a.nt, bh = row / a.nt, b = bh / a.nh, h = bh % a.nh;
  const T* go = at(a.dout, a.dos, b, h, t);
  const T* o = at(a.o, a.os, b, h, t);
  C part = 0;
  for (int64_t d = threadIdx.x; d < a.nd; d += kBlock)
    part += widen(go[d * a.dos.s[3]]) * widen(o[d * a.os.s[3]]);
  const C D_t = block_reduce<C, false>(part, red);
  if (threadIdx.x == 0) rowdot[row] = D_t;
  const C l = lse[row];
  T* dqrow = dq + tok_row(b, h, t, a.nt, a.nh, a.nd);
  for (int64_t d0 = 0; d0 < a.nd; d0 += kBlock * kDGroup) {
    C acc[kDGroup];
#pragma unroll
    for (int j = 0; j < kDGroup; ++j) acc[j] = 0;
    for (int64_t c0 = 0; c0 < a.ns; c0 += kChunk) {
      const int64_t n = a.ns - c0 < kChunk ? a.ns - c0 : kChunk;
      for (int64_t i = threadIdx.x; i < n; i += kBlock) {
        const int64_t s = c0 + i;
        const C p = exp(score<T, C>(a, b, h, t, s) - l);
        const C dp = strided_dot(go, a.dos.s[3], at(a.v, a.vs, b, h, s), a.vs.s[3], a.nd);
        ds[i] = p * (dp - D_t);
      }
      __syncthreads();
      add_weighted_rows(acc, ds, n, a.k, a.ks, b, h, c0, d0, a.nd);
      __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < kDGroup; ++j) {
      const int64_t d = d0 + threadIdx.x + j * kBlock;
      if (d < a.nd) dqrow[d] = round_to<T>(static_cast<C>(a.scale) * acc[j]);
    }
  }
}

/// dk, dv rows: dk_s = scale sum_t dS_ts q_t, dv_s = sum_t P_ts dout_t, in t order.
template <class T>
__global__ void __launch_bounds__(kBlock) attn_bwd_dkv_kernel(AttnArgs<T> a,
                                                              const compute_t<T>* lse,
                                                              const compute_t<T>* rowdot, T* dk,
                                                              T* dv) {
  using C = compute_t<T>;
  __shared__ C pc[kChunk];
  __shared__ C dsc[kChunk];
  const int64_t row = blockIdx.x;  // (b, h, s)
  const int64_t s = row % a.ns, bh = row / a.ns, b = bh / a.nh, h = bh % a.nh;
  const T* v = at(a.v, a.vs, b, h, s);
  for (int64_t d0 = 0; d0 < a.nd; d0 += kBlock * kDGroup) {
    C ak[kDGroup], av[kDGroup];
#pragma unroll
    for (int j = 0; j < kDGroup; ++j) ak[j] = av[j] = 0;
    for (int64_t c0 = 0; c0 < a.nt; c0 += kChunk) {
      const int64_t n = a.nt - c0 < kChunk ? a.nt - c0 : kChunk;
      for (int64_t i = threadIdx.x; i < n; i += kBlock) {
        const int64_t t = c0 + i, r = bh * a.nt + t;
        const C p = exp(score<T, C>(a, b, h, t, s) - lse[r]);
        const C dp = strided_dot(at(a.dout, a.dos, b, h, t), a.dos.s[3], v, a.vs.s[3], a.nd);
        pc[i] = p;
        dsc[i] = p * (dp - rowdot[r]);
      }
      __syncthreads();
      add_weighted_rows(ak, dsc, n, a.q, a.qs, b, h, c0, d0, a.nd);
      add_weighted_rows(av, pc, n, a.dout, a.dos, b, h, c0, d0, a.nd);
      __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < kDGroup; ++j) {
      const int64_t d = d0 + threadIdx.x + j * kBlock;
      if (d < a.nd) {
        const int64_t o = tok_row(b, h, s, a.ns, a.nh, a.nd) + d;
        dk[o] = round_to<T>(static_cast<C>(a.scale) * ak[j]);
        dv[o] = round_to<T>(av[j]);
      }
    }
  }
}

// ---- the register path: D <= 64 (kD = 32 or 64; f64 kD = 32) ----------------------------------
// One thread per query row (forward, dq) or key row (dk, dv), its own row and its sums in
// registers (kD values each, zero past D); the rows of the other side staged in shared memory by
// tiles of kTile rows, which every thread of the block reads in the same order (broadcast
// reads). The forward keeps a running max m and sum l (online softmax): a new maximum rescales
// what is summed so far, so the scores are computed once.

constexpr int kRows = 64;  ///< rows per block, one per thread

/// Rows per staged tile: two tiles of 8 KB each.
template <class C, int kD> constexpr int tile_rows() {
  return static_cast<int>(8192 / (kD * sizeof(C)));
}

/// sh[j][d] = x(b, h, r0 + j, d) in C for j < n and d < nd, else 0.
template <class T, class C, int kD, int kTile>
__device__ __forceinline__ void stage(C (*sh)[kD], const T* x, const Strides4& st, int64_t b,
                                      int64_t h, int64_t r0, int64_t n, int64_t nd) {
  for (int e = threadIdx.x; e < kTile * kD; e += blockDim.x) {
    const int j = e / kD, d = e % kD;
    sh[j][d] = j < n && d < nd ? widen(at(x, st, b, h, r0 + j)[d * st.s[3]]) : C(0);
  }
}

/// r[0, kD) = x(b, h, row, d) in C, 0 past nd.
template <class T, class C, int kD>
__device__ __forceinline__ void load_row(C* r, const T* x, const Strides4& st, int64_t b,
                                         int64_t h, int64_t row, int64_t nd) {
  const T* p = at(x, st, b, h, row);
#pragma unroll
  for (int d = 0; d < kD; ++d) r[d] = d < nd ? widen(p[d * st.s[3]]) : C(0);
}

/// a * b + c rounded once (an FMA, also under --fmad=false), as the CPU kernels' MulAdd.
template <class C> __device__ __forceinline__ C fmac(C a, C b, C c) {
  if constexpr (std::is_same_v<C, float>) return __fmaf_rn(a, b, c);
  else return __fma_rn(a, b, c);
}

template <class C, int kD> __device__ __forceinline__ C dot_row(const C* r, const C* sh) {
  C acc = 0;
#pragma unroll
  for (int d = 0; d < kD; ++d) acc = fmac(r[d], sh[d], acc);
  return acc;
}

/// Grid (B H, ceil(T / kRows)). out (B, H, T, D) and lse (B, H, T) contiguous.
template <class T, int kD>
__global__ void __launch_bounds__(kRows) attn_fwd_reg_kernel(AttnArgs<T> a, T* out,
                                                             compute_t<T>* lse) {
  using C = compute_t<T>;
  constexpr int kTile = tile_rows<C, kD>();
  constexpr C kNegInf = -std::numeric_limits<C>::infinity();
  __shared__ __align__(16) C ks[kTile][kD];
  __shared__ __align__(16) C vs[kTile][kD];
  const int64_t bh = blockIdx.x, b = bh / a.nh, h = bh % a.nh;
  const int64_t t = static_cast<int64_t>(blockIdx.y) * kRows + threadIdx.x;
  const bool live = t < a.nt;
  C q[kD], o[kD];
  load_row<T, C, kD>(q, a.q, a.qs, b, h, live ? t : 0, a.nd);
#pragma unroll
  for (int d = 0; d < kD; ++d) o[d] = 0;
  const T* mrow = a.mask ? at(a.mask, a.ms, b, h, live ? t : 0) : nullptr;
  const C scale = static_cast<C>(a.scale);
  C m = kNegInf, l = 0;
  for (int64_t s0 = 0; s0 < a.ns; s0 += kTile) {
    const int n = static_cast<int>(a.ns - s0 < kTile ? a.ns - s0 : kTile);
    __syncthreads();  // every thread is done with the previous tile
    stage<T, C, kD, kTile>(ks, a.k, a.ks, b, h, s0, n, a.nd);
    stage<T, C, kD, kTile>(vs, a.v, a.vs, b, h, s0, n, a.nd);
    __syncthreads();
    if (!live) continue;
    for (int j = 0; j < n; ++j) {
      C x = scale * dot_row<C, kD>(q, ks[j]);
      if (mrow) x += widen(mrow[(s0 + j) * a.ms.s[3]]);
      if (x > m) {  // a new maximum: rescale the sums (by 0 while m is -inf)
        const C c = exp(m - x);
        l *= c;
#pragma unroll
        for (int d = 0; d < kD; ++d) o[d] *= c;
        m = x;
      }
      // A -inf score adds nothing (exp(-inf - max) = 0, also before any finite score); NaN
      // and +inf scores make the sum NaN, as softmax's exp(x - max) does.
      const C p = x == kNegInf ? C(0) : exp(x - m);
      l += p;
#pragma unroll
      for (int d = 0; d < kD; ++d) o[d] = fmac(p, vs[j][d], o[d]);
    }
  }
  if (!live) return;
  const int64_t row = bh * a.nt + t;
  T* orow = out + tok_row(b, h, t, a.nt, a.nh, a.nd);
  if (a.ns == 0) {  // no keys: an empty sum
#pragma unroll
    for (int d = 0; d < kD; ++d)
      if (d < a.nd) orow[d] = round_to<T>(C(0));
    lse[row] = kNegInf;
    return;
  }
  if (m == kNegInf) l = std::numeric_limits<C>::quiet_NaN();  // all -inf: NaN, as softmax
#pragma unroll
  for (int d = 0; d < kD; ++d)
    if (d < a.nd) orow[d] = round_to<T>(o[d] / l);
  lse[row] = m + log(l);
}

/// dq rows and rowdot (D_t = dout_t . out_t); grid (B H, ceil(T / kRows)).
template <class T, int kD>
__global__ void __launch_bounds__(kRows) attn_bwd_dq_reg_kernel(AttnArgs<T> a,
                                                                const compute_t<T>* lse, T* dq,
                                                                compute_t<T>* rowdot) {
  using C = compute_t<T>;
  constexpr int kTile = tile_rows<C, kD>();
  __shared__ __align__(16) C ks[kTile][kD];
  __shared__ __align__(16) C vs[kTile][kD];
  const int64_t bh = blockIdx.x, b = bh / a.nh, h = bh % a.nh;
  const int64_t t = static_cast<int64_t>(blockIdx.y) * kRows + threadIdx.x;
  const bool live = t < a.nt;
  const int64_t tt = live ? t : 0, row = bh * a.nt + tt;
  C q[kD], g[kD], acc[kD];
  load_row<T, C, kD>(q, a.q, a.qs, b, h, tt, a.nd);
  load_row<T, C, kD>(g, a.dout, a.dos, b, h, tt, a.nd);
  load_row<T, C, kD>(acc, a.o, a.os, b, h, tt, a.nd);
  const C D_t = dot_row<C, kD>(g, acc);
#pragma unroll
  for (int d = 0; d < kD; ++d) acc[d] = 0;
  const C l = lse[row];
  const T* mrow = a.mask ? at(a.mask, a.ms, b, h, tt) : nullptr;
  const C scale = static_cast<C>(a.scale);
  for (int64_t s0 = 0; s0 < a.ns; s0 += kTile) {
    const int n = static_cast<int>(a.ns - s0 < kTile ? a.ns - s0 : kTile);
    __syncthreads();
    stage<T, C, kD, kTile>(ks, a.k, a.ks, b, h, s0, n, a.nd);
    stage<T, C, kD, kTile>(vs, a.v, a.vs, b, h, s0, n, a.nd);
    __syncthreads();
    if (!live) continue;
    for (int j = 0; j < n; ++j) {
      C x = scale * dot_row<C, kD>(q, ks[j]);
      if (mrow) x += widen(mrow[(s0 + j) * a.ms.s[3]]);
      const C p = exp(x - l);  // a NaN lse (a NaN forward row): NaN, as the CPU
      const C ds = p * (dot_row<C, kD>(g, vs[j]) - D_t);
#pragma unroll
      for (int d = 0; d < kD; ++d) acc[d] = fmac(ds, ks[j][d], acc[d]);
    }
  }
  if (!live) return;
  rowdot[row] = D_t;
  T* r = dq + tok_row(b, h, t, a.nt, a.nh, a.nd);
#pragma unroll
  for (int d = 0; d < kD; ++d)
    if (d < a.nd) r[d] = round_to<T>(scale * acc[d]);
}

/// dk, dv rows (sums over the query rows in row order); grid (B H, ceil(S / kRows)).
template <class T, int kD>
__global__ void __launch_bounds__(kRows) attn_bwd_dkv_reg_kernel(AttnArgs<T> a,
                                                                 const compute_t<T>* lse,
                                                                 const compute_t<T>* rowdot, T* dk,
                                                                 T* dv) {
  using C = compute_t<T>;
  constexpr int kTile = tile_rows<C, kD>();
  __shared__ __align__(16) C qs[kTile][kD];
  __shared__ __align__(16) C gs[kTile][kD];
  __shared__ C ls[kTile];
  __shared__ C dts[kTile];
  const int64_t bh = blockIdx.x, b = bh / a.nh, h = bh % a.nh;
  const int64_t s = static_cast<int64_t>(blockIdx.y) * kRows + threadIdx.x;
  const bool live = s < a.ns;
  const int64_t ss = live ? s : 0;
  C k[kD], v[kD], ak[kD], av[kD];
  load_row<T, C, kD>(k, a.k, a.ks, b, h, ss, a.nd);
  load_row<T, C, kD>(v, a.v, a.vs, b, h, ss, a.nd);
#pragma unroll
  for (int d = 0; d < kD; ++d) ak[d] = av[d] = 0;
  const C scale = static_cast<C>(a.scale);
  for (int64_t t0 = 0; t0 < a.nt; t0 += kTile) {
    const int n = static_cast<int>(a.nt - t0 < kTile ? a.nt - t0 : kTile);
    __syncthreads();
    stage<T, C, kD, kTile>(qs, a.q, a.qs, b, h, t0, n, a.nd);
    stage<T, C, kD, kTile>(gs, a.dout, a.dos, b, h, t0, n, a.nd);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      ls[i] = lse[bh * a.nt + t0 + i];
      dts[i] = rowdot[bh * a.nt + t0 + i];
    }
    __syncthreads();
    if (!live) continue;
    for (int i = 0; i < n; ++i) {
      C x = scale * dot_row<C, kD>(k, qs[i]);
      if (a.mask) x += widen(at(a.mask, a.ms, b, h, t0 + i)[ss * a.ms.s[3]]);
      const C p = exp(x - ls[i]);
      const C ds = p * (dot_row<C, kD>(v, gs[i]) - dts[i]);
#pragma unroll
      for (int d = 0; d < kD; ++d) {
        ak[d] = fmac(ds, qs[i][d], ak[d]);
        av[d] = fmac(p, gs[i][d], av[d]);
      }
    }
  }
  if (!live) return;
  const int64_t row = tok_row(b, h, s, a.ns, a.nh, a.nd);
#pragma unroll
  for (int d = 0; d < kD; ++d)
    if (d < a.nd) {
      dk[row + d] = round_to<T>(scale * ak[d]);
      dv[row + d] = round_to<T>(av[d]);
    }
}

// ---- the tensor-core path: bf16 (D <= 64) and f32 (D <= 32) -----------------------------------
// The products run on the tensor cores (mma.sync m16n8k16: bf16 operands, f32 accumulators);
// everything else (scale, mask, max, exp, sums, the final division) in f32, as the register
// path. A block is 4 warps; each warp owns 16 query rows (forward, dq) or key rows (dk, dv) and
// keeps their products in the mma's accumulator layout; the other side's rows are staged in
// shared memory in tiles of 64 (as stored for one product, transposed for the other).
// Every operand enters as a sum of bf16 terms, so no product is rounded to a narrower type:
// - a bf16 tensor is one term (exact); an f32 tensor is three, x = t0 + t1 + t2 with
//   t_i = bf16(x - t0 - ... - t_{i-1}), exactly (24 significant bits);
// - the f32 values that feed a second product (the probabilities P, the score gradients dS) are
//   split the same way: two terms for bf16 (16 bits, relative error <= 2^-17, far below the
//   bf16 rounding of the result), three for f32.
// A product of an n-term by an m-term operand sums the term products t_i u_j with
// i + j < max(n, m): 1 for bf16 operands, 2 for P or dS times a bf16 operand, 6 for f32 (the
// products left out are below 2^-24 of the whole, f32's own rounding). Each result is rounded
// once at the store. bf16 has f32's exponent range, so no term overflows where f32 does not.

constexpr int kMmaWarps = 4;
constexpr int kMmaThreads = 32 * kMmaWarps;
constexpr int kMmaRows = 16 * kMmaWarps;  ///< rows a block owns
constexpr int kMmaTile = 64;              ///< rows of the other side per staged tile
constexpr int kTileLd = kMmaTile + 8;     ///< pitch of a transposed tile [d][row]: no bank conflicts
static_assert(kMmaRows == kMmaTile, "a block stages its own rows through a tile buffer");

/// bf16 terms of a tensor operand (1: bf16, 3: f32) and of an f32 intermediate (2: bf16, 3: f32).
template <class T> constexpr int in_terms() { return std::is_same_v<T, bf16> ? 1 : 3; }
template <class T> constexpr int mid_terms() { return std::is_same_v<T, bf16> ? 2 : 3; }

/// Pitch of a row tile [row][d]: kD + 8 elements, so the fragment loads hit 32 different banks.
template <int kD> constexpr int row_ld() { return kD + 8; }
/// Elements of one term plane of a row tile and of a transposed tile.
template <int kD> constexpr int row_plane() { return kMmaTile * row_ld<kD>(); }
template <int kD> constexpr int col_plane() { return kD * kTileLd; }

/// D (16 x 8, f32) += A (16 x 16, bf16, row-major fragment) * B (16 x 8, bf16, column fragment).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// Two adjacent bf16 of shared memory as one 32-bit fragment register (the lower index low).
__device__ __forceinline__ uint32_t ld2(const uint16_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

/// x = t[0] + ... + t[n - 1], t[i] = bf16(x - t[0] - ... - t[i - 1]) (each subtraction exact).
/// The hardware's cvt.rn gives round_to's bits for every x but NaN, whose terms are NaN either
/// way (and so is every result they enter).
template <int n> __device__ __forceinline__ void split_terms(float x, uint16_t (&t)[n]) {
#pragma unroll
  for (int i = 0; i < n; ++i) {
    t[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x));
    x -= __uint_as_float(uint32_t{t[i]} << 16);
  }
}

/// exp(t) of a score minus its row's max or lse: for bf16 data exp_ns_half (vec_io.cuh: within a
/// few f32 ulp, far below the 2^-17 of P's two-term split, three instructions where expf takes
/// about ten); for f32 data expf.
template <class T> __device__ __forceinline__ float attn_exp(float t) {
  if constexpr (std::is_same_v<T, bf16>) return exp_ns_half(t);
  else return expf(t);
}

/// Whether the mask is the same for every query row (stride 0 along T: a (B, 1, 1, S) padding
/// mask): then the kernels read it once per key, not once per score.
template <class T> __device__ __forceinline__ bool mask_per_key(const AttnArgs<T>& a) {
  return a.mask && a.ms.s[2] == 0;
}

/// The A fragments (n terms) of a 16 x 64 f32 block held in 8 accumulator tiles x[8][4]:
/// k-step kk covers columns 16 kk .. 16 kk + 15 (tiles 2 kk and 2 kk + 1).
template <int n>
__device__ __forceinline__ void split_fragments(const float (&x)[8][4], uint32_t (&f)[n][4][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) {  // register r: tile 2 kk + r / 2, elements 2 (r % 2), +1
      float lo = x[2 * kk + r / 2][2 * (r % 2)], hi = x[2 * kk + r / 2][2 * (r % 2) + 1];
#pragma unroll
      for (int i = 0; i < n; ++i) {  // split_terms of both, two per cvt.rn.bf16x2
        const uint32_t w = pack_half2<bf16>(lo, hi);
        f[i][kk][r] = w;
        lo -= __uint_as_float(w << 16);
        hi -= __uint_as_float(w & 0xffff0000u);
      }
    }
}

/// Stores the in_terms<T>() bf16 terms of element (j, d) of a tile into the row tile
/// rows[p * row_plane + j * row_ld + d] and/or the transposed tile
/// cols[p * col_plane + d * kTileLd + j] (either may be null).
template <class T, int kD>
__device__ __forceinline__ void store_terms(uint16_t* rows, uint16_t* cols, int j, int d, T v) {
  constexpr int kTerms = in_terms<T>();
  uint16_t t[kTerms];
  if constexpr (std::is_same_v<T, bf16>) t[0] = v.bits;
  else split_terms<kTerms>(v, t);
#pragma unroll
  for (int p = 0; p < kTerms; ++p) {
    if (rows) rows[p * row_plane<kD>() + j * row_ld<kD>() + d] = t[p];
    if (cols) cols[p * col_plane<kD>() + d * kTileLd + j] = t[p];
  }
}

/// Stages rows r0 .. r0 + 63 of x (0 past n rows or nd dims) into a row tile and/or a
/// transposed tile (store_terms), from one read of x. Where `vec` (unit dim stride, 16-byte
/// aligned rows, nd a multiple of the vector) each thread reads 16 bytes a load and issues all
/// its loads before it stores any; else element by element.
template <class T, int kD>
__device__ __forceinline__ void stage_tile(uint16_t* rows, uint16_t* cols, const T* x,
                                           const Strides4& st, bool vec, int64_t b, int64_t h,
                                           int64_t r0, int64_t n, int64_t nd) {
  if (!vec) {
    for (int e = threadIdx.x; e < kMmaTile * kD; e += blockDim.x) {
      const int j = e / kD, d = e % kD;
      store_terms<T, kD>(rows, cols, j, d, j < n && d < nd ? at(x, st, b, h, r0 + j)[d * st.s[3]] : T{});
    }
    return;
  }
  constexpr int kV = 16 / static_cast<int>(sizeof(T));  ///< elements per 16-byte load
  constexpr int kPerRow = kD / kV;
  constexpr int kLoads = kMmaTile * kPerRow / kMmaThreads;  ///< loads per thread
  static_assert(kLoads * kMmaThreads == kMmaTile * kPerRow, "the tile splits evenly");
  uint4 w[kLoads];
#pragma unroll
  for (int u = 0; u < kLoads; ++u) {
    const int e = static_cast<int>(threadIdx.x) + u * kMmaThreads;
    const int j = e / kPerRow, d0 = e % kPerRow * kV;
    w[u] = make_uint4(0, 0, 0, 0);
    if (j < n && d0 < nd) w[u] = *reinterpret_cast<const uint4*>(at(x, st, b, h, r0 + j) + d0);
  }
#pragma unroll
  for (int u = 0; u < kLoads; ++u) {
    const int e = static_cast<int>(threadIdx.x) + u * kMmaThreads;
    const int j = e / kPerRow, d0 = e % kPerRow * kV;
    if (std::is_same_v<T, bf16> && rows && !cols) {  // one term: the 16 bytes as they are
      // 16-byte aligned: the tile bases, the pitch (kD + 8) * 2 bytes and d0 * 2 bytes are.
      *reinterpret_cast<uint4*>(rows + j * row_ld<kD>() + d0) = w[u];
      continue;
    }
    T v[kV];
    memcpy(v, &w[u], sizeof(v));
#pragma unroll
    for (int k = 0; k < kV; ++k) store_terms<T, kD>(rows, cols, j, d0 + k, v[k]);
  }
}

/// Whether stage_tile may read t's rows 16 bytes at a time.
bool vec_rows(const Tensor& t) {
  const int64_t v = 16 / static_cast<int64_t>(dtype_size(t.dtype()));
  if (t.rank() != 4 || t.strides()[3] != 1 || t.dim(3) % v != 0) return false;
  for (size_t i = 0; i < 3; ++i)
    if (t.dim(static_cast<int64_t>(i)) > 1 && t.strides()[i] % v != 0) return false;
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

/// A fragments (every term) of the 16 rows of a staged row tile starting at row r.
template <class T, int kD>
__device__ __forceinline__ void row_fragments(const uint16_t* sh, int r,
                                              uint32_t (&f)[in_terms<T>()][kD / 16][4]) {
  constexpr int ld = row_ld<kD>();
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
#pragma unroll
  for (int p = 0; p < in_terms<T>(); ++p)
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint16_t* q = sh + p * row_plane<kD>() + (r + g) * ld + 16 * kk + 2 * c;
      f[p][kk][0] = ld2(q);
      f[p][kk][1] = ld2(q + 8 * ld);
      f[p][kk][2] = ld2(q + 8);
      f[p][kk][3] = ld2(q + 8 * ld + 8);
    }
}

/// acc[n] (n < 8) = A (16 x kD) * B where B's column 8 n + g is row 8 n + g of the staged row
/// tile sh (a product with the tile's rows: q k^T, dout v^T, k q^T, v dout^T).
template <class T, int kD>
__device__ __forceinline__ void times_rows(const uint32_t (&a)[in_terms<T>()][kD / 16][4],
                                           const uint16_t* sh, float (&acc)[8][4]) {
  constexpr int ld = row_ld<kD>(), kTerms = in_terms<T>();
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
#pragma unroll
  for (int n = 0; n < 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] = 0.0f;
#pragma unroll
    for (int j = 0; j < kTerms; ++j)
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        const uint16_t* p = sh + j * row_plane<kD>() + (8 * n + g) * ld + 16 * kk + 2 * c;
        const uint32_t b0 = ld2(p), b1 = ld2(p + 8);
#pragma unroll
        for (int i = 0; i + j < kTerms; ++i) mma_bf16(acc[n], a[i][kk], b0, b1);
      }
  }
}

/// acc[n] (n < kD / 8) += X (16 x 64, as mid_terms<T>() fragments) * the 64 x kD tile staged
/// transposed in sh (plane p: sh[p * col_plane + d * kTileLd + j] = term p of row j, dim d).
template <class T, int kD>
__device__ __forceinline__ void accumulate_cols(const uint32_t (&x)[mid_terms<T>()][4][4],
                                                const uint16_t* sh, float (&acc)[kD / 8][4]) {
  constexpr int kMid = mid_terms<T>(), kIn = in_terms<T>();
  constexpr int kMax = kMid > kIn ? kMid : kIn;
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
#pragma unroll
  for (int n = 0; n < kD / 8; ++n)
#pragma unroll
    for (int j = 0; j < kIn; ++j)
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint16_t* p = sh + j * col_plane<kD>() + (8 * n + g) * kTileLd + 16 * kk + 2 * c;
        const uint32_t b0 = ld2(p), b1 = ld2(p + 8);
#pragma unroll
        for (int i = 0; i < kMid && i + j < kMax; ++i) mma_bf16(acc[n], x[i][kk], b0, b1);
      }
}

/// Max (NaN ignored, as the register path's x > m) and sum over the 4 threads of a quad, which
/// hold one row between them; a fixed butterfly, so the same bits every run.
__device__ __forceinline__ float quad_max(float v) {
#pragma unroll
  for (int o = 1; o < 4; o *= 2) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}
__device__ __forceinline__ float quad_sum(float v) {
#pragma unroll
  for (int o = 1; o < 4; o *= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/// Dynamic shared memory of each kernel, in bytes (forward and dq: the tiles, then a tile's
/// mask values when mask_per_key).
template <class T, int kD> constexpr int fwd_smem() {
  return 2 * in_terms<T>() * (row_plane<kD>() + col_plane<kD>()) +
         kMmaTile * static_cast<int>(sizeof(float));
}
template <class T, int kD> constexpr int dq_smem() {
  return 2 * in_terms<T>() * (2 * row_plane<kD>() + col_plane<kD>()) +
         kMmaTile * static_cast<int>(sizeof(float));
}

/// mk[i] = the mask at key s0 + i (i < n) of head (b, h), for mask_per_key.
template <class T>
__device__ __forceinline__ void stage_key_mask(float* mk, const AttnArgs<T>& a, int64_t b,
                                               int64_t h, int64_t s0, int n) {
  const T* m = at(a.mask, a.ms, b, h, 0);
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    mk[i] = static_cast<float>(widen(m[(s0 + i) * a.ms.s[3]]));
}
template <class T, int kD> constexpr int dkv_smem() {
  return 2 * in_terms<T>() * (2 * row_plane<kD>() + 2 * col_plane<kD>()) +
         2 * kMmaTile * static_cast<int>(sizeof(float));
}

/// Grid (B H, ceil(T / 64)), 128 threads. out (B, H, T, D), lse (B, H, T) contiguous.
template <class T, int kD>
__global__ void __launch_bounds__(kMmaThreads) attn_fwd_mma_kernel(AttnArgs<T> a, T* out,
                                                                   float* lse) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* ksh = smem;                                      // k rows (and q's, first)
  uint16_t* vt = smem + in_terms<T>() * row_plane<kD>();     // v, transposed
  float* mk = reinterpret_cast<float*>(vt + in_terms<T>() * col_plane<kD>());
  const bool per_key = mask_per_key(a);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int64_t bh = blockIdx.x, b = bh / a.nh, h = bh % a.nh;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kMmaRows;
  stage_tile<T, kD>(ksh, nullptr, a.q, a.qs, a.vq, b, h, t0, a.nt - t0, a.nd);
  __syncthreads();
  uint32_t qf[in_terms<T>()][kD / 16][4];
  row_fragments<T, kD>(ksh, 16 * warp, qf);
  const int64_t tr[2] = {t0 + 16 * warp + g, t0 + 16 * warp + g + 8};  // this thread's rows
  const T* mrow[2] = {nullptr, nullptr};  // the mask rows, read per score unless per_key
  for (int i = 0; i < 2; ++i)
    if (a.mask && !per_key && tr[i] < a.nt) mrow[i] = at(a.mask, a.ms, b, h, tr[i]);
  const float scale = static_cast<float>(a.scale);
  float o[kD / 8][4] = {};
  float m[2] = {kNegInf, kNegInf}, l[2] = {0.0f, 0.0f};
  for (int64_t s0 = 0; s0 < a.ns; s0 += kMmaTile) {
    const int n = static_cast<int>(a.ns - s0 < kMmaTile ? a.ns - s0 : kMmaTile);
    __syncthreads();  // every warp is done with the previous tile (and with q's staging)
    stage_tile<T, kD>(ksh, nullptr, a.k, a.ks, a.vk, b, h, s0, n, a.nd);
    stage_tile<T, kD>(nullptr, vt, a.v, a.vs, a.vv, b, h, s0, n, a.nd);
    if (per_key) stage_key_mask(mk, a, b, h, s0, n);
    __syncthreads();
    float x[8][4];
    times_rows<T, kD>(qf, ksh, x);
    float tmax[2] = {kNegInf, kNegInf};
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = e / 2, col = 8 * j + 2 * c + (e & 1);
        float v = kNegInf;  // a key past S adds nothing
        if (col < n) {
          v = scale * x[j][e];
          if (per_key) v += mk[col];
          else if (mrow[i]) v += static_cast<float>(widen(mrow[i][(s0 + col) * a.ms.s[3]]));
        }
        x[j][e] = v;
        tmax[i] = v > tmax[i] ? v : tmax[i];
      }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float mn = quad_max(tmax[i]);
      if (mn > m[i]) {  // a new maximum: rescale the sums (by 0 while m is -inf)
        const float r = attn_exp<T>(m[i] - mn);
        l[i] *= r;
#pragma unroll
        for (int j = 0; j < kD / 8; ++j) {
          o[j][2 * i] *= r;
          o[j][2 * i + 1] *= r;
        }
        m[i] = mn;
      }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        // A -inf score adds nothing; NaN and +inf scores make the sum NaN, as softmax's.
        const float p = x[j][e] == kNegInf ? 0.0f : attn_exp<T>(x[j][e] - m[e / 2]);
        l[e / 2] += p;
        x[j][e] = p;
      }
    uint32_t pf[mid_terms<T>()][4][4];
    split_fragments<mid_terms<T>()>(x, pf);
    accumulate_cols<T, kD>(pf, vt, o);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float li = quad_sum(l[i]);
    if (tr[i] >= a.nt) continue;
    const int64_t row = bh * a.nt + tr[i];
    T* orow = out + tok_row(b, h, tr[i], a.nt, a.nh, a.nd);
    if (a.ns == 0) {  // no keys: an empty sum
#pragma unroll
      for (int j = 0; j < kD / 8; ++j)
        for (int e = 0; e < 2; ++e)
          if (8 * j + 2 * c + e < a.nd) orow[8 * j + 2 * c + e] = round_to<T>(0.0f);
      if (c == 0) lse[row] = kNegInf;
      continue;
    }
    if (m[i] == kNegInf) li = std::numeric_limits<float>::quiet_NaN();  // all -inf: NaN
#pragma unroll
    for (int j = 0; j < kD / 8; ++j)
      for (int e = 0; e < 2; ++e)
        if (8 * j + 2 * c + e < a.nd) orow[8 * j + 2 * c + e] = round_to<T>(o[j][2 * i + e] / li);
    if (c == 0) lse[row] = m[i] + logf(li);
  }
}

/// dq rows and rowdot (D_t = dout_t . out_t); grid (B H, ceil(T / 64)), 128 threads.
template <class T, int kD>
__global__ void __launch_bounds__(kMmaThreads) attn_bwd_dq_mma_kernel(AttnArgs<T> a,
                                                                      const float* lse, T* dq,
                                                                      float* rowdot) {
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* ksh = smem;                                      // k rows (q's, first)
  uint16_t* vsh = smem + in_terms<T>() * row_plane<kD>();    // v rows (dout's, first)
  uint16_t* kt = smem + 2 * in_terms<T>() * row_plane<kD>(); // k, transposed
  float* mk = reinterpret_cast<float*>(kt + in_terms<T>() * col_plane<kD>());
  const bool per_key = mask_per_key(a);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int64_t bh = blockIdx.x, b = bh / a.nh, h = bh % a.nh;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kMmaRows;
  stage_tile<T, kD>(ksh, nullptr, a.q, a.qs, a.vq, b, h, t0, a.nt - t0, a.nd);
  stage_tile<T, kD>(vsh, nullptr, a.dout, a.dos, a.vdo, b, h, t0, a.nt - t0, a.nd);
  __syncthreads();
  uint32_t qf[in_terms<T>()][kD / 16][4], gf[in_terms<T>()][kD / 16][4];
  row_fragments<T, kD>(ksh, 16 * warp, qf);
  row_fragments<T, kD>(vsh, 16 * warp, gf);
  const int64_t tr[2] = {t0 + 16 * warp + g, t0 + 16 * warp + g + 8};
  float dt[2], lr[2];
  const T* mrow[2] = {nullptr, nullptr};
  for (int i = 0; i < 2; ++i) {
    const bool live = tr[i] < a.nt;
    // D_t: the quad's four threads take dims c, c + 4, ...; then a fixed butterfly.
    float part = 0.0f;
    if (live) {
      const T* go = at(a.dout, a.dos, b, h, tr[i]);
      const T* ob = at(a.o, a.os, b, h, tr[i]);
      for (int64_t d = c; d < a.nd; d += 4)
        part = fmac(static_cast<float>(widen(go[d * a.dos.s[3]])),
                    static_cast<float>(widen(ob[d * a.os.s[3]])), part);
    }
    dt[i] = quad_sum(part);
    lr[i] = live ? lse[bh * a.nt + tr[i]] : 0.0f;
    if (a.mask && !per_key && live) mrow[i] = at(a.mask, a.ms, b, h, tr[i]);
  }
  const float scale = static_cast<float>(a.scale);
  float acc[kD / 8][4] = {};
  for (int64_t s0 = 0; s0 < a.ns; s0 += kMmaTile) {
    const int n = static_cast<int>(a.ns - s0 < kMmaTile ? a.ns - s0 : kMmaTile);
    __syncthreads();
    stage_tile<T, kD>(ksh, kt, a.k, a.ks, a.vk, b, h, s0, n, a.nd);
    stage_tile<T, kD>(vsh, nullptr, a.v, a.vs, a.vv, b, h, s0, n, a.nd);
    if (per_key) stage_key_mask(mk, a, b, h, s0, n);
    __syncthreads();
    float x[8][4], dp[8][4];
    times_rows<T, kD>(qf, ksh, x);
    times_rows<T, kD>(gf, vsh, dp);
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = e / 2, col = 8 * j + 2 * c + (e & 1);
        float ds = 0.0f;  // a key past S adds nothing
        if (col < n) {
          float v = scale * x[j][e];
          if (per_key) v += mk[col];
          else if (mrow[i]) v += static_cast<float>(widen(mrow[i][(s0 + col) * a.ms.s[3]]));
          const float p = attn_exp<T>(v - lr[i]);  // a NaN lse (a NaN forward row): NaN
          ds = p * (dp[j][e] - dt[i]);
        }
        x[j][e] = ds;
      }
    uint32_t sf[mid_terms<T>()][4][4];
    split_fragments<mid_terms<T>()>(x, sf);
    accumulate_cols<T, kD>(sf, kt, acc);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (tr[i] >= a.nt) continue;
    const int64_t row = bh * a.nt + tr[i];
    if (c == 0) rowdot[row] = dt[i];
    T* r = dq + tok_row(b, h, tr[i], a.nt, a.nh, a.nd);
#pragma unroll
    for (int j = 0; j < kD / 8; ++j)
      for (int e = 0; e < 2; ++e)
        if (8 * j + 2 * c + e < a.nd) r[8 * j + 2 * c + e] = round_to<T>(scale * acc[j][2 * i + e]);
  }
}

/// dk, dv rows; grid (B H, ceil(S / 64)), 128 threads. Each warp's 16 key rows meet the query
/// rows a tile at a time: S^T = k q^T, P^T, dP^T = v dout^T, dS^T; dv += P^T dout, dk += dS^T q.
template <class T, int kD>
__global__ void __launch_bounds__(kMmaThreads) attn_bwd_dkv_mma_kernel(AttnArgs<T> a,
                                                                       const float* lse,
                                                                       const float* rowdot,
                                                                       T* dk, T* dv) {
  constexpr int kIn = in_terms<T>();
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* qsh = smem;                                  // q rows (k's, first)
  uint16_t* gsh = qsh + kIn * row_plane<kD>();           // dout rows (v's, first)
  uint16_t* qt = gsh + kIn * row_plane<kD>();            // q, transposed
  uint16_t* gt = qt + kIn * col_plane<kD>();             // dout, transposed
  float* ls = reinterpret_cast<float*>(gt + kIn * col_plane<kD>());
  float* dts = ls + kMmaTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int64_t bh = blockIdx.x, b = bh / a.nh, h = bh % a.nh;
  const int64_t s0 = static_cast<int64_t>(blockIdx.y) * kMmaRows;
  stage_tile<T, kD>(qsh, nullptr, a.k, a.ks, a.vk, b, h, s0, a.ns - s0, a.nd);
  stage_tile<T, kD>(gsh, nullptr, a.v, a.vs, a.vv, b, h, s0, a.ns - s0, a.nd);
  __syncthreads();
  uint32_t kf[kIn][kD / 16][4], vf[kIn][kD / 16][4];
  row_fragments<T, kD>(qsh, 16 * warp, kf);
  row_fragments<T, kD>(gsh, 16 * warp, vf);
  const int64_t sr[2] = {s0 + 16 * warp + g, s0 + 16 * warp + g + 8};  // this thread's keys
  const int64_t sc[2] = {sr[0] < a.ns ? sr[0] : 0, sr[1] < a.ns ? sr[1] : 0};
  const bool per_key = mask_per_key(a);
  float mkey[2] = {0.0f, 0.0f};  // per_key: this thread's keys' mask values, for every query
  if (per_key)
    for (int i = 0; i < 2; ++i)
      mkey[i] = static_cast<float>(widen(at(a.mask, a.ms, b, h, 0)[sc[i] * a.ms.s[3]]));
  const float scale = static_cast<float>(a.scale);
  float ak[kD / 8][4] = {}, av[kD / 8][4] = {};
  for (int64_t t0 = 0; t0 < a.nt; t0 += kMmaTile) {
    const int n = static_cast<int>(a.nt - t0 < kMmaTile ? a.nt - t0 : kMmaTile);
    __syncthreads();
    stage_tile<T, kD>(qsh, qt, a.q, a.qs, a.vq, b, h, t0, n, a.nd);
    stage_tile<T, kD>(gsh, gt, a.dout, a.dos, a.vdo, b, h, t0, n, a.nd);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      ls[i] = lse[bh * a.nt + t0 + i];
      dts[i] = rowdot[bh * a.nt + t0 + i];
    }
    __syncthreads();
    float x[8][4], dp[8][4];
    times_rows<T, kD>(kf, qsh, x);
    times_rows<T, kD>(vf, gsh, dp);
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = e / 2, col = 8 * j + 2 * c + (e & 1);
        float p = 0.0f, ds = 0.0f;  // a query past T adds nothing
        if (col < n) {
          float v = scale * x[j][e];
          if (per_key) v += mkey[i];
          else if (a.mask) v += static_cast<float>(widen(at(a.mask, a.ms, b, h, t0 + col)[sc[i] * a.ms.s[3]]));
          p = attn_exp<T>(v - ls[col]);
          ds = p * (dp[j][e] - dts[col]);
        }
        x[j][e] = p;
        dp[j][e] = ds;
      }
    uint32_t f[mid_terms<T>()][4][4];
    split_fragments<mid_terms<T>()>(x, f);
    accumulate_cols<T, kD>(f, gt, av);
    split_fragments<mid_terms<T>()>(dp, f);
    accumulate_cols<T, kD>(f, qt, ak);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (sr[i] >= a.ns) continue;
    const int64_t row = tok_row(b, h, sr[i], a.ns, a.nh, a.nd);
#pragma unroll
    for (int j = 0; j < kD / 8; ++j)
      for (int e = 0; e < 2; ++e) {
        const int d = 8 * j + 2 * c + e;
        if (d < a.nd) {
          dk[row + d] = round_to<T>(scale * ak[j][2 * i + e]);
          dv[row + d] = round_to<T>(av[j][2 * i + e]);
        }
      }
  }
}

/// The tensor-core path's kD for head size nd (0: none): bf16 32 or 64, f32 32 (its three
/// terms of 64 dims would not stay in registers); f16 and f64 take the register path.
template <class T> int mma_head(int64_t nd) {
  if constexpr (std::is_same_v<T, bf16>) return nd <= 32 ? 32 : (nd <= 64 ? 64 : 0);
  else if constexpr (std::is_same_v<T, float>) return nd <= 32 ? 32 : 0;
  else return 0;
}

dim3 mma_grid(int64_t bh, int64_t rows) {
  return dim3(static_cast<unsigned>(bh), static_cast<unsigned>(ceil_div(rows, kMmaRows)));
}

/// Launches kKernel with `bytes` of dynamic shared memory. Past the default 48 KB the kernel's
/// limit is raised first, once per device: on the first launch there, which runs eagerly (a
/// training step is captured into a CUDA graph only after an eager one).
template <auto kKernel, class... Args>
void launch_mma(int bytes, dim3 grid, cudaStream_t st, int ordinal, Args... args) {
  if (bytes > 48 * 1024) {
    static std::mutex mu;
    static std::vector<bool> raised;  // per device ordinal
    std::lock_guard<std::mutex> g(mu);
    if (raised.size() <= static_cast<size_t>(ordinal)) raised.resize(static_cast<size_t>(ordinal) + 1);
    if (!raised[static_cast<size_t>(ordinal)]) {
      TAPER_CUDA_CHECK(
          cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
      raised[static_cast<size_t>(ordinal)] = true;
    }
  }
  kKernel<<<grid, kMmaThreads, static_cast<size_t>(bytes), st>>>(args...);
}

/// The tensor-core forward and backward for head kD (the current device is `ordinal`).
template <class T, int kD>
void run_fwd_mma(const AttnArgs<T>& a, T* out, float* lse, cudaStream_t st, int ordinal) {
  launch_mma<attn_fwd_mma_kernel<T, kD>>(fwd_smem<T, kD>(), mma_grid(a.nb * a.nh, a.nt), st,
                                         ordinal, a, out, lse);
}
template <class T, int kD>
void run_bwd_mma(const AttnArgs<T>& a, const float* lse, T* dq, T* dk, T* dv, float* rowdot,
                 cudaStream_t st, int ordinal, const std::vector<Tensor>& in) {
  launch_mma<attn_bwd_dq_mma_kernel<T, kD>>(dq_smem<T, kD>(), mma_grid(a.nb * a.nh, a.nt), st,
                                            ordinal, a, lse, dq, rowdot);
  TAPER_CUDA_CHECK_LAUNCH("attention_bwd", in);
  if (a.ns > 0) {
    launch_mma<attn_bwd_dkv_mma_kernel<T, kD>>(dkv_smem<T, kD>(), mma_grid(a.nb * a.nh, a.ns), st,
                                               ordinal, a, lse, static_cast<const float*>(rowdot),
                                               dk, dv);
    TAPER_CUDA_CHECK_LAUNCH("attention_bwd", in);
  }
}

/// The register path's kD for head size nd (0: none, the plain kernels): 32 or 64; f64 32 only
/// (its four rows of 64 doubles would not stay in registers).
template <class T> int reg_head(int64_t nd) {
  if (nd <= 32) return 32;
  if (nd <= 64 && !std::is_same_v<T, double>) return 64;
  return 0;
}

dim3 reg_grid(int64_t bh, int64_t rows) {
  return dim3(static_cast<unsigned>(bh), static_cast<unsigned>(ceil_div(rows, kRows)));
}

Strides4 strides4(const Tensor& t) {
  Strides4 r{};
  for (size_t i = 0; i < 4; ++i) r.s[i] = t.strides()[i];
  return r;
}
/// The mask's strides over (B, H, T, S): its own, 0 along broadcast (size-1 or missing) dims.
Strides4 mask_strides(const Tensor& m) {
  Strides4 r{};
  const size_t lead = 4 - m.rank();
  for (size_t i = 0; i < 4; ++i)
    r.s[i] = i < lead || m.dim(static_cast<int64_t>(i - lead)) == 1 ? 0 : m.strides()[i - lead];
  return r;
}

template <class T> AttnArgs<T> make_args(const std::vector<Tensor>& in, const OpAttrs& attrs) {
  const Tensor &q = in[0], &k = in[1], &v = in[2];
  AttnArgs<T> a{};
  a.q = ptr<const T>(q);
  a.k = ptr<const T>(k);
  a.v = ptr<const T>(v);
  a.qs = strides4(q);
  a.ks = strides4(k);
  a.vs = strides4(v);
  a.vq = vec_rows(q);
  a.vk = vec_rows(k);
  a.vv = vec_rows(v);
  if (present(in, 3)) {
    a.mask = ptr<const T>(in[3]);
    a.ms = mask_strides(in[3]);
  }
  a.nb = static_cast<int64_t>(q.dim(0));
  a.nh = static_cast<int64_t>(q.dim(1));
  a.nt = static_cast<int64_t>(q.dim(2));
  a.nd = static_cast<int64_t>(q.dim(3));
  a.ns = static_cast<int64_t>(k.dim(2));
  a.scale = attrs.f0;
  return a;
}

/// A new (B, H, n, D) output shaped as x, stored token major (tok_row).
Tensor token_major(const Tensor& x) {
  return new_output(Shape({x.dim(0), x.dim(2), x.dim(1), x.dim(3)}), x.dtype(), x)
      .permute({0, 2, 1, 3});
}

/// in = {q, k, v, mask or undefined}. Returns {out, lse}.
std::vector<Tensor> attention_kernel(const std::vector<Tensor>& in, const OpAttrs& attrs) {
  const Tensor& q = in[0];
  TAPER_ASSERT(q.rank() == 4 && in[1].rank() == 4 && in[1].shape() == in[2].shape());
  Tensor out = token_major(q);
  Tensor lse = new_output(Shape({q.dim(0), q.dim(1), q.dim(2)}), stat_dtype(q.dtype()), q);
  const size_t rows = q.dim(0) * q.dim(1) * q.dim(2);
  if (rows == 0) return {out, lse};
  const cudaStream_t st = stream_of(q);
  visit_dtype(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_integral_v<T>) {
      const AttnArgs<T> a = make_args<T>(in, attrs);
      if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, float>) {
        const int mh = mma_head<T>(a.nd);
        const int ord = q.device().ordinal();
        if (mh == 32) run_fwd_mma<T, 32>(a, ptr<T>(out), ptr<float>(lse), st, ord);
        if constexpr (std::is_same_v<T, bf16>)
          if (mh == 64) run_fwd_mma<T, 64>(a, ptr<T>(out), ptr<float>(lse), st, ord);
        if (mh != 0) {
          TAPER_CUDA_CHECK_LAUNCH("attention", in);
          return;
        }
      }
      const dim3 grid = reg_grid(a.nb * a.nh, a.nt);
      switch (reg_head<T>(a.nd)) {
        case 32:
          attn_fwd_reg_kernel<T, 32><<<grid, kRows, 0, st>>>(a, ptr<T>(out), ptr<compute_t<T>>(lse));
          break;
        case 64:
          if constexpr (!std::is_same_v<T, double>)
            attn_fwd_reg_kernel<T, 64><<<grid, kRows, 0, st>>>(a, ptr<T>(out), ptr<compute_t<T>>(lse));
          break;
        default:
          attn_fwd_kernel<T><<<static_cast<unsigned>(rows), kBlock, 0, st>>>(
              a, ptr<T>(out), ptr<compute_t<T>>(lse));
      }
      TAPER_CUDA_CHECK_LAUNCH("attention", in);
    }
  });
  return {out, lse};
}

/// in = {q, k, v, mask or undefined, out, lse, dout}. Returns {dq, dk, dv}.
std::vector<Tensor> attention_bwd_kernel(const std::vector<Tensor>& in, const OpAttrs& attrs) {
  const Tensor &q = in[0], &k = in[1], &v = in[2];
  TAPER_ASSERT(in[4].shape() == q.shape() && in[6].shape() == q.shape());
  TAPER_ASSERT(in[5].dtype() == stat_dtype(q.dtype()) && in[5].is_contiguous());
  Tensor dq = token_major(q);
  Tensor dk = token_major(k);
  Tensor dv = token_major(v);
  const size_t qrows = q.dim(0) * q.dim(1) * q.dim(2);
  const size_t krows = k.dim(0) * k.dim(1) * k.dim(2);
  if (q.dim(2) == 0) {  // no query rows: dk and dv are empty sums
    return {dq, Tensor::zeros(k.shape(), k.dtype(), k.device()),
            Tensor::zeros(v.shape(), v.dtype(), v.device())};
  }
  if (qrows == 0) return {dq, dk, dv};
  Tensor rowdot = new_output(Shape({q.dim(0), q.dim(1), q.dim(2)}), stat_dtype(q.dtype()), q);
  const cudaStream_t st = stream_of(q);
  visit_dtype(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_integral_v<T>) {
      using C = compute_t<T>;
      AttnArgs<T> a = make_args<T>(in, attrs);
      a.o = ptr<const T>(in[4]);
      a.os = strides4(in[4]);
      a.dout = ptr<const T>(in[6]);
      a.dos = strides4(in[6]);
      a.vdo = vec_rows(in[6]);
      const C* l = ptr<const C>(in[5]);
      if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, float>) {
        const int mh = mma_head<T>(a.nd);
        const int ord = q.device().ordinal();
        if (mh == 32)
          run_bwd_mma<T, 32>(a, l, ptr<T>(dq), ptr<T>(dk), ptr<T>(dv), ptr<C>(rowdot), st, ord, in);
        if constexpr (std::is_same_v<T, bf16>)
          if (mh == 64)
            run_bwd_mma<T, 64>(a, l, ptr<T>(dq), ptr<T>(dk), ptr<T>(dv), ptr<C>(rowdot), st, ord, in);
        if (mh != 0) return;
      }
      const int head = reg_head<T>(a.nd);
      const dim3 qgrid = reg_grid(a.nb * a.nh, a.nt), kgrid = reg_grid(a.nb * a.nh, a.ns);
      if (head == 32) {
        attn_bwd_dq_reg_kernel<T, 32><<<qgrid, kRows, 0, st>>>(a, l, ptr<T>(dq), ptr<C>(rowdot));
      } else if constexpr (!std::is_same_v<T, double>) {
        if (head == 64)
          attn_bwd_dq_reg_kernel<T, 64><<<qgrid, kRows, 0, st>>>(a, l, ptr<T>(dq), ptr<C>(rowdot));
      }
      if (head == 0)
        attn_bwd_dq_kernel<T><<<static_cast<unsigned>(qrows), kBlock, 0, st>>>(
            a, l, ptr<T>(dq), ptr<C>(rowdot));
      TAPER_CUDA_CHECK_LAUNCH("attention_bwd", in);
      if (krows > 0) {
        if (head == 32) {
          attn_bwd_dkv_reg_kernel<T, 32><<<kgrid, kRows, 0, st>>>(a, l, ptr<const C>(rowdot),
                                                                   ptr<T>(dk), ptr<T>(dv));
        } else if constexpr (!std::is_same_v<T, double>) {
          if (head == 64)
            attn_bwd_dkv_reg_kernel<T, 64><<<kgrid, kRows, 0, st>>>(a, l, ptr<const C>(rowdot),
                                                                     ptr<T>(dk), ptr<T>(dv));
        }
        if (head == 0)
          attn_bwd_dkv_kernel<T><<<static_cast<unsigned>(krows), kBlock, 0, st>>>(
              a, l, ptr<const C>(rowdot), ptr<T>(dk), ptr<T>(dv));
        TAPER_CUDA_CHECK_LAUNCH("attention_bwd", in);
      }
    }
  });
  return {dq, dk, dv};
}

struct AttentionRegistrar {
  AttentionRegistrar() {
    register_kernel(OpId::attention, DeviceKind::Cuda, kFloatDTypes, &attention_kernel);
    register_kernel(OpId::attention_bwd, DeviceKind::Cuda, kFloatDTypes, &attention_bwd_kernel);
  }
};
const AttentionRegistrar g_attention_registrar;

}  // namespace
}  // namespace taper::cuda
