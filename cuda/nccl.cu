// nccl.cu: taper::dist's NCCL process group (Backend::Nccl), registered at load time like the
// CUDA kernels; NCCL itself is loaded with dlopen when the first group is made, so a program
// (or a machine) that never uses it does not need libnccl.
//
// Where libnccl.so.2 comes from, in this order: TAPER_NCCL_LIBRARY (a file, or a folder that
// holds libnccl.so.2; when set, nothing else is tried), the dynamic linker's search
// (LD_LIBRARY_PATH, the cache), the folder CMake found NCCL in at build time, the NCCL wheel of
// a Python environment (nvidia/nccl/lib, as PyTorch's nvidia-nccl-cu13 installs it: the virtual
// or conda environment, ~/.local, /usr/local/lib, /usr/lib, /opt/conda), and the toolkit's
// folders. The error says every path tried and why each failed.
//
// The entry points are declared here (the ABI of NCCL 2.x: plain functions and C enums); where
// the toolkit's nccl.h is found at build time, static_asserts check the values against it.
// NVLink multicast stays off: NCCL_NVLS_ENABLE=0 is set before a communicator is made unless the
// user set it. all_reduce runs on a communication stream of its own, after the work queued on
// taper's stream of the device so far (an event), so a reduction overlaps the kernels queued
// after it (the rest of a backward); Work::wait() makes taper's stream wait for it (an event
// again: no host wait), and so does dropping the Work unwaited, so the tensor's memory is never
// reused while NCCL writes it. broadcast runs on taper's stream itself. Every NCCL failure is a
// taper::Error naming the call, the rank, the device, the tensor's shape and dtype, and NCCL's
// own message.
// What it is not: the rendezvous or the TCP group (core/dist.cpp), or data parallelism
// (nn/ddp.cpp). A peer that dies in the middle of a collective is seen by barrier() (it polls
// with the group's timeout and aborts the communicator); a collective's kernel itself cannot
// be timed out from here.
#include <dlfcn.h>
#include <glob.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "cuda/cuda_common.cuh"
#include "taper/dist.h"
#include "taper/error.h"

#if __has_include(<nccl.h>)
#include <nccl.h>
#define TAPER_HAVE_NCCL_H 1
#endif

namespace taper::cuda {
namespace {

// ---- the ABI -----------------------------------------------------------------------------------

constexpr int kNcclSuccess = 0;
constexpr int kNcclInProgress = 7;
constexpr int kNcclSum = 0, kNcclAvg = 4;
constexpr int kNcclUint8 = 1, kNcclUint32 = 3, kNcclInt64 = 4, kNcclFloat16 = 6,
              kNcclFloat32 = 7, kNcclFloat64 = 8, kNcclBfloat16 = 9;
struct NcclUniqueId {
  char internal[128];
};
struct NcclComm;  // opaque
using Comm = NcclComm*;

#ifdef TAPER_HAVE_NCCL_H
static_assert(ncclSuccess == kNcclSuccess && ncclInProgress == kNcclInProgress);
static_assert(ncclSum == kNcclSum && ncclAvg == kNcclAvg);
static_assert(ncclUint8 == kNcclUint8 && ncclUint32 == kNcclUint32 && ncclInt64 == kNcclInt64 &&
              ncclFloat16 == kNcclFloat16 && ncclFloat32 == kNcclFloat32 &&
              ncclFloat64 == kNcclFloat64 && ncclBfloat16 == kNcclBfloat16);
static_assert(sizeof(ncclUniqueId) == sizeof(NcclUniqueId));
static_assert(sizeof(ncclResult_t) == sizeof(int) && sizeof(ncclDataType_t) == sizeof(int) &&
              sizeof(ncclRedOp_t) == sizeof(int));
#endif

/// The entry points of a loaded libnccl.
struct Nccl {
  std::string path;
  int version = 0;
  int (*GetVersion)(int*) = nullptr;
  int (*GetUniqueId)(NcclUniqueId*) = nullptr;
  int (*CommInitRank)(Comm*, int, NcclUniqueId, int) = nullptr;
  int (*CommDestroy)(Comm) = nullptr;
  int (*CommAbort)(Comm) = nullptr;
  int (*CommGetAsyncError)(Comm, int*) = nullptr;
  int (*AllReduce)(const void*, void*, size_t, int, int, Comm, cudaStream_t) = nullptr;
  int (*Broadcast)(const void*, void*, size_t, int, int, Comm, cudaStream_t) = nullptr;
  const char* (*GetErrorString)(int) = nullptr;
  const char* (*GetLastError)(Comm) = nullptr;
};

bool is_dir(const std::string& p) {
  struct stat st {};
  return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

/// Where to look for libnccl.so.2, in order (see the top of this file).
std::vector<std::string> candidates() {
  if (const char* e = std::getenv("TAPER_NCCL_LIBRARY"); e != nullptr && *e != '\0') {
    const std::string p = e;
    return {is_dir(p) ? p + "/libnccl.so.2" : p};
  }
  std::vector<std::string> c = {"libnccl.so.2"};
#ifdef TAPER_NCCL_DIR
  c.push_back(std::string(TAPER_NCCL_DIR) + "/libnccl.so.2");
#endif
  std::vector<std::string> prefixes;
  for (const char* v : {"VIRTUAL_ENV", "CONDA_PREFIX"})
    if (const char* p = std::getenv(v); p != nullptr && *p != '\0') prefixes.push_back(p);
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0')
    prefixes.push_back(std::string(h) + "/.local");
  for (const char* p : {"/usr/local", "/usr", "/opt/conda"}) prefixes.push_back(p);
  for (const std::string& prefix : prefixes)
    for (const char* sub : {"site-packages", "dist-packages"}) {
      const std::string pattern = prefix + "/lib/python3*/" + sub + "/nvidia/nccl/lib/libnccl.so.2";
      glob_t g{};
      if (glob(pattern.c_str(), 0, nullptr, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; ++i) c.push_back(g.gl_pathv[i]);
      globfree(&g);
    }
  c.push_back("/usr/lib/python3/dist-packages/nvidia/nccl/lib/libnccl.so.2");
  for (const char* p : {"/usr/local/cuda/lib64/libnccl.so.2", "/usr/local/cuda/lib/libnccl.so.2",
                        "/usr/lib/x86_64-linux-gnu/libnccl.so.2"})
    c.push_back(p);
  return c;
}

/// Loads NCCL once; every later call returns the same library or throws the same Error.
const Nccl& nccl(int rank) {
  static std::once_flag once;
  static Nccl lib;
  static std::string failure;
  std::call_once(once, [] {
    setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);  // before NCCL reads its environment
    std::string tried;
    for (const std::string& path : candidates()) {
      void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (h == nullptr) {
        const char* why = dlerror();
        tried += "\n  " + path + ": " + (why ? why : "not loadable");
        continue;
      }
      Nccl n;
      n.path = path;
      bool ok = true;
      std::string missing;
      auto sym = [&](auto& fn, const char* name) {
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
        if (fn == nullptr) {
          ok = false;
          missing += std::string(missing.empty() ? "" : ", ") + name;
        }
      };
      sym(n.GetVersion, "ncclGetVersion");
      sym(n.GetUniqueId, "ncclGetUniqueId");
      sym(n.CommInitRank, "ncclCommInitRank");
      sym(n.CommDestroy, "ncclCommDestroy");
      sym(n.CommAbort, "ncclCommAbort");
      sym(n.CommGetAsyncError, "ncclCommGetAsyncError");
      sym(n.AllReduce, "ncclAllReduce");
      sym(n.Broadcast, "ncclBroadcast");
      sym(n.GetErrorString, "ncclGetErrorString");
      sym(n.GetLastError, "ncclGetLastError");
      if (ok && n.GetVersion(&n.version) != kNcclSuccess) ok = false;
      // 2.10 brought ncclAvg and bfloat16.
      if (!ok || n.version < 21000) {
        tried += "\n  " + path + ": " +
                 (ok ? "NCCL " + std::to_string(n.version) + " is older than 2.10"
                     : "lacks " + (missing.empty() ? std::string("a working ncclGetVersion") : missing));
        dlclose(h);
        continue;
      }
      lib = n;
      return;
    }
    failure = "cannot load NCCL (libnccl.so.2); tried:" + tried +
              "\nSet TAPER_NCCL_LIBRARY to the library or its folder (PyTorch's wheel puts it in "
              "<site-packages>/nvidia/nccl/lib), or add that folder to LD_LIBRARY_PATH";
  });
  TAPER_CHECK(failure.empty(), "dist: rank ", rank, ": ", failure);
  return lib;
}

int nccl_dtype(DType dt) {
  switch (dt) {
    case DType::U8: return kNcclUint8;
    case DType::U32: return kNcclUint32;
    case DType::I64: return kNcclInt64;
    case DType::F16: return kNcclFloat16;
    case DType::F32: return kNcclFloat32;
    case DType::F64: return kNcclFloat64;
    case DType::BF16: return kNcclBfloat16;
  }
  return -1;
}

// ---- the group ------------------------------------------------------------------------------------

class NcclGroup final : public dist::ProcessGroup {
 public:
  NcclGroup(std::unique_ptr<dist::Rendezvous> rv, Device dev)
      : ProcessGroup(std::move(rv)), dev_(dev), lib_(nccl(rank())) {
    // nccl() has set NCCL_NVLS_ENABLE=0 (unless the user set it) before any NCCL call.
    NcclUniqueId id{};
    if (rank() == 0) check(lib_.GetUniqueId(&id), "ncclGetUniqueId", nullptr);
    {
      std::lock_guard<std::mutex> lock(socket_mutex());
      rendezvous().broadcast_bytes(&id, sizeof id, "NCCL unique id");
    }
    stream(dev_.ordinal());  // makes the device current for the communicator
    TAPER_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
    check(lib_.CommInitRank(&comm_, world_size(), id, rank()), "ncclCommInitRank", nullptr);
  }

  ~NcclGroup() override {
    if (comm_stream_ != nullptr) {
      stream(dev_.ordinal());
      (void)cudaStreamSynchronize(comm_stream_);
      (void)cudaStreamDestroy(comm_stream_);
    }
    if (comm_ == nullptr) return;
    // A communicator that failed may have peers that never answer: abort instead of waiting.
    if (failed_) lib_.CommAbort(comm_);
    else lib_.CommDestroy(comm_);
  }

  dist::Backend backend() const override { return dist::Backend::Nccl; }
  Device device() const override { return dev_; }

  std::unique_ptr<dist::Work> all_reduce_async(const Tensor& t, dist::ReduceOp op) override {
    check_tensor(t, "all_reduce");
    auto work = std::make_unique<Queued>(this);
    if (t.elem_count() == 0) return work;
    const cudaStream_t s = stream(dev_.ordinal());
    // The communication stream starts after what taper's stream holds now (t's producers).
    cudaEvent_t ready = nullptr;
    TAPER_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    TAPER_CUDA_CHECK(cudaEventRecord(ready, s));
    TAPER_CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, ready, 0));
    TAPER_CUDA_CHECK(cudaEventDestroy(ready));  // released once the wait is satisfied
    check(lib_.AllReduce(t.data_ptr(), t.data_ptr(), t.elem_count(), nccl_dtype(t.dtype()),
                         op == dist::ReduceOp::Avg ? kNcclAvg : kNcclSum, comm_, comm_stream_),
          "ncclAllReduce", &t);
    TAPER_CUDA_CHECK(cudaEventCreateWithFlags(&work->done, cudaEventDisableTiming));
    TAPER_CUDA_CHECK(cudaEventRecord(work->done, comm_stream_));
    return work;
  }

  void broadcast(const Tensor& t, int root) override {
    check_tensor(t, "broadcast");
    check_root(root, "broadcast");
    if (t.elem_count() > 0)
      check(lib_.Broadcast(t.data_ptr(), t.data_ptr(), t.elem_count(), nccl_dtype(t.dtype()),
                           root, comm_, stream(dev_.ordinal())),
            "ncclBroadcast", &t);
  }

  /// A one-element all-reduce, then the host polls the stream (and NCCL's error state) until
  /// it is done, at most the group's timeout: a dead peer is an Error, not a hang.
  void barrier() override {
    if (!token_.defined()) token_ = Tensor::zeros({1}, DType::F32, dev_);
    all_reduce_async(token_, dist::ReduceOp::Sum)->wait();
    const cudaStream_t s = stream(dev_.ordinal());
    const double timeout = rendezvous().timeout_s();
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      const cudaError_t e = cudaStreamQuery(s);
      if (e == cudaSuccess) break;
      if (e != cudaErrorNotReady) throw_cuda_error(e, "cudaStreamQuery (dist barrier)", __FILE__, __LINE__);
      poll_async_error("barrier");
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout) {
        failed_ = true;
        lib_.CommAbort(comm_);
        comm_ = nullptr;
        throw Error("dist: barrier: rank " + std::to_string(rank()) + " on " + dev_.to_string() +
                    " waited " + std::to_string(static_cast<int>(timeout)) +
                    " s for the other ranks; the NCCL communicator was aborted");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    raise_kernel_error(dev_.ordinal());
  }

 private:
  /// An all-reduce queued on the communication stream; `done` follows it there.
  struct Queued final : dist::Work {
    explicit Queued(NcclGroup* g) : g_(g) {}
    ~Queued() override {
      if (done != nullptr) {  // never waited for: order taper's stream behind it all the same
        (void)cudaStreamWaitEvent(stream(g_->dev_.ordinal()), done, 0);
        (void)cudaEventDestroy(done);
      }
    }
    /// What is queued on taper's stream from now on runs after the all-reduce.
    void wait() override {
      if (done != nullptr) {
        TAPER_CUDA_CHECK(cudaStreamWaitEvent(stream(g_->dev_.ordinal()), done, 0));
        TAPER_CUDA_CHECK(cudaEventDestroy(done));
        done = nullptr;
      }
      g_->poll_async_error("all_reduce");
    }
    NcclGroup* g_;
    cudaEvent_t done = nullptr;
  };

  /// The base contract (ProcessGroup::check_tensor), a live communicator and an NCCL dtype.
  void check_tensor(const Tensor& t, const char* call) const {
    TAPER_CHECK(comm_ != nullptr, "dist: ", call, ": rank ", rank(), ": the NCCL communicator was "
                "aborted after an earlier failure");
    ProcessGroup::check_tensor(t, call);
    TAPER_CHECK(nccl_dtype(t.dtype()) >= 0, "dist: ", call, ": NCCL has no ", dtype_name(t.dtype()));
  }

  void check(int rc, const char* call, const Tensor* t) {
    if (rc == kNcclSuccess) return;
    if (rc != kNcclInProgress) failed_ = true;
    std::string what = "dist: " + std::string(call) + " failed on rank " + std::to_string(rank()) +
                       " of " + std::to_string(world_size()) + " (" + dev_.to_string() + ")";
    if (t != nullptr)
      what += " for a tensor " + t->shape().to_string() + " " + std::string(dtype_name(t->dtype()));
    what += ": " + std::string(lib_.GetErrorString(rc));
    if (const char* last = lib_.GetLastError(comm_); last != nullptr && *last != '\0')
      what += " (" + std::string(last) + ")";
    what += " [NCCL " + std::to_string(lib_.version) + " from " + lib_.path + "]";
    throw Error(what);
  }

  void poll_async_error(const char* call) {
    if (comm_ == nullptr) return;
    int rc = kNcclSuccess;
    check(lib_.CommGetAsyncError(comm_, &rc), "ncclCommGetAsyncError", nullptr);
    if (rc != kNcclSuccess && rc != kNcclInProgress) check(rc, call, nullptr);
  }

  Device dev_;
  const Nccl& lib_;
  Comm comm_ = nullptr;
  cudaStream_t comm_stream_ = nullptr;  ///< all_reduce's (see the top of this file)
  bool failed_ = false;
  Tensor token_;  ///< barrier()'s one element
};

struct NcclRegistrar {
  NcclRegistrar() {
    dist::register_group_backend(dist::Backend::Nccl,
                                 [](std::unique_ptr<dist::Rendezvous> rv, Device dev) {
                                   return std::make_shared<NcclGroup>(std::move(rv), dev);
                                 });
  }
} nccl_registrar;

}  // namespace
}  // namespace taper::cuda
