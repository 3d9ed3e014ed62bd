// test_dist.cpp: taper::dist and nn::DistributedDataParallel.
//
// What it is: the environment's parsing (errors name the variable); the TCP rendezvous with
// several ranks as threads of this process on loopback, and its failures (a world-size
// mismatch, a duplicate rank, a rank that never comes, a peer that leaves): each an Error on
// every rank within a short timeout, never a hang; the TCP group's all_reduce (sum, average)
// and broadcast on every float dtype and the integers, against a host sum in rank order in the
// compute type, bit-identical on every rank; DDP's buckets, its averaged gradients over 2 and
// 3 ranks (bit-identical on every rank, equal to the average of the ranks' own gradients), and
// unused parameters (Error on every rank, or zeros); asking for NCCL without a GPU is an Error.
// CudaDist.* runs the NCCL group at world size 1 on cuda:0 (skips where no GPU is present).
// What it is not: a multi-GPU test (one process per GPU, tests/finetune_ddp.sh's CPU form is
// the multi-process one).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "taper/dist.h"
#include "taper/nn/ddp.h"
#include "tests/test_util.h"

namespace taper {
namespace {

using testing::contains;
using testing::error_of;

/// A TCP port of loopback that was free a moment ago.
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

dist::Env env_of(int rank, int world, int port) {
  dist::Env e;
  e.rank = rank;
  e.world_size = world;
  e.local_rank = rank;
  e.master_addr = "127.0.0.1";
  e.master_port = port;
  return e;
}

/// Runs body(i) on one thread per entry of `n`; returns each thread's Error message ("" when
/// it returned normally).
std::vector<std::string> on_threads(int n, const std::function<void(int)>& body) {
  std::vector<std::string> err(static_cast<size_t>(n));
  std::vector<std::thread> ts;
  for (int i = 0; i < n; ++i)
    ts.emplace_back([&, i] {
      try {
        body(i);
      } catch (const std::exception& e) {
        err[static_cast<size_t>(i)] = e.what();
        if (err[static_cast<size_t>(i)].empty()) err[static_cast<size_t>(i)] = "<empty error>";
      }
    });
  for (auto& t : ts) t.join();
  return err;
}

std::shared_ptr<dist::ProcessGroup> tcp_group(int rank, int world, int port, double timeout = 20) {
  dist::Options o;
  o.backend = dist::Backend::Tcp;
  o.env = env_of(rank, world, port);
  o.device = Device::cpu();
  o.timeout_s = timeout;
  return dist::init_process_group(o);
}

/// Sets (or unsets, with nullptr) an environment variable for a scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* v = std::getenv(name)) old_ = v;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::vector<unsigned char> bytes_of(const Tensor& t) {
  std::vector<unsigned char> b(t.elem_count() * dtype_size(t.dtype()));
  if (!b.empty()) t.copy_to_host(b.data(), t.dtype());
  return b;
}

// ---- Env -----------------------------------------------------------------------------------------

TEST(DistEnv, ParsesTorchrunVariables) {
  {
    ScopedEnv w("WORLD_SIZE", nullptr), r("RANK", nullptr);
    const dist::Env e = dist::Env::from_environment();
    EXPECT_EQ(e.rank, 0);
    EXPECT_EQ(e.world_size, 1);
    EXPECT_FALSE(dist::Env::launched());
  }
  ScopedEnv w("WORLD_SIZE", "4"), r("RANK", "2"), l("LOCAL_RANK", "1"), a("MASTER_ADDR", "node7"),
      p("MASTER_PORT", "29511");
  const dist::Env e = dist::Env::from_environment();
  EXPECT_TRUE(dist::Env::launched());
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.master_addr, "node7");
  EXPECT_EQ(e.master_port, 29511);
  ScopedEnv l2("LOCAL_RANK", nullptr);
  EXPECT_EQ(dist::Env::from_environment().local_rank, 2);  // LOCAL_RANK defaults to RANK
}

TEST(DistEnv, MalformedVariablesAreErrorsNamingThem) {
  ScopedEnv w("WORLD_SIZE", "2"), r("RANK", "1"), l("LOCAL_RANK", nullptr), p("MASTER_PORT", "29500");
  auto check = [](const char* name, const char* value, const char* expect) {
    ScopedEnv s(name, value);
    const std::string msg = error_of([] { dist::Env::from_environment(); });
    EXPECT_TRUE(contains(msg, expect)) << name << "=" << (value ? value : "<unset>") << ": " << msg;
  };
  check("WORLD_SIZE", "two", "WORLD_SIZE");
  check("WORLD_SIZE", "0", "WORLD_SIZE");
  check("WORLD_SIZE", "-3", "WORLD_SIZE");
  check("RANK", "2", "RANK=2");
  check("RANK", "x1", "RANK");
  check("RANK", nullptr, "RANK is not set");
  check("LOCAL_RANK", "-1", "LOCAL_RANK");
  check("MASTER_PORT", "70000", "MASTER_PORT");
  check("MASTER_PORT", "80a", "MASTER_PORT");
  check("MASTER_PORT", nullptr, "MASTER_PORT is not set");
  check("WORLD_SIZE", "99999999999999999999", "WORLD_SIZE");
}

// ---- rendezvous ----------------------------------------------------------------------------------

TEST(DistRendezvous, ThreeRanksMeetOnLoopbackAndExchangeBytes) {
  const int port = free_port(), world = 3;
  std::vector<std::vector<unsigned char>> gathered(world);
  std::vector<uint64_t> got(world);
  const auto err = on_threads(world, [&](int r) {
    dist::Rendezvous rv(env_of(r, world, port), 20);
    EXPECT_EQ(rv.rank(), r);
    uint64_t v = r == 0 ? 0x1234567890abcdefull : 0;
    rv.broadcast_bytes(&v, sizeof v, "test");
    got[r] = v;
    const unsigned char mine[2] = {static_cast<unsigned char>(r), static_cast<unsigned char>(10 + r)};
    gathered[r].resize(2 * world);
    rv.all_gather_bytes(mine, 2, gathered[r].data(), "test");
    rv.barrier("test");
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(err[r], "") << "rank " << r;
    EXPECT_EQ(got[r], 0x1234567890abcdefull);
    EXPECT_EQ(gathered[r], (std::vector<unsigned char>{0, 10, 1, 11, 2, 12}));
  }
}

TEST(DistRendezvous, WorldSizeMismatchIsAnErrorOnEveryRank) {
  const int port = free_port();
  const auto err = on_threads(2, [&](int r) {
    dist::Rendezvous rv(env_of(r, r == 0 ? 2 : 3, port), 5);
  });
  EXPECT_TRUE(contains(err[0], "WORLD_SIZE=3") && contains(err[0], "rank 0 has 2")) << err[0];
  EXPECT_TRUE(contains(err[1], "rank 1") && contains(err[1], "refused")) << err[1];
}

TEST(DistRendezvous, DuplicateRankIsAnErrorOnEveryRank) {
  const int port = free_port();
  // Threads 1 and 2 both claim rank 1 of 3.
  const auto err = on_threads(3, [&](int i) {
    dist::Rendezvous rv(env_of(i == 0 ? 0 : 1, 3, port), 3);
  });
  EXPECT_TRUE(contains(err[0], "two processes joined as rank 1")) << err[0];
  for (int i = 1; i < 3; ++i) EXPECT_TRUE(contains(err[i], "rank 1")) << err[i];
}

TEST(DistRendezvous, MissingRanksTimeOutWithAnError) {
  const int port = free_port();
  const std::string r0 = error_of([&] { dist::Rendezvous rv(env_of(0, 3, port), 0.3); });
  EXPECT_TRUE(contains(r0, "rank(s) 1, 2") && contains(r0, "127.0.0.1:" + std::to_string(port)))
      << r0;
  const std::string r1 = error_of([&] { dist::Rendezvous rv(env_of(1, 2, free_port()), 0.3); });
  EXPECT_TRUE(contains(r1, "rank 1 could not reach rank 0")) << r1;
}

// ---- the TCP group ----------------------------------------------------------------------------------

/// Rank r's values of the collective tests.
Tensor rank_values(DType dt, int r, size_t n) {
  if (is_float(dt)) return testing::random_tensor(Shape({n}), dt, 100 + static_cast<uint64_t>(r));
  std::vector<int64_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<int64_t>((i * 7 + static_cast<size_t>(r) * 13) % 50);
  return Tensor::from_vector(v, Shape({n})).to_dtype(dt);
}

/// The contract: sum in rank order in the compute type (f32 for bf16/f16/f32, f64 for f64, the
/// integer itself), divide by the world size for Avg, round once.
template <class T> Tensor host_reduce(const std::vector<Tensor>& xs, bool avg) {
  using C = std::conditional_t<std::is_floating_point_v<T> || is_half_v<T>, compute_t<T>, T>;
  const size_t n = xs[0].elem_count();
  std::vector<C> acc(n, C(0));
  for (size_t r = 0; r < xs.size(); ++r) {
    const std::vector<unsigned char> b = bytes_of(xs[r]);
    const T* x = reinterpret_cast<const T*>(b.data());
    for (size_t i = 0; i < n; ++i)
      acc[i] = r == 0 ? static_cast<C>(x[i]) : static_cast<C>(acc[i] + static_cast<C>(x[i]));
  }
  std::vector<T> out(n);
  for (size_t i = 0; i < n; ++i) {
    const C v = avg ? static_cast<C>(acc[i] / static_cast<C>(xs.size())) : acc[i];
    if constexpr (std::is_floating_point_v<T> || is_half_v<T>) out[i] = round_to<T>(v);
    else out[i] = v;
  }
  Tensor t = Tensor::empty(Shape({n}), dtype_of_v<T>, Device::cpu());
  std::memcpy(t.data_ptr(), out.data(), n * sizeof(T));
  return t;
}

TEST(DistTcp, AllReduceAndBroadcastMatchAHostSumBitIdenticallyOnEveryRank) {
  const int world = 3, port = free_port();
  const size_t n = 1000;
  const std::vector<DType> dtypes = {DType::F32, DType::F64, DType::BF16, DType::F16,
                                     DType::I64, DType::U32, DType::U8};
  // results[r][case]: (dtype, op) cases in order: sum, avg, broadcast from rank 1.
  std::vector<std::vector<Tensor>> results(world);
  const auto err = on_threads(world, [&](int r) {
    auto g = tcp_group(r, world, port);
    EXPECT_EQ(g->rank(), r);
    EXPECT_EQ(g->world_size(), world);
    EXPECT_EQ(g->backend(), dist::Backend::Tcp);
    for (DType dt : dtypes) {
      const Tensor s = rank_values(dt, r, n).contiguous();
      Tensor a = Tensor::empty(s.shape(), dt, Device::cpu());
      std::memcpy(a.data_ptr(), s.data_ptr(), n * dtype_size(dt));
      Tensor b = Tensor::empty(s.shape(), dt, Device::cpu());
      std::memcpy(b.data_ptr(), s.data_ptr(), n * dtype_size(dt));
      Tensor c = Tensor::empty(s.shape(), dt, Device::cpu());
      std::memcpy(c.data_ptr(), s.data_ptr(), n * dtype_size(dt));
      g->all_reduce(a, dist::ReduceOp::Sum);
      g->all_reduce(b, dist::ReduceOp::Avg);
      g->broadcast(c, 1);
      results[r].insert(results[r].end(), {a, b, c});
    }
    g->barrier();
  });
  for (int r = 0; r < world; ++r) ASSERT_EQ(err[r], "") << "rank " << r;
  for (size_t d = 0; d < dtypes.size(); ++d) {
    SCOPED_TRACE(dtype_name(dtypes[d]));
    std::vector<Tensor> xs;
    for (int r = 0; r < world; ++r) xs.push_back(rank_values(dtypes[d], r, n).contiguous());
    const Tensor sum = visit_dtype(dtypes[d], [&](auto tag) { return host_reduce<decltype(tag)>(xs, false); });
    const Tensor avg = visit_dtype(dtypes[d], [&](auto tag) { return host_reduce<decltype(tag)>(xs, true); });
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(bytes_of(results[r][3 * d]), bytes_of(sum)) << "sum, rank " << r;
      EXPECT_EQ(bytes_of(results[r][3 * d + 1]), bytes_of(avg)) << "avg, rank " << r;
      EXPECT_EQ(bytes_of(results[r][3 * d + 2]), bytes_of(xs[1])) << "broadcast, rank " << r;
    }
  }
}

TEST(DistTcp, MisuseIsAnErrorNamingTheCall) {
  auto g = tcp_group(0, 1, free_port());
  const Tensor t = Tensor::randn({4, 3}, DType::F32, Device::cpu(), 1);
  const std::string nc = error_of([&] { g->all_reduce(t.transpose(0, 1)); });
  EXPECT_TRUE(contains(nc, "all_reduce") && contains(nc, "contiguous") && contains(nc, "(3, 4)")) << nc;
  const std::string root = error_of([&] { g->broadcast(t, 1); });
  EXPECT_TRUE(contains(root, "broadcast") && contains(root, "root 1")) << root;
  // World size 1: the collectives are the identity (Avg divides by 1).
  const std::vector<float> before = t.to_vector<float>();
  g->all_reduce(t, dist::ReduceOp::Avg);
  EXPECT_EQ(t.to_vector<float>(), before);
}

TEST(DistTcp, APeerThatLeavesIsAnErrorNotAHang) {
  const int port = free_port();
  const auto err = on_threads(2, [&](int r) {
    auto g = tcp_group(r, 2, port, 2);
    if (r == 1) return;  // leaves: its sockets close
    const Tensor t = Tensor::ones({8}, DType::F32, Device::cpu());
    g->all_reduce(t);
  });
  EXPECT_EQ(err[1], "");
  EXPECT_TRUE(contains(err[0], "all_reduce") && contains(err[0], "rank 0") &&
              contains(err[0], "rank 1"))
      << err[0];
}

TEST(DistNccl, WithoutAGpuIsAnErrorNamingTheRank) {
  if (device_available(DeviceKind::Cuda)) GTEST_SKIP() << "a GPU is present (CudaDist.* runs NCCL)";
  dist::Options o;
  o.backend = dist::Backend::Nccl;
  o.env = env_of(0, 1, free_port());
  const std::string msg = error_of([&] { dist::init_process_group(o); });
  // A build without the CUDA backend, or one with it on a machine without a GPU.
  EXPECT_TRUE(contains(msg, "rank 0") && (contains(msg, "CUDA backend") || contains(msg, "GPU")))
      << msg;
}

// ---- DistributedDataParallel ------------------------------------------------------------------------

/// A small MLP's parameters, the same values for the same seed.
std::vector<std::pair<std::string, Var>> mlp_params(uint64_t seed, Device dev = Device::cpu()) {
  auto p = [&](const Shape& s, uint64_t k) {
    return Var::from_tensor(testing::random_tensor(s, DType::F32, dev, seed * 10 + k, -0.5, 0.5));
  };
  return {{"l1.weight", p(Shape({8, 16}), 1)}, {"l1.bias", p(Shape({16}), 2)},
          {"l2.weight", p(Shape({16, 4}), 3)}, {"l2.bias", p(Shape({4}), 4)}};
}

/// The MLP's loss on rank r's data (`skip_l2_bias`: a step that does not use l2.bias).
Tensor mlp_loss(const std::vector<std::pair<std::string, Var>>& ps, int r, bool skip_l2_bias = false,
                Device dev = Device::cpu()) {
  const Tensor x = testing::random_tensor(Shape({5, 8}), DType::F32, dev, 500 + static_cast<uint64_t>(r));
  Tensor h = (x.matmul(ps[0].second) + ps[1].second).tanh().matmul(ps[2].second);
  if (!skip_l2_bias) h = h + ps[3].second;
  return (h * h).sum_all();
}

TEST(Ddp, BucketsFollowTheSizesInReverseOrder) {
  auto g = tcp_group(0, 1, free_port());
  auto v = [](size_t n, DType dt = DType::F32) { return Var::from_tensor(Tensor::zeros({n}, dt)); };
  std::vector<std::pair<std::string, Var>> ps = {
      {"a", v(10)}, {"b", v(20)}, {"c", v(5)}, {"d", v(100)}, {"e", v(3, DType::F64)}, {"f", v(2, DType::F64)}};
  using Names = std::vector<std::vector<std::string>>;
  // 100 bytes: e+f (40 B f64), d alone (400 B), c+b (100 B), a.
  EXPECT_EQ(nn::DistributedDataParallel(ps, g, nn::DdpOptions().bucket_bytes(100)).bucket_names(),
            (Names{{"f", "e"}, {"d"}, {"c", "b"}, {"a"}}));
  // A dtype change always starts a bucket.
  EXPECT_EQ(nn::DistributedDataParallel(ps, g, nn::DdpOptions().bucket_bytes(1 << 20)).bucket_names(),
            (Names{{"f", "e"}, {"d", "c", "b", "a"}}));
  EXPECT_EQ(nn::DistributedDataParallel(ps, g, nn::DdpOptions().bucket_bytes(0)).bucket_names(),
            (Names{{"f"}, {"e"}, {"d"}, {"c"}, {"b"}, {"a"}}));
}

/// DDP over `world` TCP ranks on the MLP: every rank's averaged gradients must be the same bits,
/// equal to the average (the contract's: f32 sum in rank order, / world, rounded once) of the
/// ranks' own gradients; rank 0's parameters reach every rank.
void check_ddp_average(int world, size_t bucket_bytes) {
  const int port = free_port();
  std::vector<std::vector<Tensor>> own(world), avg(world), params(world);
  std::vector<size_t> n_buckets(world);
  const auto err = on_threads(world, [&](int r) {
    auto g = tcp_group(r, world, port);
    auto ps = mlp_params(1 + static_cast<uint64_t>(r));  // different values: rank 0's must win
    nn::DistributedDataParallel ddp(ps, g, nn::DdpOptions().bucket_bytes(bucket_bytes));
    n_buckets[r] = ddp.bucket_names().size();
    const GradStore mine = mlp_loss(ps, r).backward();
    const GradStore avgd = ddp.backward(mlp_loss(ps, r));
    for (const auto& [name, p] : ps) {
      own[r].push_back(*mine.get(p));
      avg[r].push_back(*avgd.get(p));
      params[r].push_back(p.value());
    }
  });
  for (int r = 0; r < world; ++r) ASSERT_EQ(err[r], "") << "rank " << r;
  EXPECT_GT(n_buckets[0], bucket_bytes < 1000 ? 1u : 0u);
  for (size_t k = 0; k < own[0].size(); ++k) {
    std::vector<Tensor> xs;
    for (int r = 0; r < world; ++r) xs.push_back(own[r][k].contiguous());
    const Tensor want = host_reduce<float>(xs, true);
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(bytes_of(avg[r][k]), bytes_of(want)) << "parameter " << k << ", rank " << r;
      EXPECT_EQ(bytes_of(params[r][k]), bytes_of(params[0][k])) << "parameter " << k << ", rank " << r;
    }
  }
  // The broadcast gave every rank rank 0's initial values.
  const auto p0 = mlp_params(1);
  for (size_t k = 0; k < p0.size(); ++k)
    EXPECT_EQ(bytes_of(params[1][k]), bytes_of(p0[k].second)) << "parameter " << k;
}

TEST(Ddp, TwoRanksAverageGradientsBitIdentically) { check_ddp_average(2, 200); }
TEST(Ddp, ThreeRanksAverageGradientsBitIdentically) { check_ddp_average(3, 1 << 20); }

// A parameter's gradient is freed once it is in its bucket's buffer: beside the buffers, at
// most about a bucket of gradients waits (before, every gradient stayed to the end: twice the
// gradients' bytes at the peak).
TEST(Ddp, GradientsAreFreedOnceInTheirBucket) {
  if (std::getenv("TAPER_NO_ALLOC_CACHE")) GTEST_SKIP() << "sizes differ without the cache";
  const Device cpu = Device::cpu();
  auto g = tcp_group(0, 1, free_port());
  std::vector<std::pair<std::string, Var>> ps;
  for (uint64_t i = 0; i < 4; ++i)  // 256 KiB each; the activations are one row
    ps.emplace_back("w" + std::to_string(i),
                    Var::from_tensor(testing::random_tensor(Shape({256, 256}), DType::F32, cpu,
                                                            900 + i, -0.05, 0.05)));
  const Tensor x = testing::random_tensor(Shape({1, 256}), DType::F32, cpu, 950);
  auto loss = [&] {
    Tensor h = x;
    for (const auto& [name, p] : ps) h = h.matmul(p);
    return (h * h).sum_all();
  };
  nn::DistributedDataParallel ddp(ps, g, nn::DdpOptions().bucket_bytes(1));  // a bucket each
  auto peak_above_start = [&](const std::function<GradStore()>& f) {
    const size_t start = memory_stats(cpu).in_use;
    reset_peak_memory(cpu);
    {
      const GradStore kept = f();
      EXPECT_EQ(kept.size(), 4u);
    }
    return memory_stats(cpu).peak - start;
  };
  const size_t plain = peak_above_start([&] { return loss().backward(); });
  const size_t with_ddp = peak_above_start([&] { return ddp.backward(loss()); });
  const size_t bucket = 256 * 256 * 4;
  EXPECT_LE(with_ddp, plain + 2 * bucket) << "plain backward " << plain << " bytes";
}

TEST(Ddp, UnusedParameterIsAnErrorOnEveryRankNamingIt) {
  const int port = free_port();
  const auto err = on_threads(2, [&](int r) {
    auto g = tcp_group(r, 2, port, 5);
    auto ps = mlp_params(1);
    nn::DistributedDataParallel ddp(ps, g, nn::DdpOptions().bucket_bytes(64));
    ddp.backward(mlp_loss(ps, r, /*skip_l2_bias=*/r == 1));
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(contains(err[r], "'l2.bias' (rank 1)") && contains(err[r], "UnusedParameters::Zeros"))
        << "rank " << r << ": " << err[r];
}

TEST(Ddp, UnusedParameterWithZerosAveragesAZero) {
  const int port = free_port();
  std::vector<Tensor> bias_grad(2), own(2);
  const auto err = on_threads(2, [&](int r) {
    auto g = tcp_group(r, 2, port);
    auto ps = mlp_params(1);
    nn::DistributedDataParallel ddp(ps, g, nn::DdpOptions().unused(nn::UnusedParameters::Zeros));
    const bool skip = r == 1;
    if (!skip) own[r] = *mlp_loss(ps, r).backward().get(ps[3].second);
    bias_grad[r] = *ddp.backward(mlp_loss(ps, r, skip)).get(ps[3].second);
  });
  ASSERT_EQ(err[0], "");
  ASSERT_EQ(err[1], "");
  const Tensor want = host_reduce<float>({own[0], Tensor::zeros({4}, DType::F32)}, true);
  EXPECT_EQ(bytes_of(bias_grad[0]), bytes_of(want));
  EXPECT_EQ(bytes_of(bias_grad[1]), bytes_of(want));
}

TEST(Ddp, ModelsThatDifferAreAnErrorOnEveryRank) {
  const int port = free_port();
  const auto err = on_threads(2, [&](int r) {
    auto g = tcp_group(r, 2, port, 5);
    auto ps = mlp_params(1);
    if (r == 1) ps[1].second = Var::from_tensor(Tensor::zeros({17}, DType::F32));
    nn::DistributedDataParallel ddp(ps, g);
  });
  EXPECT_TRUE(contains(err[0], "rank 0") && contains(err[0], "rank(s) 1")) << err[0];
  EXPECT_TRUE(contains(err[1], "rank 1") && contains(err[1], "rank(s) 0")) << err[1];
}

// ---- NCCL at world size 1 (a GPU machine) -------------------------------------------------------

TEST(CudaDist, NcclWorldSizeOneCollectivesAndDdp) {
  if (!device_available(DeviceKind::Cuda)) GTEST_SKIP() << "no CUDA device: NCCL test skipped";
  const bool nvls_set_before = std::getenv("NCCL_NVLS_ENABLE") != nullptr;
  dist::Options o;
  o.backend = dist::Backend::Nccl;
  o.env = env_of(0, 1, free_port());
  o.timeout_s = 60;
  auto g = dist::init_process_group(o);
  ASSERT_EQ(g->backend(), dist::Backend::Nccl);
  EXPECT_EQ(g->device(), Device::cuda(0));
  EXPECT_EQ(g->rank(), 0);
  EXPECT_EQ(g->world_size(), 1);
  // NVLink multicast stays off unless the user asked for it.
  const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
  ASSERT_NE(nvls, nullptr);
  if (!nvls_set_before) {
    EXPECT_STREQ(nvls, "0");
  }
  for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64, DType::U8}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor host = rank_values(dt, 0, 4099).contiguous();
    const Tensor a = host.to_device(Device::cuda(0));
    const Tensor b = host.to_device(Device::cuda(0));
    g->all_reduce(a, dist::ReduceOp::Sum);
    g->all_reduce(b, dist::ReduceOp::Avg);
    g->broadcast(a, 0);
    EXPECT_EQ(bytes_of(a), bytes_of(host));
    EXPECT_EQ(bytes_of(b), bytes_of(host));
  }
  const Tensor big = Tensor::randn({1 << 20}, DType::F32, Device::cuda(0), 3);
  const std::vector<unsigned char> before = bytes_of(big);
  g->all_reduce_async(big, dist::ReduceOp::Sum)->wait();
  g->barrier();
  EXPECT_EQ(bytes_of(big), before);
  const std::string nc = error_of([&] { g->all_reduce(big.reshape({1024, 1024}).transpose(0, 1)); });
  EXPECT_TRUE(contains(nc, "all_reduce") && contains(nc, "contiguous")) << nc;
  const std::string cpu = error_of([&] { g->all_reduce(Tensor::ones({3}, DType::F32)); });
  EXPECT_TRUE(contains(cpu, "all_reduce") && contains(cpu, "cpu")) << cpu;

  // DDP at world size 1: the averaged gradients are the step's own.
  auto ps = mlp_params(1, Device::cuda(0));
  nn::DistributedDataParallel ddp(ps, g, nn::DdpOptions().bucket_bytes(200));
  const GradStore own = mlp_loss(ps, 0, false, Device::cuda(0)).backward();
  const GradStore avg = ddp.backward(mlp_loss(ps, 0, false, Device::cuda(0)));
  for (const auto& [name, p] : ps) EXPECT_EQ(bytes_of(*avg.get(p)), bytes_of(*own.get(p))) << name;
}

// ---- NCCL over several GPUs (a machine with two or more; skipped elsewhere) -------------------------

/// One rank per GPU, as threads of this process (NCCL takes one communicator per device): the
/// all-reduce against the host's sum (integers exactly; floats within the roundings of a sum in
/// any order: (W - 1) u sum |x|, u of bf16 for bf16, which NCCL rounds at each hop, plus one
/// rounding at the end), every rank the
/// same bits, the broadcast rank 0's; DDP's averaged gradients the same bits on every rank and
/// close to the host's average of the ranks' own.
TEST(CudaDist, NcclAcrossGpusMatchesTheHostSum) {
  const int world = std::min(device_count(DeviceKind::Cuda), 4);
  if (world < 2) GTEST_SKIP() << "fewer than 2 CUDA devices: multi-GPU NCCL test skipped";
  const int port = free_port();
  const std::vector<DType> dtypes = {DType::F32, DType::F64, DType::BF16, DType::I64};
  const size_t n = 100003;
  std::vector<std::vector<Tensor>> sums(world), avgs(world), bcast(world), ddp_grads(world),
      own_grads(world);
  const auto err = on_threads(world, [&](int r) {
    const Device dev = Device::cuda(r);
    dist::Options o;
    o.backend = dist::Backend::Nccl;
    o.env = env_of(r, world, port);
    o.device = dev;
    o.timeout_s = 120;
    auto g = dist::init_process_group(o);
    for (DType dt : dtypes) {
      const Tensor a = rank_values(dt, r, n).contiguous().to_device(dev);
      const Tensor b = rank_values(dt, r, n).contiguous().to_device(dev);
      const Tensor c = rank_values(dt, r, n).contiguous().to_device(dev);
      g->all_reduce(a, dist::ReduceOp::Sum);
      g->all_reduce(b, dist::ReduceOp::Avg);
      g->broadcast(c, 0);
      sums[r].push_back(a.to_device(Device::cpu()));
      avgs[r].push_back(b.to_device(Device::cpu()));
      bcast[r].push_back(c.to_device(Device::cpu()));
    }
    auto ps = mlp_params(1 + static_cast<uint64_t>(r), dev);
    nn::DistributedDataParallel ddp(ps, g, nn::DdpOptions().bucket_bytes(200));
    const GradStore own = mlp_loss(ps, r, false, dev).backward();
    const GradStore avg = ddp.backward(mlp_loss(ps, r, false, dev));
    for (const auto& [name, p] : ps) {
      own_grads[r].push_back(own.get(p)->to_device(Device::cpu()));
      ddp_grads[r].push_back(avg.get(p)->to_device(Device::cpu()));
    }
  });
  for (int r = 0; r < world; ++r) ASSERT_EQ(err[r], "") << "rank " << r;
  auto near = [&](const Tensor& got, const Tensor& want, const std::vector<Tensor>& xs, DType dt,
                  const std::string& what) {
    const std::vector<double> g = testing::values(got), w = testing::values(want);
    std::vector<double> mag(g.size(), 0.0);
    for (const Tensor& x : xs) {
      const std::vector<double> v = testing::values(x);
      for (size_t i = 0; i < v.size(); ++i) mag[i] += std::fabs(v[i]);
    }
    // bf16 on NCCL rounds at each hop: each partial sum is rounded to bf16.
    const double u = dt == DType::F64 ? 0x1p-53 : dt == DType::BF16 ? 0x1p-9 : 0x1p-24;
    const double half_ulp = dt == DType::BF16 ? 0x1p-9 : 0.0;
    for (size_t i = 0; i < g.size(); ++i) {
      const double tol = (world - 1) * u * mag[i] * 1.01 + half_ulp * std::fabs(w[i]);
      ASSERT_LE(std::fabs(g[i] - w[i]), tol) << what << " at " << i;
    }
  };
  for (size_t d = 0; d < dtypes.size(); ++d) {
    const DType dt = dtypes[d];
    SCOPED_TRACE(dtype_name(dt));
    std::vector<Tensor> xs;
    for (int r = 0; r < world; ++r) xs.push_back(rank_values(dt, r, n).contiguous());
    const Tensor want_sum = dt == DType::F64   ? host_reduce<double>(xs, false)
                            : dt == DType::I64 ? host_reduce<int64_t>(xs, false)
                            : dt == DType::BF16 ? host_reduce<bf16>(xs, false)
                                                : host_reduce<float>(xs, false);
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(bytes_of(sums[r][d]), bytes_of(sums[0][d])) << "rank " << r;
      EXPECT_EQ(bytes_of(avgs[r][d]), bytes_of(avgs[0][d])) << "rank " << r;
      EXPECT_EQ(bytes_of(bcast[r][d]), bytes_of(xs[0])) << "rank " << r;
    }
    if (dt == DType::I64)
      EXPECT_EQ(bytes_of(sums[0][d]), bytes_of(want_sum));
    else
      near(sums[0][d], want_sum, xs, dt, "sum");
  }
  for (size_t k = 0; k < ddp_grads[0].size(); ++k) {
    std::vector<Tensor> xs;
    for (int r = 0; r < world; ++r) xs.push_back(own_grads[r][k].contiguous());
    for (int r = 0; r < world; ++r)
      EXPECT_EQ(bytes_of(ddp_grads[r][k]), bytes_of(ddp_grads[0][k])) << "parameter " << k;
    near(ddp_grads[0][k], host_reduce<float>(xs, true), xs, DType::F32, "DDP average");
  }
}

}  // namespace
}  // namespace taper
