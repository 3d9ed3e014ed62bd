// copy_cast.cu: CUDA kernels of the copy_cast family, the twins of cpu/copy_cast.cpp: copy
// (any strided view -> contiguous), to_dtype (every pair of the 7 dtypes), fill, arange,
// rand_uniform and rand_normal.
//
// What it is: grid-stride kernels over the row-major output index, the source's offsets from a
// coalesced Strided<1> (rank <= 1 layouts skip the index division); a dense copy is one
// cudaMemcpyAsync; a view that is a batch of transposes (innermost dim strided far apart, the
// next one denser) goes through 32x32 shared-memory tiles so that both the reads and the writes
// coalesce. copy moves bits (by element size: NaN payloads kept); to_dtype converts with
// taper::cast_value, the very code the CPU runs. What it is not: the front-end (core validates
// and builds attrs) or the host <-> device copies (backend.cu).
//
// Precision: bit-identical to the CPU everywhere except rand_normal, whose Box-Muller log, sin,
// cos are CUDA's f64 libm (glibc on the host; both within 1 ulp of f64): f64 values may differ
// in the last bit, values rounded to f32 or a half type almost never do. rand_uniform and
// arange are exact (integer Philox, one fma, one rounding). Elements 2k and 2k+1 share Philox
// block k, so one thread computes a pair.
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cuda/cuda_common.cuh"
#include "taper/dtype.h"
#include "taper/op.h"

namespace taper::cuda {
namespace {

/// Calls f(size(dt)-byte unsigned type tag).
template <class F> void visit_bits(DType dt, F&& f) {
  switch (dtype_size(dt)) {
    case 1: return f(uint8_t{});
    case 2: return f(uint16_t{});
    case 4: return f(uint32_t{});
    default: return f(uint64_t{});
  }
}

// ---- kernels ---------------------------------------------------------------------------------

/// y[i] = conv(x at offset off(i)) for every row-major i < n.
template <class S, class D, class Conv>
__global__ void __launch_bounds__(kThreads)
gather_map(int64_t n, Strided<1> s, const S* __restrict__ x, D* __restrict__ y, Conv conv) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += step) {
    int64_t off[1];
    if (s.rank <= 1) off[0] = s.rank == 0 ? 0 : i * s.strides[0][0];
    else s.offsets(i, off);
    y[i] = conv(x[off[0]]);
  }
}

/// y (contiguous) = x's elements, Vec16 by Vec16: x's innermost coalesced dim a run of whole
/// vectors (runs_in_vectors), so a head split or merge ((B, T, H, d) <-> (B, H, T, d)) moves 16
/// bytes per thread with one index division chain per vector instead of one per element.
template <class U>
__global__ void __launch_bounds__(kThreads)
copy_runs(int64_t nv, Strided<1> s, const U* __restrict__ x, U* __restrict__ y) {
  for_each_vector<1, 16 / sizeof(U)>(nv, s, [&](int64_t v, const int64_t (&off)[1]) {
    reinterpret_cast<Vec16<U>*>(y)[v] = *reinterpret_cast<const Vec16<U>*>(x + off[0]);
  });
}

constexpr int kTile = 32;      ///< transpose tile edge
constexpr int kTileRows = 8;   ///< thread rows per tile (kTile x kTileRows threads)

/// A batch of transposes: y (nb, R, C) contiguous = conv(x[batch(b) + r sr + c sc]). Reads walk
/// r (threadIdx.x, the denser source stride), writes walk c; a (kTile, kTile + 1) tile between.
template <class S, class D, class Conv>
__global__ void __launch_bounds__(kTile * kTileRows)
transpose_tiles(Strided<1> batch, int64_t nb, int64_t R, int64_t C, int64_t sr, int64_t sc,
                const S* __restrict__ x, D* __restrict__ y, Conv conv) {
  // Raw bytes: bf16/f16 have default member initialisers, which __shared__ forbids.
  __shared__ alignas(8) unsigned char smem[kTile * (kTile + 1) * sizeof(D)];
  D* tile = reinterpret_cast<D*>(smem);
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int tx = threadIdx.x;
  for (int64_t b = blockIdx.z; b < nb; b += gridDim.z) {
    int64_t base[1];
    batch.offsets(b, base);
    const S* xs = x + base[0];
    for (int j = threadIdx.y; j < kTile; j += kTileRows) {
      const int64_t r = r0 + tx, c = c0 + j;
      if (r < R && c < C) tile[j * (kTile + 1) + tx] = conv(xs[r * sr + c * sc]);
    }
    __syncthreads();
    D* yb = y + b * R * C;
    for (int j = threadIdx.y; j < kTile; j += kTileRows) {
      const int64_t r = r0 + j, c = c0 + tx;
      if (r < R && c < C) yb[r * C + c] = tile[tx * (kTile + 1) + j];
    }
    __syncthreads();
  }
}

/// f(i) for every i < n (creation ops: no source).
template <class F> __global__ void __launch_bounds__(kThreads) index_map(int64_t n, F f) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
    f(i);
}

struct Identity {
  template <class U> __device__ __forceinline__ U operator()(U v) const { return v; }
};
template <class D> struct Cast {
  template <class S> __device__ __forceinline__ D operator()(S v) const { return cast_value<D>(v); }
};

// ---- view iteration ----------------------------------------------------------------------------

/// y (contiguous, x's shape) = conv(x) elementwise, on x's stream: the transposing tiles when x is
/// a batch of transposes, else the gather. `dense_memcpy`: a dense x is one memcpy (copy only).
template <class S, class D, class Conv>
void convert_view(const char* op, const std::vector<Tensor>& in, const Tensor& x, const Tensor& y,
                  Conv conv, bool dense_memcpy) {
  const size_t n = x.elem_count();
  if (n == 0) return;
  const int ord = x.device().ordinal();
  const cudaStream_t st = stream(ord);
  const Strided<1> s = make_strided<1>(x.shape(), {&x.strides()});
  const S* px = ptr<S>(x);
  D* py = ptr<D>(y);
  if (dense_memcpy && is_dense(s)) {
    TAPER_CUDA_CHECK(cudaMemcpyAsync(py, px, n * sizeof(D), cudaMemcpyDeviceToDevice, st));
    return;
  }
  if constexpr (std::is_same_v<S, D>) {
    if (dense_memcpy && s.rank >= 2 &&
        runs_in_vectors<1>(s, {px}, sizeof(S), /*splat_runs=*/false)) {
      const int64_t nv = static_cast<int64_t>(n / (16 / sizeof(S)));
      copy_runs<S><<<grid_for(static_cast<size_t>(nv), ord), kThreads, 0, st>>>(nv, s, px, py);
      TAPER_CUDA_CHECK_LAUNCH(op, in);
      return;
    }
  }
  if (s.rank >= 2) {
    const int k = s.rank;
    const int64_t R = s.dims[k - 2], C = s.dims[k - 1];
    const int64_t sr = s.strides[0][k - 2], sc = s.strides[0][k - 1];
    const auto mag = [](int64_t v) { return v < 0 ? -v : v; };
    const int64_t tiles_r = ceil_div(R, kTile), tiles_c = ceil_div(C, kTile);
    if (sc != 0 && mag(sc) > 8 && mag(sr) < mag(sc) && R >= 16 && C >= 16 && tiles_r <= 65535 &&
        tiles_c <= 0x7fffffff) {
      Strided<1> batch = s;  // the outer dims
      batch.rank = k - 2;
      batch.set_divisors();
      const int64_t nb = static_cast<int64_t>(n) / (R * C);
      const dim3 grid(static_cast<unsigned>(tiles_c), static_cast<unsigned>(tiles_r),
                      static_cast<unsigned>(nb < 65535 ? nb : 65535));
      transpose_tiles<<<grid, dim3(kTile, kTileRows), 0, st>>>(batch, nb, R, C, sr, sc, px, py,
                                                               conv);
      TAPER_CUDA_CHECK_LAUNCH(op, in);
      return;
    }
  }
  gather_map<<<grid_for(n, ord), kThreads, 0, st>>>(static_cast<int64_t>(n), s, px, py, conv);
  TAPER_CUDA_CHECK_LAUNCH(op, in);
}

// ---- copy, to_dtype ----------------------------------------------------------------------------

// copy: x (any shape, strides, dtype) -> a contiguous tensor with the same bits.
std::vector<Tensor> copy_kernel(const std::vector<Tensor>& in, const OpAttrs&) {
  const Tensor& x = in[0];
  Tensor y = new_output(x.shape(), x.dtype(), x);
  visit_bits(x.dtype(), [&](auto tag) {
    using U = decltype(tag);
    convert_view<U, U>("copy", in, x, y, Identity{}, /*dense_memcpy=*/true);
  });
  return {y};
}

// to_dtype: x (any shape, strides, dtype) -> contiguous attrs.dtype, cast_value per element.
std::vector<Tensor> to_dtype_kernel(const std::vector<Tensor>& in, const OpAttrs& attrs) {
  const Tensor& x = in[0];
  if (x.dtype() == attrs.dtype) return copy_kernel(in, attrs);
  Tensor y = new_output(x.shape(), attrs.dtype, x);
  visit_dtype(x.dtype(), [&](auto s_tag) {
    using S = decltype(s_tag);
    visit_dtype(attrs.dtype, [&](auto d_tag) {
      using D = decltype(d_tag);
      if constexpr (!std::is_same_v<S, D>) {
        convert_view<S, D>("to_dtype", in, x, y, Cast<D>{}, /*dense_memcpy=*/false);
      }
    });
  });
  return {y};
}

// ---- creation ops ------------------------------------------------------------------------------

/// A new contiguous (attrs.shape, attrs.dtype) tensor on attrs.device.
Tensor new_created(const OpAttrs& attrs) {
  TAPER_ASSERT(attrs.device.is_cuda());
  return Tensor::empty(Shape(attrs.shape), attrs.dtype, attrs.device);
}

/// Runs f(i), i < n, on attrs.device's stream.
template <class F> void launch_index(const char* op, const OpAttrs& attrs, size_t n, const F& f) {
  if (n == 0) return;
  const int ord = attrs.device.ordinal();
  const cudaStream_t st = stream(ord);
  index_map<<<grid_for(n, ord), kThreads, 0, st>>>(static_cast<int64_t>(n), f);
  TAPER_CUDA_CHECK_LAUNCH(op, {});
}

template <class U> struct FillFn {
  U* y;
  U v;
  __device__ __forceinline__ void operator()(int64_t i) const { y[i] = v; }
};

// fill: every element attrs.f0 converted once (cast_value from f64, as to_dtype). An all-zero bit
// pattern is a memset.
std::vector<Tensor> fill_kernel(const std::vector<Tensor>&, const OpAttrs& attrs) {
  Tensor y = new_created(attrs);
  const size_t n = y.elem_count();
  if (n == 0) return {y};
  visit_dtype(attrs.dtype, [&](auto tag) {
    using T = decltype(tag);
    using U = typename Bits<sizeof(T)>::type;
    const T v = cast_value<T>(attrs.f0);
    U bits;
    std::memcpy(&bits, &v, sizeof(U));
    if (bits == 0) {
      const cudaStream_t st = stream(attrs.device.ordinal());
      TAPER_CUDA_CHECK(cudaMemsetAsync(y.data_ptr(), 0, n * sizeof(U), st));
    } else {
      launch_index("fill", attrs, n, FillFn<U>{ptr<U>(y), bits});
    }
  });
  return {y};
}

template <class T> struct ArangeFn {
  T* y;
  double start, step;
  __device__ __forceinline__ void operator()(int64_t i) const {
    y[i] = arange_value<T>(start, step, static_cast<uint64_t>(i));
  }
};

// arange: element i = fma(i, step = attrs.f1, start = attrs.f0) in f64, converted once.
std::vector<Tensor> arange_kernel(const std::vector<Tensor>&, const OpAttrs& attrs) {
  Tensor y = new_created(attrs);
  visit_dtype(attrs.dtype, [&](auto tag) {
    using T = decltype(tag);
    launch_index("arange", attrs, y.elem_count(), ArangeFn<T>{ptr<T>(y), attrs.f0, attrs.f1});
  });
  return {y};
}

/// Pair k: elements 2k and 2k+1 from Philox block k (uniform_value / normal_value, written out
/// so that the block is computed once per pair).
template <class T, bool kNormal> struct RandFn {
  T* y;
  int64_t n;
  uint64_t seed;
  double a, b;  ///< lo, hi (uniform) or mean, std (normal)
  __device__ __forceinline__ void operator()(int64_t k) const {
    const Philox4 blk = philox_block(seed, static_cast<uint64_t>(k));
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int64_t i = 2 * k + j;
      if (i >= n) break;
      if constexpr (kNormal) y[i] = cast_value<T>(normal_f64(blk, j == 1, a, b));
      else y[i] = below_hi(cast_value<T>(uniform_f64(blk, j == 1, a, b)), a, b);
    }
  }
};

// rand_uniform: [lo = attrs.f0, hi = attrs.f1); rand_normal: (mean = attrs.f0, std = attrs.f1);
// seed attrs.seed. Float dtypes only (as the CPU).
template <bool kNormal>
std::vector<Tensor> rand_kernel(const std::vector<Tensor>&, const OpAttrs& attrs) {
  Tensor y = new_created(attrs);
  const size_t n = y.elem_count();
  visit_dtype(attrs.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_integral_v<T>) {
      launch_index(kNormal ? "rand_normal" : "rand_uniform", attrs, (n + 1) / 2,
                   RandFn<T, kNormal>{ptr<T>(y), static_cast<int64_t>(n), attrs.seed, attrs.f0,
                                      attrs.f1});
    } else {
      TAPER_ASSERT(false && "cuda: rand of an integer dtype is not registered");
    }
  });
  return {y};
}

struct CopyCastRegistrar {
  CopyCastRegistrar() {
    register_kernel(OpId::copy, DeviceKind::Cuda, kAllDTypes, &copy_kernel);
    register_kernel(OpId::to_dtype, DeviceKind::Cuda, kAllDTypes, &to_dtype_kernel);
    register_kernel(OpId::fill, DeviceKind::Cuda, kAllDTypes, &fill_kernel);
    register_kernel(OpId::arange, DeviceKind::Cuda, kAllDTypes, &arange_kernel);
    register_kernel(OpId::rand_uniform, DeviceKind::Cuda, kFloatDTypes, &rand_kernel<false>);
    register_kernel(OpId::rand_normal, DeviceKind::Cuda, kFloatDTypes, &rand_kernel<true>);
  }
};
const CopyCastRegistrar g_copy_cast_registrar;

}  // namespace
}  // namespace taper::cuda
