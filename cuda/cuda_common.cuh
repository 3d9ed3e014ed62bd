// cuda_common.cuh: what every CUDA kernel family shares: error checks that become taper::Error,
// the per-device stream, launch geometry, strided offsets for N operands, output allocation.
//
// Shape letters and conventions: n is an element count; operands are addressed in elements
// (strides in elements, as Layout keeps them); every kernel computes in compute_t<T> (f32 for
// bf16/f16/f32, f64 for f64, taper/portable.h) and rounds once with round_to<T> at the store.
// Launches are asynchronous on the device's stream (stream(ordinal)); the host waits only where
// it reads data (the backend's copies to the host).
// What it is not: kernels (one .cu per op family, as in cpu/) or the allocator (backend.cu).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "taper/op.h"
#include "taper/portable.h"
#include "taper/tensor.h"

namespace taper::cuda {

/// Throws taper::Error naming the CUDA call, its error string, file:line and (when given) the op.
[[noreturn]] void throw_cuda_error(cudaError_t e, const char* call, const char* file, int line,
                                   const char* op = nullptr);

/// Checks a CUDA runtime call; a failure becomes a taper::Error with the call and file:line.
#define TAPER_CUDA_CHECK(call)                                                     \
  do {                                                                             \
    const cudaError_t taper_e_ = (call);                                           \
    if (taper_e_ != cudaSuccess)                                                   \
      ::taper::cuda::throw_cuda_error(taper_e_, #call, __FILE__, __LINE__);        \
  } while (0)

/// Checks the kernel launch just made for `op` (cudaGetLastError): a bad configuration becomes
/// a taper::Error naming the op, the input shapes and file:line.
void check_launch(const char* op, const std::vector<Tensor>& in, const char* file, int line);
#define TAPER_CUDA_CHECK_LAUNCH(op, in) ::taper::cuda::check_launch(op, in, __FILE__, __LINE__)

/// The stream every launch and copy on device `ordinal` goes to (created on first use, one per
/// device, non-blocking). Also makes `ordinal` the calling thread's current device.
cudaStream_t stream(int ordinal);
/// stream() of a tensor's device.
inline cudaStream_t stream_of(const Tensor& t) { return stream(t.device().ordinal()); }
/// The properties of device `ordinal` (read once).
const cudaDeviceProp& device_props(int ordinal);

/// A bad index found inside a kernel. Each device has one record in mapped host memory; the first
/// kernel thread that finds a bad index claims it (flag 0 -> 1), fills it and sets flag 2. The
/// host reads it after the next stream synchronisation (every copy to the host and
/// `synchronize`), and raises an Error naming the op, the index, the dim and its size, as the CPU
/// kernels do at once. Meanwhile a bad index reads and writes nothing (its output element stays
/// unwritten; the Error says the result is not to be used).
struct KernelErrorRecord {
  int flag;
  int op;  ///< OpId
  long long index, dim, size;
};
/// The device-side address of `ordinal`'s record (pass it to kernels that check indices).
KernelErrorRecord* kernel_error_record(int ordinal);
/// Raises the recorded error of `ordinal`, if any, and clears it (call after a stream sync).
void raise_kernel_error(int ordinal);

/// Records a bad index (device code); later reports of the same launch are dropped.
__device__ inline void report_bad_index(KernelErrorRecord* rec, OpId op, long long index,
                                        long long dim, long long size) {
  if (atomicCAS(&rec->flag, 0, 1) == 0) {
    rec->op = static_cast<int>(op);
    rec->index = index;
    rec->dim = dim;
    rec->size = size;
    __threadfence_system();
    atomicExch(&rec->flag, 2);
  }
}

/// Threads per block of the elementwise kernels.
inline constexpr int kThreads = 256;

/// ceil(a / b) for a >= 0, b > 0 (grid sizes, vectors, chunks), host and device.
__host__ __device__ inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// The dynamic shared memory a block may have on sm_90, 227 KB (about what an SM holds for all
/// its blocks).
inline constexpr size_t kSmemPerBlock = size_t{227} << 10;

/// Blocks for a grid-stride loop over n items: enough to fill every multiprocessor several
/// times over, never more than the items need.
unsigned grid_for(size_t n, int ordinal, int threads = kThreads);

/// The launch configuration of `blocks` blocks of `threads` threads (1-D), with `smem` bytes of
/// dynamic shared memory, on `st`, and the one launch attribute `attr` (which must outlive the
/// configuration's use).
inline cudaLaunchConfig_t attr_config(cudaLaunchAttribute& attr, unsigned blocks, int threads,
                                      size_t smem, cudaStream_t st) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return cfg;
}

/// attr_config with clusters of `cs` blocks; `attr` receives the cluster attribute.
inline cudaLaunchConfig_t cluster_config(cudaLaunchAttribute& attr, unsigned blocks, int threads,
                                         int cs, size_t smem, cudaStream_t st) {
  attr = {};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = static_cast<unsigned>(cs);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  return attr_config(attr, blocks, threads, smem, st);
}

/// Programmatic dependent launch (sm_90). A kernel launched with it (launch_clustered<true>)
/// may have its blocks scheduled while the kernel before it in the stream still runs, once
/// every block of that one has called pdl_begin or exited, so its launch and its first blocks'
/// start overlap that kernel's last blocks. Such a kernel must call pdl_begin before it touches
/// global memory: it waits there until the kernels before it have completed and their writes
/// are visible (a no-op where the kernel was launched without it), then lets the next kernel's
/// blocks be scheduled.
__device__ __forceinline__ void pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

#ifdef __CUDACC__  // a launch: nvcc translation units only (bench_cuda.cpp includes this header)
/// Launches `kernel` for op `name` by `cfg` (cudaLaunchKernelEx) and checks the launch: a refusal
/// is a taper::Error naming the op (TAPER_CUDA_CHECK_LAUNCH's, for what follows).
template <class... P, class... A>
void launch_ex(const char* name, const std::vector<Tensor>& in, const cudaLaunchConfig_t& cfg,
               void (*kernel)(P...), A&&... args) {
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // not left behind for the next launch's check
    throw_cuda_error(e, "cudaLaunchKernelEx", __FILE__, __LINE__, name);
  }
  TAPER_CUDA_CHECK_LAUNCH(name, in);
}

/// Launches `kernel` for op `name` over `grid` blocks in clusters of `cs` (1: none) and checks
/// the launch. kPdl: a programmatic dependent launch (pdl_begin, which the kernel must call
/// first).
template <bool kPdl = false, class... P, class... A>
void launch_grid(const char* name, const std::vector<Tensor>& in, void (*kernel)(P...), dim3 grid,
                 int threads, int cs, size_t smem, cudaStream_t st, A&&... args) {
  if (cs == 1 && !kPdl) {
    kernel<<<grid, threads, smem, st>>>(std::forward<A>(args)...);
    TAPER_CUDA_CHECK_LAUNCH(name, in);
    return;
  }
  cudaLaunchAttribute attrs[2];
  cudaLaunchConfig_t cfg = cluster_config(attrs[0], 1, threads, cs, smem, st);
  cfg.gridDim = grid;
  cfg.numAttrs = cs > 1 ? 1 : 0;
  if constexpr (kPdl) {
    cudaLaunchAttribute& a = attrs[cfg.numAttrs++];
    a = {};
    a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    a.val.programmaticStreamSerializationAllowed = 1;
  }
  cfg.attrs = attrs;
  launch_ex(name, in, cfg, kernel, std::forward<A>(args)...);
}

/// launch_grid of `blocks` blocks (1-D).
template <bool kPdl = false, class... P, class... A>
void launch_clustered(const char* name, const std::vector<Tensor>& in, void (*kernel)(P...),
                      unsigned blocks, int threads, int cs, size_t smem, cudaStream_t st,
                      A&&... args) {
  launch_grid<kPdl>(name, in, kernel, dim3(blocks), threads, cs, smem, st,
                    std::forward<A>(args)...);
}

/// A cooperative launch of `blocks` blocks (no dynamic shared memory): every block resident at
/// once, so that the kernel may wait on the whole grid (cooperative_groups' grid sync). The
/// caller checks first that the device holds that many (resident_blocks).
template <class... P, class... A>
void launch_cooperative(const char* name, const std::vector<Tensor>& in, void (*kernel)(P...),
                        unsigned blocks, int threads, cudaStream_t st, A&&... args) {
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeCooperative;
  attr.val.cooperative = 1;
  launch_ex(name, in, attr_config(attr, blocks, threads, 0, st), kernel,
            std::forward<A>(args)...);
}
#endif

/// Blocks of `kernel` (a __global__ function) that device `ordinal` holds at once when launched
/// with `threads` threads, `smem` bytes of dynamic shared memory and `cluster` blocks per cluster
/// (1: no cluster): resident blocks per multiprocessor times their count, or resident clusters
/// times `cluster`. Raises the kernel's dynamic shared memory limit to `smem` on that device
/// first. Found once per (kernel, threads, smem, cluster, device); 0 when it cannot run so (the
/// caller takes another plan). For persistent grids, whose blocks loop over the work.
int resident_blocks(const void* kernel, int threads, size_t smem, int cluster, int ordinal);

/// Most dims an operand keeps after coalescing (rank-1 dims dropped, dense neighbours merged).
inline constexpr int kMaxDims = 12;

/// Element offsets of N operands that share one shape: row-major index i -> each operand's
/// offset (in elements) from its base pointer. Built on the host by make_strided (coalesced), or
/// by hand followed by set_divisors().
///
/// When every index is below 2^31 (`narrow`), the per-dim division runs in 32 bits as a
/// multiply-high and a shift (Granlund & Montgomery's division by invariant integers: for
/// d <= 2^s, m = floor(2^32 (2^s - d) / d) + 1 gives q = (umulhi(n, m) + n) >> s exactly for
/// n, d < 2^31). A 64-bit `/` is a long software routine on the GPU: a broadcast add of 10^8
/// elements spent most of its time there (docs/cuda.md, run 8's profile).
template <int N> struct Strided {
  int rank = 0;                      ///< coalesced dims, innermost last
  bool narrow = false;               ///< every index < 2^31: the 32-bit division below
  int64_t dims[kMaxDims] = {};
  uint32_t magic[kMaxDims] = {};
  uint32_t shift[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};

  /// Computes narrow, magic and shift from rank and dims (host side).
  void set_divisors() {
    int64_t count = 1;
    narrow = true;
    for (int d = 0; d < rank; ++d) {
      if (dims[d] <= 0 || dims[d] >= (int64_t{1} << 31) || count >= (int64_t{1} << 31) / dims[d]) {
        narrow = false;
        return;
      }
      count *= dims[d];
      const uint64_t dv = static_cast<uint64_t>(dims[d]);
      uint32_t sh = 0;
      while ((uint64_t{1} << sh) < dv) ++sh;
      shift[d] = sh;
      magic[d] = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << sh) - dv)) / dv + 1);
    }
  }

  /// Offsets of row-major element i.
  __device__ __forceinline__ void offsets(int64_t i, int64_t (&off)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
    if (narrow) {
      uint32_t u = static_cast<uint32_t>(i);
      for (int d = rank - 1; d >= 0; --d) {
        const uint32_t q = (__umulhi(u, magic[d]) + u) >> shift[d];
        const uint32_t r = u - q * static_cast<uint32_t>(dims[d]);
        u = q;
#pragma unroll
        for (int k = 0; k < N; ++k) off[k] += static_cast<int64_t>(r) * strides[k][d];
      }
      return;
    }
    for (int d = rank - 1; d >= 0; --d) {
      const int64_t q = i / dims[d];
      const int64_t r = i - q * dims[d];
      i = q;
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += r * strides[k][d];
    }
  }
};

/// The coalesced Strided<N> of `shape` with one stride vector per operand (each of shape's
/// rank; 0 for broadcast dims). Throws Error when more than kMaxDims dims remain.
template <int N>
Strided<N> make_strided(const Shape& shape, const std::array<const std::vector<int64_t>*, N>& st) {
  Strided<N> s;
  std::vector<int64_t> dims;
  std::array<std::vector<int64_t>, N> cs;
  for (size_t i = 0; i < shape.rank(); ++i) {
    if (shape[i] == 1) continue;
    const int64_t d = static_cast<int64_t>(shape[i]);
    if (!dims.empty()) {
      bool merge = true;
      for (int k = 0; k < N; ++k)
        if (cs[k].back() != (*st[k])[i] * d) merge = false;
      if (merge) {
        dims.back() *= d;
        for (int k = 0; k < N; ++k) cs[k].back() = (*st[k])[i];
        continue;
      }
    }
    dims.push_back(d);
    for (int k = 0; k < N; ++k) cs[k].push_back((*st[k])[i]);
  }
  TAPER_CHECK(dims.size() <= static_cast<size_t>(kMaxDims), "cuda: shape ", shape.to_string(),
              " has ", dims.size(), " dims after coalescing; at most ", kMaxDims, " supported");
  s.rank = static_cast<int>(dims.size());
  for (int d = 0; d < s.rank; ++d) {
    s.dims[d] = dims[d];
    for (int k = 0; k < N; ++k) s.strides[k][d] = cs[k][d];
  }
  s.set_divisors();
  return s;
}

/// 16 bytes of T, the unit the vectorised paths move per thread and iteration.
template <class T> struct alignas(16) Vec16 {
  T v[16 / sizeof(T)];
};

/// Whether the operands of `s` (base pointers `base`, elements of `elem_bytes`) can be read in
/// Vec16s along the innermost coalesced dim: its length a whole number of vectors and, for each
/// operand read with stride 1 there, a 16-byte aligned base and outer strides in whole vectors.
/// With `splat_runs` an operand may instead have stride 0 there (one value per run, or a scalar
/// with base nullptr), for a kernel that broadcasts it into every lane; without, every operand
/// is a vector load and must have stride 1. Then row-major element v * kV starts a vector in
/// every operand, and s.offsets runs once per vector.
template <int N>
bool runs_in_vectors(const Strided<N>& s, const std::array<const void*, N>& base,
                     size_t elem_bytes, bool splat_runs) {
  const int64_t kv = static_cast<int64_t>(16 / elem_bytes);
  if (s.rank < 1 || s.dims[s.rank - 1] % kv != 0) return false;
  for (int k = 0; k < N; ++k) {
    const int64_t inner = s.strides[k][s.rank - 1];
    if (inner == 0 && splat_runs) continue;
    if (inner != 1 || reinterpret_cast<uintptr_t>(base[k]) % 16 != 0) return false;
    for (int d = 0; d + 1 < s.rank; ++d)
      if (s.strides[k][d] % kv != 0) return false;
  }
  return true;
}

/// f(v, off) for every vector v < nv of a runs_in_vectors layout, off[k] operand k's offset of
/// row-major element v * kV: a grid-stride loop with one offsets() chain per vector.
template <int N, int kV, class F>
__device__ __forceinline__ void for_each_vector(int64_t nv, const Strided<N>& s, const F& f) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < nv;
       v += step) {
    int64_t off[N];
    s.offsets(v * kV, off);
    f(v, off);
  }
}

/// Whether every operand of `s` is dense row-major over the same elements (offset = index).
template <int N> bool is_dense(const Strided<N>& s) {
  if (s.rank > 1) return false;
  for (int k = 0; k < N; ++k)
    if (s.rank == 1 && s.strides[k][0] != 1) return false;
  return true;
}

/// A new contiguous tensor on `like`'s device.
inline Tensor new_output(const Shape& shape, DType dt, const Tensor& like) {
  return Tensor::empty(shape, dt, like.device());
}

/// A typed device pointer to element 0 of a view.
template <class T> T* ptr(const Tensor& t) { return static_cast<T*>(t.data_ptr()); }

}  // namespace taper::cuda
