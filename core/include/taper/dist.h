// dist.h: `taper::dist`, the communication of data-parallel training: one process per device,
// a process group over NCCL (CUDA tensors) or over TCP (tensors anywhere, reduced on the host),
// set up from the environment torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT) through a small TCP rendezvous on MASTER_ADDR:MASTER_PORT, so several hosts join
// the same way as one.
//
// What it is: all_reduce (sum, average), broadcast and barrier on whole tensors, the same bits on
// every rank. NCCL is loaded when the first NCCL group is made (TAPER_NCCL_LIBRARY, else the
// library path, the folder CMake found it in, Python's nvidia/nccl/lib: cuda/nccl.cu), so a
// program that never uses it does not need it. NVLink multicast stays off: NCCL_NVLS_ENABLE=0 is
// set before a communicator is made unless the user set it. The rendezvous, the TCP group and
// NCCL's barrier() wait at most Options::timeout_s: a rank that never comes or stops answering
// is an Error, not a hang (an NCCL collective's kernel itself is NCCL's to time out).
// What it is not: the gradient bucketing of data parallelism (nn/ddp.h) or a launcher
// (`finetune --nproc N` starts N processes of itself).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "taper/device.h"
#include "taper/tensor.h"

namespace taper::dist {

/// Who this process is among the others, as torchrun's variables say.
struct Env {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  ///< the GPU index on this host (LOCAL_RANK; RANK when unset)
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  /// Reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT. With WORLD_SIZE unset it is
  /// one process (rank 0 of 1). Error naming the variable when one is malformed, out of range,
  /// or when WORLD_SIZE > 1 and RANK or MASTER_PORT is missing.
  static Env from_environment();
  /// Whether WORLD_SIZE is set in the environment (a launcher started this process).
  static bool launched();
};

/// How a group moves data. Auto: NCCL when the group's device is a GPU, else TCP.
enum class Backend { Auto, Nccl, Tcp };
/// "auto", "nccl", "tcp".
std::string_view backend_name(Backend b);

/// Sum, or the sum divided by the world size (computed once per element, then rounded).
enum class ReduceOp { Sum, Avg };

/// A collective in flight: `wait()` orders everything queued after it on the device behind the
/// collective (on a GPU the host does not wait) and raises the collective's error, if any.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};

class Rendezvous;

/// The ranks of one job. Every rank calls the same collectives in the same order, on tensors of
/// the same shape and dtype on the group's device. Tensors are updated in place and must be
/// contiguous (an Error names the call otherwise).
class ProcessGroup {
 public:
  explicit ProcessGroup(std::unique_ptr<Rendezvous> rv);
  virtual ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;
  int rank() const;
  int world_size() const;
  virtual Backend backend() const = 0;
  /// The device whose tensors the group reduces (cuda:LOCAL_RANK for NCCL).
  virtual Device device() const = 0;

  /// Starts `t <- op over ranks of t` and returns at once where the backend can overlap it
  /// (NCCL: on a stream of its own, after the work queued for `t`'s device so far). Keep `t`
  /// alive and unread until the Work's wait().
  virtual std::unique_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) = 0;
  /// all_reduce_async(t, op)->wait().
  void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::Sum);
  /// `t <- rank root's t` on every rank.
  virtual void broadcast(const Tensor& t, int root = 0) = 0;
  /// Returns once every rank has entered it (and the device's queued work before it is done).
  virtual void barrier() = 0;

  /// Every rank's `n` bytes in rank order (n * world_size bytes), through the rendezvous's
  /// connections: no device work and no device sync. For small agreements between the ranks'
  /// hosts (whether the models match, which parameters a step used); `n` must be the same on
  /// every rank.
  std::vector<unsigned char> host_all_gather(const void* mine, size_t n, const char* call);

 protected:
  Rendezvous& rendezvous() const { return *rv_; }
  /// The contract every collective checks first: `t` defined, on device(), contiguous. Error
  /// naming the call, the tensor and the rank.
  void check_tensor(const Tensor& t, const char* call) const;
  /// broadcast's root is a rank of the group, or an Error naming it.
  void check_root(int root, const char* call) const;
  /// Held while a call uses the rendezvous's sockets (one message at a time on them).
  std::mutex& socket_mutex() const { return mu_; }

 private:
  std::unique_ptr<Rendezvous> rv_;
  mutable std::mutex mu_;
};

struct Options {
  Backend backend = Backend::Auto;
  Env env = Env::from_environment();
  /// The device of the group. Default: cuda:LOCAL_RANK for NCCL (and Auto with a GPU present),
  /// else the CPU.
  std::optional<Device> device;
  /// Seconds the rendezvous waits for the other ranks, and a TCP collective for a peer.
  double timeout_s = 300;
};

/// Joins the job: rank 0 listens on MASTER_ADDR:MASTER_PORT, the others connect (retrying until
/// the timeout), then the backend sets itself up (NCCL: rank 0's unique id goes to every rank).
/// Error naming the rank and the address on a timeout, a world-size mismatch or a refused port.
std::shared_ptr<ProcessGroup> init_process_group(const Options& opts = {});

// ---- for backends ----------------------------------------------------------------------------

/// The connections of a job after the rendezvous: rank 0 holds one socket per other rank, the
/// others one socket to rank 0 (a star; small messages only, plus the TCP backend's data).
class Rendezvous {
 public:
  Rendezvous(const Env& env, double timeout_s);
  ~Rendezvous();
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;
  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  const Env& env() const { return env_; }
  /// Rank 0's `bytes` to every rank (the others pass a buffer of the same size).
  void broadcast_bytes(void* bytes, size_t n, const char* call);
  /// Rank 0: receives `n` bytes from rank `peer` (1..world-1). Others: sends them to rank 0.
  void send_to_root(const void* bytes, size_t n, const char* call);
  void recv_from(int peer, void* bytes, size_t n, const char* call);
  /// Rank 0: sends `n` bytes to rank `peer`.
  void send_to(int peer, const void* bytes, size_t n, const char* call);
  /// Every rank waits for every other.
  void barrier(const char* call);
  /// Every rank's `n` bytes in rank order into `all` (n * world_size bytes) on every rank.
  void all_gather_bytes(const void* mine, size_t n, void* all, const char* call);
  double timeout_s() const { return timeout_s_; }

 private:
  void send_all(int fd, const void* p, size_t n, int peer, const char* call);
  void recv_all(int fd, void* p, size_t n, int peer, const char* call);
  Env env_;
  double timeout_s_;
  std::vector<int> fds_;  ///< rank 0: fds_[r] for r >= 1; others: fds_[0] (to rank 0)
};

/// Makes a group of `backend` on `dev` over a finished rendezvous (registered by the backend
/// that provides it: the CUDA backend registers NCCL).
using GroupFactory = std::function<std::shared_ptr<ProcessGroup>(std::unique_ptr<Rendezvous>, Device)>;
/// Registers (or replaces) the factory of `backend`.
void register_group_backend(Backend backend, GroupFactory factory);

}  // namespace taper::dist
