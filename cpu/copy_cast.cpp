// copy_cast.cpp: CPU kernels of the copy_cast family: copy (strided -> contiguous), to_dtype
// (every pair of the 7 dtypes), fill, arange, rand_uniform and rand_normal.
//
// What it is: Highway conversions for the float pairs (bf16, f16, f32, f64 among themselves) on
// contiguous runs, scalar conversions elsewhere (integers, strided runs), memcpy for contiguous
// copies; everything threaded over element ranges of the row-major output.
// What it is not: the front-end (core/src/tensor.cpp validates and builds attrs) or autograd.
// The scalar references and the exact to_dtype contract are in tests/ref/copy_cast_ref.h.
//
// Precision: every conversion rounds once, to nearest-even, from the exact source value
// (f64 -> bf16/f16 via f32 rounded to odd; i64 -> bf16/f16 via f64 rounded to odd); float ->
// integer truncates toward zero and saturates, NaN -> 0. Creation ops compute in f64 and round
// once to the dtype. rand/randn are counter-based (Philox4x32-10 on (seed, element index / 2)):
// the values never depend on the thread count.

#ifndef TAPER_CPU_COPY_CAST_SHARED_
#define TAPER_CPU_COPY_CAST_SHARED_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu/cpu_common.h"
#include "taper/dtype.h"
#include "taper/op.h"

#endif  // TAPER_CPU_COPY_CAST_SHARED_

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/copy_cast.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "cpu/simd_half-inl.h"

HWY_BEFORE_NAMESPACE();
namespace taper::cpu::HWY_NAMESPACE {

/// dst[i] = src[i] converted, i in [0, n). Lanes are f64 when either side is f64, else f32;
/// the tail goes through the partial helpers (never touches past n).
template <class S, class D>
void ConvertRun(const S* HWY_RESTRICT src, D* HWY_RESTRICT dst, size_t n) {
  using C = std::conditional_t<std::is_same_v<S, double> || std::is_same_v<D, double>, double,
                               float>;
  const hn::ScalableTag<C> d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    const auto v0 = LoadAs(d, src + i);
    const auto v1 = LoadAs(d, src + i + N);
    StoreFrom2<false>(d, v0, v1, dst + i);
  }
  for (; i + N <= n; i += N) StoreFrom(d, LoadAs(d, src + i), dst + i);
  if (i < n) StoreFromN(d, LoadAsN(d, src + i, n - i), dst + i, n - i);
}

/// Converts n contiguous elements between two distinct float dtypes (bf16, f16, f32, f64).
void ConvertFloat(const void* src, DType from, void* dst, DType to, size_t n) {
  visit_dtype(from, [&](auto s) {
    using S = decltype(s);
    visit_dtype(to, [&](auto t) {
      using D = decltype(t);
      if constexpr (!std::is_integral_v<S> && !std::is_integral_v<D> && !std::is_same_v<S, D>) {
        ConvertRun(static_cast<const S*>(src), static_cast<D*>(dst), n);
      } else {
        TAPER_ASSERT(false && "ConvertFloat: not a pair of distinct float dtypes");
      }
    });
  });
}

/// The target this code was compiled for (test hook).
int64_t CurrentTarget() { return HWY_TARGET; }

}  // namespace taper::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace taper::cpu {

HWY_EXPORT(ConvertFloat);
HWY_EXPORT(CurrentTarget);

namespace {

// Scalar conversions are taper::cast_value (taper/portable.h), the same code the CUDA kernels
// run; tests/ref/copy_cast_ref.h holds the independent reference.
template <class D, class S> D cast_one(S x) { return cast_value<D>(x); }

// ---- view iteration --------------------------------------------------------------------------

/// Calls fn(src_offset, src_stride, dst_index, len) over maximal runs of `loop`'s elements in
/// row-major order (dst_index is the row-major index, i.e. the offset in a contiguous output),
/// threaded over element ranges so one long run is split too.
template <class F> void for_each_run(const StridedLoop<1>& loop, F&& fn) {
  const size_t inner = loop.inner;
  const size_t n = loop.outer_count * inner;
  if (n == 0) return;
  const int64_t st = loop.inner_stride[0];
  parallel_for(n, kElemGrain, [&](size_t b, size_t e) {
    while (b < e) {
      const size_t r = b / inner, j = b % inner;
      const size_t len = std::min(inner - j, e - b);
      const int64_t off = loop.offsets(r)[0] + static_cast<int64_t>(j) * st;
      fn(off, st, b, len);
      b += len;
    }
  });
}

/// Tile edge of the transposing path: a 64x64 tile of 8-byte elements (32 KiB) fits in L1/L2.
constexpr size_t kTile = 64;

/// Whether `loop` is a batch of transposes: the innermost (coalesced) dim strides far apart and
/// the next one is denser, so reading along it in tiles beats walking the innermost stride.
bool is_transposed(const StridedLoop<1>& loop) {
  if (loop.outer_dims.empty() || loop.inner < 8 || loop.outer_dims.back() < 8) return false;
  const int64_t sc = loop.inner_stride[0], sr = loop.outer_strides[0].back();
  const auto mag = [](int64_t v) { return v < 0 ? -v : v; };
  return sc != 0 && mag(sc) > 8 && mag(sr) < mag(sc);
}

/// dst[row-major i] = conv(src[offset of element i]) for a transposed `loop`, tile by tile:
/// each (R, C) matrix of the batch (R = second-innermost dim, C = innermost) is cut into
/// kTile x kTile tiles, written row by row while the tile's source lines stay cached.
template <class S, class D, class Conv>
void transpose_tiles(const StridedLoop<1>& loop, const S* src, D* dst, Conv conv) {
  const size_t R = loop.outer_dims.back(), C = loop.inner;
  const int64_t sr = loop.outer_strides[0].back(), sc = loop.inner_stride[0];
  const size_t batches = loop.outer_count / R;
  const size_t tr = (R + kTile - 1) / kTile, tc = (C + kTile - 1) / kTile;
  parallel_for(batches * tr * tc, std::max<size_t>(1, kElemGrain / (kTile * kTile)),
               [&](size_t b, size_t e) {
    for (size_t t = b; t < e; ++t) {
      const size_t batch = t / (tr * tc), r0 = (t / tc) % tr * kTile, c0 = t % tc * kTile;
      const S* s = src + loop.offsets(batch * R)[0];
      D* d = dst + batch * R * C;
      const size_t r1 = std::min(R, r0 + kTile), c1 = std::min(C, c0 + kTile);
      for (size_t r = r0; r < r1; ++r) {
        const S* sp = s + static_cast<int64_t>(r) * sr;
        D* dp = d + r * C;
        for (size_t c = c0; c < c1; ++c) dp[c] = conv(sp[static_cast<int64_t>(c) * sc]);
      }
    }
  });
}

template <class U> void strided_copy(const U* src, int64_t stride, U* dst, size_t len) {
  if (stride == 0) {
    std::fill_n(dst, len, src[0]);
    return;
  }
  for (size_t k = 0; k < len; ++k) dst[k] = src[static_cast<int64_t>(k) * stride];
}

/// copy of a view whose elements are `U`-sized (only their bits move).
template <class U> void copy_view(const StridedLoop<1>& loop, const U* src, U* dst) {
  if (is_transposed(loop)) {
    transpose_tiles(loop, src, dst, [](U v) { return v; });
    return;
  }
  for_each_run(loop, [&](int64_t off, int64_t st, size_t di, size_t len) {
    if (st == 1) std::memcpy(dst + di, src + off, len * sizeof(U));
    else strided_copy(src + off, st, dst + di, len);
  });
}

// ---- kernels ---------------------------------------------------------------------------------

// copy: x (any shape, strides, dtype) -> a contiguous tensor with the same values (bit copies:
// NaN payloads are kept).
std::vector<Tensor> copy_kernel(const std::vector<Tensor>& in, const OpAttrs&) {
  const Tensor& x = in[0];
  Tensor out = new_output(x.shape(), x.dtype());
  const StridedLoop<1> loop(x.shape(), {&x.strides()});
  const void* src = x.data_ptr();
  void* dst = out.data_ptr();
  switch (dtype_size(x.dtype())) {
    case 1: copy_view(loop, static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst)); break;
    case 2: copy_view(loop, static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst)); break;
    case 4: copy_view(loop, static_cast<const uint32_t*>(src), static_cast<uint32_t*>(dst)); break;
    default: copy_view(loop, static_cast<const uint64_t*>(src), static_cast<uint64_t*>(dst)); break;
  }
  return {out};
}

// to_dtype: x (any shape, strides, dtype) -> contiguous attrs.dtype. Contiguous runs of float
// pairs go through the SIMD conversions; the rest is scalar, with the same rounding.
std::vector<Tensor> to_dtype_kernel(const std::vector<Tensor>& in, const OpAttrs& attrs) {
  const Tensor& x = in[0];
  const DType from = x.dtype(), to = attrs.dtype;
  if (from == to) return copy_kernel(in, attrs);
  Tensor out = new_output(x.shape(), to);
  const StridedLoop<1> loop(x.shape(), {&x.strides()});
  const bool simd = is_float(from) && is_float(to);
  visit_dtype(from, [&](auto s_tag) {
    using S = decltype(s_tag);
    visit_dtype(to, [&](auto d_tag) {
      using D = decltype(d_tag);
      const S* src = x.data<S>();
      D* dst = out.data<D>();
      if (is_transposed(loop)) {
        transpose_tiles(loop, src, dst, [](S v) { return cast_one<D>(v); });
        return;
      }
      for_each_run(loop, [&](int64_t off, int64_t st, size_t di, size_t len) {
        const S* s = src + off;
        D* d = dst + di;
        if (st == 1 && simd) {
          HWY_DYNAMIC_DISPATCH(ConvertFloat)(s, from, d, to, len);
        } else if (st == 0) {
          std::fill_n(d, len, cast_one<D>(s[0]));
        } else {
          for (size_t k = 0; k < len; ++k) d[k] = cast_one<D>(s[static_cast<int64_t>(k) * st]);
        }
      });
    });
  });
  return {out};
}

/// Runs fill_range(T*, begin, end) over a new contiguous (attrs.shape, attrs.dtype) tensor.
template <class F> Tensor create(const OpAttrs& attrs, size_t grain, F&& fill_range) {
  TAPER_ASSERT(attrs.device.is_cpu());
  Tensor out = new_output(Shape(attrs.shape), attrs.dtype);
  const size_t n = out.elem_count();
  visit_dtype(attrs.dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = out.data<T>();
    parallel_for(n, grain, [&](size_t b, size_t e) { fill_range(p, b, e); });
  });
  return out;
}

// fill: (attrs.shape) of attrs.dtype, every element attrs.f0 converted once (as to_dtype from f64).
std::vector<Tensor> fill_kernel(const std::vector<Tensor>&, const OpAttrs& attrs) {
  return {create(attrs, kElemGrain, [&](auto* p, size_t b, size_t e) {
    using T = std::remove_pointer_t<decltype(p)>;
    std::fill(p + b, p + e, cast_one<T>(attrs.f0));
  })};
}

// arange: (n) of attrs.dtype, element i = fma(i, step = attrs.f1, start = attrs.f0) in f64,
// converted once.
std::vector<Tensor> arange_kernel(const std::vector<Tensor>&, const OpAttrs& attrs) {
  return {create(attrs, kElemGrain, [&](auto* p, size_t b, size_t e) {
    using T = std::remove_pointer_t<decltype(p)>;
    for (size_t i = b; i < e; ++i)
      p[i] = cast_one<T>(std::fma(static_cast<double>(i), attrs.f1, attrs.f0));
  })};
}

// rand_uniform: [lo = attrs.f0, hi = attrs.f1), rand_normal: (mean = attrs.f0, std = attrs.f1).
// Elements 2k and 2k+1 share Philox block k of attrs.seed; a thread's range may start or end
// mid-pair, the other half of that pair being some other thread's (same values either way).
template <bool kNormal> std::vector<Tensor> rand_kernel(const std::vector<Tensor>&,
                                                        const OpAttrs& attrs) {
  constexpr size_t kRandGrain = 1 << 13;  // Philox (+ log/sin/cos) per pair: compute bound
  return {create(attrs, kRandGrain, [&](auto* p, size_t b, size_t e) {
    using T = std::remove_pointer_t<decltype(p)>;
    Philox4 block{};
    uint64_t have = ~uint64_t{0};
    for (size_t i = b; i < e; ++i) {
      const uint64_t k = i >> 1;
      if (k != have) {
        block = philox_block(attrs.seed, k);
        have = k;
      }
      if constexpr (kNormal) {
        p[i] = cast_one<T>(normal_f64(block, i & 1, attrs.f0, attrs.f1));
      } else {
        p[i] = below_hi(cast_one<T>(uniform_f64(block, i & 1, attrs.f0, attrs.f1)), attrs.f0,
                        attrs.f1);
      }
    }
  })};
}

struct Registrar {
  Registrar() {
    register_kernel(OpId::copy, DeviceKind::Cpu, kAllDTypes, &copy_kernel);
    register_kernel(OpId::to_dtype, DeviceKind::Cpu, kAllDTypes, &to_dtype_kernel);
    register_kernel(OpId::fill, DeviceKind::Cpu, kAllDTypes, &fill_kernel);
    register_kernel(OpId::arange, DeviceKind::Cpu, kAllDTypes, &arange_kernel);
    register_kernel(OpId::rand_uniform, DeviceKind::Cpu, kFloatDTypes, &rand_kernel<false>);
    register_kernel(OpId::rand_normal, DeviceKind::Cpu, kFloatDTypes, &rand_kernel<true>);
  }
} registrar;

}  // namespace

// ---- test hooks (declared in tests/cpu_hooks.h, the tests' only view of them) -------------

std::vector<int64_t> simd_targets_for_test() { return hwy::SupportedAndGeneratedTargets(); }

void set_simd_target_for_test(int64_t target) { hwy::SetSupportedTargetsForTest(target); }

const char* simd_target_name(int64_t target) { return hwy::TargetName(target); }

int64_t convert_contiguous_for_test(const void* src, DType from, void* dst, DType to, size_t n) {
  TAPER_ASSERT(is_float(from) && is_float(to) && from != to);
  HWY_DYNAMIC_DISPATCH(ConvertFloat)(src, from, dst, to, n);
  return HWY_DYNAMIC_DISPATCH(CurrentTarget)();
}

int64_t convert_f32_to_half_for_test(const float* src, uint16_t* dst, size_t n, DType to) {
  TAPER_ASSERT(to == DType::BF16 || to == DType::F16);
  return convert_contiguous_for_test(src, DType::F32, dst, to, n);
}

}  // namespace taper::cpu
#endif  // HWY_ONCE
