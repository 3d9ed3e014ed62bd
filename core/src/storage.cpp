// storage.cpp: Storage and the caching allocator every device shares.
//
// Blocks are rounded up to a size class (powers of two split in four), so a freed block of a
// class serves the next request of that class without a fresh mmap (host) or cudaMalloc (GPU).
// One cache per device; reuse needs no device sync because a device's work runs in stream order.
//
// Private pools (graph capture): while a pool is active on a device, every allocation of that
// device comes from the pool (its free blocks, else fresh ones), and every block freed then,
// the pool's or not, joins the pool. A captured graph replays the addresses it saw, so none of
// those blocks may serve anyone else while the graph lives: after the capture the pool hands
// out nothing, its blocks freed later return to it, and only its release (the graph's end)
// gives its free blocks to the device's cache. Reuse inside the capture is stream-ordered as
// everywhere else. A pool's blocks count as in use, at their class size, until released.
// On a device the host can address (the CPU), each block carries a 64-byte guard after the
// requested bytes, checked at free: a kernel that writes past its output is reported (the
// sentinel check of the test suite). GPU blocks are checked by compute-sanitizer instead.
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "taper/error.h"
#include "taper/storage.h"

namespace taper {
namespace {

constexpr size_t kGuard = 64;
constexpr unsigned char kGuardByte = 0xA5;
// Larger requests are refused before any arithmetic on them can wrap.
constexpr size_t kMaxAlloc = size_t(1) << 62;

size_t size_class(size_t n) {
  if (n <= 256) return (n + 63) & ~size_t(63);
  size_t p = 1;
  while (p < n) p <<= 1;
  const size_t q = p / 8;  // four classes per power of two: p/2 + k*p/8
  return (n + q - 1) / q * q;
}

/// A private pool's blocks: the free ones by class, and the bytes of all it owns.
struct Pool {
  std::unordered_map<size_t, std::vector<void*>> free;
  size_t bytes = 0;
  bool active = false;  ///< allocations come from it
  bool released = false;
};

class Cache {
 public:
  explicit Cache(Device dev) : dev_(dev) {
    const char* e = std::getenv("TAPER_NO_ALLOC_CACHE");
    enabled_ = !(e && *e && *e != '0');
  }

  void* alloc(size_t nbytes) {
    TAPER_CHECK(nbytes <= kMaxAlloc, "out of memory on ", dev_.to_string(), ": ", nbytes,
                " bytes asked for");
    DeviceBackend& be = device_backend(dev_.kind());
    const bool guard = be.host_accessible();
    // A zero-byte request still gets a real block (cudaMalloc(0) returns no pointer).
    const size_t cls = size_class(std::max<size_t>(1, nbytes + (guard ? kGuard : 0)));
    void* p = nullptr;
    std::shared_ptr<Pool> pool;
    {
      std::lock_guard<std::mutex> g(mu_);
      pool = active_;
      if (pool) {  // a capture: the pool's own blocks only
        auto it = pool->free.find(cls);
        if (it != pool->free.end() && !it->second.empty()) {
          p = it->second.back();
          it->second.pop_back();
        }
      } else if (enabled_) {
        auto it = free_.find(cls);
        if (it != free_.end() && !it->second.empty()) {
          p = it->second.back();
          it->second.pop_back();
          cached_ -= cls;
        }
      }
    }
    const bool fresh = !p;
    if (!p) p = be.raw_allocate(dev_, cls);
    if (!p) {  // out of memory: give the cache back and try once more
      trim();
      p = be.raw_allocate(dev_, cls);
    }
    TAPER_CHECK(p != nullptr, "out of memory on ", dev_.to_string(), ": ", nbytes,
                " bytes asked for, ", be.free_bytes(dev_), " bytes free (after emptying the "
                "allocator's cache)");
    if (guard) std::memset(static_cast<char*>(p) + nbytes, kGuardByte, kGuard);
    {
      std::lock_guard<std::mutex> g(mu_);
      if (pool) {
        if (fresh) {
          owner_[p] = pool;
          pool->bytes += cls;
          in_use_ += cls;
        }
      } else {
        in_use_ += nbytes;
      }
      peak_ = std::max(peak_, in_use_);
    }
    return p;
  }

  void free(void* p, size_t nbytes) {
    if (!p) return;
    DeviceBackend& be = device_backend(dev_.kind());
    const bool guard = be.host_accessible();
    if (guard) {
      const unsigned char* g = static_cast<const unsigned char*>(p) + nbytes;
      for (size_t i = 0; i < kGuard; ++i) {
        if (g[i] != kGuardByte) {
          std::fprintf(stderr, "taper: a kernel wrote past the end of a %zu-byte buffer\n", nbytes);
          std::abort();
        }
      }
    }
    const size_t cls = size_class(std::max<size_t>(1, nbytes + (guard ? kGuard : 0)));
    {
      std::lock_guard<std::mutex> gl(mu_);
      auto own = owner_.empty() ? owner_.end() : owner_.find(p);  // no lookup without pools
      if (own != owner_.end()) {
        Pool& pool = *own->second;
        if (!pool.released) {  // kept for the graph that may replay into it
          pool.free[cls].push_back(p);
          return;
        }
        owner_.erase(own);  // its pool is gone: a plain block again
        in_use_ -= cls;
      } else if (active_) {
        // Freed during a capture: a captured kernel may have read it, so it is the pool's now.
        in_use_ -= nbytes;
        owner_[p] = active_;
        active_->bytes += cls;
        in_use_ += cls;
        peak_ = std::max(peak_, in_use_);
        active_->free[cls].push_back(p);
        return;
      } else {
        in_use_ -= nbytes;
      }
      if (enabled_) {
        free_[cls].push_back(p);
        cached_ += cls;
        return;
      }
    }
    be.raw_free(dev_, p);
  }

  std::shared_ptr<Pool> begin_pool() {
    std::lock_guard<std::mutex> g(mu_);
    TAPER_CHECK(!active_, "PrivatePool: ", dev_.to_string(),
                " already routes its allocations to a private pool (one capture at a time)");
    active_ = std::make_shared<Pool>();
    active_->active = true;
    return active_;
  }

  void end_pool(const std::shared_ptr<Pool>& pool) {
    std::lock_guard<std::mutex> g(mu_);
    if (active_ == pool) active_.reset();
    pool->active = false;
  }

  /// The pool's graph is gone: its free blocks go to the cache; live ones return there when
  /// freed.
  void release_pool(Pool& pool) {
    std::vector<void*> give_back;  // with the cache off: to the backend, outside the lock
    {
      std::lock_guard<std::mutex> g(mu_);
      if (active_.get() == &pool) active_.reset();
      pool.released = true;
      for (auto& [cls, v] : pool.free) {
        for (void* p : v) {
          owner_.erase(p);
          in_use_ -= cls;
          if (enabled_) {
            free_[cls].push_back(p);
            cached_ += cls;
          } else {
            give_back.push_back(p);
          }
        }
      }
      pool.free.clear();
    }
    DeviceBackend& be = device_backend(dev_.kind());
    for (void* p : give_back) {
      try {
        be.raw_free(dev_, p);
      } catch (const Error&) {
        // Called from a destructor: a failing free (a device already torn down) is not thrown.
      }
    }
  }

  void trim() {
    std::lock_guard<std::mutex> g(mu_);
    DeviceBackend& be = device_backend(dev_.kind());
    for (auto& [k, v] : free_)
      for (void* p : v) be.raw_free(dev_, p);
    free_.clear();
    cached_ = 0;
  }

  size_t cached() {
    std::lock_guard<std::mutex> g(mu_);
    return cached_;
  }

  MemoryStats stats() {
    std::lock_guard<std::mutex> g(mu_);
    return MemoryStats{in_use_, peak_, cached_};
  }

  void reset_peak() {
    std::lock_guard<std::mutex> g(mu_);
    peak_ = in_use_;
  }

 private:
  Device dev_;
  bool enabled_ = true;
  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_ = 0;
  size_t in_use_ = 0;  ///< bytes asked for by the live blocks
  size_t peak_ = 0;    ///< the most in_use_ since the start or reset_peak
  std::shared_ptr<Pool> active_;                                 ///< capturing into it
  std::unordered_map<void*, std::shared_ptr<Pool>> owner_;       ///< blocks of private pools
};

Cache& cache(Device dev) {
  // Leaked on purpose: outlives static tensors (and the CUDA runtime's teardown).
  static std::mutex* mu = new std::mutex();
  static auto* caches = new std::map<std::pair<int, int>, Cache*>();
  static Cache* cpu = new Cache(Device::cpu());
  if (dev.is_cpu()) return *cpu;
  std::lock_guard<std::mutex> g(*mu);
  Cache*& c = (*caches)[{static_cast<int>(dev.kind()), dev.ordinal()}];
  if (!c) c = new Cache(dev);
  return *c;
}

}  // namespace

void* device_alloc(Device dev, size_t nbytes) { return cache(dev).alloc(nbytes); }
void device_free(Device dev, void* p, size_t nbytes) { cache(dev).free(p, nbytes); }
void device_cache_trim(Device dev) { cache(dev).trim(); }
size_t device_cache_bytes(Device dev) { return cache(dev).cached(); }
MemoryStats memory_stats(Device dev) { return cache(dev).stats(); }
void reset_peak_memory(Device dev) { cache(dev).reset_peak(); }

struct PrivatePool::Impl {
  Device dev;
  std::shared_ptr<Pool> pool;
};

PrivatePool::PrivatePool(Device dev) : impl_(new Impl{dev, cache(dev).begin_pool()}) {}

PrivatePool::~PrivatePool() {
  if (impl_) cache(impl_->dev).release_pool(*impl_->pool);
}

void PrivatePool::end() {
  if (impl_) cache(impl_->dev).end_pool(impl_->pool);
}

bool PrivatePool::active() const { return impl_ && impl_->pool->active; }

size_t PrivatePool::bytes() const { return impl_ ? impl_->pool->bytes : 0; }

void* host_alloc(size_t nbytes) { return device_alloc(Device::cpu(), nbytes); }
void host_free(void* p, size_t nbytes) { device_free(Device::cpu(), p, nbytes); }
void host_cache_trim() { device_cache_trim(Device::cpu()); }
size_t host_cache_bytes() { return device_cache_bytes(Device::cpu()); }

Storage::Storage(Device dev, size_t nbytes) : device_(dev), nbytes_(nbytes) {
  TAPER_CHECK(dev.is_cpu() || (dev.ordinal() >= 0 && dev.ordinal() < device_count(dev.kind())),
              "device ", dev.to_string(), " is not available (", device_count(dev.kind()),
              " such devices present)");
  ptr_ = device_alloc(dev, nbytes);
}

Storage::~Storage() { device_free(device_, ptr_, nbytes_); }

}  // namespace taper
