// storage.h: a block of device memory owned by tensors, and the host caching allocator.
//
// What it is: `Storage` (device, bytes, pointer; allocated and freed through its device's
// caching allocator) and that allocator, which reuses freed blocks by size class on every device,
// so a training step neither page-faults fresh host memory nor calls cudaMalloc per temporary. `TAPER_NO_ALLOC_CACHE=1` turns the cache
// off (for leak checkers). What it is not: a layout; views share one Storage.
#pragma once

#include <cstddef>
#include <memory>

#include "taper/device.h"

namespace taper {

/// Owned device memory. Not copyable; shared between tensors by shared_ptr.
class Storage {
 public:
  /// Allocates `nbytes` on `dev` (uninitialised).
  Storage(Device dev, size_t nbytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  Device device() const { return device_; }
  size_t nbytes() const { return nbytes_; }
  void* data() { return ptr_; }
  const void* data() const { return ptr_; }

 private:
  Device device_;
  size_t nbytes_;
  void* ptr_;
};

/// Memory of `dev` through its caching allocator: blocks are rounded up to a size class and a
/// freed block serves the next request of its class on the same device without a device sync.
/// Out of memory empties that device's cache and retries once, then throws an Error naming the
/// bytes asked for and the bytes free. `TAPER_NO_ALLOC_CACHE=1` turns caching off.
void* device_alloc(Device dev, size_t nbytes);
void device_free(Device dev, void* p, size_t nbytes);
/// Returns `dev`'s cached blocks to its backend.
void device_cache_trim(Device dev);
/// Bytes held in `dev`'s cache (free blocks waiting for reuse).
size_t device_cache_bytes(Device dev);

/// Bytes of `dev` held by live tensors (as asked for, before size-class rounding) and by the
/// private pools of captured graphs (at class size, whole), the most held at once since the
/// start or the last reset_peak_memory, and the cache's free bytes: what PyTorch's
/// memory_allocated / max_memory_allocated report.
struct MemoryStats {
  size_t in_use = 0;
  size_t peak = 0;
  size_t cached = 0;
};
MemoryStats memory_stats(Device dev);
void reset_peak_memory(Device dev);

/// A private pool of `dev`'s memory, for a captured graph (taper::cuda::Graph), which replays
/// the addresses it was captured with. From construction until `end()`, every allocation on
/// `dev` comes from the pool, and every block freed on `dev`, the pool's or one allocated
/// before, joins the pool (a captured kernel may read it). After `end()` the pool serves no one,
/// and its blocks freed later return to it; its destruction (the graph's) gives its free blocks
/// to the device's cache, and its live ones return there when their tensors free them. The
/// pool's blocks count in `memory_stats(dev).in_use` (at their size class) until then. One
/// pool at a time per device; other threads must not use the device while one is active.
class PrivatePool {
 public:
  explicit PrivatePool(Device dev);
  ~PrivatePool();
  PrivatePool(const PrivatePool&) = delete;
  PrivatePool& operator=(const PrivatePool&) = delete;
  /// Stops routing allocations to the pool.
  void end();
  bool active() const;
  /// Bytes of the blocks the pool owns (free or held by tensors).
  size_t bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Host memory (device_alloc on the CPU): 64-byte aligned, cached by size class, with a guard
/// after each block checked at free. Used by the CPU backend and for staging.
void* host_alloc(size_t nbytes);
void host_free(void* p, size_t nbytes);
/// Returns every cached host block to the system.
void host_cache_trim();
/// Bytes currently held in the host cache (free blocks waiting for reuse).
size_t host_cache_bytes();

}  // namespace taper
