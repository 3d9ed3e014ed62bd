// device.h: `Device` (kind + ordinal) and the backend interface a device plugs in.
//
// What it is: the per-device services storage needs (allocate, free, copy to/from host,
// synchronize). CPU is always present; the CUDA backend registers itself when built.
// What it is not: kernels (see op.h) or streams' scheduling policy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace taper {

/// The kinds of device taper knows. Kernel slots in the registry are indexed by this.
enum class DeviceKind : uint8_t { Cpu = 0, Cuda = 1 };
inline constexpr int kNumDeviceKinds = 2;

/// A device: a kind and an ordinal (the GPU index for CUDA).
class Device {
 public:
  constexpr Device() = default;
  constexpr Device(DeviceKind kind, int ordinal) : kind_(kind), ordinal_(ordinal) {}
  static constexpr Device cpu() { return Device(DeviceKind::Cpu, 0); }
  static constexpr Device cuda(int ordinal = 0) { return Device(DeviceKind::Cuda, ordinal); }

  DeviceKind kind() const { return kind_; }
  int ordinal() const { return ordinal_; }
  bool is_cpu() const { return kind_ == DeviceKind::Cpu; }
  bool is_cuda() const { return kind_ == DeviceKind::Cuda; }
  bool operator==(const Device& o) const { return kind_ == o.kind_ && ordinal_ == o.ordinal_; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  /// "cpu", "cuda:0"
  std::string to_string() const;

 private:
  DeviceKind kind_ = DeviceKind::Cpu;
  int ordinal_ = 0;
};

/// What a device backend provides to storage. Work may be queued asynchronously: `synchronize`
/// waits for it; copies to the host synchronize before returning.
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  /// Allocates `nbytes` (64-byte aligned) on `dev`; throws Error when out of memory.
  virtual void* allocate(Device dev, size_t nbytes) = 0;
  virtual void deallocate(Device dev, void* p, size_t nbytes) = 0;
  virtual void copy_from_host(Device dev, void* dst, const void* src, size_t nbytes) = 0;
  virtual void copy_to_host(Device dev, void* dst, const void* src, size_t nbytes) = 0;
  virtual void synchronize(Device dev) = 0;
  /// Host threads the backend's kernels use (the CPU backend: its pool and OpenBLAS's).
  virtual size_t num_threads() const { return 1; }
  virtual void set_num_threads(size_t n) { (void)n; }
};

/// Registers the backend of `kind` (called once by each backend at load).
void register_device_backend(DeviceKind kind, DeviceBackend* backend);
/// The backend of `kind`; throws Error when taper was built without it.
DeviceBackend& device_backend(DeviceKind kind);
/// Whether a backend for `kind` is registered and has at least one device.
bool device_available(DeviceKind kind);

/// Threads of the CPU backend (its kernels, OpenBLAS and the optimizers' updates):
/// TAPER_NUM_THREADS when set, else the hardware's count.
size_t num_threads();
/// Sets them (n >= 1, else an Error); call it between ops, not from inside one.
void set_num_threads(size_t n);

}  // namespace taper
