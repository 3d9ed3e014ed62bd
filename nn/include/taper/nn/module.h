// module.h: `Module`, the base of every layer, and the containers `Sequential` and `ModuleList`.
//
// What it is: the LibTorch-style module tree. A module registers its parameters (`Var`s),
// buffers (plain tensors) and children under names; `named_parameters()` joins the names with
// dots (`encoder.layer.0.attention.self.query.weight`), which are the keys of a safetensors
// checkpoint, so `save`/`load` work by name. Registration order is iteration order.
// What it is not: the layers themselves (layers.h, attention.h) or the optimizers (optim.h).
//
// Parameters are shared handles: the `Var` a layer keeps as a member and the one in the
// registry are the same leaf, so an optimizer's `Var::set` or `Module::to` is seen by both.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "taper/nn/options.h"
#include "taper/tensor.h"

namespace taper::safetensors {
class File;
}

namespace taper::nn {

/// Seeds parameter initialisation and dropout, as `torch::manual_seed`: every module built
/// afterwards draws its seeds from a counter started at `seed`, so a model built in the same
/// order after the same `manual_seed` has the same weights whatever the threads.
void manual_seed(uint64_t seed);
/// The next seed of that counter.
uint64_t next_seed();

/// Replaces the value behind `handle` (a parameter or buffer) in place, keeping its identity,
/// like PyTorch's `param.data = value`: dtype and device may change, every copy of the handle
/// sees the new value. Not recorded by autograd.
void replace_value(const Tensor& handle, const Tensor& value);

/// Options of `Module::load`.
struct LoadOptions {
  /// Fail (with every missing and unexpected key in the message) unless the file's keys and the
  /// module's parameter and buffer names match exactly. Checked before anything is modified.
  TAPER_ARG(bool, strict) = true;
  /// Convert a tensor whose dtype differs from the parameter's; otherwise that is an error.
  TAPER_ARG(bool, convert_dtype) = false;
  /// Prepended to every module name to form the file key (e.g. "bert." for a checkpoint that
  /// holds a whole BertForX model); file keys without it count as unexpected.
  TAPER_ARG(std::string, prefix) = "";
};

/// What a load did: keys the module has but the source lacks, keys the source has that the
/// module does not, and keys whose dtype was converted.
struct LoadReport {
  std::vector<std::string> missing;
  std::vector<std::string> unexpected;
  std::vector<std::string> converted;
  /// One line per category, for logs.
  std::string to_string() const;
};

/// Base of every layer. A plain `Module` is also a container: `register_module("a.b.c", m)`
/// creates the containers `a` and `a.b` when they are missing, so a layer can lay its
/// parameters out under a checkpoint's names.
class Module {
 public:
  explicit Module(std::string type_name = "Module");
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  /// The single-input forward; layers that take one tensor override it (`Sequential` calls
  /// it). The default throws an Error naming the module type.
  virtual Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }
  /// "Linear", "LayerNorm", ...
  const std::string& type_name() const { return type_name_; }

  // ---- registration ----------------------------------------------------------------------------
  /// Registers `value` as a trainable parameter (a new leaf sharing its storage) and returns it.
  /// A dotted name puts it in (possibly new) child containers.
  Var register_parameter(const std::string& name, const Tensor& value);
  /// Registers a non-trainable tensor; persistent buffers are saved and loaded with the
  /// parameters, others are not.
  Tensor register_buffer(const std::string& name, const Tensor& value, bool persistent = true);
  /// Registers a child module and returns it (typed).
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    register_module_impl(name, module);
    return module;
  }

  // ---- inspection ------------------------------------------------------------------------------
  std::vector<Var> parameters(bool recurse = true) const;
  /// (dotted name, parameter), in registration order, depth first.
  std::vector<std::pair<std::string, Var>> named_parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  /// Every descendant (not this module) with its dotted path, depth first.
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules() const;
  /// The child at a dotted path, or null.
  std::shared_ptr<Module> child(const std::string& path) const;
  /// The parameter at a dotted path; throws Error when there is none.
  Var parameter(const std::string& path) const;
  /// Parameters then persistent buffers, by dotted name: what `save` writes.
  std::vector<std::pair<std::string, Tensor>> state_dict() const;
  /// Total number of parameter elements.
  size_t num_parameters() const;

  // ---- mode and placement ----------------------------------------------------------------------
  /// Training mode (dropout active) for this module and its descendants.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  /// Converts every float parameter and buffer to `dt` in place (identities kept). Build the
  /// optimizer after this: it keeps per-parameter state of the old dtype otherwise.
  Module& to(DType dt);
  /// Moves every parameter and buffer to `dev` in place.
  Module& to(Device dev);

  // ---- checkpoints -----------------------------------------------------------------------------
  /// Writes `state_dict()` to a safetensors file.
  void save(const std::string& path,
            const std::map<std::string, std::string>& metadata = {}) const;
  /// Loads parameters and persistent buffers by name from a safetensors file (memory-mapped).
  /// Shapes must match; dtypes must match unless `convert_dtype`. Throws Error (naming the file
  /// and the key) on any mismatch, and in strict mode on missing or unexpected keys; nothing is
  /// modified when it throws.
  LoadReport load(const std::string& path, const LoadOptions& opts = LoadOptions());
  /// The same from an open file.
  LoadReport load(const safetensors::File& file, const LoadOptions& opts = LoadOptions());
  /// The same from named tensors (`source_name` appears in error messages).
  LoadReport load_state_dict(const std::vector<std::pair<std::string, Tensor>>& tensors,
                             const LoadOptions& opts = LoadOptions(),
                             const std::string& source_name = "state dict");

 protected:
  void register_module_impl(const std::string& name, std::shared_ptr<Module> module);

 private:
  struct Buffer {
    std::string name;
    Tensor value;
    bool persistent;
  };
  Module* container_for(const std::string& name, std::string* leaf);
  std::vector<std::pair<std::string, Tensor>> load_targets() const;
  void check_new_name(const std::string& name) const;
  template <class F> void visit(const std::string& prefix, F&& f) const;

  std::string type_name_;
  bool training_ = true;
  std::vector<std::pair<std::string, Var>> params_;
  std::vector<Buffer> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

/// Applies its children in order; children are named "0", "1", ...
class Sequential : public Module {
 public:
  Sequential();
  Sequential(std::initializer_list<std::shared_ptr<Module>> modules);
  /// Appends a module (named by its index).
  void push_back(std::shared_ptr<Module> module);
  Tensor forward(const Tensor& x) override;
  size_t size() const { return modules_.size(); }
  const std::shared_ptr<Module>& operator[](size_t i) const { return modules_.at(i); }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

/// An indexed list of modules named "0", "1", ... (BERT's `encoder.layer.N`); no forward.
class ModuleList : public Module {
 public:
  ModuleList();
  void push_back(std::shared_ptr<Module> module);
  size_t size() const { return modules_.size(); }
  const std::shared_ptr<Module>& operator[](size_t i) const { return modules_.at(i); }
  /// The i-th module as `M` (throws Error when it is not one).
  template <class M> std::shared_ptr<M> at(size_t i) const {
    auto m = std::dynamic_pointer_cast<M>(modules_.at(i));
    TAPER_CHECK(m != nullptr, "ModuleList::at: module ", i, " is a ", modules_.at(i)->type_name());
    return m;
  }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

}  // namespace taper::nn
