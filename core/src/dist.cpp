// dist.cpp: the environment, the TCP rendezvous, the TCP process group, and the choice of a
// backend (NCCL is registered by the CUDA backend, cuda/nccl.cpp).
//
// The rendezvous is a star: rank 0 listens on MASTER_ADDR:MASTER_PORT and every other rank
// connects and says hello (a magic word, its rank and the world size it was given); rank 0
// answers once every rank is in, so a mismatch (two ranks 1, a world size that differs) is an
// Error on every rank instead of a hang. The TCP group reduces through the same star: rank 0
// receives every rank's tensor, sums in rank order in the compute type (f32 for bf16/f16/f32,
// f64 for f64, the integer type itself for integers), rounds once and sends the result back, so
// every rank holds the same bits.
#include "taper/dist.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "taper/error.h"
#include "taper/portable.h"

namespace taper::dist {

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kMagic = 0x54505231;  // "TPR1"

std::optional<long long> env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v, &end, 10);
  TAPER_CHECK(errno == 0 && end != v && *end == '\0', "dist: environment variable ", name, "='",
              v, "' is not an integer");
  return x;
}

std::string sys_error() { return std::strerror(errno); }

/// "0.3", "300": a timeout for a message.
std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// The IPv4 address of `host` (a name or dotted quad).
sockaddr_in resolve(const std::string& host, int port, int rank) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  TAPER_CHECK(rc == 0 && res != nullptr, "dist: rank ", rank, ": cannot resolve MASTER_ADDR '",
              host, "': ", gai_strerror(rc));
  sockaddr_in a = *reinterpret_cast<const sockaddr_in*>(res->ai_addr);
  freeaddrinfo(res);
  a.sin_port = htons(static_cast<uint16_t>(port));
  return a;
}

/// No Nagle delay (small messages go at once), and a send that cannot progress for
/// `timeout_s` fails (EAGAIN) instead of blocking for ever.
void tune_socket(int fd, double timeout_s) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const double t = std::clamp(timeout_s, 0.0, 1.0e6);
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(t);
  tv.tv_usec = static_cast<suseconds_t>((t - static_cast<double>(tv.tv_sec)) * 1e6);
  if (tv.tv_sec == 0 && tv.tv_usec == 0) tv.tv_usec = 1000;
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

/// Waits until `fd` is readable (or writable); false on timeout.
bool wait_fd(int fd, short events, double timeout_s) {
  pollfd p{fd, events, 0};
  for (;;) {
    const int ms = static_cast<int>(std::min(timeout_s, 2.0e6) * 1000.0);
    const int rc = poll(&p, 1, ms);
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return false;
  }
}

struct Hello {
  uint32_t magic;
  int32_t rank;
  int32_t world_size;
};

}  // namespace

// ---- Env ---------------------------------------------------------------------------------------

bool Env::launched() { return std::getenv("WORLD_SIZE") != nullptr; }

Env Env::from_environment() {
  Env e;
  const auto world = env_int("WORLD_SIZE");
  if (!world) return e;
  TAPER_CHECK(*world >= 1 && *world <= 65536, "dist: WORLD_SIZE=", *world,
              " is out of range [1, 65536]");
  e.world_size = static_cast<int>(*world);
  const auto rank = env_int("RANK");
  TAPER_CHECK(rank || e.world_size == 1, "dist: WORLD_SIZE=", e.world_size,
              " but RANK is not set (a launcher sets both)");
  e.rank = rank ? static_cast<int>(*rank) : 0;
  TAPER_CHECK(e.rank >= 0 && e.rank < e.world_size, "dist: RANK=", e.rank,
              " is out of range for WORLD_SIZE=", e.world_size);
  const auto local = env_int("LOCAL_RANK");
  e.local_rank = local ? static_cast<int>(*local) : e.rank;
  TAPER_CHECK(e.local_rank >= 0, "dist: LOCAL_RANK=", e.local_rank, " is negative");
  if (const char* a = std::getenv("MASTER_ADDR"); a != nullptr && *a != '\0') e.master_addr = a;
  const auto port = env_int("MASTER_PORT");
  TAPER_CHECK(port || e.world_size == 1, "dist: WORLD_SIZE=", e.world_size,
              " but MASTER_PORT is not set");
  if (port) {
    TAPER_CHECK(*port >= 1 && *port <= 65535, "dist: MASTER_PORT=", *port,
                " is out of range [1, 65535]");
    e.master_port = static_cast<int>(*port);
  }
  return e;
}

std::string_view backend_name(Backend b) {
  switch (b) {
    case Backend::Auto: return "auto";
    case Backend::Nccl: return "nccl";
    case Backend::Tcp: break;
  }
  return "tcp";
}

void ProcessGroup::all_reduce(const Tensor& t, ReduceOp op) { all_reduce_async(t, op)->wait(); }

// ---- Rendezvous ----------------------------------------------------------------------------------

Rendezvous::Rendezvous(const Env& env, double timeout_s) : env_(env), timeout_s_(timeout_s) {
  TAPER_CHECK(env.world_size >= 1 && env.rank >= 0 && env.rank < env.world_size,
              "dist: rendezvous: rank ", env.rank, " of world size ", env.world_size,
              " is out of range");
  if (env.world_size == 1) return;  // nobody to meet
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  const sockaddr_in addr = resolve(env.master_addr, env.master_port, env.rank);
  const auto t0 = Clock::now();
  if (env.rank == 0) {
    const int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    TAPER_CHECK(lfd >= 0, "dist: rank 0: socket(): ", sys_error());
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(lfd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
      const std::string err = sys_error();
      close(lfd);
      throw Error("dist: rank 0 cannot listen on " + where + " (MASTER_ADDR:MASTER_PORT): " + err);
    }
    TAPER_CHECK(listen(lfd, 128) == 0, "dist: rank 0: listen() on ", where, ": ", sys_error());
    fds_.assign(static_cast<size_t>(env.world_size), -1);
    int joined = 1;
    std::string failure;
    while (joined < env.world_size && failure.empty()) {
      const double left = timeout_s - seconds_since(t0);
      if (left <= 0 || !wait_fd(lfd, POLLIN, left)) {
        std::string missing;
        for (int r = 1; r < env.world_size; ++r)
          if (fds_[r] < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        failure = "dist: rendezvous: rank 0 waited " + seconds(timeout_s) +
                  " s on " + where + " for rank(s) " + missing + " of world size " +
                  std::to_string(env.world_size);
        break;
      }
      const int fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      tune_socket(fd, timeout_s);
      Hello h{};
      if (!wait_fd(fd, POLLIN, std::min(10.0, std::max(0.01, left))) || recv(fd, &h, sizeof h, MSG_WAITALL) != sizeof h ||
          h.magic != kMagic) {
        close(fd);  // not one of ours (a port scan, a stale process): ignore it
        continue;
      }
      if (h.world_size != env.world_size) {
        failure = "dist: rendezvous: rank " + std::to_string(h.rank) + " has WORLD_SIZE=" +
                  std::to_string(h.world_size) + ", rank 0 has " + std::to_string(env.world_size);
      } else if (h.rank < 1 || h.rank >= env.world_size || fds_[h.rank] >= 0) {
        failure = "dist: rendezvous: two processes joined as rank " + std::to_string(h.rank) +
                  " (or it is out of range) of world size " + std::to_string(env.world_size);
      }
      if (!failure.empty()) {
        close(fd);
        break;
      }
      fds_[h.rank] = fd;
      ++joined;
    }
    close(lfd);
    // The answer: 1 = go, 0 = the rendezvous failed (the message is rank 0's).
    const uint8_t go = failure.empty() ? 1 : 0;
    for (int r = 1; r < env.world_size; ++r)
      if (fds_[r] >= 0) (void)send(fds_[r], &go, 1, MSG_NOSIGNAL);
    if (!failure.empty()) {
      for (int fd : fds_)
        if (fd >= 0) close(fd);
      fds_.clear();
      throw Error(failure);
    }
    return;
  }
  // Ranks > 0: connect, retrying while rank 0 is not listening yet.
  int fd = -1;
  for (;;) {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    TAPER_CHECK(fd >= 0, "dist: rank ", env.rank, ": socket(): ", sys_error());
    if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) break;
    const std::string err = sys_error();
    close(fd);
    TAPER_CHECK(seconds_since(t0) < timeout_s, "dist: rendezvous: rank ", env.rank,
                " could not reach rank 0 at ", where, " within ", timeout_s, " s (", err, ")");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  tune_socket(fd, timeout_s);
  fds_ = {fd};
  const Hello h{kMagic, env.rank, env.world_size};
  send_all(fd, &h, sizeof h, 0, "rendezvous");
  uint8_t go = 0;
  const double left = std::max(1.0, timeout_s - seconds_since(t0));
  if (!wait_fd(fd, POLLIN, left) || recv(fd, &go, 1, MSG_WAITALL) != 1 || go != 1) {
    close(fd);
    fds_.clear();
    throw Error("dist: rendezvous: rank " + std::to_string(env.rank) + " was refused by rank 0 at " +
                where + " (rank 0's error says why: a duplicate rank, a world-size mismatch or a "
                "rank that never came)");
  }
}

Rendezvous::~Rendezvous() {
  for (int fd : fds_)
    if (fd >= 0) close(fd);
}

void Rendezvous::send_all(int fd, const void* p, size_t n, int peer, const char* call) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      throw Error("dist: " + std::string(call) + ": rank " + std::to_string(env_.rank) +
                  " could not send to rank " + std::to_string(peer) + " for " +
                  seconds(timeout_s_) + " s (is it stuck?)");
    if (k <= 0)
      throw Error("dist: " + std::string(call) + ": rank " + std::to_string(env_.rank) +
                  " lost the connection to rank " + std::to_string(peer) + " (" + sys_error() +
                  ")");
    c += k;
    n -= static_cast<size_t>(k);
  }
}

void Rendezvous::recv_all(int fd, void* p, size_t n, int peer, const char* call) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    if (!wait_fd(fd, POLLIN, timeout_s_))
      throw Error("dist: " + std::string(call) + ": rank " + std::to_string(env_.rank) +
                  " waited " + seconds(timeout_s_) + " s for rank " +
                  std::to_string(peer));
    const ssize_t k = recv(fd, c, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0)
      throw Error("dist: " + std::string(call) + ": rank " + std::to_string(env_.rank) +
                  " lost the connection to rank " + std::to_string(peer) +
                  (k == 0 ? " (it closed it: did that rank fail?)" : " (" + sys_error() + ")"));
    c += k;
    n -= static_cast<size_t>(k);
  }
}

void Rendezvous::broadcast_bytes(void* bytes, size_t n, const char* call) {
  if (env_.world_size == 1) return;
  if (env_.rank == 0) {
    for (int r = 1; r < env_.world_size; ++r) send_all(fds_[r], bytes, n, r, call);
  } else {
    recv_all(fds_[0], bytes, n, 0, call);
  }
}

void Rendezvous::send_to_root(const void* bytes, size_t n, const char* call) {
  TAPER_ASSERT(env_.rank != 0);
  send_all(fds_[0], bytes, n, 0, call);
}

void Rendezvous::recv_from(int peer, void* bytes, size_t n, const char* call) {
  if (env_.rank == 0) {
    TAPER_ASSERT(peer >= 1 && peer < env_.world_size);
    recv_all(fds_[peer], bytes, n, peer, call);
  } else {
    TAPER_ASSERT(peer == 0);
    recv_all(fds_[0], bytes, n, 0, call);
  }
}

void Rendezvous::send_to(int peer, const void* bytes, size_t n, const char* call) {
  TAPER_ASSERT(env_.rank == 0 && peer >= 1 && peer < env_.world_size);
  send_all(fds_[peer], bytes, n, peer, call);
}

void Rendezvous::barrier(const char* call) {
  if (env_.world_size == 1) return;
  uint8_t b = 1;
  if (env_.rank == 0) {
    for (int r = 1; r < env_.world_size; ++r) recv_all(fds_[r], &b, 1, r, call);
    for (int r = 1; r < env_.world_size; ++r) send_all(fds_[r], &b, 1, r, call);
  } else {
    send_all(fds_[0], &b, 1, 0, call);
    recv_all(fds_[0], &b, 1, 0, call);
  }
}

void Rendezvous::all_gather_bytes(const void* mine, size_t n, void* all, const char* call) {
  unsigned char* out = static_cast<unsigned char*>(all);
  if (n > 0) std::memcpy(out + n * static_cast<size_t>(env_.rank), mine, n);
  if (env_.world_size == 1) return;
  if (env_.rank == 0) {
    for (int r = 1; r < env_.world_size; ++r) recv_all(fds_[r], out + n * r, n, r, call);
  } else {
    send_all(fds_[0], mine, n, 0, call);
  }
  broadcast_bytes(out, n * static_cast<size_t>(env_.world_size), call);
}

// ---- ProcessGroup ---------------------------------------------------------------------------------

ProcessGroup::ProcessGroup(std::unique_ptr<Rendezvous> rv) : rv_(std::move(rv)) {
  TAPER_ASSERT(rv_ != nullptr);
}
ProcessGroup::~ProcessGroup() = default;

void ProcessGroup::check_tensor(const Tensor& t, const char* call) const {
  TAPER_CHECK(t.defined(), "dist: ", call, ": the tensor is undefined (rank ", rank(), ")");
  TAPER_CHECK(t.device() == device(), "dist: ", call, ": the tensor ", t.shape().to_string(), " ",
              dtype_name(t.dtype()), " is on ", t.device().to_string(), ", the group's device is ",
              device().to_string(), " (rank ", rank(), ")");
  TAPER_CHECK(t.is_contiguous(), "dist: ", call, ": needs a contiguous tensor, got shape ",
              t.shape().to_string(), " ", dtype_name(t.dtype()),
              " with strides that are not (rank ", rank(), ")");
}

void ProcessGroup::check_root(int root, const char* call) const {
  TAPER_CHECK(root >= 0 && root < world_size(), "dist: ", call, ": root ", root,
              " is out of range for world size ", world_size());
}
int ProcessGroup::rank() const { return rendezvous().rank(); }
int ProcessGroup::world_size() const { return rendezvous().world_size(); }

std::vector<unsigned char> ProcessGroup::host_all_gather(const void* mine, size_t n,
                                                         const char* call) {
  std::vector<unsigned char> all(n * static_cast<size_t>(world_size()));
  std::lock_guard<std::mutex> lock(mu_);
  rendezvous().all_gather_bytes(mine, n, all.data(), call);
  return all;
}

// ---- the TCP group ---------------------------------------------------------------------------------

namespace {

/// Every rank's tensor meets on rank 0's host.
class TcpGroup final : public ProcessGroup {
 public:
  TcpGroup(std::unique_ptr<Rendezvous> rv, Device dev) : ProcessGroup(std::move(rv)), dev_(dev) {}
  Backend backend() const override { return Backend::Tcp; }
  Device device() const override { return dev_; }

  std::unique_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) override {
    check_tensor(t, "all_reduce");
    std::lock_guard<std::mutex> lock(socket_mutex());
    if (world_size() > 1 || op == ReduceOp::Avg) {
      std::vector<unsigned char> mine = read(t);
      visit_dtype(t.dtype(), [&](auto tag) { reduce<decltype(tag)>(mine, t.elem_count(), op); });
      write(t, mine);
    }
    return std::make_unique<Done>();
  }

  void broadcast(const Tensor& t, int root) override {
    check_tensor(t, "broadcast");
    check_root(root, "broadcast");
    if (world_size() == 1) return;
    std::lock_guard<std::mutex> lock(socket_mutex());
    std::vector<unsigned char> buf = read(t);
    const size_t n = buf.size();
    // Through rank 0: the root sends its bytes there first.
    if (root != 0) {
      if (rank() == root) rendezvous().send_to_root(buf.data(), n, "broadcast");
      if (rank() == 0) rendezvous().recv_from(root, buf.data(), n, "broadcast");
    }
    rendezvous().broadcast_bytes(buf.data(), n, "broadcast");
    if (rank() != root) write(t, buf);
  }

  void barrier() override {
    synchronize(dev_);
    std::lock_guard<std::mutex> lock(socket_mutex());
    rendezvous().barrier("barrier");
  }

 private:
  struct Done final : Work {
    void wait() override {}
  };

  std::vector<unsigned char> read(const Tensor& t) const {
    std::vector<unsigned char> b(t.elem_count() * dtype_size(t.dtype()));
    if (!b.empty()) t.copy_to_host(b.data(), t.dtype());
    return b;
  }

  static void write(const Tensor& t, const std::vector<unsigned char>& b) {
    if (b.empty()) return;
    if (t.device().is_cpu()) {
      std::memcpy(t.data_ptr(), b.data(), b.size());
    } else {
      device_backend(t.device().kind()).copy_from_host(t.device(), t.data_ptr(), b.data(), b.size());
    }
  }

  /// Rank 0 sums every rank's values in rank order in C, rounds once, and sends the result
  /// to every rank; the others send theirs and receive it.
  template <class T> void reduce(std::vector<unsigned char>& mine, size_t n, ReduceOp op) {
    const size_t bytes = n * sizeof(T);
    if (rank() != 0) {
      rendezvous().send_to_root(mine.data(), bytes, "all_reduce");
      rendezvous().recv_from(0, mine.data(), bytes, "all_reduce");
      return;
    }
    using C = std::conditional_t<std::is_floating_point_v<T> || is_half_v<T>, compute_t<T>, T>;
    std::vector<C> acc(n);
    const T* x = reinterpret_cast<const T*>(mine.data());
    for (size_t i = 0; i < n; ++i) acc[i] = static_cast<C>(x[i]);
    std::vector<unsigned char> peer(bytes);
    for (int r = 1; r < world_size(); ++r) {
      rendezvous().recv_from(r, peer.data(), bytes, "all_reduce");
      const T* y = reinterpret_cast<const T*>(peer.data());
      for (size_t i = 0; i < n; ++i) acc[i] = static_cast<C>(acc[i] + static_cast<C>(y[i]));
    }
    T* out = reinterpret_cast<T*>(mine.data());
    const C w = static_cast<C>(world_size());
    for (size_t i = 0; i < n; ++i) {
      const C v = op == ReduceOp::Avg ? static_cast<C>(acc[i] / w) : acc[i];
      if constexpr (std::is_floating_point_v<T> || is_half_v<T>) out[i] = round_to<T>(v);
      else out[i] = v;
    }
    for (int r = 1; r < world_size(); ++r) rendezvous().send_to(r, mine.data(), bytes, "all_reduce");
  }

  Device dev_;
};

std::mutex g_factories_mu;
std::map<Backend, GroupFactory>& factories() {
  static std::map<Backend, GroupFactory> f;
  return f;
}

}  // namespace

void register_group_backend(Backend backend, GroupFactory factory) {
  std::lock_guard<std::mutex> lock(g_factories_mu);
  factories()[backend] = std::move(factory);
}

std::shared_ptr<ProcessGroup> init_process_group(const Options& opts) {
  Backend b = opts.backend;
  if (b == Backend::Auto) {
    const bool gpu = opts.device ? opts.device->is_cuda() : device_available(DeviceKind::Cuda);
    b = gpu ? Backend::Nccl : Backend::Tcp;
  }
  const Device dev = opts.device ? *opts.device
                     : b == Backend::Nccl ? Device::cuda(opts.env.local_rank)
                                          : Device::cpu();
  GroupFactory factory;
  if (b == Backend::Nccl) {
    std::lock_guard<std::mutex> lock(g_factories_mu);
    const auto it = factories().find(Backend::Nccl);
    TAPER_CHECK(it != factories().end(), "dist: init_process_group: the NCCL backend needs "
                "taper's CUDA backend, and this build has none (rank ", opts.env.rank, ")");
    factory = it->second;
    TAPER_CHECK(dev.is_cuda(), "dist: init_process_group: NCCL reduces GPU tensors, the device "
                "given is ", dev.to_string());
    TAPER_CHECK(dev.ordinal() < device_count(DeviceKind::Cuda), "dist: rank ", opts.env.rank,
                ": LOCAL_RANK ", dev.ordinal(), " names ", dev.to_string(), " but this host has ",
                device_count(DeviceKind::Cuda), " GPU(s)");
  }
  auto rv = std::make_unique<Rendezvous>(opts.env, opts.timeout_s);
  if (factory) return factory(std::move(rv), dev);
  return std::make_shared<TcpGroup>(std::move(rv), dev);
}

}  // namespace taper::dist
