// layers.cpp: Linear, Embedding, the norms, Dropout, GELU.
#include "taper/nn/layers.h"

#include <cmath>

#include "seed_mix.h"
#include "taper/nn/functional.h"
#include "taper/ops.h"

namespace taper::nn {

namespace {
// Initial values are drawn in stat_dtype (f32; f64 for f64 models) and rounded once to the
// target dtype, so a bf16 model starts from the rounded f32 model of the same seed.

Tensor uniform(const Shape& s, double bound, DType dt) {
  return Tensor::rand(s, stat_dtype(dt), Device::cpu(), next_seed(), -bound, bound).to_dtype(dt);
}

void check_float(const char* layer, DType dt) {
  TAPER_CHECK(is_float(dt), layer, ": parameters need a float dtype, got ", dtype_name(dt));
}

}  // namespace

Linear::Linear(const LinearOptions& o) : Module("Linear"), options_(o) {
  check_float("Linear", o.dtype());
  // PyTorch's default: kaiming_uniform(a = sqrt(5)) gives bound 1/sqrt(in) for the weight,
  // and the bias uses the same bound.
  const double bound = o.in_features() ? 1.0 / std::sqrt(double(o.in_features())) : 0.0;
  weight = register_parameter("weight", uniform({o.out_features(), o.in_features()}, bound, o.dtype()));
  if (o.bias()) bias = register_parameter("bias", uniform({o.out_features()}, bound, o.dtype()));
}

Tensor Linear::forward(const Tensor& x) { return functional::linear(x, weight, bias); }

Embedding::Embedding(const EmbeddingOptions& o) : Module("Embedding"), options_(o) {
  check_float("Embedding", o.dtype());
  weight = register_parameter(
      "weight", Tensor::randn({o.num_embeddings(), o.embedding_dim()}, stat_dtype(o.dtype()),
                              Device::cpu(), next_seed())
                    .to_dtype(o.dtype()));
}

Tensor Embedding::forward(const Tensor& ids) { return functional::embedding(ids, weight); }

LayerNorm::LayerNorm(const LayerNormOptions& o) : Module("LayerNorm"), options_(o) {
  check_float("LayerNorm", o.dtype());
  if (o.elementwise_affine()) {
    weight = register_parameter("weight", Tensor::ones({o.dim()}, o.dtype()));
    if (o.bias()) bias = register_parameter("bias", Tensor::zeros({o.dim()}, o.dtype()));
  }
}

Tensor LayerNorm::forward(const Tensor& x) {
  TAPER_CHECK(x.rank() >= 1 && x.dim(-1) == options_.dim(), "LayerNorm(", options_.dim(),
              "): input ", x.shape().to_string(), " does not end in ", options_.dim());
  return ops::layer_norm(x, weight, bias, options_.eps());
}

RmsNorm::RmsNorm(const RmsNormOptions& o) : Module("RmsNorm"), options_(o) {
  check_float("RmsNorm", o.dtype());
  if (o.elementwise_affine()) weight = register_parameter("weight", Tensor::ones({o.dim()}, o.dtype()));
}

Tensor RmsNorm::forward(const Tensor& x) {
  TAPER_CHECK(x.rank() >= 1 && x.dim(-1) == options_.dim(), "RmsNorm(", options_.dim(),
              "): input ", x.shape().to_string(), " does not end in ", options_.dim());
  return ops::rms_norm(x, weight, options_.eps());
}

GroupNorm::GroupNorm(const GroupNormOptions& o) : Module("GroupNorm"), options_(o) {
  check_float("GroupNorm", o.dtype());
  TAPER_CHECK(o.num_groups() > 0 && o.num_channels() % o.num_groups() == 0, "GroupNorm: ",
              o.num_channels(), " channels do not split into ", o.num_groups(), " groups");
  if (o.affine()) {
    weight = register_parameter("weight", Tensor::ones({o.num_channels()}, o.dtype()));
    bias = register_parameter("bias", Tensor::zeros({o.num_channels()}, o.dtype()));
  }
}

Tensor GroupNorm::forward(const Tensor& x) {
  TAPER_CHECK(x.rank() >= 2 && x.dim(1) == options_.num_channels(), "GroupNorm(",
              options_.num_groups(), ", ", options_.num_channels(), "): input ",
              x.shape().to_string(), " is not (N, ", options_.num_channels(), ", *)");
  return ops::group_norm(x, options_.num_groups(), weight, bias, options_.eps());
}

Dropout::Dropout(const DropoutOptions& o)
    : Module("Dropout"), options_(o), seed_(o.seed() ? o.seed() : next_seed()) {
  TAPER_CHECK(o.p() >= 0.0 && o.p() <= 1.0, "Dropout: probability must be in [0, 1], got ",
              o.p());
}

uint64_t Dropout::next_mask_seed() const { return detail::mix_seed(seed_ ^ detail::mix_seed(calls_)); }

Tensor Dropout::forward(const Tensor& x) {
  if (!is_training() || options_.p() == 0.0) return x;
  const uint64_t seed = next_mask_seed();
  ++calls_;
  return functional::dropout(x, options_.p(), seed, true);
}

GELU::GELU(GeluApproximation approximate) : Module("GELU"), approximate_(approximate) {}

Tensor GELU::forward(const Tensor& x) {
  return approximate_ == GeluApproximation::Tanh ? x.gelu() : x.gelu_erf();
}

}  // namespace taper::nn
