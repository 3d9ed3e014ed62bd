// bench_nn.cpp: Google Benchmark program for the nn layer: one TransformerEncoderLayer and the
// AdamW step, at the sizes of the closing note.
//
// What it is:
//   BM_encoder_layer_fwd/f32           forward of one post-LN TransformerEncoderLayer (hidden
//                                      384, 12 heads, FFN 1536, seq 128, batch 8), no graph;
//   BM_encoder_layer_fwd_bwd/f32/p     forward + backward (loss = mean of the output), dropout p
//                                      (0 or 0.1) on attention weights and block outputs;
//   BM_adamw_step/<fused|composed>     one AdamW step over all-MiniLM-L6-v2's 22.7M f32
//                                      parameters (shapes of its word embeddings and 6 layers),
//                                      GB/s counting 4 reads + 3 writes of 4 bytes per element.
// Every benchmark uses wall time: the kernels run on taper's thread pool (TAPER_NUM_THREADS).
// What it is not: a correctness check (tests/test_nn.cpp, tests/test_optim.cpp do that).
#include <benchmark/benchmark.h>

#include <memory>
#include <vector>

#include "taper/nn.h"
#include "taper/taper.h"

namespace {

using namespace taper;
using namespace taper::nn;

constexpr size_t kB = 8, kT = 128, kE = 384, kH = 12, kFF = 1536;

std::shared_ptr<TransformerEncoderLayer> make_layer(double dropout) {
  manual_seed(1);
  return std::make_shared<TransformerEncoderLayer>(TransformerEncoderLayerOptions(kE, kH)
                                                       .dim_feedforward(kFF)
                                                       .dropout(dropout)
                                                       .attention_dropout(dropout)
                                                       .layer_norm_eps(1e-12));
}

void BM_encoder_layer_fwd(benchmark::State& state) {
  auto layer = make_layer(0.0);
  layer->eval();
  const Tensor x = Tensor::randn({kB, kT, kE}, DType::F32, Device::cpu(), 2);
  NoGradGuard ng;
  for (auto _ : state) {
    Tensor y = layer->forward(x);
    benchmark::DoNotOptimize(y.data_ptr());
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * int64_t(kB * kT));  // tokens/s
}
BENCHMARK(BM_encoder_layer_fwd)->Name("BM_encoder_layer_fwd/f32")->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_encoder_layer_fwd_bwd(benchmark::State& state) {
  const double p = state.range(0) / 10.0;
  auto layer = make_layer(p);
  const Tensor x = Tensor::randn({kB, kT, kE}, DType::F32, Device::cpu(), 2);
  for (auto _ : state) {
    GradStore g = layer->forward(x).mean_all().backward();
    benchmark::DoNotOptimize(g.size());
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * int64_t(kB * kT));
}
BENCHMARK(BM_encoder_layer_fwd_bwd)
    ->Name("BM_encoder_layer_fwd_bwd/f32/dropout_x10")
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// all-MiniLM-L6-v2's parameter shapes: embeddings, then 6 BERT layers (22.7M elements).
std::vector<Var> minilm_params() {
  std::vector<Shape> shapes = {{30522, kE}, {512, kE}, {2, kE}, {kE}, {kE}};
  for (int l = 0; l < 6; ++l) {
    for (int k = 0; k < 4; ++k) shapes.insert(shapes.end(), {Shape{kE, kE}, Shape{kE}});
    shapes.insert(shapes.end(), {Shape{kE}, Shape{kE}, Shape{kFF, kE}, Shape{kFF}, Shape{kE, kFF},
                                 Shape{kE}, Shape{kE}, Shape{kE}});
  }
  std::vector<Var> params;
  uint64_t seed = 10;
  for (const Shape& s : shapes)
    params.push_back(Var::from_tensor(Tensor::randn(s, DType::F32, Device::cpu(), seed++, 0, 0.02)));
  return params;
}

void BM_adamw_step(benchmark::State& state) {
  const bool fused = state.range(0) != 0;
  std::vector<Var> params = minilm_params();
  GradStore grads;
  size_t n = 0;
  uint64_t seed = 1000;
  for (const Var& p : params) {
    grads.insert(p, Tensor::randn(p.shape(), DType::F32, Device::cpu(), seed++, 0, 1e-3));
    n += p.elem_count();
  }
  AdamW opt(params, AdamWOptions(1e-4).fused(fused));
  opt.step(grads);  // allocate the moments outside the timed loop
  for (auto _ : state) opt.step(grads);
  state.counters["params"] = double(n);
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(n) * 7 * 4);
}
BENCHMARK(BM_adamw_step)->Name("BM_adamw_step/fused")->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_adamw_step)->Name("BM_adamw_step/composed")->Arg(0)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
