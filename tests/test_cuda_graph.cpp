// test_cuda_graph.cpp: taper::cuda::Graph on a GPU: a captured step replayed with new static
// inputs gives the eager step's bits, a training step (forward and backward captured, AdamW in
// place) trains exactly as the eager one, the graph's private pool keeps its blocks from later
// tensors, and a host synchronisation inside a capture is an Error that leaves the device usable.
// Every suite is named Cuda* (scripts/gpu_run.sh runs them); each test skips without a GPU. The
// allocator's pool logic and the CPU's refusal are tested on every machine (test_core.cpp).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "taper/nn.h"
#include "tests/test_util.h"

namespace taper {
namespace {

using testing::random_tensor;
using testing::values;

const Device kGpu = Device::cuda(0);

class CudaGraph : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!device_available(DeviceKind::Cuda)) GTEST_SKIP() << "no CUDA device: CUDA tests skipped";
  }
};

/// Raw bytes of a tensor (the same dtype on both sides: bit-for-bit comparison).
std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor c = t.to_device(Device::cpu()).contiguous();
  const uint8_t* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.elem_count() * dtype_size(c.dtype()));
}

TEST_F(CudaGraph, ReplayRecomputesFromTheStaticInputsBitForBit) {
  for (DType dt : {DType::F32, DType::BF16, DType::F64}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = random_tensor({37, 300}, dt, kGpu, 1);
    const Tensor w = random_tensor({300}, dt, kGpu, 2);
    const auto f = [&] {
      return ops::softmax_last_dim(ops::rms_norm(x * 2.0 + 1.0, w, 1e-6).matmul(x.t()));
    };
    (void)f();  // eager first: one-time set-up stays outside the capture
    Tensor y;
    cuda::Graph g;
    g.capture(kGpu, [&] { y = f(); });
    ASSERT_TRUE(g.captured());
    EXPECT_GT(g.pool_bytes(), 0u);
    for (uint64_t seed : {10, 11, 12}) {
      x.copy_from(random_tensor({37, 300}, dt, seed));  // from the host, into x's storage
      g.replay();
      EXPECT_EQ(bytes_of(y), bytes_of(f())) << seed;
    }
  }
}

TEST_F(CudaGraph, PoolBlocksAreNotHandedToLaterTensors) {
  const Tensor x = random_tensor({1 << 16}, DType::F32, kGpu, 3);
  const auto f = [&] { return ((x * 2.0).exp() + 1.0).sqrt(); };  // temporaries freed inside
  (void)f();
  Tensor y;
  cuda::Graph g;
  g.capture(kGpu, [&] { y = f(); });
  // Tensors of the temporaries' size made after the capture must not share the pool's blocks:
  // the replay writes those blocks.
  std::vector<Tensor> later;
  for (int i = 0; i < 8; ++i) later.push_back(Tensor::full({1 << 16}, 7.0, DType::F32, kGpu));
  g.replay();
  g.replay();
  for (const Tensor& t : later)
    for (double v : values(t)) ASSERT_EQ(v, 7.0);
  EXPECT_EQ(bytes_of(y), bytes_of(f()));
}

TEST_F(CudaGraph, HostSyncInsideACaptureIsAnErrorAndTheDeviceStaysUsable) {
  const Tensor x = random_tensor({64}, DType::F32, kGpu, 4);
  (void)(x * 2.0);
  cuda::Graph g;
  try {
    g.capture(kGpu, [&] { (void)(x * 2.0).sum_all().item(); });
    FAIL() << "no Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("graph capture"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(g.captured());
  // The stream is out of capture mode: eager work runs and syncs again.
  EXPECT_EQ(bytes_of(x * 2.0), bytes_of(x + x));
  synchronize(kGpu);
  // And a second capture on the same device works.
  Tensor y;
  g.capture(kGpu, [&] { y = x * 3.0; });
  g.replay();
  EXPECT_EQ(bytes_of(y), bytes_of(x * 3.0));
}

/// A small net with every family the main job uses: embedding, layer_norm, matmul with a
/// bias, GELU, attention-like softmax, mean pooling, cross entropy.
struct Net {
  Var emb, ln_w, ln_b, w1, b1, w2;
  explicit Net(DType dt) {
    emb = Var::from_tensor(random_tensor({50, 16}, dt, kGpu, 20));
    ln_w = Var::from_tensor(random_tensor({16}, dt, kGpu, 21, 0.5, 1.5));
    ln_b = Var::from_tensor(random_tensor({16}, dt, kGpu, 22, -0.1, 0.1));
    w1 = Var::from_tensor(random_tensor({16, 32}, dt, kGpu, 23, -0.3, 0.3));
    b1 = Var::from_tensor(random_tensor({32}, dt, kGpu, 24, -0.1, 0.1));
    w2 = Var::from_tensor(random_tensor({32, 4}, dt, kGpu, 25, -0.3, 0.3));
  }
  std::vector<Var> params() const { return {emb, ln_w, ln_b, w1, b1, w2}; }
  Tensor loss(const Tensor& ids, const Tensor& labels) const {
    const size_t b = ids.dim(0), t = ids.dim(1);
    Tensor h = emb.index_select(ids.reshape({b * t}), 0).reshape({b, t, 16});
    h = ops::layer_norm(h, ln_w, ln_b, 1e-5);
    h = ops::softmax_last_dim(h.matmul(h.transpose(1, 2)) * 0.25).matmul(h);
    h = (h.matmul(w1) + b1).gelu_erf();
    const Tensor logits = h.mean({1}).matmul(w2).to_dtype(DType::F32);
    return nn::cross_entropy(logits, labels);
  }
};

TEST_F(CudaGraph, CapturedTrainingStepTrainsBitForBitAsTheEagerOne) {
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    Net eager(dt), graphed(dt);
    nn::AdamW oe(eager.params(), nn::AdamWOptions(1e-2)),
        og(graphed.params(), nn::AdamWOptions(1e-2));
    const Tensor ids = Tensor::zeros({6, 9}, DType::U32, kGpu);  // static inputs
    const Tensor labels = Tensor::zeros({6}, DType::I64, kGpu);
    Tensor loss;
    GradStore grads;
    cuda::Graph g;
    for (int step = 0; step < 6; ++step) {
      SCOPED_TRACE(step);
      std::vector<uint32_t> iv(54);
      std::vector<int64_t> lv(6);
      for (size_t i = 0; i < iv.size(); ++i) iv[i] = static_cast<uint32_t>((i * 7 + step * 13) % 50);
      for (size_t i = 0; i < lv.size(); ++i) lv[i] = static_cast<int64_t>((i + step) % 4);
      const Tensor ids_e = Tensor::from_vector(iv, Shape({6, 9}), kGpu);
      const Tensor lab_e = Tensor::from_vector(lv, Shape({6}), kGpu);
      const Tensor le = eager.loss(ids_e, lab_e);
      oe.step(le.backward());

      ids.copy_from(ids_e);
      labels.copy_from(lab_e);
      const std::vector<const void*> at = {graphed.emb.data_ptr(), graphed.w1.data_ptr()};
      if (step == 0) {  // eager: AdamW's state and cuBLAS's set-up outside the capture
        loss = graphed.loss(ids, labels);
        grads = loss.backward();
      } else {
        if (!g.captured()) g.capture(kGpu, [&] {
          loss = graphed.loss(ids, labels);
          grads = loss.backward();
        });
        g.replay();
      }
      og.step(grads);
      EXPECT_EQ(graphed.emb.data_ptr(), at[0]);  // in place: the graph reads them there
      EXPECT_EQ(graphed.w1.data_ptr(), at[1]);
      EXPECT_EQ(bytes_of(loss), bytes_of(le));
      for (size_t k = 0; k < eager.params().size(); ++k)
        ASSERT_EQ(bytes_of(graphed.params()[k]), bytes_of(eager.params()[k])) << "param " << k;
    }
  }
}

}  // namespace
}  // namespace taper
