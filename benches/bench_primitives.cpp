// bench_primitives.cpp: Google Benchmark program for taper's primitive CPU ops (issue 2):
// elementwise add and unary ops, reductions, matmul and the per-call overhead of the dispatcher,
// each next to a plain baseline measured in the same process on the same buffers.
//
// What it is: throughput as bytes/s (SetBytesProcessed, minimal traffic: every input read once,
// every output written once) or FLOP/s (SetItemsProcessed: items/s reads as FLOP/s). Every
// benchmark uses wall time (UseRealTime), since the kernels run on taper's thread pool.
// Baselines: `BM_memcpy` and `BM_stream_add_f32` (STREAM-like copy and add in plain C++, split
// over the same number of threads as taper, on pre-touched buffers) give the machine's
// bandwidth; `BM_matmul_cblas_f32` calls cblas_sgemm directly on the buffers taper uses.
// What it is not: a test; values are random and never checked here.
//
// Shapes: n = 2^24 elements for elementwise ops; (4096, 4096) for the row reduction; 10^7 for
// sum_all; m = n = k = 1024 for matmul. Threads: TAPER_NUM_THREADS (taper's pool and BLAS).
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "taper/taper.h"
#include "tests/cpu_hooks.h"  // taper::testing::parallel_for, on taper's thread pool

namespace {

using taper::DType;
using taper::Shape;
using taper::Tensor;

constexpr size_t kElems = size_t{1} << 24;
// The elementwise kernels' grain (cpu::kElemGrain): the plain add splits as taper's add does.
constexpr size_t kElemGrain = size_t{1} << 15;

// A 64-byte aligned, page-touched host buffer for the plain-C++ baselines.
struct AlignedBuf {
  explicit AlignedBuf(size_t bytes)
      : p(static_cast<char*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64))), n(bytes) {
    std::memset(p, 1, n);
  }
  ~AlignedBuf() { std::free(p); }
  AlignedBuf(const AlignedBuf&) = delete;
  AlignedBuf& operator=(const AlignedBuf&) = delete;
  char* p;
  size_t n;
};

void common_counters(benchmark::State& st) {
  st.counters["threads"] = static_cast<double>(taper::num_threads());
}

// ---- elementwise add: as a training step calls it (a fresh output per call, which the caching
// allocator serves from a reused block). Bytes: read a and b, write c: 3 * 4 * n.
void BM_add_f32(benchmark::State& st) {
  const size_t n = static_cast<size_t>(st.range(0));
  const Tensor a = Tensor::randn(Shape({n}), DType::F32, taper::Device::cpu(), 1);
  const Tensor b = Tensor::randn(Shape({n}), DType::F32, taper::Device::cpu(), 2);
  for (auto _ : st) {
    Tensor c = a + b;
    benchmark::DoNotOptimize(c.data_ptr());
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations() * 3 * 4 * n));
  common_counters(st);
}

// ---- STREAM-like copy: memcpy of n f32, split into one chunk per thread. Bytes: 2 * 4 * n
// (read + write, the STREAM convention; write-allocate traffic is not counted).
void BM_memcpy(benchmark::State& st) {
  const size_t n = static_cast<size_t>(st.range(0));
  const size_t bytes = 4 * n;
  AlignedBuf src(bytes), dst(bytes);
  const size_t nt = taper::num_threads();
  for (auto _ : st) {
    taper::testing::parallel_for(nt, 1, [&](size_t b, size_t e) {
      for (size_t t = b; t < e; ++t) {
        const size_t lo = bytes * t / nt / 64 * 64, hi = t + 1 == nt ? bytes : bytes * (t + 1) / nt / 64 * 64;
        std::memcpy(dst.p + lo, src.p + lo, hi - lo);
      }
    });
    benchmark::DoNotOptimize(dst.p);
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations() * 2 * bytes));
  common_counters(st);
}

// ---- STREAM-like add in plain C++ on pre-touched buffers: c = a + b. Bytes: 3 * 4 * n, the
// same count as BM_add_f32, so the two rates compare directly.
void BM_stream_add_f32(benchmark::State& st) {
  const size_t n = static_cast<size_t>(st.range(0));
  AlignedBuf ab(4 * n), bb(4 * n), cb(4 * n);
  const float* a = reinterpret_cast<const float*>(ab.p);
  const float* b = reinterpret_cast<const float*>(bb.p);
  float* c = reinterpret_cast<float*>(cb.p);
  for (auto _ : st) {
    taper::testing::parallel_for(n, kElemGrain, [&](size_t lo, size_t hi) {
      for (size_t i = lo; i < hi; ++i) c[i] = a[i] + b[i];
    });
    benchmark::DoNotOptimize(c);
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations() * 3 * 4 * n));
  common_counters(st);
}

// ---- unary ops on n elements. Bytes: read x, write y: 2 * sizeof(dtype) * n.
template <class Fn> void unary_bench(benchmark::State& st, DType dt, Fn fn) {
  const size_t n = static_cast<size_t>(st.range(0));
  const Tensor x = Tensor::randn(Shape({n}), DType::F32, taper::Device::cpu(), 3).to_dtype(dt);
  for (auto _ : st) {
    Tensor y = fn(x);
    benchmark::DoNotOptimize(y.data_ptr());
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations() * 2 * taper::dtype_size(dt) * n));
  common_counters(st);
}
void BM_exp_f32(benchmark::State& st) { unary_bench(st, DType::F32, [](const Tensor& x) { return x.exp(); }); }
void BM_exp_bf16(benchmark::State& st) { unary_bench(st, DType::BF16, [](const Tensor& x) { return x.exp(); }); }
void BM_gelu_f32(benchmark::State& st) { unary_bench(st, DType::F32, [](const Tensor& x) { return x.gelu(); }); }
void BM_gelu_bf16(benchmark::State& st) { unary_bench(st, DType::BF16, [](const Tensor& x) { return x.gelu(); }); }

// ---- sum over the last dim of (rows, cols). Bytes: read x, write one value per row.
void sum_last_bench(benchmark::State& st, DType dt) {
  const size_t rows = static_cast<size_t>(st.range(0)), cols = static_cast<size_t>(st.range(1));
  const Tensor x =
      Tensor::randn(Shape({rows, cols}), DType::F32, taper::Device::cpu(), 4).to_dtype(dt);
  for (auto _ : st) {
    Tensor y = x.sum({1});
    benchmark::DoNotOptimize(y.data_ptr());
  }
  st.SetBytesProcessed(
      static_cast<int64_t>(st.iterations() * taper::dtype_size(dt) * (rows * cols + rows)));
  common_counters(st);
}
void BM_sum_last_dim_f32(benchmark::State& st) { sum_last_bench(st, DType::F32); }
void BM_sum_last_dim_bf16(benchmark::State& st) { sum_last_bench(st, DType::BF16); }

// ---- sum over the first dim of (rows, cols) f32, the column reduction the norm backwards use for
// the weight and bias gradients. Bytes: read x, write one value per column.
void BM_sum_first_dim_f32(benchmark::State& st) {
  const size_t rows = static_cast<size_t>(st.range(0)), cols = static_cast<size_t>(st.range(1));
  const Tensor x = Tensor::randn(Shape({rows, cols}), DType::F32, taper::Device::cpu(), 4);
  for (auto _ : st) {
    Tensor y = x.sum({0});
    benchmark::DoNotOptimize(y.data_ptr());
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations() * 4 * (rows * cols + cols)));
  common_counters(st);
}

// ---- sum_all of n f32. Bytes: read x: 4 * n.
void BM_sum_all_f32(benchmark::State& st) {
  const size_t n = static_cast<size_t>(st.range(0));
  const Tensor x = Tensor::randn(Shape({n}), DType::F32, taper::Device::cpu(), 5);
  for (auto _ : st) {
    Tensor s = x.sum_all();
    benchmark::DoNotOptimize(s.data_ptr());
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations() * 4 * n));
  common_counters(st);
}

// ---- matmul (m, k) x (k, n) f32: 2*m*n*k FLOP per call, reported as items/s.
// No user counter for GFLOP/s: the CSV reporter aborts when a counter appears in some runs and not
// others (random interleaving reorders them); scripts/bench_report.sh divides items/s by 1e9.
void flops_counters(benchmark::State& st, size_t m, size_t n, size_t k) {
  const double flop = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  st.SetItemsProcessed(static_cast<int64_t>(static_cast<double>(st.iterations()) * flop));
  common_counters(st);
}

void BM_matmul_f32(benchmark::State& st) {
  const size_t m = static_cast<size_t>(st.range(0)), n = m, k = m;
  const Tensor a = Tensor::randn(Shape({m, k}), DType::F32, taper::Device::cpu(), 6);
  const Tensor b = Tensor::randn(Shape({k, n}), DType::F32, taper::Device::cpu(), 7);
  for (auto _ : st) {
    Tensor c = a.matmul(b);
    benchmark::DoNotOptimize(c.data_ptr());
  }
  flops_counters(st, m, n, k);
}

// cblas_sgemm straight on taper's input buffers, into a pre-touched output: the floor taper's
// matmul can reach (it calls the same routine, with the same thread setting).
void BM_matmul_cblas_f32(benchmark::State& st) {
  const size_t m = static_cast<size_t>(st.range(0)), n = m, k = m;
  const Tensor a = Tensor::randn(Shape({m, k}), DType::F32, taper::Device::cpu(), 6);
  const Tensor b = Tensor::randn(Shape({k, n}), DType::F32, taper::Device::cpu(), 7);
  AlignedBuf cb(4 * m * n);
  float* c = reinterpret_cast<float*>(cb.p);
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  for (auto _ : st) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, mi, ni, ki, 1.0f, a.data<float>(), ki,
                b.data<float>(), ni, 0.0f, c, ni);
    benchmark::DoNotOptimize(c);
    benchmark::ClobberMemory();
  }
  flops_counters(st, m, n, k);
}

// ---- the cost of one op call on 1-element tensors: validation, registry lookup, dispatch,
// output allocation (from the cache) and the handle's bookkeeping. Time per iteration is the
// overhead; no gradient recording (no input tracks gradients).
void BM_op_overhead_add_1elem(benchmark::State& st) {
  const Tensor x = Tensor::full(Shape({1}), 1.5, DType::F32);
  const Tensor y = Tensor::full(Shape({1}), 2.5, DType::F32);
  for (auto _ : st) {
    Tensor z = x + y;
    benchmark::DoNotOptimize(z.data_ptr());
  }
  common_counters(st);
}

// The same with x a Var, so each call also records a graph node (freed when z goes).
void BM_op_overhead_add_1elem_grad(benchmark::State& st) {
  const taper::Var x = taper::Var::from_tensor(Tensor::full(Shape({1}), 1.5, DType::F32));
  const Tensor y = Tensor::full(Shape({1}), 2.5, DType::F32);
  for (auto _ : st) {
    Tensor z = x + y;
    benchmark::DoNotOptimize(z.data_ptr());
  }
  common_counters(st);
}

}  // namespace

BENCHMARK(BM_matmul_f32)->Arg(1024)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_matmul_cblas_f32)->Arg(1024)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_add_f32)->Arg(kElems)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_memcpy)->Arg(kElems)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_stream_add_f32)->Arg(kElems)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_exp_f32)->Arg(kElems)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_exp_bf16)->Arg(kElems)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_gelu_f32)->Arg(kElems)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_gelu_bf16)->Arg(kElems)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_sum_last_dim_f32)->Args({4096, 4096})->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_sum_last_dim_bf16)->Args({4096, 4096})->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_sum_first_dim_f32)->Args({4096, 4096})->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_sum_all_f32)->Arg(10'000'000)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_op_overhead_add_1elem)->UseRealTime()->Unit(benchmark::kNanosecond);
BENCHMARK(BM_op_overhead_add_1elem_grad)->UseRealTime()->Unit(benchmark::kNanosecond);

int main(int argc, char** argv) {
  // Start taper's pool first: it also sets OpenBLAS's thread count, which the direct cblas
  // baseline must share.
  (void)taper::num_threads();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("taper_threads", std::to_string(taper::num_threads()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
