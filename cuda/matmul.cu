// matmul.cu: OpId::matmul on CUDA through cuBLAS (cublasGemmEx / cublasGemmStridedBatchedEx),
// the twin of cpu/matmul.cpp.
//
// Shapes: a: (..., M, K), b: (..., K, N) -> c: (..., M, N), contiguous. The front-end has
// broadcast the batch dims (they may have stride 0) and checked K.
// Precision, by dtype (alpha = 1, beta = 0):
//   f32:  CUBLAS_COMPUTE_32F (true f32 products and sums); CUBLAS_COMPUTE_32F_FAST_TF32 only
//         when the user allowed it (taper::cuda_allow_tf32()).
//   bf16, f16: operands and result in their type, CUBLAS_COMPUTE_32F: products and sums in f32,
//         the result rounded once. The handle's math mode forbids reduced-precision reductions
//         (CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION), so split-K partials stay in f32
//         and are not rounded to the output type before they are added.
//   f64:  CUBLAS_COMPUTE_64F.
// Layout: cuBLAS is column-major, so the row-major C = A B is computed as the column-major
// C^T = B^T A^T: gemm(opB, opA, N, M, K, B, ldb, A, lda, C, ldc = N). An operand is read in
// place when cuBLAS can describe it: rows dense (a row-major matrix, narrowed rows too: op N,
// ld = row stride) or columns dense (a transposed view, strides (1, ld): op T, ld = column
// stride); size-1 dims may have any stride. Any other matrix layout is copied dense first; its
// broadcast batch dims (stride 0) stay broadcast, so only one copy of the matrix is made.
// Batch: the batch dims are flattened as far as both operands allow (size-1 dims ignored,
// stride 0 allowed: a broadcast operand has strideA/strideB = 0) into one strided-batched call.
// An operand whose batch dims do not flatten (and holds no broadcast dim) is first copied dense,
// so the batch stays one call; batch dims that still do not flatten (a mix of broadcast and
// strided dims) are looped over on the host, one strided-batched call each.
// When b is one matrix for every batch and a's (batch..., M) rows flatten into one stride (a
// linear layer on (B, T, C)), the batch folds into M: one (B*M, K) x (K, N) GEMM.
// Sizes: M, N or batch 0 -> an empty result without a cuBLAS call; K == 0 -> zeros (memset).
// Dims, lds or batch counts past int range use the _64 entry points.
// Handles: one per device, created lazily on first use (with that device current), bound to
// stream(ordinal), never destroyed (like the streams: static tensors may outlive statics).
// Every cuBLAS status is checked (TAPER_CUBLAS_CHECK): a failure is a taper::Error naming the
// call, its status, file:line and the input shapes.
// linear (x w^T + b, below) is one cuBLASLt call with the bias in its epilogue.
// What it is not: a GEMM of our own, or integer matmul (not registered).
#include <cublasLt.h>
#include <cublas_v2.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "cuda/cuda_common.cuh"
#include "taper/device.h"
#include "taper/dtype.h"
#include "taper/error.h"
#include "taper/op.h"

namespace taper::cuda {
namespace {

[[noreturn]] void throw_cublas_error(cublasStatus_t st, const char* call, const char* file,
                                     int line, const Tensor& a, const Tensor& b) {
  throw Error(detail::str_cat("matmul: cuBLAS error ", cublasGetStatusName(st), " (",
                              cublasGetStatusString(st), ") in ", call, " at ", file, ":", line,
                              " (inputs: ", a.shape().to_string(), " ", dtype_name(a.dtype()),
                              " x ", b.shape().to_string(), " ", dtype_name(b.dtype()), ")"));
}

/// Checks a cuBLAS call of the matmul of a and b: a failure becomes a taper::Error naming the
/// call, file:line and the shapes.
#define TAPER_CUBLAS_CHECK(call, a, b)                                               \
  do {                                                                               \
    const cublasStatus_t taper_st_ = (call);                                         \
    if (taper_st_ != CUBLAS_STATUS_SUCCESS)                                          \
      throw_cublas_error(taper_st_, #call, __FILE__, __LINE__, (a), (b));            \
  } while (0)

/// A device's cuBLAS workspace (32 MiB, what cuBLAS recommends for Hopper), shared by its cuBLAS
/// handle and the cuBLASLt calls of linear: both run on the device's one stream, in order.
constexpr size_t kWorkspace = size_t(32) << 20;
std::vector<void*>& workspaces() {
  static std::vector<void*>* w = new std::vector<void*>();  // leaked, as the handles
  return *w;
}

/// The cuBLAS handle of device `ordinal` (created on first use, bound to stream(ordinal)); also
/// makes `ordinal` the calling thread's current device.
cublasHandle_t handle(int ordinal, const Tensor& a, const Tensor& b) {
  static std::mutex mu;
  static std::vector<cublasHandle_t>* handles = new std::vector<cublasHandle_t>();  // leaked
  const cudaStream_t s = stream(ordinal);  // checks the ordinal, sets the device
  std::lock_guard<std::mutex> g(mu);
  if (handles->size() <= static_cast<size_t>(ordinal)) {
    handles->resize(static_cast<size_t>(ordinal) + 1, nullptr);
    workspaces().resize(static_cast<size_t>(ordinal) + 1, nullptr);
  }
  cublasHandle_t& h = (*handles)[static_cast<size_t>(ordinal)];
  if (!h) {
    cublasHandle_t nh = nullptr;
    TAPER_CUBLAS_CHECK(cublasCreate(&nh), a, b);
    try {
      TAPER_CUBLAS_CHECK(cublasSetStream(nh, s), a, b);
      // A workspace of our own, fixed for the handle's life (set after the stream, which resets
      // it): eager calls and calls captured into a cuda::Graph then see the same workspace, so
      // cuBLAS picks the same algorithm and gives the same bits; no allocation happens inside a
      // capture. Leaked with the handle.
      void* ws = nullptr;
      TAPER_CUDA_CHECK(cudaMalloc(&ws, kWorkspace));
      workspaces()[static_cast<size_t>(ordinal)] = ws;
      TAPER_CUBLAS_CHECK(cublasSetWorkspace(nh, ws, kWorkspace), a, b);
      TAPER_CUBLAS_CHECK(cublasSetMathMode(nh, static_cast<cublasMath_t>(
                                                   CUBLAS_DEFAULT_MATH |
                                                   CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
                         a, b);
    } catch (...) {
      (void)cublasDestroy(nh);
      throw;
    }
    h = nh;
  }
  return h;
}

/// How cuBLAS reads one row-major (rows x cols) operand in place. `trans` false: rows dense,
/// (i, j) at i*ld + j, ld >= cols (column-major this is the operand transposed, op N in the
/// C^T = B^T A^T call). `trans` true: a transposed view, (i, j) at i + j*ld, ld >= rows (op T).
struct BlasView {
  bool trans;
  int64_t ld;
};

/// The cuBLAS description of a (rows x cols) matrix with element strides (sr, sc), if one
/// exists. Size-1 dims may have any stride.
std::optional<BlasView> blas_view(size_t rows, size_t cols, int64_t sr, int64_t sc) {
  const int64_t r1 = static_cast<int64_t>(std::max<size_t>(rows, 1));
  const int64_t c1 = static_cast<int64_t>(std::max<size_t>(cols, 1));
  if ((cols <= 1 || sc == 1) && (rows <= 1 || sr >= c1)) return BlasView{false, rows <= 1 ? c1 : sr};
  if ((rows <= 1 || sr == 1) && (cols <= 1 || sc >= r1)) return BlasView{true, cols <= 1 ? r1 : sc};
  return std::nullopt;
}

/// The single stride of `dims` (with `strides`) flattened into one dim, if they flatten (size-1
/// dims ignored; stride 0 throughout is a broadcast and flattens); `fallback` when no dim is
/// larger than 1.
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

/// Offset (in elements) of batch `bi` of an operand with batch dims `bdims` and strides `bst`.
int64_t batch_offset(size_t bi, const std::vector<size_t>& bdims, const std::vector<int64_t>& bst) {
  int64_t off = 0;
  for (size_t i = bdims.size(); i-- > 0;) {
    off += static_cast<int64_t>(bi % bdims[i]) * bst[i];
    bi /= bdims[i];
  }
  return off;
}

/// `t` itself when cuBLAS can read its matrices in place, else a copy whose matrices are dense
/// row-major; batch dims broadcast in `t` (stride 0) stay broadcast (one matrix is copied, not
/// one per batch).
Tensor readable(const Tensor& t) {
  const size_t r = t.rank();
  if (blas_view(t.dims()[r - 2], t.dims()[r - 1], t.strides()[r - 2], t.strides()[r - 1]))
    return t;
  Tensor u = t.detach();
  for (size_t i = 0; i + 2 < r; ++i)
    if (t.dims()[i] > 1 && t.strides()[i] == 0) u = u.narrow(static_cast<int64_t>(i), 0, 1);
  u = u.contiguous();
  return u.shape() == t.shape() ? u : u.broadcast_as(t.shape());
}

/// cuBLAS's element type and compute type of dtype `dt`.
struct GemmTypes {
  cudaDataType_t data;
  cublasComputeType_t compute;
};
GemmTypes gemm_types(DType dt) {
  switch (dt) {
    case DType::F64: return {CUDA_R_64F, CUBLAS_COMPUTE_64F};
    case DType::F32:
      return {CUDA_R_32F, cuda_allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F};
    case DType::BF16: return {CUDA_R_16BF, CUBLAS_COMPUTE_32F};
    case DType::F16: return {CUDA_R_16F, CUBLAS_COMPUTE_32F};
    default: break;
  }
  TAPER_ASSERT(false && "cuda matmul: integer dtypes are not registered");
  return {CUDA_R_32F, CUBLAS_COMPUTE_32F};
}

/// One column-major call: C^T (n x m, ldc) = op(B) op(A) for `count` batches, in the strides
/// given (elements). Pointers are byte addresses of element 0 of batch 0.
struct GemmCall {
  cublasOperation_t opa, opb;
  int64_t m, n, k;
  const void* a;
  int64_t lda, stride_a;
  const void* b;
  int64_t ldb, stride_b;
  void* c;
  int64_t ldc, stride_c;
  int64_t count;
};

void run_gemm(cublasHandle_t h, const GemmCall& g, const GemmTypes& ty, const Tensor& ta,
              const Tensor& tb) {
  const float one_f = 1.0f, zero_f = 0.0f;
  const double one_d = 1.0, zero_d = 0.0;
  const bool f64 = ty.compute == CUBLAS_COMPUTE_64F;
  const void* alpha = f64 ? static_cast<const void*>(&one_d) : static_cast<const void*>(&one_f);
  const void* beta = f64 ? static_cast<const void*>(&zero_d) : static_cast<const void*>(&zero_f);
  const auto fits = [](int64_t v) { return v <= static_cast<int64_t>(INT_MAX); };
  const bool small = fits(g.m) && fits(g.n) && fits(g.k) && fits(g.lda) && fits(g.ldb) &&
                     fits(g.ldc) && fits(g.count);
  const auto i32 = [](int64_t v) { return static_cast<int>(v); };
  // C^T = B^T A^T: cuBLAS's "A" is our b (n x k after op), its "B" our a (k x m after op).
  if (g.count == 1 && small) {
    TAPER_CUBLAS_CHECK(cublasGemmEx(h, g.opb, g.opa, i32(g.n), i32(g.m), i32(g.k), alpha, g.b,
                                    ty.data, i32(g.ldb), g.a, ty.data, i32(g.lda), beta, g.c,
                                    ty.data, i32(g.ldc), ty.compute, CUBLAS_GEMM_DEFAULT),
                       ta, tb);
  } else if (small) {
    TAPER_CUBLAS_CHECK(
        cublasGemmStridedBatchedEx(h, g.opb, g.opa, i32(g.n), i32(g.m), i32(g.k), alpha, g.b,
                                   ty.data, i32(g.ldb), g.stride_b, g.a, ty.data, i32(g.lda),
                                   g.stride_a, beta, g.c, ty.data, i32(g.ldc), g.stride_c,
                                   i32(g.count), ty.compute, CUBLAS_GEMM_DEFAULT),
        ta, tb);
  } else {
    TAPER_CUBLAS_CHECK(
        cublasGemmStridedBatchedEx_64(h, g.opb, g.opa, g.n, g.m, g.k, alpha, g.b, ty.data, g.ldb,
                                      g.stride_b, g.a, ty.data, g.lda, g.stride_a, beta, g.c,
                                      ty.data, g.ldc, g.stride_c, g.count, ty.compute,
                                      CUBLAS_GEMM_DEFAULT),
        ta, tb);
  }
}

std::vector<Tensor> matmul_kernel(const std::vector<Tensor>& in, const OpAttrs&) {
  const Tensor& a_in = in[0];
  const Tensor& b_in = in[1];
  const size_t r = a_in.rank();
  TAPER_ASSERT(r >= 2 && b_in.rank() == r && a_in.dims()[r - 1] == b_in.dims()[r - 2]);
  TAPER_ASSERT(a_in.dtype() == b_in.dtype());
  std::vector<size_t> od = a_in.dims();
  od[r - 1] = b_in.dims()[r - 1];
  Tensor c = new_output(Shape(od), a_in.dtype(), a_in);
  if (c.elem_count() == 0) return {c};
  const size_t m = a_in.dims()[r - 2], k = a_in.dims()[r - 1], n = b_in.dims()[r - 1];
  const size_t esz = dtype_size(c.dtype());
  const int ord = c.device().ordinal();
  if (k == 0) {  // an empty sum: zeros (+0.0 is all-zero bits in every float dtype)
    TAPER_CUDA_CHECK(cudaMemsetAsync(c.data_ptr(), 0, c.elem_count() * esz, stream(ord)));
    return {c};
  }
  const GemmTypes ty = gemm_types(c.dtype());
  const cublasHandle_t h = handle(ord, a_in, b_in);

  Tensor a = readable(a_in), b = readable(b_in);
  // Batch dims that do not flatten into one stride (attention's heads: (B, H, T, D) viewed from
  // (B, T, H, D)) would make a host loop of one cuBLAS call per outer index (B calls of H
  // matrices each: thousands of tiny launches per training step). A dense copy of such an
  // operand, one copy kernel, makes the whole batch one strided-batched call. An operand with
  // broadcast batch dims keeps them (no materialised broadcast) and may still loop.
  const auto dense_batch = [&](Tensor& t) {
    const std::vector<size_t> d(t.dims().begin(), t.dims().end() - 2);
    const std::vector<int64_t> st(t.strides().begin(), t.strides().end() - 2);
    if (flat_stride(d, st, 0)) return;
    for (size_t i = 0; i < d.size(); ++i)
      if (d[i] > 1 && st[i] == 0) return;
    t = t.detach().contiguous();
  };
  dense_batch(a);
  dense_batch(b);
  const std::vector<size_t> bdims(a.dims().begin(), a.dims().end() - 2);
  const std::vector<int64_t> as(a.strides().begin(), a.strides().end() - 2);
  const std::vector<int64_t> bs(b.strides().begin(), b.strides().end() - 2);
  const int64_t asr = a.strides()[r - 2], asc = a.strides()[r - 1];
  const int64_t bsr = b.strides()[r - 2], bsc = b.strides()[r - 1];
  size_t batch = 1;
  for (size_t d : bdims) batch *= d;
  const auto* ap = static_cast<const char*>(a.data_ptr());
  const auto* bp = static_cast<const char*>(b.data_ptr());
  auto* cp = static_cast<char*>(c.data_ptr());
  const auto i64 = [](size_t v) { return static_cast<int64_t>(v); };
  const auto op = [](const BlasView& v) { return v.trans ? CUBLAS_OP_T : CUBLAS_OP_N; };
  const BlasView vb = *blas_view(k, n, bsr, bsc);

  // Fold the batch into M when b is one matrix for every batch and a's (batch..., M) rows
  // flatten into one stride that cuBLAS can read.
  bool b_shared = true;
  for (size_t i = 0; i < bdims.size(); ++i)
    if (bdims[i] > 1 && bs[i] != 0) b_shared = false;
  if (batch > 1 && b_shared) {
    std::vector<size_t> rd = bdims;
    std::vector<int64_t> rs = as;
    rd.push_back(m);
    rs.push_back(asr);
    if (const auto fs = flat_stride(rd, rs, asr)) {
      if (const auto va = blas_view(m * batch, k, *fs, asc)) {
        run_gemm(h,
                 GemmCall{op(*va), op(vb), i64(m * batch), i64(n), i64(k), ap, va->ld, 0, bp,
                          vb.ld, 0, cp, i64(n), 0, 1},
                 ty, a_in, b_in);
        return {c};
      }
    }
  }

  // The longest suffix of batch dims that flattens for both operands goes into one
  // strided-batched call; the dims before it are looped over.
  const BlasView va = *blas_view(m, k, asr, asc);
  size_t split = bdims.size();
  std::optional<int64_t> sa = int64_t{0}, sb = int64_t{0};
  while (split > 0) {
    const std::vector<size_t> d(bdims.begin() + static_cast<std::ptrdiff_t>(split - 1), bdims.end());
    const auto fa = flat_stride(d, {as.begin() + static_cast<std::ptrdiff_t>(split - 1), as.end()}, 0);
    const auto fb = flat_stride(d, {bs.begin() + static_cast<std::ptrdiff_t>(split - 1), bs.end()}, 0);
    if (!fa || !fb) break;
    sa = fa;
    sb = fb;
    --split;
  }
  const std::vector<size_t> outer_dims(bdims.begin(), bdims.begin() + static_cast<std::ptrdiff_t>(split));
  const std::vector<int64_t> outer_as(as.begin(), as.begin() + static_cast<std::ptrdiff_t>(split));
  const std::vector<int64_t> outer_bs(bs.begin(), bs.begin() + static_cast<std::ptrdiff_t>(split));
  size_t outer = 1;
  for (size_t d : outer_dims) outer *= d;
  const size_t inner = batch / outer;
  for (size_t o = 0; o < outer; ++o) {
    const int64_t ao = batch_offset(o, outer_dims, outer_as);
    const int64_t bo = batch_offset(o, outer_dims, outer_bs);
    run_gemm(h,
             GemmCall{op(va), op(vb), i64(m), i64(n), i64(k), ap + ao * i64(esz), va.ld, *sa,
                      bp + bo * i64(esz), vb.ld, *sb, cp + i64(o * inner * m * n * esz), i64(n),
                      i64(m * n), i64(inner)},
             ty, a_in, b_in);
  }
  return {c};
}

// ---- linear: y = x w^T + b in one cuBLASLt call, the bias added in the GEMM's epilogue --------
// x (R, in) and w (out, in) contiguous (the registry makes them so), b (out) or absent. Column-
// major, y^T (out x R) = op_T(w as (in x out), ld in) * (x as (in x R), ld in), and the bias is a
// vector over y^T's rows. The epilogue adds it to the f32 sum before the one rounding to y's
// type, where matmul then add rounds twice (bf16, f16, f32; f64 runs linear's composed form).
// Split-K partials stay in the compute type (reduction schemes NONE or COMPUTE_TYPE only), as
// the handle's math mode asks of cublasGemmEx.
// Plans (descriptors and the heuristic's algorithm) are cached per shape, dtype, TF32 setting and
// pointer alignment, so a call costs no heuristic query after the first and a captured call uses
// the eager call's algorithm.

[[noreturn]] void throw_lt_error(cublasStatus_t st, const char* call, int line, const Tensor& x,
                                 const Tensor& w) {
  throw Error(detail::str_cat("linear: cuBLASLt error ", cublasGetStatusName(st), " (",
                              cublasGetStatusString(st), ") in ", call, " at ", __FILE__, ":",
                              line, " (inputs: ", x.shape().to_string(), " ",
                              dtype_name(x.dtype()), " x ", w.shape().to_string(), " ",
                              dtype_name(w.dtype()), ")"));
}
#define TAPER_LT_CHECK(call)                                                   \
  do {                                                                         \
    const cublasStatus_t taper_st_ = (call);                                   \
    if (taper_st_ != CUBLAS_STATUS_SUCCESS)                                    \
      throw_lt_error(taper_st_, #call, __LINE__, x, w);                        \
  } while (0)

/// The largest power of two (at most 256) that divides the address.
uint32_t alignment(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

struct LtKey {
  int ordinal;
  DType dt;
  bool tf32, bias;
  int64_t rows, in, out;
  uint32_t align;  ///< the least alignment of x, w, y and b
  auto operator<=>(const LtKey&) const = default;
};

struct LtPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t lw = nullptr, lx = nullptr, ly = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

cublasLtHandle_t lt_handle(int ordinal, const Tensor& x, const Tensor& w) {
  static std::vector<cublasLtHandle_t>* handles = new std::vector<cublasLtHandle_t>();  // leaked
  if (handles->size() <= static_cast<size_t>(ordinal))
    handles->resize(static_cast<size_t>(ordinal) + 1, nullptr);
  cublasLtHandle_t& h = (*handles)[static_cast<size_t>(ordinal)];
  if (!h) TAPER_LT_CHECK(cublasLtCreate(&h));
  return h;
}

/// Fills every row of y (rows x out) with b, or zeros without b: x w^T + b with in == 0.
template <class T> __global__ void bias_rows_kernel(T* y, const T* b, int64_t rows, int64_t out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * out;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = b ? b[i % out] : T{};
}

std::vector<Tensor> linear_kernel(const std::vector<Tensor>& in, const OpAttrs&) {
  const Tensor& x = in[0];
  const Tensor& w = in[1];
  const bool has_b = present(in, 2);
  TAPER_ASSERT(x.rank() == 2 && w.rank() == 2 && x.dim(1) == w.dim(1));
  const int64_t rows = static_cast<int64_t>(x.dim(0)), k = static_cast<int64_t>(x.dim(1));
  const int64_t out = static_cast<int64_t>(w.dim(0));
  Tensor y = new_output(Shape({x.dim(0), w.dim(0)}), x.dtype(), x);
  if (y.elem_count() == 0) return {y};
  const int ord = y.device().ordinal();
  const cudaStream_t st = stream(ord);
  if (k == 0) {  // an empty sum: the bias in every row
    visit_dtype(y.dtype(), [&](auto tag) {
      using T = decltype(tag);
      bias_rows_kernel<T><<<grid_for(y.elem_count(), ord), kThreads, 0, st>>>(
          ptr<T>(y), has_b ? ptr<const T>(in[2]) : nullptr, rows, out);
    });
    TAPER_CUDA_CHECK_LAUNCH("linear", in);
    return {y};
  }
  (void)handle(ord, x, w);  // the device's workspace
  const GemmTypes ty = gemm_types(y.dtype());  // f32 compute: f64 is not registered
  uint32_t align = std::min({alignment(x.data_ptr()), alignment(w.data_ptr()),
                             alignment(y.data_ptr())});
  if (has_b) align = std::min(align, alignment(in[2].data_ptr()));
  const LtKey key{ord, y.dtype(), ty.compute == CUBLAS_COMPUTE_32F_FAST_TF32, has_b, rows, k, out,
                  align};
  static std::mutex mu;
  static std::map<LtKey, LtPlan>* plans = new std::map<LtKey, LtPlan>();  // leaked
  std::lock_guard<std::mutex> g(mu);
  const cublasLtHandle_t lt = lt_handle(ord, x, w);
  auto it = plans->find(key);
  if (it == plans->end()) {
    LtPlan p;
    TAPER_LT_CHECK(cublasLtMatmulDescCreate(&p.desc, ty.compute, CUDA_R_32F));
    const cublasOperation_t opt = CUBLAS_OP_T, opn = CUBLAS_OP_N;
    TAPER_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opt, sizeof(opt)));
    TAPER_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opn, sizeof(opn)));
    const cublasLtEpilogue_t epi = has_b ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    TAPER_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    if (has_b) {
      const void* bp = in[2].data_ptr();
      TAPER_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp)));
    }
    TAPER_LT_CHECK(cublasLtMatrixLayoutCreate(&p.lw, ty.data, static_cast<uint64_t>(k),
                                              static_cast<uint64_t>(out), k));
    TAPER_LT_CHECK(cublasLtMatrixLayoutCreate(&p.lx, ty.data, static_cast<uint64_t>(k),
                                              static_cast<uint64_t>(rows), k));
    TAPER_LT_CHECK(cublasLtMatrixLayoutCreate(&p.ly, ty.data, static_cast<uint64_t>(out),
                                              static_cast<uint64_t>(rows), out));
    cublasLtMatmulPreference_t pref = nullptr;
    TAPER_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = kWorkspace;
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    cublasStatus_t hs = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    if (hs == CUBLAS_STATUS_SUCCESS)
      hs = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof(schemes));
    for (cublasLtMatmulPreferenceAttributes_t at :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      if (hs == CUBLAS_STATUS_SUCCESS)
        hs = cublasLtMatmulPreferenceSetAttribute(pref, at, &align, sizeof(align));
    if (hs == CUBLAS_STATUS_SUCCESS)
      hs = cublasLtMatmulAlgoGetHeuristic(lt, p.desc, p.lw, p.lx, p.ly, p.ly, pref, 1, &res, &found);
    (void)cublasLtMatmulPreferenceDestroy(pref);
    TAPER_LT_CHECK(hs);
    TAPER_CHECK(found > 0, "linear: cuBLASLt has no algorithm for ", x.shape().to_string(), " x ",
                w.shape().to_string(), "^T ", dtype_name(x.dtype()), has_b ? " with" : " without",
                " a bias");
    p.algo = res.algo;
    it = plans->emplace(key, p).first;
  }
  LtPlan& p = it->second;
  if (has_b) {
    const void* bp = in[2].data_ptr();
    TAPER_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp)));
  }
  const float alpha = 1.0f, beta = 0.0f;
  TAPER_LT_CHECK(cublasLtMatmul(lt, p.desc, &alpha, w.data_ptr(), p.lw, x.data_ptr(), p.lx, &beta,
                                y.data_ptr(), p.ly, y.data_ptr(), p.ly, &p.algo,
                                workspaces()[static_cast<size_t>(ord)], kWorkspace, st));
  return {y};
}
#undef TAPER_LT_CHECK

// Strided operands are read in place where cuBLAS can; the kernel copies the rest itself.
struct MatmulRegistrar {
  MatmulRegistrar() {
    register_kernel(OpId::matmul, DeviceKind::Cuda, kFloatDTypes, &matmul_kernel,
                    /*needs_contiguous=*/false);
    // f64 takes linear's composed form (matmul, then add).
    register_kernel(OpId::linear, DeviceKind::Cuda,
                    dtype_bit(DType::BF16) | dtype_bit(DType::F16) | dtype_bit(DType::F32),
                    &linear_kernel,
                    /*needs_contiguous=*/true);
  }
};
const MatmulRegistrar g_matmul_registrar;

}  // namespace
}  // namespace taper::cuda
