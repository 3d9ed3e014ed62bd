// layers.h: the basic layers: Linear, Embedding, the norms, Dropout and the activations.
//
// What it is: parameter-holding wrappers over functional.h and the fused ops, with LibTorch's
// names, shapes and initialisations (Linear weight is (out, in), uniform(+-1/sqrt(in)); Embedding
// normal(0, 1); norm weights 1 and biases 0). Each forward is its functional form.
// What it is not: attention or transformer blocks (attention.h).
#pragma once

#include <cstdint>

#include "taper/nn/module.h"

namespace taper::nn {

/// Options of `Linear`: `LinearOptions(in, out).bias(false)`.
struct LinearOptions {
  LinearOptions(size_t in_features, size_t out_features)
      : in_features_(in_features), out_features_(out_features) {}
  TAPER_ARG(size_t, in_features);
  TAPER_ARG(size_t, out_features);
  TAPER_ARG(bool, bias) = true;
  TAPER_ARG(DType, dtype) = DType::F32;
};

/// y = x W^T + b. x: (..., in) -> (..., out). Parameters `weight` (out, in), `bias` (out).
class Linear : public Module {
 public:
  explicit Linear(const LinearOptions& options);
  Linear(size_t in_features, size_t out_features) : Linear(LinearOptions(in_features, out_features)) {}
  Tensor forward(const Tensor& x) override;
  const LinearOptions& options() const { return options_; }

  Var weight;
  Var bias;  ///< undefined when options.bias() is false

 private:
  LinearOptions options_;
};

/// Options of `Embedding`.
struct EmbeddingOptions {
  EmbeddingOptions(size_t num_embeddings, size_t embedding_dim)
      : num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {}
  TAPER_ARG(size_t, num_embeddings);
  TAPER_ARG(size_t, embedding_dim);
  TAPER_ARG(DType, dtype) = DType::F32;
};

/// A lookup table. ids: any shape (i64 or u32) -> (*ids, dim). Parameter `weight` (num, dim).
class Embedding : public Module {
 public:
  explicit Embedding(const EmbeddingOptions& options);
  Embedding(size_t num, size_t dim) : Embedding(EmbeddingOptions(num, dim)) {}
  Tensor forward(const Tensor& ids) override;
  const EmbeddingOptions& options() const { return options_; }

  Var weight;

 private:
  EmbeddingOptions options_;
};

/// Options of `LayerNorm` (over the last dim).
struct LayerNormOptions {
  explicit LayerNormOptions(size_t dim) : dim_(dim) {}
  TAPER_ARG(size_t, dim);
  TAPER_ARG(double, eps) = 1e-5;
  TAPER_ARG(bool, elementwise_affine) = true;
  /// With affine: whether there is a bias (PyTorch's `bias=`).
  TAPER_ARG(bool, bias) = true;
  TAPER_ARG(DType, dtype) = DType::F32;
};

/// Layer norm over the last dim via the fused `ops::layer_norm`. Parameters `weight`, `bias` (D).
class LayerNorm : public Module {
 public:
  explicit LayerNorm(const LayerNormOptions& options);
  explicit LayerNorm(size_t dim) : LayerNorm(LayerNormOptions(dim)) {}
  Tensor forward(const Tensor& x) override;
  const LayerNormOptions& options() const { return options_; }

  Var weight;  ///< undefined without elementwise_affine
  Var bias;    ///< undefined without elementwise_affine or bias

 private:
  LayerNormOptions options_;
};

/// Options of `RmsNorm` (over the last dim).
struct RmsNormOptions {
  explicit RmsNormOptions(size_t dim) : dim_(dim) {}
  TAPER_ARG(size_t, dim);
  TAPER_ARG(double, eps) = 1e-6;
  TAPER_ARG(bool, elementwise_affine) = true;
  TAPER_ARG(DType, dtype) = DType::F32;
};

/// RMS norm over the last dim via the fused `ops::rms_norm`. Parameter `weight` (D).
class RmsNorm : public Module {
 public:
  explicit RmsNorm(const RmsNormOptions& options);
  explicit RmsNorm(size_t dim) : RmsNorm(RmsNormOptions(dim)) {}
  Tensor forward(const Tensor& x) override;
  const RmsNormOptions& options() const { return options_; }

  Var weight;  ///< undefined without elementwise_affine

 private:
  RmsNormOptions options_;
};

/// Options of `GroupNorm`.
struct GroupNormOptions {
  GroupNormOptions(size_t num_groups, size_t num_channels)
      : num_groups_(num_groups), num_channels_(num_channels) {}
  TAPER_ARG(size_t, num_groups);
  TAPER_ARG(size_t, num_channels);
  TAPER_ARG(double, eps) = 1e-5;
  TAPER_ARG(bool, affine) = true;
  TAPER_ARG(DType, dtype) = DType::F32;
};

/// Group norm of (N, C, *) via the fused `ops::group_norm`. Parameters `weight`, `bias` (C).
class GroupNorm : public Module {
 public:
  explicit GroupNorm(const GroupNormOptions& options);
  Tensor forward(const Tensor& x) override;
  const GroupNormOptions& options() const { return options_; }

  Var weight;  ///< undefined without affine
  Var bias;    ///< undefined without affine

 private:
  GroupNormOptions options_;
};

/// Options of `Dropout`.
struct DropoutOptions {
  DropoutOptions(double p = 0.5) : p_(p) {}  // NOLINT: implicit, as LibTorch's
  TAPER_ARG(double, p);
  /// Base seed of the masks; 0 takes one from `next_seed()` at construction.
  TAPER_ARG(uint64_t, seed) = 0;
};

/// Inverted dropout in training mode, identity in eval mode. Each forward call uses a fresh
/// counter-based mask derived from (seed, call count), so a run is reproducible.
class Dropout : public Module {
 public:
  explicit Dropout(const DropoutOptions& options = DropoutOptions());
  explicit Dropout(double p) : Dropout(DropoutOptions(p)) {}
  Tensor forward(const Tensor& x) override;
  /// The seed the next forward will use (advances with each training-mode call).
  uint64_t next_mask_seed() const;
  uint64_t calls() const { return calls_; }
  /// Sets the call counter (to resume a run exactly).
  void set_calls(uint64_t calls) { calls_ = calls; }

 private:
  DropoutOptions options_;
  uint64_t seed_;
  uint64_t calls_ = 0;
};

/// The two forms of GELU: PyTorch's `approximate="none"` (erf) and `"tanh"`.
enum class GeluApproximation { None, Tanh };

/// GELU; exact (erf) by default as in PyTorch and BERT.
class GELU : public Module {
 public:
  explicit GELU(GeluApproximation approximate = GeluApproximation::None);
  Tensor forward(const Tensor& x) override;
  GeluApproximation approximate() const { return approximate_; }

 private:
  GeluApproximation approximate_;
};

/// max(x, 0).
class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Tensor forward(const Tensor& x) override { return x.relu(); }
};

/// x * sigmoid(x).
class SiLU : public Module {
 public:
  SiLU() : Module("SiLU") {}
  Tensor forward(const Tensor& x) override { return x.silu(); }
};

/// tanh(x).
class Tanh : public Module {
 public:
  Tanh() : Module("Tanh") {}
  Tensor forward(const Tensor& x) override { return x.tanh(); }
};

}  // namespace taper::nn
