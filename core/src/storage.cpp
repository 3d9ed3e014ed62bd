// storage.cpp: Storage and the host caching allocator.
//
// Blocks are 64-byte aligned and rounded up to a size class (powers of two split in four), so
// a freed block of a class serves the next request of that class without a fresh mmap and its
// page faults. Each block carries a 64-byte guard after the requested bytes, checked at free:
// a kernel that writes past its output is reported (the sentinel check of the test suite).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "taper/error.h"
#include "taper/storage.h"

namespace taper {
namespace {

constexpr size_t kAlign = 64;
constexpr size_t kGuard = 64;
constexpr unsigned char kGuardByte = 0xA5;

size_t size_class(size_t n) {
  if (n <= 256) return (n + 63) & ~size_t(63);
  size_t p = 1;
  while (p < n) p <<= 1;
  const size_t q = p / 8;  // four classes per power of two: p/2 + k*p/8
  return (n + q - 1) / q * q;
}

struct HostCache {
  std::mutex mu;
  std::unordered_map<size_t, std::vector<void*>> free_lists;
  size_t cached = 0;
  bool enabled = true;
  HostCache() {
    const char* e = std::getenv("TAPER_NO_ALLOC_CACHE");
    enabled = !(e && *e && *e != '0');
  }
  ~HostCache() { trim(); }
  void trim() {
    std::lock_guard<std::mutex> g(mu);
    for (auto& [k, v] : free_lists)
      for (void* p : v) std::free(p);
    free_lists.clear();
    cached = 0;
  }
};

HostCache& cache() {
  static HostCache* c = new HostCache();  // leaked on purpose: outlives static tensors
  return *c;
}

}  // namespace

void* host_alloc(size_t nbytes) {
  const size_t cls = size_class(nbytes + kGuard);
  HostCache& c = cache();
  void* p = nullptr;
  if (c.enabled) {
    std::lock_guard<std::mutex> g(c.mu);
    auto it = c.free_lists.find(cls);
    if (it != c.free_lists.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      c.cached -= cls;
    }
  }
  if (!p) {
    p = std::aligned_alloc(kAlign, cls);
    if (!p) throw Error(detail::str_cat("out of host memory allocating ", nbytes, " bytes"));
  }
  std::memset(static_cast<char*>(p) + nbytes, kGuardByte, kGuard);
  return p;
}

void host_free(void* p, size_t nbytes) {
  if (!p) return;
  const unsigned char* g = static_cast<const unsigned char*>(p) + nbytes;
  for (size_t i = 0; i < kGuard; ++i) {
    if (g[i] != kGuardByte) {
      std::fprintf(stderr, "taper: a kernel wrote past the end of a %zu-byte buffer\n", nbytes);
      std::abort();
    }
  }
  const size_t cls = size_class(nbytes + kGuard);
  HostCache& c = cache();
  if (c.enabled) {
    std::lock_guard<std::mutex> gl(c.mu);
    c.free_lists[cls].push_back(p);
    c.cached += cls;
    return;
  }
  std::free(p);
}

void host_cache_trim() { cache().trim(); }
size_t host_cache_bytes() {
  std::lock_guard<std::mutex> g(cache().mu);
  return cache().cached;
}

Storage::Storage(Device dev, size_t nbytes) : device_(dev), nbytes_(nbytes) {
  ptr_ = dev.is_cpu() ? host_alloc(nbytes) : device_backend(dev.kind()).allocate(dev, nbytes);
}

Storage::~Storage() {
  if (device_.is_cpu())
    host_free(ptr_, nbytes_);
  else
    device_backend(device_.kind()).deallocate(device_, ptr_, nbytes_);
}

}  // namespace taper
