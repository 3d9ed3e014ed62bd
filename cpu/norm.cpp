// norm.cpp: Highway kernels of rms_norm, layer_norm and group_norm and of their dedicated
// backward ops (rms_norm_bwd, layer_norm_bwd, group_norm_bwd), for bf16, f16, f32 and f64. Each
// forward returns y and the statistics the backward reads (rstd; mean and rstd).
//
// What it is: one "row" abstraction for all three: a contiguous run of L elements with its own
// statistics (layer/rms: a row of the last dim; group norm: the C/G channels x S positions of one
// (n, group), contiguous in (N, C, S)). Rows are threaded; when there are fewer rows than threads
// (group norm (1, 16, 256, 256) with 4 groups) each row is cut into chunks whose two-pass
// statistics are merged with Chan's formula, then the chunks are normalised in parallel.
// The backward (see "backward" below for its plan and the bytes it moves) computes, per row of
// M = L elements with d = x - mean (rms: d = x) and rho = rstd, in the compute type:
//   u = dy * rho, c = sum(u * w) / M (rms: 0), k = rho^2 sum(u * d * w) / M,
//   dx = u * w - d * k - c (rounded once), dw = sum over rows of u * d, db = sum over rows of dy,
// the same formulas as the composed forms (metal_fallback/composed.cpp), which are its reference.
// What it is not: autograd (the bwd hooks in core/ call the *_bwd ops), or the composed forms.
// The scalar reference is tests/ref/fused_ref.h.
//
// Shapes: rms/layer: x, y, dy, dx (R, D), w, b, dw, db (D) or empty, mean/rstd (R). group: x, y,
// dy, dx (N, C, S), w, b, dw, db (C) or empty, mean/rstd (N, G).
// Precision: bf16/f16 load to f32 and round once at the store; statistics are f32 for bf16, f16
// and f32 (never rounded to the input type) and f64 for f64. Variance is two-pass within each
// chunk (chunks of at most kStatChunk, so the second pass reads cache) and Chan-merged across
// chunks; never E[x^2] - E[x]^2. The backward's sums (row dots, dw, db) are f32 (f64 for f64)
// and reduced in an order fixed by the shape alone: the same bits for every thread count.

#ifndef TAPER_CPU_NORM_SHARED_
#define TAPER_CPU_NORM_SHARED_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "cpu/cpu_common.h"
#include "taper/dtype.h"
#include "taper/op.h"

namespace taper::cpu::norm_detail {

enum class Kind : int { kRms, kLayer, kGroup };

/// What a dispatched call does with its item range (as in softmax.cpp).
enum class Phase : int {
  kRows,   ///< items are whole rows: statistics, then normalise while the row is in cache
  kStats,  ///< items are (row, chunk): the chunk's mean and M2 (rms: sum of squares)
  kWrite,  ///< items are (row, chunk): normalise the chunk with the row's statistics
};

/// One norm job; pointers are element 0 of contiguous tensors (w/b null for no affine).
struct Job {
  DType dt = DType::F32;
  Kind kind = Kind::kLayer;
  const void* x = nullptr;
  const void* w = nullptr;
  const void* b = nullptr;
  void* y = nullptr;
  void* mean = nullptr;  ///< (R) compute-type statistics (float, or double for f64); null for rms
  void* rstd = nullptr;  ///< (R)
  size_t L = 0;          ///< row length (group: C/G * S)
  size_t S = 1;          ///< group: spatial size (a channel's run inside the row)
  size_t G = 1;          ///< group: groups per sample; row r starts at channel (r % G) * L / S
  double eps = 0;
  size_t chunk = 0;      ///< kStats/kWrite: chunk length; item = row * nchunks + chunk index
  size_t nchunks = 1;
  double* part_mean = nullptr;  ///< per item
  double* part_m2 = nullptr;    ///< per item (rms: sum of squares)
  bool stream = false;          ///< y is written with streaming stores (kStreamStoreBytes)
};

/// Statistics are computed over chunks of at most this many elements (two passes over L1/L2).
inline constexpr size_t kStatChunk = 8192;

/// Chan's merge of (count, mean, M2) partials.
template <class C> struct MeanM2 {
  double n = 0;
  C mean = 0, m2 = 0;
  void add(double nb, C mb, C m2b) {
    if (nb == 0) return;
    if (n == 0) {
      n = nb;
      mean = mb;
      m2 = m2b;
      return;
    }
    const double nt = n + nb;
    const C delta = mb - mean;
    mean += delta * static_cast<C>(nb / nt);
    m2 += m2b + delta * delta * static_cast<C>(n * nb / nt);
    n = nt;
  }
};

/// 1 / sqrt(v + eps), in the compute type.
template <class C> inline C rstd_of(C v, double eps) {
  return C(1) / std::sqrt(v + static_cast<C>(eps));
}

// ---- backward ----------------------------------------------------------------------------------
//
// Plan, chosen from the shape alone (never the thread count, so every sum has one order):
//  - kRowTasks (rms/layer, rows that fit kBwdRowBytes and enough of them): tasks of whole rows.
//    Per row one pass over (x, dy) for the two dots, then the dx pass reads x and dy again from
//    L1/L2 and adds u * d and dy into the task's dw/db partial rows (compute type, also cached).
//    Memory traffic: x and dy read once, dx written once (3 R D sizeof(T); streamed when dx is
//    past kStreamStoreBytes), plus the partials, 2 x tasks x D x sizeof(C), written and read
//    once by the final column-wise reduction (about 2% of the traffic at the bench's
//    (4096, 4096) f32: 64 tasks).
//  - kRowDots + kColWrite (rows too long for the cache, or too few to spread): the dots per
//    (row, chunk of kBwdChunk), summed per row in chunk order; then tasks of column chunks, each
//    writing dx for its columns of every row and owning those columns of dw/db (no partials).
//    x and dy are read twice from memory: 5 R D sizeof(T).
//  - kGroups (group norm, groups that fit kBwdRowBytes and at least kBwdMinTasks of them): tasks
//    of whole groups: per channel run of S, sum(dy) and sum(dy * d) (the per-(n, c) sums that
//    dw, db and the group dots are made of), then the dx pass from cache. 3 N C S sizeof(T).
//  - kChanDots + kChanWrite (few or large groups, e.g. (1, 16, 256, 256) with 4 groups): the same
//    per-(n, c) sums over (n, c, chunk of kBwdChunk) items on every thread, combined per group,
//    then the dx pass over the same items. 5 N C S sizeof(T) (the second read often from L3).
// dw[c] = sum over n of rho * sum_S(dy * d) and db[c] = sum over n of sum_S(dy) (group), or the
// partials summed in task order (rows), in the compute type; each rounded once to its dtype.

enum class BwdPhase : int { kRowTasks, kRowDots, kColWrite, kGroups, kChanDots, kChanWrite };

/// One backward job; pointers are element 0 of contiguous tensors (w null for no affine). The
/// buffers typed `void*` hold the compute type (float, or double for f64).
struct BwdJob {
  DType dt = DType::F32;
  Kind kind = Kind::kLayer;
  const void* x = nullptr;
  const void* w = nullptr;
  const void* dy = nullptr;
  void* dx = nullptr;
  const void* mean = nullptr;  ///< (R) compute type; null for rms
  const void* rstd = nullptr;  ///< (R)
  size_t R = 0;                ///< rows (group: N * G)
  size_t L = 0;                ///< row length (group: C/G * S)
  size_t S = 1;                ///< group: spatial size
  size_t C = 0;                ///< group: channels
  size_t Cg = 1;               ///< group: channels per group
  bool stream = false;         ///< dx is written with streaming stores
  size_t rows_per_task = 1;    ///< kRowTasks
  size_t chunk = 0;            ///< kRowDots/kColWrite: columns; kChan*: positions of a channel
  size_t nchunks = 1;          ///< chunks per row (kRow*) or per channel (kChan*)
  void* part_dw = nullptr;     ///< kRowTasks: (tasks, part_stride); kColWrite: (L); or null
  void* part_db = nullptr;
  size_t part_stride = 0;
  void* dot1 = nullptr;        ///< kRowDots/kChanDots: per item, sum(dy * w) resp. sum(dy)
  void* dot2 = nullptr;        ///< per item, sum(dy * w * d) resp. sum(dy * d)
  const void* row_k = nullptr; ///< kColWrite/kChanWrite: per row (group) k and c
  const void* row_c = nullptr;
  void* ch_a = nullptr;        ///< group: (N, C) sum_S(dy)
  void* ch_b = nullptr;        ///< group: (N, C) sum_S(dy * d)
};

/// Rows (groups) whose x and dy, plus a task's f32/f64 dw and db partial rows, fit this many
/// bytes are done whole, their second pass reading L2.
inline constexpr size_t kBwdRowBytes = size_t{512} << 10;
/// Columns (positions) per item when rows (channels) are split.
inline constexpr size_t kBwdChunk = 4096;
/// Below this many rows (groups) they are split, so that every thread has work.
inline constexpr size_t kBwdMinTasks = 16;
/// kRowTasks: at most this many tasks (dw/db partial rows), of at least kBwdTaskElems elements
/// and 4 rows each where the shape allows.
inline constexpr size_t kBwdMaxTasks = 64;
inline constexpr size_t kBwdTaskElems = 32768;

/// The row coefficients of dx = u * w - d * k - c from the row dots s1 = sum(dy * w) and
/// s2 = sum(dy * w * d): c = rho s1 / M (0 for rms), k = rho^2 (rho s2) / M.
template <class C> inline void bwd_coeffs(C rho, C s1, C s2, size_t M, bool rms, C* k, C* c) {
  const C m = static_cast<C>(M);
  *c = rms ? C(0) : rho * s1 / m;
  *k = rho * rho * (rho * s2) / m;
}

}  // namespace taper::cpu::norm_detail

#endif  // TAPER_CPU_NORM_SHARED_

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/norm.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "cpu/simd_half-inl.h"

HWY_BEFORE_NAMESPACE();
namespace taper::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace nd = taper::cpu::norm_detail;

template <class T> using TC = compute_t<T>;
template <class T> using DC = hn::ScalableTag<compute_t<T>>;

// ---- statistics of one chunk (four accumulators, one horizontal reduce) ----------------------

/// Sum of squares of x[0, n) (the zero-filled tail lanes add nothing).
template <class T> HWY_INLINE TC<T> RunSumSq(const T* HWY_RESTRICT x, size_t n) {
  const DC<T> d;
  const size_t N = hn::Lanes(d);
  auto s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d), s3 = hn::Zero(d);
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    const auto v0 = LoadAs(d, x + i), v1 = LoadAs(d, x + i + N);
    const auto v2 = LoadAs(d, x + i + 2 * N), v3 = LoadAs(d, x + i + 3 * N);
    s0 = hn::MulAdd(v0, v0, s0);
    s1 = hn::MulAdd(v1, v1, s1);
    s2 = hn::MulAdd(v2, v2, s2);
    s3 = hn::MulAdd(v3, v3, s3);
  }
  for (; i + N <= n; i += N) {
    const auto v = LoadAs(d, x + i);
    s0 = hn::MulAdd(v, v, s0);
  }
  if (i < n) {
    const auto v = LoadAsN(d, x + i, n - i);
    s0 = hn::MulAdd(v, v, s0);
  }
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
}

/// Sum of x[0, n).
template <class T> HWY_INLINE TC<T> RunSum(const T* HWY_RESTRICT x, size_t n) {
  const DC<T> d;
  const size_t N = hn::Lanes(d);
  auto s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d), s3 = hn::Zero(d);
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    s0 = hn::Add(s0, LoadAs(d, x + i));
    s1 = hn::Add(s1, LoadAs(d, x + i + N));
    s2 = hn::Add(s2, LoadAs(d, x + i + 2 * N));
    s3 = hn::Add(s3, LoadAs(d, x + i + 3 * N));
  }
  for (; i + N <= n; i += N) s0 = hn::Add(s0, LoadAs(d, x + i));
  if (i < n) s0 = hn::Add(s0, LoadAsN(d, x + i, n - i));
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
}

/// Sum of (x - mean)^2 over x[0, n); the tail lanes past the end are masked (they would add
/// mean^2).
template <class T> HWY_INLINE TC<T> RunSumSqDev(const T* HWY_RESTRICT x, size_t n, TC<T> mean) {
  const DC<T> d;
  const size_t N = hn::Lanes(d);
  const auto vm = hn::Set(d, mean);
  auto s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d), s3 = hn::Zero(d);
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    const auto v0 = hn::Sub(LoadAs(d, x + i), vm), v1 = hn::Sub(LoadAs(d, x + i + N), vm);
    const auto v2 = hn::Sub(LoadAs(d, x + i + 2 * N), vm);
    const auto v3 = hn::Sub(LoadAs(d, x + i + 3 * N), vm);
    s0 = hn::MulAdd(v0, v0, s0);
    s1 = hn::MulAdd(v1, v1, s1);
    s2 = hn::MulAdd(v2, v2, s2);
    s3 = hn::MulAdd(v3, v3, s3);
  }
  for (; i + N <= n; i += N) {
    const auto v = hn::Sub(LoadAs(d, x + i), vm);
    s0 = hn::MulAdd(v, v, s0);
  }
  if (i < n) {
    const auto v = hn::IfThenElseZero(hn::FirstN(d, n - i), hn::Sub(LoadAsN(d, x + i, n - i), vm));
    s0 = hn::MulAdd(v, v, s0);
  }
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
}

/// A chunk's statistics: two-pass (mean, M2) for layer/group norm, (0, sum of squares) for rms.
template <class T>
HWY_INLINE void ChunkStats(nd::Kind kind, const T* x, size_t n, TC<T>* mean, TC<T>* m2) {
  if (kind == nd::Kind::kRms) {
    *mean = 0;
    *m2 = RunSumSq(x, n);
    return;
  }
  *mean = RunSum(x, n) / static_cast<TC<T>>(n);
  *m2 = RunSumSqDev(x, n, *mean);
}

// ---- normalisation ---------------------------------------------------------------------------

/// y = (x - mean) * rstd * w + b on x[lo, hi) of a row whose w/b are per element (rms: mean 0).
/// pf: the next row's x, prefetched along (or null).
template <bool kStream, bool kW, bool kB, class T>
HWY_INLINE void WriteElementwise(const T* HWY_RESTRICT x, const T* HWY_RESTRICT w,
                                 const T* HWY_RESTRICT b, T* HWY_RESTRICT y, size_t lo, size_t hi,
                                 TC<T> mean, TC<T> rstd, const T* pf) {
  const DC<T> d;
  const size_t N = hn::Lanes(d);
  const auto vm = hn::Set(d, mean), vr = hn::Set(d, rstd);
  auto f = [&](size_t i, size_t n) {
    if (pf) hwy::Prefetch(pf + i);
    const auto vx = n == N ? LoadAs(d, x + i) : LoadAsN(d, x + i, n);
    auto t = hn::Mul(hn::Sub(vx, vm), vr);
    if constexpr (kW) {
      const auto vw = n == N ? LoadAs(d, w + i) : LoadAsN(d, w + i, n);
      if constexpr (kB) {
        return hn::MulAdd(t, vw, n == N ? LoadAs(d, b + i) : LoadAsN(d, b + i, n));
      } else {
        return hn::Mul(t, vw);
      }
    } else if constexpr (kB) {
      return hn::Add(t, n == N ? LoadAs(d, b + i) : LoadAsN(d, b + i, n));
    } else {
      return t;
    }
  };
  MapStore<kStream>(d, y, lo, hi, f);
}

/// y = (x - mean) * a + c on x[lo, hi), with a = rstd * w[ch], c = b[ch] constant per channel.
template <bool kStream, class T>
HWY_INLINE void WriteAffineRun(const T* HWY_RESTRICT x, T* HWY_RESTRICT y, size_t lo, size_t hi,
                               TC<T> mean, TC<T> a, TC<T> c) {
  const DC<T> d;
  const size_t N = hn::Lanes(d);
  const auto vm = hn::Set(d, mean), va = hn::Set(d, a), vc = hn::Set(d, c);
  MapStore<kStream>(d, y, lo, hi, [&](size_t i, size_t n) {
    return hn::MulAdd(hn::Sub(n == N ? LoadAs(d, x + i) : LoadAsN(d, x + i, n), vm), va, vc);
  });
}

template <bool kStream, class T>
void WriteRangeT(const nd::Job& j, size_t r, size_t lo, size_t hi, const T* pf) {
  using C = TC<T>;
  const T* x = static_cast<const T*>(j.x) + r * j.L;
  T* y = static_cast<T*>(j.y) + r * j.L;
  const T* w = static_cast<const T*>(j.w);
  const T* b = static_cast<const T*>(j.b);
  const C mean = j.mean ? static_cast<const C*>(j.mean)[r] : C(0);
  const C rstd = static_cast<const C*>(j.rstd)[r];
  if (j.kind == nd::Kind::kGroup) {
    const size_t ch0 = (r % j.G) * (j.L / j.S);  // first channel of this group
    for (size_t s0 = lo; s0 < hi;) {
      const size_t k = s0 / j.S, s1 = std::min(hi, (k + 1) * j.S);
      const C a = w ? rstd * widen(w[ch0 + k]) : rstd;
      const C c = b ? widen(b[ch0 + k]) : C(0);
      WriteAffineRun<kStream>(x, y, s0, s1, mean, a, c);
      s0 = s1;
    }
    return;
  }
  if (w && b) WriteElementwise<kStream, true, true>(x, w, b, y, lo, hi, mean, rstd, pf);
  else if (w) WriteElementwise<kStream, true, false>(x, w, b, y, lo, hi, mean, rstd, pf);
  else if (b) WriteElementwise<kStream, false, true>(x, w, b, y, lo, hi, mean, rstd, pf);
  else WriteElementwise<kStream, false, false>(x, w, b, y, lo, hi, mean, rstd, pf);
}

/// Normalises elements [lo, hi) of row r; pf (or null) is prefetched along (the next row's x).
template <class T>
void WriteRange(const nd::Job& j, size_t r, size_t lo, size_t hi, const T* pf = nullptr) {
  if (j.stream) WriteRangeT<true>(j, r, lo, hi, pf);
  else WriteRangeT<false>(j, r, lo, hi, pf);
}

/// Stores row r's statistics from its merged (mean, M2) or sum of squares.
template <class C> HWY_INLINE void StoreStats(const nd::Job& j, size_t r, C mean, C m2) {
  const C v = m2 / static_cast<C>(j.L);  // biased variance (rms: mean of squares)
  if (j.mean) static_cast<C*>(j.mean)[r] = mean;
  static_cast<C*>(j.rstd)[r] = nd::rstd_of(v, j.eps);
}

template <class T> void NormRange(const nd::Job& j, nd::Phase phase, size_t begin, size_t end) {
  using C = TC<T>;
  const T* x = static_cast<const T*>(j.x);
  for (size_t it = begin; it < end; ++it) {
    if (phase == nd::Phase::kRows) {
      const T* xr = x + it * j.L;
      nd::MeanM2<C> acc;
      for (size_t c0 = 0; c0 < j.L; c0 += nd::kStatChunk) {
        const size_t n = std::min(nd::kStatChunk, j.L - c0);
        C m, m2;
        ChunkStats(j.kind, xr + c0, n, &m, &m2);
        if (j.kind == nd::Kind::kRms) acc.m2 += m2;
        else acc.add(static_cast<double>(n), m, m2);
      }
      StoreStats<C>(j, it, acc.mean, acc.m2);
      // The next row's x is fetched while this one is written (its statistics pass then reads
      // the cache, and memory stays busy during the compute of the write).
      const bool pf = it + 1 < end && j.L * sizeof(T) <= kPrefetchRowBytes;
      WriteRange<T>(j, it, 0, j.L, pf ? xr + j.L : nullptr);
      continue;
    }
    const size_t r = it / j.nchunks, c0 = (it % j.nchunks) * j.chunk;
    const size_t c1 = std::min(j.L, c0 + j.chunk);
    if (phase == nd::Phase::kStats) {
      C m, m2;
      ChunkStats(j.kind, x + r * j.L + c0, c1 - c0, &m, &m2);
      j.part_mean[it] = m;
      j.part_m2[it] = m2;
    } else {
      WriteRange<T>(j, r, c0, c1);
    }
  }
  if (j.stream) hwy::FlushStream();  // before the pool's hand-back publishes the rows
}

void NormRun(const nd::Job& j, nd::Phase phase, size_t begin, size_t end) {
  switch (j.dt) {
    case DType::BF16: return NormRange<bf16>(j, phase, begin, end);
    case DType::F16: return NormRange<f16>(j, phase, begin, end);
    case DType::F32: return NormRange<float>(j, phase, begin, end);
    default: return NormRange<double>(j, phase, begin, end);
  }
}

// ---- backward --------------------------------------------------------------------------------

/// The dots over [0, n): s1 = sum a, s2 = sum a * (x - mean), a = dy * w (kW) or dy. The lanes
/// past the end load 0 for dy (and w) and have d masked to 0, so they add nothing.
template <bool kW, class T>
HWY_INLINE void RunDots(const T* HWY_RESTRICT x, const T* HWY_RESTRICT dy,
                        const T* HWY_RESTRICT w, size_t n, TC<T> mean, TC<T>* s1, TC<T>* s2) {
  const DC<T> d;
  const size_t N = hn::Lanes(d);
  const auto vm = hn::Set(d, mean);
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  auto b0 = hn::Zero(d), b1 = hn::Zero(d), b2 = hn::Zero(d), b3 = hn::Zero(d);
  auto term = [&](size_t i, auto& sa, auto& sb) {
    const auto vdy = LoadAs(d, dy + i);
    const auto va = kW ? hn::Mul(vdy, LoadAs(d, w + i)) : vdy;
    sa = hn::Add(sa, va);
    sb = hn::MulAdd(va, hn::Sub(LoadAs(d, x + i), vm), sb);
  };
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    term(i, a0, b0);
    term(i + N, a1, b1);
    term(i + 2 * N, a2, b2);
    term(i + 3 * N, a3, b3);
  }
  for (; i + N <= n; i += N) term(i, a0, b0);
  if (i < n) {
    const size_t k = n - i;
    const auto vdy = LoadAsN(d, dy + i, k);
    const auto va = kW ? hn::Mul(vdy, LoadAsN(d, w + i, k)) : vdy;
    const auto vd = hn::IfThenElseZero(hn::FirstN(d, k), hn::Sub(LoadAsN(d, x + i, k), vm));
    a0 = hn::Add(a0, va);
    b0 = hn::MulAdd(va, vd, b0);
  }
  *s1 = hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
  *s2 = hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(b0, b1), hn::Add(b2, b3))));
}

/// p[i, i + n) += v (n <= Lanes: a partial vector reads and writes only its n elements).
template <class D, class C> HWY_INLINE void AccumulateN(D d, C* HWY_RESTRICT p, size_t i, size_t n,
                                                        hn::Vec<D> v) {
  if (n == hn::Lanes(d)) {
    hn::StoreU(hn::Add(hn::LoadU(d, p + i), v), d, p + i);
  } else {
    StoreFromN(d, hn::Add(LoadAsN(d, p + i, n), v), p + i, n);
  }
}

/// dx = u * w - d * k - c on columns [lo, hi) of one row (x, dy, dx its element 0; w, dwp, dbp
/// indexed by column), u = dy * rho, d = x - mean; adds u * d to dwp and dy to dbp (each where
/// not null). pfx, pfdy (or null): the next row's x and dy, prefetched along.
template <bool kStream, bool kW, class T>
HWY_INLINE void WriteRow(const T* HWY_RESTRICT x, const T* HWY_RESTRICT dy,
                         const T* HWY_RESTRICT w, T* HWY_RESTRICT dx, size_t lo, size_t hi,
                         TC<T> mean, TC<T> rho, TC<T> k, TC<T> c, TC<T>* HWY_RESTRICT dwp,
                         TC<T>* HWY_RESTRICT dbp, const T* pfx, const T* pfdy) {
  const DC<T> d;
  const size_t N = hn::Lanes(d);
  const auto vm = hn::Set(d, mean), vr = hn::Set(d, rho), vk = hn::Set(d, k), vnc = hn::Set(d, -c);
  MapStore<kStream>(d, dx, lo, hi, [&](size_t i, size_t n) {
    if (pfx) {
      hwy::Prefetch(pfx + i);
      hwy::Prefetch(pfdy + i);
    }
    const bool full = n == N;
    const auto vdy = full ? LoadAs(d, dy + i) : LoadAsN(d, dy + i, n);
    const auto vd = hn::Sub(full ? LoadAs(d, x + i) : LoadAsN(d, x + i, n), vm);
    const auto vu = hn::Mul(vdy, vr);
    if (dwp) AccumulateN(d, dwp, i, n, hn::Mul(vu, vd));
    if (dbp) AccumulateN(d, dbp, i, n, vdy);
    const auto vt = hn::NegMulAdd(vd, vk, vnc);  // -(d * k) - c
    if constexpr (kW) {
      return hn::MulAdd(vu, full ? LoadAs(d, w + i) : LoadAsN(d, w + i, n), vt);
    } else {
      return hn::Add(vu, vt);
    }
  });
}

/// Group norm's dx on one channel's run x[0, n): dx = dy * a - d * k - c with a = rho * w[ch].
template <bool kStream, class T>
HWY_INLINE void WriteChanRun(const T* HWY_RESTRICT x, const T* HWY_RESTRICT dy,
                             T* HWY_RESTRICT dx, size_t n, TC<T> mean, TC<T> a, TC<T> k, TC<T> c) {
  const DC<T> d;
  const size_t N = hn::Lanes(d);
  const auto vm = hn::Set(d, mean), va = hn::Set(d, a), vk = hn::Set(d, k), vnc = hn::Set(d, -c);
  MapStore<kStream>(d, dx, 0, n, [&](size_t i, size_t m) {
    const bool full = m == N;
    const auto vd = hn::Sub(full ? LoadAs(d, x + i) : LoadAsN(d, x + i, m), vm);
    const auto vdy = full ? LoadAs(d, dy + i) : LoadAsN(d, dy + i, m);
    return hn::MulAdd(vdy, va, hn::NegMulAdd(vd, vk, vnc));
  });
}

template <bool kStream, bool kW, class T>
void BwdRangeT(const nd::BwdJob& j, nd::BwdPhase phase, size_t begin, size_t end) {
  using C = TC<T>;
  const T* x = static_cast<const T*>(j.x);
  const T* dy = static_cast<const T*>(j.dy);
  const T* w = static_cast<const T*>(j.w);
  T* dx = static_cast<T*>(j.dx);
  const C* mean = static_cast<const C*>(j.mean);
  const C* rstd = static_cast<const C*>(j.rstd);
  C* dwp = static_cast<C*>(j.part_dw);
  C* dbp = static_cast<C*>(j.part_db);
  const bool rms = j.kind == nd::Kind::kRms;
  auto mean_of = [&](size_t r) { return mean ? mean[r] : C(0); };
  auto w_of = [&](size_t ch) { return kW ? widen(w[ch]) : C(1); };
  const size_t L = j.L;
  switch (phase) {
    case nd::BwdPhase::kRowTasks: {
      const bool prefetch = L * sizeof(T) <= kPrefetchRowBytes;
      for (size_t t = begin; t < end; ++t) {
        const size_t r0 = t * j.rows_per_task, r1 = std::min(j.R, r0 + j.rows_per_task);
        C* tdw = dwp ? dwp + t * j.part_stride : nullptr;
        C* tdb = dbp ? dbp + t * j.part_stride : nullptr;
        for (size_t r = r0; r < r1; ++r) {
          const T* xr = x + r * L;
          const T* dyr = dy + r * L;
          const C m = mean_of(r), rho = rstd[r];
          C s1, s2, k, c;
          RunDots<kW>(xr, dyr, w, L, m, &s1, &s2);
          nd::bwd_coeffs(rho, s1, s2, L, rms, &k, &c);
          // The next row is fetched while this one's dx pass computes from cache.
          const bool pf = prefetch && r + 1 < r1;
          WriteRow<kStream, kW>(xr, dyr, w, dx + r * L, 0, L, m, rho, k, c, tdw, tdb,
                                pf ? xr + L : nullptr, pf ? dyr + L : nullptr);
        }
      }
      break;
    }
    case nd::BwdPhase::kRowDots:
      for (size_t it = begin; it < end; ++it) {
        const size_t r = it / j.nchunks, c0 = (it % j.nchunks) * j.chunk;
        const size_t n = std::min(j.chunk, L - c0);
        RunDots<kW>(x + r * L + c0, dy + r * L + c0, kW ? w + c0 : w, n, mean_of(r),
                    static_cast<C*>(j.dot1) + it, static_cast<C*>(j.dot2) + it);
      }
      break;
    case nd::BwdPhase::kColWrite: {
      const C* rk = static_cast<const C*>(j.row_k);
      const C* rc = static_cast<const C*>(j.row_c);
      for (size_t it = begin; it < end; ++it) {
        const size_t c0 = it * j.chunk, c1 = std::min(L, c0 + j.chunk);
        for (size_t r = 0; r < j.R; ++r) {  // rows in order: each column's dw/db sum has one order
          const bool pf = r + 1 < j.R;
          WriteRow<kStream, kW>(x + r * L, dy + r * L, w, dx + r * L, c0, c1, mean_of(r), rstd[r],
                                rk[r], rc[r], dwp, dbp, pf ? x + (r + 1) * L : nullptr,
                                pf ? dy + (r + 1) * L : nullptr);
        }
      }
      break;
    }
    case nd::BwdPhase::kGroups: {
      C* ca = static_cast<C*>(j.ch_a);
      C* cb = static_cast<C*>(j.ch_b);
      const size_t G = j.C / j.Cg;
      for (size_t r = begin; r < end; ++r) {
        const size_t ch0 = (r % G) * j.Cg, nc0 = (r / G) * j.C + ch0;  // first channel, (n, c)
        const C m = mean_of(r), rho = rstd[r];
        C s1 = 0, s2 = 0, k, c;
        for (size_t q = 0; q < j.Cg; ++q) {
          const size_t off = r * L + q * j.S;
          RunDots<false>(x + off, dy + off, w, j.S, m, ca + nc0 + q, cb + nc0 + q);
          s1 += w_of(ch0 + q) * ca[nc0 + q];
          s2 += w_of(ch0 + q) * cb[nc0 + q];
        }
        nd::bwd_coeffs(rho, s1, s2, L, false, &k, &c);
        for (size_t q = 0; q < j.Cg; ++q) {
          const size_t off = r * L + q * j.S;
          WriteChanRun<kStream>(x + off, dy + off, dx + off, j.S, m, rho * w_of(ch0 + q), k, c);
        }
      }
      break;
    }
    case nd::BwdPhase::kChanDots:
    case nd::BwdPhase::kChanWrite: {
      const C* rk = static_cast<const C*>(j.row_k);
      const C* rc = static_cast<const C*>(j.row_c);
      for (size_t it = begin; it < end; ++it) {
        const size_t nc = it / j.nchunks, s0 = (it % j.nchunks) * j.chunk;
        const size_t n = std::min(j.chunk, j.S - s0), r = nc / j.Cg, off = nc * j.S + s0;
        if (phase == nd::BwdPhase::kChanDots) {
          RunDots<false>(x + off, dy + off, w, n, mean_of(r), static_cast<C*>(j.dot1) + it,
                         static_cast<C*>(j.dot2) + it);
        } else {
          WriteChanRun<kStream>(x + off, dy + off, dx + off, n, mean_of(r),
                                rstd[r] * w_of(nc % j.C), rk[r], rc[r]);
        }
      }
      break;
    }
  }
  if (kStream) hwy::FlushStream();  // before the pool's hand-back publishes the rows
}

template <class T> void BwdRange(const nd::BwdJob& j, nd::BwdPhase phase, size_t b, size_t e) {
  if (j.stream) {
    if (j.w) BwdRangeT<true, true, T>(j, phase, b, e);
    else BwdRangeT<true, false, T>(j, phase, b, e);
  } else {
    if (j.w) BwdRangeT<false, true, T>(j, phase, b, e);
    else BwdRangeT<false, false, T>(j, phase, b, e);
  }
}

void NormBwdRun(const nd::BwdJob& j, nd::BwdPhase phase, size_t begin, size_t end) {
  switch (j.dt) {
    case DType::BF16: return BwdRange<bf16>(j, phase, begin, end);
    case DType::F16: return BwdRange<f16>(j, phase, begin, end);
    case DType::F32: return BwdRange<float>(j, phase, begin, end);
    default: return BwdRange<double>(j, phase, begin, end);
  }
}

}  // namespace taper::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace taper::cpu {
HWY_EXPORT(NormRun);
HWY_EXPORT(NormBwdRun);

namespace norm_detail {
namespace {

/// Splits rows into chunks only when there are too few rows to keep every thread busy; each
/// chunk's two passes stay in cache.
void plan(Job& j, size_t R) {
  const RowSplit s = split_rows(R, j.L, kStatChunk);
  j.chunk = s.chunk;
  j.nchunks = s.nchunks;
}

template <class C> void combine(const Job& j, size_t R) {
  for (size_t r = 0; r < R; ++r) {
    MeanM2<C> acc;
    for (size_t k = 0; k < j.nchunks; ++k) {
      const size_t it = r * j.nchunks + k;
      const size_t n = std::min(j.chunk, j.L - k * j.chunk);
      if (j.kind == Kind::kRms) {
        acc.m2 += static_cast<C>(j.part_m2[it]);
      } else {
        acc.add(static_cast<double>(n), static_cast<C>(j.part_mean[it]),
                static_cast<C>(j.part_m2[it]));
      }
    }
    const C v = acc.m2 / static_cast<C>(j.L);
    if (j.mean) static_cast<C*>(j.mean)[r] = acc.mean;
    static_cast<C*>(j.rstd)[r] = rstd_of(v, j.eps);
  }
}

void run(Job j, size_t R) {
  if (R == 0) return;
  if (j.L == 0) {  // statistics of nothing: NaN, as 0/0
    for (size_t r = 0; r < R; ++r) {
      if (j.dt == DType::F64) {
        if (j.mean) static_cast<double*>(j.mean)[r] = std::numeric_limits<double>::quiet_NaN();
        static_cast<double*>(j.rstd)[r] = std::numeric_limits<double>::quiet_NaN();
      } else {
        if (j.mean) static_cast<float*>(j.mean)[r] = std::numeric_limits<float>::quiet_NaN();
        static_cast<float*>(j.rstd)[r] = std::numeric_limits<float>::quiet_NaN();
      }
    }
    return;
  }
  auto call = [&](Phase ph, size_t b, size_t e) { HWY_DYNAMIC_DISPATCH(NormRun)(j, ph, b, e); };
  plan(j, R);
  if (j.nchunks == 1) {
    const size_t grain = std::max<size_t>(1, kElemGrain / j.L);
    parallel_for(R, grain, [&](size_t b, size_t e) { call(Phase::kRows, b, e); });
    return;
  }
  const size_t items = R * j.nchunks;
  std::vector<double> pm(items), pm2(items);
  j.part_mean = pm.data();
  j.part_m2 = pm2.data();
  parallel_for(items, 1, [&](size_t b, size_t e) { call(Phase::kStats, b, e); });
  if (j.dt == DType::F64) combine<double>(j, R);
  else combine<float>(j, R);
  parallel_for(items, 1, [&](size_t b, size_t e) { call(Phase::kWrite, b, e); });
}

const void* ptr_or_null(const std::vector<Tensor>& in, size_t i) {
  if (!present(in, i)) return nullptr;
  TAPER_ASSERT(in[i].is_contiguous() && in[i].dtype() == in[0].dtype());
  return in[i].data_ptr();
}
/// x's shape without its last dim (the per-row statistics' shape).
Shape rows_shape(const Tensor& x) {
  std::vector<size_t> d = x.dims();
  if (!d.empty()) d.pop_back();
  return Shape(d);
}

/// rms_norm: in = {x (..., D), w (D) or empty}; attrs.f0 eps. Returns {y, rstd}.
std::vector<Tensor> rms_norm_kernel(const std::vector<Tensor>& in, const OpAttrs& attrs) {
  const Tensor& x = in[0];
  TAPER_ASSERT(x.is_contiguous());
  Tensor y = new_output(x.shape(), x.dtype());
  Tensor rstd = new_output(rows_shape(x), stat_dtype(x.dtype()));
  Job j;
  j.dt = x.dtype();
  j.kind = Kind::kRms;
  j.x = x.data_ptr();
  j.w = ptr_or_null(in, 1);
  j.y = y.data_ptr();
  j.stream = use_stream_stores(y);
  j.rstd = rstd.data_ptr();
  j.L = x.rank() ? x.dims().back() : 1;
  j.eps = attrs.f0;
  run(j, rstd.elem_count());
  return {y, rstd};
}

/// layer_norm: in = {x (..., D), w (D) or empty, b (D) or empty}; attrs.f0 eps.
/// Returns {y, mean, rstd}.
std::vector<Tensor> layer_norm_kernel(const std::vector<Tensor>& in, const OpAttrs& attrs) {
  const Tensor& x = in[0];
  TAPER_ASSERT(x.is_contiguous());
  Tensor y = new_output(x.shape(), x.dtype());
  Tensor mean = new_output(rows_shape(x), stat_dtype(x.dtype()));
  Tensor rstd = new_output(rows_shape(x), stat_dtype(x.dtype()));
  Job j;
  j.dt = x.dtype();
  j.kind = Kind::kLayer;
  j.x = x.data_ptr();
  j.w = ptr_or_null(in, 1);
  j.b = ptr_or_null(in, 2);
  j.y = y.data_ptr();
  j.stream = use_stream_stores(y);
  j.mean = mean.data_ptr();
  j.rstd = rstd.data_ptr();
  j.L = x.rank() ? x.dims().back() : 1;
  j.eps = attrs.f0;
  run(j, rstd.elem_count());
  return {y, mean, rstd};
}

/// group_norm: in = {x (N, C, *), w (C) or empty, b (C) or empty}; attrs.i0 num_groups,
/// attrs.f0 eps. Returns {y, mean (N, G), rstd (N, G)}.
std::vector<Tensor> group_norm_kernel(const std::vector<Tensor>& in, const OpAttrs& attrs) {
  const Tensor& x = in[0];
  TAPER_ASSERT(x.is_contiguous() && x.rank() >= 2 && attrs.i0 > 0);
  const size_t N = x.dims()[0], C = x.dims()[1], G = static_cast<size_t>(attrs.i0);
  TAPER_ASSERT(C % G == 0);
  size_t S = 1;
  for (size_t k = 2; k < x.rank(); ++k) S *= x.dims()[k];
  Tensor y = new_output(x.shape(), x.dtype());
  Tensor mean = new_output(Shape({N, G}), stat_dtype(x.dtype()));
  Tensor rstd = new_output(Shape({N, G}), stat_dtype(x.dtype()));
  Job j;
  j.dt = x.dtype();
  j.kind = Kind::kGroup;
  j.x = x.data_ptr();
  j.w = ptr_or_null(in, 1);
  j.b = ptr_or_null(in, 2);
  j.y = y.data_ptr();
  j.stream = use_stream_stores(y);
  j.mean = mean.data_ptr();
  j.rstd = rstd.data_ptr();
  j.L = C / G * S;
  j.S = std::max<size_t>(S, 1);
  j.G = G;
  j.eps = attrs.f0;
  if (S == 0) j.L = 0;
  run(j, N * G);
  return {y, mean, rstd};
}

// ---- backward ----------------------------------------------------------------------------------

bool need(const OpAttrs& a, size_t i) { return a.ints.size() > i && a.ints[i] != 0; }

/// out[i] = round(acc[i]) to out's dtype, i < n (acc in the compute type C).
template <class C> void store_rounded(const C* acc, Tensor& out) {
  const size_t n = out.elem_count();
  void* p = out.data_ptr();
  switch (out.dtype()) {
    case DType::BF16:
      for (size_t i = 0; i < n; ++i) static_cast<bf16*>(p)[i] = round_to<bf16>(acc[i]);
      break;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) static_cast<f16*>(p)[i] = round_to<f16>(acc[i]);
      break;
    case DType::F32:
      for (size_t i = 0; i < n; ++i) static_cast<float*>(p)[i] = static_cast<float>(acc[i]);
      break;
    default:
      for (size_t i = 0; i < n; ++i) static_cast<double*>(p)[i] = static_cast<double>(acc[i]);
  }
}

void run_bwd(const BwdJob& j, BwdPhase ph, size_t items, size_t grain) {
  parallel_for(items, grain, [&](size_t b, size_t e) { HWY_DYNAMIC_DISPATCH(NormBwdRun)(j, ph, b, e); });
}

/// rms/layer backward over R rows of L (R L > 0); dw, db: undefined or (L), filled here.
template <class C> void rows_bwd(BwdJob j, Tensor& dw, Tensor& db, size_t sizeof_t) {
  const size_t R = j.R, L = j.L;
  const bool whole = (2 * sizeof_t + 2 * sizeof(C)) * L <= kBwdRowBytes &&
                     (R >= kBwdMinTasks || R * L < 4 * kBwdChunk);
  std::vector<C> pdw, pdb;
  size_t tasks = 1;
  if (whole) {
    tasks = std::min({kBwdMaxTasks, std::max<size_t>(1, R / 4), (R * L + kBwdTaskElems - 1) / kBwdTaskElems});
    tasks = std::max<size_t>(tasks, 1);
    j.rows_per_task = (R + tasks - 1) / tasks;
    tasks = (R + j.rows_per_task - 1) / j.rows_per_task;
  }
  j.part_stride = L;
  if (dw.defined()) pdw.assign(tasks * L, C(0));
  if (db.defined()) pdb.assign(tasks * L, C(0));
  j.part_dw = dw.defined() ? pdw.data() : nullptr;
  j.part_db = db.defined() ? pdb.data() : nullptr;
  if (whole) {
    run_bwd(j, BwdPhase::kRowTasks, tasks, 1);
  } else {
    j.chunk = kBwdChunk;
    j.nchunks = (L + kBwdChunk - 1) / kBwdChunk;
    const size_t items = R * j.nchunks;
    std::vector<C> d1(items), d2(items), rk(R), rc(R);
    j.dot1 = d1.data();
    j.dot2 = d2.data();
    run_bwd(j, BwdPhase::kRowDots, items, 1);
    const C* rstd = static_cast<const C*>(j.rstd);
    for (size_t r = 0; r < R; ++r) {
      C s1 = 0, s2 = 0;
      for (size_t k = 0; k < j.nchunks; ++k) {
        s1 += d1[r * j.nchunks + k];
        s2 += d2[r * j.nchunks + k];
      }
      bwd_coeffs(rstd[r], s1, s2, L, j.kind == Kind::kRms, &rk[r], &rc[r]);
    }
    j.row_k = rk.data();
    j.row_c = rc.data();
    run_bwd(j, BwdPhase::kColWrite, j.nchunks, 1);
  }
  // The partials summed column by column in task order (tasks == 1: the column tasks' sums).
  auto reduce = [&](std::vector<C>& p) {
    if (tasks == 1) return;
    parallel_for(L, kElemGrain / 8, [&](size_t b, size_t e) {
      for (size_t t = 1; t < tasks; ++t)
        for (size_t i = b; i < e; ++i) p[i] += p[t * L + i];
    });
  };
  if (dw.defined()) {
    reduce(pdw);
    store_rounded(pdw.data(), dw);
  }
  if (db.defined()) {
    reduce(pdb);
    store_rounded(pdb.data(), db);
  }
}

/// Checks the saved statistic s: the compute dtype of x, one value per row.
void check_stat(const Tensor& s, const Tensor& x, size_t rows) {
  TAPER_ASSERT(s.is_contiguous() && s.dtype() == stat_dtype(x.dtype()) && s.elem_count() == rows);
}

/// rms_norm_bwd / layer_norm_bwd: in = {x (..., D), w (D) or empty, [mean (...),] rstd (...),
/// dy (..., D)}; attrs.ints = {need dw, need db}, attrs.dtype = db's dtype.
/// Returns {dx, dw, db} (dw, db undefined where not needed; rms: {dx, dw}).
std::vector<Tensor> rows_bwd_kernel(const std::vector<Tensor>& in, const OpAttrs& attrs,
                                    Kind kind) {
  const bool rms = kind == Kind::kRms;
  const Tensor& x = in[0];
  const Tensor& rstd = in[rms ? 2 : 3];
  const Tensor& dy = in[rms ? 3 : 4];
  TAPER_ASSERT(x.is_contiguous() && dy.is_contiguous() && x.shape() == dy.shape() &&
               x.dtype() == dy.dtype());
  const size_t L = x.rank() ? x.dims().back() : 1, R = rstd.elem_count();
  TAPER_ASSERT(R * L == x.elem_count());
  check_stat(rstd, x, R);
  if (!rms) check_stat(in[2], x, R);
  Tensor dx = new_output(x.shape(), x.dtype());
  Tensor dw = present(in, 1) && need(attrs, 0) ? new_output(Shape({L}), in[1].dtype()) : Tensor();
  Tensor db = !rms && need(attrs, 1) ? new_output(Shape({L}), attrs.dtype) : Tensor();
  BwdJob j;
  j.dt = x.dtype();
  j.kind = kind;
  j.x = x.data_ptr();
  j.w = ptr_or_null(in, 1);
  j.dy = dy.data_ptr();
  j.dx = dx.data_ptr();
  j.mean = rms ? nullptr : in[2].data_ptr();
  j.rstd = rstd.data_ptr();
  j.R = R;
  j.L = L;
  j.stream = use_stream_stores(dx);
  if (R * L == 0) {  // no rows, or rows of nothing: sums over nothing are 0
    for (Tensor* t : {&dw, &db})
      if (t->defined()) {
        const std::vector<double> zeros(L, 0.0);
        store_rounded(zeros.data(), *t);
      }
  } else if (j.dt == DType::F64) {
    rows_bwd<double>(j, dw, db, 8);
  } else {
    rows_bwd<float>(j, dw, db, dtype_size(j.dt));
  }
  if (rms) return {dx, dw};
  return {dx, dw, db};
}

std::vector<Tensor> rms_norm_bwd_kernel(const std::vector<Tensor>& in, const OpAttrs& attrs) {
  return rows_bwd_kernel(in, attrs, Kind::kRms);
}
std::vector<Tensor> layer_norm_bwd_kernel(const std::vector<Tensor>& in, const OpAttrs& attrs) {
  return rows_bwd_kernel(in, attrs, Kind::kLayer);
}

/// Group norm backward over N G groups (N C S > 0); dw, db: undefined or (C), filled here.
template <class C> void groups_bwd(BwdJob j, Tensor& dw, Tensor& db, size_t N, size_t sizeof_t) {
  const size_t NC = N * j.C;
  std::vector<C> ca(NC), cb(NC);
  j.ch_a = ca.data();
  j.ch_b = cb.data();
  const C* rstd = static_cast<const C*>(j.rstd);
  const bool whole = 2 * sizeof_t * j.L <= kBwdRowBytes && j.R >= kBwdMinTasks;
  if (whole) {
    run_bwd(j, BwdPhase::kGroups, j.R, std::max<size_t>(1, kElemGrain / j.L));
  } else {
    j.chunk = std::min(kBwdChunk, j.S);
    j.nchunks = (j.S + j.chunk - 1) / j.chunk;
    const size_t items = NC * j.nchunks;
    const size_t grain = std::max<size_t>(1, kElemGrain / j.chunk);
    std::vector<C> d1(items), d2(items), rk(j.R), rc(j.R);
    j.dot1 = d1.data();
    j.dot2 = d2.data();
    run_bwd(j, BwdPhase::kChanDots, items, grain);
    const C* w = nullptr;
    std::vector<C> wc;
    if (j.w) {
      wc.resize(j.C);
      for (size_t c = 0; c < j.C; ++c) {
        switch (j.dt) {
          case DType::BF16: wc[c] = widen(static_cast<const bf16*>(j.w)[c]); break;
          case DType::F16: wc[c] = widen(static_cast<const f16*>(j.w)[c]); break;
          case DType::F32: wc[c] = static_cast<C>(static_cast<const float*>(j.w)[c]); break;
          default: wc[c] = static_cast<C>(static_cast<const double*>(j.w)[c]);
        }
      }
      w = wc.data();
    }
    for (size_t nc = 0; nc < NC; ++nc) {  // per (n, c): its chunks in order
      C a = 0, b = 0;
      for (size_t k = 0; k < j.nchunks; ++k) {
        a += d1[nc * j.nchunks + k];
        b += d2[nc * j.nchunks + k];
      }
      ca[nc] = a;
      cb[nc] = b;
    }
    for (size_t r = 0; r < j.R; ++r) {  // per group: the dots with w over its channels
      const size_t nc0 = (r / (j.C / j.Cg)) * j.C + (r % (j.C / j.Cg)) * j.Cg;
      C s1 = 0, s2 = 0;
      for (size_t q = 0; q < j.Cg; ++q) {
        const C wq = w ? w[(nc0 + q) % j.C] : C(1);
        s1 += wq * ca[nc0 + q];
        s2 += wq * cb[nc0 + q];
      }
      bwd_coeffs(rstd[r], s1, s2, j.L, false, &rk[r], &rc[r]);
    }
    j.row_k = rk.data();
    j.row_c = rc.data();
    run_bwd(j, BwdPhase::kChanWrite, items, grain);
  }
  // dw[c] = sum_n rho * sum_S(dy d), db[c] = sum_n sum_S(dy), n in order.
  std::vector<C> acc(j.C);
  if (dw.defined()) {
    for (size_t c = 0; c < j.C; ++c) {
      C s = 0;
      for (size_t n = 0; n < N; ++n) s += rstd[n * (j.C / j.Cg) + c / j.Cg] * cb[n * j.C + c];
      acc[c] = s;
    }
    store_rounded(acc.data(), dw);
  }
  if (db.defined()) {
    for (size_t c = 0; c < j.C; ++c) {
      C s = 0;
      for (size_t n = 0; n < N; ++n) s += ca[n * j.C + c];
      acc[c] = s;
    }
    store_rounded(acc.data(), db);
  }
}

/// group_norm_bwd: in = {x (N, C, *), w (C) or empty, mean (N, G), rstd (N, G), dy (N, C, *)};
/// attrs.i0 = G, attrs.ints = {need dw, need db}, attrs.dtype = db's dtype. Returns {dx, dw, db}.
std::vector<Tensor> group_norm_bwd_kernel(const std::vector<Tensor>& in, const OpAttrs& attrs) {
  const Tensor& x = in[0];
  const Tensor& dy = in[4];
  TAPER_ASSERT(x.is_contiguous() && dy.is_contiguous() && x.shape() == dy.shape() &&
               x.dtype() == dy.dtype() && x.rank() >= 2 && attrs.i0 > 0);
  const size_t N = x.dims()[0], C = x.dims()[1], G = static_cast<size_t>(attrs.i0);
  TAPER_ASSERT(C % G == 0);
  size_t S = 1;
  for (size_t k = 2; k < x.rank(); ++k) S *= x.dims()[k];
  check_stat(in[2], x, N * G);
  check_stat(in[3], x, N * G);
  Tensor dx = new_output(x.shape(), x.dtype());
  Tensor dw = present(in, 1) && need(attrs, 0) ? new_output(Shape({C}), in[1].dtype()) : Tensor();
  Tensor db = need(attrs, 1) ? new_output(Shape({C}), attrs.dtype) : Tensor();
  BwdJob j;
  j.dt = x.dtype();
  j.kind = Kind::kGroup;
  j.x = x.data_ptr();
  j.w = ptr_or_null(in, 1);
  j.dy = dy.data_ptr();
  j.dx = dx.data_ptr();
  j.mean = in[2].data_ptr();
  j.rstd = in[3].data_ptr();
  j.R = N * G;
  j.C = C;
  j.Cg = C / G;
  j.S = S;
  j.L = j.Cg * S;
  j.stream = use_stream_stores(dx);
  if (N * C * S == 0) {  // sums over nothing are 0
    for (Tensor* t : {&dw, &db})
      if (t->defined()) {
        const std::vector<double> zeros(C, 0.0);
        store_rounded(zeros.data(), *t);
      }
  } else if (j.dt == DType::F64) {
    groups_bwd<double>(j, dw, db, N, 8);
  } else {
    groups_bwd<float>(j, dw, db, N, dtype_size(j.dt));
  }
  return {dx, dw, db};
}

struct Registrar {
  Registrar() {
    register_kernel(OpId::rms_norm, DeviceKind::Cpu, kFloatDTypes, &rms_norm_kernel, true);
    register_kernel(OpId::layer_norm, DeviceKind::Cpu, kFloatDTypes, &layer_norm_kernel, true);
    register_kernel(OpId::group_norm, DeviceKind::Cpu, kFloatDTypes, &group_norm_kernel, true);
    register_kernel(OpId::rms_norm_bwd, DeviceKind::Cpu, kFloatDTypes, &rms_norm_bwd_kernel, true);
    register_kernel(OpId::layer_norm_bwd, DeviceKind::Cpu, kFloatDTypes, &layer_norm_bwd_kernel,
                    true);
    register_kernel(OpId::group_norm_bwd, DeviceKind::Cpu, kFloatDTypes, &group_norm_bwd_kernel,
                    true);
  }
};
const Registrar registrar;

}  // namespace
}  // namespace norm_detail
}  // namespace taper::cpu
#endif  // HWY_ONCE
