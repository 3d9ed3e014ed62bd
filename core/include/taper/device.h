// device.h: `Device` (kind + ordinal) and the backend interface a device plugs in.
//
// What it is: the per-device services storage needs (raw allocation, copies, memset, synchronize,
// device count). CPU is always present; the CUDA backend registers itself when built.
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

/// What a device gives storage, and nothing else: raw allocation (the per-device caching
/// allocator of storage.h sits on top of it), copies host <-> device and device <-> device,
/// memset, synchronize and the number of devices. Work may be queued asynchronously on the
/// device's stream: `synchronize` waits for it; copies to the host wait before returning; a
/// block freed and reused on the same device needs no synchronisation (stream order).
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  /// Devices of this kind present (0 when the backend is built but no device exists).
  virtual int device_count() const = 0;
  /// Allocates `nbytes` (at least 64-byte aligned) uncached; nullptr when out of memory (the
  /// caching allocator then empties its cache and retries before raising an Error).
  virtual void* raw_allocate(Device dev, size_t nbytes) = 0;
  virtual void raw_free(Device dev, void* p) = 0;
  /// Free bytes on the device, for out-of-memory messages (0 when unknown).
  virtual size_t free_bytes(Device dev) const { return 0; }
  virtual void copy_from_host(Device dev, void* dst, const void* src, size_t nbytes) = 0;
  virtual void copy_to_host(Device dev, void* dst, const void* src, size_t nbytes) = 0;
  /// A copy between two devices of this kind (the same one, or two ordinals): never staged
  /// through the host when the device can copy directly.
  virtual void copy_device(Device dst_dev, void* dst, Device src_dev, const void* src,
                           size_t nbytes) = 0;
  virtual void memset(Device dev, void* dst, int byte, size_t nbytes) = 0;
  virtual void synchronize(Device dev) = 0;
  /// Whether the host reads and writes this device's memory directly (the CPU): the caching
  /// allocator's stray-write guard needs that.
  virtual bool host_accessible() const { return false; }

  /// Graph capture (taper::cuda::Graph): from begin_capture, the work queued on `dev` is
  /// recorded instead of run; end_capture returns the recording, ready to replay (an opaque
  /// handle), or throws an Error naming what broke it. replay queues it once more; destroy_graph
  /// frees it (never throws). The defaults throw: a device that cannot capture says so.
  virtual void begin_capture(Device dev);
  virtual void* end_capture(Device dev);
  virtual void replay_graph(Device dev, void* graph);
  virtual void destroy_graph(Device dev, void* graph) noexcept;
};

/// Registers the backend of `kind` (called once by each backend at load).
void register_device_backend(DeviceKind kind, DeviceBackend* backend);
/// The backend of `kind`; throws Error when taper was built without it.
DeviceBackend& device_backend(DeviceKind kind);
/// Whether a backend for `kind` is registered and has at least one device.
bool device_available(DeviceKind kind);
/// Devices of `kind` present (0 when taper was built without its backend).
int device_count(DeviceKind kind);
/// Waits for the work queued on `dev` (a no-op on the CPU).
void synchronize(Device dev);

/// Whether CUDA matmuls of f32 may use TF32 tensor cores (10-bit mantissa products). Off by
/// default: f32 means f32 unless the user allows less.
bool cuda_allow_tf32();
void set_cuda_allow_tf32(bool allow);

/// Threads of the CPU backend (its kernels, OpenBLAS and the optimizers' updates):
/// TAPER_NUM_THREADS when set, else the hardware's count. Defined by the CPU backend.
size_t num_threads();
/// Sets them (n >= 1, else an Error); call it between ops, not from inside one.
void set_num_threads(size_t n);

}  // namespace taper
