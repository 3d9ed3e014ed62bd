// ddp.cpp: DistributedDataParallel: buckets, the parameters' broadcast, and the step's
// gradient averaging (nn/ddp.h says what it is).
//
// A step: (1) the graph says which parameters it uses (graph_leaves); with
// UnusedParameters::Error the ranks compare that over the host connections, so an unused
// parameter is an Error on every rank before any collective starts; (2) backward runs with an
// on_ready hook: a parameter's gradient goes to its bucket as soon as it is complete, and a
// complete bucket is flattened (cat: a fresh buffer, never a gradient's own storage, which a
// backward rule may share with another gradient) and its all-reduce (average) starts, in bucket
// order: a complete bucket waits for the ones before it, so every rank issues the same
// collectives in the same order; (3) what backward never reached is zeros; (4) each parameter's
// gradient is a view of its bucket's reduced buffer.
// What it is not: the collectives themselves (core/dist.cpp, cuda/nccl.cu).
#include "taper/nn/ddp.h"

#include <algorithm>
#include <unordered_set>

#include "taper/error.h"
#include "taper/nn/module.h"
#include "taper/op.h"

namespace taper::nn {

namespace {

/// FNV-1a over the parameters' names, shapes and dtypes: equal on ranks whose models match.
uint64_t signature(const std::vector<std::pair<std::string, Var>>& params) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, size_t n) {
    const unsigned char* c = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ c[i]) * 1099511628211ull;
  };
  for (const auto& [name, v] : params) {
    mix(name.data(), name.size() + 1);
    for (size_t d : v.dims()) mix(&d, sizeof d);
    const int dt = static_cast<int>(v.dtype());
    mix(&dt, sizeof dt);
  }
  return h;
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(const Module& model,
                                                 std::shared_ptr<dist::ProcessGroup> group,
                                                 DdpOptions opts)
    : DistributedDataParallel(model.named_parameters(), std::move(group), opts) {}

DistributedDataParallel::DistributedDataParallel(std::vector<std::pair<std::string, Var>> params,
                                                 std::shared_ptr<dist::ProcessGroup> group,
                                                 DdpOptions opts)
    : group_(std::move(group)), opts_(opts) {
  TAPER_CHECK(group_ != nullptr, "DistributedDataParallel: the process group is null");
  const Device dev = group_->device();
  const int rank = group_->rank();
  for (const auto& [name, v] : params) {
    TAPER_CHECK(v.defined(), "DistributedDataParallel: parameter '", name, "' is undefined");
    TAPER_CHECK(v.device() == dev, "DistributedDataParallel: parameter '", name, "' ",
                v.shape().to_string(), " ", dtype_name(v.dtype()), " is on ",
                v.device().to_string(), ", the process group's device is ", dev.to_string(),
                " (rank ", rank, ")");
    TAPER_CHECK(is_float(v.dtype()), "DistributedDataParallel: parameter '", name, "' is ",
                dtype_name(v.dtype()), ": gradients need a float dtype");
    TAPER_CHECK(index_.emplace(v.id(), slots_.size()).second, "DistributedDataParallel: "
                "parameter '", name, "' is the same Var as an earlier one");
    slots_.push_back(Slot{name, v, 0, 0});
  }

  // Every rank must hold the same parameters, or the collectives below would not match.
  if (group_->world_size() > 1) {
    const uint64_t mine = signature(params);
    const std::vector<unsigned char> all =
        group_->host_all_gather(&mine, sizeof mine, "DistributedDataParallel");
    std::string differ;
    for (int r = 0; r < group_->world_size(); ++r) {
      uint64_t theirs = 0;
      std::copy_n(all.data() + sizeof theirs * static_cast<size_t>(r), sizeof theirs,
                  reinterpret_cast<unsigned char*>(&theirs));
      if (theirs != mine) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
    }
    TAPER_CHECK(differ.empty(), "DistributedDataParallel: rank ", rank, " has ", slots_.size(),
                " parameters whose names, shapes or dtypes differ from those of rank(s) ", differ,
                ": every rank must build the same model");
  }

  // Buckets: reverse registration order, about the order backward completes gradients.
  for (size_t k = slots_.size(); k-- > 0;) {
    Slot& s = slots_[k];
    const size_t numel = s.param.elem_count();
    const size_t bytes = numel * dtype_size(s.param.dtype());
    Bucket* b = buckets_.empty() ? nullptr : &buckets_.back();
    if (b == nullptr || b->dtype != s.param.dtype() ||
        (b->numel * dtype_size(b->dtype)) + bytes > opts_.bucket_bytes()) {
      buckets_.emplace_back();
      b = &buckets_.back();
      b->dtype = s.param.dtype();
      b->device = dev;
    }
    s.bucket = buckets_.size() - 1;
    s.offset = b->numel;
    b->slots.push_back(k);
    b->numel += numel;
  }

  if (opts_.broadcast_parameters() && group_->world_size() > 1) {
    for (Slot& s : slots_) {
      if (!s.param.is_contiguous()) s.param.set(s.param.value().contiguous());
      group_->broadcast(s.param.value(), 0);
    }
  }
}

std::vector<std::vector<std::string>> DistributedDataParallel::bucket_names() const {
  std::vector<std::vector<std::string>> out;
  for (const Bucket& b : buckets_) {
    out.emplace_back();
    for (size_t k : b.slots) out.back().push_back(slots_[k].name);
  }
  return out;
}

GradStore DistributedDataParallel::backward(const Tensor& loss) const {
  TAPER_CHECK(loss.defined() && loss.elem_count() == 1, "DistributedDataParallel::backward: "
              "needs a single-element loss, got ",
              loss.defined() ? loss.shape().to_string() : std::string("an undefined tensor"),
              " (pass the upstream gradient: backward(out, grad))");
  return backward(loss, Tensor::ones(loss.shape(), loss.dtype(), loss.device()));
}

GradStore DistributedDataParallel::backward(const Tensor& out, const Tensor& grad) const {
  const size_t n = slots_.size(), nb = buckets_.size();
  const int rank = group_->rank(), world = group_->world_size();

  // (1) Which parameters this step's graph reaches, agreed between the ranks before anything
  // could wait on a rank that is about to fail.
  std::vector<unsigned char> used(n, 0);
  {
    const std::vector<uint64_t> leaves = graph_leaves(out);
    for (uint64_t id : leaves)
      if (auto it = index_.find(id); it != index_.end()) used[it->second] = 1;
  }
  if (opts_.unused() == UnusedParameters::Error) {
    const std::vector<unsigned char> all =
        world > 1 ? group_->host_all_gather(used.data(), n, "DistributedDataParallel::backward")
                  : used;
    std::string unused;
    size_t count = 0;
    for (size_t i = 0; i < n; ++i) {
      std::string ranks;
      for (int r = 0; r < world; ++r) {
        if (all[static_cast<size_t>(r) * n + i]) continue;
        if (!ranks.empty()) ranks += ',';
        ranks += std::to_string(r);
      }
      if (ranks.empty()) continue;
      if (++count > 8) continue;
      if (!unused.empty()) unused += ", ";
      unused += "'";
      unused += slots_[i].name;
      unused += "' (rank ";
      unused += ranks;
      unused += ")";
    }
    TAPER_CHECK(count == 0, "DistributedDataParallel::backward: ", count, " parameter(s) got no "
                "gradient on this step: ", unused, count > 8 ? ", ..." : "",
                " (rank ", rank, " of ", world, "); every parameter must take part in the loss, "
                "or construct with DdpOptions().unused(UnusedParameters::Zeros)");
  }

  // (2) Backward, reducing each bucket as soon as it is complete, in bucket order.
  // A parameter's gradient lives here from the moment it is complete (backward hands it over)
  // until its bucket is copied into the flat buffer: at most one bucket's worth waits beside the
  // buffers, not every gradient twice.
  std::vector<Tensor> grads(n), flat(nb);
  std::vector<unsigned char> have(n, 0);
  std::vector<std::pair<Tensor, Tensor>> others;  // gradients of leaves that are not ours
  std::vector<size_t> missing(nb);
  std::vector<std::unique_ptr<dist::Work>> work(nb);
  size_t next = 0;
  for (size_t b = 0; b < nb; ++b) missing[b] = buckets_[b].slots.size();
  auto zeros_for = [&](size_t i) {
    const Slot& s = slots_[i];
    grads[i] = Tensor::zeros(s.param.shape(), s.param.dtype(), s.param.device());
    have[i] = 1;
    --missing[s.bucket];
  };
  auto launch_ready = [&] {
    NoGradGuard no_grad;
    for (; next < nb && missing[next] == 0; ++next) {
      std::vector<Tensor> parts;
      for (size_t k : buckets_[next].slots)
        parts.push_back(grads[k].reshape(Shape({grads[k].elem_count()})));
      // A fresh buffer: the all-reduce writes into it.
      flat[next] = parts.size() == 1 ? dispatch1(OpId::copy, parts) : Tensor::cat(parts, 0);
      parts.clear();
      for (size_t k : buckets_[next].slots) grads[k] = Tensor();  // in the buffer now
      work[next] = group_->all_reduce_async(flat[next], dist::ReduceOp::Avg);
    }
  };
  for (size_t i = 0; i < n; ++i)
    if (!used[i]) zeros_for(i);
  launch_ready();
  const GradReadyFn on_ready = [&](const Tensor& leaf, const Tensor& g) {
    // `leaf` is the graph's snapshot of a Var: the Var's id(), another handle.
    const auto it = index_.find(leaf.id());
    if (it == index_.end()) {  // a leaf that is not one of ours: back into the store after
      others.emplace_back(leaf, g);
      return;
    }
    const size_t i = it->second;
    const Slot& s = slots_[i];
    TAPER_CHECK(!have[i], "DistributedDataParallel::backward: parameter '", s.name,
                "' got its gradient twice (rank ", rank, ")");
    TAPER_CHECK(g.shape() == s.param.shape() && g.dtype() == s.param.dtype() &&
                    g.device() == s.param.device(),
                "DistributedDataParallel::backward: the gradient of parameter '", s.name, "' is ",
                g.shape().to_string(), " ", dtype_name(g.dtype()), " on ", g.device().to_string(),
                ", the parameter ", s.param.shape().to_string(), " ", dtype_name(s.param.dtype()),
                " on ", s.param.device().to_string());
    grads[i] = g;
    have[i] = 1;
    if (--missing[s.bucket] == 0) launch_ready();
  };
  GradStore store = out.backward(grad, on_ready, /*hand_over=*/true);
  for (const auto& [leaf, g] : others) store.insert(leaf, g);

  // (3) Reached by the graph, but no gradient came: zeros, the same on every rank's schedule.
  for (size_t i = 0; i < n; ++i)
    if (!have[i]) zeros_for(i);
  launch_ready();
  TAPER_ASSERT(next == nb);

  // (4) The averaged gradients, as views of the reduced buffers.
  for (size_t b = 0; b < nb; ++b) work[b]->wait();
  for (const Slot& s : slots_)
    store.insert(s.param, flat[s.bucket]
                              .narrow(0, s.offset, s.param.elem_count())
                              .reshape(s.param.shape()));
  return store;
}

}  // namespace taper::nn
