// storage.h: a block of device memory owned by tensors, and the host caching allocator.
//
// What it is: `Storage` (device, bytes, pointer; freed through its device's backend) and the CPU
// caching allocator that reuses freed blocks by size class, so a training step does not
// page-fault fresh memory for every large temporary. `TAPER_NO_ALLOC_CACHE=1` turns the cache
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

/// Host memory: 64-byte aligned, cached by size class. Used by the CPU backend and for staging.
void* host_alloc(size_t nbytes);
void host_free(void* p, size_t nbytes);
/// Returns every cached block to the system.
void host_cache_trim();
/// Bytes currently held in the host cache (free blocks waiting for reuse).
size_t host_cache_bytes();

}  // namespace taper
