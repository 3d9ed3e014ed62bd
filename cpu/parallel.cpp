// parallel.cpp: the CPU thread pool behind cpu::parallel_for, the thread setting shared with
// OpenBLAS (TAPER_NUM_THREADS), and the CPU device backend (host memory).
//
// One job runs at a time: workers and the caller take chunks from an atomic counter. A call from
// inside a chunk, or while another thread's job is running, runs inline, so threads never
// oversubscribe the cores. Between jobs a worker spins for kSpin before it sleeps on the condition
// variable, and the caller spins for the last chunks before it does: a composed op or a backward
// is a train of small jobs, and a futex wake-up per job cost ~15% of a (8, 32, 64, 64) group norm
// forward+backward.
#include <cblas.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>

#include "cpu/cpu_common.h"
#include "taper/storage.h"

namespace taper::cpu {
namespace {

thread_local bool t_in_parallel = false;

/// How long an idle worker (or a caller waiting for the last chunks) polls before sleeping.
constexpr std::chrono::microseconds kSpin{50};

/// Polls `done` for up to kSpin; true once it holds.
template <class F> bool spin_until(const F& done) {
  const auto end = std::chrono::steady_clock::now() + kSpin;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    if (std::chrono::steady_clock::now() >= end) return done();
  }
}

/// More threads than this is a mistake, not a setting (and would exhaust the process's threads).
constexpr size_t kMaxThreads = 4096;

size_t default_threads() {
  if (const char* e = std::getenv("TAPER_NUM_THREADS"); e && *e) {
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(e, &end, 10);
    TAPER_CHECK(errno == 0 && *end == '\0' && e[0] != '-' && v >= 1 && v <= kMaxThreads,
                "TAPER_NUM_THREADS: '", e, "' is not a thread count (1 to ", kMaxThreads, ")");
    return static_cast<size_t>(v);
  }
  const unsigned hc = std::thread::hardware_concurrency();
  return hc ? hc : 1;
}

class Pool {
 public:
  Pool() { resize(default_threads()); }
  ~Pool() { stop_workers(); }

  size_t threads() const { return nthreads_; }

  void resize(size_t n) {
    std::lock_guard<std::mutex> job(job_mu_);
    const size_t old = nthreads_;
    stop_workers();
    try {
      start_workers(n < 1 ? 1 : n);
    } catch (const std::system_error& e) {  // the system refused a thread: keep the old count
      stop_workers();
      start_workers(old);
      throw Error(std::string("set_num_threads: cannot start ") + std::to_string(n) +
                  " threads (" + e.what() + "); still " + std::to_string(old));
    }
  }

  void start_workers(size_t n) {
    nthreads_ = n;
    // BLAS is called from the pool's threads on fixed tiles (matmul.cpp): one thread each.
    openblas_set_num_threads(1);
    stop_ = false;
    for (size_t i = 1; i < nthreads_; ++i) workers_.emplace_back([this] { worker_loop(); });
  }

  void run(size_t n, size_t grain, detail::RangeFn fn, void* ctx) {
    size_t chunks = (n + grain - 1) / grain;
    if (chunks > nthreads_) chunks = nthreads_;
    std::unique_lock<std::mutex> job(job_mu_, std::try_to_lock);
    if (chunks <= 1 || t_in_parallel || !job.owns_lock()) {
      fn(ctx, 0, n);
      return;
    }
    {
      // A worker still inside work() for the previous job reads the job fields: wait it out.
      std::unique_lock<std::mutex> g(mu_);
      done_cv_.wait(g, [this] { return active_ == 0; });
      fn_ = fn;
      ctx_ = ctx;
      n_ = n;
      chunk_ = (n + chunks - 1) / chunks;
      nchunks_ = (n + chunk_ - 1) / chunk_;
      next_.store(0);
      remaining_.store(nchunks_);
      error_ = nullptr;
      generation_.store(generation_.load() + 1, std::memory_order_release);
    }
    cv_.notify_all();
    work();
    spin_until([this] { return remaining_.load(std::memory_order_acquire) == 0; });
    std::unique_lock<std::mutex> g(mu_);
    done_cv_.wait(g, [this] { return remaining_.load() == 0 && active_ == 0; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void work() {
    t_in_parallel = true;
    for (;;) {
      const size_t c = next_.fetch_add(1);
      if (c >= nchunks_) break;
      const size_t b = c * chunk_;
      const size_t e = b + chunk_ < n_ ? b + chunk_ : n_;
      try {
        fn_(ctx_, b, e);
      } catch (...) {
        std::lock_guard<std::mutex> g(mu_);
        if (!error_) error_ = std::current_exception();
      }
      if (remaining_.fetch_sub(1) == 1) {
        std::lock_guard<std::mutex> g(mu_);
        done_cv_.notify_all();
      }
    }
    t_in_parallel = false;
  }

  void worker_loop() {
    uint64_t seen = 0;
    for (;;) {
      spin_until([&] { return generation_.load(std::memory_order_acquire) != seen; });
      {
        std::unique_lock<std::mutex> g(mu_);
        cv_.wait(g, [&] { return stop_ || generation_.load() != seen; });
        if (stop_) return;
        seen = generation_.load();
        ++active_;
      }
      work();
      std::lock_guard<std::mutex> g(mu_);
      if (--active_ == 0) done_cv_.notify_all();
    }
  }

  void stop_workers() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
  }

  std::mutex job_mu_;  // one job at a time
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::vector<std::thread> workers_;
  size_t nthreads_ = 1;
  bool stop_ = false;
  std::atomic<uint64_t> generation_{0};  // written under mu_; polled without it
  size_t active_ = 0;  // workers inside work(), guarded by mu_
  detail::RangeFn fn_ = nullptr;
  void* ctx_ = nullptr;
  size_t n_ = 0, chunk_ = 1, nchunks_ = 0;
  std::atomic<size_t> next_{0}, remaining_{0};
  std::exception_ptr error_;
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: workers may outlive static destructors
  return *p;
}

// The CPU backend: host memory (64-byte aligned; core's caching allocator sits on top).
class CpuBackend final : public DeviceBackend {
 public:
  int device_count() const override { return 1; }
  void* raw_allocate(Device, size_t nbytes) override {
    return std::aligned_alloc(64, (nbytes + 63) & ~size_t(63));
  }
  void raw_free(Device, void* p) override { std::free(p); }
  void copy_from_host(Device, void* dst, const void* src, size_t n) override {
    std::memcpy(dst, src, n);
  }
  void copy_to_host(Device, void* dst, const void* src, size_t n) override {
    std::memcpy(dst, src, n);
  }
  void copy_device(Device, void* dst, Device, const void* src, size_t n) override {
    std::memcpy(dst, src, n);
  }
  void memset(Device, void* dst, int byte, size_t n) override { std::memset(dst, byte, n); }
  void synchronize(Device) override {}
  bool host_accessible() const override { return true; }
};

struct Registrar {
  Registrar() {
    static CpuBackend backend;
    register_device_backend(DeviceKind::Cpu, &backend);
  }
} registrar;

}  // namespace

size_t num_threads() { return pool().threads(); }
void set_num_threads(size_t n) { pool().resize(n); }

}  // namespace taper::cpu

// The public thread settings belong to the CPU backend alone (not to DeviceBackend).
namespace taper {
size_t num_threads() { return cpu::num_threads(); }
void set_num_threads(size_t n) {
  TAPER_CHECK(n >= 1 && n <= cpu::kMaxThreads, "set_num_threads: need 1 to ", cpu::kMaxThreads,
              " threads, got ", n);
  cpu::set_num_threads(n);
}
}  // namespace taper

namespace taper::cpu {

namespace detail {
void parallel_for_impl(size_t n, size_t grain, RangeFn fn, void* ctx) {
  pool().run(n, grain, fn, ctx);
}
}  // namespace detail

}  // namespace taper::cpu
