// autograd.cpp: graph nodes, GradStore, recording switch, and Tensor::backward.
//
// backward() sorts the nodes reachable from the root with an explicit stack (no recursion, so
// a 100 000-op chain is fine), runs each node's bwd hook once all its output gradients are in,
// accumulates gradients on fan-in, and releases each node's saved tensors once it has run.
#include <algorithm>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "taper/autograd.h"

namespace taper {

namespace {
thread_local bool t_grad_enabled = true;
thread_local std::vector<Tensor> t_release_queue;
thread_local bool t_releasing = false;

/// One empty block per device: the storage of every value-free tensor there (leaked on purpose,
/// as the allocator's caches: it outlives static tensors).
const std::shared_ptr<Storage>& empty_storage(Device dev) {
  static auto* cpu = new std::shared_ptr<Storage>(std::make_shared<Storage>(Device::cpu(), 0));
  if (dev.is_cpu()) return *cpu;
  static std::mutex* mu = new std::mutex();
  static auto* blocks = new std::map<std::pair<int, int>, std::shared_ptr<Storage>>();
  std::lock_guard<std::mutex> g(*mu);
  std::shared_ptr<Storage>& s = (*blocks)[{static_cast<int>(dev.kind()), dev.ordinal()}];
  if (!s) s = std::make_shared<Storage>(dev, 0);
  return s;
}
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

Tensor value_free(const Tensor& t) {
  if (!t.defined()) return t;
  auto impl = std::make_shared<TensorImpl>(*t.impl_ptr());
  if (t.elem_count() > 0) impl->storage = empty_storage(t.device());  // else: nothing to free
  return Tensor(std::move(impl));
}

bool is_value_free(const Tensor& t) {
  return t.defined() && t.storage()->nbytes() == 0 && t.elem_count() > 0;
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

namespace {
/// The nodes reachable from `root`'s node, each after every node it takes inputs from
/// (post-order DFS with an explicit stack, so a 100 000-op chain is fine); ends with the root's
/// node. The vector holds the nodes alive while their consumers release their inputs.
std::vector<std::shared_ptr<Node>> topo_order(const std::shared_ptr<Node>& root) {
  std::vector<std::shared_ptr<Node>> order;
  std::unordered_set<Node*> seen;
  std::vector<std::pair<std::shared_ptr<Node>, size_t>> stack;
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
  return order;
}

/// A leaf of the graph: a tensor that tracks gradients and was made by no recorded op (a Var,
/// or the graph's snapshot of one: the same identity).
bool is_leaf(const Tensor& in) {
  return in.defined() && in.tracks_grad() && !in.impl_ptr()->grad_fn;
}
}  // namespace

std::vector<uint64_t> graph_leaves(const Tensor& root) {
  if (!root.defined() || !root.tracks_grad()) return {};
  if (!root.impl_ptr()->grad_fn) return {root.id()};
  std::vector<uint64_t> ids;
  std::unordered_set<uint64_t> seen;
  for (const auto& node : topo_order(root.impl_ptr()->grad_fn))
    for (const Tensor& in : node->inputs)
      if (is_leaf(in) && seen.insert(in.id()).second) ids.push_back(in.id());
  return ids;
}

void GradStore::insert(const Tensor& t, const Tensor& g) { grads_[t.id()] = g; }
void GradStore::remove(const Tensor& t) { grads_.erase(t.id()); }

GradStore Tensor::backward() const {
  TAPER_CHECK(elem_count() == 1, "backward: needs a single-element tensor, got shape ",
              shape().to_string(), " (pass the upstream gradient: backward(grad))");
  return backward(Tensor::ones(shape(), dtype(), device()));  // checks the dtype
}

GradStore Tensor::backward(const Tensor& root_grad) const { return backward(root_grad, nullptr); }

GradStore Tensor::backward(const Tensor& root_grad, const GradReadyFn& on_ready,
                           bool hand_over) const {
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
    if (on_ready) on_ready(*this, root_grad);
    if (!on_ready || !hand_over) store.insert(*this, root_grad);
    return store;
  }

  const std::vector<std::shared_ptr<Node>> order = topo_order(impl_ptr()->grad_fn);

  // For on_ready: how many edges of the graph still lead into each leaf. A leaf is complete
  // once every node that takes it has run or been skipped.
  // The graph holds snapshots of the Vars it read (registry.cpp's record) under the Vars'
  // identities: counting and reporting go by id(), the key GradStore uses too.
  std::unordered_map<uint64_t, size_t> leaf_edges;
  if (on_ready)
    for (const auto& node : order)
      for (const Tensor& in : node->inputs)
        if (is_leaf(in)) ++leaf_edges[in.id()];
  auto edge_done = [&](const Tensor& in) {
    if (!on_ready || !is_leaf(in)) return;
    if (--leaf_edges[in.id()] != 0) return;
    if (const auto g = store.get(in)) {
      on_ready(in, *g);
      if (hand_over) store.remove(in);  // complete: no later edge adds to it
    }
  };

  std::unordered_map<Node*, std::vector<Tensor>> pending;
  pending[impl_ptr()->grad_fn.get()].resize(op_def(impl_ptr()->grad_fn->op).n_out);
  pending[impl_ptr()->grad_fn.get()][impl_ptr()->out_index] = root_grad;

  NoGradGuard no_grad;  // no higher-order graphs
  for (size_t k = order.size(); k-- > 0;) {
    Node* node = order[k].get();
    auto it = pending.find(node);
    if (it == pending.end()) {  // no gradient reached this node
      for (const Tensor& in : node->inputs) edge_done(in);
      continue;
    }
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
    for (const Tensor& in : node->inputs) edge_done(in);
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
