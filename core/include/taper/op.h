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

// The op table. X(name, arity, n_out, n_saved, differentiable, attrs):
// - arity: the inputs (-1: variadic); an undefined input is an absent operand (the norms' weight
//   and bias), or for the binary ops and where_cond the scalar attribute f0.
// - n_out: the user-visible outputs. n_saved: the further outputs a kernel returns for the
//   backward, each in stat_dtype(dtype of input 0) (f32 for the half types and f32, f64 for
//   f64); dispatch checks every kernel's outputs against both. Composed forms return n_out only
//   (their parts save their own).
// - attrs: the OpAttrs fields the op reads (kernels, composed form and backward rule alike).
#define TAPER_OPS(X)                                                                               \
  /* views: device independent, no kernel */                                                       \
  X(reshape, 1, 1, 0, true, "shape")                                                               \
  X(permute, 1, 1, 0, true, "ints: the order")                                                     \
  X(narrow, 1, 1, 0, true, "i0: dim; ints: start, the dim's full length")                          \
  X(broadcast_as, 1, 1, 0, true, "shape")                                                          \
  /* device transfer: no kernel (the backends' copies) */                                          \
  X(to_device, 1, 1, 0, true, "device")                                                            \
  /* copy_cast */                                                                                  \
  X(copy, 1, 1, 0, true, "")                                                                       \
  X(to_dtype, 1, 1, 0, true, "dtype")                                                              \
  X(fill, 0, 1, 0, false, "shape, dtype, device; f0: the value")                                   \
  X(arange, 0, 1, 0, false, "shape, dtype, device; f0: start; f1: step")                           \
  X(rand_uniform, 0, 1, 0, false, "shape, dtype, device, seed; f0: lo; f1: hi")                    \
  X(rand_normal, 0, 1, 0, false, "shape, dtype, device, seed; f0: mean; f1: std")                  \
  /* unary */                                                                                      \
  X(neg, 1, 1, 0, true, "")                                                                        \
  X(abs, 1, 1, 0, true, "")                                                                        \
  X(exp, 1, 1, 0, true, "")                                                                        \
  X(log, 1, 1, 0, true, "")                                                                        \
  X(sqrt, 1, 1, 0, true, "")                                                                       \
  X(rsqrt, 1, 1, 0, true, "")                                                                      \
  X(recip, 1, 1, 0, true, "")                                                                      \
  X(sqr, 1, 1, 0, true, "")                                                                        \
  X(tanh, 1, 1, 0, true, "")                                                                       \
  X(sigmoid, 1, 1, 0, true, "")                                                                    \
  X(relu, 1, 1, 0, true, "")                                                                       \
  X(gelu, 1, 1, 0, true, "")                                                                       \
  X(gelu_erf, 1, 1, 0, true, "")                                                                   \
  X(gelu_erf_bwd, 2, 1, 0, false, "")                                                              \
  X(silu, 1, 1, 0, true, "")                                                                       \
  X(sin, 1, 1, 0, true, "")                                                                        \
  X(cos, 1, 1, 0, true, "")                                                                        \
  X(powf, 1, 1, 0, true, "f0: exponent")                                                           \
  X(affine, 1, 1, 0, true, "f0: mul; f1: add")                                                     \
  X(clamp, 1, 1, 0, true, "f0: lo; f1: hi")                                                        \
  /* binary (an undefined operand is the scalar attrs.f0) */                                       \
  X(add, 2, 1, 0, true, "f0: a scalar operand")                                                    \
  X(sub, 2, 1, 0, true, "f0: a scalar operand")                                                    \
  X(mul, 2, 1, 0, true, "f0: a scalar operand")                                                    \
  X(div, 2, 1, 0, true, "f0: a scalar operand")                                                    \
  X(maximum, 2, 1, 0, true, "f0: a scalar operand")                                                \
  X(minimum, 2, 1, 0, true, "f0: a scalar operand")                                                \
  X(eq, 2, 1, 0, false, "f0: a scalar operand")                                                    \
  X(ne, 2, 1, 0, false, "f0: a scalar operand")                                                    \
  X(lt, 2, 1, 0, false, "f0: a scalar operand")                                                    \
  X(le, 2, 1, 0, false, "f0: a scalar operand")                                                    \
  X(gt, 2, 1, 0, false, "f0: a scalar operand")                                                    \
  X(ge, 2, 1, 0, false, "f0: a scalar operand")                                                    \
  X(where_cond, 3, 1, 0, true, "f0: a scalar value")                                               \
  X(mul_add, 3, 1, 0, true, "")                                                                    \
  /* reduce */                                                                                     \
  X(sum, 1, 1, 0, true, "ints: dims; flag: keepdim")                                               \
  X(max, 1, 1, 0, true, "ints: dims; flag: keepdim")                                               \
  X(min, 1, 1, 0, true, "ints: dims; flag: keepdim")                                               \
  X(argmax, 1, 1, 0, false, "ints: the dim; flag: keepdim")                                        \
  X(argmin, 1, 1, 0, false, "ints: the dim; flag: keepdim")                                        \
  /* matmul */                                                                                     \
  X(matmul, 2, 1, 0, true, "")                                                                     \
  /* index */                                                                                      \
  X(index_select, 2, 1, 0, true, "i0: dim")                                                        \
  X(gather, 2, 1, 0, true, "i0: dim")                                                              \
  X(scatter_add, 3, 1, 0, true, "i0: dim")                                                         \
  X(cat, -1, 1, 0, true, "i0: dim")                                                                \
  X(narrow_bwd, 1, 1, 0, true, "i0: dim; ints: start, full length")                                \
  /* fused (softmax, norm); saved outputs: softmax's (..., 2) row stats, the norms' mean/rstd */   \
  X(softmax_last_dim, 1, 1, 1, true, "")                                                           \
  X(log_softmax_last_dim, 1, 1, 1, true, "")                                                       \
  X(softmax_last_dim_bwd, 3, 1, 0, false, "")                                                      \
  X(log_softmax_last_dim_bwd, 3, 1, 0, false, "")                                                  \
  X(rms_norm, 2, 1, 1, true, "f0: eps")                                                            \
  X(layer_norm, 3, 1, 2, true, "f0: eps")                                                          \
  X(group_norm, 3, 1, 2, true, "f0: eps; i0: num_groups")                                          \
  X(rms_norm_bwd, 4, 2, 0, false, "ints: need dw, need db; dtype: db's")                           \
  X(layer_norm_bwd, 5, 3, 0, false, "ints: need dw, need db; dtype: db's")                         \
  X(group_norm_bwd, 5, 3, 0, false, "i0: num_groups; ints: need dw, need db; dtype: db's")         \
  /* fused linear: (x (R, in), w (out, in), b (out) or undefined) -> x w^T + b */                 \
  X(linear, 3, 1, 0, true, "")                                                                     \
  /* fused attention: (q, k, v, mask or undefined) -> out, saved lse (B, H, T); the backward */   \
  /* op (q, k, v, mask, out, lse, dout) -> dq, dk, dv. No (B, H, T, S) tensor is kept. */        \
  X(attention, 4, 1, 1, true, "f0: scale")                                                         \
  X(attention_bwd, 7, 3, 0, false, "f0: scale")                                                    \
  /* optim (updates of the optimizers; flag: in place, the outputs are inputs 0, 2, 3; input */ \
  /* 4, when present: the bf16/f16 parameter of an f32 master, given w' rounded once) */        \
  X(adamw_step, 5, 3, 0, false, "reals: decay, b1, b2, eps, lr / bc1, sqrt(bc2); flag: in place")

/// Every op. `OpId::Count` is the table size.
enum class OpId : uint16_t {
#define TAPER_X(name, arity, nout, nsaved, diff, attrs) name,
  TAPER_OPS(TAPER_X)
#undef TAPER_X
      Count
};
inline constexpr size_t kNumOps = static_cast<size_t>(OpId::Count);

/// Non-tensor arguments of an op. Which fields each op reads is the table's attrs column.
struct OpAttrs {
  std::vector<int64_t> ints;   ///< dims (reduce, permute), shapes, or (dim, start, len)
  std::vector<size_t> shape;   ///< target shape (reshape, broadcast_as, creation ops)
  double f0 = 0.0;             ///< eps, mul, exponent, lo, fill value, start
  double f1 = 0.0;             ///< add, hi, step
  int64_t i0 = 0;              ///< a dim, num_groups, an original length
  bool flag = false;           ///< keepdim; adamw_step: update in place
  DType dtype = DType::F32;    ///< target dtype (to_dtype, creation ops)
  Device device = Device::cpu();  ///< target device (creation ops)
  uint64_t seed = 0;
  std::vector<double> reals;   ///< further scalars (adamw_step: decay, b1, b2, eps, lr/bc1, sqrt(bc2))
};

/// Whether an optional operand (the norms' weight or bias) is given: defined and not empty.
inline bool present(const Tensor& t) { return t.defined() && t.elem_count() > 0; }
/// `present` for input i of a kernel's or rule's inputs (absent past the end).
inline bool present(const std::vector<Tensor>& in, size_t i) {
  return i < in.size() && present(in[i]);
}

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
  int n_saved;  ///< outputs a kernel returns after the n_out visible ones, in stat_dtype
  bool differentiable;
  std::string_view attrs;  ///< the OpAttrs fields it reads (documentation)
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
/// Whether dispatch runs that kernel here: has_kernel, and the op is not forced to its composed
/// form in this thread (ComposedOnlyGuard, TAPER_COMPOSED_OPS). For callers that pick between a
/// fused op and their own way of doing without it (nn's attention).
bool runs_kernel(OpId op, Device dev, DType dt);

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
/// thread, so tests and benches can run both paths on one device. For a whole program, the
/// environment variable TAPER_COMPOSED_OPS does the same in every thread: a comma-separated list
/// of fused op names (`attention,attention_bwd`) or `all`, read at the first dispatch; an unknown
/// name is an Error there.
namespace detail {
/// TAPER_COMPOSED_OPS's value as a flag per OpId (an Error for a name that is not a fused op).
std::vector<bool> parse_composed_ops(std::string_view list);
}  // namespace detail

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
