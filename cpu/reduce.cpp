// reduce.cpp: CPU kernels of the reduce family: sum, max, min over a set of dims, argmax and
// argmin over one dim (OpId::sum/max/min/argmax/argmin).
//
// Shapes: the (contiguous) input is viewed as x: (O, R, I), O = the kept dims before the reduced
// ones, R = the reduced dims (adjacent, flattened), I = the kept dims after them; out: (O, I).
// I == 1 is a row reduction (SIMD along R, four accumulators, one SumOfLanes per block); I > 1
// accumulates columns (SIMD across I, a loop over R). Reduced dims that are not adjacent ({0, 2}
// of rank 3) are first brought together by one permuting copy.
//
// Precision: bf16/f16/f32 load into f32 lanes; a row is summed in blocks of kSumBlock elements
// (f32 lanes within a block), block sums are added in f64, and the result is rounded once to the
// output dtype. Columns are summed in f32 over kColBlock rows, then in f64. f64 is f64 throughout.
// Integer sums wrap around in the dtype's width (computed unsigned); max/min are exact.
// The blocking is fixed, so results do not depend on the thread count.
// NaN: max/min propagate NaN; argmax and argmin both return the index of the first NaN (as
// PyTorch, so that x[argmin] == min). Ties: the first index of the extreme.
//
// What it is not: mean (the front-end scales a sum), the backward rules (core/backward.cpp), or
// argument checks (the front-end normalises the dims: sorted, unique, non-empty).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/reduce.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// clang-format: simd_half-inl.h must follow highway.h.
#include "cpu/simd_half-inl.h"

#ifndef TAPER_CPU_REDUCE_CONSTANTS_
#define TAPER_CPU_REDUCE_CONSTANTS_
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "cpu/cpu_common.h"

namespace taper::cpu::reduce_detail {
/// Elements per f32 block of a row sum: each of 4*Lanes accumulators adds at most
/// kSumBlock/(4*Lanes) values (64 with AVX2) before the block total goes to f64, which keeps
/// the f32 rounding error of a 10^7-element sum near 1e-7 relative.
inline constexpr size_t kSumBlock = 2048;
/// Rows of a column sum accumulated in f32 before they are added in f64.
inline constexpr size_t kColBlock = 128;
/// Columns handed to one task of a column reduction.
inline constexpr size_t kColChunk = 256;
enum Kind : int { kSum = 0, kMax = 1, kMin = 2 };
}  // namespace taper::cpu::reduce_detail
#endif

HWY_BEFORE_NAMESPACE();
namespace taper::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace taper::cpu::reduce_detail;

/// Sum of x[0, n) in f32 lanes with four accumulators, returned as f64 (exact conversion).
template <class T>
HWY_INLINE double SumSpan(const T* HWY_RESTRICT x, size_t n) {
  using C = compute_t<T>;
  const hn::ScalableTag<C> d;
  const size_t N = hn::Lanes(d);
  auto a0 = hn::Zero(d);
  auto a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    a0 = hn::Add(a0, LoadAs(d, x + i));
    a1 = hn::Add(a1, LoadAs(d, x + i + N));
    a2 = hn::Add(a2, LoadAs(d, x + i + 2 * N));
    a3 = hn::Add(a3, LoadAs(d, x + i + 3 * N));
  }
  for (; i + N <= n; i += N) a0 = hn::Add(a0, LoadAs(d, x + i));
  if (i < n) a1 = hn::Add(a1, LoadAsN(d, x + i, n - i));  // reads x[i, n) only; other lanes 0
  const auto s = hn::Add(hn::Add(a0, a1), hn::Add(a2, a3));
  return static_cast<double>(hn::GetLane(hn::SumOfLanes(d, s)));
}

template <bool kIsMax, class V>
HWY_INLINE V Pick(V a, V b) {
  if constexpr (kIsMax) {
    return hn::Max(a, b);
  } else {
    return hn::Min(a, b);
  }
}

template <bool kIsMax, class C>
HWY_INLINE C PickScalar(C a, C b) {
  if constexpr (kIsMax) {
    return b > a ? b : a;
  } else {
    return b < a ? b : a;
  }
}

/// Max (kIsMax) or min of x[0, n), n >= 1, in the compute type; NaN if any element is NaN.
/// Highway's Max/Min do not propagate NaN on every target, so NaN lanes are tracked apart.
template <bool kIsMax, class T>
HWY_INLINE compute_t<T> ExtremeSpan(const T* HWY_RESTRICT x, size_t n) {
  using C = compute_t<T>;
  const hn::ScalableTag<C> d;
  const size_t N = hn::Lanes(d);
  if (n < N) {
    C e = widen(x[0]);
    bool nan = std::isnan(e);
    for (size_t i = 1; i < n; ++i) {
      const C v = widen(x[i]);
      nan |= std::isnan(v);
      e = PickScalar<kIsMax>(e, v);
    }
    return nan ? std::numeric_limits<C>::quiet_NaN() : e;
  }
  auto a0 = LoadAs(d, x);
  auto a1 = a0, a2 = a0, a3 = a0;
  auto nan = hn::IsNaN(a0);
  size_t i = N;
  for (; i + 4 * N <= n; i += 4 * N) {
    const auto v0 = LoadAs(d, x + i);
    const auto v1 = LoadAs(d, x + i + N);
    const auto v2 = LoadAs(d, x + i + 2 * N);
    const auto v3 = LoadAs(d, x + i + 3 * N);
    a0 = Pick<kIsMax>(a0, v0);
    a1 = Pick<kIsMax>(a1, v1);
    a2 = Pick<kIsMax>(a2, v2);
    a3 = Pick<kIsMax>(a3, v3);
    nan = hn::Or(
        nan, hn::Or(hn::Or(hn::IsNaN(v0), hn::IsNaN(v1)), hn::Or(hn::IsNaN(v2), hn::IsNaN(v3))));
  }
  for (; i + N <= n; i += N) {
    const auto v = LoadAs(d, x + i);
    a0 = Pick<kIsMax>(a0, v);
    nan = hn::Or(nan, hn::IsNaN(v));
  }
  if (i < n) {
    // The last N elements, overlapping ones already seen: harmless for max/min; n >= N so the
    // load stays inside x[0, n).
    const auto v = LoadAs(d, x + n - N);
    a1 = Pick<kIsMax>(a1, v);
    nan = hn::Or(nan, hn::IsNaN(v));
  }
  if (!hn::AllFalse(d, nan)) return std::numeric_limits<C>::quiet_NaN();
  const auto a = Pick<kIsMax>(Pick<kIsMax>(a0, a1), Pick<kIsMax>(a2, a3));
  if constexpr (kIsMax) {
    return hn::GetLane(hn::MaxOfLanes(d, a));
  } else {
    return hn::GetLane(hn::MinOfLanes(d, a));
  }
}

/// Index of the first extreme (first NaN if any) of x[0, n), n >= 1: the extreme first, then a
/// SIMD search for the first lane equal to it.
template <bool kIsMax, class T>
HWY_INLINE size_t ArgSpan(const T* HWY_RESTRICT x, size_t n) {
  using C = compute_t<T>;
  const hn::ScalableTag<C> d;
  const size_t N = hn::Lanes(d);
  const C e = ExtremeSpan<kIsMax>(x, n);
  size_t i = 0;
  if (std::isnan(e)) {
    for (; i + N <= n; i += N) {
      const auto m = hn::IsNaN(LoadAs(d, x + i));
      if (!hn::AllFalse(d, m)) return i + static_cast<size_t>(hn::FindFirstTrue(d, m));
    }
    for (; i < n; ++i)
      if (std::isnan(widen(x[i]))) return i;
  } else {
    const auto ve = hn::Set(d, e);
    for (; i + N <= n; i += N) {
      const auto m = hn::Eq(LoadAs(d, x + i), ve);
      if (!hn::AllFalse(d, m)) return i + static_cast<size_t>(hn::FindFirstTrue(d, m));
    }
    for (; i < n; ++i)
      if (widen(x[i]) == e) return i;
  }
  return 0;  // unreachable: e is one of the elements
}

/// x: (rows, n) -> out: (rows). kind: kSum, kMax, kMin.
template <class T>
HWY_INLINE void ReduceRowsT(int kind, const T* HWY_RESTRICT x, size_t rows, size_t n,
                            T* HWY_RESTRICT out) {
  for (size_t r = 0; r < rows; ++r) {
    const T* row = x + r * n;
    if (kind == kSum) {
      double s = 0.0;  // block sums in f64, in block order (the parallel path adds the same way)
      for (size_t b = 0; b < n; b += kSumBlock) s += SumSpan(row + b, std::min(kSumBlock, n - b));
      out[r] = round_to<T>(s);
    } else if (kind == kMax) {
      out[r] = round_to<T>(ExtremeSpan<true>(row, n));  // exact: the value is an element
    } else {
      out[r] = round_to<T>(ExtremeSpan<false>(row, n));
    }
  }
}

/// Per-block statistics of one row x: (n): partial[b] for blocks b in [b0, b1) of kSumBlock
/// elements: the block sum (kSum, f32 lanes -> f64) or its extreme (exact in f64, NaN kept).
template <class T>
HWY_INLINE void BlockStatsT(int kind, const T* HWY_RESTRICT x, size_t n, size_t b0, size_t b1,
                            double* HWY_RESTRICT partial) {
  for (size_t b = b0; b < b1; ++b) {
    const T* p = x + b * kSumBlock;
    const size_t len = std::min(kSumBlock, n - b * kSumBlock);
    if (kind == kSum) {
      partial[b] = SumSpan(p, len);
    } else if (kind == kMax) {
      partial[b] = static_cast<double>(ExtremeSpan<true>(p, len));
    } else {
      partial[b] = static_cast<double>(ExtremeSpan<false>(p, len));
    }
  }
}

/// x: (rows, n) -> out: (rows) indices of the first max (is_max) or min; NaN counts as extreme.
template <class T>
HWY_INLINE void ArgRowsT(bool is_max, const T* HWY_RESTRICT x, size_t rows, size_t n,
                         int64_t* HWY_RESTRICT out) {
  for (size_t r = 0; r < rows; ++r)
    out[r] =
        static_cast<int64_t>(is_max ? ArgSpan<true>(x + r * n, n) : ArgSpan<false>(x + r * n, n));
}

/// Adds the f32 (or f64) lanes of v into acc[0, N) in f64.
template <class D>
HWY_INLINE void FlushToF64(D d, hn::Vec<D> v, double* HWY_RESTRICT acc) {
  hn::TFromD<D> tmp[HWY_MAX_BYTES / sizeof(hn::TFromD<D>)];
  hn::StoreU(v, d, tmp);
  for (size_t l = 0; l < hn::Lanes(d); ++l) acc[l] += static_cast<double>(tmp[l]);
}

/// Column sums of x: (red, inner) for columns [c0, c1) -> out[c0, c1), c1 - c0 <= kColChunk.
/// Tiles of 4 vectors, then single vectors, then a scalar tail (no partial loads per row). Each
/// tile sums kColBlock rows in the compute type, then adds that into f64. Row blocks are the outer
/// loop: a block's tiles read neighbouring lines of the same rows, so after the first tile the
/// block (kColBlock x kColChunk elements) is served from cache instead of striding through
/// memory one tile at a time.
template <class T>
HWY_INLINE void SumColsT(const T* HWY_RESTRICT x, size_t red, size_t inner, size_t c0, size_t c1,
                         T* HWY_RESTRICT out) {
  using C = compute_t<T>;
  const hn::ScalableTag<C> d;
  const size_t N = hn::Lanes(d);
  constexpr size_t kMaxN = HWY_MAX_BYTES / sizeof(C);
  double acc_all[kColChunk];
  HWY_ASSERT(c1 - c0 <= kColChunk);
  std::fill(acc_all, acc_all + (c1 - c0), 0.0);
  for (size_t r0 = 0; r0 < red; r0 += kColBlock) {
    const size_t r1 = std::min(red, r0 + kColBlock);
    size_t c = c0;
    while (c < c1) {
      const size_t left = c1 - c;
      const size_t w = left >= 4 * N ? 4 * N : (left >= N ? N : left);
      double* acc = acc_all + (c - c0);
      if (w == 4 * N) {
        auto a0 = hn::Zero(d);
        auto a1 = a0, a2 = a0, a3 = a0;
        for (size_t r = r0; r < r1; ++r) {
          const T* p = x + r * inner + c;
          a0 = hn::Add(a0, LoadAs(d, p));
          a1 = hn::Add(a1, LoadAs(d, p + N));
          a2 = hn::Add(a2, LoadAs(d, p + 2 * N));
          a3 = hn::Add(a3, LoadAs(d, p + 3 * N));
        }
        FlushToF64(d, a0, acc);
        FlushToF64(d, a1, acc + N);
        FlushToF64(d, a2, acc + 2 * N);
        FlushToF64(d, a3, acc + 3 * N);
      } else if (w == N) {
        auto a0 = hn::Zero(d);
        for (size_t r = r0; r < r1; ++r) a0 = hn::Add(a0, LoadAs(d, x + r * inner + c));
        FlushToF64(d, a0, acc);
      } else {
        C s[kMaxN] = {};
        for (size_t r = r0; r < r1; ++r)
          for (size_t l = 0; l < w; ++l) s[l] += widen(x[r * inner + c + l]);
        for (size_t l = 0; l < w; ++l) acc[l] += static_cast<double>(s[l]);
      }
      c += w;
    }
  }
  for (size_t l = 0; l < c1 - c0; ++l) out[c0 + l] = round_to<T>(acc_all[l]);
}

/// Column max/min of x: (red, inner), red >= 1, for columns [c0, c1) -> out[c0, c1); NaN lanes
/// are tracked and win.
template <bool kIsMax, class T>
HWY_INLINE void ExtremeColsT(const T* HWY_RESTRICT x, size_t red, size_t inner, size_t c0,
                             size_t c1, T* HWY_RESTRICT out) {
  using C = compute_t<T>;
  const hn::ScalableTag<C> d;
  const size_t N = hn::Lanes(d);
  const auto qnan = hn::Set(d, std::numeric_limits<C>::quiet_NaN());
  size_t c = c0;
  for (; c + 4 * N <= c1; c += 4 * N) {
    auto a0 = LoadAs(d, x + c);
    auto a1 = LoadAs(d, x + c + N);
    auto a2 = LoadAs(d, x + c + 2 * N);
    auto a3 = LoadAs(d, x + c + 3 * N);
    auto n0 = hn::IsNaN(a0), n1 = hn::IsNaN(a1), n2 = hn::IsNaN(a2), n3 = hn::IsNaN(a3);
    for (size_t r = 1; r < red; ++r) {
      const T* p = x + r * inner + c;
      const auto v0 = LoadAs(d, p), v1 = LoadAs(d, p + N);
      const auto v2 = LoadAs(d, p + 2 * N), v3 = LoadAs(d, p + 3 * N);
      a0 = Pick<kIsMax>(a0, v0);
      a1 = Pick<kIsMax>(a1, v1);
      a2 = Pick<kIsMax>(a2, v2);
      a3 = Pick<kIsMax>(a3, v3);
      n0 = hn::Or(n0, hn::IsNaN(v0));
      n1 = hn::Or(n1, hn::IsNaN(v1));
      n2 = hn::Or(n2, hn::IsNaN(v2));
      n3 = hn::Or(n3, hn::IsNaN(v3));
    }
    StoreFrom(d, hn::IfThenElse(n0, qnan, a0), out + c);
    StoreFrom(d, hn::IfThenElse(n1, qnan, a1), out + c + N);
    StoreFrom(d, hn::IfThenElse(n2, qnan, a2), out + c + 2 * N);
    StoreFrom(d, hn::IfThenElse(n3, qnan, a3), out + c + 3 * N);
  }
  for (; c + N <= c1; c += N) {
    auto a0 = LoadAs(d, x + c);
    auto n0 = hn::IsNaN(a0);
    for (size_t r = 1; r < red; ++r) {
      const auto v0 = LoadAs(d, x + r * inner + c);
      a0 = Pick<kIsMax>(a0, v0);
      n0 = hn::Or(n0, hn::IsNaN(v0));
    }
    StoreFrom(d, hn::IfThenElse(n0, qnan, a0), out + c);
  }
  for (; c < c1; ++c) {
    C e = widen(x[c]);
    bool nan = std::isnan(e);
    for (size_t r = 1; r < red; ++r) {
      const C v = widen(x[r * inner + c]);
      nan |= std::isnan(v);
      e = PickScalar<kIsMax>(e, v);
    }
    out[c] = round_to<T>(nan ? std::numeric_limits<C>::quiet_NaN() : e);
  }
}

template <class T>
HWY_INLINE void ReduceColsT(int kind, const T* HWY_RESTRICT x, size_t red, size_t inner, size_t c0,
                            size_t c1, T* HWY_RESTRICT out) {
  if (kind == kSum) {
    SumColsT(x, red, inner, c0, c1, out);
  } else if (kind == kMax) {
    ExtremeColsT<true>(x, red, inner, c0, c1, out);
  } else {
    ExtremeColsT<false>(x, red, inner, c0, c1, out);
  }
}

// Non-template entry points, one set per float dtype (HWY_EXPORT needs plain names).
#define TAPER_REDUCE_ENTRY(SUF, T)                                                           \
  void ReduceRows##SUF(int kind, const T* x, size_t rows, size_t n, T* out) {                \
    ReduceRowsT(kind, x, rows, n, out);                                                      \
  }                                                                                          \
  void BlockStats##SUF(int kind, const T* x, size_t n, size_t b0, size_t b1, double* part) { \
    BlockStatsT(kind, x, n, b0, b1, part);                                                   \
  }                                                                                          \
  void ArgRows##SUF(bool is_max, const T* x, size_t rows, size_t n, int64_t* out) {          \
    ArgRowsT(is_max, x, rows, n, out);                                                       \
  }                                                                                          \
  void ReduceCols##SUF(int kind, const T* x, size_t red, size_t inner, size_t c0, size_t c1, \
                       T* out) {                                                             \
    ReduceColsT(kind, x, red, inner, c0, c1, out);                                           \
  }
TAPER_REDUCE_ENTRY(BF16, bf16)
TAPER_REDUCE_ENTRY(F16, f16)
TAPER_REDUCE_ENTRY(F32, float)
TAPER_REDUCE_ENTRY(F64, double)
#undef TAPER_REDUCE_ENTRY

}  // namespace taper::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace taper::cpu {

HWY_EXPORT(ReduceRowsBF16);
HWY_EXPORT(ReduceRowsF16);
HWY_EXPORT(ReduceRowsF32);
HWY_EXPORT(ReduceRowsF64);
HWY_EXPORT(BlockStatsBF16);
HWY_EXPORT(BlockStatsF16);
HWY_EXPORT(BlockStatsF32);
HWY_EXPORT(BlockStatsF64);
HWY_EXPORT(ArgRowsBF16);
HWY_EXPORT(ArgRowsF16);
HWY_EXPORT(ArgRowsF32);
HWY_EXPORT(ArgRowsF64);
HWY_EXPORT(ReduceColsBF16);
HWY_EXPORT(ReduceColsF16);
HWY_EXPORT(ReduceColsF32);
HWY_EXPORT(ReduceColsF64);

namespace {
using namespace reduce_detail;

// Overloads over the float element types, so the drivers below can be templates.
#define TAPER_REDUCE_HOST(SUF, T)                                                                  \
  void reduce_rows(int kind, const T* x, size_t rows, size_t n, T* out) {                          \
    HWY_DYNAMIC_DISPATCH(ReduceRows##SUF)(kind, x, rows, n, out);                                  \
  }                                                                                                \
  void block_stats(int kind, const T* x, size_t n, size_t b0, size_t b1, double* part) {           \
    HWY_DYNAMIC_DISPATCH(BlockStats##SUF)(kind, x, n, b0, b1, part);                               \
  }                                                                                                \
  void arg_rows(bool is_max, const T* x, size_t rows, size_t n, int64_t* out) {                    \
    HWY_DYNAMIC_DISPATCH(ArgRows##SUF)(is_max, x, rows, n, out);                                   \
  }                                                                                                \
  void reduce_cols(int kind, const T* x, size_t red, size_t inner, size_t c0, size_t c1, T* out) { \
    HWY_DYNAMIC_DISPATCH(ReduceCols##SUF)(kind, x, red, inner, c0, c1, out);                       \
  }
TAPER_REDUCE_HOST(BF16, bf16)
TAPER_REDUCE_HOST(F16, f16)
TAPER_REDUCE_HOST(F32, float)
TAPER_REDUCE_HOST(F64, double)
#undef TAPER_REDUCE_HOST

template <class T>
inline constexpr bool kIsFloat = is_float(dtype_of_v<T>);

/// The (O, R, I) view of a contiguous input whose reduced dims are adjacent.
struct ReduceView {
  size_t outer = 1, red = 1, inner = 1;
};

/// Whether `cand` beats the current best `best` for argmax (is_max) / argmin: strictly better,
/// or the first NaN (NaN is never replaced, so the first NaN wins).
template <class C>
inline bool arg_better(bool is_max, C cand, C best) {
  if (best != best) return false;
  if (cand != cand) return true;
  return is_max ? cand > best : cand < best;
}

// ---- float drivers ---------------------------------------------------------------------------

/// Row reduction (I == 1) of floats: parallel over rows, or over blocks of one row when there are
/// fewer rows than threads.
template <class T>
void float_rows(int kind, bool arg, const T* x, size_t rows, size_t n, void* out) {
  const size_t nblocks = (n + kSumBlock - 1) / kSumBlock;
  if (rows >= num_threads() || nblocks < 4) {
    const size_t grain = std::max<size_t>(1, kElemGrain / std::max<size_t>(n, 1));
    parallel_for(rows, grain, [&](size_t b, size_t e) {
      if (arg) {
        arg_rows(kind == kMax, x + b * n, e - b, n, static_cast<int64_t*>(out) + b);
      } else {
        reduce_rows(kind, x + b * n, e - b, n, static_cast<T*>(out) + b);
      }
    });
    return;
  }
  // Few long rows: per-block results, combined in block order (the same order as reduce_rows,
  // so the sum is identical whatever the thread count).
  using C = compute_t<T>;
  const size_t block_grain = std::max<size_t>(1, kElemGrain / kSumBlock);
  std::vector<double> part(nblocks);
  std::vector<int64_t> idx(nblocks);
  for (size_t r = 0; r < rows; ++r) {
    const T* row = x + r * n;
    if (arg) {
      parallel_for(nblocks, block_grain, [&](size_t b, size_t e) {
        for (size_t k = b; k < e; ++k)
          arg_rows(kind == kMax, row + k * kSumBlock, 1, std::min(kSumBlock, n - k * kSumBlock),
                   &idx[k]);
      });
      size_t best = static_cast<size_t>(idx[0]);
      for (size_t k = 1; k < nblocks; ++k) {
        const size_t cand = k * kSumBlock + static_cast<size_t>(idx[k]);
        if (arg_better<C>(kind == kMax, widen(row[cand]), widen(row[best]))) best = cand;
      }
      static_cast<int64_t*>(out)[r] = static_cast<int64_t>(best);
      continue;
    }
    parallel_for(nblocks, block_grain,
                 [&](size_t b, size_t e) { block_stats(kind, row, n, b, e, part.data()); });
    double acc = part[0];
    if (kind == kSum) {
      acc = 0.0;
      for (double p : part) acc += p;
    } else {
      for (size_t k = 1; k < nblocks; ++k) {
        if (std::isnan(acc)) break;
        if (std::isnan(part[k]) || (kind == kMax ? part[k] > acc : part[k] < acc)) acc = part[k];
      }
    }
    static_cast<T*>(out)[r] = round_to<T>(acc);
  }
}

/// Column argmax/argmin of x: (red, inner) for columns [c0, c1), scalar in the compute type.
template <class T>
void arg_cols(bool is_max, const T* x, size_t red, size_t inner, size_t c0, size_t c1,
              int64_t* out) {
  using C = compute_t<T>;
  std::vector<C> best(c1 - c0);
  for (size_t c = c0; c < c1; ++c) {
    best[c - c0] = widen(x[c]);
    out[c] = 0;
  }
  for (size_t r = 1; r < red; ++r) {
    const T* p = x + r * inner;
    for (size_t c = c0; c < c1; ++c) {
      const C v = widen(p[c]);
      if (arg_better(is_max, v, best[c - c0])) {
        best[c - c0] = v;
        out[c] = static_cast<int64_t>(r);
      }
    }
  }
}

// ---- integer drivers (scalar: exact, the compiler vectorises the inner loops) ----------------

/// Integer sum/max/min/argmax/argmin of x: (red, inner) for columns [c0, c1) (inner may be 1).
/// Sums wrap in the dtype's width (unsigned arithmetic, so no signed overflow).
template <class T>
void int_cols(int kind, bool arg, const T* x, size_t red, size_t inner, size_t c0, size_t c1,
              void* out_v) {
  using U = std::make_unsigned_t<T>;
  const size_t w = c1 - c0;
  if (arg) {
    int64_t* out = static_cast<int64_t*>(out_v);
    std::vector<T> best(x + c0, x + c1);
    std::fill(out + c0, out + c1, 0);
    for (size_t r = 1; r < red; ++r) {
      const T* p = x + r * inner + c0;
      for (size_t l = 0; l < w; ++l) {
        const bool better = kind == kMax ? p[l] > best[l] : p[l] < best[l];
        if (better) {
          best[l] = p[l];
          out[c0 + l] = static_cast<int64_t>(r);
        }
      }
    }
    return;
  }
  T* out = static_cast<T*>(out_v);
  if (kind == kSum) {
    std::vector<U> acc(w, U{0});
    for (size_t r = 0; r < red; ++r) {
      const T* p = x + r * inner + c0;
      for (size_t l = 0; l < w; ++l) acc[l] = static_cast<U>(acc[l] + static_cast<U>(p[l]));
    }
    for (size_t l = 0; l < w; ++l) out[c0 + l] = static_cast<T>(acc[l]);
    return;
  }
  std::vector<T> acc(x + c0, x + c1);
  for (size_t r = 1; r < red; ++r) {
    const T* p = x + r * inner + c0;
    for (size_t l = 0; l < w; ++l)
      acc[l] = kind == kMax ? std::max(acc[l], p[l]) : std::min(acc[l], p[l]);
  }
  std::copy(acc.begin(), acc.end(), out + c0);
}

/// Runs the reduction of x: (O, R, I) into out: (O, I) for element type T.
template <class T>
void run_reduce(int kind, bool arg, const T* x, const ReduceView& v, void* out) {
  const size_t out_es = arg ? sizeof(int64_t) : sizeof(T);
  char* out_b = static_cast<char*>(out);
  if constexpr (kIsFloat<T>) {
    if (v.inner == 1) {
      float_rows(kind, arg, x, v.outer, v.red, out);
      return;
    }
  }
  // Column form (and every integer case): tasks of up to kColChunk columns of one outer slice.
  const size_t chunk = v.inner == 1 ? 1 : kColChunk;
  const size_t nchunks = (v.inner + chunk - 1) / chunk;
  const size_t per_task = v.red * std::min(v.inner, chunk);
  const size_t grain = std::max<size_t>(1, kElemGrain / std::max<size_t>(per_task, 1));
  parallel_for(v.outer * nchunks, grain, [&](size_t b, size_t e) {
    for (size_t t = b; t < e; ++t) {
      const size_t o = t / nchunks;
      const size_t c0 = (t % nchunks) * chunk;
      const size_t c1 = std::min(v.inner, c0 + chunk);
      const T* xs = x + o * v.red * v.inner;
      void* os = out_b + o * v.inner * out_es;
      if constexpr (kIsFloat<T>) {
        if (arg) {
          arg_cols(kind == kMax, xs, v.red, v.inner, c0, c1, static_cast<int64_t*>(os));
        } else {
          reduce_cols(kind, xs, v.red, v.inner, c0, c1, static_cast<T*>(os));
        }
      } else {
        int_cols(kind, arg, xs, v.red, v.inner, c0, c1, os);
      }
    }
  });
}

/// A contiguous copy of x with its dims permuted by `order` (out dim i = x dim order[i]).
Tensor permuted_copy(const Tensor& x, const std::vector<size_t>& order) {
  std::vector<size_t> dims(order.size());
  std::vector<int64_t> src_strides(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    dims[i] = x.dims()[order[i]];
    src_strides[i] = x.strides()[order[i]];
  }
  const Shape shape(dims);
  Tensor y = new_output(shape, x.dtype());
  const std::vector<int64_t> dst_strides = shape.contiguous_strides();
  const StridedLoop<2> loop(shape, {&dst_strides, &src_strides});
  const size_t es = dtype_size(x.dtype());
  char* dst = static_cast<char*>(y.data_ptr());
  const char* src = static_cast<const char*>(x.data_ptr());
  auto copy = [&](auto tag) {
    using E = decltype(tag);
    const size_t grain = std::max<size_t>(1, kElemGrain / std::max<size_t>(loop.inner, 1));
    parallel_for(loop.outer_count, grain, [&](size_t b, size_t e) {
      for (size_t r = b; r < e; ++r) {
        const auto off = loop.offsets(r);
        E* d = reinterpret_cast<E*>(dst) + off[0];
        const E* s = reinterpret_cast<const E*>(src) + off[1];
        if (loop.inner_stride[0] == 1 && loop.inner_stride[1] == 1) {  // x's last dim stayed last
          std::memcpy(d, s, loop.inner * sizeof(E));
          continue;
        }
        for (size_t i = 0; i < loop.inner; ++i)
          d[static_cast<int64_t>(i) * loop.inner_stride[0]] =
              s[static_cast<int64_t>(i) * loop.inner_stride[1]];
      }
    });
  };
  switch (es) {
    case 1:
      copy(uint8_t{});
      break;
    case 2:
      copy(uint16_t{});
      break;
    case 4:
      copy(uint32_t{});
      break;
    default:
      copy(uint64_t{});
      break;
  }
  return y;
}

/// sum/max/min (arg == false) or argmax/argmin (arg == true) of in[0] over attrs.ints.
std::vector<Tensor> reduce_kernel(int kind, bool arg, const std::vector<Tensor>& in,
                                  const OpAttrs& attrs) {
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
  Tensor out = new_output(Shape(out_dims), arg ? DType::I64 : x.dtype());
  if (out.elem_count() == 0) return {out};

  // Bring non-adjacent reduced dims together: kept dims before the last reduced one, then the
  // reduced dims, then the kept dims after it; the kept dims keep their order, so out's layout
  // is unchanged.
  const size_t first = static_cast<size_t>(rd.front()), last = static_cast<size_t>(rd.back());
  size_t lo = first, hi = last + 1;  // reduced dims occupy [lo, hi) of x after this
  if (hi - lo != rd.size()) {
    std::vector<size_t> order;
    for (size_t i = 0; i < last; ++i)
      if (!reduced[i]) order.push_back(i);
    lo = order.size();
    for (int64_t d : rd) order.push_back(static_cast<size_t>(d));
    hi = order.size();
    for (size_t i = last + 1; i < rank; ++i) order.push_back(i);
    x = permuted_copy(x, order);
  }
  TAPER_ASSERT(x.is_contiguous());
  ReduceView v;
  for (size_t i = 0; i < rank; ++i) {
    const size_t n = x.dims()[i];
    if (i < lo)
      v.outer *= n;
    else if (i < hi)
      v.red *= n;
    else
      v.inner *= n;
  }
  if (v.red == 0) {  // sum over an empty dim (the front-end rejects max/min/arg there)
    TAPER_CHECK(kind == kSum && !arg, "reduce: cannot reduce an empty dim of ",
                in[0].shape().to_string());
    visit_dtype(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      T* o = out.data<T>();
      std::fill(o, o + out.elem_count(), from_f64<T>(0.0));
    });
    return {out};
  }
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    run_reduce<T>(kind, arg, x.data<T>(), v, out.data_ptr());
  });
  return {out};
}

std::vector<Tensor> sum_kernel(const std::vector<Tensor>& in, const OpAttrs& a) {
  return reduce_kernel(kSum, false, in, a);
}
std::vector<Tensor> max_kernel(const std::vector<Tensor>& in, const OpAttrs& a) {
  return reduce_kernel(kMax, false, in, a);
}
std::vector<Tensor> min_kernel(const std::vector<Tensor>& in, const OpAttrs& a) {
  return reduce_kernel(kMin, false, in, a);
}
std::vector<Tensor> argmax_kernel(const std::vector<Tensor>& in, const OpAttrs& a) {
  TAPER_ASSERT(a.ints.size() == 1);
  return reduce_kernel(kMax, true, in, a);
}
std::vector<Tensor> argmin_kernel(const std::vector<Tensor>& in, const OpAttrs& a) {
  TAPER_ASSERT(a.ints.size() == 1);
  return reduce_kernel(kMin, true, in, a);
}

// The kernels index the input as a dense (O, R, I) array: the dispatcher makes it contiguous.
struct ReduceRegistrar {
  ReduceRegistrar() {
    register_kernel(OpId::sum, DeviceKind::Cpu, kAllDTypes, &sum_kernel, true);
    register_kernel(OpId::max, DeviceKind::Cpu, kAllDTypes, &max_kernel, true);
    register_kernel(OpId::min, DeviceKind::Cpu, kAllDTypes, &min_kernel, true);
    register_kernel(OpId::argmax, DeviceKind::Cpu, kAllDTypes, &argmax_kernel, true);
    register_kernel(OpId::argmin, DeviceKind::Cpu, kAllDTypes, &argmin_kernel, true);
  }
};
const ReduceRegistrar g_reduce_registrar;

}  // namespace
}  // namespace taper::cpu
#endif  // HWY_ONCE
