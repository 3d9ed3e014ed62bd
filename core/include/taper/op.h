// op.h: the op registry and dispatcher: one table of every op, primitive or fused.
//
// What it is: `OpId` (one enum, its name table checked by a static_assert), `OpDef` (name,
// arity, outputs, differentiable flag, one kernel slot per device kind, bwd hook, composed form)
// and `dispatch`, the only meeting point of the tensor front-end, kernels and autograd.
// What it is not: kernels (cpu/, cuda/) or composed forms (metal_fallback/), which register here.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "taper/tensor.h"

namespace taper {

// X(name, arity, n_out, differentiable). arity -1: variadic. n_out counts user-visible outputs;
// a kernel may return more (saved tensors for the backward, e.g. mean and rstd).
#define TAPER_OPS(X)                          \
  /* views: device independent, no kernel */  \
  X(reshape, 1, 1, true)                      \
  X(permute, 1, 1, true)                      \
  X(narrow, 1, 1, true)                       \
  X(broadcast_as, 1, 1, true)                 \
  /* device transfer: no kernel (the backends' copies) */ \
  X(to_device, 1, 1, true)                    \
  /* copy_cast */                             \
  X(copy, 1, 1, true)                         \
  X(to_dtype, 1, 1, true)                     \
  X(fill, 0, 1, false)                        \
  X(arange, 0, 1, false)                      \
  X(rand_uniform, 0, 1, false)                \
  X(rand_normal, 0, 1, false)                 \
  /* unary */                                 \
  X(neg, 1, 1, true)                          \
  X(abs, 1, 1, true)                          \
  X(exp, 1, 1, true)                          \
  X(log, 1, 1, true)                          \
  X(sqrt, 1, 1, true)                         \
  X(rsqrt, 1, 1, true)                        \
  X(recip, 1, 1, true)                        \
  X(sqr, 1, 1, true)                          \
  X(tanh, 1, 1, true)                         \
  X(sigmoid, 1, 1, true)                      \
  X(relu, 1, 1, true)                         \
  X(gelu, 1, 1, true)                         \
  X(gelu_erf, 1, 1, true)                     \
  X(gelu_erf_bwd, 2, 1, false)                \
  X(silu, 1, 1, true)                         \
  X(sin, 1, 1, true)                          \
  X(cos, 1, 1, true)                          \
  X(powf, 1, 1, true)                         \
  X(affine, 1, 1, true)                       \
  X(clamp, 1, 1, true)                        \
  /* binary */                                \
  X(add, 2, 1, true)                          \
  X(sub, 2, 1, true)                          \
  X(mul, 2, 1, true)                          \
  X(div, 2, 1, true)                          \
  X(maximum, 2, 1, true)                      \
  X(minimum, 2, 1, true)                      \
  X(eq, 2, 1, false)                          \
  X(ne, 2, 1, false)                          \
  X(lt, 2, 1, false)                          \
  X(le, 2, 1, false)                          \
  X(gt, 2, 1, false)                          \
  X(ge, 2, 1, false)                          \
  X(where_cond, 3, 1, true)                   \
  X(mul_add, 3, 1, true)                      \
  /* reduce */                                \
  X(sum, 1, 1, true)                          \
  X(max, 1, 1, true)                          \
  X(min, 1, 1, true)                          \
  X(argmax, 1, 1, false)                      \
  X(argmin, 1, 1, false)                      \
  /* matmul */                                \
  X(matmul, 2, 1, true)                       \
  /* index */                                 \
  X(index_select, 2, 1, true)                 \
  X(gather, 2, 1, true)                       \
  X(scatter_add, 3, 1, true)                  \
  X(cat, -1, 1, true)                         \
  X(narrow_bwd, 1, 1, true)                   \
  /* fused (softmax, norm) */                 \
  X(softmax_last_dim, 1, 1, true)             \
  X(log_softmax_last_dim, 1, 1, true)         \
  X(softmax_last_dim_bwd, 3, 1, false)        \
  X(log_softmax_last_dim_bwd, 3, 1, false)     \
  X(rms_norm, 2, 1, true)                     \
  X(layer_norm, 3, 1, true)                   \
  X(group_norm, 3, 1, true)                   \
  X(rms_norm_bwd, 4, 2, false)                \
  X(layer_norm_bwd, 5, 3, false)              \
  X(group_norm_bwd, 5, 3, false)              \
  /* optim (updates of the optimizers; outputs are the new tensors) */ \
  X(adamw_step, 4, 3, false)

/// Every op. `OpId::Count` is the table size.
enum class OpId : uint16_t {
#define TAPER_X(name, arity, nout, diff) name,
  TAPER_OPS(TAPER_X)
#undef TAPER_X
      Count
};
inline constexpr size_t kNumOps = static_cast<size_t>(OpId::Count);

/// Non-tensor arguments of an op. Each op documents which fields it reads (core/op_table.cpp).
struct OpAttrs {
  std::vector<int64_t> ints;   ///< dims (reduce, permute), shapes, or (dim, start, len)
  std::vector<size_t> shape;   ///< target shape (reshape, broadcast_as, creation ops)
  double f0 = 0.0;             ///< eps, mul, exponent, lo, fill value, start
  double f1 = 0.0;             ///< add, hi, step
  int64_t i0 = 0;              ///< a dim, num_groups, an original length
  bool flag = false;           ///< keepdim
  DType dtype = DType::F32;    ///< target dtype (to_dtype, creation ops)
  Device device = Device::cpu();  ///< target device (creation ops)
  uint64_t seed = 0;
  std::vector<double> reals;   ///< further scalars (adamw_step: decay, b1, b2, eps, lr/bc1, sqrt(bc2))
};

/// A kernel: computes the outputs of one op on one device. It receives the inputs as given
/// (strided views) unless it was registered with `needs_contiguous`; it allocates its outputs.
using KernelFn = std::vector<Tensor> (*)(const std::vector<Tensor>& in, const OpAttrs& attrs);

/// A backward hook: given the inputs, the forward outputs (saved ones included) and the
/// gradients of the user-visible outputs (an undefined Tensor where no gradient arrived), returns
/// one gradient per input (undefined where the input needs none). Built from tensor ops, so it
/// runs on any device.
using BwdFn = std::vector<Tensor> (*)(const std::vector<Tensor>& in, const std::vector<Tensor>& out,
                                      const std::vector<Tensor>& grad_out, const OpAttrs& attrs);

/// The composed form of a fused op, built from primitive ops (which record their own edges).
using ComposedFn = std::vector<Tensor> (*)(const std::vector<Tensor>& in, const OpAttrs& attrs);

/// One device's kernel for an op.
struct KernelSlot {
  KernelFn fn = nullptr;
  uint32_t dtypes = 0;  ///< dtype_bit mask of the input dtypes it serves
  bool needs_contiguous = false;
};

/// One registry entry.
struct OpDef {
  std::string_view name;
  int arity;
  int n_out;
  bool differentiable;
  std::array<KernelSlot, kNumDeviceKinds> kernels{};
  BwdFn bwd = nullptr;
  ComposedFn composed = nullptr;
};

/// The table (index by OpId).
OpDef& op_def(OpId op);
std::string_view op_name(OpId op);

/// Called by backends at load to fill a kernel slot.
void register_kernel(OpId op, DeviceKind kind, uint32_t dtypes, KernelFn fn,
                     bool needs_contiguous = false);
/// Called by metal_fallback/ at load to give a fused op its composed form.
void register_composed(OpId op, ComposedFn fn);

/// Whether (op, device, dtype) has a kernel (a capability query, as ggml's supports_op).
bool has_kernel(OpId op, Device dev, DType dt);

/// Runs `op`: the kernel for (op, device kind, dtype) if there is one; else, for a fused op, its
/// composed form; else an Error naming the op, device and dtype. Records a graph edge when
/// gradient recording is on and an input tracks gradients. Returns the user-visible outputs.
std::vector<Tensor> dispatch(OpId op, const std::vector<Tensor>& in, const OpAttrs& attrs = {});
/// `dispatch` for a single-output op.
Tensor dispatch1(OpId op, const std::vector<Tensor>& in, const OpAttrs& attrs = {});

/// Kernel calls `dispatch` has made on `kind`'s devices since the program started (every thread;
/// a composed form counts its parts). On a GPU each is at least one launch: the difference
/// around a training step is what the step launches.
uint64_t kernel_calls(DeviceKind kind);

/// A per-op profile, to find where a step's device time goes. While it is on, dispatch waits
/// for the device before and after every kernel call and adds the wall time between to the
/// op's row, so a row is the device time of that op's kernels plus one launch each (a kernel
/// that dispatches others, as matmul's dense copy of a strided operand, counts them too). The waits
/// make the whole run slower: time a step with profiling off. `TAPER_PROFILE_OPS=1` turns it on
/// at start-up.
struct OpProfileRow {
  OpId op;
  DeviceKind kind;
  DType dtype;  ///< of the first input (attrs.dtype for creation ops)
  uint64_t calls = 0;
  double seconds = 0.0;
};
void set_op_profiling(bool on);
bool op_profiling();
/// The rows since the start or the last reset, slowest first.
std::vector<OpProfileRow> op_profile();
void reset_op_profile();

/// Forces the composed path of the chosen fused ops (all of them by default) in this scope and
/// thread, so tests and benches can run both paths on one device.
class ComposedOnlyGuard {
 public:
  ComposedOnlyGuard();
  explicit ComposedOnlyGuard(std::vector<OpId> ops);
  ~ComposedOnlyGuard();
  ComposedOnlyGuard(const ComposedOnlyGuard&) = delete;
  ComposedOnlyGuard& operator=(const ComposedOnlyGuard&) = delete;

 private:
  std::vector<bool> saved_;
};

}  // namespace taper
