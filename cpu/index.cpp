// index.cpp: CPU kernels of the index family: index_select, gather, scatter_add, cat and
// narrow_bwd (the backward of narrow).
//
// Shapes (d = attrs.i0, the dim):
//   index_select: x (..., D, ...), idx (L) i64/u32 -> out (..., L, ...)
//   gather:       x (..., D, ...), idx (..., J, ...) -> out idx's shape, out[p] = x[p with p_d =
//   idx[p]] scatter_add:  x (..., D, ...), idx (..., J, ...), src idx's shape -> out = x, then
//                 out[p with p_d = idx[p]] += src[p] for every p of idx
//   cat:          xs_i (..., D_i, ...) -> out (..., sum D_i, ...)
//   narrow_bwd:   g (..., L, ...), attrs.ints = {start, full_len} -> zeros (..., full_len, ...)
//                 with g at [start, start + L) along d
// Inputs may be strided views (read in place); outputs are contiguous. Runs that are dense on
// both sides are memcpy'd. Every index is checked before anything is written, so a bad index
// throws taper::Error (naming the op, the index, the dim and its size) and leaves no half-written
// output. scatter_add on bf16/f16 adds in f32 and rounds once per add; integer adds wrap.
// What it is not: SIMD code (these are data movement; memcpy is the fast path), or the
// front-end's argument checks (core/src/tensor_ops.cpp), which run first.
#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/cpu_common.h"

namespace taper::cpu {
namespace {

/// Element of an index tensor (i64 or u32) at element offset `off`.
inline int64_t index_at(const void* base, DType dt, int64_t off) {
  if (dt == DType::U32) return static_cast<int64_t>(static_cast<const uint32_t*>(base)[off]);
  return static_cast<const int64_t*>(base)[off];
}

/// Throws Error (before any write) unless every element of `idx` is in [0, limit).
void check_indices(const char* op, const Tensor& idx, size_t limit, size_t dim) {
  TAPER_CHECK(idx.dtype() == DType::I64 || idx.dtype() == DType::U32, op,
              ": indices must be i64 or u32, got ", dtype_name(idx.dtype()));
  if (idx.elem_count() == 0) return;
  const StridedLoop<1> loop(idx.shape(), {&idx.strides()});
  const void* base = idx.data_ptr();
  for (size_t r = 0; r < loop.outer_count; ++r) {
    const int64_t o = loop.offsets(r)[0];
    for (size_t i = 0; i < loop.inner; ++i) {
      const int64_t v =
          index_at(base, idx.dtype(), o + static_cast<int64_t>(i) * loop.inner_stride[0]);
      TAPER_CHECK(v >= 0 && static_cast<uint64_t>(v) < limit, op, ": index ", v,
                  " is out of range for dim ", dim, " of size ", limit);
    }
  }
}

/// Calls f with an unsigned integer of `es` bytes: elements are moved as raw bits.
template <class F>
void visit_size(size_t es, F&& f) {
  switch (es) {
    case 1:
      f(uint8_t{});
      break;
    case 2:
      f(uint16_t{});
      break;
    case 4:
      f(uint32_t{});
      break;
    default:
      f(uint64_t{});
      break;
  }
}

/// Copies the elements of `shape` from src (strides ss) to dst (strides ds), both element
/// pointers of `es` bytes: memcpy per run where both are dense, else element by element.
void strided_copy(const Shape& shape, char* dst, const std::vector<int64_t>& ds, const char* src,
                  const std::vector<int64_t>& ss, size_t es) {
  if (shape.elem_count() == 0) return;
  const StridedLoop<2> loop(shape, {&ds, &ss});
  const size_t grain = std::max<size_t>(1, kElemGrain / std::max<size_t>(loop.inner, 1));
  visit_size(es, [&](auto tag) {
    using E = decltype(tag);
    parallel_for(loop.outer_count, grain, [&](size_t b, size_t e) {
      for (size_t r = b; r < e; ++r) {
        const auto off = loop.offsets(r);
        E* d = reinterpret_cast<E*>(dst) + off[0];
        const E* s = reinterpret_cast<const E*>(src) + off[1];
        if (loop.inner_stride[0] == 1 && loop.inner_stride[1] == 1) {
          std::memcpy(d, s, loop.inner * sizeof(E));
        } else {
          for (size_t i = 0; i < loop.inner; ++i)
            d[static_cast<int64_t>(i) * loop.inner_stride[0]] =
                s[static_cast<int64_t>(i) * loop.inner_stride[1]];
        }
      }
    });
  });
}

/// out = x, contiguous.
void copy_into(const Tensor& x, Tensor& out) {
  strided_copy(x.shape(), static_cast<char*>(out.data_ptr()), out.shape().contiguous_strides(),
               static_cast<const char*>(x.data_ptr()), x.strides(), dtype_size(x.dtype()));
}

// ---- index_select ----------------------------------------------------------------------------

std::vector<Tensor> index_select_kernel(const std::vector<Tensor>& in, const OpAttrs& attrs) {
  const Tensor& x = in[0];
  const Tensor& idx = in[1];
  const size_t d = static_cast<size_t>(attrs.i0);
  TAPER_ASSERT(d < x.rank() && idx.rank() == 1);
  check_indices("index_select", idx, x.dims()[d], d);
  std::vector<size_t> od = x.dims();
  const size_t len = idx.dims()[0];
  od[d] = len;
  Tensor out = new_output(Shape(od), x.dtype());
  if (out.elem_count() == 0) return {out};
  // One slab per selected index: x narrowed to 1 along d, copied to out's slab l. The slab loop
  // is the same for every l; only the two base offsets move.
  std::vector<size_t> slab = x.dims();
  slab[d] = 1;
  const std::vector<int64_t> os = Shape(od).contiguous_strides();
  const StridedLoop<2> loop(Shape(slab), {&os, &x.strides()});
  const size_t es = dtype_size(x.dtype());
  char* dst = static_cast<char*>(out.data_ptr());
  const char* src = static_cast<const char*>(x.data_ptr());
  const int64_t xsd = x.strides()[d], osd = os[d];
  const size_t runs = len * loop.outer_count;
  const size_t grain = std::max<size_t>(1, kElemGrain / std::max<size_t>(loop.inner, 1));
  visit_size(es, [&](auto tag) {
    using E = decltype(tag);
    parallel_for(runs, grain, [&](size_t b, size_t e) {
      for (size_t t = b; t < e; ++t) {
        const size_t l = t / loop.outer_count;
        const auto off = loop.offsets(t % loop.outer_count);
        const int64_t v =
            index_at(idx.data_ptr(), idx.dtype(), static_cast<int64_t>(l) * idx.strides()[0]);
        E* dp = reinterpret_cast<E*>(dst) + off[0] + static_cast<int64_t>(l) * osd;
        const E* sp = reinterpret_cast<const E*>(src) + off[1] + v * xsd;
        if (loop.inner_stride[0] == 1 && loop.inner_stride[1] == 1) {
          std::memcpy(dp, sp, loop.inner * sizeof(E));
        } else {
          for (size_t i = 0; i < loop.inner; ++i)
            dp[static_cast<int64_t>(i) * loop.inner_stride[0]] =
                sp[static_cast<int64_t>(i) * loop.inner_stride[1]];
        }
      }
    });
  });
  return {out};
}

// ---- gather / scatter_add --------------------------------------------------------------------

std::vector<Tensor> gather_kernel(const std::vector<Tensor>& in, const OpAttrs& attrs) {
  const Tensor& x = in[0];
  const Tensor& idx = in[1];
  const size_t d = static_cast<size_t>(attrs.i0);
  TAPER_ASSERT(d < x.rank() && idx.rank() == x.rank());
  for (size_t i = 0; i < x.rank(); ++i) TAPER_ASSERT(i == d || idx.dims()[i] <= x.dims()[i]);
  check_indices("gather", idx, x.dims()[d], d);
  Tensor out = new_output(idx.shape(), x.dtype());
  if (out.elem_count() == 0) return {out};
  // Walk idx's shape with three operands: out (dense), idx, and x with its stride along d
  // zeroed (the index supplies that coordinate).
  const std::vector<int64_t> os = idx.shape().contiguous_strides();
  std::vector<int64_t> xs = x.strides();
  const int64_t xsd = xs[d];
  xs[d] = 0;
  const StridedLoop<3> loop(idx.shape(), {&os, &idx.strides(), &xs});
  const size_t grain = std::max<size_t>(1, kElemGrain / std::max<size_t>(loop.inner, 1));
  visit_size(dtype_size(x.dtype()), [&](auto tag) {
    using E = decltype(tag);
    E* dst = static_cast<E*>(out.data_ptr());
    const E* src = static_cast<const E*>(x.data_ptr());
    parallel_for(loop.outer_count, grain, [&](size_t b, size_t e) {
      for (size_t r = b; r < e; ++r) {
        const auto off = loop.offsets(r);
        for (size_t i = 0; i < loop.inner; ++i) {
          const int64_t ii = static_cast<int64_t>(i);
          const int64_t v =
              index_at(idx.data_ptr(), idx.dtype(), off[1] + ii * loop.inner_stride[1]);
          dst[off[0] + ii * loop.inner_stride[0]] =
              src[off[2] + ii * loop.inner_stride[2] + v * xsd];
        }
      }
    });
  });
  return {out};
}

/// a + b in T: f32 for the half types (rounded once), wrapping for the integers.
template <class T>
inline T add_elem(T a, T b) {
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
    return T(static_cast<float>(a) + static_cast<float>(b));
  } else if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}

std::vector<Tensor> scatter_add_kernel(const std::vector<Tensor>& in, const OpAttrs& attrs) {
  const Tensor& x = in[0];
  const Tensor& idx = in[1];
  const Tensor& src = in[2];
  const size_t d = static_cast<size_t>(attrs.i0);
  TAPER_ASSERT(d < x.rank() && idx.rank() == x.rank() && src.rank() == x.rank());
  for (size_t i = 0; i < x.rank(); ++i) {
    TAPER_ASSERT(i == d || idx.dims()[i] <= x.dims()[i]);
    TAPER_ASSERT(idx.dims()[i] <= src.dims()[i]);
  }
  check_indices("scatter_add", idx, x.dims()[d], d);
  Tensor out = new_output(x.shape(), x.dtype());
  if (out.elem_count() == 0) return {out};
  copy_into(x, out);
  if (idx.elem_count() == 0) return {out};
  std::vector<int64_t> os = x.shape().contiguous_strides();
  const int64_t osd = os[d];
  os[d] = 0;
  const StridedLoop<3> loop(idx.shape(), {&src.strides(), &idx.strides(), &os});
  // Sequential: two index elements may target the same output element.
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* dst = out.data<T>();
    const T* sp = src.data<T>();
    for (size_t r = 0; r < loop.outer_count; ++r) {
      const auto off = loop.offsets(r);
      for (size_t i = 0; i < loop.inner; ++i) {
        const int64_t ii = static_cast<int64_t>(i);
        const int64_t v = index_at(idx.data_ptr(), idx.dtype(), off[1] + ii * loop.inner_stride[1]);
        T& o = dst[off[2] + ii * loop.inner_stride[2] + v * osd];
        o = add_elem(o, sp[off[0] + ii * loop.inner_stride[0]]);
      }
    }
  });
  return {out};
}

// ---- cat and narrow_bwd ----------------------------------------------------------------------

std::vector<Tensor> cat_kernel(const std::vector<Tensor>& in, const OpAttrs& attrs) {
  TAPER_ASSERT(!in.empty());
  const size_t d = static_cast<size_t>(attrs.i0);
  const size_t rank = in[0].rank();
  TAPER_ASSERT(d < rank);
  std::vector<size_t> od = in[0].dims();
  od[d] = 0;
  for (const Tensor& t : in) {
    TAPER_ASSERT(t.rank() == rank && t.dtype() == in[0].dtype());
    od[d] += t.dims()[d];
  }
  Tensor out = new_output(Shape(od), in[0].dtype());
  if (out.elem_count() == 0) return {out};
  const std::vector<int64_t> os = Shape(od).contiguous_strides();
  const size_t es = dtype_size(in[0].dtype());
  size_t start = 0;
  for (const Tensor& t : in) {
    char* dst = static_cast<char*>(out.data_ptr()) +
                static_cast<int64_t>(start) * os[d] * static_cast<int64_t>(es);
    strided_copy(t.shape(), dst, os, static_cast<const char*>(t.data_ptr()), t.strides(), es);
    start += t.dims()[d];
  }
  return {out};
}

std::vector<Tensor> narrow_bwd_kernel(const std::vector<Tensor>& in, const OpAttrs& attrs) {
  const Tensor& g = in[0];
  const size_t d = static_cast<size_t>(attrs.i0);
  TAPER_ASSERT(d < g.rank() && attrs.ints.size() == 2);
  const int64_t start = attrs.ints[0], full = attrs.ints[1];
  const size_t len = g.dims()[d];
  TAPER_CHECK(
      start >= 0 && full >= 0 && static_cast<uint64_t>(start) + len <= static_cast<uint64_t>(full),
      "narrow_bwd: slice [", start, ", ", static_cast<uint64_t>(start) + len, ") does not fit dim ",
      d, " of size ", full);
  std::vector<size_t> od = g.dims();
  od[d] = static_cast<size_t>(full);
  Tensor out = new_output(Shape(od), g.dtype());
  if (out.elem_count() == 0) return {out};
  const size_t es = dtype_size(g.dtype());
  std::memset(out.data_ptr(), 0, out.elem_count() * es);  // +0.0 and integer 0 are all-zero bits
  const std::vector<int64_t> os = Shape(od).contiguous_strides();
  char* dst = static_cast<char*>(out.data_ptr()) + start * os[d] * static_cast<int64_t>(es);
  strided_copy(g.shape(), dst, os, static_cast<const char*>(g.data_ptr()), g.strides(), es);
  return {out};
}

// Every kernel reads strided inputs in place (no contiguous copy from the dispatcher).
struct IndexRegistrar {
  IndexRegistrar() {
    register_kernel(OpId::index_select, DeviceKind::Cpu, kAllDTypes, &index_select_kernel, false);
    register_kernel(OpId::gather, DeviceKind::Cpu, kAllDTypes, &gather_kernel, false);
    register_kernel(OpId::scatter_add, DeviceKind::Cpu, kAllDTypes, &scatter_add_kernel, false);
    register_kernel(OpId::cat, DeviceKind::Cpu, kAllDTypes, &cat_kernel, false);
    register_kernel(OpId::narrow_bwd, DeviceKind::Cpu, kAllDTypes, &narrow_bwd_kernel, false);
  }
};
const IndexRegistrar g_index_registrar;

}  // namespace
}  // namespace taper::cpu
