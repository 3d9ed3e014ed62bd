// cuda_graph.cpp: taper::cuda::Graph over the device backend's capture hooks (device.h) and a
// private pool of the caching allocator (storage.h). Device neutral: a build without CUDA
// links it and throws at capture.
#include "taper/cuda_graph.h"

#include "taper/error.h"
#include "taper/op.h"
#include "taper/storage.h"

namespace taper::cuda {

struct Graph::Impl {
  Device dev;
  std::unique_ptr<PrivatePool> pool;
  void* exec = nullptr;

  ~Impl() {
    // The graph first: a replay still queued keeps running on the stream, and a block the pool
    // gives back is reused only by work queued after it.
    if (exec) device_backend(dev.kind()).destroy_graph(dev, exec);
  }
};

Graph::Graph() = default;
Graph::~Graph() = default;
Graph::Graph(Graph&&) noexcept = default;
Graph& Graph::operator=(Graph&&) noexcept = default;

void Graph::capture(Device dev, const std::function<void()>& fn) {
  TAPER_CHECK(dev.is_cuda(), "cuda::Graph::capture: ", dev.to_string(),
              " is not a CUDA device (graphs capture a CUDA stream)");
  TAPER_CHECK(!op_profiling(), "cuda::Graph::capture: op profiling is on; it waits for the "
              "device after every kernel, which a capture cannot do");
  DeviceBackend& be = device_backend(dev.kind());
  impl_.reset();  // an earlier capture's graph and pool go first
  auto impl = std::make_unique<Impl>();
  impl->dev = dev;
  be.begin_capture(dev);
  try {
    impl->pool = std::make_unique<PrivatePool>(dev);
    fn();
  } catch (...) {
    if (impl->pool) impl->pool->end();
    try {
      be.destroy_graph(dev, be.end_capture(dev));
    } catch (const Error&) {
      // The capture was already broken by what threw: its own error is the one to report.
    }
    throw;
  }
  impl->pool->end();
  impl->exec = be.end_capture(dev);
  impl_ = std::move(impl);
}

void Graph::replay() {
  TAPER_CHECK(impl_ && impl_->exec, "cuda::Graph::replay: nothing was captured");
  device_backend(impl_->dev.kind()).replay_graph(impl_->dev, impl_->exec);
}

bool Graph::captured() const { return impl_ && impl_->exec; }

size_t Graph::pool_bytes() const { return impl_ && impl_->pool ? impl_->pool->bytes() : 0; }

}  // namespace taper::cuda
