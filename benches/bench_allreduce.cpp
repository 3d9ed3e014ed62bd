// bench_allreduce.cpp: the time of taper's all-reduce (taper::dist, NCCL on GPUs, TCP on CPUs)
// over every rank of a job, for issue 16's target (100 MB of f32 gradients within 10% of NCCL's
// own all_reduce, scripts/bench_allreduce_torch.py timing torch.distributed's in the same run).
//
// Start one process per GPU with a launcher that sets torchrun's variables, e.g.
//   torchrun --standalone --nproc_per_node 2 --no-python build/benches/bench_allreduce --mib 100
// Without WORLD_SIZE it is one process (world size 1: no data moves; a smoke test). Rank 0
// prints the median over --iters all-reduces (Avg, so the values stay bounded) after 5 warm-up
// ones, each timed from a synchronised device to a synchronised device, with the algorithm
// bandwidth (bytes / time) and NCCL's bus bandwidth (times 2 (W - 1) / W).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "taper/dist.h"
#include "taper/taper.h"

using namespace taper;

int main(int argc, char** argv) {
  double mib = 100.0;
  int iters = 20;
  std::string device = "auto";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_allreduce: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--mib") mib = std::stod(next());
    else if (a == "--iters") iters = std::max(1, std::stoi(next()));
    else if (a == "--device") device = next();
    else {
      std::fprintf(stderr, "usage: bench_allreduce [--mib 100] [--iters 20] [--device auto|cpu|cuda]\n");
      return 2;
    }
  }
  try {
    dist::Options o;
    const bool gpu = device == "cuda" || (device == "auto" && device_available(DeviceKind::Cuda));
    o.device = gpu ? Device::cuda(o.env.local_rank) : Device::cpu();
    auto g = dist::init_process_group(o);
    const Device dev = g->device();
    const size_t n = static_cast<size_t>(mib * (1 << 20) / 4);
    const Tensor t = Tensor::randn({n}, DType::F32, dev, 7 + static_cast<uint64_t>(g->rank()));
    using Clock = std::chrono::steady_clock;
    std::vector<double> ms;
    for (int i = 0; i < 5 + iters; ++i) {
      synchronize(dev);
      const auto t0 = Clock::now();
      g->all_reduce(t, dist::ReduceOp::Avg);
      synchronize(dev);
      if (i >= 5) ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    g->barrier();
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2], w = g->world_size();
    const double algbw = static_cast<double>(n) * 4 / (med * 1e-3) / 1e9;
    if (g->rank() == 0)
      std::printf("bench-allreduce: taper (%s) %.1f MiB f32 over %d ranks on %s: median %.3f ms "
                  "(min %.3f, max %.3f, %d runs), algbw %.1f GB/s, busbw %.1f GB/s\n",
                  std::string(dist::backend_name(g->backend())).c_str(), mib, g->world_size(),
                  dev.to_string().c_str(), med, ms.front(), ms.back(), iters, algbw,
                  algbw * 2 * (w - 1) / w);
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_allreduce: %s\n", e.what());
    return 1;
  }
  return 0;
}
