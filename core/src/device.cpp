// device.cpp: Device names, the table of registered device backends and what reads it
// (device_backend, device_count, device_available, synchronize), and the CUDA TF32 switch
// (device.h). What it is not: a backend (cpu/, cuda/ register theirs) or the allocator
// (storage.cpp).
#include <atomic>
#include <string>

#include "taper/device.h"
#include "taper/error.h"

namespace taper {

std::string Device::to_string() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(ordinal_);
}

void DeviceBackend::begin_capture(Device dev) {
  throw Error(detail::str_cat("graph capture: device ", dev.to_string(),
                              " cannot capture its work into a graph (CUDA devices can)"));
}
void* DeviceBackend::end_capture(Device dev) { begin_capture(dev); return nullptr; }
void DeviceBackend::replay_graph(Device dev, void*) { begin_capture(dev); }
void DeviceBackend::destroy_graph(Device, void*) noexcept {}

namespace {
DeviceBackend* g_backends[kNumDeviceKinds] = {};
}

void register_device_backend(DeviceKind kind, DeviceBackend* backend) {
  g_backends[static_cast<int>(kind)] = backend;
}

DeviceBackend& device_backend(DeviceKind kind) {
  DeviceBackend* b = g_backends[static_cast<int>(kind)];
  TAPER_CHECK(b != nullptr, "device ", Device(kind, 0).to_string(),
              ": taper was built without this backend (or no device is present)");
  return *b;
}

bool device_available(DeviceKind kind) { return device_count(kind) > 0; }

int device_count(DeviceKind kind) {
  DeviceBackend* b = g_backends[static_cast<int>(kind)];
  return b ? b->device_count() : 0;
}

void synchronize(Device dev) { device_backend(dev.kind()).synchronize(dev); }

namespace {
std::atomic<bool> g_allow_tf32{false};
}
bool cuda_allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }
void set_cuda_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }

}  // namespace taper
