// autograd.h: the graph node, `GradStore`, `NoGradGuard`.
//
// What it is: reverse-mode autograd over registry ops. An edge is recorded only when an input
// tracks gradients; backward walks the graph with an iterative topological sort (a 100 000-op
// chain does not overflow the stack) and releases the graph's memory as it goes.
// What it is not: the backward formulas themselves (core/src/backward.cpp, one place).
#pragma once

#include <optional>
#include <unordered_map>
#include <vector>

#include "taper/op.h"
#include "taper/tensor.h"

namespace taper {

/// One recorded op application.
struct Node {
  OpId op;
  OpAttrs attrs;
  /// As given to the op (they hold their own edges); value-free (`value_free`) where the
  /// backward rule does not read them (`SavedValues`).
  std::vector<Tensor> inputs;
  /// The detached forward outputs, saved tensors included; undefined where the backward rule
  /// does not read them.
  std::vector<Tensor> outputs;
  bool released = false;
  ~Node();
};

/// Gradients of the leaves (Vars), keyed by tensor identity.
class GradStore {
 public:
  /// The gradient of `t`, if one reached it.
  std::optional<Tensor> get(const Tensor& t) const;
  /// Adds `g` to the stored gradient of `t` (stores it when there is none).
  void accumulate(const Tensor& t, const Tensor& g);
  void insert(const Tensor& t, const Tensor& g);
  void remove(const Tensor& t);
  size_t size() const { return grads_.size(); }
  const std::unordered_map<uint64_t, Tensor>& all() const { return grads_; }

 private:
  std::unordered_map<uint64_t, Tensor> grads_;
};

/// Whether ops record graph edges on this thread.
bool grad_enabled();

/// Turns graph recording off in a scope (inference, optimizer updates).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

/// The identities (Tensor::id) of the leaves `root`'s graph reaches, each once: the tensors
/// whose gradient root.backward() may compute (a path of ops whose backward gives no gradient
/// still counts). Data parallelism asks it before backward which parameters a step used.
std::vector<uint64_t> graph_leaves(const Tensor& root);

/// The backward rule of `op`, registered in core/src/backward.cpp.
BwdFn backward_rule(OpId op);

/// The values a backward rule reads of its node: bit i of `inputs` for input i, bit k of
/// `outputs` for forward output k (saved outputs included). A recorded node keeps only these
/// alive until backward: of every other input it keeps the shape, dtype, device, identity and
/// graph edge but not the bytes (a value-free tensor), and every other output it drops, so an
/// activation lives only as long as some rule will read it.
struct SavedValues {
  uint32_t inputs = 0;
  uint32_t outputs = 0;
  bool input(size_t i) const { return i < 32 && ((inputs >> i) & 1u) != 0; }
  bool output(size_t k) const { return k < 32 && ((outputs >> k) & 1u) != 0; }
};
/// What a rule reads, given the op's inputs as recorded (a product's rule reads one operand
/// only when the other needs a gradient).
using SavesFn = SavedValues (*)(const std::vector<Tensor>& in);
/// What `op`'s backward rule reads, declared beside the rule in core/src/backward.cpp; null for
/// the ops marked non-differentiable.
SavesFn saved_values_rule(OpId op);

/// A handle with `t`'s shape, strides, dtype, device, identity and graph edge but none of its
/// bytes (its storage is an empty block of the same device): what a node keeps of an input
/// its rule does not read. Running an op on it is an Error.
Tensor value_free(const Tensor& t);
/// Whether `t` is such a handle (an empty storage under a non-empty shape).
bool is_value_free(const Tensor& t);

}  // namespace taper
