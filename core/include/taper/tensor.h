// tensor.h: `Tensor`, a cheap immutable handle (shared storage + layout + dtype + autograd
// edge), and `Var`, a trainable leaf.
//
// What it is: the public tensor API of DESIGN.md. Ops are methods (as in candle); each one
// validates its arguments, then goes through the registry (op.h). What it is not: kernels.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <type_traits>
#include <vector>

#include "taper/device.h"
#include "taper/dtype.h"
#include "taper/error.h"
#include "taper/shape.h"
#include "taper/storage.h"

namespace taper {

struct Node;
class GradStore;

/// The shared state behind a Tensor handle.
struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Layout layout;
  DType dtype = DType::F32;
  std::shared_ptr<Node> grad_fn;  ///< the op that produced this tensor, when it tracks grads
  uint32_t out_index = 0;         ///< which output of grad_fn this is
  bool is_var = false;            ///< a trainable leaf
  uint64_t id = 0;                ///< identity used by GradStore
};

/// A tensor: shape, strides, dtype, device, and (when it tracks gradients) its graph edge.
/// Copying a Tensor copies the handle, not the data.
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- creation -------------------------------------------------------------------------------
  /// Uninitialised contiguous tensor (kernels fill it).
  static Tensor empty(const Shape& shape, DType dt, Device dev);
  static Tensor zeros(const Shape& shape, DType dt, Device dev = Device::cpu());
  static Tensor ones(const Shape& shape, DType dt, Device dev = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dt, Device dev = Device::cpu());
  /// 0, 1, ..., n-1 (as `dt`); `arange(start, end, step)` for the general form.
  static Tensor arange(double start, double end, double step, DType dt,
                       Device dev = Device::cpu());
  /// Uniform in [lo, hi), counter-based: the same values for the same seed whatever the threads.
  static Tensor rand(const Shape& shape, DType dt, Device dev = Device::cpu(), uint64_t seed = 0,
                     double lo = 0.0, double hi = 1.0);
  /// Normal(mean, std), counter-based as `rand`.
  static Tensor randn(const Shape& shape, DType dt, Device dev = Device::cpu(), uint64_t seed = 0,
                      double mean = 0.0, double std = 1.0);
  /// Copies host values into a new tensor; `data.size()` must equal the shape's element count.
  template <class T>
  static Tensor from_vector(const std::vector<T>& data, const Shape& shape,
                            Device dev = Device::cpu()) {
    return from_host(data.data(), data.size(), dtype_of_v<T>, shape, dev);
  }
  static Tensor from_host(const void* data, size_t count, DType dt, const Shape& shape,
                          Device dev);

  // ---- inspection -----------------------------------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().layout.shape; }
  const std::vector<size_t>& dims() const { return impl().layout.shape.dims(); }
  size_t dim(int64_t d) const;
  size_t rank() const { return impl().layout.rank(); }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device(); }
  size_t elem_count() const { return impl().layout.elem_count(); }
  const Layout& layout() const { return impl().layout; }
  const std::vector<int64_t>& strides() const { return impl().layout.strides; }
  bool is_contiguous() const { return impl().layout.is_contiguous(); }
  const std::shared_ptr<Storage>& storage() const { return impl().storage; }
  /// Pointer to element 0 of this view (device memory for non-CPU devices).
  void* data_ptr() const;
  template <class T> T* data() const { return static_cast<T*>(data_ptr()); }
  /// Identity used by GradStore; views and results of ops get new ids.
  uint64_t id() const { return impl().id; }
  /// Whether gradients flow through this tensor (a Var, or a result of an op on one).
  bool tracks_grad() const { return impl().is_var || impl().grad_fn != nullptr; }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

  // ---- host transfer --------------------------------------------------------------------------
  /// All elements in row-major order, converted to T (any float dtype converts to any float T).
  template <class T> std::vector<T> to_vector() const {
    std::vector<T> out(elem_count());
    copy_to_host(out.data(), dtype_of_v<T>);
    return out;
  }
  /// A single-element tensor's value as double.
  double item() const;
  void copy_to_host(void* dst, DType as) const;

  // ---- conversion -----------------------------------------------------------------------------
  Tensor to_dtype(DType dt) const;
  Tensor to_device(Device dev) const;
  /// A contiguous tensor with the same values (this one if already contiguous).
  Tensor contiguous() const;
  /// A new leaf sharing storage, with no graph edge.
  Tensor detach() const;

  // ---- views ----------------------------------------------------------------------------------
  Tensor reshape(const Shape& shape) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  /// The last two dims swapped.
  Tensor t() const { return transpose(-2, -1); }
  Tensor permute(const std::vector<size_t>& order) const;
  Tensor narrow(int64_t dim, size_t start, size_t len) const;
  Tensor broadcast_as(const Shape& shape) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;
  Tensor flatten_all() const { return reshape(Shape({elem_count()})); }

  // ---- unary ----------------------------------------------------------------------------------
  Tensor neg() const;
  Tensor abs() const;
  Tensor exp() const;
  Tensor log() const;
  Tensor sqrt() const;
  Tensor rsqrt() const;
  Tensor recip() const;
  Tensor sqr() const;
  Tensor tanh() const;
  Tensor sigmoid() const;
  Tensor relu() const;
  /// GELU, tanh approximation.
  Tensor gelu() const;
  /// GELU, exact erf form.
  Tensor gelu_erf() const;
  Tensor silu() const;
  Tensor sin() const;
  Tensor cos() const;
  /// x^e elementwise.
  Tensor powf(double e) const;
  /// x * mul + add.
  Tensor affine(double mul, double add) const;
  Tensor clamp(double lo, double hi) const;

  // ---- binary (NumPy broadcasting, same dtype and device) ------------------------------------
  Tensor add(const Tensor& o) const;
  Tensor sub(const Tensor& o) const;
  Tensor mul(const Tensor& o) const;
  Tensor div(const Tensor& o) const;
  Tensor maximum(const Tensor& o) const;
  Tensor minimum(const Tensor& o) const;
  /// Comparisons give U8 (1 where true).
  Tensor eq(const Tensor& o) const;
  Tensor ne(const Tensor& o) const;
  Tensor lt(const Tensor& o) const;
  Tensor le(const Tensor& o) const;
  Tensor gt(const Tensor& o) const;
  Tensor ge(const Tensor& o) const;
  /// Where this (a U8 mask) is nonzero, `on_true`, else `on_false` (broadcast together).
  Tensor where_cond(const Tensor& on_true, const Tensor& on_false) const;
  /// this * b + c (broadcast together; float dtypes), rounded once: a fused multiply-add in the
  /// compute type (f32 for bf16/f16), as Rust's f32::mul_add.
  Tensor mul_add(const Tensor& b, const Tensor& c) const;

  // ---- reductions -----------------------------------------------------------------------------
  Tensor sum(const std::vector<int64_t>& dims, bool keepdim = false) const;
  Tensor mean(const std::vector<int64_t>& dims, bool keepdim = false) const;
  Tensor max(const std::vector<int64_t>& dims, bool keepdim = false) const;
  Tensor min(const std::vector<int64_t>& dims, bool keepdim = false) const;
  /// Index (I64) of the max/min along one dim.
  Tensor argmax(int64_t dim, bool keepdim = false) const;
  Tensor argmin(int64_t dim, bool keepdim = false) const;
  Tensor sum_all() const;
  Tensor mean_all() const;

  // ---- matmul and indexing --------------------------------------------------------------------
  /// (..., m, k) x (..., k, n) -> (..., m, n), batch dims broadcast.
  Tensor matmul(const Tensor& o) const;
  /// Rows of this along `dim` picked by `indices` (1-D, I64 or U32).
  Tensor index_select(const Tensor& indices, int64_t dim) const;
  /// out[i][j] = this[i][index[i][j]] along `dim` (index has the output's shape).
  Tensor gather(const Tensor& index, int64_t dim) const;
  /// A copy of this with `src` added at `index` along `dim`.
  Tensor scatter_add(const Tensor& index, const Tensor& src, int64_t dim) const;
  static Tensor cat(const std::vector<Tensor>& ts, int64_t dim);
  static Tensor stack(const std::vector<Tensor>& ts, int64_t dim);

  // ---- autograd -------------------------------------------------------------------------------
  /// Backpropagates from this single-element tensor; returns the gradients of every leaf.
  GradStore backward() const;
  /// Backpropagates `grad`, the gradient of some scalar with respect to this tensor (same shape,
  /// dtype and device), as PyTorch's `y.backward(grad)`: the vector-Jacobian product of the graph.
  GradStore backward(const Tensor& grad) const;

 private:
  const TensorImpl& impl() const {
    TAPER_CHECK(impl_ != nullptr, "use of an undefined (default-constructed) Tensor");
    return *impl_;
  }
  std::shared_ptr<TensorImpl> impl_;
};

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, double s);
Tensor operator-(const Tensor& a, double s);
Tensor operator*(const Tensor& a, double s);
Tensor operator/(const Tensor& a, double s);
Tensor operator+(double s, const Tensor& a);
Tensor operator-(double s, const Tensor& a);
Tensor operator*(double s, const Tensor& a);
Tensor operator/(double s, const Tensor& a);

/// Prints shape, dtype, device and a summarised view of the values.
std::ostream& operator<<(std::ostream& os, const Tensor& t);

/// A trainable leaf: gradients are collected for it; an optimizer may replace its value.
class Var : public Tensor {
 public:
  Var() = default;
  /// A new leaf holding `t`'s values (shares storage; no graph edge to `t`).
  static Var from_tensor(const Tensor& t);
  /// Replaces the value (same shape, dtype and device), keeping the identity. A graph recorded
  /// before the change keeps the old value: its backward gives the gradient of what it computed
  /// (to this Var), not of the new value. Writes through data_ptr() bypass this.
  void set(const Tensor& value);
  /// Tensor view of this Var with no graph edge (for optimizers).
  Tensor value() const { return detach(); }

 private:
  explicit Var(std::shared_ptr<TensorImpl> impl) : Tensor(std::move(impl)) {}
};

/// A fresh id for a TensorImpl.
uint64_t next_tensor_id();

}  // namespace taper
