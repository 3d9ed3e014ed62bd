// norm.cpp: Highway forward kernels of rms_norm, layer_norm and group_norm, for bf16, f16, f32
// and f64. Each returns y and the statistics the backward reads (rstd; mean and rstd).
//
// What it is: one "row" abstraction for all three: a contiguous run of L elements with its own
// statistics (layer/rms: a row of the last dim; group norm: the C/G channels x S positions of one
// (n, group), contiguous in (N, C, S)). Rows are threaded; when there are fewer rows than threads
// (group norm (1, 16, 256, 256) with 4 groups) each row is cut into chunks whose two-pass
// statistics are merged with Chan's formula, then the chunks are normalised in parallel.
// What it is not: the backward (composed from primitives in the bwd hooks, core/), or the
// composed forms (metal_fallback/composed.cpp). The scalar reference is cpu/fused_ref.h.
//
// Shapes: rms/layer: x, y (R, D), w, b (D) or empty, mean/rstd (R). group: x, y (N, C, S),
// w, b (C) or empty, mean/rstd (N, G).
// Precision: bf16/f16 load to f32 and round once at the store; statistics are f32 for bf16, f16
// and f32 (never rounded to the input type) and f64 for f64. Variance is two-pass within each
// chunk (chunks of at most kStatChunk, so the second pass reads cache) and Chan-merged across
// chunks; never E[x^2] - E[x]^2.

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

}  // namespace taper::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace taper::cpu {
HWY_EXPORT(NormRun);

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

bool has(const std::vector<Tensor>& in, size_t i) {
  return in.size() > i && in[i].defined() && in[i].elem_count() > 0;
}
const void* ptr_or_null(const std::vector<Tensor>& in, size_t i) {
  if (!has(in, i)) return nullptr;
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

struct Registrar {
  Registrar() {
    register_kernel(OpId::rms_norm, DeviceKind::Cpu, kFloatDTypes, &rms_norm_kernel, true);
    register_kernel(OpId::layer_norm, DeviceKind::Cpu, kFloatDTypes, &layer_norm_kernel, true);
    register_kernel(OpId::group_norm, DeviceKind::Cpu, kFloatDTypes, &group_norm_kernel, true);
  }
};
const Registrar registrar;

}  // namespace
}  // namespace norm_detail
}  // namespace taper::cpu
#endif  // HWY_ONCE
