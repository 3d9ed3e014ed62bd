// storage.cpp: Storage and the caching allocator every device shares.
//
// Blocks are rounded up to a size class (powers of two split in four), so a freed block of a
// class serves the next request of that class without a fresh mmap (host) or cudaMalloc (GPU).
// One cache per device; reuse needs no device sync because a device's work runs in stream order.
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
    if (enabled_) {
      std::lock_guard<std::mutex> g(mu_);
      auto it = free_.find(cls);
      if (it != free_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
        cached_ -= cls;
      }
    }
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
      in_use_ += nbytes;
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
      in_use_ -= nbytes;
      if (enabled_) {
        free_[cls].push_back(p);
        cached_ += cls;
        return;
      }
    }
    be.raw_free(dev_, p);
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
