// registry.cpp: the op table and the dispatcher.
//
// Dispatch order: the kernel for (op, device kind, dtype); else, for a fused op, its composed
// form; else an Error naming the op, device, dtype and shapes. A graph edge is recorded only when
// recording is on and an input tracks gradients.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <string_view>
#include <tuple>

#include "taper/autograd.h"
#include "taper/op.h"

namespace taper {
namespace {

constexpr std::string_view kOpNames[] = {
#define TAPER_X(name, arity, nout, nsaved, diff, attrs) #name,
    TAPER_OPS(TAPER_X)
#undef TAPER_X
};
static_assert(sizeof(kOpNames) / sizeof(kOpNames[0]) == kNumOps, "op name table out of sync");

std::vector<OpDef>& table() {
  static std::vector<OpDef>* t = [] {
    auto* v = new std::vector<OpDef>();
#define TAPER_X(name, arity, nout, nsaved, diff, attrs) \
  v->push_back(OpDef{#name, arity, nout, nsaved, diff, attrs});
    TAPER_OPS(TAPER_X)
#undef TAPER_X
    for (size_t i = 0; i < v->size(); ++i) (*v)[i].bwd = backward_rule(static_cast<OpId>(i));
    return v;
  }();
  return *t;
}

thread_local std::vector<bool> t_composed_only(kNumOps, false);

// TAPER_COMPOSED_OPS, read once at the first dispatch (an unknown name is an Error there).
const std::vector<bool>& env_composed_only() {
  static const std::vector<bool> v = [] {
    const char* e = std::getenv("TAPER_COMPOSED_OPS");
    return detail::parse_composed_ops(e == nullptr ? "" : e);
  }();
  return v;
}

/// Whether `op` is forced to its composed form here (ComposedOnlyGuard, TAPER_COMPOSED_OPS).
bool forced_composed(OpId op) {
  const size_t i = static_cast<size_t>(op);
  return t_composed_only[i] || env_composed_only()[i];
}

std::string describe_inputs(const std::vector<Tensor>& in) {
  std::ostringstream os;
  for (size_t i = 0; i < in.size(); ++i) {
    if (i) os << ", ";
    if (!in[i].defined()) {
      os << "undefined";
      continue;
    }
    os << in[i].shape().to_string() << " " << dtype_name(in[i].dtype());
  }
  return os.str();
}

// The table's contract for what a kernel returns: n_out + n_saved tensors, the saved ones in
// stat_dtype of the input dtype (the backward rules read them as such). A mismatch is a bug of
// the kernel: an Error naming it, not a wrong gradient later.
void check_outputs(const OpDef& d, Device dev, DType dt, const std::vector<Tensor>& outs) {
  const size_t want = static_cast<size_t>(d.n_out + d.n_saved);
  TAPER_CHECK(outs.size() == want, "internal error: the ", dev.to_string(), " kernel of ", d.name,
              " returned ", outs.size(), " outputs, the op table says ", d.n_out, " + ",
              d.n_saved, " saved");
  for (size_t i = static_cast<size_t>(d.n_out); i < want; ++i)
    TAPER_CHECK(outs[i].defined() && outs[i].dtype() == stat_dtype(dt), "internal error: the ",
                dev.to_string(), " kernel of ", d.name, " saved output ", i, " as ",
                outs[i].defined() ? dtype_name(outs[i].dtype()) : "undefined",
                ", the op table says ", dtype_name(stat_dtype(dt)), " for ", dtype_name(dt),
                " inputs");
}

}  // namespace

OpDef& op_def(OpId op) { return table()[static_cast<size_t>(op)]; }
std::string_view op_name(OpId op) { return kOpNames[static_cast<size_t>(op)]; }

void register_kernel(OpId op, DeviceKind kind, uint32_t dtypes, KernelFn fn,
                     bool needs_contiguous) {
  KernelSlot& s = op_def(op).kernels[static_cast<int>(kind)];
  s.fn = fn;
  s.dtypes = dtypes;
  s.needs_contiguous = needs_contiguous;
}

void register_composed(OpId op, ComposedFn fn) { op_def(op).composed = fn; }

bool has_kernel(OpId op, Device dev, DType dt) {
  const KernelSlot& s = op_def(op).kernels[static_cast<int>(dev.kind())];
  return s.fn != nullptr && (s.dtypes & dtype_bit(dt)) != 0;
}

bool runs_kernel(OpId op, Device dev, DType dt) {
  return has_kernel(op, dev, dt) && !(op_def(op).composed && forced_composed(op));
}

namespace detail {
// Makes `outs[0..n_out)` results of a new graph node over `in` (when recording applies) and
// returns the user-visible outputs.
std::vector<Tensor> record(OpId op, const std::vector<Tensor>& in, std::vector<Tensor> outs,
                           const OpAttrs& attrs) {
  const OpDef& d = op_def(op);
  bool track = false;
  if (d.differentiable && grad_enabled())
    for (const Tensor& t : in)
      if (t.defined() && t.tracks_grad()) track = true;
  if (track) {
    auto node = std::make_shared<Node>();
    node->op = op;
    node->attrs = attrs;
    // The node keeps alive only the values its backward rule reads (SAVES in backward.cpp):
    // any other input is kept value-free (shape, dtype, device, identity and edge), any other
    // output not at all, so an activation no rule reads is freed as soon as the forward is done
    // with it. A Var's value may be replaced (Var::set, an optimizer step) before backward
    // runs: the node keeps the value it saw, under the Var's identity, so the gradient is the
    // recorded graph's and accumulates for that Var.
    const SavedValues keep = saved_values_rule(op)(in);
    node->inputs.reserve(in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      const Tensor& t = in[i];
      if (!t.defined())
        node->inputs.push_back(t);
      else if (!keep.input(i))
        node->inputs.push_back(value_free(t));
      else
        node->inputs.push_back(t.impl_ptr()->is_var
                                   ? Tensor(std::make_shared<TensorImpl>(*t.impl_ptr()))
                                   : t);
    }
    node->outputs.reserve(outs.size());
    for (size_t k = 0; k < outs.size(); ++k)
      node->outputs.push_back(keep.output(k) ? outs[k].detach() : Tensor());
    for (int i = 0; i < d.n_out; ++i) {
      // Kernel outputs are fresh handles: give them the edge in place.
      TensorImpl& impl = *outs[i].impl_ptr();
      impl.grad_fn = node;
      impl.out_index = static_cast<uint32_t>(i);
    }
  }
  outs.resize(static_cast<size_t>(d.n_out));
  return outs;
}
}  // namespace detail

namespace {
std::atomic<uint64_t> t_kernel_calls[kNumDeviceKinds];

struct Profile {
  std::mutex mu;
  std::map<std::tuple<int, int, int>, OpProfileRow> rows;  // (op, kind, dtype)
};
Profile& profile() {
  static Profile p;
  return p;
}
std::atomic<bool> t_profiling{[] {
  const char* e = std::getenv("TAPER_PROFILE_OPS");
  return e != nullptr && std::string_view(e) == "1";
}()};
}  // namespace

uint64_t kernel_calls(DeviceKind kind) {
  return t_kernel_calls[static_cast<int>(kind)].load(std::memory_order_relaxed);
}

void set_op_profiling(bool on) { t_profiling.store(on); }
bool op_profiling() { return t_profiling.load(std::memory_order_relaxed); }
std::vector<OpProfileRow> op_profile() {
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mu);
  std::vector<OpProfileRow> out;
  for (const auto& [k, r] : p.rows) out.push_back(r);
  std::sort(out.begin(), out.end(),
            [](const OpProfileRow& a, const OpProfileRow& b) { return a.seconds > b.seconds; });
  return out;
}
void reset_op_profile() {
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mu);
  p.rows.clear();
}

std::vector<Tensor> dispatch(OpId op, const std::vector<Tensor>& in, const OpAttrs& attrs) {
  const OpDef& d = op_def(op);
  TAPER_ASSERT(d.arity < 0 || static_cast<size_t>(d.arity) == in.size());
  // Device and dtype: the first defined input's (an undefined one is "none" or, for the binary
  // ops and where_cond, the scalar attrs.f0), the attributes' for creation ops.
  const auto first =
      std::find_if(in.begin(), in.end(), [](const Tensor& t) { return t.defined(); });
  const Device dev = first == in.end() ? attrs.device : first->device();
  const DType dt = first == in.end() ? attrs.dtype : first->dtype();
  for (const Tensor& t : in)
    TAPER_CHECK(!t.defined() || t.device() == dev, d.name, ": inputs on different devices (",
                dev.to_string(), " and ", t.device().to_string(), ")");
  TAPER_CHECK(dev.is_cpu() || (dev.ordinal() >= 0 && dev.ordinal() < device_count(dev.kind())),
              d.name, ": device ", dev.to_string(), " is not available (",
              device_count(dev.kind()), " such devices present)");
  // A value-free input is a graph node's record of a value its backward rule declared it would
  // not read (SAVES in backward.cpp): reading it is a bug of that rule, not garbage to compute on.
  for (const Tensor& t : in)
    TAPER_CHECK(!is_value_free(t), "internal error: ", d.name, " was given a value-free ",
                t.shape().to_string(), " ", dtype_name(t.dtype()),
                " tensor (a backward rule read a value its SAVES line does not keep)");
  const KernelSlot& slot = d.kernels[static_cast<int>(dev.kind())];
  const bool has = has_kernel(op, dev, dt);
  if (d.composed && !runs_kernel(op, dev, dt)) {
    std::vector<Tensor> outs = d.composed(in, attrs);
    outs.resize(static_cast<size_t>(d.n_out));
    return outs;
  }
  TAPER_CHECK(has, d.name, ": no kernel for dtype ", dtype_name(dt), " on device ",
              dev.to_string(), " (inputs: ", describe_inputs(in), ")");
  t_kernel_calls[static_cast<int>(dev.kind())].fetch_add(1, std::memory_order_relaxed);
  const bool prof = op_profiling();
  std::chrono::steady_clock::time_point t0;
  if (prof) {
    synchronize(dev);
    t0 = std::chrono::steady_clock::now();
  }
  std::vector<Tensor> outs;
  if (slot.needs_contiguous) {
    std::vector<Tensor> cin;
    cin.reserve(in.size());
    for (const Tensor& t : in)
      cin.push_back(!t.defined() || t.is_contiguous() ? t : t.detach().contiguous());
    outs = slot.fn(cin, attrs);
  } else {
    outs = slot.fn(in, attrs);
  }
  if (prof) {
    synchronize(dev);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    Profile& p = profile();
    std::lock_guard<std::mutex> lock(p.mu);
    OpProfileRow& r =
        p.rows[{static_cast<int>(op), static_cast<int>(dev.kind()), static_cast<int>(dt)}];
    r.op = op;
    r.kind = dev.kind();
    r.dtype = dt;
    ++r.calls;
    r.seconds += s;
  }
  check_outputs(d, dev, dt, outs);
  return detail::record(op, in, std::move(outs), attrs);
}

Tensor dispatch1(OpId op, const std::vector<Tensor>& in, const OpAttrs& attrs) {
  return dispatch(op, in, attrs)[0];
}

namespace detail {
std::vector<bool> parse_composed_ops(std::string_view list) {
  std::vector<bool> on(kNumOps, false);
  while (!list.empty()) {
    const size_t comma = list.find(',');
    const std::string_view name = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    if (name.empty()) continue;
    if (name == "all") {
      for (size_t i = 0; i < kNumOps; ++i) on[i] = table()[i].composed != nullptr;
      continue;
    }
    const auto* it = std::find(std::begin(kOpNames), std::end(kOpNames), name);
    const size_t i = static_cast<size_t>(it - std::begin(kOpNames));
    TAPER_CHECK(it != std::end(kOpNames) && table()[i].composed != nullptr,
                "TAPER_COMPOSED_OPS: '", name, "' is not ",
                it == std::end(kOpNames) ? "an op" : "an op with a composed form",
                " (give fused op names such as attention,attention_bwd, or all)");
    on[i] = true;
  }
  return on;
}
}  // namespace detail

ComposedOnlyGuard::ComposedOnlyGuard() : saved_(t_composed_only) {
  t_composed_only.assign(kNumOps, true);
}
ComposedOnlyGuard::ComposedOnlyGuard(std::vector<OpId> ops) : saved_(t_composed_only) {
  for (OpId op : ops) t_composed_only[static_cast<size_t>(op)] = true;
}
ComposedOnlyGuard::~ComposedOnlyGuard() { t_composed_only = saved_; }

}  // namespace taper
