// test_threads.cpp: results do not depend on the thread count (issue 15, item 5).
//
// What it is: one computation per op family on shapes that make the kernels split their work
// differently (many short rows, a few long rows, one long row, large flat tensors), forward and
// backward, at 1 to 8 threads: every result must be the bits of the 1-thread run. The work
// split of each kernel is planned from the shape alone (cpu/cpu_common.h split_rows, the
// fixed GEMM tile grid of cpu/matmul.cpp, the block order of cpu/reduce.cpp).
// What it is not: the per-family tests of values (test_elementwise.cpp, test_fused.cpp, ...)
// or the whole main job at 1-4 threads (tests/finetune_threads.sh).
#include <gtest/gtest.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "taper/nn.h"
#include "tests/test_util.h"

namespace taper::testing {
namespace {

struct Family {
  std::string name;
  std::function<std::vector<Tensor>()> run;  ///< outputs and gradients to compare
};

/// y and the gradient of sum(y * r) for every input (r fixed), through autograd.
std::vector<Tensor> with_grads(const std::vector<Tensor>& inputs,
                               const std::function<Tensor(const std::vector<Tensor>&)>& f) {
  std::vector<Tensor> vars;
  for (const Tensor& t : inputs) vars.push_back(Var::from_tensor(t));
  const Tensor y = f(vars);
  const Tensor r = random_tensor(y.shape(), y.dtype(), 99);
  GradStore g = (y * r).sum_all().backward();
  std::vector<Tensor> out = {y};
  for (const Tensor& v : vars)
    if (const std::optional<Tensor> gv = g.get(v)) out.push_back(*gv);  // inputs f does not use get none
  return out;
}

std::vector<Family> families() {
  std::vector<Family> fs;
  for (DType dt : {DType::F32, DType::BF16, DType::F64}) {
    const std::string d(dtype_name(dt));
    fs.push_back({"elementwise " + d, [dt] {
                    const Tensor a = random_tensor(Shape({300, 700}), dt, 1);
                    const Tensor b = random_tensor(Shape({700}), dt, 2);
                    return with_grads({a, b}, [](const std::vector<Tensor>& x) {
                      return (x[0] * x[1]).gelu_erf().exp() + x[0].t().contiguous().t();
                    });
                  }});
    for (const Shape& s : {Shape({3, 40001}), Shape({1024, 257}), Shape({1, 1 << 17})}) {
      fs.push_back({"reductions " + s.to_string() + " " + d, [dt, s] {
                      const Tensor x = random_tensor(s, dt, 3);
                      return std::vector<Tensor>{x.sum({1}), x.sum({0}), x.max({1}),
                                                 x.argmax(1), x.sum_all(), x.mean_all()};
                    }});
      fs.push_back({"softmax and norms " + s.to_string() + " " + d, [dt, s] {
                      const Tensor x = random_tensor(s, dt, 4);
                      const Tensor w = random_tensor(Shape({s[1]}), dt, 5);
                      const Tensor b = random_tensor(Shape({s[1]}), dt, 6);
                      std::vector<Tensor> out;
                      for (const auto& f : std::vector<std::function<Tensor(const std::vector<Tensor>&)>>{
                               [](const std::vector<Tensor>& v) { return ops::softmax_last_dim(v[0]); },
                               [](const std::vector<Tensor>& v) { return ops::log_softmax_last_dim(v[0]); },
                               [](const std::vector<Tensor>& v) { return ops::rms_norm(v[0], v[1], 1e-5); },
                               [](const std::vector<Tensor>& v) {
                                 return ops::layer_norm(v[0], v[1], v[2], 1e-5);
                               }})
                        for (const Tensor& t : with_grads({x, w, b}, f)) out.push_back(t);
                      return out;
                    }});
    }
    fs.push_back({"group norm " + d, [dt] {
                    const Tensor x = random_tensor(Shape({2, 8, 12001}), dt, 7);
                    const Tensor w = random_tensor(Shape({8}), dt, 8);
                    return with_grads({x, w, w}, [](const std::vector<Tensor>& v) {
                      return ops::group_norm(v[0], 2, v[1], v[2], 1e-5);
                    });
                  }});
    fs.push_back({"matmul " + d, [dt] {
                    const Tensor a = random_tensor(Shape({3, 64, 256}), dt, 9);
                    const Tensor b = random_tensor(Shape({256, 300}), dt, 10);
                    return with_grads({a, b}, [](const std::vector<Tensor>& v) {
                      return v[0].matmul(v[1]);
                    });
                  }});
    fs.push_back({"index ops and cat " + d, [dt] {
                    const Tensor table = random_tensor(Shape({5000, 64}), dt, 11);
                    std::vector<int64_t> ids(2000);
                    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 7919) % 5000);
                    const Tensor idx = Tensor::from_vector(ids, Shape({ids.size()}));
                    return with_grads({table}, [&](const std::vector<Tensor>& v) {
                      const Tensor e = v[0].index_select(idx, 0);
                      return Tensor::cat({e, e.gather(Tensor::zeros(Shape({2000, 3}), DType::I64), 1)}, 1);
                    });
                  }});
  }
  fs.push_back({"AdamW and random draws", [] {
                  Var p = Var::from_tensor(random_tensor(Shape({300, 999}), DType::F32, 12));
                  nn::AdamW opt({p}, nn::AdamWOptions(1e-3).weight_decay(0.01));
                  for (int s = 0; s < 3; ++s) {
                    GradStore g;
                    g.insert(p, random_tensor(Shape({300, 999}), DType::F32, 13 + s));
                    opt.step(g);
                  }
                  return std::vector<Tensor>{p.value(), Tensor::rand(Shape({300, 1001}), DType::F32, Device::cpu(), 5),
                                             Tensor::randn(Shape({300, 1001}), DType::BF16, Device::cpu(), 6)};
                }});
  return fs;
}

TEST(Threads, EveryOpFamilyIsBitIdenticalFrom1To8Threads) {
  ThreadsGuard guard;
  for (const Family& f : families()) {
    SCOPED_TRACE(f.name);
    set_num_threads(1);
    const std::vector<Tensor> want = f.run();
    for (size_t t = 2; t <= 8; ++t) {
      set_num_threads(t);
      const std::vector<Tensor> got = f.run();
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(values(got[i]), values(want[i])) << "output " << i << " at " << t << " threads";
    }
  }
}

}  // namespace
}  // namespace taper::testing
