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
  std::vector<Tensor> inputs;   ///< as given to the op (they hold their own edges)
  std::vector<Tensor> outputs;  ///< detached forward outputs, saved tensors included
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

}  // namespace taper
