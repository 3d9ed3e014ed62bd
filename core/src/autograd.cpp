// autograd.cpp: graph nodes, GradStore, recording switch, and Tensor::backward.
//
// backward() sorts the nodes reachable from the root with an explicit stack (no recursion, so
// a 100 000-op chain is fine), runs each node's bwd hook once all its output gradients are in,
// accumulates gradients on fan-in, and releases each node's saved tensors once it has run.
#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "taper/autograd.h"

namespace taper {

namespace {
thread_local bool t_grad_enabled = true;
thread_local std::vector<Tensor> t_release_queue;
thread_local bool t_releasing = false;
}  // namespace

// Destroying a long chain would recurse through Node -> Tensor -> Node ...: queue the inputs and
// let the outermost destructor drain them in a loop.
Node::~Node() {
  for (Tensor& t : inputs) t_release_queue.push_back(std::move(t));
  inputs.clear();
  outputs.clear();
  if (t_releasing) return;
  t_releasing = true;
  while (!t_release_queue.empty()) {
    Tensor t = std::move(t_release_queue.back());
    t_release_queue.pop_back();
  }
  t_releasing = false;
}

bool grad_enabled() { return t_grad_enabled; }
NoGradGuard::NoGradGuard() : prev_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = prev_; }

std::optional<Tensor> GradStore::get(const Tensor& t) const {
  auto it = grads_.find(t.id());
  if (it == grads_.end()) return std::nullopt;
  return it->second;
}

void GradStore::accumulate(const Tensor& t, const Tensor& g) {
  auto it = grads_.find(t.id());
  if (it == grads_.end())
    grads_.emplace(t.id(), g);
  else
    it->second = it->second + g;
}

void GradStore::insert(const Tensor& t, const Tensor& g) { grads_[t.id()] = g; }
void GradStore::remove(const Tensor& t) { grads_.erase(t.id()); }

GradStore Tensor::backward() const {
  TAPER_CHECK(elem_count() == 1, "backward: needs a single-element tensor, got shape ",
              shape().to_string(), " (pass the upstream gradient: backward(grad))");
  return backward(Tensor::ones(shape(), dtype(), device()));  // checks the dtype
}

GradStore Tensor::backward(const Tensor& root_grad) const {
  TAPER_CHECK(is_float(dtype()), "backward: needs a float tensor, got ", dtype_name(dtype()));
  TAPER_CHECK(root_grad.defined(), "backward: the upstream gradient is an undefined Tensor");
  TAPER_CHECK(root_grad.shape() == shape() && root_grad.dtype() == dtype() &&
                  root_grad.device() == device(),
              "backward: the upstream gradient must match the tensor: tensor ", shape().to_string(),
              " ", dtype_name(dtype()), " on ", device().to_string(), ", gradient ",
              root_grad.shape().to_string(), " ", dtype_name(root_grad.dtype()), " on ",
              root_grad.device().to_string());
  GradStore store;
  if (!tracks_grad()) return store;
  if (!impl_ptr()->grad_fn) {  // the root is itself a leaf
    store.insert(*this, root_grad);
    return store;
  }

  // Post-order DFS with an explicit stack; `order` ends with the root's node.
  // `order` holds the nodes alive while their consumers release their inputs.
  std::vector<std::shared_ptr<Node>> order;
  {
    std::unordered_set<Node*> seen;
    std::vector<std::pair<std::shared_ptr<Node>, size_t>> stack;
    const std::shared_ptr<Node>& root = impl_ptr()->grad_fn;
    stack.emplace_back(root, 0);
    seen.insert(root.get());
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      TAPER_CHECK(!node->released, "backward: the graph was already released by an earlier "
                                   "backward(); run the forward again");
      if (next < node->inputs.size()) {
        const Tensor& in = node->inputs[next++];
        if (!in.defined()) continue;
        const std::shared_ptr<Node>& child = in.impl_ptr()->grad_fn;
        if (child && seen.insert(child.get()).second) stack.emplace_back(child, 0);
      } else {
        order.push_back(node);
        stack.pop_back();
      }
    }
  }

  std::unordered_map<Node*, std::vector<Tensor>> pending;
  pending[impl_ptr()->grad_fn.get()].resize(op_def(impl_ptr()->grad_fn->op).n_out);
  pending[impl_ptr()->grad_fn.get()][impl_ptr()->out_index] = root_grad;

  NoGradGuard no_grad;  // no higher-order graphs
  for (size_t k = order.size(); k-- > 0;) {
    Node* node = order[k].get();
    auto it = pending.find(node);
    if (it == pending.end()) continue;
    std::vector<Tensor> grad_out = std::move(it->second);
    pending.erase(it);
    const OpDef& def = op_def(node->op);
    grad_out.resize(static_cast<size_t>(def.n_out));
    TAPER_CHECK(def.bwd != nullptr, "backward: op ", def.name, " has no backward rule");
    std::vector<Tensor> grads = def.bwd(node->inputs, node->outputs, grad_out, node->attrs);
    for (size_t i = 0; i < node->inputs.size() && i < grads.size(); ++i) {
      const Tensor& in = node->inputs[i];
      if (!in.defined() || !in.tracks_grad() || !grads[i].defined()) continue;
      TAPER_ASSERT(grads[i].shape() == in.shape());
      const auto& child = in.impl_ptr()->grad_fn;
      if (child) {
        auto& slot = pending[child.get()];
        slot.resize(static_cast<size_t>(op_def(child->op).n_out));
        Tensor& acc = slot[in.impl_ptr()->out_index];
        acc = acc.defined() ? acc + grads[i] : grads[i];
      } else {
        store.accumulate(in, grads[i]);
      }
    }
    // Release what the node saved: the graph's memory goes as backward proceeds.
    node->released = true;
    std::vector<Tensor> drop_in = std::move(node->inputs);
    std::vector<Tensor> drop_out = std::move(node->outputs);
    node->inputs.clear();
    node->outputs.clear();
  }
  return store;
}

}  // namespace taper
