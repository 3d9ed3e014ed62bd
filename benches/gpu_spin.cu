// gpu_spin.cu: bench_cuda's one kernel of its own. The fused table times each call between two
// CUDA events; when the host takes longer to queue a call than the GPU takes to run the work
// queued before it, the events also time the host (PyTorch's and Liger's Python calls above
// all: run 94 of docs/cuda.md). A spin queued after the L2 flush keeps the GPU busy while the
// host queues the timed call, so the events time the GPU's work alone.
#include <cuda_runtime.h>

namespace {
__global__ void spin_kernel(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}
}  // namespace

/// Queues on `s` one thread that spins for `cycles` SM clocks (as torch.cuda._sleep).
void gpu_spin(cudaStream_t s, long long cycles) { spin_kernel<<<1, 1, 0, s>>>(cycles); }
