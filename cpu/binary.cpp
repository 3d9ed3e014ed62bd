// binary.cpp: CPU kernels of the binary elementwise ops: add sub mul div maximum minimum (all
// dtypes), comparisons eq ne lt le gt ge (all dtypes in, u8 out: 1 or 0), where_cond
// (u8 mask, on_true, on_false of any one dtype) and the ternary mul_add (a * b + c, float
// dtypes, one rounding: a fused multiply-add in the compute type, then the store's rounding).
// a, b: the same shape (the front-end has broadcast them with stride-0 views), any strides ->
// out: that shape, contiguous. One operand (of the binary ops, or one value of where_cond) may be
// an undefined Tensor: the scalar attrs.f0 (`x / 2.0`, `x.gt(0.0)`), converted once to the
// dtype and read with stride 0, without a one-element tensor behind it.
//
// What it is: Highway kernels for the float arithmetic (bf16/f16 load as f32, one f32 operation,
// one rounding at the store; f64 in f64), applied per inner run of a StridedLoop<3>: SIMD
// directly when the inner strides of (a, b) are (1, 1), (1, 0) or (0, 1) (a broadcast scalar is
// Set once), otherwise both runs are gathered into stack buffers first, so every layout gets the
// same arithmetic. Integer arithmetic, the comparisons and where_cond are scalar loops over the
// same runs (integer add/sub/mul wrap; x / 0 == 0; INT64_MIN / -1 == INT64_MIN).
// maximum/minimum propagate NaN (x86 max/min would return the second operand).
// What it is not: broadcasting or dtype checks (core's front-end), backward rules (core), the
// reference (tests/ref/elementwise_ref.h).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/binary.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"
#include "cpu/simd_half-inl.h"

#ifndef TAPER_CPU_BINARY_ONCE_H_
#define TAPER_CPU_BINARY_ONCE_H_
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu/cpu_common.h"
#include "taper/op.h"
#include "taper/portable.h"
#endif

HWY_BEFORE_NAMESPACE();
namespace taper::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

struct AddOp {
  template <class V> HWY_INLINE V operator()(V a, V b) const { return hn::Add(a, b); }
};
struct SubOp {
  template <class V> HWY_INLINE V operator()(V a, V b) const { return hn::Sub(a, b); }
};
struct MulOp {
  template <class V> HWY_INLINE V operator()(V a, V b) const { return hn::Mul(a, b); }
};
struct DivOp {
  template <class V> HWY_INLINE V operator()(V a, V b) const { return hn::Div(a, b); }
};
// NaN in either operand gives NaN (a + b), as PyTorch's maximum/minimum.
struct MaxOp {
  template <class V> HWY_INLINE V operator()(V a, V b) const {
    return hn::IfThenElse(hn::Or(hn::IsNaN(a), hn::IsNaN(b)), hn::Add(a, b), hn::Max(a, b));
  }
};
struct MinOp {
  template <class V> HWY_INLINE V operator()(V a, V b) const {
    return hn::IfThenElse(hn::Or(hn::IsNaN(a), hn::IsNaN(b)), hn::Add(a, b), hn::Min(a, b));
  }
};

/// Both operands contiguous. Unrolled 4x with independent loads and stores, so the loop runs at
/// memory speed; the tail (n % Lanes) reads and writes only [0, n).
template <class D, class T, class Op>
HWY_INLINE void LoopVV(D d, const T* HWY_RESTRICT a, const T* HWY_RESTRICT b, T* HWY_RESTRICT out,
                       size_t n, Op op) {
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    const auto a0 = LoadAs(d, a + i);
    const auto a1 = LoadAs(d, a + i + N);
    const auto a2 = LoadAs(d, a + i + 2 * N);
    const auto a3 = LoadAs(d, a + i + 3 * N);
    const auto b0 = LoadAs(d, b + i);
    const auto b1 = LoadAs(d, b + i + N);
    const auto b2 = LoadAs(d, b + i + 2 * N);
    const auto b3 = LoadAs(d, b + i + 3 * N);
    StoreFrom2<false>(d, op(a0, b0), op(a1, b1), out + i);
    StoreFrom2<false>(d, op(a2, b2), op(a3, b3), out + i + 2 * N);
  }
  for (; i + N <= n; i += N) StoreFrom(d, op(LoadAs(d, a + i), LoadAs(d, b + i)), out + i);
  if (i < n) {
    const size_t r = n - i;
    StoreFromN(d, op(LoadAsN(d, a + i, r), LoadAsN(d, b + i, r)), out + i, r);
  }
}

/// op(x, s) or op(s, x): which operand is the broadcast scalar s.
template <bool kScalarB, class Op, class V> HWY_INLINE V WithScalar(const Op& op, V x, V s) {
  return kScalarB ? op(x, s) : op(s, x);
}

/// One operand is a scalar broadcast along the run: `kScalarB` says which; s is its value.
template <bool kScalarB, class D, class T, class Op>
HWY_INLINE void LoopVS(D d, const T* HWY_RESTRICT v, hn::Vec<D> s, T* HWY_RESTRICT out, size_t n,
                       Op op) {
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    const auto x0 = LoadAs(d, v + i);
    const auto x1 = LoadAs(d, v + i + N);
    const auto x2 = LoadAs(d, v + i + 2 * N);
    const auto x3 = LoadAs(d, v + i + 3 * N);
    StoreFrom2<false>(d, WithScalar<kScalarB>(op, x0, s), WithScalar<kScalarB>(op, x1, s), out + i);
    StoreFrom2<false>(d, WithScalar<kScalarB>(op, x2, s), WithScalar<kScalarB>(op, x3, s),
                      out + i + 2 * N);
  }
  for (; i + N <= n; i += N) StoreFrom(d, WithScalar<kScalarB>(op, LoadAs(d, v + i), s), out + i);
  if (i < n) StoreFromN(d, WithScalar<kScalarB>(op, LoadAsN(d, v + i, n - i), s), out + i, n - i);
}

/// mode 0: a and b are runs of n; 1: b is one scalar (b[0]); 2: a is one scalar (a[0]).
template <class T, class Op>
HWY_INLINE void BinaryMode(const T* HWY_RESTRICT a, const T* HWY_RESTRICT b, T* HWY_RESTRICT out,
                           size_t n, int mode, Op op) {
  const hn::ScalableTag<compute_t<T>> d;
  if (mode == 0) return LoopVV(d, a, b, out, n, op);
  if (mode == 1) return LoopVS<true>(d, a, hn::Set(d, widen(b[0])), out, n, op);
  return LoopVS<false>(d, b, hn::Set(d, widen(a[0])), out, n, op);
}

template <class T>
HWY_INLINE void BinaryT(int op, const T* HWY_RESTRICT a, const T* HWY_RESTRICT b,
                        T* HWY_RESTRICT out, size_t n, int mode) {
  switch (static_cast<OpId>(op)) {
    case OpId::add: return BinaryMode(a, b, out, n, mode, AddOp());
    case OpId::sub: return BinaryMode(a, b, out, n, mode, SubOp());
    case OpId::mul: return BinaryMode(a, b, out, n, mode, MulOp());
    case OpId::div: return BinaryMode(a, b, out, n, mode, DivOp());
    case OpId::maximum: return BinaryMode(a, b, out, n, mode, MaxOp());
    case OpId::minimum: return BinaryMode(a, b, out, n, mode, MinOp());
    default: HWY_ASSERT(false);
  }
}

// a and b may alias each other (x + x); neither aliases out.
void BinaryBF16(int op, const bf16* a, const bf16* b, bf16* HWY_RESTRICT out, size_t n, int mode) {
  BinaryT(op, a, b, out, n, mode);
}
void BinaryF16(int op, const f16* a, const f16* b, f16* HWY_RESTRICT out, size_t n, int mode) {
  BinaryT(op, a, b, out, n, mode);
}
void BinaryF32(int op, const float* a, const float* b, float* HWY_RESTRICT out, size_t n,
               int mode) {
  BinaryT(op, a, b, out, n, mode);
}
void BinaryF64(int op, const double* a, const double* b, double* HWY_RESTRICT out, size_t n,
               int mode) {
  BinaryT(op, a, b, out, n, mode);
}

// ---- mul_add ----
// a * b + c rounded once in the compute type (f32 for the half types, then the store's rounding).
// x86 targets from AVX2 up use the FMA instruction; the others (SSE4, EMU128, the scalar target,
// other ISAs) call std::fma per element, since Highway's MulAdd there may be a product and a
// sum, two roundings: the same bits on every target, and what the reference computes.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#define TAPER_MUL_ADD_HAS_FMA 1
#else
#define TAPER_MUL_ADD_HAS_FMA 0
#endif

/// out[i] = a[i*sa] * b[i*sb] + c[i*sc] for i < n, each stride 1 (a run) or 0 (a scalar).
template <class T>
HWY_INLINE void MulAddT(const T* HWY_RESTRICT a, const T* HWY_RESTRICT b, const T* HWY_RESTRICT c,
                        T* HWY_RESTRICT out, size_t n, size_t sa, size_t sb, size_t sc) {
  size_t i = 0;
#if TAPER_MUL_ADD_HAS_FMA
  const hn::ScalableTag<compute_t<T>> d;
  const size_t N = hn::Lanes(d);
  const auto load = [&](const T* p, size_t st, size_t at) {
    return st == 0 ? hn::Set(d, widen(p[0])) : LoadAs(d, p + at);
  };
  for (; i + 2 * N <= n; i += 2 * N) {
    const auto r0 = hn::MulAdd(load(a, sa, i), load(b, sb, i), load(c, sc, i));
    const auto r1 = hn::MulAdd(load(a, sa, i + N), load(b, sb, i + N), load(c, sc, i + N));
    StoreFrom2<false>(d, r0, r1, out + i);
  }
#endif
  for (; i < n; ++i)
    out[i] = round_to<T>(std::fma(widen(a[i * sa]), widen(b[i * sb]), widen(c[i * sc])));
}

void MulAddBF16(const bf16* a, const bf16* b, const bf16* c, bf16* HWY_RESTRICT out, size_t n,
                size_t sa, size_t sb, size_t sc) {
  MulAddT(a, b, c, out, n, sa, sb, sc);
}
void MulAddF16(const f16* a, const f16* b, const f16* c, f16* HWY_RESTRICT out, size_t n,
               size_t sa, size_t sb, size_t sc) {
  MulAddT(a, b, c, out, n, sa, sb, sc);
}
void MulAddF32(const float* a, const float* b, const float* c, float* HWY_RESTRICT out, size_t n,
               size_t sa, size_t sb, size_t sc) {
  MulAddT(a, b, c, out, n, sa, sb, sc);
}
void MulAddF64(const double* a, const double* b, const double* c, double* HWY_RESTRICT out,
               size_t n, size_t sa, size_t sb, size_t sc) {
  MulAddT(a, b, c, out, n, sa, sb, sc);
}
#undef TAPER_MUL_ADD_HAS_FMA

}  // namespace taper::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace taper::cpu {

HWY_EXPORT(BinaryBF16);
HWY_EXPORT(BinaryF16);
HWY_EXPORT(BinaryF32);
HWY_EXPORT(BinaryF64);
HWY_EXPORT(MulAddBF16);
HWY_EXPORT(MulAddF16);
HWY_EXPORT(MulAddF32);
HWY_EXPORT(MulAddF64);

namespace {

/// Elements per work item inside one inner run; a thread takes whole items.
constexpr size_t kBlock = 8192;
/// Elements gathered at a time from runs SIMD cannot read directly (stack buffers).
constexpr size_t kGather = 512;

void binary_simd(int op, const bf16* a, const bf16* b, bf16* out, size_t n, int mode) {
  HWY_DYNAMIC_DISPATCH(BinaryBF16)(op, a, b, out, n, mode);
}
void binary_simd(int op, const f16* a, const f16* b, f16* out, size_t n, int mode) {
  HWY_DYNAMIC_DISPATCH(BinaryF16)(op, a, b, out, n, mode);
}
void binary_simd(int op, const float* a, const float* b, float* out, size_t n, int mode) {
  HWY_DYNAMIC_DISPATCH(BinaryF32)(op, a, b, out, n, mode);
}
void binary_simd(int op, const double* a, const double* b, double* out, size_t n, int mode) {
  HWY_DYNAMIC_DISPATCH(BinaryF64)(op, a, b, out, n, mode);
}

/// Calls f(ptrs, inner strides, len) over the elements of `shape` in row-major order for the
/// operands (out first, contiguous), in blocks of at most kBlock elements spread over the pool.
/// ptrs[k] is the element offset of operand k at the block's start.
template <size_t N, class F>
void for_each_block(const Shape& shape, const std::array<const std::vector<int64_t>*, N>& strides,
                    F&& f) {
  if (shape.elem_count() == 0) return;
  const StridedLoop<N> loop(shape, strides);
  TAPER_ASSERT(loop.inner_stride[0] == 1 || loop.inner == 1);
  const size_t inner = loop.inner;
  const size_t per_run = (inner + kBlock - 1) / kBlock;
  const size_t items = loop.outer_count * per_run;
  const size_t grain = std::max<size_t>(1, kElemGrain / std::min(inner, kBlock));
  parallel_for(items, grain, [&](size_t begin, size_t end) {
    for (size_t it = begin; it < end; ++it) {
      const size_t run = it / per_run;
      const size_t start = (it % per_run) * kBlock;
      auto off = loop.offsets(run);
      for (size_t k = 0; k < N; ++k) off[k] += static_cast<int64_t>(start) * loop.inner_stride[k];
      f(off, loop.inner_stride, std::min(kBlock, inner - start));
    }
  });
}

/// One operand of a kernel below: its elements and strides (in the output's shape). A scalar
/// operand (an undefined input: the op attribute f0) is one value read with stride 0.
struct Operand {
  const void* data;
  const std::vector<int64_t>* strides;
};

/// The operands of `in`: a defined input as it is; an undefined one is attrs.f0 converted once to
/// T (cast_value, as Tensor::full converts it, so `x / 2.0` has the bits of `x / full(2.0)`),
/// kept in `scalar` and read through `zero` strides.
template <class T, size_t N>
std::array<Operand, N> operands(const std::vector<Tensor>& in, size_t first, const OpAttrs& attrs,
                                T& scalar, const std::vector<int64_t>& zero) {
  std::array<Operand, N> ops;
  scalar = cast_value<T>(attrs.f0);
  for (size_t k = 0; k < N; ++k) {
    const Tensor& t = in[first + k];
    ops[k] = t.defined() ? Operand{t.data_ptr(), &t.strides()} : Operand{&scalar, &zero};
  }
  return ops;
}

template <class T>
void arith_float(OpId op, const Operand& a, const Operand& b, const Tensor& out) {
  const T* pa = static_cast<const T*>(a.data);
  const T* pb = static_cast<const T*>(b.data);
  T* po = out.data<T>();
  const int iop = static_cast<int>(op);
  for_each_block<3>(out.shape(), {&out.strides(), a.strides, b.strides},
                    [&](const std::array<int64_t, 3>& off, const std::array<int64_t, 3>& st,
                        size_t len) {
    const T* ra = pa + off[1];
    const T* rb = pb + off[2];
    T* ro = po + off[0];
    const int64_t sa = st[1], sb = st[2];
    if (sa == 1 && sb == 1) return binary_simd(iop, ra, rb, ro, len, 0);
    if (sa == 1 && sb == 0) return binary_simd(iop, ra, rb, ro, len, 1);
    if (sa == 0 && sb == 1) return binary_simd(iop, ra, rb, ro, len, 2);
    T ba[kGather], bb[kGather];
    for (size_t c = 0; c < len; c += kGather) {
      const size_t m = std::min(kGather, len - c);
      for (size_t k = 0; k < m; ++k) {
        ba[k] = ra[static_cast<int64_t>(c + k) * sa];
        bb[k] = rb[static_cast<int64_t>(c + k) * sb];
      }
      binary_simd(iop, ba, bb, ro + c, m, 0);
    }
  });
}

// ---- scalar parts: integer arithmetic, comparisons, where_cond --------------------------------

/// The value a comparison or integer op works on: f32 for the half types, T itself otherwise.
template <class T> auto scalar_value(T v) {
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
    return static_cast<float>(v);
  } else {
    return v;
  }
}

template <class T, class R, class F>
void scalar_map2(const Operand& a, const Operand& b, const Tensor& out, F f) {
  const T* pa = static_cast<const T*>(a.data);
  const T* pb = static_cast<const T*>(b.data);
  R* po = out.data<R>();
  for_each_block<3>(out.shape(), {&out.strides(), a.strides, b.strides},
                    [&](const std::array<int64_t, 3>& off, const std::array<int64_t, 3>& st,
                        size_t len) {
    const T* ra = pa + off[1];
    const T* rb = pb + off[2];
    R* ro = po + off[0];
    const int64_t sa = st[1], sb = st[2];
    if (sa == 1 && sb == 1) {  // the common case, kept free of stride multiplies
      for (size_t k = 0; k < len; ++k) ro[k] = f(ra[k], rb[k]);
    } else {
      for (size_t k = 0; k < len; ++k)
        ro[k] = f(ra[static_cast<int64_t>(k) * sa], rb[static_cast<int64_t>(k) * sb]);
    }
  });
}

template <class T> void arith_int(OpId op, const Operand& a, const Operand& b, const Tensor& out) {
  using U = std::make_unsigned_t<T>;
  // Wrapping arithmetic through the unsigned type; u8 products go through u32 (no int overflow).
  switch (op) {
    case OpId::add:
      return scalar_map2<T, T>(a, b, out, [](T x, T y) { return static_cast<T>(static_cast<U>(x) + static_cast<U>(y)); });
    case OpId::sub:
      return scalar_map2<T, T>(a, b, out, [](T x, T y) { return static_cast<T>(static_cast<U>(x) - static_cast<U>(y)); });
    case OpId::mul:
      return scalar_map2<T, T>(a, b, out, [](T x, T y) {
        using W = std::conditional_t<(sizeof(U) < 4), uint32_t, U>;
        return static_cast<T>(static_cast<W>(static_cast<U>(x)) * static_cast<W>(static_cast<U>(y)));
      });
    case OpId::div:
      return scalar_map2<T, T>(a, b, out, [](T x, T y) -> T {
        if (y == T{0}) return T{0};  // defined as 0 rather than a trap
        if constexpr (std::is_signed_v<T>) {
          if (y == T{-1}) return static_cast<T>(U{0} - static_cast<U>(x));  // MIN / -1 wraps
        }
        return static_cast<T>(x / y);
      });
    case OpId::maximum: return scalar_map2<T, T>(a, b, out, [](T x, T y) { return x < y ? y : x; });
    case OpId::minimum: return scalar_map2<T, T>(a, b, out, [](T x, T y) { return y < x ? y : x; });
    default: TAPER_ASSERT(false && "integer binary op without a kernel");
  }
}

template <class T> void compare(OpId op, const Operand& a, const Operand& b, const Tensor& out) {
  const auto run = [&](auto cmp) {
    scalar_map2<T, uint8_t>(a, b, out, [cmp](T x, T y) {
      return static_cast<uint8_t>(cmp(scalar_value(x), scalar_value(y)) ? 1 : 0);
    });
  };
  switch (op) {
    case OpId::eq: return run([](auto x, auto y) { return x == y; });
    case OpId::ne: return run([](auto x, auto y) { return x != y; });
    case OpId::lt: return run([](auto x, auto y) { return x < y; });
    case OpId::le: return run([](auto x, auto y) { return x <= y; });
    case OpId::gt: return run([](auto x, auto y) { return x > y; });
    case OpId::ge: return run([](auto x, auto y) { return x >= y; });
    default: TAPER_ASSERT(false && "not a comparison");
  }
}

/// in: a, b of one shape and dtype, or one of them undefined: the scalar attrs.f0 (x / 2.0,
/// 1.0 / x, x > 0.0 without a one-element tensor, its allocation and its fill).
template <OpId kOp>
std::vector<Tensor> binary_kernel(const std::vector<Tensor>& in, const OpAttrs& attrs) {
  const Tensor& x = in[0].defined() ? in[0] : in[1];
  TAPER_ASSERT(!in[0].defined() || !in[1].defined() ||
               (in[0].shape() == in[1].shape() && in[0].dtype() == in[1].dtype()));
  constexpr bool kCompare = kOp == OpId::eq || kOp == OpId::ne || kOp == OpId::lt ||
                            kOp == OpId::le || kOp == OpId::gt || kOp == OpId::ge;
  Tensor out = new_output(x.shape(), kCompare ? DType::U8 : x.dtype());
  const std::vector<int64_t> zero(x.rank(), 0);
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T scalar;
    const auto [a, b] = operands<T, 2>(in, 0, attrs, scalar, zero);
    if constexpr (kCompare) {
      compare<T>(kOp, a, b, out);
    } else if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16> ||
                         std::is_floating_point_v<T>) {
      arith_float<T>(kOp, a, b, out);
    } else {
      arith_int<T>(kOp, a, b, out);
    }
  });
  return {out};
}

/// Picks on_true/on_false by element size: a select moves bits, so 4 widths serve 7 dtypes.
template <class W>
void where_bits(const Tensor& m, const Operand& t, const Operand& f, const Tensor& out) {
  const uint8_t* pm = m.data<uint8_t>();
  const W* pt = static_cast<const W*>(t.data);
  const W* pf = static_cast<const W*>(f.data);
  W* po = static_cast<W*>(out.data_ptr());
  for_each_block<4>(out.shape(), {&out.strides(), &m.strides(), t.strides, f.strides},
                    [&](const std::array<int64_t, 4>& off, const std::array<int64_t, 4>& st,
                        size_t len) {
    const uint8_t* rm = pm + off[1];
    const W* rt = pt + off[2];
    const W* rf = pf + off[3];
    W* ro = po + off[0];
    for (size_t k = 0; k < len; ++k) {
      const int64_t i = static_cast<int64_t>(k);
      ro[k] = rm[i * st[1]] != 0 ? rt[i * st[2]] : rf[i * st[3]];
    }
  });
}

// in[0]: u8 mask, in[1]: on_true, in[2]: on_false (same shape and dtype; one of the two may be
// undefined: the scalar attrs.f0). The registry selects this kernel by in[0]'s dtype (u8); it
// serves every dtype of the values.
std::vector<Tensor> where_cond_kernel(const std::vector<Tensor>& in, const OpAttrs& attrs) {
  const Tensor& m = in[0];
  const Tensor& v = in[1].defined() ? in[1] : in[2];
  TAPER_ASSERT(m.dtype() == DType::U8 && m.shape() == v.shape());
  TAPER_ASSERT(!in[1].defined() || !in[2].defined() ||
               (in[1].dtype() == in[2].dtype() && in[1].shape() == in[2].shape()));
  Tensor out = new_output(v.shape(), v.dtype());
  const std::vector<int64_t> zero(v.rank(), 0);
  visit_dtype(v.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T scalar;
    const auto [t, f] = operands<T, 2>(in, 1, attrs, scalar, zero);
    where_bits<typename Bits<sizeof(T)>::type>(m, t, f, out);
  });
  return {out};
}

void mul_add_simd(const bf16* a, const bf16* b, const bf16* c, bf16* out, size_t n, size_t sa,
                  size_t sb, size_t sc) {
  HWY_DYNAMIC_DISPATCH(MulAddBF16)(a, b, c, out, n, sa, sb, sc);
}
void mul_add_simd(const f16* a, const f16* b, const f16* c, f16* out, size_t n, size_t sa,
                  size_t sb, size_t sc) {
  HWY_DYNAMIC_DISPATCH(MulAddF16)(a, b, c, out, n, sa, sb, sc);
}
void mul_add_simd(const float* a, const float* b, const float* c, float* out, size_t n, size_t sa,
                  size_t sb, size_t sc) {
  HWY_DYNAMIC_DISPATCH(MulAddF32)(a, b, c, out, n, sa, sb, sc);
}
void mul_add_simd(const double* a, const double* b, const double* c, double* out, size_t n,
                  size_t sa, size_t sb, size_t sc) {
  HWY_DYNAMIC_DISPATCH(MulAddF64)(a, b, c, out, n, sa, sb, sc);
}

/// in: a, b, c of one float dtype and shape (the front-end broadcast them), any strides. Runs
/// whose inner stride is 1 or 0 go to SIMD as they are; others are gathered first.
std::vector<Tensor> mul_add_kernel(const std::vector<Tensor>& in, const OpAttrs&) {
  const Tensor& a = in[0];
  const Tensor& b = in[1];
  const Tensor& c = in[2];
  TAPER_ASSERT(a.dtype() == b.dtype() && b.dtype() == c.dtype());
  TAPER_ASSERT(a.shape() == b.shape() && b.shape() == c.shape());
  Tensor out = new_output(a.shape(), a.dtype());
  visit_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (is_float(dtype_of_v<T>)) {
      const std::array<const T*, 3> base = {a.data<T>(), b.data<T>(), c.data<T>()};
      T* po = out.data<T>();
      for_each_block<4>(out.shape(), {&out.strides(), &a.strides(), &b.strides(), &c.strides()},
                        [&](const std::array<int64_t, 4>& off, const std::array<int64_t, 4>& st,
                            size_t len) {
        std::array<const T*, 3> p;
        std::array<size_t, 3> s;
        bool direct = true;
        for (size_t k = 0; k < 3; ++k) {
          p[k] = base[k] + off[k + 1];
          s[k] = static_cast<size_t>(st[k + 1]);
          direct = direct && (st[k + 1] == 0 || st[k + 1] == 1);
        }
        if (direct) return mul_add_simd(p[0], p[1], p[2], po + off[0], len, s[0], s[1], s[2]);
        T buf[3][kGather];
        for (size_t at = 0; at < len; at += kGather) {
          const size_t m = std::min(kGather, len - at);
          for (size_t k = 0; k < 3; ++k)
            for (size_t e = 0; e < m; ++e) buf[k][e] = p[k][static_cast<int64_t>(at + e) * st[k + 1]];
          mul_add_simd(buf[0], buf[1], buf[2], po + off[0] + at, m, 1, 1, 1);
        }
      });
    } else {
      TAPER_ASSERT(false && "mul_add: integer dtypes are not registered");
    }
  });
  return {out};
}

struct BinaryRegistrar {
  BinaryRegistrar() {
    const auto reg = [](OpId op, KernelFn fn) {
      register_kernel(op, DeviceKind::Cpu, kAllDTypes, fn, /*needs_contiguous=*/false);
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
    register_kernel(OpId::mul_add, DeviceKind::Cpu, kFloatDTypes, &mul_add_kernel, false);
  }
};
const BinaryRegistrar g_binary_registrar;

}  // namespace
}  // namespace taper::cpu
#endif  // HWY_ONCE
