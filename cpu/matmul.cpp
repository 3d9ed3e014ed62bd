// matmul.cpp: OpId::matmul on the CPU: OpenBLAS's CBLAS GEMM, and a Highway GEMV of our own for
// matrix-vector products.
//
// Shapes: a: (..., M, K), b: (..., K, N) -> c: (..., M, N), contiguous. The front-end has
// broadcast the batch dims (they may have stride 0) and checked K.
// f32/f64: sgemm/dgemm read the operands in place when BLAS can describe them: rows dense
// (NoTrans, ld = row stride) or columns dense (a transposed view: Trans, ld = column stride);
// any other layout is copied dense first. When a's batch dims and M flatten into one strided
// dim and b is the same matrix for every batch (stride 0, e.g. a linear layer on (B, T, C)), the
// batch folds into M: one (B*M, K) x (K, N) GEMM.
// N == 1 or M == 1 (a matrix times a vector, either side) runs on taper's thread pool instead:
// OpenBLAS's GEMM packs the matrix first (a (16384, 1024) x (1024, 1) product took 3.5 ms against
// 1.2 ms for a GEMV), and its GEMV's threads spin after the call and took the cores from the
// elementwise ops that followed (the norm backwards' row dots: rms norm fwd+bwd f32 (16384, 1024)
// 50 ms with cblas_sgemv, 39 ms with OpenBLAS's spinning cut short, 41 ms with this GEMV).
// Rows dotted with the vector (a row-major matrix) or rows scaled and summed (a transposed
// one), accumulated in the compute type: f32 (half types too), f64 for f64.
// bf16/f16: both operands widen (exactly) to f32 panels, sgemm accumulates in f32, and each
// output element is rounded once to nearest-even.
// GEMMs run as a fixed grid of C tiles on taper's pool, each tile a single-threaded BLAS call
// (OpenBLAS runs with one thread: its own split depends on the thread count, and so did the
// bits), so products are bit-identical whatever the thread count.
// What it is not: a GEMM of our own; integer matmul is not registered.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/matmul.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"

#ifndef TAPER_CPU_MATMUL_ONCE_H_
#define TAPER_CPU_MATMUL_ONCE_H_
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <optional>
#include <vector>

#include "cpu/cpu_common.h"
#endif

HWY_BEFORE_NAMESPACE();
namespace taper::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// y[i * incy] = sum_j a[i * lda + j] * v[j] for the rows [r0, r1); four accumulators.
template <class T>
HWY_INLINE void RowDotsT(const T* HWY_RESTRICT a, size_t lda, size_t r0, size_t r1, size_t cols,
                         const T* HWY_RESTRICT v, T* HWY_RESTRICT y, size_t incy) {
  const hn::ScalableTag<T> d;
  const size_t N = hn::Lanes(d);
  for (size_t i = r0; i < r1; ++i) {
    const T* HWY_RESTRICT row = a + i * lda;
    auto s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d), s3 = hn::Zero(d);
    size_t j = 0;
    for (; j + 4 * N <= cols; j += 4 * N) {
      s0 = hn::MulAdd(hn::LoadU(d, row + j), hn::LoadU(d, v + j), s0);
      s1 = hn::MulAdd(hn::LoadU(d, row + j + N), hn::LoadU(d, v + j + N), s1);
      s2 = hn::MulAdd(hn::LoadU(d, row + j + 2 * N), hn::LoadU(d, v + j + 2 * N), s2);
      s3 = hn::MulAdd(hn::LoadU(d, row + j + 3 * N), hn::LoadU(d, v + j + 3 * N), s3);
    }
    for (; j + N <= cols; j += N) s0 = hn::MulAdd(hn::LoadU(d, row + j), hn::LoadU(d, v + j), s0);
    T acc = hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
    for (; j < cols; ++j) acc += row[j] * v[j];
    y[i * incy] = acc;
  }
}

/// part[j] += sum over the rows i in [r0, r1) of v[i] * a[i * lda + j], for j < cols; in column
/// blocks that keep their slice of `part` in L1 while the rows stream past.
template <class T>
HWY_INLINE void ColDotsT(const T* HWY_RESTRICT a, size_t lda, size_t r0, size_t r1, size_t cols,
                         const T* HWY_RESTRICT v, T* HWY_RESTRICT part) {
  const hn::ScalableTag<T> d;
  const size_t N = hn::Lanes(d);
  constexpr size_t kColBlock = 4096 / sizeof(T);
  for (size_t c0 = 0; c0 < cols; c0 += kColBlock) {
    const size_t c1 = std::min(cols, c0 + kColBlock);
    for (size_t i = r0; i < r1; ++i) {
      const T* HWY_RESTRICT row = a + i * lda;
      const auto vi = hn::Set(d, v[i]);
      size_t j = c0;
      for (; j + N <= c1; j += N)
        hn::StoreU(hn::MulAdd(vi, hn::LoadU(d, row + j), hn::LoadU(d, part + j)), d, part + j);
      for (; j < c1; ++j) part[j] += v[i] * row[j];
    }
  }
}

void RowDotsF32(const float* a, size_t lda, size_t r0, size_t r1, size_t cols, const float* v,
                float* y, size_t incy) {
  RowDotsT(a, lda, r0, r1, cols, v, y, incy);
}
void RowDotsF64(const double* a, size_t lda, size_t r0, size_t r1, size_t cols, const double* v,
                double* y, size_t incy) {
  RowDotsT(a, lda, r0, r1, cols, v, y, incy);
}
void ColDotsF32(const float* a, size_t lda, size_t r0, size_t r1, size_t cols, const float* v,
                float* part) {
  ColDotsT(a, lda, r0, r1, cols, v, part);
}
void ColDotsF64(const double* a, size_t lda, size_t r0, size_t r1, size_t cols, const double* v,
                double* part) {
  ColDotsT(a, lda, r0, r1, cols, v, part);
}

}  // namespace taper::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace taper::cpu {

HWY_EXPORT(RowDotsF32);
HWY_EXPORT(RowDotsF64);
HWY_EXPORT(ColDotsF32);
HWY_EXPORT(ColDotsF64);

namespace {

/// How BLAS reads one (rows x cols) operand in place.
struct BlasView {
  CBLAS_TRANSPOSE trans;
  size_t ld;
};

/// The BLAS description of a (rows x cols) matrix with element strides (sr, sc), if one exists.
/// Row-major NoTrans: (i, j) at i*ld + j, ld >= cols. Trans (a transposed view): (i, j) at
/// i + j*ld, ld >= rows. Size-1 dims may have any stride.
std::optional<BlasView> blas_view(size_t rows, size_t cols, int64_t sr, int64_t sc) {
  const int64_t r1 = static_cast<int64_t>(std::max<size_t>(rows, 1));
  const int64_t c1 = static_cast<int64_t>(std::max<size_t>(cols, 1));
  if ((cols <= 1 || sc == 1) && (rows <= 1 || sr >= c1))
    return BlasView{CblasNoTrans, rows <= 1 ? static_cast<size_t>(c1) : static_cast<size_t>(sr)};
  if ((rows <= 1 || sr == 1) && (cols <= 1 || sc >= r1))
    return BlasView{CblasTrans, cols <= 1 ? static_cast<size_t>(r1) : static_cast<size_t>(sc)};
  return std::nullopt;
}

/// The single stride of `dims` (with `strides`) flattened into one dim, if they flatten
/// (size-1 dims ignored); `fallback` when no dim is larger than 1.
std::optional<int64_t> flat_stride(const std::vector<size_t>& dims,
                                   const std::vector<int64_t>& strides, int64_t fallback) {
  bool have = false;
  int64_t stride = 0;
  size_t extent = 0;
  for (size_t i = dims.size(); i-- > 0;) {
    if (dims[i] == 1) continue;
    if (!have) {
      stride = strides[i];
      extent = dims[i];
      have = true;
      continue;
    }
    if (strides[i] != stride * static_cast<int64_t>(extent)) return std::nullopt;
    extent *= dims[i];
  }
  return have ? stride : fallback;
}

/// Offsets (in elements) of batch `bi` of an operand with batch dims `bdims` and strides `bst`.
int64_t batch_offset(size_t bi, const std::vector<size_t>& bdims, const std::vector<int64_t>& bst) {
  int64_t off = 0;
  for (size_t i = bdims.size(); i-- > 0;) {
    off += static_cast<int64_t>(bi % bdims[i]) * bst[i];
    bi /= bdims[i];
  }
  return off;
}

/// Copies the (rows x cols) matrix at p with strides (sr, sc) into dense row-major dst,
/// converting to float for the half types (exact).
template <class T, class D>
void pack(const T* p, size_t rows, size_t cols, int64_t sr, int64_t sc, D* dst) {
  for (size_t i = 0; i < rows; ++i) {
    const T* row = p + static_cast<int64_t>(i) * sr;
    D* out = dst + i * cols;
    if (sc == 1 && std::is_same_v<T, D>) {
      std::memcpy(static_cast<void*>(out), static_cast<const void*>(row), cols * sizeof(T));
    } else {
      for (size_t j = 0; j < cols; ++j) out[j] = static_cast<D>(row[static_cast<int64_t>(j) * sc]);
    }
  }
}

void gemm_blas(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, blasint m, blasint n, blasint k,
               const float* a, blasint lda, const float* b, blasint ldb, float* c, blasint ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
}
void gemm_blas(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, blasint m, blasint n, blasint k,
               const double* a, blasint lda, const double* b, blasint ldb, double* c, blasint ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, 1.0, a, lda, b, ldb, 0.0, c, ldc);
}
void row_dots(const float* a, size_t lda, size_t r0, size_t r1, size_t cols, const float* v,
              float* y, size_t incy) {
  HWY_DYNAMIC_DISPATCH(RowDotsF32)(a, lda, r0, r1, cols, v, y, incy);
}
void row_dots(const double* a, size_t lda, size_t r0, size_t r1, size_t cols, const double* v,
              double* y, size_t incy) {
  HWY_DYNAMIC_DISPATCH(RowDotsF64)(a, lda, r0, r1, cols, v, y, incy);
}
void col_dots(const float* a, size_t lda, size_t r0, size_t r1, size_t cols, const float* v,
              float* part) {
  HWY_DYNAMIC_DISPATCH(ColDotsF32)(a, lda, r0, r1, cols, v, part);
}
void col_dots(const double* a, size_t lda, size_t r0, size_t r1, size_t cols, const double* v,
              double* part) {
  HWY_DYNAMIC_DISPATCH(ColDotsF64)(a, lda, r0, r1, cols, v, part);
}

/// y[i * incy] = sum_j m[i, j] * v[j * incv] for the (rows x cols) matrix m: row-major at a
/// with row stride ld (trans false), or stored transposed (trans: m[i, j] at a[j * ld + i]).
template <class G>
void gemv(bool trans, size_t rows, size_t cols, const G* a, size_t ld, const G* v, size_t incv,
          G* y, size_t incy) {
  std::vector<G> vbuf;
  if (incv != 1) {
    vbuf.resize(cols);
    for (size_t j = 0; j < cols; ++j) vbuf[j] = v[j * incv];
    v = vbuf.data();
  }
  if (!trans) {
    parallel_for(rows, std::max<size_t>(1, kElemGrain / std::max<size_t>(cols, 1)),
                 [&](size_t r0, size_t r1) { row_dots(a, ld, r0, r1, cols, v, y, incy); });
    return;
  }
  // Transposed: y = sum over the stored rows j of v[j] * (stored row j); each chunk of stored
  // rows sums into its own partial y, added up in chunk order at the end. The chunking depends
  // on the shape only, never on the thread count, so the result does not either. At most 64
  // chunks, 2^22 partial elements, and one stored row a chunk.
  constexpr size_t kChunkElems = size_t{1} << 16, kMaxChunks = 64, kMaxPartial = size_t{1} << 22;
  const size_t cap = std::min({kMaxChunks, cols, std::max<size_t>(1, kMaxPartial / rows)});
  const size_t chunks = std::clamp<size_t>(rows * cols / kChunkElems, 1, cap);
  std::vector<G> part(chunks * rows, G(0));
  parallel_for(chunks, 1, [&](size_t c0, size_t c1) {
    for (size_t c = c0; c < c1; ++c)
      col_dots(a, ld, cols * c / chunks, cols * (c + 1) / chunks, rows, v, part.data() + c * rows);
  });
  for (size_t i = 0; i < rows; ++i) {
    G acc = part[i];
    for (size_t c = 1; c < chunks; ++c) acc += part[c * rows + i];
    y[i * incy] = acc;
  }
}

/// The tile of C one BLAS call computes (see gemm).
constexpr size_t kTileM = 128, kTileN = 512;

/// c (m x n, row stride ldc) = op(a) (m x k) * op(b) (k x n). A matrix-vector product (n == 1 or
/// m == 1) goes to gemv (see the header comment), the rest to BLAS on a fixed grid of tiles.
template <class G>
void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, size_t m, size_t n, size_t k, const G* a,
          size_t lda, const G* b, size_t ldb, G* c, size_t ldc) {
  if (n == 1)  // c[i] = sum_j op(a)[i, j] * op(b)[j, 0]; op(b)'s column has stride ldb or 1
    return gemv(ta == CblasTrans, m, k, a, lda, b, tb == CblasNoTrans ? ldb : 1, c, ldc);
  if (m == 1)  // c[j] = sum_i op(b)[i, j] * op(a)[0, i], i.e. op(b)^T times op(a)'s row
    return gemv(tb == CblasNoTrans, n, k, b, ldb, a, ta == CblasNoTrans ? 1 : lda, c, 1);
  // A fixed grid of (kTileM x kTileN) tiles of C, each one single-threaded BLAS call over the
  // whole K, run on taper's pool: the grid depends on the shape alone, so every element is
  // computed by the same call whatever the thread count (OpenBLAS's own threads split K and M
  // by the count: 859 of 8192 elements of a (64, 256) x (256, 128) product differed between 3
  // and 4 threads). Tile (i, j) reads op(a)'s rows [i kTileM, ...) and op(b)'s columns
  // [j kTileN, ...): for a stored transposed those start at column i kTileM, resp. row j kTileN.
  const size_t tm = (m + kTileM - 1) / kTileM, tn = (n + kTileN - 1) / kTileN;
  const auto bi = [](size_t v) { return static_cast<blasint>(v); };
  parallel_for(tm * tn, 1, [&](size_t t0, size_t t1) {
    for (size_t t = t0; t < t1; ++t) {
      const size_t r0 = t / tn * kTileM, c0 = t % tn * kTileN;
      const size_t rm = std::min(kTileM, m - r0), cn = std::min(kTileN, n - c0);
      const G* ap = ta == CblasNoTrans ? a + r0 * lda : a + r0;
      const G* bp = tb == CblasNoTrans ? b + c0 : b + c0 * ldb;
      gemm_blas(ta, tb, bi(rm), bi(cn), bi(k), ap, bi(lda), bp, bi(ldb), c + r0 * ldc + c0,
                bi(ldc));
    }
  });
}

/// One operand matrix as GEMM sees it: a base pointer and a BLAS view, pointing either into the
/// tensor or into `buf` (a dense copy, in the compute type G).
template <class G>
struct Panel {
  const G* p = nullptr;
  BlasView view{CblasNoTrans, 0};
  std::vector<G> buf;
};

/// Prepares the (rows x cols) matrix at src with strides (sr, sc) for a GEMM in type G: in place
/// when T == G and BLAS can read it, else packed dense (and widened for the half types).
template <class T, class G>
void prepare(Panel<G>& pn, const T* src, size_t rows, size_t cols, int64_t sr, int64_t sc) {
  if constexpr (std::is_same_v<T, G>) {
    if (auto v = blas_view(rows, cols, sr, sc)) {
      pn.p = src;
      pn.view = *v;
      return;
    }
  }
  pn.buf.resize(rows * cols);
  pack(src, rows, cols, sr, sc, pn.buf.data());
  pn.p = pn.buf.data();
  pn.view = BlasView{CblasNoTrans, std::max<size_t>(cols, 1)};
}

template <class T>
void run_matmul(const Tensor& a, const Tensor& b, Tensor& c) {
  using G = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const size_t r = a.rank();
  const size_t m = a.dims()[r - 2], k = a.dims()[r - 1], n = b.dims()[r - 1];
  const std::vector<size_t> bdims(a.dims().begin(), a.dims().end() - 2);
  const std::vector<int64_t> as(a.strides().begin(), a.strides().end() - 2);
  const std::vector<int64_t> bs(b.strides().begin(), b.strides().end() - 2);
  const int64_t asr = a.strides()[r - 2], asc = a.strides()[r - 1];
  const int64_t bsr = b.strides()[r - 2], bsc = b.strides()[r - 1];
  size_t batch = 1;
  for (size_t d : bdims) batch *= d;
  T* out = c.data<T>();
  if (k == 0) {  // an empty sum: zeros (BLAS would not accept ld = 0 views here)
    std::fill(out, out + batch * m * n, T(0.0f));
    return;
  }
  const auto blas_limit = static_cast<size_t>(INT_MAX);
  TAPER_CHECK(std::max({m * batch, n, k}) <= blas_limit, "matmul: dims ", a.shape().to_string(),
              " x ", b.shape().to_string(), " exceed BLAS's 32-bit int range");

  // Fold the batch into M when b is one matrix for all batches and a's (batch..., M) flattens
  // into rows of one stride.
  bool b_shared = true;
  for (size_t i = 0; i < bdims.size(); ++i)
    if (bdims[i] > 1 && bs[i] != 0) b_shared = false;
  size_t gm = m, gbatch = batch;
  int64_t gasr = asr;
  if (batch > 1 && b_shared) {
    std::vector<size_t> rd = bdims;
    std::vector<int64_t> rs = as;
    rd.push_back(m);
    rs.push_back(asr);
    // The flattened rows are read in place or packed like any other operand (prepare).
    if (const auto fs = flat_stride(rd, rs, asr)) {
      gm = m * batch;
      gbatch = 1;
      gasr = *fs;
    }
  }

  Panel<G> pa, pb;
  std::vector<G> cbuf;  // f32 result of the half types, rounded once into out
  int64_t last_b = -1;
  for (size_t bi = 0; bi < gbatch; ++bi) {
    const int64_t ao = batch_offset(bi, bdims, as);
    const int64_t bo = batch_offset(bi, bdims, bs);
    prepare(pa, a.data<T>() + ao, gm, k, gasr, asc);
    if (bo != last_b) {  // a broadcast b (stride 0) is prepared once
      prepare(pb, b.data<T>() + bo, k, n, bsr, bsc);
      last_b = bo;
    }
    T* cp = out + bi * gm * n;
    if constexpr (std::is_same_v<T, G>) {
      gemm(pa.view.trans, pb.view.trans, gm, n, k, pa.p, pa.view.ld, pb.p, pb.view.ld, cp, n);
    } else {
      cbuf.resize(gm * n);
      gemm(pa.view.trans, pb.view.trans, gm, n, k, pa.p, pa.view.ld, pb.p, pb.view.ld, cbuf.data(),
           n);
      for (size_t i = 0; i < gm * n; ++i) cp[i] = T(cbuf[i]);  // round once, nearest-even
    }
  }
}

std::vector<Tensor> matmul_kernel(const std::vector<Tensor>& in, const OpAttrs&) {
  const Tensor& a = in[0];
  const Tensor& b = in[1];
  const size_t r = a.rank();
  TAPER_ASSERT(r >= 2 && b.rank() == r && a.dims()[r - 1] == b.dims()[r - 2]);
  std::vector<size_t> od = a.dims();
  od[r - 1] = b.dims()[r - 1];
  Tensor c = new_output(Shape(od), a.dtype());
  if (c.elem_count() == 0) return {c};
  visit_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (is_float(dtype_of_v<T>)) {
      run_matmul<T>(a, b, c);
    } else {
      TAPER_ASSERT(false && "matmul: integer dtypes are not registered");
    }
  });
  return {c};
}

/// linear: y = x w^T + b, x (R, in) and w (out, in) contiguous, b (out) or absent. The same GEMM
/// as matmul's x w^T (w read transposed in place); the bias is added in the compute type before
/// the one rounding to y's type (so f32 and f64 give matmul-then-add's bits, and the half types
/// round once where matmul-then-add rounds twice).
template <class T>
void run_linear(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  using G = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const size_t rows = x.dim(0), k = x.dim(1), out = w.dim(0);
  TAPER_CHECK(std::max({rows, out, k}) <= static_cast<size_t>(INT_MAX), "linear: dims ",
              x.shape().to_string(), " x ", w.shape().to_string(), " exceed BLAS's 32-bit int range");
  std::vector<G> cbuf;
  G* c = nullptr;
  if constexpr (std::is_same_v<T, G>) {
    c = y.data<T>();
  } else {
    cbuf.resize(rows * out);
    c = cbuf.data();
  }
  if (k == 0) {
    std::fill(c, c + rows * out, G(0));
  } else {
    Panel<G> px, pw;
    prepare(px, x.data<T>(), rows, k, static_cast<int64_t>(k), 1);
    prepare(pw, w.data<T>(), k, out, 1, static_cast<int64_t>(k));  // w^T: a transposed view
    gemm(px.view.trans, pw.view.trans, rows, out, k, px.p, px.view.ld, pw.p, pw.view.ld, c, out);
  }
  const T* bp = b ? b->data<T>() : nullptr;
  T* yp = y.data<T>();
  parallel_for(rows, 64, [&](size_t r0, size_t r1) {
    for (size_t r = r0; r < r1; ++r)
      for (size_t j = 0; j < out; ++j) {
        G v = c[r * out + j];
        if (bp) v += static_cast<G>(bp[j]);
        yp[r * out + j] = T(v);  // once, nearest-even
      }
  });
}

std::vector<Tensor> linear_kernel(const std::vector<Tensor>& in, const OpAttrs&) {
  const Tensor& x = in[0];
  const Tensor& w = in[1];
  TAPER_ASSERT(x.rank() == 2 && w.rank() == 2 && x.dim(1) == w.dim(1));
  Tensor y = new_output(Shape({x.dim(0), w.dim(0)}), x.dtype());
  if (y.elem_count() == 0) return {y};
  const Tensor* b = present(in, 2) ? &in[2] : nullptr;
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (is_float(dtype_of_v<T>)) {
      run_linear<T>(x, w, b, y);
    } else {
      TAPER_ASSERT(false && "linear: integer dtypes are not registered");
    }
  });
  return {y};
}

// Strided operands are read in place where BLAS can; the kernel copies the rest itself.
struct MatmulRegistrar {
  MatmulRegistrar() {
    register_kernel(OpId::matmul, DeviceKind::Cpu, kFloatDTypes, &matmul_kernel, false);
    register_kernel(OpId::linear, DeviceKind::Cpu, kFloatDTypes, &linear_kernel, true);
  }
};
const MatmulRegistrar g_matmul_registrar;

}  // namespace
}  // namespace taper::cpu
#endif  // HWY_ONCE
