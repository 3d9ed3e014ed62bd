// optim.h: optimizers (SGD, AdamW), gradient clipping and learning-rate schedules.
//
// What it is: LibTorch-style optimizers over `Var`s that take the `GradStore` a backward
// returned. State is kept per parameter: for bf16/f16 parameters an f32 master copy of the
// weights and f32 moments (the update is computed in f32 and rounded once into the parameter);
// f64 parameters keep f64 state; f32 parameters f32 state. A parameter with no gradient in the
// store is skipped (no decay either), as PyTorch skips `grad is None`. A parameter is updated in
// place (its storage keeps its address, as in PyTorch; so does the fused AdamW's state), so a
// captured cuda::Graph that reads it stays valid, whenever nothing else holds its storage. One
// that a recorded graph (a forward not yet backwarded), a view or another tensor shares, or a
// non-contiguous one, gets a new value through Var::set instead: what they read is unchanged.
// What it is not: a learning-rate policy (the schedules below set `lr` from outside).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "taper/autograd.h"
#include "taper/nn/options.h"
#include "taper/tensor.h"

namespace taper::nn {

/// A set of parameters with its own weight decay (e.g. no decay for biases and norms).
struct ParamGroup {
  std::vector<Var> params;
  /// Overrides the optimizer's weight decay for this group.
  std::optional<double> weight_decay;
};

/// Base of the optimizers.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  /// Updates every parameter that has a gradient in `grads` (under NoGradGuard, in place).
  void step(const GradStore& grads);
  /// Updates from the gradients summed by `accumulate` since the last `zero_grad`.
  void step();
  /// Adds the parameters' gradients in `grads` to the accumulated ones (gradient accumulation
  /// over micro-batches).
  void accumulate(const GradStore& grads);
  /// Forgets the accumulated gradients.
  void zero_grad();
  /// The accumulated gradients.
  const GradStore& accumulated() const { return accum_; }

  double lr() const { return lr_; }
  void set_lr(double lr);
  /// Number of `step` calls so far.
  int64_t step_count() const { return step_count_; }
  /// Every parameter, group by group.
  std::vector<Var> parameters() const;
  const std::vector<ParamGroup>& param_groups() const { return groups_; }

  /// Optimizer state as named tensors (copies): `step`, `lr`, and per parameter i `<i>.step`,
  /// `<i>.master` (half parameters) and `<i>.<slot>` (`momentum_buffer`; `exp_avg`,
  /// `exp_avg_sq`), to be saved next to the model (e.g. under an `optim.` prefix) and restored
  /// with `load_state_dict`.
  std::vector<std::pair<std::string, Tensor>> state_dict() const;
  /// Restores `state_dict()` output for the same parameter list (keys without the optional
  /// `prefix`); throws Error naming a missing key or a shape or dtype mismatch.
  void load_state_dict(const std::vector<std::pair<std::string, Tensor>>& state,
                       const std::string& prefix = "");

 protected:
  Optimizer(std::vector<ParamGroup> groups, double lr, double weight_decay, const char* name);
  /// Per-parameter state; which slots are used depends on the optimizer.
  struct State {
    Tensor master;  ///< f32 copy of a half parameter (undefined otherwise)
    Tensor slot0;   ///< SGD: momentum buffer; AdamW: exp_avg
    Tensor slot1;   ///< AdamW: exp_avg_sq
    int64_t step = 0;  ///< updates this parameter has had (AdamW's bias correction)
    bool writable = false;  ///< this step may overwrite the parameter (writable_in_place)
  };
  /// Updates one parameter. `g` is the gradient (parameter dtype); `weight_decay` the group's.
  virtual void update(Var& p, State& s, const Tensor& g, double weight_decay) = 0;
  virtual std::vector<std::string> slot_names() const = 0;
  /// The parameter's value in the compute dtype (the master copy for half parameters).
  static Tensor compute_value(const Var& p, State& s);
  /// Whether `p`'s storage may be overwritten: contiguous, and held by `p`'s handle alone.
  static bool writable_in_place(const Var& p);
  /// Writes an updated compute-dtype value back (into the master, rounded once into `p`).
  static void write_back(Var& p, State& s, const Tensor& value);

  std::vector<ParamGroup> groups_;
  std::vector<State> state_;  ///< parallel to parameters()
  double lr_;
  double weight_decay_;
  int64_t step_count_ = 0;
  GradStore accum_;
  const char* name_;
};

/// Options of `SGD`, PyTorch semantics: weight decay is added to the gradient; momentum
/// buffer b = momentum b + (1 - dampening) g (b = g on the first step); Nesterov uses
/// g + momentum b.
struct SGDOptions {
  SGDOptions(double lr) : lr_(lr) {}  // NOLINT: implicit, as LibTorch's
  TAPER_ARG(double, lr);
  TAPER_ARG(double, momentum) = 0.0;
  TAPER_ARG(double, dampening) = 0.0;
  TAPER_ARG(double, weight_decay) = 0.0;
  TAPER_ARG(bool, nesterov) = false;
};

/// Stochastic gradient descent with optional momentum, Nesterov and weight decay.
class SGD : public Optimizer {
 public:
  SGD(std::vector<Var> params, const SGDOptions& options);
  SGD(std::vector<ParamGroup> groups, const SGDOptions& options);
  const SGDOptions& options() const { return options_; }

 protected:
  void update(Var& p, State& s, const Tensor& g, double weight_decay) override;
  std::vector<std::string> slot_names() const override { return {"momentum_buffer"}; }

 private:
  SGDOptions options_;
};

/// Options of `AdamW` (PyTorch's defaults).
struct AdamWOptions {
  AdamWOptions(double lr = 1e-3) : lr_(lr) {}  // NOLINT: implicit, as LibTorch's
  TAPER_ARG(double, lr);
  TAPER_ARG(double, beta1) = 0.9;
  TAPER_ARG(double, beta2) = 0.999;
  TAPER_ARG(double, eps) = 1e-8;
  TAPER_ARG(double, weight_decay) = 1e-2;
  /// One loop per parameter over contiguous host memory on the CPU (three reads, three writes
  /// per element); false, or a non-CPU device, uses composed tensor ops.
  TAPER_ARG(bool, fused) = true;
};

/// Adam with decoupled weight decay (Loshchilov & Hutter), as torch.optim.AdamW:
///   p -= lr wd p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
///   p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Var> params, const AdamWOptions& options = AdamWOptions());
  AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options = AdamWOptions());
  const AdamWOptions& options() const { return options_; }

 protected:
  void update(Var& p, State& s, const Tensor& g, double weight_decay) override;
  std::vector<std::string> slot_names() const override { return {"exp_avg", "exp_avg_sq"}; }

 private:
  AdamWOptions options_;
};

/// Scales the gradients of `params` in `grads` so that their joint L2 norm is at most
/// `max_norm` (factor max_norm / (norm + 1e-6), as PyTorch) and returns the norm before
/// clipping. The norm is accumulated in f64.
double clip_grad_norm(const std::vector<Var>& params, GradStore& grads, double max_norm);

/// A learning rate as a function of the step index (0 for the first step).
class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  virtual double lr_at(int64_t step) const = 0;
  /// Sets the optimizer's lr for its next step (index `step_count()`) and returns it.
  double apply(Optimizer& opt) const;
};

/// Linear warm-up from base_lr/warmup to base_lr over `warmup_steps`, then cosine decay to
/// `min_lr` at `total_steps` (held there after).
class WarmupCosineSchedule : public LrSchedule {
 public:
  WarmupCosineSchedule(double base_lr, int64_t warmup_steps, int64_t total_steps,
                       double min_lr = 0.0);
  double lr_at(int64_t step) const override;

 private:
  double base_lr_, min_lr_;
  int64_t warmup_, total_;
};

/// Linear warm-up as above, then linear decay to `end_lr` at `total_steps`.
class WarmupLinearSchedule : public LrSchedule {
 public:
  WarmupLinearSchedule(double base_lr, int64_t warmup_steps, int64_t total_steps,
                       double end_lr = 0.0);
  double lr_at(int64_t step) const override;

 private:
  double base_lr_, end_lr_;
  int64_t warmup_, total_;
};

}  // namespace taper::nn
