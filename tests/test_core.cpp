// test_core.cpp: shapes and views, the registry (coverage, capability, errors), autograd
// (fan-in, detach, no-grad, a 100 000-op chain, graph release), storage, and printing.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <thread>

#include "taper/composed.h"
#include "tests/test_util.h"

namespace taper::testing {
namespace {

Tensor f64(std::vector<double> v, const Shape& s) { return Tensor::from_vector(v, s); }

// ---- views --------------------------------------------------------------------------------------

TEST(Views, TransposeNarrowBroadcastShareStorage) {
  Tensor x = Tensor::arange(0, 12, 1, DType::F32).reshape({3, 4});
  Tensor t = x.t();
  EXPECT_EQ(t.dims(), (std::vector<size_t>{4, 3}));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.storage(), x.storage());
  EXPECT_EQ(t.to_vector<float>(),
            (std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  Tensor n = x.narrow(1, 1, 2);
  EXPECT_EQ(n.to_vector<float>(), (std::vector<float>{1, 2, 5, 6, 9, 10}));
  Tensor b = x.narrow(0, 1, 1).broadcast_as({2, 3, 4});
  EXPECT_EQ(b.strides()[0], 0);
  EXPECT_EQ(b.to_vector<float>()[13], 5.0f);
  EXPECT_EQ(x.unsqueeze(1).dims(), (std::vector<size_t>{3, 1, 4}));
  EXPECT_EQ(x.unsqueeze(-1).squeeze(2).dims(), (std::vector<size_t>{3, 4}));
}

TEST(Views, BroadcastsToIsBroadcastAsRule) {
  EXPECT_TRUE(broadcasts_to(Shape({2, 1, 1, 5}), Shape({2, 3, 4, 5})));
  EXPECT_TRUE(broadcasts_to(Shape({4, 1}), Shape({2, 3, 4, 5})));
  EXPECT_TRUE(broadcasts_to(Shape({}), Shape({2})));
  EXPECT_TRUE(broadcasts_to(Shape({2, 0}), Shape({2, 0})));
  EXPECT_FALSE(broadcasts_to(Shape({2, 3}), Shape({3})));         // more dims
  EXPECT_FALSE(broadcasts_to(Shape({2, 2, 1, 5}), Shape({2, 3, 4, 5})));
  EXPECT_FALSE(broadcasts_to(Shape({2, 4}), Shape({2, 1})));      // one-sided: to's 1 stays
  EXPECT_THROW((void)Tensor::zeros({2, 4}, DType::F32).broadcast_as({2, 1}), Error);
}

TEST(Views, ReshapeIsAViewWhenStridesAllowElseACopy) {
  Tensor x = Tensor::arange(0, 24, 1, DType::F32).reshape({2, 3, 4});
  EXPECT_EQ(x.reshape({6, 4}).storage(), x.storage());
  Tensor p = x.permute({1, 0, 2});  // (3, 2, 4): merging dims 0,1 needs a copy
  Tensor r = p.reshape({6, 4});
  EXPECT_NE(r.storage(), x.storage());
  EXPECT_EQ(r.to_vector<float>(), p.contiguous().to_vector<float>());
  Tensor q = p.reshape({3, 2, 2, 2});  // splitting a dim is always a view
  EXPECT_EQ(q.storage(), x.storage());
  EXPECT_EQ(q.to_vector<float>(), p.contiguous().reshape({3, 2, 2, 2}).to_vector<float>());
}

TEST(Views, ErrorsNameTheOpAndShapes) {
  Tensor x = Tensor::zeros({3, 4}, DType::F32);
  EXPECT_NE(error_of([&] { x.reshape({5}); }).find("reshape"), std::string::npos);
  EXPECT_NE(error_of([&] { x.reshape({5}); }).find("(3, 4)"), std::string::npos);
  EXPECT_NE(error_of([&] { x.narrow(1, 3, 2); }).find("narrow"), std::string::npos);
  EXPECT_NE(error_of([&] { x.transpose(0, 2); }).find("dim 2 out of range"), std::string::npos);
  EXPECT_NE(error_of([&] { x.permute({0, 0}); }).find("permute"), std::string::npos);
  EXPECT_NE(error_of([&] { x.broadcast_as({2, 4}); }).find("broadcast_as"), std::string::npos);
  EXPECT_NE(error_of([&] { x.squeeze(0); }).find("squeeze"), std::string::npos);
}

// ---- errors of ops ------------------------------------------------------------------------------

TEST(Errors, MismatchesGiveTaperErrorsNamingOpShapesAndDTypes) {
  Tensor a = Tensor::ones({2, 3}, DType::F32);
  Tensor b = Tensor::ones({4, 3}, DType::F32);
  Tensor c = Tensor::ones({2, 3}, DType::F64);
  std::string e = error_of([&] { a + b; });
  EXPECT_NE(e.find("add"), std::string::npos) << e;
  EXPECT_NE(e.find("(2, 3)"), std::string::npos) << e;
  EXPECT_NE(e.find("(4, 3)"), std::string::npos) << e;
  e = error_of([&] { a * c; });
  EXPECT_NE(e.find("mul"), std::string::npos) << e;
  EXPECT_NE(e.find("f32"), std::string::npos) << e;
  EXPECT_NE(e.find("f64"), std::string::npos) << e;
  e = error_of([&] { a.matmul(a); });
  EXPECT_NE(e.find("matmul: inner dims differ: (2, 3) x (2, 3)"), std::string::npos) << e;
  e = error_of([&] { a.sum({2}); });
  EXPECT_NE(e.find("sum"), std::string::npos) << e;
  Tensor idx = Tensor::from_vector(std::vector<int64_t>{0, 5}, {2});
  e = error_of([&] { a.index_select(idx, 1); });
  EXPECT_NE(e.find("index_select: index 5 is out of range for dim 1 of size 3"),
            std::string::npos)
      << e;
  e = error_of([&] { Tensor::from_vector(std::vector<float>{1, 2, 3}, {2, 2}); });
  EXPECT_NE(e.find("(2, 2)"), std::string::npos) << e;
  e = error_of([&] { Tensor::ones({2}, DType::U8).exp(); });
  EXPECT_NE(e.find("exp: no kernel for dtype u8 on device cpu"), std::string::npos) << e;
  e = error_of([&] { ops::layer_norm(a, Tensor::ones({4}, DType::F32), Tensor(), 1e-5); });
  EXPECT_NE(e.find("layer_norm: weight (4) must be (3)"), std::string::npos) << e;
  e = error_of([&] { ops::group_norm(Tensor::ones({2, 6, 4}, DType::F32), 4, {}, {}, 1e-5); });
  EXPECT_NE(e.find("group_norm"), std::string::npos) << e;
  e = error_of([&] { Tensor::ones({2}, DType::F32).to_device(Device::cuda(64)).exp(); });
  EXPECT_NE(e.find("cuda"), std::string::npos) << e;
}

// ---- sizes that overflow (issue 15, item 1 and 4) ------------------------------------------------

TEST(Sizes, ElementCountsThatWrapAreErrorsNamingTheOp) {
  const size_t big = size_t{1} << 40;
  std::string e = error_of([&] { Tensor::zeros({big, big}, DType::F32); });
  EXPECT_NE(e.find("(1099511627776, 1099511627776) has more than 2^60 elements"), std::string::npos)
      << e;
  EXPECT_NE(e.find("empty"), std::string::npos) << e;
  const Tensor x = Tensor::ones({4, 3}, DType::F32);
  e = error_of([&] { x.narrow(0, 1, SIZE_MAX); });
  EXPECT_NE(e.find("narrow: start 1 and length 18446744073709551615 are out of range for dim 0"),
            std::string::npos)
      << e;
  e = error_of([&] { Tensor::ones({1}, DType::F32).broadcast_as({size_t{1} << 32, size_t{1} << 32}); });
  EXPECT_NE(e.find("broadcast_as"), std::string::npos) << e;
  EXPECT_NE(e.find("2^60"), std::string::npos) << e;
  // 2 * (2^63 + 2) wraps to 4, the count of the source.
  e = error_of([&] { Tensor::ones({4}, DType::F32).reshape({2, (size_t{1} << 63) + 2}); });
  EXPECT_NE(e.find("reshape"), std::string::npos) << e;
  EXPECT_NE(e.find("2^60"), std::string::npos) << e;
  e = error_of([&] { Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {2, (size_t{1} << 63) + 2}); });
  EXPECT_NE(e.find("from_vector"), std::string::npos) << e;
  // A zero dim makes the count 0 however large the others are.
  EXPECT_EQ(Tensor::zeros({big, big, 0}, DType::F32).elem_count(), 0u);
  // Found by fuzz/fuzz_ops.cpp: no elements, but strides past int64 (UBSan overflow before); a
  // count past 2^64 (a float-to-int cast past its range); groups past int64 with C = 0 (a
  // negative attribute, an assertion); the composed group norm of 0 groups (a division by 0).
  e = error_of([&] {
    Tensor::zeros({0, size_t{1} << 31, size_t{1} << 31, size_t{1} << 31}, DType::F32);
  });
  EXPECT_NE(e.find("strides overflow int64"), std::string::npos) << e;
  e = error_of([&] { Tensor::arange(0, 1e30, 1, DType::F32); });
  EXPECT_NE(e.find("arange"), std::string::npos) << e;
  EXPECT_NE(e.find("2^60"), std::string::npos) << e;
  e = error_of([&] { ops::group_norm(Tensor::zeros({3, 0}, DType::F32), SIZE_MAX, Tensor(), Tensor(), 1e-5); });
  EXPECT_NE(e.find("group_norm"), std::string::npos) << e;
  e = error_of([&] { composed::group_norm(Tensor::ones({2, 3}, DType::F32), 0, Tensor(), Tensor(), 1e-5); });
  EXPECT_NE(e.find("group_norm (composed)"), std::string::npos) << e;
}

TEST(Sizes, HugeAllocationsAreOutOfMemoryErrorsNotHangs) {
  // (Sizes the host could try to map are left out: ASan aborts on those instead of failing.)
  for (const auto& c : {std::pair{(size_t{1} << 61) + 1, DType::F32},
                        std::pair{size_t{1} << 60, DType::F64},
                        std::pair{(size_t{1} << 60) - 1, DType::F64}}) {
    const size_t n = c.first;
    const DType dt = c.second;
    const std::string e = error_of([&] { Tensor::empty({n}, dt, Device::cpu()); });
    EXPECT_TRUE(e.find("out of memory") != std::string::npos || e.find("2^60") != std::string::npos)
        << n << ": " << e;
  }
}

// Issue 15 item 8: clamp with a NaN bound says so; a rank-0 reduction takes dims 0 and -1 only
// (PyTorch's rule).
TEST(Errors, NanClampBoundsAndRankZeroReductionDims) {
  const Tensor x = Tensor::ones({3}, DType::F32);
  const double nan = std::nan("");
  std::string e = error_of([&] { x.clamp(nan, nan); });
  EXPECT_NE(e.find("clamp: a bound is NaN (lo nan, hi nan)"), std::string::npos) << e;
  e = error_of([&] { x.clamp(0.0, nan); });
  EXPECT_NE(e.find("clamp: a bound is NaN"), std::string::npos) << e;
  const Tensor s = Tensor::full(Shape(std::vector<size_t>{}), 2.5, DType::F32, Device::cpu());
  ASSERT_EQ(s.rank(), 0u);
  EXPECT_EQ(s.sum({0}).item(), 2.5);
  EXPECT_EQ(s.sum({-1}).item(), 2.5);
  e = error_of([&] { s.sum({1}); });
  EXPECT_NE(e.find("sum: dim 1 out of range for a rank-0 tensor"), std::string::npos) << e;
  e = error_of([&] { s.max({-2}); });
  EXPECT_NE(e.find("max: dim -2 out of range for a rank-0 tensor"), std::string::npos) << e;
}

// ---- threads ------------------------------------------------------------------------------------

TEST(Threads, PublicSetterChangesTheCountAndRejectsZero) {
  ThreadsGuard guard;
  EXPECT_GE(guard.saved, 1u);
  set_num_threads(3);
  EXPECT_EQ(num_threads(), 3u);
  const Tensor x = Tensor::randn({257, 1031}, DType::F32, Device::cpu(), 5);
  const std::vector<float> three = (x * x).sum({1}).to_vector<float>();
  set_num_threads(1);
  EXPECT_EQ(num_threads(), 1u);
  EXPECT_EQ((x * x).sum({1}).to_vector<float>(), three);  // the same bits on any count
  const std::string e = error_of([] { set_num_threads(0); });
  EXPECT_NE(e.find("set_num_threads"), std::string::npos) << e;
  EXPECT_EQ(num_threads(), 1u);
  const std::string e2 = error_of([] { set_num_threads(SIZE_MAX); });
  EXPECT_NE(e2.find("set_num_threads: need 1 to 4096 threads, got 18446744073709551615"),
            std::string::npos)
      << e2;
  EXPECT_EQ(num_threads(), 1u);  // unchanged
}

// TAPER_NUM_THREADS is read when the pool starts, once per process, so each bad value runs in a
// child process (tests/threads_child.cpp) that prints the Error the pool's first use raises.
TEST(Threads, BadEnvironmentValueIsAnErrorNamingTheVariable) {
  for (const char* bad : {"100000000000000000000", "-3", "0", "4x", "5000"}) {
    const std::string cmd =
        std::string("TAPER_NUM_THREADS=") + bad + " '" + TAPER_THREADS_CHILD + "' 2>&1";
    std::FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[512];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    EXPECT_EQ(pclose(p), 0) << bad << ": " << out;
    EXPECT_NE(out.find(std::string("TAPER_NUM_THREADS: '") + bad + "' is not a thread count"),
              std::string::npos)
        << out;
  }
  const std::string cmd = std::string("TAPER_NUM_THREADS=3 '") + TAPER_THREADS_CHILD + "' 2>&1";
  std::FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[512] = {};
  ASSERT_NE(std::fgets(buf, sizeof buf, p), nullptr);
  EXPECT_NE(pclose(p), 0) << "a good value raises no error: the child exits 1";
  EXPECT_EQ(std::string(buf), "threads: 3\n");
}

// ---- registry -----------------------------------------------------------------------------------

TEST(Registry, EveryEntryHasAForwardAndAGradientCase) {
  const auto& fwd = covered(CaseKind::Forward);
  const auto& grad = covered(CaseKind::Gradient);
  for (size_t i = 0; i < kNumOps; ++i) {
    const OpDef& d = op_def(static_cast<OpId>(i));
    EXPECT_TRUE(fwd[i]) << "op " << d.name << " has no forward test case";
    if (d.differentiable) {
      EXPECT_TRUE(grad[i]) << "op " << d.name << " has no gradient case";
    }
  }
}

TEST(Registry, DifferentiableIffBackwardRule) {
  for (size_t i = 0; i < kNumOps; ++i) {
    const OpDef& d = op_def(static_cast<OpId>(i));
    EXPECT_EQ(d.differentiable, d.bwd != nullptr) << d.name;
  }
}

TEST(Registry, EveryNonViewOpHasACpuKernel) {
  for (size_t i = 0; i < kNumOps; ++i) {
    const OpId op = static_cast<OpId>(i);
    if (op == OpId::reshape || op == OpId::permute || op == OpId::narrow ||
        op == OpId::broadcast_as || op == OpId::to_device)
      continue;
    EXPECT_NE(op_def(op).kernels[0].fn, nullptr) << op_name(op) << " has no CPU kernel";
  }
}

TEST(Registry, KernelCallsAndOpProfileCountDispatches) {
  const Tensor x = Tensor::ones({4, 3}, DType::F32);
  const uint64_t k0 = kernel_calls(DeviceKind::Cpu);
  (void)x.exp().sum_all();
  EXPECT_EQ(kernel_calls(DeviceKind::Cpu) - k0, 2u);
  reset_op_profile();
  set_op_profiling(true);
  (void)x.exp();
  (void)x.exp().tanh();
  set_op_profiling(false);
  (void)x.exp();  // not counted: profiling is off
  std::map<std::string, uint64_t> calls;
  for (const OpProfileRow& r : op_profile()) {
    EXPECT_EQ(r.kind, DeviceKind::Cpu);
    EXPECT_EQ(r.dtype, DType::F32);
    EXPECT_GE(r.seconds, 0.0);
    calls[std::string(op_name(r.op))] += r.calls;
  }
  EXPECT_EQ(calls, (std::map<std::string, uint64_t>{{"exp", 2}, {"tanh", 1}}));
  reset_op_profile();
  EXPECT_TRUE(op_profile().empty());
}

TEST(Registry, ComposedOpsListNamesFusedOps) {
  auto flagged = [](const std::vector<bool>& on) {
    std::vector<std::string> names;
    for (size_t i = 0; i < on.size(); ++i)
      if (on[i]) names.emplace_back(op_name(static_cast<OpId>(i)));
    return names;
  };
  EXPECT_TRUE(flagged(detail::parse_composed_ops("")).empty());
  EXPECT_EQ(flagged(detail::parse_composed_ops("attention_bwd,,attention")),
            (std::vector<std::string>{"attention", "attention_bwd"}));
  const std::vector<std::string> all = flagged(detail::parse_composed_ops("all"));
  EXPECT_NE(std::find(all.begin(), all.end(), "group_norm_bwd"), all.end());
  EXPECT_EQ(std::find(all.begin(), all.end(), "matmul"), all.end());
  const std::string m =
      error_of([] { (void)detail::parse_composed_ops("softmax_last_dim,matmul"); });
  EXPECT_TRUE(contains(m, "TAPER_COMPOSED_OPS") && contains(m, "'matmul'") &&
              contains(m, "composed form")) << m;
  const std::string u = error_of([] { (void)detail::parse_composed_ops("sofmax"); });
  EXPECT_TRUE(contains(u, "'sofmax' is not an op")) << u;
}

// Run by ctest with TAPER_COMPOSED_OPS=softmax_last_dim (tests/CMakeLists.txt): the variable
// sends that op, and no other, to its composed form in every thread.
TEST(Registry, ComposedOpsEnvironmentVariable) {
  const char* e = std::getenv("TAPER_COMPOSED_OPS");
  if (e == nullptr || std::string_view(e) != "softmax_last_dim")
    GTEST_SKIP() << "run with TAPER_COMPOSED_OPS=softmax_last_dim (ctest does)";
  const Tensor x = random_tensor({4, 9}, DType::F32, 1);
  reset_op_profile();
  set_op_profiling(true);
  std::thread([&] { (void)ops::softmax_last_dim(x); }).join();
  (void)ops::log_softmax_last_dim(x);
  set_op_profiling(false);
  std::set<std::string> ran;
  for (const OpProfileRow& r : op_profile()) ran.emplace(op_name(r.op));
  reset_op_profile();
  EXPECT_FALSE(runs_kernel(OpId::softmax_last_dim, Device::cpu(), DType::F32));
  EXPECT_TRUE(has_kernel(OpId::softmax_last_dim, Device::cpu(), DType::F32));
  EXPECT_EQ(ran.count("softmax_last_dim"), 0u);
  EXPECT_EQ(ran.count("exp"), 1u);
  EXPECT_EQ(ran.count("log_softmax_last_dim"), 1u);
}

// The op table's contract on what a kernel returns (n_out + n_saved outputs, the saved ones in
// stat_dtype): dispatch rejects a kernel that breaks it with an Error naming the op.
TEST(Registry, KernelOutputsAreCheckedAgainstTheTable) {
  struct SlotGuard {
    KernelSlot saved = op_def(OpId::rms_norm).kernels[0];
    ~SlotGuard() { op_def(OpId::rms_norm).kernels[0] = saved; }
  } guard;
  static KernelFn original = nullptr;
  original = guard.saved.fn;
  const Tensor x = random_tensor(Shape({3, 8}), DType::F32, 5);
  const Tensor w = random_tensor(Shape({8}), DType::F32, 6);
  EXPECT_EQ(op_def(OpId::rms_norm).n_saved, 1);
  (void)ops::rms_norm(x, w, 1e-5);  // the real kernel keeps the contract

  op_def(OpId::rms_norm).kernels[0].fn = [](const std::vector<Tensor>& in, const OpAttrs& a) {
    std::vector<Tensor> o = original(in, a);
    o[1] = o[1].to_dtype(DType::F64);  // rstd saved in the wrong dtype
    return o;
  };
  std::string e = error_of([&] { (void)ops::rms_norm(x, w, 1e-5); });
  EXPECT_TRUE(contains(e, "rms_norm") && contains(e, "saved output 1 as f64") &&
              contains(e, "says f32"))
      << e;

  op_def(OpId::rms_norm).kernels[0].fn = [](const std::vector<Tensor>& in, const OpAttrs& a) {
    return std::vector<Tensor>{original(in, a)[0]};  // the saved rstd missing
  };
  e = error_of([&] { (void)ops::rms_norm(x, w, 1e-5); });
  EXPECT_TRUE(contains(e, "rms_norm") && contains(e, "returned 1 outputs")) << e;
}

// The attrs column names what each op reads; every op with attributes documents them.
TEST(Registry, TableDocumentsTheAttributesOpsRead) {
  EXPECT_EQ(op_def(OpId::group_norm).attrs, "f0: eps; i0: num_groups");
  EXPECT_EQ(op_def(OpId::div).attrs, "f0: a scalar operand");
  EXPECT_EQ(op_def(OpId::layer_norm).n_saved, 2);
  EXPECT_EQ(op_def(OpId::softmax_last_dim).n_saved, 1);
  EXPECT_EQ(op_def(OpId::matmul).n_saved, 0);
}

TEST(Registry, CapabilityQuery) {
  EXPECT_TRUE(has_kernel(OpId::add, Device::cpu(), DType::F32));
  EXPECT_FALSE(has_kernel(OpId::exp, Device::cpu(), DType::U8));
  // runs_kernel: the kernel is there and the op is not forced to its composed form.
  EXPECT_TRUE(runs_kernel(OpId::softmax_last_dim, Device::cpu(), DType::F32));
  {
    ComposedOnlyGuard only({OpId::softmax_last_dim});
    EXPECT_TRUE(has_kernel(OpId::softmax_last_dim, Device::cpu(), DType::F32));
    EXPECT_FALSE(runs_kernel(OpId::softmax_last_dim, Device::cpu(), DType::F32));
    EXPECT_TRUE(runs_kernel(OpId::add, Device::cpu(), DType::F32));  // no composed form to force
  }
  EXPECT_FALSE(runs_kernel(OpId::exp, Device::cpu(), DType::U8));
  // A CUDA build registers its kernels whether or not a GPU is present; a CPU-only build has none.
#ifdef TAPER_WITH_CUDA
  EXPECT_TRUE(has_kernel(OpId::add, Device::cuda(0), DType::F32));
  EXPECT_TRUE(has_kernel(OpId::matmul, Device::cuda(0), DType::BF16));
  EXPECT_FALSE(has_kernel(OpId::exp, Device::cuda(0), DType::U8));
#else
  EXPECT_FALSE(has_kernel(OpId::add, Device::cuda(0), DType::F32));
#endif
}

// ---- autograd -----------------------------------------------------------------------------------

TEST(Autograd, FanInAccumulates) {
  Var x = Var::from_tensor(f64({1, 2, 3}, {3}));
  Tensor y = x * x + x * 3.0 + x;  // dy/dx = 2x + 4
  GradStore g = y.sum_all().backward();
  ASSERT_TRUE(g.get(x));
  EXPECT_EQ(g.get(x)->to_vector<double>(), (std::vector<double>{6, 8, 10}));
}


TEST(Autograd, BackwardWithUpstreamGradientIsTheVectorJacobianProduct) {
  Var x = Var::from_tensor(f64({1, 2, 3}, {3}));
  const Tensor up = f64({0.5, -1, 2}, {3});
  Tensor y = x * x;  // dy/dx = 2x
  GradStore g = y.backward(up);
  ASSERT_TRUE(g.get(x));
  EXPECT_EQ(g.get(x)->to_vector<double>(), (std::vector<double>{1, -4, 12}));
  // The same as the gradient of the scalar (y * up).sum_all().
  GradStore ref = ((x * x) * up).sum_all().backward();
  EXPECT_EQ(ref.get(x)->to_vector<double>(), g.get(x)->to_vector<double>());
  // A leaf's own gradient is the upstream gradient.
  EXPECT_EQ(Tensor(x).backward(up).get(x)->to_vector<double>(), up.to_vector<double>());

  const std::string shape_err = error_of([&] { (x * x).backward(f64({1, 2}, {2})); });
  EXPECT_NE(shape_err.find("backward"), std::string::npos) << shape_err;
  EXPECT_NE(shape_err.find("(3)"), std::string::npos) << shape_err;
  EXPECT_NE(shape_err.find("(2)"), std::string::npos) << shape_err;
  const std::string dtype_err = error_of([&] { (x * x).backward(up.to_dtype(DType::F32)); });
  EXPECT_NE(dtype_err.find("f32"), std::string::npos) << dtype_err;
  EXPECT_NE(dtype_err.find("f64"), std::string::npos) << dtype_err;
  EXPECT_NE(error_of([&] { (x * x).backward(); }).find("backward(grad)"), std::string::npos);
}
TEST(Autograd, GradientsReachEveryLeaf) {
  Var a = Var::from_tensor(f64({1, 2}, {2}));
  Var b = Var::from_tensor(f64({3, 4}, {2}));
  Var c = Var::from_tensor(f64({5}, {1}));
  GradStore g = ((a * b).sum_all() + c.sum_all() * 2.0).backward();
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g.get(a)->to_vector<double>(), (std::vector<double>{3, 4}));
  EXPECT_EQ(g.get(b)->to_vector<double>(), (std::vector<double>{1, 2}));
  EXPECT_EQ(g.get(c)->to_vector<double>(), (std::vector<double>{2}));
}

TEST(Autograd, DetachAndNoGradStopRecording) {
  Var x = Var::from_tensor(f64({1, 2}, {2}));
  Tensor d = x.detach();
  EXPECT_FALSE(d.tracks_grad());
  EXPECT_FALSE((d * 2.0).tracks_grad());
  {
    NoGradGuard ng;
    EXPECT_FALSE((x * 2.0).tracks_grad());
  }
  EXPECT_TRUE((x * 2.0).tracks_grad());
  GradStore g = ((x * d).sum_all()).backward();
  EXPECT_EQ(g.get(x)->to_vector<double>(), (std::vector<double>{1, 2}));
  EXPECT_FALSE(g.get(d));
}

TEST(Autograd, NoEdgeWithoutTrackingInputs) {
  Tensor x = f64({1, 2}, {2});
  Tensor y = x.exp() * 2.0;
  EXPECT_FALSE(y.tracks_grad());
  EXPECT_EQ(y.impl_ptr()->grad_fn, nullptr);
}

TEST(Autograd, LongChainDoesNotOverflowTheStack) {
  Var x = Var::from_tensor(f64({0.5}, {1}));
  Tensor y = x;
  for (int i = 0; i < 100000; ++i) y = y * 1.0;
  GradStore g = y.sum_all().backward();
  EXPECT_EQ(g.get(x)->item(), 1.0);
  // And dropping an un-backpropagated chain of the same length is fine too.
  Tensor z = x;
  for (int i = 0; i < 100000; ++i) z = z + 0.0;
  z = Tensor();
}

TEST(Autograd, GraphIsReleasedAfterBackward) {
  Var x = Var::from_tensor(f64({1, 2}, {2}));
  Tensor big = x.broadcast_as({1000, 2}).exp();
  std::weak_ptr<Storage> saved = big.storage();
  Tensor loss = big.sum_all();
  big = Tensor();
  EXPECT_FALSE(saved.expired());  // the graph holds exp's output for its backward
  GradStore g = loss.backward();
  EXPECT_TRUE(saved.expired());
  EXPECT_NE(error_of([&] { loss.backward(); }).find("already released"), std::string::npos);
}

// Issue 17: a node keeps alive only the values its backward rule reads (SAVES in backward.cpp).
// Here a product by a scalar reads nothing, exp reads its output (not its input), an added
// scalar nothing, softmax its input and row stats (not its output), and a square-by-product both
// operands: of the five (64, 256) activations, the graph holds e, b and s. (It held all five,
// each node keeping its inputs and outputs whether its rule read them or not.)
TEST(Autograd, NodesKeepOnlyTheValuesTheirRulesRead) {
  const Device cpu = Device::cpu();
  const Var x = Var::from_tensor(random_tensor({64, 256}, DType::F32, 7));
  const size_t n = 64 * 256 * sizeof(float), stats = 64 * 2 * sizeof(float);
  const size_t base = memory_stats(cpu).in_use;
  Tensor loss;
  {
    const Tensor a = x * 2.0;                         // kept by nothing
    const Tensor e = a.exp();                         // exp's output: its rule reads it
    const Tensor b = e + 1.0;                         // softmax's input: its rule reads it
    const Tensor s = ops::softmax_last_dim(b);        // read by the product below
    loss = (s * s).sum_all();
  }
  const size_t held = memory_stats(cpu).in_use - base;
  EXPECT_GE(held, 3 * n + stats);
  EXPECT_LT(held, 4 * n) << "the graph holds " << held << " bytes of 5 x " << n;
  // The gradient is the one of the whole graph (checked against the same function in f64 by
  // central differences elsewhere): defined, finite, and everything is freed after backward.
  GradStore g = loss.backward();
  ASSERT_TRUE(g.get(x));
  for (float v : g.get(x)->to_vector<float>()) ASSERT_TRUE(std::isfinite(v));
  EXPECT_EQ(memory_stats(cpu).in_use - base, n + sizeof(float));  // dx and the loss
}

// What a node keeps of an input its rule does not read: shape, dtype, device and identity, no
// bytes; an op given one is an internal error that says so, never a computation on garbage.
TEST(Autograd, ValueFreeTensorsKeepTheirMetadataAndRefuseOps) {
  const Tensor t = random_tensor({3, 5}, DType::F32, 8).transpose(0, 1);
  const Tensor f = value_free(t);
  EXPECT_TRUE(is_value_free(f));
  EXPECT_FALSE(is_value_free(t));
  EXPECT_EQ(f.dims(), t.dims());
  EXPECT_EQ(f.strides(), t.strides());
  EXPECT_EQ(f.dtype(), t.dtype());
  EXPECT_EQ(f.device(), t.device());
  EXPECT_EQ(f.id(), t.id());
  EXPECT_EQ(f.storage()->nbytes(), 0u);
  EXPECT_NE(error_of([&] { (void)(f + 1.0); }).find("value-free"), std::string::npos);
  EXPECT_NE(error_of([&] { (void)f.reshape({15}).exp(); }).find("value-free"), std::string::npos);
  // A graph edge survives: a value-free handle of a recorded result still tracks gradients.
  const Var v = Var::from_tensor(random_tensor({4}, DType::F32, 9));
  const Tensor y = v * 3.0;
  EXPECT_TRUE(value_free(y).tracks_grad());
  EXPECT_EQ(value_free(y).impl_ptr()->grad_fn, y.impl_ptr()->grad_fn);
}

TEST(Autograd, VarSetKeepsIdentity) {
  Var x = Var::from_tensor(f64({1, 2}, {2}));
  const uint64_t id = x.id();
  x.set(f64({5, 6}, {2}));
  EXPECT_EQ(x.id(), id);
  EXPECT_EQ(x.to_vector<double>(), (std::vector<double>{5, 6}));
  EXPECT_THROW(x.set(f64({1, 2, 3}, {3})), Error);
}

// Issue 15 item 3: a Var replaced between forward and backward. The graph computed 2 * 2, so
// d(v*v)/dv is 4 (not 200, the gradient at the new value 100), and it still reaches v.
TEST(Autograd, VarChangedAfterForwardKeepsTheGraphsValue) {
  Var v = Var::from_tensor(f64({2}, {1}));
  const Tensor l = (v * v).sum_all();
  const Tensor m = v.exp().sum_all();  // a unary op's saved input, too
  v.set(f64({100}, {1}));
  GradStore g = l.backward();
  ASSERT_TRUE(g.get(v).has_value());
  EXPECT_EQ(g.get(v)->to_vector<double>(), (std::vector<double>{4}));
  GradStore h = m.backward();
  EXPECT_NEAR(h.get(v)->to_vector<double>()[0], std::exp(2.0), 1e-12);
  // The next forward sees the new value.
  EXPECT_EQ((*(v * v).sum_all().backward().get(v)).to_vector<double>(),
            (std::vector<double>{200}));
}

// Calls per op while `f` runs (profiling on), e.g. a backward pass.
std::map<std::string, uint64_t> op_calls(const std::function<void()>& f) {
  reset_op_profile();
  set_op_profiling(true);
  f();
  set_op_profiling(false);
  std::map<std::string, uint64_t> calls;
  for (const OpProfileRow& r : op_profile()) calls[std::string(op_name(r.op))] += r.calls;
  reset_op_profile();
  return calls;
}

// Backward rules compute only the gradients some input needs: a frozen operand costs no product.
TEST(Autograd, RulesSkipTheGradientsOfFrozenInputs) {
  const Var x = Var::from_tensor(random_tensor(Shape({4, 6}), DType::F32, 1));
  const Tensor w = random_tensor(Shape({6, 5}), DType::F32, 2);  // frozen: not a Var
  const Tensor y = x.matmul(w).sum_all();
  GradStore g;
  auto calls = op_calls([&] { g = y.backward(); });
  EXPECT_EQ(calls["matmul"], 1u);  // dx = g w^T only; no dw = x^T g
  ASSERT_TRUE(g.get(x));
  EXPECT_TRUE(all_close(values(*g.get(x)),
                        values(Tensor::ones({4, 5}, DType::F32).matmul(w.t())), 1e-6, 1e-6));
  const Tensor z = (x * w.narrow(1, 0, 4).t()).sum_all();
  calls = op_calls([&] { (void)z.backward(); });
  EXPECT_EQ(calls["mul"], 1u);
}

// The rules' zeros and bounds travel as op attributes: a backward pass makes no scalar tensors
// (each was an allocation and, on a GPU, a fill launch).
TEST(Autograd, BackwardRulesMakeNoScalarTensors) {
  const Var x = Var::from_tensor(random_tensor(Shape({3, 7}), DType::F32, 3));
  const Var y = Var::from_tensor(random_tensor(Shape({3, 7}), DType::F32, 4));
  const Tensor m = random_tensor(Shape({3, 7}), DType::F32, 5).gt(0.0);
  const Tensor loss = (x.relu() + x.abs() + x.clamp(-0.5, 0.5) + x.maximum(y) + x.minimum(0.25) +
                       m.where_cond(x, y) + m.where_cond(0.5, y) + x / 3.0 + 2.0 / (y.abs() + 1.0))
                          .sum_all();
  const Tensor seed = Tensor::ones(Shape({}), DType::F32);  // backward() would fill this one
  const auto calls = op_calls([&] { (void)loss.backward(seed); });
  EXPECT_EQ(calls.count("fill"), 0u) << calls.at("fill") << " fills in the backward pass";
  EXPECT_GT(calls.count("where_cond"), 0u);
}

TEST(Autograd, FusedOpsPassGradientToEveryInput) {
  for (bool composed : {false, true}) {
    Var x = Var::from_tensor(random_tensor({4, 8}, DType::F32, 1));
    Var w = Var::from_tensor(random_tensor({8}, DType::F32, 2));
    Var b = Var::from_tensor(random_tensor({8}, DType::F32, 3));
    Var xg = Var::from_tensor(random_tensor({2, 4, 3}, DType::F32, 4));
    Var wg = Var::from_tensor(random_tensor({4}, DType::F32, 5));
    Var bg = Var::from_tensor(random_tensor({4}, DType::F32, 6));
    std::optional<ComposedOnlyGuard> guard;
    if (composed) guard.emplace();
    Tensor loss = ops::softmax_last_dim(x).sqr().sum_all() +
                  ops::log_softmax_last_dim(x).sqr().sum_all() +
                  ops::rms_norm(x, w, 1e-5).sqr().sum_all() +
                  ops::layer_norm(x, w, b, 1e-5).sqr().sum_all() +
                  ops::group_norm(xg, 2, wg, bg, 1e-5).sqr().sum_all();
    GradStore g = loss.backward();
    for (const Tensor* t : {&x, &w, &b, &xg, &wg, &bg}) {
      auto gt = g.get(*t);
      ASSERT_TRUE(gt) << "composed=" << composed;
      double n = gt->sqr().sum_all().item();
      EXPECT_GT(n, 0.0) << "composed=" << composed;
    }
  }
}

// ---- storage and printing -----------------------------------------------------------------------

TEST(Storage, CacheReusesFreedBlocks) {
  if (std::getenv("TAPER_NO_ALLOC_CACHE")) GTEST_SKIP() << "cache disabled for leak checking";
  void* p = nullptr;
  {
    Tensor t = Tensor::empty({1 << 20}, DType::F32, Device::cpu());
    p = t.data_ptr();
  }
  EXPECT_GE(host_cache_bytes(), (1u << 22));
  Tensor u = Tensor::empty({1 << 20}, DType::F32, Device::cpu());
  EXPECT_EQ(u.data_ptr(), p);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(u.data_ptr()) % 64, 0u);
}

// The counters behind finetune's peak-memory figure: bytes held by live tensors, and the most
// held at once since reset_peak_memory (with the cache on or off).
TEST(Storage, MemoryStatsCountLiveBytesAndThePeak) {
  const Device cpu = Device::cpu();
  reset_peak_memory(cpu);
  const MemoryStats s0 = memory_stats(cpu);
  EXPECT_EQ(s0.peak, s0.in_use);
  {
    Tensor a = Tensor::empty({1000}, DType::F32, cpu);
    Tensor b = Tensor::empty({500}, DType::F64, cpu);
    EXPECT_EQ(memory_stats(cpu).in_use, s0.in_use + 8000);
  }
  const MemoryStats s1 = memory_stats(cpu);
  EXPECT_EQ(s1.in_use, s0.in_use);
  EXPECT_EQ(s1.peak, s0.in_use + 8000);
  { Tensor c = Tensor::empty({10}, DType::F32, cpu); }
  EXPECT_EQ(memory_stats(cpu).peak, s0.in_use + 8000);  // a smaller block leaves the peak
  reset_peak_memory(cpu);
  EXPECT_EQ(memory_stats(cpu).peak, s0.in_use);
}

// A captured graph's private pool (cuda::Graph on a GPU; the allocator logic is the same on
// every device, so the CPU tests it): blocks freed during the capture, the pool's or older
// ones, serve only the pool; after end() nobody; at the pool's end they return to the cache.
TEST(Storage, PrivatePoolKeepsItsBlocksFromEveryoneElseUntilReleased) {
  const Device cpu = Device::cpu();
  const Shape s({3000});  // 12 000 bytes: one size class
  Tensor older = Tensor::empty(s, DType::F32, cpu);
  const void* older_at = older.data_ptr();
  const size_t in_use0 = memory_stats(cpu).in_use;
  std::set<const void*> pool_blocks;
  {
    PrivatePool pool(cpu);
    EXPECT_TRUE(pool.active());
    EXPECT_THROW(PrivatePool second(cpu), Error);  // one capture at a time
    const void* a_at = nullptr;
    {
      Tensor a = Tensor::empty(s, DType::F32, cpu);
      a_at = a.data_ptr();
      pool_blocks.insert(a_at);
    }
    {
      Tensor b = Tensor::empty(s, DType::F32, cpu);  // the pool's free block
      EXPECT_EQ(b.data_ptr(), a_at);
    }
    older = Tensor();  // an older block freed during the capture joins the pool
    pool_blocks.insert(older_at);
    const size_t cls_bytes = pool.bytes() / 2;
    EXPECT_GE(cls_bytes, 12000u);
    EXPECT_EQ(memory_stats(cpu).in_use, in_use0 - 12000 + 2 * cls_bytes);
    pool.end();
    EXPECT_FALSE(pool.active());
    std::vector<Tensor> after;
    for (int i = 0; i < 4; ++i) {
      after.push_back(Tensor::empty(s, DType::F32, cpu));
      EXPECT_EQ(pool_blocks.count(after.back().data_ptr()), 0u) << i;
    }
  }
  // Released: its two blocks are the cache's again (the last freed is handed out first), or
  // freed at once with the cache off (leak checking).
  EXPECT_EQ(memory_stats(cpu).in_use, in_use0 - 12000);
  if (std::getenv("TAPER_NO_ALLOC_CACHE")) return;
  Tensor c = Tensor::empty(s, DType::F32, cpu), d = Tensor::empty(s, DType::F32, cpu);
  EXPECT_EQ(pool_blocks.count(c.data_ptr()) + pool_blocks.count(d.data_ptr()), 2u);
}

// copy_from writes in place (converting the dtype) and refuses what would break a graph.
TEST(Tensor, CopyFromWritesInPlaceAndChecksItsArguments) {
  const Tensor dst = Tensor::zeros({2, 3}, DType::BF16);
  const void* at = dst.data_ptr();
  dst.copy_from(Tensor::from_vector(std::vector<double>{1, 2, 3, 4, 5, 1.00390625}, {2, 3}));
  EXPECT_EQ(dst.data_ptr(), at);
  EXPECT_EQ(dst.to_vector<double>(), (std::vector<double>{1, 2, 3, 4, 5, 1.0}));  // to nearest even
  EXPECT_THROW(dst.copy_from(Tensor::zeros({3, 2}, DType::F32)), Error);
  EXPECT_THROW(dst.t().copy_from(Tensor::zeros({3, 2}, DType::F32)), Error);  // not contiguous
  const Var v = Var::from_tensor(Tensor::zeros({2}, DType::F32));
  EXPECT_THROW(v.copy_from(Tensor::ones({2}, DType::F32)), Error);  // tracks gradients
  v.value().copy_from(Tensor::ones({2}, DType::F32));
  EXPECT_EQ(v.to_vector<float>(), (std::vector<float>{1, 1}));
}

// Capturing a graph needs a CUDA device: anywhere else it is an Error that says so.
TEST(Graph, CaptureOnTheCpuIsAnError) {
  cuda::Graph g;
  try {
    g.capture(Device::cpu(), [] {});
    FAIL() << "no Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a CUDA device"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(g.captured());
  EXPECT_THROW(g.replay(), Error);
}

TEST(Print, ShowsShapeDTypeDeviceAndValues) {
  std::ostringstream os;
  os << Tensor::arange(0, 6, 1, DType::F32).reshape({2, 3});
  EXPECT_EQ(os.str(), "Tensor[shape=(2, 3), dtype=f32, device=cpu]\n[[0, 1, 2],\n [3, 4, 5]]");
  std::ostringstream big;
  big << Tensor::zeros({100, 100}, DType::BF16);
  EXPECT_NE(big.str().find("..."), std::string::npos);
  EXPECT_LT(big.str().size(), 400u);
}

// ---- devices ------------------------------------------------------------------------------------

TEST(Devices, ToDeviceCarriesValuesAndGradientsBothWays) {
  // On every device pair of test_devices() (CPU -> CPU is the identity; with a GPU present the
  // same test crosses to it and back): values survive the trip bit for bit and the gradient of
  // a loss computed on the far device arrives on the source device.
  for (Device dev : test_devices()) {
    SCOPED_TRACE(dev.to_string());
    const Tensor x = random_tensor({3, 5}, DType::F32, 11);
    Var v = Var::from_tensor(x);
    const Tensor far = v.to_device(dev);
    EXPECT_EQ(far.device(), dev);
    EXPECT_EQ(far.to_vector<float>(), x.to_vector<float>());
    const Tensor loss = (far * far).sum_all().to_device(Device::cpu());
    GradStore g = loss.backward();
    ASSERT_TRUE(g.get(v));
    EXPECT_EQ(g.get(v)->device(), Device::cpu());
    const std::vector<float> gx = g.get(v)->to_vector<float>(), xv = x.to_vector<float>();
    for (size_t i = 0; i < xv.size(); ++i) EXPECT_EQ(gx[i], 2 * xv[i]) << i;
  }
}

TEST(Devices, UnavailableDeviceIsAnError) {
  const std::string e = error_of([] { Tensor::zeros({2}, DType::F32, Device::cuda(99)); });
  EXPECT_NE(e.find("cuda:99"), std::string::npos) << e;
  EXPECT_NE(e.find("not available"), std::string::npos) << e;
  EXPECT_EQ(device_available(DeviceKind::Cuda), device_count(DeviceKind::Cuda) > 0);
}

TAPER_COVERS(Forward, OpId::reshape, OpId::permute, OpId::narrow, OpId::broadcast_as,
             OpId::to_device);
TAPER_COVERS(Gradient, OpId::to_device);

}  // namespace
}  // namespace taper::testing
