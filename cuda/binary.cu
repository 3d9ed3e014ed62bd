// binary.cu: CUDA kernels of the binary elementwise ops, the twins of cpu/binary.cpp: add sub
// mul div maximum minimum (all dtypes), comparisons eq ne lt le gt ge (all dtypes in, u8 out:
// 1 or 0), where_cond (u8 mask, on_true, on_false of any one dtype) and the ternary mul_add
// (a * b + c, float dtypes, one fma in the compute type).
// Inputs: one shape (the front-end broadcast them with stride-0 views), any strides -> out: that
// shape, contiguous. One operand of a binary op or one value of where_cond may be an undefined
// Tensor: the scalar attrs.f0, passed by value in the kernel's arguments (no tensor, no fill).
//
// What it is: one grid-stride kernel per (family, dtype) over the row-major output index; the
// operands' offsets come from a coalesced Strided<2> / Strided<3> (rank <= 1 layouts, i.e.
// dense operands and broadcast scalars, skip the index division). The op within a family is a
// run-time code (a warp-uniform switch: these ops are one instruction each, so 7 kernels per
// family rather than 42). Floats compute in compute_t<T> and round once at the store; integer
// add/sub/mul wrap, x / 0 == 0, INT64_MIN / -1 == INT64_MIN. where_cond moves bits (4 widths).
// What it is not: broadcasting or dtype checks (core's front-end), backward rules (core), the
// reference (tests/ref/elementwise_ref.h).
//
// Semantics that follow the CPU bit for bit: maximum/minimum return a + b when either operand is
// NaN, else x86's maxps/minps rule (a > b ? a : b, a < b ? a : b; so max(-0, +0) == +0 and
// max(+0, -0) == -0, as the CPU's AVX2/AVX3 targets); comparisons of bf16/f16 compare the f32
// values; mul_add is std::fma's single rounding (then the half store's). Every result is exact
// or correctly rounded, so the bits equal the CPU's except NaN payloads (a GPU NaN result is the
// canonical 0x7fffffff; x86 propagates the first operand's payload).
#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cuda/cuda_common.cuh"
#include "taper/dtype.h"
#include "taper/op.h"

namespace taper::cuda {
namespace {

/// f(i, off) for every row-major i < n, off[k] the element offset of operand k.
template <int N, class F>
__global__ void __launch_bounds__(kThreads) map_n(int64_t n, Strided<N> s, F f) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += step) {
    int64_t off[N];
    if (s.rank <= 1) {
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] = s.rank == 0 ? 0 : i * s.strides[k][0];
    } else {
      s.offsets(i, off);
    }
    f(i, off);
  }
}

/// Launches f over `out`'s elements (at least one) on its stream; `s` is the operands' layout.
template <int N, class F>
void launch(OpId op, const std::vector<Tensor>& in, const Tensor& out, const Strided<N>& s,
            const F& f) {
  const size_t n = out.elem_count();
  const int ord = out.device().ordinal();
  const cudaStream_t stm = stream(ord);
  map_n<<<grid_for(n, ord), kThreads, 0, stm>>>(static_cast<int64_t>(n), s, f);
  TAPER_CUDA_CHECK_LAUNCH(op_name(op).data(), in);
}

/// An operand of the functors below: its elements, or (p == nullptr) the scalar s, an undefined
/// input standing for attrs.f0 (`x / 2.0`, `x.gt(0.0)`), converted once to T on the host as
/// Tensor::full converts it. The branch is uniform over the grid.
template <class T> struct Src {
  const T* p;
  T s;
  __device__ __forceinline__ T operator[](int64_t off) const { return p != nullptr ? p[off] : s; }
};

/// The operand for input t (undefined: the scalar v) and its strides (zero for the scalar).
template <class T> Src<T> src(const Tensor& t, double v) {
  return t.defined() ? Src<T>{ptr<T>(t), T{}} : Src<T>{nullptr, cast_value<T>(v)};
}
const std::vector<int64_t>* strides_of(const Tensor& t, const std::vector<int64_t>& zero) {
  return t.defined() ? &t.strides() : &zero;
}

// ---- arithmetic ------------------------------------------------------------------------------

template <class T> __device__ __forceinline__ T arith(OpId op, T x, T y) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    using W = std::conditional_t<(sizeof(U) < 4), uint32_t, U>;  // u8 products: no int overflow
    switch (op) {
      case OpId::add: return static_cast<T>(static_cast<U>(x) + static_cast<U>(y));
      case OpId::sub: return static_cast<T>(static_cast<U>(x) - static_cast<U>(y));
      case OpId::mul:
        return static_cast<T>(static_cast<W>(static_cast<U>(x)) *
                              static_cast<W>(static_cast<U>(y)));
      case OpId::div:
        if (y == T{0}) return T{0};  // defined as 0 rather than a trap
        if constexpr (std::is_signed_v<T>) {
          if (y == T{-1}) return static_cast<T>(U{0} - static_cast<U>(x));  // MIN / -1 wraps
        }
        return static_cast<T>(x / y);
      case OpId::maximum: return x < y ? y : x;
      default: return y < x ? y : x;  // minimum
    }
  } else {
    using C = compute_t<T>;
    const C a = widen(x), b = widen(y);
    C r;
    switch (op) {
      case OpId::add: r = a + b; break;
      case OpId::sub: r = a - b; break;
      case OpId::mul: r = a * b; break;
      case OpId::div: r = a / b; break;
      case OpId::maximum: r = (a != a || b != b) ? a + b : (a > b ? a : b); break;
      default: r = (a != a || b != b) ? a + b : (a < b ? a : b); break;  // minimum
    }
    return round_to<T>(r);
  }
}

template <class T> struct ArithFn {
  Src<T> a;
  Src<T> b;
  T* y;
  OpId op;
  __device__ __forceinline__ void operator()(int64_t i, const int64_t (&off)[2]) const {
    y[i] = arith(op, a[off[0]], b[off[1]]);
  }
};

// ---- comparisons -----------------------------------------------------------------------------

/// The value a comparison works on: f32 for the half types, T itself otherwise.
template <class T> __device__ __forceinline__ auto cmp_value(T v) {
  if constexpr (is_half_v<T>) return static_cast<float>(v);
  else return v;
}

template <class T> struct CompareFn {
  Src<T> a;
  Src<T> b;
  uint8_t* y;
  OpId op;
  __device__ __forceinline__ void operator()(int64_t i, const int64_t (&off)[2]) const {
    const auto x = cmp_value(a[off[0]]), z = cmp_value(b[off[1]]);
    bool r;
    switch (op) {
      case OpId::eq: r = x == z; break;
      case OpId::ne: r = x != z; break;
      case OpId::lt: r = x < z; break;
      case OpId::le: r = x <= z; break;
      case OpId::gt: r = x > z; break;
      default: r = x >= z; break;  // ge
    }
    y[i] = r ? 1 : 0;
  }
};

/// y = op(a, b) over n dense elements: 16-byte vectors, the n % (16 / sizeof(T)) tail by the
/// first threads of block 0.
template <class T>
__global__ void __launch_bounds__(kThreads)
    arith_dense(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y, int64_t n,
                OpId op) {
  constexpr int kV = 16 / sizeof(T);
  const int64_t nv = n / kV;
  const auto* va = reinterpret_cast<const Vec16<T>*>(a);
  const auto* vb = reinterpret_cast<const Vec16<T>*>(b);
  auto* vy = reinterpret_cast<Vec16<T>*>(y);
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < nv;
       i += step) {
    const Vec16<T> x = va[i], z = vb[i];
    Vec16<T> r;
#pragma unroll
    for (int k = 0; k < kV; ++k) r.v[k] = arith(op, x.v[k], z.v[k]);
    vy[i] = r;
  }
  if (blockIdx.x == 0 && threadIdx.x < n - nv * kV) {
    const int64_t i = nv * kV + threadIdx.x;
    y[i] = arith(op, a[i], b[i]);
  }
}

bool aligned16(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

/// The vector of operand a at offset off: a load where its run has stride 1 (`vec`), else its one
/// value there (a broadcast run, or the scalar) in every lane.
template <class T>
__device__ __forceinline__ Vec16<T> run_at(const Src<T>& a, int64_t off, bool vec) {
  if (vec) return *reinterpret_cast<const Vec16<T>*>(a.p + off);
  Vec16<T> x;
  const T c = a[off];
#pragma unroll
  for (int k = 0; k < static_cast<int>(16 / sizeof(T)); ++k) x.v[k] = c;
  return x;
}

/// y = op(a, b) when the innermost coalesced dim is a run in each operand, contiguous (stride 1)
/// or one broadcast value (stride 0), of a length divisible by the vector width, every
/// contiguous run starting 16-byte aligned: one Vec16 per thread and iteration, and one index
/// division chain (s.offsets) per vector instead of per element. Bias adds ((rows, D) + (D)),
/// the attention mask ((B, H, T, T) + (B, 1, 1, T)) and x + scalar take it.
template <class T>
__global__ void __launch_bounds__(kThreads)
    arith_runs(Strided<2> s, Src<T> a, Src<T> b, T* __restrict__ y, int64_t nv, OpId op) {
  constexpr int kV = 16 / sizeof(T);
  const int last = s.rank - 1;
  const bool va = s.strides[0][last] == 1, vb = s.strides[1][last] == 1;
  for_each_vector<2, kV>(nv, s, [&](int64_t v, const int64_t (&off)[2]) {
    const Vec16<T> x = run_at(a, off[0], va), z = run_at(b, off[1], vb);
    Vec16<T> r;
#pragma unroll
    for (int k = 0; k < kV; ++k) r.v[k] = arith(op, x.v[k], z.v[k]);
    reinterpret_cast<Vec16<T>*>(y)[v] = r;
  });
}

constexpr bool is_compare(OpId op) {
  return op == OpId::eq || op == OpId::ne || op == OpId::lt || op == OpId::le || op == OpId::gt ||
         op == OpId::ge;
}

// in: a, b of one shape and dtype, or one of them undefined: the scalar attrs.f0.
template <OpId kOp>
std::vector<Tensor> binary_kernel(const std::vector<Tensor>& in, const OpAttrs& attrs) {
  const Tensor& a = in[0];
  const Tensor& b = in[1];
  const Tensor& x = a.defined() ? a : b;
  TAPER_ASSERT(!a.defined() || !b.defined() || (a.shape() == b.shape() && a.dtype() == b.dtype()));
  constexpr bool kCompare = is_compare(kOp);
  Tensor out = new_output(x.shape(), kCompare ? DType::U8 : x.dtype(), x);
  if (out.elem_count() == 0) return {out};
  const std::vector<int64_t> zero(x.rank(), 0);
  const Strided<2> s = make_strided<2>(out.shape(), {strides_of(a, zero), strides_of(b, zero)});
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const Src<T> sa = src<T>(a, attrs.f0), sb = src<T>(b, attrs.f0);
    if constexpr (kCompare) {
      launch<2>(kOp, in, out, s, CompareFn<T>{sa, sb, ptr<uint8_t>(out), kOp});
    } else if (a.defined() && b.defined() && a.is_contiguous() && b.is_contiguous() &&
               aligned16(a) && aligned16(b)) {
      const int64_t n = static_cast<int64_t>(out.elem_count());
      const int ord = out.device().ordinal();
      const size_t nv = static_cast<size_t>(n) / (16 / sizeof(T));
      arith_dense<T><<<grid_for(nv > 0 ? nv : 1, ord), kThreads, 0, stream(ord)>>>(
          ptr<T>(a), ptr<T>(b), ptr<T>(out), n, kOp);
      TAPER_CUDA_CHECK_LAUNCH(op_name(kOp).data(), in);
    } else if (runs_in_vectors<2>(s, {sa.p, sb.p}, sizeof(T), /*splat_runs=*/true)) {
      const int ord = out.device().ordinal();
      const int64_t nv = static_cast<int64_t>(out.elem_count() / (16 / sizeof(T)));
      arith_runs<T><<<grid_for(static_cast<size_t>(nv), ord), kThreads, 0, stream(ord)>>>(
          s, sa, sb, ptr<T>(out), nv, kOp);
      TAPER_CUDA_CHECK_LAUNCH(op_name(kOp).data(), in);
    } else {
      launch<2>(kOp, in, out, s, ArithFn<T>{sa, sb, ptr<T>(out), kOp});
    }
  });
  return {out};
}

// ---- where_cond, mul_add ---------------------------------------------------------------------

template <class W> struct WhereFn {
  const uint8_t* m;
  Src<W> t;
  Src<W> f;
  W* y;
  __device__ __forceinline__ void operator()(int64_t i, const int64_t (&off)[3]) const {
    y[i] = m[off[0]] != 0 ? t[off[1]] : f[off[2]];
  }
};

// in[0]: u8 mask, in[1]: on_true, in[2]: on_false (same shape and dtype; one of the two may be
// undefined: the scalar attrs.f0). The registry selects this kernel by in[0]'s dtype (u8); it
// serves every dtype of the values, by element size.
std::vector<Tensor> where_cond_kernel(const std::vector<Tensor>& in, const OpAttrs& attrs) {
  const Tensor& m = in[0];
  const Tensor& t = in[1];
  const Tensor& f = in[2];
  const Tensor& v = t.defined() ? t : f;
  TAPER_ASSERT(m.dtype() == DType::U8 && m.shape() == v.shape());
  TAPER_ASSERT(!t.defined() || !f.defined() || (t.dtype() == f.dtype() && t.shape() == f.shape()));
  Tensor out = new_output(v.shape(), v.dtype(), v);
  if (out.elem_count() == 0) return {out};
  const std::vector<int64_t> zero(v.rank(), 0);
  visit_dtype(v.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using W = typename Bits<sizeof(T)>::type;
    const auto bits = [&](const Tensor& u) {
      if (u.defined()) return Src<W>{ptr<W>(u), W{}};
      const T s = cast_value<T>(attrs.f0);
      W w;
      std::memcpy(&w, &s, sizeof(W));
      return Src<W>{nullptr, w};
    };
    const Strided<3> s =
        make_strided<3>(out.shape(), {&m.strides(), strides_of(t, zero), strides_of(f, zero)});
    launch<3>(OpId::where_cond, in, out, s, WhereFn<W>{ptr<uint8_t>(m), bits(t), bits(f), ptr<W>(out)});
  });
  return {out};
}

template <class T> struct MulAddFn {
  const T* a;
  const T* b;
  const T* c;
  T* y;
  __device__ __forceinline__ void operator()(int64_t i, const int64_t (&off)[3]) const {
    y[i] = round_to<T>(fma(widen(a[off[0]]), widen(b[off[1]]), widen(c[off[2]])));
  }
};

// in: a, b, c of one float dtype and shape, any strides: a * b + c rounded once in the compute
// type (f32 for the half types, then the store's rounding), as the CPU's std::fma / FMA.
std::vector<Tensor> mul_add_kernel(const std::vector<Tensor>& in, const OpAttrs&) {
  const Tensor& a = in[0];
  const Tensor& b = in[1];
  const Tensor& c = in[2];
  TAPER_ASSERT(a.dtype() == b.dtype() && b.dtype() == c.dtype());
  TAPER_ASSERT(a.shape() == b.shape() && b.shape() == c.shape());
  Tensor out = new_output(a.shape(), a.dtype(), a);
  if (out.elem_count() == 0) return {out};
  visit_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_integral_v<T>) {
      launch<3>(OpId::mul_add, in, out,
                make_strided<3>(out.shape(), {&a.strides(), &b.strides(), &c.strides()}),
                MulAddFn<T>{ptr<T>(a), ptr<T>(b), ptr<T>(c), ptr<T>(out)});
    } else {
      TAPER_ASSERT(false && "cuda: mul_add of an integer dtype is not registered");
    }
  });
  return {out};
}

struct BinaryRegistrar {
  BinaryRegistrar() {
    const auto reg = [](OpId op, KernelFn fn) {
      register_kernel(op, DeviceKind::Cuda, kAllDTypes, fn, /*needs_contiguous=*/false);
    };
    reg(OpId::add, &binary_kernel<OpId::add>);
    reg(OpId::sub, &binary_kernel<OpId::sub>);
    reg(OpId::mul, &binary_kernel<OpId::mul>);
    reg(OpId::div, &binary_kernel<OpId::div>);
    reg(OpId::maximum, &binary_kernel<OpId::maximum>);
    reg(OpId::minimum, &binary_kernel<OpId::minimum>);
    reg(OpId::eq, &binary_kernel<OpId::eq>);
    reg(OpId::ne, &binary_kernel<OpId::ne>);
    reg(OpId::lt, &binary_kernel<OpId::lt>);
    reg(OpId::le, &binary_kernel<OpId::le>);
    reg(OpId::gt, &binary_kernel<OpId::gt>);
    reg(OpId::ge, &binary_kernel<OpId::ge>);
    reg(OpId::where_cond, &where_cond_kernel);
    register_kernel(OpId::mul_add, DeviceKind::Cuda, kFloatDTypes, &mul_add_kernel, false);
  }
};
const BinaryRegistrar g_binary_registrar;

}  // namespace
}  // namespace taper::cuda
