// bench_fused.cpp: Google Benchmark program for the fused ops of issue 3 against their composed
// forms: softmax_last_dim, rms_norm, layer_norm and group_norm, forward and forward+backward,
// in f32 and bf16 at every shape and in f16 and f64 at the first shape of each op.
//
// What it is: time and GB/s of the minimal bytes (each input read once, each output written
// once; the formula per op is in `minimal_bytes`). Names are
//   BM_<op>_<fwd|fwd_bwd>_<fused|composed|fused_bwd_composed>/<dtype>/<shape>
// so a fused benchmark and its twins differ only in that word (group norm's shape carries its
// group count: 8x32x64x64_g8). scripts/bench_report.sh joins the twins.
//   fused               the fused forward op and its dedicated backward op (what ships)
//   composed            the composed forward (taper::composed::*), its backward by autograd
//   fused_bwd_composed  the fused forward, the backward op's composed form (ComposedOnlyGuard
//                       on rms_norm_bwd / layer_norm_bwd / group_norm_bwd): the norms as they
//                       shipped before issue 13 gave them dedicated backward kernels, so
//                       fused_bwd_composed/fused is what those kernels buy by themselves. Norms'
//                       fwd_bwd only: softmax_last_dim_bwd predates issue 13 (no such baseline).
// Every benchmark also reports `kernel_calls`, the CPU kernel calls per iteration
// (taper::kernel_calls), so the three variants are seen to run different code.
// Also measured here, so the GB/s compare with the same process's bandwidth:
//   BM_stream_copy/<size>      a STREAM-like copy over taper's thread count (2 x size bytes).
// What it is not: a correctness check (tests/ do that).
//
// Forward+backward: x, w, b are Vars, y = op(x, w, b), then y.backward(up) with a fixed random
// upstream gradient `up` of y's dtype (PyTorch's y.backward(up)): the op's forward and its
// backward and nothing else, so fused/composed is the ratio of the ops themselves.
// Every benchmark uses wall time (UseRealTime): the kernels run on taper's thread pool.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "benches/fused_case.h"
#include "taper/composed.h"
#include "taper/taper.h"
#include "tests/cpu_hooks.h"  // taper::testing::parallel_for, on taper's thread pool

namespace {

using taper::DType;
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

Tensor make_randn(const std::vector<size_t>& shape, DType dt, uint64_t seed, double mean = 0.0,
                  double std = 1.0) {
  // Drawn in f32 (f64 for f64), then rounded once, so every dtype sees the same values.
  const DType gen = dt == DType::F64 ? DType::F64 : DType::F32;
  Tensor t = Tensor::randn(Shape(shape), gen, taper::Device::cpu(), seed, mean, std);
  return gen == dt ? t : t.to_dtype(dt);
}

enum class Variant { Fused, Composed, FusedBwdComposed };

const char* variant_name(Variant v) {
  switch (v) {
    case Variant::Fused: return "fused";
    case Variant::Composed: return "composed";
    case Variant::FusedBwdComposed: return "fused_bwd_composed";
  }
  return "?";
}

// The dedicated backward op of a norm (issue 13); none for softmax (see the header).
std::vector<taper::OpId> bwd_ops(Op op) {
  if (op == Op::Softmax) return {};
  return {op_ids(op).second};
}

uint64_t cpu_kernel_calls() { return taper::kernel_calls(taper::DeviceKind::Cpu); }

void set_counters(benchmark::State& st, double bytes_per_iter, uint64_t calls) {
  const double iters = static_cast<double>(st.iterations());
  st.SetBytesProcessed(static_cast<int64_t>(bytes_per_iter * iters));
  st.counters["threads"] = static_cast<double>(taper::num_threads());
  st.counters["kernel_calls"] = iters > 0 ? static_cast<double>(calls) / iters : 0.0;
}

void run_fwd(benchmark::State& st, const Case& c, Variant v) {
  const bool fused = v != Variant::Composed;
  const Tensor x = make_randn(c.shape, c.dt, 11);
  const size_t p = param_len(c);
  const Tensor w = c.op == Op::Softmax ? Tensor() : make_randn({p}, c.dt, 12, 1.0, 0.1);
  const Tensor b = c.op == Op::Softmax || c.op == Op::RmsNorm ? Tensor() : make_randn({p}, c.dt, 13, 0.0, 0.1);
  const uint64_t calls0 = cpu_kernel_calls();
  for (auto _ : st) {
    Tensor y = apply(c, fused, x, w, b);
    benchmark::DoNotOptimize(y.data_ptr());
  }
  set_counters(st, minimal_bytes(c, false), cpu_kernel_calls() - calls0);
}

void run_fwd_bwd(benchmark::State& st, const Case& c, Variant v) {
  const bool fused = v != Variant::Composed;
  // Forces the composed form of the norm's backward op for this benchmark (this thread; the
  // backward's ops are dispatched from it). The forward ops stay fused.
  const std::vector<taper::OpId> forced =
      v == Variant::FusedBwdComposed ? bwd_ops(c.op) : std::vector<taper::OpId>{};
  const taper::ComposedOnlyGuard guard(forced);
  const Var x = Var::from_tensor(make_randn(c.shape, c.dt, 11));
  const size_t p = param_len(c);
  Var w, b;
  if (c.op != Op::Softmax) w = Var::from_tensor(make_randn({p}, c.dt, 12, 1.0, 0.1));
  if (c.op == Op::LayerNorm || c.op == Op::GroupNorm)
    b = Var::from_tensor(make_randn({p}, c.dt, 13, 0.0, 0.1));
  const Tensor up = make_randn(c.shape, c.dt, 14);
  const uint64_t calls0 = cpu_kernel_calls();
  for (auto _ : st) {
    Tensor y = apply(c, fused, x, w, b);
    taper::GradStore g = y.backward(up);
    std::optional<Tensor> gx = g.get(x);
    if (!gx) {
      st.SkipWithError("no gradient reached x");
      break;
    }
    benchmark::DoNotOptimize(gx->data_ptr());
  }
  set_counters(st, minimal_bytes(c, true), cpu_kernel_calls() - calls0);
}

// STREAM-like copy of `bytes` over taper's thread count, one contiguous chunk per thread, on
// pre-touched buffers. Bytes counted: 2 x size (read + write, the STREAM convention).
void run_stream_copy(benchmark::State& st, size_t bytes) {
  char* src = static_cast<char*>(std::aligned_alloc(64, bytes));
  char* dst = static_cast<char*>(std::aligned_alloc(64, bytes));
  std::memset(src, 1, bytes);
  std::memset(dst, 2, bytes);
  const size_t nt = taper::num_threads();
  for (auto _ : st) {
    taper::testing::parallel_for(nt, 1, [&](size_t lo, size_t hi) {
      for (size_t t = lo; t < hi; ++t) {
        const size_t a = bytes / nt * t, e = t + 1 == nt ? bytes : bytes / nt * (t + 1);
        std::memcpy(dst + a, src + a, e - a);
      }
    });
    benchmark::DoNotOptimize(dst);
    benchmark::ClobberMemory();
  }
  std::free(src);
  std::free(dst);
  st.SetBytesProcessed(static_cast<int64_t>(2.0 * static_cast<double>(bytes) *
                                            static_cast<double>(st.iterations())));
  st.counters["threads"] = static_cast<double>(nt);
}

std::vector<Case> cases() {
  struct OpShapes {
    Op op;
    std::vector<std::vector<size_t>> shapes;
    std::vector<size_t> groups;
  };
  const std::vector<OpShapes> table = {
      {Op::Softmax, {{4096, 4096}, {1024, 32768}}, {0, 0}},
      {Op::RmsNorm, {{4096, 4096}, {16384, 1024}}, {0, 0}},
      {Op::LayerNorm, {{4096, 4096}, {16384, 1024}}, {0, 0}},
      {Op::GroupNorm, {{8, 32, 64, 64}, {1, 16, 256, 256}}, {8, 4}},
  };
  std::vector<Case> out;
  for (const OpShapes& o : table) {
    for (DType dt : {DType::F32, DType::BF16})
      for (size_t i = 0; i < o.shapes.size(); ++i) out.push_back({o.op, o.shapes[i], o.groups[i], dt});
    // f16 and f64 at the first shape only.
    for (DType dt : {DType::F16, DType::F64}) out.push_back({o.op, o.shapes[0], o.groups[0], dt});
  }
  return out;
}

void register_all() {
  for (size_t mib : {64, 512}) {
    const std::string name = "BM_stream_copy/" + std::to_string(mib) + "MiB";
    benchmark::RegisterBenchmark(name.c_str(), [mib](benchmark::State& st) {
      run_stream_copy(st, mib << 20);
    })->UseRealTime()->Unit(benchmark::kMillisecond);
  }
  for (const Case& c : cases()) {
    std::string tail = "/";
    tail += taper::dtype_name(c.dt);
    tail += '/';
    tail += shape_name(c);
    for (bool bwd : {false, true}) {
      for (Variant v : {Variant::Fused, Variant::Composed, Variant::FusedBwdComposed}) {
        // fused_bwd_composed: forward+backward of the norms only (see the header).
        if (v == Variant::FusedBwdComposed && (!bwd || bwd_ops(c.op).empty())) continue;
        const std::string name = std::string("BM_") + op_name(c.op) + (bwd ? "_fwd_bwd_" : "_fwd_") +
                                 variant_name(v) + tail;
        benchmark::RegisterBenchmark(name.c_str(), [c, bwd, v](benchmark::State& st) {
          bwd ? run_fwd_bwd(st, c, v) : run_fwd(st, c, v);
        })->UseRealTime()->Unit(benchmark::kMillisecond);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  (void)taper::num_threads();  // start the pool (and set BLAS's threads) before timing
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("taper_threads", std::to_string(taper::num_threads()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
