// bench_cuda.cpp: Google Benchmark program for taper's CUDA backend: bandwidth-bound primitives
// against a device-to-device copy, the host cost of one op call, matmul against cuBLAS called
// directly, and the fused ops against their composed forms.
//
// What it is: device time measured from the host: every timed iteration queues its work on
// taper's stream of cuda:0 and ends with taper::synchronize(Device::cuda()), under wall time
// (UseRealTime). Rates are bytes/s of the minimal traffic (SetBytesProcessed: every input read
// once, every output written once) or TFLOP/s (2*M*N*K per matmul). The one exception is
// BM_cuda_op_overhead, which times the host alone (see there). Every benchmark skips (SkipWithError)
// when no CUDA device is present.
//   BM_cuda_memcpy_d2d         cudaMemcpyAsync D2D of 2^28 f32 (1 GiB); bytes 2 * 4 * n
//   BM_cuda_add_f32            a + b, 2^28 f32 each; bytes 3 * 4 * n (target >= 90% of the copy)
//   BM_cuda_sum_last_dim_f32   x.sum({1}) of (16384, 16384) f32; bytes 4 * n, the input read
//                              (the 64 KiB output is not counted; target >= 85% of the copy)
//   BM_cuda_op_overhead        host microseconds per `x + y` call on 1-element tensors
//                              (counter us_per_op; target <= 5)
//   BM_cuda_matmul_taper/<dt>  a.matmul(b), 4096^3, f32 (TF32 off) and bf16; counter TFLOP/s
//   BM_cuda_matmul_cublas/<dt> cublasGemmEx on the same shapes, on its own handle configured as
//                              taper's (taper's stream, the same math mode and compute type);
//                              target taper >= 95% of it
// `bench_cuda --fused-table FILE` instead writes the fused-against-composed table (CSV; see
// run_fused_table), timed with CUDA events and the L2 flushed, by the method of
// scripts/bench_fused_torch.py; scripts/h200_report.py renders both as docs/benchmarks-h200.md.
// `--filter S` with it keeps the rows whose "op,dtype,shape,path,pass" contains S (for ncu).
// What it is not: a correctness check (tests/ do that).
#include <benchmark/benchmark.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "benches/fused_case.h"
#include "taper/composed.h"
#include "taper/taper.h"

void gpu_spin(cudaStream_t s, long long cycles);  // gpu_spin.cu

// taper's stream of a device, from cuda/backend.cu (declared in cuda/cuda_common.cuh, which holds
// device code and does not compile as host C++; the library exports the symbol).
namespace taper::cuda {
cudaStream_t stream(int ordinal);
}  // namespace taper::cuda

namespace {

using taper::Device;
using taper::DeviceKind;
using taper::DType;
using taper::OpId;
using taper::Shape;
using taper::Tensor;
using taper::Var;
using taper::bench::apply;
using taper::bench::Case;
using taper::bench::minimal_bytes;
using taper::bench::numel;
using taper::bench::Op;
using taper::bench::op_ids;
using taper::bench::op_name;
using taper::bench::param_len;
using taper::bench::shape_name;

constexpr size_t kStreamElems = size_t{1} << 28;  // 1 GiB of f32
constexpr size_t kSumRows = 16384, kSumCols = 16384;
constexpr size_t kMatDim = 4096;
constexpr int kOverheadCalls = 1000;

const Device kGpu = Device::cuda(0);

/// Skips the benchmark when no CUDA device is present; true when it may run.
bool have_gpu(benchmark::State& st) {
  if (taper::device_available(DeviceKind::Cuda)) return true;
  st.SkipWithError("no CUDA device present");
  return false;
}

void sync() { taper::synchronize(kGpu); }

/// Aborts the benchmark on a CUDA or cuBLAS error (no exceptions through the benchmark loop).
bool cuda_ok(benchmark::State& st, cudaError_t e) {
  if (e == cudaSuccess) return true;
  st.SkipWithError(cudaGetErrorString(e));
  return false;
}
bool cublas_ok(benchmark::State& st, cublasStatus_t s) {
  if (s == CUBLAS_STATUS_SUCCESS) return true;
  st.SkipWithError(cublasGetStatusString(s));
  return false;
}

// ---- D2D copy on taper's stream: the device's bandwidth. Bytes: read + write, 2 * 4 * n.
void BM_cuda_memcpy_d2d(benchmark::State& st) {
  if (!have_gpu(st)) return;
  const size_t n = kStreamElems, bytes = 4 * n;
  const Tensor src = Tensor::randn(Shape({n}), DType::F32, kGpu, 1);
  const Tensor dst = Tensor::empty(Shape({n}), DType::F32, kGpu);
  const cudaStream_t s = taper::cuda::stream(0);
  if (!cuda_ok(st, cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), bytes,
                                   cudaMemcpyDeviceToDevice, s)))
    return;
  sync();
  for (auto _ : st) {
    const cudaError_t e =
        cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), bytes, cudaMemcpyDeviceToDevice, s);
    sync();
    if (!cuda_ok(st, e)) break;
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * static_cast<int64_t>(2 * bytes));
}

// ---- elementwise add, a fresh output per call (the caching allocator serves a reused block).
// Bytes: read a and b, write c: 3 * 4 * n.
void BM_cuda_add_f32(benchmark::State& st) {
  if (!have_gpu(st)) return;
  const size_t n = kStreamElems;
  const Tensor a = Tensor::randn(Shape({n}), DType::F32, kGpu, 1);
  const Tensor b = Tensor::randn(Shape({n}), DType::F32, kGpu, 2);
  { Tensor warm = a + b; }
  sync();
  for (auto _ : st) {
    Tensor c = a + b;
    sync();
    benchmark::DoNotOptimize(c.data_ptr());
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * static_cast<int64_t>(3 * 4 * n));
}

// ---- row sums of (16384, 16384) f32. Bytes: the input read, 4 * rows * cols.
void BM_cuda_sum_last_dim_f32(benchmark::State& st) {
  if (!have_gpu(st)) return;
  const Tensor x = Tensor::randn(Shape({kSumRows, kSumCols}), DType::F32, kGpu, 3);
  { Tensor warm = x.sum({1}); }
  sync();
  for (auto _ : st) {
    Tensor y = x.sum({1});
    sync();
    benchmark::DoNotOptimize(y.data_ptr());
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) *
                       static_cast<int64_t>(4 * kSumRows * kSumCols));
}

// ---- host cost of one op call: kOverheadCalls `x + y` on 1-element tensors, timed on the host
// only (manual time: the calls' host time, without waiting for the device); the stream is
// drained after the timed part of each iteration, so queued launches never pile up. Counter
// us_per_op: host microseconds per call; items/s: calls per second.
void BM_cuda_op_overhead(benchmark::State& st) {
  if (!have_gpu(st)) return;
  const Tensor x = Tensor::randn(Shape({1}), DType::F32, kGpu, 4);
  const Tensor y = Tensor::randn(Shape({1}), DType::F32, kGpu, 5);
  { Tensor warm = x + y; }
  sync();
  double host_s = 0.0;
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kOverheadCalls; ++i) {
      Tensor z = x + y;
      benchmark::DoNotOptimize(z.data_ptr());
    }
    const auto t1 = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(t1 - t0).count();
    st.SetIterationTime(s);
    host_s += s;
    sync();
  }
  const double calls = static_cast<double>(st.iterations()) * kOverheadCalls;
  st.SetItemsProcessed(static_cast<int64_t>(calls));
  st.counters["us_per_op"] = calls > 0 ? host_s * 1e6 / calls : 0.0;
}

// ---- matmul 4096^3: taper against cuBLAS called directly on the same buffers.

/// The bench's own cuBLAS handle on taper's stream, configured as cuda/matmul.cu configures
/// taper's: default math with reduced-precision reductions disallowed.
cublasHandle_t bench_handle(benchmark::State& st) {
  static cublasHandle_t h = nullptr;  // leaked at exit, as taper's
  if (h) return h;
  const cudaStream_t s = taper::cuda::stream(0);  // also makes cuda:0 current
  cublasHandle_t nh = nullptr;
  if (!cublas_ok(st, cublasCreate(&nh))) return nullptr;
  if (!cublas_ok(st, cublasSetStream(nh, s)) ||
      !cublas_ok(st, cublasSetMathMode(nh, static_cast<cublasMath_t>(
                                               CUBLAS_DEFAULT_MATH |
                                               CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)))) {
    (void)cublasDestroy(nh);
    return nullptr;
  }
  h = nh;
  return h;
}

void matmul_counters(benchmark::State& st) {
  const double flop = 2.0 * static_cast<double>(kMatDim) * kMatDim * kMatDim;
  const double iters = static_cast<double>(st.iterations());
  st.SetItemsProcessed(static_cast<int64_t>(flop * iters));  // items/s reads as FLOP/s
  st.counters["TFLOP/s"] = benchmark::Counter(flop * iters / 1e12, benchmark::Counter::kIsRate);
}

struct MatmulOperands {
  Tensor a, b;
};
MatmulOperands matmul_operands(DType dt) {
  const Shape s({kMatDim, kMatDim});
  return {Tensor::randn(s, DType::F32, kGpu, 6).to_dtype(dt),
          Tensor::randn(s, DType::F32, kGpu, 7).to_dtype(dt)};
}

void run_matmul_taper(benchmark::State& st, DType dt) {
  if (!have_gpu(st)) return;
  taper::set_cuda_allow_tf32(false);
  const MatmulOperands o = matmul_operands(dt);
  { Tensor warm = o.a.matmul(o.b); }
  sync();
  for (auto _ : st) {
    Tensor c = o.a.matmul(o.b);
    sync();
    benchmark::DoNotOptimize(c.data_ptr());
  }
  matmul_counters(st);
}

void run_matmul_cublas(benchmark::State& st, DType dt) {
  if (!have_gpu(st)) return;
  const cublasHandle_t h = bench_handle(st);
  if (!h) return;
  const MatmulOperands o = matmul_operands(dt);
  const Tensor c = Tensor::empty(Shape({kMatDim, kMatDim}), dt, kGpu);
  const cudaDataType_t ty = dt == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
  const int d = static_cast<int>(kMatDim);
  const float one = 1.0f, zero = 0.0f;
  // Row-major C = A B as column-major C^T = B^T A^T, as taper calls it (TF32 off for f32).
  const auto gemm = [&] {
    return cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, d, d, d, &one, o.b.data_ptr(), ty, d,
                        o.a.data_ptr(), ty, d, &zero, c.data_ptr(), ty, d, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT);
  };
  if (!cublas_ok(st, gemm())) return;
  sync();
  for (auto _ : st) {
    const cublasStatus_t s = gemm();
    sync();
    if (!cublas_ok(st, s)) break;
  }
  matmul_counters(st);
}

// ---- fused against composed: the table mode (--fused-table FILE), timed by the method of
// scripts/bench_fused_torch.py so its rows sit beside PyTorch's, torch.compile's and Liger's:
// CUDA events on taper's stream around each call, the L2 cache flushed before every timed
// iteration (a 256 MiB buffer summed, outside the events: reading it leaves clean lines, where a
// memset would leave 50 MB of dirty lines for the timed call to write back), then a spin of
// kHideCycles on the GPU (gpu_spin.cu), so that the events time the GPU's work and not the host's
// queueing of it, 5 warm-up calls, the median of kTableIters timed calls. The copy ceiling is a
// 1 GiB device-to-device copy timed the same way.
// Every row: op, dtype, shape, path (fused/composed), pass (fwd/fwd_bwd), median us, minimal
// bytes, fused_kernel (1 when a fused CUDA kernel ran, 0 when both paths ran the composed form).

Tensor make_randn(const std::vector<size_t>& shape, DType dt, uint64_t seed, double mean = 0.0,
                  double std = 1.0) {
  // Drawn in f32 on the device, then rounded once, so every dtype sees the same values.
  Tensor t = Tensor::randn(Shape(shape), DType::F32, kGpu, seed, mean, std);
  return dt == DType::F32 ? t : t.to_dtype(dt);
}

/// The table's rows; scripts/bench_fused_torch.py's cases() lists the same ones.
std::vector<Case> table_cases() {
  std::vector<Case> out;
  const std::vector<std::vector<size_t>> rows = {{16384, 1024}, {4096, 16384}};
  for (DType dt : {DType::BF16, DType::F32}) {
    for (Op op : {Op::Softmax, Op::RmsNorm, Op::LayerNorm})
      for (const std::vector<size_t>& shape : rows) out.push_back({op, shape, 0, dt});
    out.push_back({Op::GroupNorm, {16, 32, 256, 256}, 8, dt});
    out.push_back({Op::GroupNorm, {16, 512, 64, 64}, 32, dt});
    out.push_back({Op::GroupNorm, {1, 16, 256, 256}, 4, dt});
  }
  for (Op op : {Op::Softmax, Op::RmsNorm, Op::LayerNorm})
    out.push_back({op, {16384, 1024}, 0, DType::F64});
  out.push_back({Op::GroupNorm, {16, 32, 256, 256}, 8, DType::F64});
  return out;
}

constexpr int kTableIters = 50;
constexpr int kTableWarmup = 5;
/// The spin before each timed call: 2e6 SM clocks, about 1 ms at the H100's and H200's 1.98 GHz,
/// more than the host takes to queue any row's call (scripts/bench_fused_torch.py spins as long).
constexpr long long kHideCycles = 2000000;

/// Times `fn` (which queues work on taper's stream) by the table's method; returns the median
/// in microseconds.
template <class Fn> double time_events(const Fn& fn, const Tensor& flush) {
  const cudaStream_t s = taper::cuda::stream(0);
  for (int i = 0; i < kTableWarmup; ++i) fn();
  sync();
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess)
    throw std::runtime_error("bench_cuda: cudaEventCreate failed");
  std::vector<double> us;
  for (int i = 0; i < kTableIters; ++i) {
    { Tensor t = flush.sum({0}); }  // reads the buffer: the L2 holds clean lines of it after
    gpu_spin(s, kHideCycles);       // the GPU busy while the host queues fn's work
    cudaEventRecord(e0, s);
    fn();
    cudaEventRecord(e1, s);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    us.push_back(1000.0 * ms);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(us.begin(), us.end());
  return 0.5 * (us[(us.size() - 1) / 2] + us[us.size() / 2]);
}

/// `filter`: run only the rows whose "op,dtype,shape,path,pass" contains it (empty: every row;
/// the copy ceiling is always measured), so that a profiler sees one case's kernels.
int run_fused_table(const std::string& path, const std::string& filter) {
  if (!taper::device_available(DeviceKind::Cuda)) {
    std::fprintf(stderr, "bench_cuda --fused-table: no CUDA device present\n");
    return 1;
  }
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "bench_cuda: cannot write %s\n", path.c_str());
    return 1;
  }
  const Tensor flush = Tensor::zeros(Shape({size_t{64} << 20}), DType::F32, kGpu);  // 256 MiB
  std::fprintf(f, "op,dtype,shape,path,pass,median_us,bytes,fused_kernel\n");
  {  // the copy ceiling: 1 GiB, bytes read + written
    const size_t bytes = size_t{1} << 30;
    const Tensor src = Tensor::empty(Shape({bytes}), DType::U8, kGpu);
    const Tensor dst = Tensor::empty(Shape({bytes}), DType::U8, kGpu);
    const double us = time_events(
        [&] {
          cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), bytes, cudaMemcpyDeviceToDevice,
                          taper::cuda::stream(0));
        },
        flush);
    std::fprintf(f, "copy,u8,%zu,copy,fwd,%.2f,%zu,0\n", bytes, us, 2 * bytes);
    std::fprintf(stderr, "copy 1 GiB: %.1f us = %.0f GB/s\n", us, 2e-3 * bytes / us);
  }
  for (const Case& c : table_cases()) {
    const size_t p = param_len(c);
    const bool has_w = c.op != Op::Softmax;
    const bool has_b = c.op == Op::LayerNorm || c.op == Op::GroupNorm;
    const auto [fwd_id, bwd_id] = op_ids(c.op);
    for (bool bwd : {false, true}) {
      for (bool fused : {true, false}) {
        const std::string key = std::string(op_name(c.op)) + "," +
                                std::string(taper::dtype_name(c.dt)) + "," + shape_name(c) + "," +
                                (fused ? "fused" : "composed") + "," + (bwd ? "fwd_bwd" : "fwd");
        if (key.find(filter) == std::string::npos) continue;
        double us = 0;
        if (!bwd) {
          const Tensor x = make_randn(c.shape, c.dt, 11);
          const Tensor w = has_w ? make_randn({p}, c.dt, 12, 1.0, 0.1) : Tensor();
          const Tensor b = has_b ? make_randn({p}, c.dt, 13, 0.0, 0.1) : Tensor();
          us = time_events([&] { Tensor y = apply(c, fused, x, w, b); }, flush);
        } else {
          const Var x = Var::from_tensor(make_randn(c.shape, c.dt, 11));
          Var w, b;
          if (has_w) w = Var::from_tensor(make_randn({p}, c.dt, 12, 1.0, 0.1));
          if (has_b) b = Var::from_tensor(make_randn({p}, c.dt, 13, 0.0, 0.1));
          const Tensor up = make_randn(c.shape, c.dt, 14);
          us = time_events(
              [&] {
                taper::GradStore g = apply(c, fused, x, w, b).backward(up);
                if (!g.get(x)) throw std::runtime_error("bench_cuda: no gradient reached x");
              },
              flush);
        }
        const bool kernel = fused && taper::has_kernel(fwd_id, kGpu, c.dt) &&
                            (!bwd || taper::has_kernel(bwd_id, kGpu, c.dt));
        std::fprintf(f, "%s,%s,%s,%s,%s,%.2f,%.0f,%d\n", op_name(c.op),
                     std::string(taper::dtype_name(c.dt)).c_str(), shape_name(c).c_str(),
                     fused ? "fused" : "composed", bwd ? "fwd_bwd" : "fwd", us,
                     minimal_bytes(c, bwd), kernel ? 1 : 0);
        std::fflush(f);
        std::fprintf(stderr, "%s %s %s %s %s: %.1f us (%.0f GB/s)\n", op_name(c.op),
                     std::string(taper::dtype_name(c.dt)).c_str(), shape_name(c).c_str(),
                     fused ? "fused" : "composed", bwd ? "fwd_bwd" : "fwd", us,
                     1e-3 * minimal_bytes(c, bwd) / us);
      }
    }
  }
  std::fclose(f);
  return 0;
}

void register_all() {
  const auto ms = benchmark::kMillisecond;
  benchmark::RegisterBenchmark("BM_cuda_memcpy_d2d", BM_cuda_memcpy_d2d)->UseRealTime()->Unit(ms);
  benchmark::RegisterBenchmark("BM_cuda_add_f32", BM_cuda_add_f32)->UseRealTime()->Unit(ms);
  benchmark::RegisterBenchmark("BM_cuda_sum_last_dim_f32", BM_cuda_sum_last_dim_f32)
      ->UseRealTime()
      ->Unit(ms);
  benchmark::RegisterBenchmark("BM_cuda_op_overhead", BM_cuda_op_overhead)
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);
  for (DType dt : {DType::F32, DType::BF16}) {
    const std::string d(taper::dtype_name(dt));
    benchmark::RegisterBenchmark(("BM_cuda_matmul_taper/" + d).c_str(), [dt](benchmark::State& st) {
      run_matmul_taper(st, dt);
    })->UseRealTime()->Unit(ms);
    benchmark::RegisterBenchmark(("BM_cuda_matmul_cublas/" + d).c_str(), [dt](benchmark::State& st) {
      run_matmul_cublas(st, dt);
    })->UseRealTime()->Unit(ms);
  }
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--fused-table") {
      std::string filter;
      for (int j = 1; j + 1 < argc; ++j)
        if (std::string(argv[j]) == "--filter") filter = argv[j + 1];
      taper::set_cuda_allow_tf32(false);
      try {
        return run_fused_table(argv[i + 1], filter);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_cuda --fused-table: %s\n", e.what());
        return 1;
      }
    }
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (taper::device_available(DeviceKind::Cuda)) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
      benchmark::AddCustomContext("cuda_device", prop.name);
    benchmark::AddCustomContext("cuda_devices",
                                std::to_string(taper::device_count(DeviceKind::Cuda)));
  } else {
    benchmark::AddCustomContext("cuda_device", "none (every benchmark skips)");
  }
  benchmark::AddCustomContext("tf32", "off");
  taper::set_cuda_allow_tf32(false);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
