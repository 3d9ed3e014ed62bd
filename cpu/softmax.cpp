// softmax.cpp: Highway kernels of softmax_last_dim, log_softmax_last_dim and their dedicated
// backward ops (softmax_last_dim_bwd, log_softmax_last_dim_bwd), for bf16, f16, f32 and f64.
//
// What it is: per-row kernels over contiguous (R, D) data (registered needs_contiguous), threaded
// over rows, and inside rows when there are fewer rows than threads (a row is cut into chunks,
// each chunk's statistics are combined, then the chunks are written in parallel).
// What it is not: autograd (core/ holds the bwd hooks that call the *_bwd ops) or the composed
// forms (metal_fallback/composed.cpp). The scalar reference is tests/ref/fused_ref.h.
//
// Shapes: x, y, dy, dx: (R, D), R rows of D elements; stats: (R, 2), the saved row statistics
// (m, l) = (max, log sum exp(x - max)) in the compute type (f32 for bf16/f16/f32, f64 for f64);
// m + l is the row's log-sum-exp. The forward returns {y, stats}. The backward ops take
// (x, stats, dy) and recompute y = exp((x - m) - l) in the compute type rather than reading the
// stored y: a bf16/f16 y carries its own rounding (u|y|), which the backward's cancellation
// (dy - sum, or dy - exp(y) sum) would magnify to many ulps of dx; the recomputed y is exact to
// f32 (f64) noise, so dx is rounded once, at the store. The pair, not m + l, is saved: x - m is
// exact for x near the max and l is small (log D at most), whereas x - lse with lse rounded to f32
// would carry an error of u|lse| (logits near 1000: 2.4e-5 relative in f32 dx, 4e-4 near 1e4).
// Precision: bf16/f16 load to f32, every step is f32 (ExpNoSubnormal of simd_exp-inl.h, within
// 2 ulp; exp results below FLT_MIN, and so y below it, are 0), the result is rounded once at the
// store; f64 is f64 throughout (exp in f64, f64 accumulators).
// Special values, as PyTorch: a row with a NaN, an all -inf row, or a row holding +inf gives NaN
// everywhere (explicitly, from the max pass: NaN is never left to flow through exp).
// Such a row's saved max is NaN, -inf, +inf respectively, so "m is not finite" is exactly "the
// forward row is NaN", and the backward writes NaN there.

#ifndef TAPER_CPU_SOFTMAX_SHARED_
#define TAPER_CPU_SOFTMAX_SHARED_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "cpu/cpu_common.h"
#include "taper/dtype.h"
#include "taper/op.h"

namespace taper::cpu::softmax_detail {

/// What a dispatched call does with its item range [begin, end).
enum class Phase : int {
  kRows,   ///< items are whole rows: statistics and write, the row hot in cache
  kStats,  ///< items are (row, chunk) pairs: per-chunk statistics into part0/part1
  kWrite,  ///< items are (row, chunk) pairs: write the chunk with the row's combined statistics
};

/// One softmax-family job; the pointers are the (contiguous) tensors' element 0.
struct Job {
  DType dt = DType::F32;
  bool log = false;          ///< log-softmax (forward) / log-softmax backward
  const void* x = nullptr;   ///< the forward input (forward and backward)
  const void* dy = nullptr;  ///< backward: the upstream gradient
  void* out = nullptr;       ///< forward: y; backward: dx
  void* stats = nullptr;     ///< (R, 2): (m, l) per row, compute type: forward writes, bwd reads
  size_t D = 0;              ///< row length
  size_t chunk = 0;          ///< chunk length (kStats/kWrite); item = row * nchunks + chunk index
  size_t nchunks = 1;
  double* part0 = nullptr;   ///< per item: forward chunk max (NaN: the row is NaN); backward sum
  double* part1 = nullptr;   ///< per item: forward sum of exp(x - chunk max)
  const double* row0 = nullptr;  ///< per row: forward max M (NaN: NaN row); backward sum
  const double* row1 = nullptr;  ///< per row: forward 1/S (softmax) or log S (log-softmax)
  bool stream = false;       ///< out is written with streaming stores (kStreamStoreBytes)
};

/// Rows up to this length keep exp(x - max) in a per-thread scratch row (f32/f64), so exp is
/// evaluated once and x is read from memory once; 32768 f64 (256 KiB) plus the row fit in L2.
inline constexpr size_t kScratchElems = 32768;
/// Longer rows are reduced in chunks of this length: max then sum of exp, the chunk still in L1/L2.
inline constexpr size_t kStatChunk = 8192;

/// Online combination of chunk statistics: (m, s) with s = sum exp(x - m) over the chunk.
/// A NaN m marks a chunk that made the whole row NaN.
template <class TC> struct MaxSum {
  TC m = -std::numeric_limits<TC>::infinity();
  TC s = 0;
  bool nan = false;
  void add(TC cm, TC cs) {
    if (std::isnan(cm)) {
      nan = true;
      return;
    }
    if (cs == TC(0)) return;  // an all -inf chunk adds nothing (unless the whole row is so)
    if (cm > m) {
      s = s * std::exp(m - cm) + cs;  // exp(-inf) = 0 for the first chunk
      m = cm;
    } else {
      s += cs * std::exp(cm - m);
    }
  }
  /// Whether the row's softmax is NaN everywhere: a NaN, or no finite max (all -inf, or +inf).
  bool nan_row() const { return nan || !std::isfinite(m); }
};

/// Saves a row's statistics (m, log s), s = sum exp(x - m) >= 1 (the max term is exp(0)). A NaN
/// row saves m = NaN; with no finite max m itself (-inf for an all -inf row, +inf for a row
/// holding +inf) and l = 0: m is never finite, as the backward expects for a NaN forward row.
template <class TC> void save_stats(bool nan, TC m, TC s, TC* st) {
  st[0] = nan ? std::numeric_limits<TC>::quiet_NaN() : m;
  st[1] = nan || !std::isfinite(m) ? TC(0) : std::log(s);
}

}  // namespace taper::cpu::softmax_detail

#endif  // TAPER_CPU_SOFTMAX_SHARED_

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/softmax.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "cpu/simd_exp-inl.h"
#include "cpu/simd_half-inl.h"

HWY_BEFORE_NAMESPACE();
namespace taper::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace sd = taper::cpu::softmax_detail;

template <class T> using TC = compute_t<T>;
template <class T> using DC = hn::ScalableTag<compute_t<T>>;

// ---- reductions over one contiguous run (four accumulators, one horizontal reduce) -----------

/// Max of x[0, n). With a NaN in x the result is unspecified (Highway's Max does not propagate
/// NaN): callers find the NaN in the sum of exp(x - max) instead, which exp keeps NaN.
template <class T> HWY_INLINE TC<T> RunMax(const T* HWY_RESTRICT x, size_t n) {
  const DC<T> d;
  const size_t N = hn::Lanes(d);
  const auto ninf = hn::Set(d, -std::numeric_limits<TC<T>>::infinity());
  auto m0 = ninf, m1 = ninf, m2 = ninf, m3 = ninf;
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    m0 = hn::Max(m0, LoadAs(d, x + i));
    m1 = hn::Max(m1, LoadAs(d, x + i + N));
    m2 = hn::Max(m2, LoadAs(d, x + i + 2 * N));
    m3 = hn::Max(m3, LoadAs(d, x + i + 3 * N));
  }
  for (; i + N <= n; i += N) m0 = hn::Max(m0, LoadAs(d, x + i));
  if (i < n) {  // the zero-filled lanes past the end must not raise the max
    m0 = hn::Max(m0, hn::IfThenElse(hn::FirstN(d, n - i), LoadAsN(d, x + i, n - i), ninf));
  }
  return hn::GetLane(hn::MaxOfLanes(d, hn::Max(hn::Max(m0, m1), hn::Max(m2, m3))));
}

/// sum exp(x - m) over x[0, n); with kStore, also writes exp(x - m) to e[0, round_up(n, N)).
/// pf (or null): n elements to prefetch along (the next row's x).
template <bool kStore, class T>
HWY_INLINE TC<T> RunSumExp(const T* HWY_RESTRICT x, size_t n, TC<T> m, TC<T>* HWY_RESTRICT e,
                           const T* pf = nullptr) {
  const DC<T> d;
  const size_t N = hn::Lanes(d);
  const auto vm = hn::Set(d, m);
  auto s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d), s3 = hn::Zero(d);
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    if (pf) PrefetchBytes(pf + i, 4 * N * sizeof(T));
    const auto e0 = ExpNoSubnormal(d, hn::Sub(LoadAs(d, x + i), vm));
    const auto e1 = ExpNoSubnormal(d, hn::Sub(LoadAs(d, x + i + N), vm));
    const auto e2 = ExpNoSubnormal(d, hn::Sub(LoadAs(d, x + i + 2 * N), vm));
    const auto e3 = ExpNoSubnormal(d, hn::Sub(LoadAs(d, x + i + 3 * N), vm));
    if constexpr (kStore) {
      hn::StoreU(e0, d, e + i);
      hn::StoreU(e1, d, e + i + N);
      hn::StoreU(e2, d, e + i + 2 * N);
      hn::StoreU(e3, d, e + i + 3 * N);
    }
    s0 = hn::Add(s0, e0);
    s1 = hn::Add(s1, e1);
    s2 = hn::Add(s2, e2);
    s3 = hn::Add(s3, e3);
  }
  for (; i + N <= n; i += N) {
    const auto e0 = ExpNoSubnormal(d, hn::Sub(LoadAs(d, x + i), vm));
    if constexpr (kStore) hn::StoreU(e0, d, e + i);
    s0 = hn::Add(s0, e0);
  }
  if (i < n) {  // lanes past the end hold exp(0 - m): masked out of the sum
    const auto e0 =
        hn::IfThenElseZero(hn::FirstN(d, n - i), ExpNoSubnormal(d, hn::Sub(LoadAsN(d, x + i, n - i), vm)));
    if constexpr (kStore) hn::StoreU(e0, d, e + i);  // the scratch row is padded to whole vectors
    s0 = hn::Add(s0, e0);
  }
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
}

/// y = exp((x - m) - l): a row's softmax recomputed from its saved stats, vm = Set(m), vl = Set(l).
template <class D, class V> HWY_INLINE V YFromStats(D d, V vx, V vm, V vl) {
  return ExpNoSubnormal(d, hn::Sub(hn::Sub(vx, vm), vl));
}

/// sum dy * y over [0, n), y = exp((x - m) - l) recomputed from the saved stats (the softmax
/// backward's sum(dy * y)), or with kLog sum dy (the log-softmax backward's); with kStore, also
/// writes y to e[0, round_up(n, N)). pfx, pfdy (or null): n elements each to prefetch along
/// (the next row's x and dy).
template <bool kStore, bool kLog = false, class T>
HWY_INLINE TC<T> RunDotExp(const T* HWY_RESTRICT x, const T* HWY_RESTRICT dy, size_t n, TC<T> m,
                           TC<T> l, TC<T>* HWY_RESTRICT e, const T* pfx = nullptr,
                           const T* pfdy = nullptr) {
  const DC<T> d;
  const size_t N = hn::Lanes(d);
  const auto vm = hn::Set(d, m), vl = hn::Set(d, l);
  auto ex = [&](auto vx) { return YFromStats(d, vx, vm, vl); };
  auto term = [](auto ve, auto vdy, auto acc) {
    if constexpr (kLog) return hn::Add(acc, vdy);
    else return hn::MulAdd(ve, vdy, acc);
  };
  auto s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d), s3 = hn::Zero(d);
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    if (pfx) {
      PrefetchBytes(pfx + i, 4 * N * sizeof(T));
      PrefetchBytes(pfdy + i, 4 * N * sizeof(T));
    }
    const auto e0 = ex(LoadAs(d, x + i));
    const auto e1 = ex(LoadAs(d, x + i + N));
    const auto e2 = ex(LoadAs(d, x + i + 2 * N));
    const auto e3 = ex(LoadAs(d, x + i + 3 * N));
    if constexpr (kStore) {
      hn::StoreU(e0, d, e + i);
      hn::StoreU(e1, d, e + i + N);
      hn::StoreU(e2, d, e + i + 2 * N);
      hn::StoreU(e3, d, e + i + 3 * N);
    }
    s0 = term(e0, LoadAs(d, dy + i), s0);
    s1 = term(e1, LoadAs(d, dy + i + N), s1);
    s2 = term(e2, LoadAs(d, dy + i + 2 * N), s2);
    s3 = term(e3, LoadAs(d, dy + i + 3 * N), s3);
  }
  for (; i + N <= n; i += N) {
    const auto e0 = ex(LoadAs(d, x + i));
    if constexpr (kStore) hn::StoreU(e0, d, e + i);
    s0 = term(e0, LoadAs(d, dy + i), s0);
  }
  if (i < n) {  // lanes past the end hold exp(-m - l), possibly inf: zeroed, so 0 * 0 adds 0
    const auto e0 = hn::IfThenElseZero(hn::FirstN(d, n - i), ex(LoadAsN(d, x + i, n - i)));
    if constexpr (kStore) hn::StoreU(e0, d, e + i);  // the scratch row is padded to whole vectors
    s0 = term(e0, LoadAsN(d, dy + i, n - i), s0);
  }
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
}

/// sum b over [0, n); the zero-filled tail lanes add nothing.
template <class T> HWY_INLINE TC<T> RunSum(const T* HWY_RESTRICT b, size_t n) {
  const DC<T> d;
  const size_t N = hn::Lanes(d);
  auto s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d), s3 = hn::Zero(d);
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    s0 = hn::Add(s0, LoadAs(d, b + i));
    s1 = hn::Add(s1, LoadAs(d, b + i + N));
    s2 = hn::Add(s2, LoadAs(d, b + i + 2 * N));
    s3 = hn::Add(s3, LoadAs(d, b + i + 3 * N));
  }
  for (; i + N <= n; i += N) s0 = hn::Add(s0, LoadAs(d, b + i));
  if (i < n) s0 = hn::Add(s0, LoadAsN(d, b + i, n - i));
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
}

// ---- writes ----------------------------------------------------------------------------------

template <class T> HWY_INLINE void FillNaN(T* HWY_RESTRICT y, size_t n) {
  const T v = round_to<T>(std::numeric_limits<TC<T>>::quiet_NaN());
  for (size_t i = 0; i < n; ++i) y[i] = v;
}

/// y = e * c, e the scratch row (padded to whole vectors, so a partial vector loads whole).
template <bool kStream, class T>
HWY_INLINE void WriteScaled(const TC<T>* HWY_RESTRICT e, T* HWY_RESTRICT y, size_t n, TC<T> c) {
  const DC<T> d;
  const auto vc = hn::Set(d, c);
  MapStore<kStream>(d, y, 0, n, [&](size_t i, size_t) { return hn::Mul(hn::LoadU(d, e + i), vc); });
}

/// Softmax: y = exp(x - m) * c (c = 1/S). Log-softmax: y = (x - m) - c (c = log S).
template <bool kLog, bool kStream, class T>
HWY_INLINE void WriteFromX(const T* HWY_RESTRICT x, T* HWY_RESTRICT y, size_t n, TC<T> m,
                           TC<T> c) {
  const DC<T> d;
  const size_t N = hn::Lanes(d);
  const auto vm = hn::Set(d, m), vc = hn::Set(d, c);
  auto f = [&](auto v) {
    if constexpr (kLog) return hn::Sub(hn::Sub(v, vm), vc);
    else return hn::Mul(ExpNoSubnormal(d, hn::Sub(v, vm)), vc);
  };
  MapStore<kStream>(d, y, 0, n, [&](size_t i, size_t k) {
    return f(k == N ? LoadAs(d, x + i) : LoadAsN(d, x + i, k));
  });
}

/// Backward from the scratch row e = y: softmax dx = e * (dy - s), log-softmax dx = dy - e * s.
template <bool kLog, bool kStream, class T>
HWY_INLINE void WriteBwdScratch(const TC<T>* HWY_RESTRICT e, const T* HWY_RESTRICT dy,
                                T* HWY_RESTRICT dx, size_t n, TC<T> s) {
  const DC<T> d;
  const size_t N = hn::Lanes(d);
  const auto vs = hn::Set(d, s);
  auto f = [&](auto ve, auto vdy) {
    if constexpr (kLog) return hn::NegMulAdd(ve, vs, vdy);
    else return hn::Mul(ve, hn::Sub(vdy, vs));
  };
  MapStore<kStream>(d, dx, 0, n, [&](size_t i, size_t k) {
    return f(hn::LoadU(d, e + i), k == N ? LoadAs(d, dy + i) : LoadAsN(d, dy + i, k));
  });
}

/// Backward with y recomputed as exp((x - m) - l): softmax dx = y * (dy - s), log-softmax
/// dx = dy - y * s (s: sum(dy * y), resp. sum(dy)). Tail lanes past n may hold inf; never stored.
template <bool kLog, bool kStream, class T>
HWY_INLINE void WriteBwdFromX(const T* HWY_RESTRICT x, const T* HWY_RESTRICT dy,
                              T* HWY_RESTRICT dx, size_t n, TC<T> m, TC<T> l, TC<T> s) {
  const DC<T> d;
  const size_t N = hn::Lanes(d);
  const auto vm = hn::Set(d, m), vl = hn::Set(d, l), vs = hn::Set(d, s);
  auto f = [&](auto vx, auto vdy) {
    const auto y = YFromStats(d, vx, vm, vl);
    if constexpr (kLog) return hn::NegMulAdd(y, vs, vdy);
    else return hn::Mul(y, hn::Sub(vdy, vs));
  };
  MapStore<kStream>(d, dx, 0, n, [&](size_t i, size_t k) {
    return k == N ? f(LoadAs(d, x + i), LoadAs(d, dy + i))
                  : f(LoadAsN(d, x + i, k), LoadAsN(d, dy + i, k));
  });
}

// ---- per-row and per-chunk drivers -----------------------------------------------------------

/// (max, sum exp(x - max)) of one chunk; max is NaN when the chunk holds a NaN.
template <class T> HWY_INLINE void ChunkStats(const T* x, size_t n, TC<T>* m, TC<T>* s) {
  using C = TC<T>;
  *m = RunMax(x, n);
  // An all -inf chunk: exp(-inf - -inf) would be NaN; it contributes nothing.
  *s = std::isfinite(*m) ? RunSumExp<false>(x, n, *m, static_cast<C*>(nullptr))
                         : (*m > 0 ? std::numeric_limits<C>::infinity() : C(0));
  if (std::isnan(*s) || std::isnan(*m)) {  // a NaN in the chunk (the sum keeps it)
    *m = std::numeric_limits<C>::quiet_NaN();
    *s = 0;
  }
}

/// One whole row of the forward; writes the row's stats st[0, 2). pf (or null): the next row's
/// x, fetched while this row's exp is computed.
template <bool kStream, class T>
void FwdRow(const T* x, T* y, size_t D, bool log, TC<T>* st, const T* pf) {
  using C = TC<T>;
  if (D <= sd::kScratchElems) {
    const C m = RunMax(x, D);
    if (!std::isfinite(m)) {  // NaN, all -inf, or +inf
      sd::save_stats(std::isnan(m), m, C(1), st);
      return FillNaN(y, D);
    }
    C* e = log ? nullptr : thread_scratch<C>(D + hn::Lanes(DC<T>()));
    const C s = log ? RunSumExp<false>(x, D, m, e, pf) : RunSumExp<true>(x, D, m, e, pf);
    sd::save_stats(std::isnan(s), m, s, st);
    if (std::isnan(s)) return FillNaN(y, D);  // a NaN in the row (exp(NaN - m) is NaN)
    if (log) return WriteFromX<true, kStream>(x, y, D, m, st[1]);
    return WriteScaled<kStream>(e, y, D, C(1) / s);  // s >= 1: the max term is exp(0)
  }
  sd::MaxSum<C> acc;
  for (size_t c0 = 0; c0 < D; c0 += sd::kStatChunk) {
    C m, s;
    ChunkStats(x + c0, std::min(sd::kStatChunk, D - c0), &m, &s);
    acc.add(m, s);
  }
  sd::save_stats(acc.nan, acc.m, acc.s, st);
  if (acc.nan_row()) return FillNaN(y, D);
  if (log) return WriteFromX<true, kStream>(x, y, D, acc.m, st[1]);
  WriteFromX<false, kStream>(x, y, D, acc.m, C(1) / acc.s);
}

template <bool kStream, class T>
void FwdRangeT(const sd::Job& j, sd::Phase phase, size_t begin, size_t end) {
  using C = TC<T>;
  const T* x = static_cast<const T*>(j.x);
  T* y = static_cast<T*>(j.out);
  C* st = static_cast<C*>(j.stats);
  const bool prefetch = j.D * sizeof(T) <= kPrefetchRowBytes;
  for (size_t it = begin; it < end; ++it) {
    if (phase == sd::Phase::kRows) {
      const T* xr = x + it * j.D;
      FwdRow<kStream>(xr, y + it * j.D, j.D, j.log, st + 2 * it,
                      prefetch && it + 1 < end ? xr + j.D : nullptr);
      continue;
    }
    const size_t r = it / j.nchunks, c0 = (it % j.nchunks) * j.chunk;
    const size_t n = std::min(j.chunk, j.D - c0);
    const T* xc = x + r * j.D + c0;
    if (phase == sd::Phase::kStats) {
      C m, s;
      ChunkStats(xc, n, &m, &s);
      j.part0[it] = m;
      j.part1[it] = s;
    } else if (std::isnan(j.row0[r])) {
      FillNaN(y + r * j.D + c0, n);
    } else if (j.log) {
      WriteFromX<true, kStream>(xc, y + r * j.D + c0, n, static_cast<C>(j.row0[r]),
                                static_cast<C>(j.row1[r]));
    } else {
      WriteFromX<false, kStream>(xc, y + r * j.D + c0, n, static_cast<C>(j.row0[r]),
                                 static_cast<C>(j.row1[r]));
    }
  }
  if (kStream) hwy::FlushStream();  // before the pool's hand-back publishes the rows
}

template <class T> void FwdRange(const sd::Job& j, sd::Phase phase, size_t begin, size_t end) {
  if (j.stream) FwdRangeT<true, T>(j, phase, begin, end);
  else FwdRangeT<false, T>(j, phase, begin, end);
}

/// One whole row of the backward, (m, l) the row's stats (m finite). pfx, pfdy (or null): the
/// next row's x and dy, fetched while this row's exp is computed.
template <bool kStream, class T>
void BwdRow(const T* x, const T* dy, T* dx, size_t D, bool log, TC<T> m, TC<T> l, const T* pfx,
            const T* pfdy) {
  using C = TC<T>;
  // Keep y = exp((x - m) - l) from the sum pass in an f32/f64 scratch row for the write pass, or
  // recompute it there from x? For bf16/f16 the scratch row wins (it saves the widening and the
  // exp; (4096, 4096) fwd+bwd 5.7 vs 7.3 ms, (1024, 32768) 10.4 vs 13.4 ms), and for the f64
  // softmax (its exp is dearer: 17.7 vs 20.1 ms). For f32, whose row is as large as the scratch,
  // recomputing wins (8.1 vs 8.9 ms, and 19.9 vs 25.2 ms once the row no longer fits L1). The f32
  // and f64 log-softmax need y only once, after the sum of dy, so they never keep it.
  const bool scratch = D <= sd::kScratchElems && (sizeof(T) == 2 || (sizeof(T) == 8 && !log));
  if (scratch) {  // y = exp((x - m) - l) once, with the sum, kept for the write
    C* e = thread_scratch<C>(D + hn::Lanes(DC<T>()));
    if (log) {
      const C s = RunDotExp<true, true>(x, dy, D, m, l, e, pfx, pfdy);
      return WriteBwdScratch<true, kStream>(e, dy, dx, D, s);
    }
    const C s = RunDotExp<true>(x, dy, D, m, l, e, pfx, pfdy);
    return WriteBwdScratch<false, kStream>(e, dy, dx, D, s);
  }
  if (log) return WriteBwdFromX<true, kStream>(x, dy, dx, D, m, l, RunSum(dy, D));
  const C s = RunDotExp<false>(x, dy, D, m, l, static_cast<C*>(nullptr), pfx, pfdy);
  WriteBwdFromX<false, kStream>(x, dy, dx, D, m, l, s);
}

template <bool kStream, class T>
void BwdRangeT(const sd::Job& j, sd::Phase phase, size_t begin, size_t end) {
  using C = TC<T>;
  const T* x = static_cast<const T*>(j.x);
  const T* dy = static_cast<const T*>(j.dy);
  T* dx = static_cast<T*>(j.out);
  const C* st = static_cast<const C*>(j.stats);
  const bool prefetch = j.D * sizeof(T) <= kPrefetchRowBytes;
  for (size_t it = begin; it < end; ++it) {
    size_t off = it * j.D, n = j.D, r = it;
    if (phase != sd::Phase::kRows) {
      r = it / j.nchunks;
      const size_t c0 = (it % j.nchunks) * j.chunk;
      off = r * j.D + c0;
      n = std::min(j.chunk, j.D - c0);
    }
    const C m = st[2 * r], l = st[2 * r + 1];
    if (phase == sd::Phase::kStats) {
      if (!std::isfinite(m)) j.part0[it] = 0;
      else if (j.log) j.part0[it] = RunSum(dy + off, n);
      else j.part0[it] = RunDotExp<false>(x + off, dy + off, n, m, l, static_cast<C*>(nullptr));
      continue;
    }
    if (!std::isfinite(m)) {  // the forward row is NaN (NaN, all -inf, or +inf in x)
      FillNaN(dx + off, n);
      continue;
    }
    if (phase == sd::Phase::kRows) {
      const bool pf = prefetch && it + 1 < end;
      BwdRow<kStream>(x + off, dy + off, dx + off, n, j.log, m, l, pf ? x + off + n : nullptr,
                      pf ? dy + off + n : nullptr);
    } else if (j.log) {
      WriteBwdFromX<true, kStream>(x + off, dy + off, dx + off, n, m, l,
                                   static_cast<C>(j.row0[r]));
    } else {
      WriteBwdFromX<false, kStream>(x + off, dy + off, dx + off, n, m, l,
                                    static_cast<C>(j.row0[r]));
    }
  }
  if (kStream) hwy::FlushStream();
}

template <class T> void BwdRange(const sd::Job& j, sd::Phase phase, size_t begin, size_t end) {
  if (j.stream) BwdRangeT<true, T>(j, phase, begin, end);
  else BwdRangeT<false, T>(j, phase, begin, end);
}

void SoftmaxFwd(const sd::Job& j, sd::Phase phase, size_t begin, size_t end) {
  switch (j.dt) {
    case DType::BF16: return FwdRange<bf16>(j, phase, begin, end);
    case DType::F16: return FwdRange<f16>(j, phase, begin, end);
    case DType::F32: return FwdRange<float>(j, phase, begin, end);
    default: return FwdRange<double>(j, phase, begin, end);
  }
}

void SoftmaxBwd(const sd::Job& j, sd::Phase phase, size_t begin, size_t end) {
  switch (j.dt) {
    case DType::BF16: return BwdRange<bf16>(j, phase, begin, end);
    case DType::F16: return BwdRange<f16>(j, phase, begin, end);
    case DType::F32: return BwdRange<float>(j, phase, begin, end);
    default: return BwdRange<double>(j, phase, begin, end);
  }
}

/// The test hook's body: y = ExpNoSubnormal(t) over n contiguous f32 or f64 values.
template <class C> void ExpRun(const C* t, C* y, size_t n) {
  const hn::ScalableTag<C> d;
  MapStore<false>(d, y, 0, n, [&](size_t i, size_t k) {
    return ExpNoSubnormal(d, k == hn::Lanes(d) ? hn::LoadU(d, t + i) : LoadAsN(d, t + i, k));
  });
}
int64_t ExpForTest(const void* t, void* y, bool f64, size_t n) {
  if (f64) ExpRun(static_cast<const double*>(t), static_cast<double*>(y), n);
  else ExpRun(static_cast<const float*>(t), static_cast<float*>(y), n);
  return HWY_TARGET;
}

}  // namespace taper::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace taper::cpu {
HWY_EXPORT(SoftmaxFwd);
HWY_EXPORT(SoftmaxBwd);
HWY_EXPORT(ExpForTest);

// Test hook, declared in tests/cpu_hooks.h.
int64_t softmax_exp_for_test(const void* t, void* y, DType dt, size_t n) {
  TAPER_ASSERT(dt == DType::F32 || dt == DType::F64);
  return HWY_DYNAMIC_DISPATCH(ExpForTest)(t, y, dt == DType::F64, n);
}

namespace softmax_detail {
namespace {

/// Splits rows into chunks only when there are too few rows to keep every thread busy; a
/// chunk's max and sum passes stay in cache.
void plan(Job& j, size_t R) {
  const RowSplit s = split_rows(R, j.D, kScratchElems);
  j.chunk = s.chunk;
  j.nchunks = s.nchunks;
}

size_t row_grain(size_t D) { return std::max<size_t>(1, kElemGrain / std::max<size_t>(D, 1)); }

template <class C> void combine_fwd(Job& j, size_t R, std::vector<double>& M,
                                    std::vector<double>& c) {
  C* st = static_cast<C*>(j.stats);
  for (size_t r = 0; r < R; ++r) {
    MaxSum<C> acc;
    for (size_t k = 0; k < j.nchunks; ++k)
      acc.add(static_cast<C>(j.part0[r * j.nchunks + k]), static_cast<C>(j.part1[r * j.nchunks + k]));
    save_stats(acc.nan, acc.m, acc.s, st + 2 * r);
    if (acc.nan_row()) {
      M[r] = std::numeric_limits<double>::quiet_NaN();
      continue;
    }
    M[r] = acc.m;
    c[r] = j.log ? static_cast<double>(st[2 * r + 1]) : static_cast<double>(C(1) / acc.s);
  }
}

template <class C> void combine_bwd(Job& j, size_t R, std::vector<double>& s) {
  for (size_t r = 0; r < R; ++r) {
    C acc = 0;
    for (size_t k = 0; k < j.nchunks; ++k) acc += static_cast<C>(j.part0[r * j.nchunks + k]);
    s[r] = acc;
  }
}

/// Runs a forward (bwd = false) or backward job over R rows (D > 0).
void run(Job j, size_t R, bool bwd) {
  if (R == 0 || j.D == 0) return;
  auto call = [&](Phase ph, size_t b, size_t e) {
    if (bwd) HWY_DYNAMIC_DISPATCH(SoftmaxBwd)(j, ph, b, e);
    else HWY_DYNAMIC_DISPATCH(SoftmaxFwd)(j, ph, b, e);
  };
  plan(j, R);
  if (j.nchunks == 1) {
    parallel_for(R, row_grain(j.D), [&](size_t b, size_t e) { call(Phase::kRows, b, e); });
    return;
  }
  const size_t items = R * j.nchunks;
  std::vector<double> p0(items), p1(items), r0(R), r1(R);
  j.part0 = p0.data();
  j.part1 = p1.data();
  parallel_for(items, 1, [&](size_t b, size_t e) { call(Phase::kStats, b, e); });
  const bool f64 = j.dt == DType::F64;
  if (bwd) {
    f64 ? combine_bwd<double>(j, R, r0) : combine_bwd<float>(j, R, r0);
  } else {
    f64 ? combine_fwd<double>(j, R, r0, r1) : combine_fwd<float>(j, R, r0, r1);
  }
  j.row0 = r0.data();
  j.row1 = r1.data();
  parallel_for(items, 1, [&](size_t b, size_t e) { call(Phase::kWrite, b, e); });
}

size_t last_dim(const Tensor& t) { return t.rank() == 0 ? 1 : t.dims().back(); }
/// The saved stats' shape: x's shape with its last dim replaced by 2 (m, l).
Shape stats_shape(const Tensor& x) {
  std::vector<size_t> d = x.dims();
  if (!d.empty()) d.pop_back();
  d.push_back(2);
  return Shape(d);
}

/// in = {x}. Returns {y, stats}.
std::vector<Tensor> fwd_kernel(const std::vector<Tensor>& in, bool log) {
  const Tensor& x = in[0];
  TAPER_ASSERT(x.is_contiguous());
  Tensor y = new_output(x.shape(), x.dtype());
  Tensor stats = new_output(stats_shape(x), stat_dtype(x.dtype()));
  Job j;
  j.dt = x.dtype();
  j.log = log;
  j.x = x.data_ptr();
  j.out = y.data_ptr();
  j.stats = stats.data_ptr();
  j.stream = use_stream_stores(y);
  j.D = last_dim(x);
  const size_t R = stats.elem_count() / 2;
  if (j.D == 0) {  // rows of nothing: max -inf, log-sum-exp log(0) = -inf
    for (size_t r = 0; r < R; ++r) {
      if (j.dt == DType::F64)
        save_stats(false, -HUGE_VAL, 1.0, static_cast<double*>(j.stats) + 2 * r);
      else save_stats(false, -HUGE_VALF, 1.0f, static_cast<float*>(j.stats) + 2 * r);
    }
  }
  run(j, R, false);
  return {y, stats};
}

/// in = {x, stats, dy}: the forward's input and saved stats, the upstream gradient. Returns {dx}.
std::vector<Tensor> bwd_kernel(const std::vector<Tensor>& in, bool log) {
  const Tensor& x = in[0];
  const Tensor& stats = in[1];
  const Tensor& dy = in[2];
  TAPER_ASSERT(x.is_contiguous() && stats.is_contiguous() && dy.is_contiguous());
  TAPER_ASSERT(x.shape() == dy.shape() && x.dtype() == dy.dtype());
  TAPER_ASSERT(stats.dtype() == stat_dtype(x.dtype()) && stats.shape() == stats_shape(x));
  Tensor dx = new_output(x.shape(), x.dtype());
  Job j;
  j.dt = x.dtype();
  j.log = log;
  j.x = x.data_ptr();
  j.dy = dy.data_ptr();
  j.out = dx.data_ptr();
  j.stats = stats.data_ptr();
  j.stream = use_stream_stores(dx);
  j.D = last_dim(x);
  run(j, stats.elem_count() / 2, true);
  return {dx};
}

std::vector<Tensor> softmax_kernel(const std::vector<Tensor>& in, const OpAttrs&) {
  return fwd_kernel(in, false);
}
std::vector<Tensor> log_softmax_kernel(const std::vector<Tensor>& in, const OpAttrs&) {
  return fwd_kernel(in, true);
}
std::vector<Tensor> softmax_bwd_kernel(const std::vector<Tensor>& in, const OpAttrs&) {
  return bwd_kernel(in, false);
}
std::vector<Tensor> log_softmax_bwd_kernel(const std::vector<Tensor>& in, const OpAttrs&) {
  return bwd_kernel(in, true);
}

struct Registrar {
  Registrar() {
    register_kernel(OpId::softmax_last_dim, DeviceKind::Cpu, kFloatDTypes, &softmax_kernel, true);
    register_kernel(OpId::log_softmax_last_dim, DeviceKind::Cpu, kFloatDTypes, &log_softmax_kernel,
                    true);
    register_kernel(OpId::softmax_last_dim_bwd, DeviceKind::Cpu, kFloatDTypes, &softmax_bwd_kernel,
                    true);
    register_kernel(OpId::log_softmax_last_dim_bwd, DeviceKind::Cpu, kFloatDTypes,
                    &log_softmax_bwd_kernel, true);
  }
};
const Registrar registrar;

}  // namespace
}  // namespace softmax_detail
}  // namespace taper::cpu
#endif  // HWY_ONCE
