// optim.cpp: Optimizer bookkeeping, SGD, AdamW (the adamw_step registry op, or the same update
// from tensor ops), clip_grad_norm, learning-rate schedules.
#include "taper/nn/optim.h"

#include "taper/op.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <unordered_map>

namespace taper::nn {

namespace {

// A copy that shares no storage with `t`, on t's device (state_dict hands out copies, so a
// caller that keeps them holds a snapshot).
Tensor clone(const Tensor& t) {
  const Tensor c = t.detach().contiguous();
  Tensor out = Tensor::empty(c.shape(), c.dtype(), c.device());
  const size_t n = c.elem_count() * dtype_size(c.dtype());
  if (n)
    device_backend(c.device().kind()).copy_device(c.device(), out.data_ptr(), c.device(),
                                                  c.data_ptr(), n);
  return out;
}

}  // namespace

// ---- Optimizer ------------------------------------------------------------------------------------

Optimizer::Optimizer(std::vector<ParamGroup> groups, double lr, double weight_decay,
                     const char* name)
    : groups_(std::move(groups)), lr_(lr), weight_decay_(weight_decay), name_(name) {
  TAPER_CHECK(lr >= 0.0 && std::isfinite(lr), name_, ": invalid learning rate: ", lr);
  TAPER_CHECK(weight_decay >= 0.0, name_, ": invalid weight_decay value: ", weight_decay);
  std::set<uint64_t> seen;
  size_t n = 0;
  for (const ParamGroup& g : groups_) {
    TAPER_CHECK(!g.weight_decay || *g.weight_decay >= 0.0, name_,
                ": invalid weight_decay value in a parameter group: ", *g.weight_decay);
    for (const Var& p : g.params) {
      TAPER_CHECK(p.defined() && is_float(p.dtype()), name_,
                  ": parameters must be defined float Vars");
      TAPER_CHECK(seen.insert(p.id()).second, name_,
                  ": a parameter appears twice in the parameter list");
      ++n;
    }
  }
  state_.resize(n);
}

void Optimizer::set_lr(double lr) {
  TAPER_CHECK(lr >= 0.0 && std::isfinite(lr), name_, ": invalid learning rate: ", lr);
  lr_ = lr;
}

std::vector<Var> Optimizer::parameters() const {
  std::vector<Var> out;
  for (const ParamGroup& g : groups_) out.insert(out.end(), g.params.begin(), g.params.end());
  return out;
}

void Optimizer::step(const GradStore& grads) {
  NoGradGuard ng;
  ++step_count_;
  size_t i = 0;
  for (ParamGroup& grp : groups_) {
    const double wd = grp.weight_decay.value_or(weight_decay_);
    for (Var& p : grp.params) {
      State& s = state_[i++];
      const std::optional<Tensor> g = grads.get(p);
      if (!g) continue;
      TAPER_CHECK(g->shape() == p.shape() && g->device() == p.device(), name_,
                  ": gradient ", g->shape().to_string(), " on ", g->device().to_string(),
                  " does not fit parameter ", p.shape().to_string(), " on ",
                  p.device().to_string());
      s.writable = writable_in_place(p);  // before update's own handles on the storage
      update(p, s, g->detach(), wd);
    }
  }
}

void Optimizer::step() { step(accum_); }

void Optimizer::accumulate(const GradStore& grads) {
  NoGradGuard ng;
  for (const Var& p : parameters())
    if (auto g = grads.get(p)) accum_.accumulate(p, g->detach());
}

void Optimizer::zero_grad() { accum_ = GradStore(); }

Tensor Optimizer::compute_value(const Var& p, State& s) {
  if (!is_half(p.dtype())) return p.value();
  if (!s.master.defined()) s.master = p.value().to_dtype(DType::F32).contiguous();
  return s.master;
}

bool Optimizer::writable_in_place(const Var& p) {
  // Only the Var's own handle holds the storage: no recorded graph keeps a snapshot of it and
  // no view or other tensor shares it, so overwriting it changes nothing anyone else reads.
  return p.is_contiguous() && p.impl_ptr()->storage.use_count() == 1;
}

void Optimizer::write_back(Var& p, State& s, const Tensor& value) {
  if (is_half(p.dtype())) s.master = value;
  // Into the parameter's own storage when nothing else reads it, as PyTorch's optimizers
  // update in place: a captured graph (cuda::Graph) reads its parameters where they were.
  // Else a new value (Var::set), so a graph recorded before the step keeps what it saw. A half
  // parameter gets the value rounded once; a value already written there needs nothing.
  if (value.dtype() == p.dtype() && value.data_ptr() == p.data_ptr() && value.is_contiguous())
    return;
  if (s.writable)
    p.value().copy_from(value);  // to_dtype's rounding for a half parameter
  else
    p.set(value.to_dtype(p.dtype()));
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state_dict() const {
  std::vector<std::pair<std::string, Tensor>> out;
  out.emplace_back("step", Tensor::from_vector(std::vector<int64_t>{step_count_}, Shape({1})));
  out.emplace_back("lr", Tensor::from_vector(std::vector<double>{lr_}, Shape({1})));
  const std::vector<std::string> slots = slot_names();
  for (size_t i = 0; i < state_.size(); ++i) {
    const State& s = state_[i];
    const std::string k = std::to_string(i) + ".";
    out.emplace_back(k + "step", Tensor::from_vector(std::vector<int64_t>{s.step}, Shape({1})));
    if (s.master.defined()) out.emplace_back(k + "master", clone(s.master));
    const Tensor* st[2] = {&s.slot0, &s.slot1};
    for (size_t j = 0; j < slots.size() && j < 2; ++j)
      if (st[j]->defined()) out.emplace_back(k + slots[j], clone(*st[j]));
  }
  return out;
}

void Optimizer::load_state_dict(const std::vector<std::pair<std::string, Tensor>>& state,
                                const std::string& prefix) {
  std::unordered_map<std::string, Tensor> by;
  for (const auto& [n, t] : state)
    if (n.compare(0, prefix.size(), prefix) == 0) by.emplace(n.substr(prefix.size()), t);
  auto need = [&](const std::string& k) -> const Tensor& {
    auto it = by.find(k);
    TAPER_CHECK(it != by.end(), name_, "::load_state_dict: missing key '", prefix + k, "'");
    return it->second;
  };
  const std::vector<Var> params = parameters();
  std::vector<State> fresh(state_.size());
  const std::vector<std::string> slots = slot_names();
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string k = std::to_string(i) + ".";
    fresh[i].step = static_cast<int64_t>(need(k + "step").item());
    auto take = [&](const std::string& key, DType dt) -> Tensor {
      auto it = by.find(key);
      if (it == by.end()) return Tensor();
      const Tensor& t = it->second;
      TAPER_CHECK(t.shape() == params[i].shape() && t.dtype() == dt, name_,
                  "::load_state_dict: '", prefix + key, "' is ", dtype_name(t.dtype()), " ",
                  t.shape().to_string(), ", parameter ", i, " needs ", dtype_name(dt), " ",
                  params[i].shape().to_string());
      return clone(t.to_device(params[i].device()));
    };
    const DType cd = stat_dtype(params[i].dtype());
    if (is_half(params[i].dtype())) fresh[i].master = take(k + "master", DType::F32);
    if (slots.size() > 0) fresh[i].slot0 = take(k + slots[0], cd);
    if (slots.size() > 1) fresh[i].slot1 = take(k + slots[1], cd);
  }
  const int64_t steps = static_cast<int64_t>(need("step").item());
  const double lr = need("lr").item();
  state_ = std::move(fresh);
  step_count_ = steps;
  set_lr(lr);
}

// ---- SGD ------------------------------------------------------------------------------------------

SGD::SGD(std::vector<Var> params, const SGDOptions& o)
    : SGD(std::vector<ParamGroup>{ParamGroup{std::move(params), std::nullopt}}, o) {}

SGD::SGD(std::vector<ParamGroup> groups, const SGDOptions& o)
    : Optimizer(std::move(groups), o.lr(), o.weight_decay(), "SGD"), options_(o) {
  TAPER_CHECK(o.momentum() >= 0.0, "SGD: invalid momentum value: ", o.momentum());
  TAPER_CHECK(!o.nesterov() || (o.momentum() > 0.0 && o.dampening() == 0.0),
              "SGD: Nesterov momentum requires a momentum and zero dampening");
}

void SGD::update(Var& p, State& s, const Tensor& g, double wd) {
  ++s.step;
  const Tensor w = compute_value(p, s);
  Tensor d = g.to_dtype(w.dtype());
  if (wd != 0.0) d = d + w * wd;
  const double mom = options_.momentum();
  if (mom != 0.0) {
    s.slot0 = s.slot0.defined() ? s.slot0 * mom + d * (1.0 - options_.dampening()) : d;
    d = options_.nesterov() ? d + s.slot0 * mom : s.slot0;
  }
  write_back(p, s, w - d * lr_);
}

// ---- AdamW ----------------------------------------------------------------------------------------

AdamW::AdamW(std::vector<Var> params, const AdamWOptions& o)
    : AdamW(std::vector<ParamGroup>{ParamGroup{std::move(params), std::nullopt}}, o) {}

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWOptions& o)
    : Optimizer(std::move(groups), o.lr(), o.weight_decay(), "AdamW"), options_(o) {
  TAPER_CHECK(o.beta1() >= 0.0 && o.beta1() < 1.0, "AdamW: invalid beta parameter at index 0: ",
              o.beta1());
  TAPER_CHECK(o.beta2() >= 0.0 && o.beta2() < 1.0, "AdamW: invalid beta parameter at index 1: ",
              o.beta2());
  TAPER_CHECK(o.eps() >= 0.0, "AdamW: invalid epsilon value: ", o.eps());
}

void AdamW::update(Var& p, State& s, const Tensor& g, double wd) {
  const DType cd = stat_dtype(p.dtype());
  if (!s.slot0.defined()) {
    s.slot0 = Tensor::zeros(p.shape(), cd, p.device());
    s.slot1 = Tensor::zeros(p.shape(), cd, p.device());
  }
  ++s.step;
  const double b1 = options_.beta1(), b2 = options_.beta2(), eps = options_.eps();
  const double bc1 = 1.0 - std::pow(b1, double(s.step));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(b2, double(s.step)));
  const double step_size = lr_ / bc1, decay = 1.0 - lr_ * wd;
  const bool in_place = is_half(p.dtype()) || s.writable;  // the master is ours
  Tensor w = compute_value(p, s);

  if (options_.fused()) {
    // One registry op (a kernel per device, a composed form elsewhere): the same bits as the
    // tensor-op form below.
    // In place: m, v and w (the parameter's storage, or the master copy's) are overwritten;
    // a parameter that something else reads gets a copy updated instead (write_back sets it).
    // A half parameter that may be overwritten gets the master's new value rounded in the same
    // pass.
    const bool round_into_p = is_half(p.dtype()) && s.writable;
    OpAttrs a;
    a.reals = {decay, b1, b2, eps, step_size, bc2_sqrt};
    a.flag = true;
    // A half gradient as it is: the op widens it as it reads it (no f32 copy).
    const bool as_is = g.dtype() == cd || (cd == DType::F32 && is_half(g.dtype()));
    const Tensor gk = (as_is ? g : g.to_dtype(cd)).contiguous();
    const std::vector<Tensor> r =
        dispatch(OpId::adamw_step,
                 {in_place ? w.contiguous() : clone(w), gk, s.slot0, s.slot1,
                  round_into_p ? p.value() : Tensor()},
                 a);
    s.slot0 = r[1];
    s.slot1 = r[2];
    if (round_into_p)
      s.master = r[0];
    else
      write_back(p, s, r[0]);
    return;
  }
  // The same update from tensor ops (AdamWOptions::fused(false)), in the op's order.
  const Tensor gc = g.to_dtype(cd).contiguous();
  const Tensor m1 = s.slot0 + (gc - s.slot0) * (1.0 - b1);
  const Tensor v1 = s.slot1 * b2 + (gc * gc) * (1.0 - b2);
  s.slot0 = m1;
  s.slot1 = v1;
  write_back(p, s, w * decay - (m1 / (v1.sqrt() / bc2_sqrt + eps)) * step_size);
}

// ---- clipping and schedules -----------------------------------------------------------------------

double clip_grad_norm(const std::vector<Var>& params, GradStore& grads, double max_norm) {
  TAPER_CHECK(max_norm >= 0.0, "clip_grad_norm: max_norm must be >= 0, got ", max_norm);
  NoGradGuard ng;
  Tensor sq;  // on the parameters' device: the host reads it once, below
  std::vector<std::pair<Var, Tensor>> have;
  for (const Var& p : params) {
    const std::optional<Tensor> g = grads.get(p);
    if (!g) continue;
    have.emplace_back(p, *g);
    // Sum of squares accumulated in f32 (f64 for f64) inside the reduction, in f64 across tensors.
    const Tensor s =
        g->detach().to_dtype(stat_dtype(g->dtype())).sqr().sum_all().to_dtype(DType::F64);
    sq = sq.defined() ? sq + s : s;
  }
  const double norm = sq.defined() ? std::sqrt(sq.item()) : 0.0;
  if (norm > max_norm) {
    const double coef = max_norm / (norm + 1e-6);
    for (auto& [p, g] : have) grads.insert(p, g.detach() * coef);
  }
  return norm;
}

double LrSchedule::apply(Optimizer& opt) const {
  const double lr = lr_at(opt.step_count());
  opt.set_lr(lr);
  return lr;
}

namespace {
// Fraction of the decay phase done at `step`, in [0, 1].
double progress(int64_t step, int64_t warmup, int64_t total) {
  const double span = static_cast<double>(std::max<int64_t>(1, total - warmup));
  return std::clamp(static_cast<double>(step - warmup) / span, 0.0, 1.0);
}
}  // namespace

WarmupCosineSchedule::WarmupCosineSchedule(double base_lr, int64_t warmup_steps,
                                           int64_t total_steps, double min_lr)
    : base_lr_(base_lr), min_lr_(min_lr), warmup_(warmup_steps), total_(total_steps) {
  TAPER_CHECK(warmup_steps >= 0 && total_steps >= warmup_steps && base_lr >= 0 && min_lr >= 0,
              "WarmupCosineSchedule: bad arguments base_lr=", base_lr, " warmup=", warmup_steps,
              " total=", total_steps, " min_lr=", min_lr);
}

double WarmupCosineSchedule::lr_at(int64_t step) const {
  if (step < warmup_) return base_lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_);
  const double pr = progress(step, warmup_, total_);
  return min_lr_ + (base_lr_ - min_lr_) * 0.5 * (1.0 + std::cos(M_PI * pr));
}

WarmupLinearSchedule::WarmupLinearSchedule(double base_lr, int64_t warmup_steps,
                                           int64_t total_steps, double end_lr)
    : base_lr_(base_lr), end_lr_(end_lr), warmup_(warmup_steps), total_(total_steps) {
  TAPER_CHECK(warmup_steps >= 0 && total_steps >= warmup_steps && base_lr >= 0 && end_lr >= 0,
              "WarmupLinearSchedule: bad arguments base_lr=", base_lr, " warmup=", warmup_steps,
              " total=", total_steps, " end_lr=", end_lr);
}

double WarmupLinearSchedule::lr_at(int64_t step) const {
  if (step < warmup_) return base_lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_);
  return base_lr_ + (end_lr_ - base_lr_) * progress(step, warmup_, total_);
}

}  // namespace taper::nn
