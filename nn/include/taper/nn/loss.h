// loss.h: cross_entropy, nll_loss, mse_loss.
//
// What it is: the losses as differentiable functions of tensors, in the input's dtype (the
// reductions accumulate in f32 for the half types, f64 for f64). The class dim is the LAST dim
// (candle's convention): logits (..., C) with targets (...); PyTorch's (N, C, d1, ...) layout
// needs a permute first. What it is not: modules; there is no state to hold.
#pragma once

#include <cstdint>

#include "taper/nn/options.h"
#include "taper/tensor.h"

namespace taper::nn {

/// How a loss reduces over its elements.
enum class Reduction { None, Mean, Sum };

/// Options of `cross_entropy`.
struct CrossEntropyOptions {
  /// Targets equal to this contribute nothing (and do not count in the mean).
  TAPER_ARG(int64_t, ignore_index) = -100;
  /// The target distribution is (1 - s) one-hot + s / C uniform.
  TAPER_ARG(double, label_smoothing) = 0.0;
  TAPER_ARG(Reduction, reduction) = Reduction::Mean;
};

/// Options of `nll_loss`.
struct NllLossOptions {
  TAPER_ARG(int64_t, ignore_index) = -100;
  TAPER_ARG(Reduction, reduction) = Reduction::Mean;
};

/// Cross entropy from unnormalised logits through the fused log-softmax.
/// logits: (..., C) float; targets: (...) i64 or u32 class indices in [0, C) or ignore_index.
/// Targets on the CPU are checked at once (an Error naming the loss and the target); targets on
/// a GPU are never read by the host: an out-of-range one raises gather's Error at the next
/// synchronisation (e.g. reading the loss).
/// Mean: over the targets that are not ignored (NaN when all are, as PyTorch).
/// None: one loss per target, 0 where ignored.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets,
                     const CrossEntropyOptions& options = CrossEntropyOptions());

/// Negative log-likelihood of log-probabilities. log_probs: (..., C); targets: (...).
Tensor nll_loss(const Tensor& log_probs, const Tensor& targets,
                const NllLossOptions& options = NllLossOptions());

/// Mean squared error (input - target)^2; input and target have the same shape and dtype.
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);

}  // namespace taper::nn
