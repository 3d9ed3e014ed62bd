// bench_torch.cpp: LibTorch (Debian's libtorch-dev, 1.13) on the shapes and thread count of
// bench_fused.cpp, so scripts/bench_report.sh can print taper and PyTorch side by side.
//
// What it is: torch::softmax, torch::layer_norm, torch::group_norm and an rms norm written as
// PyTorch users write it (x * rsqrt(mean(x^2) + eps) * w; 1.13 has no fused rms_norm), forward
// and forward+backward, named
//   BM_<op>_<fwd|fwd_bwd>_torch/<dtype>/<shape>
// with the same <op>, <dtype> and <shape> words as bench_fused, and the same minimal bytes.
// Forward+backward as bench_fused: y.backward(up) with a fixed random upstream gradient `up` of
// y's dtype; the gradients are dropped after each iteration, so every iteration
// allocates them afresh, as taper does. Threads: TAPER_NUM_THREADS (else all cores), intra-op;
// one inter-op thread. An (op, dtype) that this LibTorch lacks on the CPU is reported as an
// error row, not a crash.
// What it is not: part of taper; it includes no taper header and is built only where CMake finds
// LibTorch (benches/CMakeLists.txt).
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr double kEps = 1e-5;

enum class Op { Softmax, RmsNorm, LayerNorm, GroupNorm };

struct Case {
  Op op;
  std::vector<int64_t> shape;
  int64_t groups = 0;
  torch::Dtype dt;
};

const char* op_name(Op op) {
  switch (op) {
    case Op::Softmax: return "softmax";
    case Op::RmsNorm: return "rms_norm";
    case Op::LayerNorm: return "layer_norm";
    case Op::GroupNorm: return "group_norm";
  }
  return "?";
}

const char* dtype_name(torch::Dtype dt) {
  if (dt == torch::kFloat32) return "f32";
  if (dt == torch::kBFloat16) return "bf16";
  if (dt == torch::kFloat16) return "f16";
  if (dt == torch::kFloat64) return "f64";
  return "?";
}

size_t dtype_size(torch::Dtype dt) { return dt == torch::kFloat64 ? 8 : dt == torch::kFloat32 ? 4 : 2; }

std::string shape_name(const Case& c) {
  std::string s;
  for (size_t i = 0; i < c.shape.size(); ++i) s += (i ? "x" : "") + std::to_string(c.shape[i]);
  if (c.op == Op::GroupNorm) s += "_g" + std::to_string(c.groups);
  return s;
}

int64_t param_len(const Case& c) { return c.op == Op::GroupNorm ? c.shape[1] : c.shape.back(); }

// Same formulas as bench_fused.cpp's minimal_bytes.
double minimal_bytes(const Case& c, bool bwd) {
  const double s = static_cast<double>(dtype_size(c.dt));
  double n = 1;
  for (int64_t d : c.shape) n *= static_cast<double>(d);
  const double p = static_cast<double>(param_len(c));
  switch (c.op) {
    case Op::Softmax: return bwd ? 5 * n * s : 2 * n * s;
    case Op::RmsNorm: return bwd ? 5 * n * s + 3 * p * s : 2 * n * s + p * s;
    case Op::LayerNorm:
    case Op::GroupNorm: return bwd ? 5 * n * s + 5 * p * s : 2 * n * s + 2 * p * s;
  }
  return 0;
}

torch::Tensor make_randn(const std::vector<int64_t>& shape, torch::Dtype dt, uint64_t seed,
                         double mean = 0.0, double std = 1.0) {
  torch::manual_seed(seed);
  const torch::Dtype gen = dt == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  return (torch::randn(shape, torch::TensorOptions().dtype(gen)) * std + mean).to(dt);
}

torch::Tensor apply(const Case& c, const torch::Tensor& x, const torch::Tensor& w,
                    const torch::Tensor& b) {
  switch (c.op) {
    case Op::Softmax: return torch::softmax(x, -1);
    case Op::RmsNorm: return x * torch::rsqrt(x.pow(2).mean(-1, true) + kEps) * w;
    case Op::LayerNorm: return torch::layer_norm(x, {c.shape.back()}, w, b, kEps);
    case Op::GroupNorm: return torch::group_norm(x, c.groups, w, b, kEps);
  }
  return {};
}

void run(benchmark::State& st, const Case& c, bool bwd) {
  // Set before anything can throw: Google Benchmark's CSV reporter wants every run to carry the
  // same counters, an errored one included (LibTorch 1.13 has no CPU f16 layer norm).
  st.counters["threads"] = static_cast<double>(torch::get_num_threads());
  try {
    const int64_t p = param_len(c);
    torch::Tensor x = make_randn(c.shape, c.dt, 11);
    torch::Tensor w, b;
    if (c.op != Op::Softmax) w = make_randn({p}, c.dt, 12, 1.0, 0.1);
    if (c.op == Op::LayerNorm || c.op == Op::GroupNorm) b = make_randn({p}, c.dt, 13, 0.0, 0.1);
    const torch::Tensor up = make_randn(c.shape, c.dt, 14);
    if (!bwd) {
      torch::NoGradGuard no_grad;
      for (auto _ : st) {
        torch::Tensor y = apply(c, x, w, b);
        benchmark::DoNotOptimize(y.data_ptr());
      }
    } else {
      x.requires_grad_(true);
      if (w.defined()) w.requires_grad_(true);
      if (b.defined()) b.requires_grad_(true);
      for (auto _ : st) {
        torch::Tensor y = apply(c, x, w, b);
        y.backward(up);
        benchmark::DoNotOptimize(x.grad().data_ptr());
        x.mutable_grad() = torch::Tensor();
        if (w.defined()) w.mutable_grad() = torch::Tensor();
        if (b.defined()) b.mutable_grad() = torch::Tensor();
      }
    }
    st.SetBytesProcessed(static_cast<int64_t>(minimal_bytes(c, bwd) *
                                              static_cast<double>(st.iterations())));
  } catch (const c10::Error& e) {
    st.SkipWithError(("LibTorch: " + std::string(e.what_without_backtrace())).c_str());
  }
}

std::vector<Case> cases() {
  struct OpShapes {
    Op op;
    std::vector<std::vector<int64_t>> shapes;
    std::vector<int64_t> groups;
  };
  const std::vector<OpShapes> table = {
      {Op::Softmax, {{4096, 4096}, {1024, 32768}}, {0, 0}},
      {Op::RmsNorm, {{4096, 4096}, {16384, 1024}}, {0, 0}},
      {Op::LayerNorm, {{4096, 4096}, {16384, 1024}}, {0, 0}},
      {Op::GroupNorm, {{8, 32, 64, 64}, {1, 16, 256, 256}}, {8, 4}},
  };
  std::vector<Case> out;
  for (const OpShapes& o : table) {
    for (torch::Dtype dt : {torch::kFloat32, torch::kBFloat16})
      for (size_t i = 0; i < o.shapes.size(); ++i) out.push_back({o.op, o.shapes[i], o.groups[i], dt});
    // f16 and f64 at the first shape only, as bench_fused. Where LibTorch lacks a CPU f16
    // kernel the row is an error row (c10::Error caught in run), not a crash.
    for (torch::Dtype dt : {torch::kFloat16, torch::kFloat64})
      out.push_back({o.op, o.shapes[0], o.groups[0], dt});
  }
  return out;
}

int thread_count() {
  if (const char* e = std::getenv("TAPER_NUM_THREADS")) {
    const long v = std::strtol(e, nullptr, 10);
    if (v > 0) return static_cast<int>(v);
  }
  const unsigned hc = std::thread::hardware_concurrency();
  return hc ? static_cast<int>(hc) : 1;
}

}  // namespace

int main(int argc, char** argv) {
  torch::set_num_interop_threads(1);
  torch::set_num_threads(thread_count());
  for (const Case& c : cases()) {
    for (bool bwd : {false, true}) {
      const std::string name = std::string("BM_") + op_name(c.op) + (bwd ? "_fwd_bwd" : "_fwd") +
                               "_torch/" + dtype_name(c.dt) + "/" + shape_name(c);
      benchmark::RegisterBenchmark(name.c_str(), [c, bwd](benchmark::State& st) { run(st, c, bwd); })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("torch_threads", std::to_string(torch::get_num_threads()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
