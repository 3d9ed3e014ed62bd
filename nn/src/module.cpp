// module.cpp: the Module tree (registration, dotted names, mode, placement), the containers,
// and loading/saving by name.
#include "taper/nn/module.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <set>
#include <unordered_map>

#include "taper/autograd.h"
#include "seed_mix.h"
#include "taper/nn/safetensors.h"

namespace taper::nn {

namespace {
std::atomic<uint64_t> g_seed_counter{0x5eed'0000'0000'0001ull};

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

std::string list_keys(const std::vector<std::string>& keys) {
  std::string out;
  const size_t shown = std::min<size_t>(keys.size(), 20);
  for (size_t i = 0; i < shown; ++i) out += (i ? ", " : "") + keys[i];
  if (keys.size() > shown) out += ", ... (" + std::to_string(keys.size() - shown) + " more)";
  return out;
}

// What a load reads from: a file (metadata without reading data) or a list of tensors.
struct Source {
  std::string name;
  std::vector<std::string> keys;
  std::function<DType(const std::string&)> dtype;
  std::function<Shape(const std::string&)> shape;
  std::function<Tensor(const std::string&, Device)> get;
};
}  // namespace

void manual_seed(uint64_t seed) { g_seed_counter.store(seed); }
uint64_t next_seed() { return detail::mix_seed(g_seed_counter.fetch_add(1)); }

void replace_value(const Tensor& handle, const Tensor& value) {
  TAPER_CHECK(handle.defined() && value.defined(), "replace_value: undefined tensor");
  TAPER_CHECK(handle.shape() == value.shape(), "replace_value: shape ",
              value.shape().to_string(), " differs from ", handle.shape().to_string());
  const Tensor v = value.detach();
  TensorImpl& impl = *handle.impl_ptr();
  impl.storage = v.storage();
  impl.layout = v.layout();
  impl.dtype = v.dtype();
}

std::string LoadReport::to_string() const {
  std::string out;
  out += "missing (" + std::to_string(missing.size()) + "): " + list_keys(missing) + "\n";
  out += "unexpected (" + std::to_string(unexpected.size()) + "): " + list_keys(unexpected) + "\n";
  out += "converted (" + std::to_string(converted.size()) + "): " + list_keys(converted) + "\n";
  return out;
}

// ---- Module ---------------------------------------------------------------------------------------

Module::Module(std::string type_name) : type_name_(std::move(type_name)) {}

Tensor Module::forward(const Tensor&) {
  throw Error(taper::detail::str_cat(type_name_, "::forward: this module does not take a single tensor"));
}

void Module::check_new_name(const std::string& name) const {
  TAPER_CHECK(!name.empty() && name.find('.') == std::string::npos, type_name_,
              ": bad name '", name, "' (empty or dotted)");
  auto taken = [&](const auto& v) {
    return std::any_of(v.begin(), v.end(), [&](const auto& e) { return e.first == name; });
  };
  const bool buf = std::any_of(buffers_.begin(), buffers_.end(),
                               [&](const Buffer& b) { return b.name == name; });
  TAPER_CHECK(!taken(params_) && !taken(children_) && !buf, type_name_, ": name '", name,
              "' is already registered");
}

Module* Module::container_for(const std::string& name, std::string* leaf) {
  TAPER_CHECK(!name.empty(), type_name_, ": empty name");
  Module* m = this;
  size_t start = 0;
  for (size_t dot; (dot = name.find('.', start)) != std::string::npos; start = dot + 1) {
    const std::string seg = name.substr(start, dot - start);
    auto it = std::find_if(m->children_.begin(), m->children_.end(),
                           [&](const auto& c) { return c.first == seg; });
    if (it != m->children_.end()) {
      m = it->second.get();
    } else {
      auto c = std::make_shared<Module>();
      m->register_module_impl(seg, c);
      m = c.get();
    }
  }
  *leaf = name.substr(start);
  return m;
}

Var Module::register_parameter(const std::string& name, const Tensor& value) {
  std::string leaf;
  Module* m = container_for(name, &leaf);
  m->check_new_name(leaf);
  TAPER_CHECK(value.defined() && is_float(value.dtype()), type_name_, ": parameter '", name,
              "' must be a defined float tensor");
  NoGradGuard ng;
  Var v = Var::from_tensor(value.detach().contiguous());
  m->params_.emplace_back(leaf, v);
  return v;
}

Tensor Module::register_buffer(const std::string& name, const Tensor& value, bool persistent) {
  std::string leaf;
  Module* m = container_for(name, &leaf);
  m->check_new_name(leaf);
  TAPER_CHECK(value.defined(), type_name_, ": buffer '", name, "' is undefined");
  NoGradGuard ng;
  Tensor t = value.detach().contiguous().detach();
  m->buffers_.push_back({leaf, t, persistent});
  return t;
}

void Module::register_module_impl(const std::string& name, std::shared_ptr<Module> module) {
  TAPER_CHECK(module != nullptr, type_name_, ": module '", name, "' is null");
  std::string leaf;
  Module* m = container_for(name, &leaf);
  m->check_new_name(leaf);
  m->children_.emplace_back(leaf, std::move(module));
}

template <class F> void Module::visit(const std::string& prefix, F&& f) const {
  f(prefix, *this);
  for (const auto& [n, c] : children_) c->visit(join(prefix, n), f);
}

std::vector<std::pair<std::string, Var>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Var>> out;
  if (!recurse) return params_;
  visit("", [&](const std::string& p, const Module& m) {
    for (const auto& [n, v] : m.params_) out.emplace_back(join(p, n), v);
  });
  return out;
}

std::vector<Var> Module::parameters(bool recurse) const {
  std::vector<Var> out;
  for (auto& [n, v] : named_parameters(recurse)) out.push_back(v);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  visit("", [&](const std::string& p, const Module& m) {
    if (!recurse && &m != this) return;
    for (const Buffer& b : m.buffers_) out.emplace_back(join(p, b.name), b.value);
  });
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const {
  return children_;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_modules() const {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  for (const auto& [n, c] : children_) {
    out.emplace_back(n, c);
    for (auto& [cn, cc] : c->named_modules()) out.emplace_back(join(n, cn), cc);
  }
  return out;
}

std::shared_ptr<Module> Module::child(const std::string& path) const {
  const size_t dot = path.find('.');
  const std::string head = path.substr(0, dot);
  for (const auto& [n, c] : children_)
    if (n == head) return dot == std::string::npos ? c : c->child(path.substr(dot + 1));
  return nullptr;
}

Var Module::parameter(const std::string& path) const {
  for (auto& [n, v] : named_parameters())
    if (n == path) return v;
  throw Error(taper::detail::str_cat(type_name_, ": no parameter named '", path, "'"));
}

std::vector<std::pair<std::string, Tensor>> Module::state_dict() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [n, v] : named_parameters()) out.emplace_back(n, v.value());
  visit("", [&](const std::string& p, const Module& m) {
    for (const Buffer& b : m.buffers_)
      if (b.persistent) out.emplace_back(join(p, b.name), b.value);
  });
  return out;
}

size_t Module::num_parameters() const {
  size_t n = 0;
  for (auto& [name, v] : named_parameters()) n += v.elem_count();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

Module& Module::to(DType dt) {
  NoGradGuard ng;
  visit("", [&](const std::string&, const Module& m) {
    for (const auto& [n, v] : m.params_)
      if (v.dtype() != dt && is_float(v.dtype())) replace_value(v, v.value().to_dtype(dt));
    for (const Buffer& b : m.buffers_)
      if (b.value.dtype() != dt && is_float(b.value.dtype()))
        replace_value(b.value, b.value.to_dtype(dt));
  });
  return *this;
}

Module& Module::to(Device dev) {
  NoGradGuard ng;
  visit("", [&](const std::string&, const Module& m) {
    for (const auto& [n, v] : m.params_)
      if (v.device() != dev) replace_value(v, v.value().to_device(dev));
    for (const Buffer& b : m.buffers_)
      if (b.value.device() != dev) replace_value(b.value, b.value.to_device(dev));
  });
  return *this;
}

// ---- checkpoints ----------------------------------------------------------------------------------

void Module::save(const std::string& path, const std::map<std::string, std::string>& metadata) const {
  safetensors::save(state_dict(), path, metadata);
}

namespace {

LoadReport load_from(const std::vector<std::pair<std::string, Tensor>>& targets, const Source& src,
                     const LoadOptions& opts, const std::string& type_name) {
  LoadReport rep;
  std::set<std::string> source_keys(src.keys.begin(), src.keys.end());
  std::set<std::string> used;
  std::vector<std::pair<const Tensor*, std::string>> plan;
  for (const auto& [name, t] : targets) {
    const std::string key = opts.prefix() + name;
    if (!source_keys.count(key)) {
      rep.missing.push_back(key);
      continue;
    }
    used.insert(key);
    const Shape s = src.shape(key);
    TAPER_CHECK(s == t.shape(), type_name, "::load: ", src.name, ": tensor '", key, "' has shape ",
                s.to_string(), " but the module's '", name, "' is ", t.shape().to_string());
    const DType dt = src.dtype(key);
    if (dt != t.dtype()) {
      TAPER_CHECK(opts.convert_dtype(), type_name, "::load: ", src.name, ": tensor '", key,
                  "' is ", dtype_name(dt), " but the module's '", name, "' is ",
                  dtype_name(t.dtype()), " (set LoadOptions().convert_dtype(true) to convert)");
      TAPER_CHECK(is_float(dt) == is_float(t.dtype()), type_name, "::load: ", src.name,
                  ": tensor '", key, "' is ", dtype_name(dt), ", cannot convert to ",
                  dtype_name(t.dtype()), " for '", name, "'");
      rep.converted.push_back(key);
    }
    plan.emplace_back(&t, key);
  }
  for (const std::string& k : src.keys)
    if (!used.count(k)) rep.unexpected.push_back(k);
  if (opts.strict() && (!rep.missing.empty() || !rep.unexpected.empty()))
    throw Error(taper::detail::str_cat(type_name, "::load: ", src.name, " does not match the module (",
                                "strict): ", rep.missing.size(), " missing keys [",
                                list_keys(rep.missing), "]; ", rep.unexpected.size(),
                                " unexpected keys [", list_keys(rep.unexpected), "]"));
  NoGradGuard ng;
  // Read everything first, so a failure while reading leaves the module unchanged.
  std::vector<Tensor> values;
  values.reserve(plan.size());
  for (const auto& [t, key] : plan)
    values.push_back(src.get(key, t->device()).to_dtype(t->dtype()).contiguous());
  // Same shape, dtype and device as the target by now: this is Var::set for parameters.
  for (size_t i = 0; i < plan.size(); ++i) replace_value(*plan[i].first, values[i]);
  return rep;
}

}  // namespace

// The handles (not detached values) of the parameters and persistent buffers.
std::vector<std::pair<std::string, Tensor>> Module::load_targets() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [n, v] : named_parameters()) out.emplace_back(n, v);
  visit("", [&](const std::string& p, const Module& m) {
    for (const Buffer& b : m.buffers_)
      if (b.persistent) out.emplace_back(join(p, b.name), b.value);
  });
  return out;
}

LoadReport Module::load(const std::string& path, const LoadOptions& opts) {
  return load(safetensors::File::open(path), opts);
}

LoadReport Module::load(const safetensors::File& file, const LoadOptions& opts) {
  Source src;
  src.name = "'" + file.path() + "'";
  src.keys = file.names();
  src.dtype = [&](const std::string& k) { return file.info(k).dtype; };
  src.shape = [&](const std::string& k) { return Shape(file.info(k).shape); };
  src.get = [&](const std::string& k, Device d) { return file.get(k, d); };
  return load_from(load_targets(), src, opts, type_name_);
}

LoadReport Module::load_state_dict(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                   const LoadOptions& opts, const std::string& source_name) {
  std::unordered_map<std::string, Tensor> by_name;
  Source src;
  src.name = source_name;
  for (const auto& [n, t] : tensors) {
    TAPER_CHECK(by_name.emplace(n, t).second, type_name_, "::load_state_dict: ", source_name,
                ": key '", n, "' appears twice");
    src.keys.push_back(n);
  }
  src.dtype = [&](const std::string& k) { return by_name.at(k).dtype(); };
  src.shape = [&](const std::string& k) { return by_name.at(k).shape(); };
  src.get = [&](const std::string& k, Device d) { return by_name.at(k).detach().to_device(d); };
  return load_from(load_targets(), src, opts, type_name_);
}

// ---- containers -----------------------------------------------------------------------------------

Sequential::Sequential() : Module("Sequential") {}

Sequential::Sequential(std::initializer_list<std::shared_ptr<Module>> modules)
    : Module("Sequential") {
  for (const auto& m : modules) push_back(m);
}

void Sequential::push_back(std::shared_ptr<Module> module) {
  register_module_impl(std::to_string(modules_.size()), module);
  modules_.push_back(std::move(module));
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (auto& m : modules_) y = m->forward(y);
  return y;
}

ModuleList::ModuleList() : Module("ModuleList") {}

void ModuleList::push_back(std::shared_ptr<Module> module) {
  register_module_impl(std::to_string(modules_.size()), module);
  modules_.push_back(std::move(module));
}

}  // namespace taper::nn
