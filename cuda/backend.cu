// backend.cu: the CUDA device backend: raw allocation (core's caching allocator sits on top),
// one non-blocking stream per device, copies host <-> device and device <-> device (peer copies
// between ordinals, never staged through the host), memset, synchronize, and the error
// conversion every CUDA call site uses.
//
// Ordering: every launch and copy of a device goes to its one stream, so a block freed by a
// tensor and handed to the next request by the cache is only reused by work queued after the
// work that last used it (no sync needed). Copies to the host wait for the stream.
#include <atomic>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <tuple>

#include "cuda/cuda_common.cuh"
#include "taper/device.h"
#include "taper/error.h"

namespace taper::cuda {

void throw_cuda_error(cudaError_t e, const char* call, const char* file, int line,
                      const char* op) {
  (void)cudaGetLastError();  // clear a sticky launch error so the next call starts clean
  const bool capture = e == cudaErrorStreamCaptureUnsupported ||
                       e == cudaErrorStreamCaptureInvalidated ||
                       e == cudaErrorStreamCaptureImplicit || e == cudaErrorCapturedEvent ||
                       e == cudaErrorStreamCaptureWrongThread ||
                       e == cudaErrorStreamCaptureUnmatched || e == cudaErrorStreamCaptureMerge ||
                       e == cudaErrorStreamCaptureUnjoined || e == cudaErrorStreamCaptureIsolation;
  throw Error(detail::str_cat(op ? op : "", op ? ": " : "", "CUDA error ", cudaGetErrorName(e),
                              " (", cudaGetErrorString(e), ") in ", call, " at ", file, ":",
                              line,
                              capture ? " (inside a graph capture: a captured function may "
                                        "only queue device work; a copy to the host, an upload "
                                        "of host data or a synchronize cannot be captured)"
                                      : ""));
}

void check_launch(const char* op, const std::vector<Tensor>& in, const char* file, int line) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return;
  std::ostringstream shapes;
  for (size_t i = 0; i < in.size(); ++i) {
    if (i) shapes << ", ";
    if (in[i].defined())
      shapes << in[i].shape().to_string() << " " << dtype_name(in[i].dtype());
    else
      shapes << "undefined";
  }
  throw Error(detail::str_cat(op, ": CUDA kernel launch failed: ", cudaGetErrorName(e), " (",
                              cudaGetErrorString(e), ") at ", file, ":", line, " (inputs: ",
                              shapes.str(), ")"));
}

namespace {

int query_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: the backend stays, with 0 devices
    return 0;
  }
  return n;
}

std::vector<cudaDeviceProp> read_props(int count) {
  std::vector<cudaDeviceProp> p(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i)
    if (cudaGetDeviceProperties(&p[static_cast<size_t>(i)], i) != cudaSuccess) (void)cudaGetLastError();
  return p;
}

struct Devices {
  int count = query_device_count();
  std::mutex mu;
  std::vector<KernelErrorRecord*> records = std::vector<KernelErrorRecord*>(static_cast<size_t>(count));
  /// The records' device-side addresses, set once: every index op reads one, without the lock.
  std::unique_ptr<std::atomic<KernelErrorRecord*>[]> device_records{
      new std::atomic<KernelErrorRecord*>[static_cast<size_t>(count)]()};
  std::vector<cudaStream_t> streams = std::vector<cudaStream_t>(static_cast<size_t>(count));
  std::vector<cudaDeviceProp> props = read_props(count);
};

Devices& devices() {
  static Devices* d = new Devices();  // leaked: streams outlive static tensors
  return *d;
}

void check_ordinal(int ordinal) {
  TAPER_CHECK(ordinal >= 0 && ordinal < devices().count, "device cuda:", ordinal,
              " is not available (", devices().count, " CUDA devices present)");
}

}  // namespace

cudaStream_t stream(int ordinal) {
  Devices& d = devices();
  check_ordinal(ordinal);
  // cudaSetDevice only when this thread's current device changes: it is on every op's path.
  thread_local int current = -1;
  if (current != ordinal) {
    TAPER_CUDA_CHECK(cudaSetDevice(ordinal));
    current = ordinal;
  }
  cudaStream_t& s = d.streams[static_cast<size_t>(ordinal)];
  if (!s) {
    std::lock_guard<std::mutex> g(d.mu);
    if (!s) TAPER_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  }
  return s;
}

const cudaDeviceProp& device_props(int ordinal) {
  Devices& d = devices();
  check_ordinal(ordinal);
  return d.props[static_cast<size_t>(ordinal)];  // read once, when the devices were counted
}

KernelErrorRecord* kernel_error_record(int ordinal) {
  Devices& d = devices();
  check_ordinal(ordinal);
  std::atomic<KernelErrorRecord*>& cached = d.device_records[static_cast<size_t>(ordinal)];
  if (KernelErrorRecord* p = cached.load(std::memory_order_acquire)) return p;
  std::lock_guard<std::mutex> g(d.mu);
  KernelErrorRecord*& r = d.records[static_cast<size_t>(ordinal)];
  if (!r) {
    TAPER_CUDA_CHECK(cudaSetDevice(ordinal));
    TAPER_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&r), sizeof(KernelErrorRecord),
                                   cudaHostAllocMapped));
    r->flag = 0;
  }
  KernelErrorRecord* dev = nullptr;
  TAPER_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev), r, 0));
  cached.store(dev, std::memory_order_release);
  return dev;
}

void raise_kernel_error(int ordinal) {
  Devices& d = devices();
  if (ordinal < 0 || ordinal >= d.count) return;
  KernelErrorRecord* r = d.records[static_cast<size_t>(ordinal)];
  if (!r || reinterpret_cast<volatile KernelErrorRecord*>(r)->flag != 2) return;
  const KernelErrorRecord e = *r;
  r->flag = 0;
  throw Error(detail::str_cat(op_name(static_cast<OpId>(e.op)), ": index ", e.index,
                              " is out of range for dim ", e.dim, " of size ", e.size,
                              " (found by the kernel on cuda:", ordinal, ")"));
}

unsigned grid_for(size_t n, int ordinal, int threads) {
  if (n == 0) return 1;
  const size_t need = (n + static_cast<size_t>(threads) - 1) / static_cast<size_t>(threads);
  const size_t cap = static_cast<size_t>(device_props(ordinal).multiProcessorCount) * 32;
  return static_cast<unsigned>(need < cap ? need : cap);
}

int resident_blocks(const void* kernel, int threads, size_t smem, int cluster, int ordinal) {
  check_ordinal(ordinal);
  using Key = std::tuple<const void*, int, size_t, int, int>;
  static std::mutex mu;
  static std::map<Key, int> found;
  // The limit each kernel has on each device: only ever raised, since one kernel is launched
  // with several sizes (a lower limit would refuse the larger launches found before).
  static std::map<std::pair<const void*, int>, size_t> limit;
  const Key key{kernel, threads, smem, cluster, ordinal};
  std::lock_guard<std::mutex> g(mu);
  if (const auto it = found.find(key); it != found.end()) return it->second;
  int blocks = 0;
  (void)stream(ordinal);  // makes `ordinal` current: function attributes are per device
  size_t& lim = limit[{kernel, ordinal}];
  cudaFuncAttributes fa{};
  cudaError_t e = cudaFuncGetAttributes(&fa, kernel);
  // More shared memory than a block may have on this device: refused here, not by an API call
  // that fails (compute-sanitizer reports those; run 36, f64 softmax backward rows).
  const bool fits = smem + fa.sharedSizeBytes <= device_props(ordinal).sharedMemPerBlockOptin;
  if (e == cudaSuccess && fits && smem > lim) {
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem));
    if (e == cudaSuccess) lim = smem;
  }
  if (e == cudaSuccess && fits) {
    if (cluster <= 1) {
      int per_sm = 0;
      e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
      if (e == cudaSuccess) blocks = per_sm * device_props(ordinal).multiProcessorCount;
    } else {
      cudaLaunchAttribute attr;
      const cudaLaunchConfig_t cfg =
          cluster_config(attr, static_cast<unsigned>(cluster), threads, cluster, smem, nullptr);
      int clusters = 0;
      e = cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg);
      if (e == cudaSuccess) blocks = clusters * cluster;
    }
  }
  if (e != cudaSuccess) (void)cudaGetLastError();  // a refusal is an answer (0), not left pending
  found.emplace(key, blocks);
  return blocks;
}

namespace {

class CudaBackend final : public DeviceBackend {
 public:
  int device_count() const override { return devices().count; }

  void* raw_allocate(Device dev, size_t nbytes) override {
    stream(dev.ordinal());  // sets the device
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, nbytes);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    if (e != cudaSuccess) throw_cuda_error(e, "cudaMalloc", __FILE__, __LINE__);
    return p;
  }

  void raw_free(Device dev, void* p) override {
    stream(dev.ordinal());
    TAPER_CUDA_CHECK(cudaFree(p));
  }

  size_t free_bytes(Device dev) const override {
    stream(dev.ordinal());
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) (void)cudaGetLastError();
    return free;
  }

  void copy_from_host(Device dev, void* dst, const void* src, size_t n) override {
    // From pageable memory the runtime stages the source before returning: the caller may free
    // it at once.
    TAPER_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream(dev.ordinal())));
  }

  void copy_to_host(Device dev, void* dst, const void* src, size_t n) override {
    const cudaStream_t s = stream(dev.ordinal());
    TAPER_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, s));
    TAPER_CUDA_CHECK(cudaStreamSynchronize(s));
    raise_kernel_error(dev.ordinal());
  }

  void copy_device(Device dst_dev, void* dst, Device src_dev, const void* src,
                   size_t n) override {
    const cudaStream_t ds = stream(dst_dev.ordinal());
    if (dst_dev == src_dev) {
      TAPER_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, ds));
      return;
    }
    // The copy runs on the destination's stream after the source's queued work; the source's
    // stream then waits for the copy, so its cache cannot hand the block to a later kernel early.
    const cudaStream_t ss = stream(src_dev.ordinal());
    cudaEvent_t ready, done;
    TAPER_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    TAPER_CUDA_CHECK(cudaEventRecord(ready, ss));
    stream(dst_dev.ordinal());
    TAPER_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    TAPER_CUDA_CHECK(cudaStreamWaitEvent(ds, ready, 0));
    TAPER_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_dev.ordinal(), src, src_dev.ordinal(), n, ds));
    TAPER_CUDA_CHECK(cudaEventRecord(done, ds));
    TAPER_CUDA_CHECK(cudaStreamWaitEvent(ss, done, 0));
    TAPER_CUDA_CHECK(cudaEventDestroy(ready));
    TAPER_CUDA_CHECK(cudaEventDestroy(done));
  }

  void memset(Device dev, void* dst, int byte, size_t n) override {
    TAPER_CUDA_CHECK(cudaMemsetAsync(dst, byte, n, stream(dev.ordinal())));
  }

  void synchronize(Device dev) override {
    TAPER_CUDA_CHECK(cudaStreamSynchronize(stream(dev.ordinal())));
    raise_kernel_error(dev.ordinal());
  }

  // Graphs. Relaxed mode: the caching allocator may cudaMalloc a fresh block for the graph's
  // private pool during the capture (the block is not part of the graph; its address is).
  // A synchronisation or a host copy on the capturing stream still fails, and says so.
  void begin_capture(Device dev) override {
    TAPER_CUDA_CHECK(cudaStreamBeginCapture(stream(dev.ordinal()), cudaStreamCaptureModeRelaxed));
  }

  void* end_capture(Device dev) override {
    cudaGraph_t g = nullptr;
    const cudaError_t e = cudaStreamEndCapture(stream(dev.ordinal()), &g);
    if (e != cudaSuccess) {
      if (g) (void)cudaGraphDestroy(g);
      throw_cuda_error(e, "cudaStreamEndCapture", __FILE__, __LINE__, "cuda::Graph::capture");
    }
    cudaGraphExec_t x = nullptr;
    const cudaError_t ie = cudaGraphInstantiate(&x, g, 0);
    (void)cudaGraphDestroy(g);
    if (ie != cudaSuccess)
      throw_cuda_error(ie, "cudaGraphInstantiate", __FILE__, __LINE__, "cuda::Graph::capture");
    return x;
  }

  void replay_graph(Device dev, void* graph) override {
    TAPER_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), stream(dev.ordinal())));
  }

  void destroy_graph(Device dev, void* graph) noexcept override {
    if (!graph) return;
    try {
      stream(dev.ordinal());  // sets the device
    } catch (...) {
      return;
    }
    (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph));
    (void)cudaGetLastError();
  }
};

struct Registrar {
  Registrar() {
    static CudaBackend backend;
    register_device_backend(DeviceKind::Cuda, &backend);
  }
} registrar;

}  // namespace
}  // namespace taper::cuda
