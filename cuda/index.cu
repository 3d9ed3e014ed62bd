// index.cu: CUDA kernels of the index family: index_select, gather, scatter_add, cat and
// narrow_bwd (the backward of narrow), mirroring cpu/index.cpp.
//
// Shapes (d = attrs.i0, the dim):
//   index_select: x (..., D, ...), idx (L) i64/u32 -> out (..., L, ...)
//   gather:       x (..., D, ...), idx (..., J, ...) -> out idx's shape, out[p] = x[p with p_d =
//                 idx[p]]
//   scatter_add:  x (..., D, ...), idx (..., J, ...), src idx's shape -> out = x, then
//                 out[p with p_d = idx[p]] += src[p] for every p of idx, in row-major order of p
//   cat:          xs_i (..., D_i, ...) -> out (..., sum D_i, ...)
//   narrow_bwd:   g (..., L, ...), attrs.ints = {start, full_len} -> zeros (..., full_len, ...)
//                 with g at [start, start + L) along d
// Inputs may be strided views (read in place); outputs are contiguous. Every move is one of: a
// cudaMemcpyAsync (both sides dense), a run kernel (the innermost coalesced dim is dense on both
// sides: rows of 16/8/4/2/1-byte units, one indirection per row for index_select), or an element
// kernel (Strided offsets per element, one indirection per element for gather). Elements move as
// raw bits.
// Indices are checked here, in the kernels, not on the host (which would copy the index tensor
// back and wait for the device on every call): a bad one is reported to the device's
// KernelErrorRecord (cuda_common.cuh), which the host turns into an Error naming the op, the
// index, the dim and its size at the next synchronisation. Meanwhile it never touches memory out
// of bounds: its element (or row) is neither read nor written, and scatter_add skips it.
// scatter_add is deterministic and equals the CPU bit for bit: each output element is owned by
// one thread that adds its contributions in source order, as the CPU's sequential loop does, and
// in the CPU's precision (bf16/f16 add in f32 and round once per add; integers wrap). Two plans:
//   - column-serial: one thread per column (the positions of idx that differ only along d, which
//     can only reach the outputs of the same column) loops over j in order; no two threads share
//     an output. Used when J (idx's extent along d) is short or the columns alone fill the GPU.
//   - rows: idx holds one index per j, broadcast over every other dim (stride 0 there), as the
//     backward of index_select (the embedding's) makes it: the J indices alone are sorted
//     (stable: j order kept), and one block per run of equal indices adds the run's src rows to
//     its output row, a thread per column, in j order.
//   - sorted: every position p becomes (key = its output's flat index, value = its src offset);
//     a stable radix sort (CUB) groups equal keys keeping p order; the first thread of each
//     group adds the group in order. Used for other long J with few columns.
// No floating-point atomics anywhere.
// What it is not: SIMD or arithmetic kernels (only scatter_add adds), or the front-end's argument
// checks (core/src/tensor_ops.cpp), which run first.
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "cuda/cuda_common.cuh"
#include "taper/dtype.h"
#include "taper/error.h"

namespace taper::cuda {
namespace {

constexpr int kBlock = 256;
/// scatter_add goes column-serial when idx's extent along d is at most this, or when there are
/// at least kSerialCols columns (enough threads that J sequential steps each are cheaper than
/// sorting J * columns keys).
constexpr int64_t kSerialJ = 64;
constexpr int64_t kSerialCols = 32768;

/// Stands for "no index operand" in the move kernels.
struct NoIdx {};

/// Where a kernel reports a bad index: the device's record, the op, the dim it indexes.
struct Fault {
  KernelErrorRecord* rec;
  OpId op;
  int64_t dim;
};

/// Whether v indexes [0, lim); reports it to `f` when not.
__device__ __forceinline__ bool index_ok(int64_t v, int64_t lim, const Fault& f) {
  if (v >= 0 && v < lim) return true;
  report_bad_index(f.rec, f.op, v, f.dim, lim);
  return false;
}

// ---- moves ---------------------------------------------------------------------------------

/// Element moves over n row-major positions of a shape: operand 0 is dst, 1 is src, 2 is the
/// index (when IdxT is not NoIdx: src moves by clamp(idx) * src_sd more elements).
template <class E, class IdxT>
__global__ void __launch_bounds__(kBlock)
    move_elems_kernel(E* __restrict__ dst, const E* __restrict__ src,
                      const IdxT* __restrict__ idx, Strided<3> s, int64_t n, int64_t src_sd,
                      int64_t lim, Fault fault) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kBlock) {
    int64_t off[3];
    s.offsets(i, off);
    int64_t so = off[1];
    if constexpr (!std::is_same_v<IdxT, NoIdx>) {
      const int64_t v = static_cast<int64_t>(idx[off[2]]);
      if (!index_ok(v, lim, fault)) continue;  // nothing read or written (lim may be 0)
      so += v * src_sd;
    }
    dst[off[0]] = src[so];
  }
}

/// Row moves: `rows` rows (outer positions of `outer`: element offsets of dst, src, idx) of
/// `units` units U each, dense on both sides. Offsets are elements of es bytes; the host chose U
/// so that every row start is U-aligned. Block: bx unit lanes x by row lanes.
template <class U, class IdxT>
__global__ void __launch_bounds__(kBlock)
    move_runs_kernel(char* __restrict__ dst, const char* __restrict__ src,
                     const IdxT* __restrict__ idx, Strided<3> outer, int64_t rows, int64_t units,
                     int bx_log2, int64_t es, int64_t src_sd, int64_t lim, Fault fault) {
  const int bx = 1 << bx_log2, by = kBlock >> bx_log2;
  const int tx = static_cast<int>(threadIdx.x) & (bx - 1);
  const int ty = static_cast<int>(threadIdx.x) >> bx_log2;
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * by + ty; r < rows;
       r += static_cast<int64_t>(gridDim.y) * by) {
    int64_t off[3];
    outer.offsets(r, off);
    int64_t so = off[1];
    if constexpr (!std::is_same_v<IdxT, NoIdx>) {
      const int64_t v = static_cast<int64_t>(idx[off[2]]);
      if (!index_ok(v, lim, fault)) continue;  // the row is left unwritten (lim may be 0)
      so += v * src_sd;
    }
    U* d = reinterpret_cast<U*>(dst + off[0] * es);
    const U* s = reinterpret_cast<const U*>(src + so * es);
    for (int64_t u = static_cast<int64_t>(blockIdx.x) * bx + tx; u < units;
         u += static_cast<int64_t>(gridDim.x) * bx)
      d[u] = s[u];
  }
}

/// Where one move reads and writes: dst and src (element pointers of es bytes), their strides
/// over `shape`, and optionally an index operand (its strides over `shape`) that moves src by
/// clamp(idx) * src_sd elements (lim = the extent it indexes).
struct MoveSpec {
  const Shape* shape;
  void* dst;
  const std::vector<int64_t>* ds;
  const void* src;
  const std::vector<int64_t>* ss;
  size_t es;
  const Tensor* idx = nullptr;
  const std::vector<int64_t>* is = nullptr;
  int64_t src_sd = 0;
  int64_t lim = 1;
  OpId op = OpId::copy;  ///< the op that indexes, and the dim, for a bad index's report
  int64_t dim = 0;
};

/// Calls f with the C++ type of the index operand: NoIdx, int64_t or uint32_t.
template <class F> void visit_index(const Tensor* idx, F&& f) {
  if (!idx) return f(NoIdx{});
  if (idx->dtype() == DType::U32) return f(uint32_t{});
  TAPER_ASSERT(idx->dtype() == DType::I64);
  return f(int64_t{});
}

/// Calls f with an unsigned integer of `es` bytes (elements move as raw bits).
template <class F> void visit_size(size_t es, F&& f) {
  switch (es) {
    case 1: return f(uint8_t{});
    case 2: return f(uint16_t{});
    case 4: return f(uint32_t{});
    default: return f(uint64_t{});
  }
}

/// Runs one move on `dev`'s stream (name and in: for launch errors).
void move(const char* name, const std::vector<Tensor>& in, const MoveSpec& m, Device dev) {
  const int64_t n = static_cast<int64_t>(m.shape->elem_count());
  if (n == 0) return;
  const int ordinal = dev.ordinal();
  const cudaStream_t st = stream(ordinal);
  const std::vector<int64_t> zeros(m.shape->rank(), 0);
  const Strided<3> s = make_strided<3>(*m.shape, {m.ds, m.ss, m.is ? m.is : &zeros});
  const int64_t es = static_cast<int64_t>(m.es);
  const int last = s.rank - 1;
  const bool dense_inner =
      s.rank > 0 && s.strides[0][last] == 1 && s.strides[1][last] == 1 && s.strides[2][last] == 0;
  if (!m.idx && (s.rank == 0 || (s.rank == 1 && dense_inner))) {  // one dense block
    TAPER_CUDA_CHECK(cudaMemcpyAsync(m.dst, m.src, static_cast<size_t>(n * es),
                                     cudaMemcpyDeviceToDevice, st));
    return;
  }
  const void* idx_ptr = m.idx ? m.idx->data_ptr() : nullptr;
  const Fault fault{m.idx ? kernel_error_record(ordinal) : nullptr, m.op, m.dim};
  if (dense_inner && s.dims[last] * es >= 16) {
    // Rows of the innermost dim. The widest unit that divides every row start and length.
    const int64_t run_bytes = s.dims[last] * es;
    uint64_t align = static_cast<uint64_t>(run_bytes) | reinterpret_cast<uintptr_t>(m.dst) |
                     reinterpret_cast<uintptr_t>(m.src) |
                     static_cast<uint64_t>(m.src_sd * es);
    Strided<3> outer;
    outer.rank = last;
    for (int k = 0; k < last; ++k) {
      outer.dims[k] = s.dims[k];
      for (int q = 0; q < 3; ++q) outer.strides[q][k] = s.strides[q][k];
      align |= static_cast<uint64_t>(s.strides[0][k] * es) | static_cast<uint64_t>(s.strides[1][k] * es);
    }
    outer.set_divisors();
    int64_t w = 16;
    while (w > 1 && (align & static_cast<uint64_t>(w - 1)) != 0) w >>= 1;
    const int64_t units = run_bytes / w;
    const int64_t rows = n / s.dims[last];
    int bx_log2 = 0;
    while (bx_log2 < 8 && (int64_t{1} << bx_log2) < units) ++bx_log2;
    const int64_t by = kBlock >> bx_log2;
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>(ceil_div(units, int64_t{1} << bx_log2), 65535)),
                    static_cast<unsigned>(std::min<int64_t>(ceil_div(rows, by), 65535)));
    visit_index(m.idx, [&](auto itag) {
      using I = decltype(itag);
      auto launch = [&](auto utag) {
        using U = decltype(utag);
        move_runs_kernel<U, I><<<grid, kBlock, 0, st>>>(
            static_cast<char*>(m.dst), static_cast<const char*>(m.src),
            static_cast<const I*>(idx_ptr), outer, rows, units, bx_log2, es, m.src_sd, m.lim,
            fault);
        TAPER_CUDA_CHECK_LAUNCH(name, in);
      };
      switch (w) {
        case 16: launch(uint4{}); break;
        case 8: launch(uint2{}); break;
        case 4: launch(uint32_t{}); break;
        case 2: launch(uint16_t{}); break;
        default: launch(uint8_t{}); break;
      }
    });
    return;
  }
  const unsigned grid = grid_for(static_cast<size_t>(n), ordinal, kBlock);
  visit_index(m.idx, [&](auto itag) {
    using I = decltype(itag);
    visit_size(m.es, [&](auto etag) {
      using E = decltype(etag);
      move_elems_kernel<E, I><<<grid, kBlock, 0, st>>>(static_cast<E*>(m.dst),
                                                      static_cast<const E*>(m.src),
                                                      static_cast<const I*>(idx_ptr), s, n,
                                                      m.src_sd, m.lim, fault);
      TAPER_CUDA_CHECK_LAUNCH(name, in);
    });
  });
}

/// A plain strided copy of `shape` (no index).
void strided_copy(const char* name, const std::vector<Tensor>& in, const Shape& shape, void* dst,
                  const std::vector<int64_t>& ds, const void* src, const std::vector<int64_t>& ss,
                  size_t es, Device dev) {
  MoveSpec m{&shape, dst, &ds, src, &ss, es};
  move(name, in, m, dev);
}

// ---- index_select / gather -----------------------------------------------------------------

std::vector<Tensor> index_select_kernel(const std::vector<Tensor>& in, const OpAttrs& attrs) {
  const Tensor& x = in[0];
  const Tensor& idx = in[1];
  const size_t d = static_cast<size_t>(attrs.i0);
  TAPER_ASSERT(d < x.rank() && idx.rank() == 1);
  TAPER_ASSERT(idx.dtype() == DType::I64 || idx.dtype() == DType::U32);
  std::vector<size_t> od = x.dims();
  od[d] = idx.dims()[0];
  const Shape oshape(od);
  Tensor out = new_output(oshape, x.dtype(), x);
  if (out.elem_count() == 0) return {out};
  // Walk out's shape: x with its stride along d zeroed (the index supplies that coordinate),
  // the index operand striding along d only.
  const std::vector<int64_t> os = oshape.contiguous_strides();
  std::vector<int64_t> xs = x.strides();
  const int64_t xsd = xs[d];
  xs[d] = 0;
  std::vector<int64_t> is(x.rank(), 0);
  is[d] = idx.strides()[0];
  MoveSpec m{&oshape, out.data_ptr(), &os, x.data_ptr(), &xs, dtype_size(x.dtype()), &idx, &is,
             xsd, static_cast<int64_t>(x.dims()[d]), OpId::index_select, static_cast<int64_t>(d)};
  move("index_select", in, m, x.device());
  return {out};
}

std::vector<Tensor> gather_kernel(const std::vector<Tensor>& in, const OpAttrs& attrs) {
  const Tensor& x = in[0];
  const Tensor& idx = in[1];
  const size_t d = static_cast<size_t>(attrs.i0);
  TAPER_ASSERT(d < x.rank() && idx.rank() == x.rank());
  TAPER_ASSERT(idx.dtype() == DType::I64 || idx.dtype() == DType::U32);
  for (size_t i = 0; i < x.rank(); ++i) TAPER_ASSERT(i == d || idx.dims()[i] <= x.dims()[i]);
  Tensor out = new_output(idx.shape(), x.dtype(), x);
  if (out.elem_count() == 0) return {out};
  const std::vector<int64_t> os = idx.shape().contiguous_strides();
  std::vector<int64_t> xs = x.strides();
  const int64_t xsd = xs[d];
  xs[d] = 0;
  MoveSpec m{&idx.shape(), out.data_ptr(), &os, x.data_ptr(), &xs, dtype_size(x.dtype()), &idx,
             &idx.strides(), xsd, static_cast<int64_t>(x.dims()[d]), OpId::gather,
             static_cast<int64_t>(d)};
  move("gather", in, m, x.device());
  return {out};
}

// ---- scatter_add ---------------------------------------------------------------------------

/// a + b as the CPU's add_elem: f32 for the half types (rounded once per add), wrapping for the
/// integers.
template <class T> __device__ __forceinline__ T add_elem(T a, T b) {
  if constexpr (is_half_v<T>) {
    return round_to<T>(static_cast<float>(a) + static_cast<float>(b));
  } else if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}

/// Column-serial scatter_add. cols walks the columns (idx's shape with d dropped): offsets of
/// src, idx and out (out's stride along d zeroed); each thread adds its column's J positions in
/// order, so contributions to one output arrive in source order. Columns never share outputs.
template <class T, class IdxT>
__global__ void __launch_bounds__(kBlock)
    scatter_serial_kernel(T* __restrict__ out, const T* __restrict__ src,
                          const IdxT* __restrict__ idx, Strided<3> cols, int64_t ncols, int64_t J,
                          int64_t src_sd, int64_t idx_sd, int64_t out_sd, int64_t lim,
                          Fault fault) {
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; c < ncols;
       c += static_cast<int64_t>(gridDim.x) * kBlock) {
    int64_t off[3];
    cols.offsets(c, off);
    for (int64_t j = 0; j < J; ++j) {
      const int64_t v = static_cast<int64_t>(idx[off[1] + j * idx_sd]);
      if (!index_ok(v, lim, fault)) continue;
      T& o = out[off[2] + v * out_sd];
      o = add_elem(o, src[off[0] + j * src_sd]);
    }
  }
}

/// Sorted scatter_add, step 1: position p of idx (row-major) -> key = flat index of its output
/// (`sentinel` for a bad index), value = its element offset in src.
template <class IdxT>
__global__ void __launch_bounds__(kBlock)
    scatter_keys_kernel(const IdxT* __restrict__ idx, Strided<3> s, int64_t n, int64_t out_sd,
                        int64_t lim, uint64_t sentinel, uint64_t* __restrict__ keys,
                        int64_t* __restrict__ vals, Fault fault) {
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; p < n;
       p += static_cast<int64_t>(gridDim.x) * kBlock) {
    int64_t off[3];
    s.offsets(p, off);
    const int64_t v = static_cast<int64_t>(idx[off[1]]);
    keys[p] = index_ok(v, lim, fault) ? static_cast<uint64_t>(off[2] + v * out_sd) : sentinel;
    vals[p] = off[0];
  }
}

/// The end of the run of keys equal to keys[i] (sorted keys): the first position past i whose
/// key differs, or n.
__device__ __forceinline__ int64_t run_end(const uint64_t* __restrict__ keys, int64_t i,
                                           int64_t n) {
  const uint64_t k = keys[i];
  int64_t lo = i + 1, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (keys[mid] == k) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/// Sorted scatter_add, step 2: the first position of each run of equal keys adds the run's src
/// values, in their (stable, source) order, to its output.
template <class T>
__global__ void __launch_bounds__(kBlock)
    scatter_runs_kernel(T* __restrict__ out, const T* __restrict__ src,
                        const uint64_t* __restrict__ keys, const int64_t* __restrict__ vals,
                        int64_t n, uint64_t sentinel) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kBlock) {
    const uint64_t k = keys[i];
    if (k == sentinel || (i > 0 && keys[i - 1] == k)) continue;
    const int64_t end = run_end(keys, i, n);
    T acc = out[k];
    for (int64_t t = i; t < end; ++t) acc = add_elem(acc, src[vals[t]]);
    out[k] = acc;
  }
}

/// Row plan, step 1: key j = idx[j] (`lim` for a bad index: it sorts last), value j.
template <class IdxT>
__global__ void __launch_bounds__(kBlock)
    scatter_row_keys_kernel(const IdxT* __restrict__ idx, int64_t idx_sd, int64_t J, int64_t lim,
                            uint64_t* __restrict__ keys, int64_t* __restrict__ vals, Fault fault) {
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; j < J;
       j += static_cast<int64_t>(gridDim.x) * kBlock) {
    const int64_t v = static_cast<int64_t>(idx[j * idx_sd]);
    keys[j] = static_cast<uint64_t>(index_ok(v, lim, fault) ? v : lim);
    vals[j] = j;
  }
}

/// Row plan, step 2: block i, where a run of equal keys starts, adds the run's src rows (in j
/// order) to output row keys[i], one thread per column (cols: offsets of src and out).
template <class T>
__global__ void __launch_bounds__(kBlock)
    scatter_row_runs_kernel(T* __restrict__ out, const T* __restrict__ src,
                            const uint64_t* __restrict__ keys, const int64_t* __restrict__ vals,
                            int64_t J, int64_t lim, Strided<3> cols, int64_t ncols, int64_t src_sd,
                            int64_t out_sd) {
  for (int64_t i = blockIdx.x; i < J; i += gridDim.x) {
    const uint64_t k = keys[i];
    if (k == static_cast<uint64_t>(lim) || (i > 0 && keys[i - 1] == k)) continue;
    const int64_t end = run_end(keys, i, J);
    for (int64_t c = threadIdx.x; c < ncols; c += kBlock) {
      int64_t off[3];
      cols.offsets(c, off);
      T& o = out[off[2] + static_cast<int64_t>(k) * out_sd];
      T acc = o;
#pragma unroll 8
      for (int64_t t = i; t < end; ++t) acc = add_elem(acc, src[off[0] + vals[t] * src_sd]);
      o = acc;
    }
  }
}

/// n (key, value) pairs on the device, double-buffered for CUB's radix sort: written through
/// keys.Current() and vals.Current(), sorted by sort(), read back through them.
struct SortPairs {
  Tensor kbuf, vbuf;
  cub::DoubleBuffer<uint64_t> keys;
  cub::DoubleBuffer<int64_t> vals;
  int64_t n;
  SortPairs(size_t count, const Device& dev)
      : kbuf(Tensor::empty(Shape({2 * count}), DType::I64, dev)),
        vbuf(Tensor::empty(Shape({2 * count}), DType::I64, dev)),
        keys(ptr<uint64_t>(kbuf), ptr<uint64_t>(kbuf) + count),
        vals(ptr<int64_t>(vbuf), ptr<int64_t>(vbuf) + count),
        n(static_cast<int64_t>(count)) {}
  /// Stable sort by the keys' low end_bit bits, on stream st.
  void sort(int end_bit, cudaStream_t st) {
    size_t temp_bytes = 0;
    TAPER_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys, vals, n, 0,
                                                     end_bit, st));
    Tensor temp = Tensor::empty(Shape({std::max<size_t>(temp_bytes, 1)}), DType::U8, kbuf.device());
    TAPER_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data_ptr(), temp_bytes, keys, vals, n,
                                                     0, end_bit, st));
  }
};

/// Bits that hold every key up to and including `largest`.
int key_bits(uint64_t largest) {
  int b = 1;
  while (b < 64 && (largest >> b) != 0) ++b;
  return b;
}

/// Whether idx varies only along d (stride 0 on every other dim of extent > 1).
bool one_index_per_row(const Tensor& idx, size_t d) {
  for (size_t i = 0; i < idx.rank(); ++i)
    if (i != d && idx.dims()[i] > 1 && idx.strides()[i] != 0) return false;
  return true;
}

std::vector<Tensor> scatter_add_kernel(const std::vector<Tensor>& in, const OpAttrs& attrs) {
  const Tensor& x = in[0];
  const Tensor& idx = in[1];
  const Tensor& src = in[2];
  const size_t d = static_cast<size_t>(attrs.i0);
  TAPER_ASSERT(d < x.rank() && idx.rank() == x.rank() && src.rank() == x.rank());
  TAPER_ASSERT(idx.dtype() == DType::I64 || idx.dtype() == DType::U32);
  for (size_t i = 0; i < x.rank(); ++i) {
    TAPER_ASSERT(i == d || idx.dims()[i] <= x.dims()[i]);
    TAPER_ASSERT(idx.dims()[i] <= src.dims()[i]);
  }
  Tensor out = new_output(x.shape(), x.dtype(), x);
  if (out.elem_count() == 0) return {out};
  const std::vector<int64_t> xos = x.shape().contiguous_strides();
  strided_copy("scatter_add", in, x.shape(), out.data_ptr(), xos, x.data_ptr(), x.strides(),
               dtype_size(x.dtype()), x.device());
  const int64_t n = static_cast<int64_t>(idx.elem_count());
  if (n == 0) return {out};

  const int ordinal = x.device().ordinal();
  const cudaStream_t st = stream(ordinal);
  std::vector<int64_t> os = xos;
  const int64_t out_sd = os[d];
  os[d] = 0;
  const int64_t lim = static_cast<int64_t>(x.dims()[d]);
  const int64_t J = static_cast<int64_t>(idx.dims()[d]);
  const int64_t ncols = n / J;
  const Fault fault{kernel_error_record(ordinal), OpId::scatter_add, static_cast<int64_t>(d)};
  visit_dtype(x.dtype(), [&](auto ttag) {
    using T = decltype(ttag);
    visit_index(&idx, [&](auto itag) {
      using I = decltype(itag);
      if constexpr (!std::is_same_v<I, NoIdx>) {
        const I* ip = ptr<const I>(idx);
        // Offsets of src, idx and out per column (idx's positions with d dropped); built only
        // by the plans that walk columns (the sorted plan's positions may coalesce where these
        // do not).
        auto columns = [&] {
          std::vector<size_t> cdims = idx.dims();
          cdims[d] = 1;  // dropped by make_strided
          return make_strided<3>(Shape(cdims), {&src.strides(), &idx.strides(), &os});
        };
        if (J <= kSerialJ || ncols >= kSerialCols) {
          const Strided<3> cols = columns();
          scatter_serial_kernel<T, I><<<grid_for(static_cast<size_t>(ncols), ordinal, kBlock),
                                        kBlock, 0, st>>>(
              ptr<T>(out), ptr<const T>(src), ip, cols, ncols, J,
              src.strides()[d], idx.strides()[d], out_sd, lim, fault);
          TAPER_CUDA_CHECK_LAUNCH("scatter_add", in);
          return;
        }
        if (one_index_per_row(idx, d)) {  // row plan: sort the J indices only
          const Strided<3> cols = columns();
          SortPairs p(static_cast<size_t>(J), x.device());
          scatter_row_keys_kernel<I><<<grid_for(static_cast<size_t>(J), ordinal, kBlock), kBlock,
                                       0, st>>>(ip, idx.strides()[d], J, lim, p.keys.Current(),
                                                p.vals.Current(), fault);
          TAPER_CUDA_CHECK_LAUNCH("scatter_add", in);
          p.sort(key_bits(static_cast<uint64_t>(lim)), st);
          const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(J, 65535));
          scatter_row_runs_kernel<T><<<blocks, kBlock, 0, st>>>(
              ptr<T>(out), ptr<const T>(src), p.keys.Current(), p.vals.Current(), J, lim, cols,
              ncols, src.strides()[d], out_sd);
          TAPER_CUDA_CHECK_LAUNCH("scatter_add", in);
          return;
        }
        // Sorted plan. Keys are output indices < out_count; the sentinel sorts last.
        const uint64_t sentinel = static_cast<uint64_t>(out.elem_count());
        const int end_bit = key_bits(sentinel);
        SortPairs p(static_cast<size_t>(n), x.device());
        const unsigned grid = grid_for(static_cast<size_t>(n), ordinal, kBlock);
        const Strided<3> s = make_strided<3>(idx.shape(), {&src.strides(), &idx.strides(), &os});
        scatter_keys_kernel<I><<<grid, kBlock, 0, st>>>(ip, s, n, out_sd, lim, sentinel,
                                                        p.keys.Current(), p.vals.Current(), fault);
        TAPER_CUDA_CHECK_LAUNCH("scatter_add", in);
        p.sort(end_bit, st);
        scatter_runs_kernel<T><<<grid, kBlock, 0, st>>>(ptr<T>(out), ptr<const T>(src),
                                                        p.keys.Current(), p.vals.Current(), n,
                                                        sentinel);
        TAPER_CUDA_CHECK_LAUNCH("scatter_add", in);
      }
    });
  });
  return {out};
}

// ---- cat and narrow_bwd --------------------------------------------------------------------

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
  const Shape oshape(od);
  Tensor out = new_output(oshape, in[0].dtype(), in[0]);
  if (out.elem_count() == 0) return {out};
  const std::vector<int64_t> os = oshape.contiguous_strides();
  const size_t es = dtype_size(in[0].dtype());
  size_t start = 0;
  for (const Tensor& t : in) {  // one move per input into its slice of out
    char* dst = static_cast<char*>(out.data_ptr()) +
                static_cast<int64_t>(start) * os[d] * static_cast<int64_t>(es);
    strided_copy("cat", in, t.shape(), dst, os, t.data_ptr(), t.strides(), es, out.device());
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
  const Shape oshape(od);
  Tensor out = new_output(oshape, g.dtype(), g);
  if (out.elem_count() == 0) return {out};
  const size_t es = dtype_size(g.dtype());
  // +0.0 and integer 0 are all-zero bits; the copy below is ordered after it on the stream.
  TAPER_CUDA_CHECK(cudaMemsetAsync(out.data_ptr(), 0, out.elem_count() * es, stream_of(out)));
  const std::vector<int64_t> os = oshape.contiguous_strides();
  char* dst = static_cast<char*>(out.data_ptr()) + start * os[d] * static_cast<int64_t>(es);
  strided_copy("narrow_bwd", in, g.shape(), dst, os, g.data_ptr(), g.strides(), es, out.device());
  return {out};
}

// Every kernel reads strided inputs in place (no contiguous copy from the dispatcher), as on the
// CPU.
struct IndexRegistrar {
  IndexRegistrar() {
    register_kernel(OpId::index_select, DeviceKind::Cuda, kAllDTypes, &index_select_kernel, false);
    register_kernel(OpId::gather, DeviceKind::Cuda, kAllDTypes, &gather_kernel, false);
    register_kernel(OpId::scatter_add, DeviceKind::Cuda, kAllDTypes, &scatter_add_kernel, false);
    register_kernel(OpId::cat, DeviceKind::Cuda, kAllDTypes, &cat_kernel, false);
    register_kernel(OpId::narrow_bwd, DeviceKind::Cuda, kAllDTypes, &narrow_bwd_kernel, false);
  }
};
const IndexRegistrar g_index_registrar;

}  // namespace
}  // namespace taper::cuda
