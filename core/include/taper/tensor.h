// tensor.h: `Tensor`, a cheap immutable handle (shared storage + layout + dtype + autograd
// edge), and `Var`, a trainable leaf.
//
// What it is: the public tensor API of DESIGN.md. Ops are methods (as in candle); each one
// validates its arguments, then goes through the registry (op.h). What it is not: kernels.
//
// Conventions of every method below: a dim argument may be negative (-1 is the last dim) and
// one out of range throws Error; binary ops take operands of one dtype and one device (there is
// no promotion: mixing is an Error naming both) and broadcast their shapes as NumPy does; bf16
// and f16 compute in f32 and round once, f64 computes in f64; an op records a graph edge only
// when an input tracks gradients. An (op, device, dtype) with no kernel throws Error naming all
// three. Any method but defined() called on an undefined (default-constructed) Tensor throws.
#pragma once

#include <cstdint>
#include <functional>
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
class Tensor;
/// Called by backward once a leaf's gradient is complete (no later node adds to it), with the
/// leaf and its gradient: data parallelism starts reducing it while backward goes on.
using GradReadyFn = std::function<void(const Tensor& leaf, const Tensor& grad)>;

/// The shared state behind a Tensor handle.
struct TensorImpl {
  std::shared_ptr<Storage> storage;  ///< the bytes, shared by every view of them
  Layout layout;                     ///< shape, strides and offset in elements into `storage`
  DType dtype = DType::F32;          ///< the element type of `storage`
  std::shared_ptr<Node> grad_fn;  ///< the op that produced this tensor, when it tracks grads
  uint32_t out_index = 0;         ///< which output of grad_fn this is
  bool is_var = false;            ///< a trainable leaf
  uint64_t id = 0;                ///< identity used by GradStore
};

/// A tensor: shape, strides, dtype, device, and (when it tracks gradients) its graph edge.
/// Copying a Tensor copies the handle, not the data.
class Tensor {
 public:
  /// An undefined handle: defined() is false, every other method throws Error.
  Tensor() = default;
  /// Wraps existing state (how kernels, views and autograd make tensors).
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- creation -------------------------------------------------------------------------------
  /// Uninitialised contiguous tensor (kernels fill it). Error when the shape has more than 2^60
  /// elements, `dev` is not available, or the device is out of memory.
  static Tensor empty(const Shape& shape, DType dt, Device dev);
  /// Every element 0, any dtype.
  static Tensor zeros(const Shape& shape, DType dt, Device dev = Device::cpu());
  /// Every element 1, any dtype.
  static Tensor ones(const Shape& shape, DType dt, Device dev = Device::cpu());
  /// Every element `value` converted once to `dt` as to_dtype converts (round to nearest-even;
  /// integer dtypes truncate toward zero and saturate), any dtype.
  static Tensor full(const Shape& shape, double value, DType dt, Device dev = Device::cpu());
  /// 1-D: start + i * step (one f64 fma, then converted to `dt`) for i < ceil((end - start) /
  /// step), any dtype. Error when step is 0, a bound is not finite or past 2^60 elements.
  static Tensor arange(double start, double end, double step, DType dt,
                       Device dev = Device::cpu());
  /// Uniform in [lo, hi), counter-based (Philox4x32-10): the same values for the same seed on
  /// every device and thread count. Float dtypes only (else Error).
  static Tensor rand(const Shape& shape, DType dt, Device dev = Device::cpu(), uint64_t seed = 0,
                     double lo = 0.0, double hi = 1.0);
  /// Normal(mean, std), counter-based as `rand`. Float dtypes only (else Error).
  static Tensor randn(const Shape& shape, DType dt, Device dev = Device::cpu(), uint64_t seed = 0,
                      double mean = 0.0, double std = 1.0);
  /// Copies host values into a new tensor of T's dtype (T: uint8_t, uint32_t, int64_t, bf16,
  /// f16, float or double); Error unless `data.size()` equals the shape's element count.
  template <class T>
  static Tensor from_vector(const std::vector<T>& data, const Shape& shape,
                            Device dev = Device::cpu()) {
    return from_host(data.data(), data.size(), dtype_of_v<T>, shape, dev);
  }
  /// Copies `count` elements of `dt` from host memory at `data` into a new tensor on `dev`;
  /// Error unless `count` equals the shape's element count.
  static Tensor from_host(const void* data, size_t count, DType dt, const Shape& shape,
                          Device dev);

  // ---- inspection -----------------------------------------------------------------------------
  /// False for a default-constructed handle (the only method that does not throw then).
  bool defined() const { return impl_ != nullptr; }
  /// The dims as a Shape (rank 0: a single element).
  const Shape& shape() const { return impl().layout.shape; }
  /// The dims as a vector, outermost first.
  const std::vector<size_t>& dims() const { return impl().layout.shape.dims(); }
  /// The size of dim `d` (negative counts from the end); Error when out of range.
  size_t dim(int64_t d) const;
  /// Number of dims (0 for a scalar).
  size_t rank() const { return impl().layout.rank(); }
  /// The element type.
  DType dtype() const { return impl().dtype; }
  /// Where the storage lives (views share their source's).
  Device device() const { return impl().storage->device(); }
  /// Product of the dims (1 for rank 0, 0 when a dim is 0).
  size_t elem_count() const { return impl().layout.elem_count(); }
  /// Shape, strides and offset (in elements) of this view into its storage.
  const Layout& layout() const { return impl().layout; }
  /// Strides in elements, one per dim (0 along a broadcast dim).
  const std::vector<int64_t>& strides() const { return impl().layout.strides; }
  /// Whether the elements are dense and row-major (size-1 dims may have any stride).
  bool is_contiguous() const { return impl().layout.is_contiguous(); }
  /// The memory block, shared with every view of it.
  const std::shared_ptr<Storage>& storage() const { return impl().storage; }
  /// Pointer to element 0 of this view (device memory for non-CPU devices).
  void* data_ptr() const;
  /// data_ptr() as T*; T is not checked against dtype().
  template <class T> T* data() const { return static_cast<T*>(data_ptr()); }
  /// Identity used by GradStore; views and results of ops get new ids.
  uint64_t id() const { return impl().id; }
  /// Whether gradients flow through this tensor (a Var, or a result of an op on one).
  bool tracks_grad() const { return impl().is_var || impl().grad_fn != nullptr; }
  /// The shared state (null when undefined), for backends and autograd.
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

  // ---- host transfer --------------------------------------------------------------------------
  /// All elements in row-major order, converted to T (any of dtype_of's types) as to_dtype
  /// converts; waits for the device.
  template <class T> std::vector<T> to_vector() const {
    std::vector<T> out(elem_count());
    copy_to_host(out.data(), dtype_of_v<T>);
    return out;
  }
  /// A single-element tensor's value as double; Error for any other element count.
  double item() const;
  /// Writes the elements, row-major and converted to `as`, to host memory at `dst` (room for
  /// elem_count() * dtype_size(as) bytes); waits for the device.
  void copy_to_host(void* dst, DType as) const;

  /// Writes `src`'s values into this tensor's elements, in place: the same shape, converted to
  /// this dtype as to_dtype converts, from this device or the host. For optimizers and static
  /// inputs (a captured graph reads the same storage each replay). Not recorded by autograd:
  /// Error when this tensor tracks gradients (write into a Var's value()), is not contiguous,
  /// or the shapes or devices do not fit. `src` must not partly overlap this tensor.
  void copy_from(const Tensor& src) const;

  // ---- conversion -----------------------------------------------------------------------------
  /// The values as `dt` (this tensor when already `dt`). Float targets round to nearest-even
  /// once; integer targets truncate toward zero and saturate (NaN gives 0). Differentiable.
  Tensor to_dtype(DType dt) const;
  /// A copy on `dev` (this tensor when already there); differentiable, the gradient returns to
  /// this tensor's device. Error when `dev` is not available.
  Tensor to_device(Device dev) const;
  /// A contiguous tensor with the same values (this one if already contiguous).
  Tensor contiguous() const;
  /// A new handle on the same storage and layout with a new id and no graph edge: it does not
  /// track gradients.
  Tensor detach() const;

  // ---- views ----------------------------------------------------------------------------------
  /// The same elements in `shape`: a view when the strides allow one, else a contiguous copy.
  /// Error when the element counts differ.
  Tensor reshape(const Shape& shape) const;
  /// A view with dims d0 and d1 swapped.
  Tensor transpose(int64_t d0, int64_t d1) const;
  /// The last two dims swapped.
  Tensor t() const { return transpose(-2, -1); }
  /// A view whose dim i is this tensor's dim order[i]; Error unless `order` is a permutation
  /// of 0 .. rank-1.
  Tensor permute(const std::vector<size_t>& order) const;
  /// A view of elements [start, start + len) along `dim`; Error when that passes the dim's end.
  Tensor narrow(int64_t dim, size_t start, size_t len) const;
  /// A view expanded to `shape` by NumPy rules (dims aligned at the end, size-1 dims repeat by
  /// stride 0, new leading dims); Error when the shapes do not broadcast that way.
  Tensor broadcast_as(const Shape& shape) const;
  /// A size-1 dim inserted at `dim` (in -(rank+1) .. rank).
  Tensor unsqueeze(int64_t dim) const;
  /// Dim `dim` removed; Error unless its size is 1.
  Tensor squeeze(int64_t dim) const;
  /// The elements as one dim (a view when contiguous).
  Tensor flatten_all() const { return reshape(Shape({elem_count()})); }

  // ---- unary ----------------------------------------------------------------------------------
  // Same shape and dtype out, elementwise, differentiable. Float dtypes only unless noted (an
  // integer dtype then has no kernel: Error); integer arithmetic wraps (two's complement).
  /// -x; float dtypes and i64.
  Tensor neg() const;
  /// |x|; every dtype.
  Tensor abs() const;
  /// e^x.
  Tensor exp() const;
  /// Natural log (-inf at 0, NaN below).
  Tensor log() const;
  /// Square root (NaN below 0).
  Tensor sqrt() const;
  /// 1 / sqrt(x).
  Tensor rsqrt() const;
  /// 1 / x.
  Tensor recip() const;
  /// x * x; every dtype.
  Tensor sqr() const;
  /// Hyperbolic tangent.
  Tensor tanh() const;
  /// 1 / (1 + e^-x), accurate in both tails.
  Tensor sigmoid() const;
  /// max(x, 0) (NaN stays NaN); every dtype.
  Tensor relu() const;
  /// GELU, tanh approximation.
  Tensor gelu() const;
  /// GELU, exact erf form.
  Tensor gelu_erf() const;
  /// x * sigmoid(x).
  Tensor silu() const;
  /// Sine (radians).
  Tensor sin() const;
  /// Cosine (radians).
  Tensor cos() const;
  /// x^e elementwise with C99 pow's special cases (a negative finite x gives NaN unless e is
  /// whole).
  Tensor powf(double e) const;
  /// x * mul + add, the parameters rounded to the compute type; every dtype (integers: whole
  /// parameters wrap, fractional ones go through double and saturate).
  Tensor affine(double mul, double add) const;
  /// x limited to [lo, hi] (NaN stays NaN); every dtype. Error when a bound is NaN or lo > hi.
  Tensor clamp(double lo, double hi) const;

  // ---- binary (NumPy broadcasting, same dtype and device) ------------------------------------
  // Every dtype; differentiable except the comparisons. Error on a dtype or device mismatch or
  // shapes that do not broadcast. Integer arithmetic wraps (two's complement).
  /// this + o.
  Tensor add(const Tensor& o) const;
  /// this - o.
  Tensor sub(const Tensor& o) const;
  /// this * o elementwise (matmul is the matrix product).
  Tensor mul(const Tensor& o) const;
  /// this / o; integers truncate toward zero, and x / 0 gives 0 (no trap).
  Tensor div(const Tensor& o) const;
  /// The larger of the two elementwise (NaN propagates); a tie sends the gradient to this.
  Tensor maximum(const Tensor& o) const;
  /// The smaller of the two elementwise (NaN propagates); a tie sends the gradient to this.
  Tensor minimum(const Tensor& o) const;
  /// Comparisons give U8 (1 where true): this == o (NaN equals nothing).
  Tensor eq(const Tensor& o) const;
  /// this != o as U8 (1 where true, NaN included).
  Tensor ne(const Tensor& o) const;
  /// this < o as U8.
  Tensor lt(const Tensor& o) const;
  /// this <= o as U8.
  Tensor le(const Tensor& o) const;
  /// this > o as U8.
  Tensor gt(const Tensor& o) const;
  /// this >= o as U8.
  Tensor ge(const Tensor& o) const;
  /// Where this (a U8 mask) is nonzero, `on_true`, else `on_false` (broadcast together).
  /// Error when the mask is not U8 or the values differ in dtype or device.
  Tensor where_cond(const Tensor& on_true, const Tensor& on_false) const;
  // With a scalar operand s: s takes this tensor's dtype (converted once, as `full` converts
  // it: an integer tensor compares with trunc(s)) and travels as an op attribute, so there is no
  // one-element tensor and, on a GPU, no fill launch. Any dtype; the gradient (maximum,
  // minimum, where_cond) goes to the tensor operand only.
  /// Elementwise max(this, s); NaN in this gives NaN.
  Tensor maximum(double s) const;
  /// Elementwise min(this, s); NaN in this gives NaN.
  Tensor minimum(double s) const;
  /// U8 mask of this == s (half types compare their f32 values).
  Tensor eq(double s) const;
  /// U8 mask of this != s.
  Tensor ne(double s) const;
  /// U8 mask of this < s.
  Tensor lt(double s) const;
  /// U8 mask of this <= s.
  Tensor le(double s) const;
  /// U8 mask of this > s.
  Tensor gt(double s) const;
  /// U8 mask of this >= s.
  Tensor ge(double s) const;
  /// Where this (a U8 mask) is nonzero, `on_true`, else s (mask and values broadcast together).
  /// Error when the mask is not U8 or the two are on different devices.
  Tensor where_cond(const Tensor& on_true, double on_false) const;
  /// Where this (a U8 mask) is nonzero, s, else `on_false`; as the overload above.
  Tensor where_cond(double on_true, const Tensor& on_false) const;
  /// this * b + c (broadcast together; float dtypes), rounded once: a fused multiply-add in the
  /// compute type (f32 for bf16/f16), as Rust's f32::mul_add.
  Tensor mul_add(const Tensor& b, const Tensor& c) const;

  // ---- reductions -----------------------------------------------------------------------------
  // `dims` empty reduces every dim; a repeated dim is an Error. keepdim keeps each reduced dim
  // as size 1. Float sums accumulate in f32 or wider (f64 for f64) in a fixed order: the same
  // bits at any thread count.
  /// Sum over `dims`, in this dtype (integer sums wrap); an empty dim sums to 0.
  Tensor sum(const std::vector<int64_t>& dims, bool keepdim = false) const;
  /// Sum over `dims` divided by their element count; float dtypes only (else Error).
  Tensor mean(const std::vector<int64_t>& dims, bool keepdim = false) const;
  /// Largest element over `dims` (NaN propagates; ties share the gradient equally). Error
  /// when a reduced dim is empty.
  Tensor max(const std::vector<int64_t>& dims, bool keepdim = false) const;
  /// Smallest element over `dims`, as max.
  Tensor min(const std::vector<int64_t>& dims, bool keepdim = false) const;
  /// The first index (I64) of the largest element along `dim`, or of the first NaN; not
  /// differentiable. Error when the dim is empty.
  Tensor argmax(int64_t dim, bool keepdim = false) const;
  /// The first index (I64) of the smallest element along `dim`, or of the first NaN, as argmax.
  Tensor argmin(int64_t dim, bool keepdim = false) const;
  /// Sum of every element, rank 0.
  Tensor sum_all() const;
  /// Mean of every element, rank 0; float dtypes only (else Error).
  Tensor mean_all() const;

  // ---- matmul and indexing --------------------------------------------------------------------
  /// (..., m, k) x (..., k, n) -> (..., m, n), batch dims broadcast.
  /// Float dtypes; Error when a rank is below 2 or the inner dims differ. f32 on CUDA uses TF32
  /// only under set_cuda_allow_tf32(true).
  Tensor matmul(const Tensor& o) const;
  /// Rows of this along `dim` picked by `indices` (1-D, I64 or U32).
  /// The result has this shape with `dim` resized to indices' length; differentiable in this.
  /// An index outside [0, size) is an Error naming it (on the CPU at once, elsewhere at the
  /// next synchronisation).
  Tensor index_select(const Tensor& indices, int64_t dim) const;
  /// out[i][j] = this[i][index[i][j]] along `dim` (index has the output's shape).
  /// `index` (I64 or U32) has this rank and this shape outside `dim` (else Error); its values
  /// are range-checked as index_select's. Differentiable in this.
  Tensor gather(const Tensor& index, int64_t dim) const;
  /// A copy of this with `src` added at `index` along `dim`.
  /// index (I64 or U32) and src share one shape, of this rank, equal to this shape outside
  /// `dim`; src has this dtype (else Error). Indices checked as index_select's; differentiable
  /// in this and src.
  Tensor scatter_add(const Tensor& index, const Tensor& src, int64_t dim) const;
  /// The tensors joined along `dim`. Error when `ts` is empty or they differ in rank, dtype,
  /// device or any other dim.
  static Tensor cat(const std::vector<Tensor>& ts, int64_t dim);
  /// The tensors joined along a new dim inserted at `dim` (in -(rank+1) .. rank). Error when
  /// `ts` is empty or their shapes, dtypes or devices differ.
  static Tensor stack(const std::vector<Tensor>& ts, int64_t dim);

  // ---- autograd -------------------------------------------------------------------------------
  /// Backpropagates from this single-element tensor; returns the gradients of every leaf.
  /// Error unless it has one element and a float dtype; the graph is released as backward runs,
  /// so a second backward over it is an Error. Empty when this does not track gradients.
  GradStore backward() const;
  /// Backpropagates `grad`, the gradient of some scalar with respect to this tensor (same shape,
  /// dtype and device), as PyTorch's `y.backward(grad)`: the vector-Jacobian product of the graph.
  /// Error when `grad` is undefined or differs in shape, dtype or device.
  GradStore backward(const Tensor& grad) const;
  /// backward(grad) that calls `on_ready` for each leaf as soon as its gradient is complete, in
  /// the order backward completes them (leaves no gradient reaches are not called). With
  /// `hand_over`, the returned store forgets each gradient it hands to `on_ready`, so the
  /// callback's copy can be the only one (data parallelism frees it once it is in a bucket).
  GradStore backward(const Tensor& grad, const GradReadyFn& on_ready,
                     bool hand_over = false) const;

 private:
  const TensorImpl& impl() const {
    TAPER_CHECK(impl_ != nullptr, "use of an undefined (default-constructed) Tensor");
    return *impl_;
  }
  std::shared_ptr<TensorImpl> impl_;
};

// The operators follow the methods: broadcasting, one dtype and device, Error otherwise. A
// scalar operand takes the tensor's dtype (no promotion); every dtype.
/// a.add(b).
Tensor operator+(const Tensor& a, const Tensor& b);
/// a.sub(b).
Tensor operator-(const Tensor& a, const Tensor& b);
/// a.mul(b).
Tensor operator*(const Tensor& a, const Tensor& b);
/// a.div(b).
Tensor operator/(const Tensor& a, const Tensor& b);
/// a.neg(): float dtypes and i64.
Tensor operator-(const Tensor& a);
/// a + s elementwise (affine(1, s)).
Tensor operator+(const Tensor& a, double s);
/// a - s elementwise (affine(1, -s)).
Tensor operator-(const Tensor& a, double s);
/// a * s elementwise (affine(s, 0)).
Tensor operator*(const Tensor& a, double s);
/// a / s elementwise, a true division (not a * (1 / s)); s is an op attribute in a's dtype.
Tensor operator/(const Tensor& a, double s);
/// s + a elementwise (affine(1, s)).
Tensor operator+(double s, const Tensor& a);
/// s - a elementwise (affine(-1, s)).
Tensor operator-(double s, const Tensor& a);
/// s * a elementwise (affine(s, 0)).
Tensor operator*(double s, const Tensor& a);
/// s / a elementwise; s is an op attribute in a's dtype.
Tensor operator/(double s, const Tensor& a);

/// Prints shape, dtype, device and a summarised view of the values ("..." past 6 items a dim
/// above 1000 elements); copies to the host. An undefined tensor prints as Tensor[undefined].
std::ostream& operator<<(std::ostream& os, const Tensor& t);

/// A trainable leaf: gradients are collected for it; an optimizer may replace its value.
class Var : public Tensor {
 public:
  /// An undefined Var.
  Var() = default;
  /// A new leaf holding `t`'s values (shares storage; no graph edge to `t`).
  static Var from_tensor(const Tensor& t);
  /// Replaces the value (same shape, dtype and device), keeping the identity. A graph recorded
  /// before the change keeps the old value: its backward gives the gradient of what it computed
  /// (to this Var), not of the new value. Writes through data_ptr() bypass this. Error when
  /// `value` differs in shape, dtype or device.
  void set(const Tensor& value);
  /// Tensor view of this Var with no graph edge (for optimizers).
  Tensor value() const { return detach(); }

 private:
  explicit Var(std::shared_ptr<TensorImpl> impl) : Tensor(std::move(impl)) {}
};

/// A fresh id for a TensorImpl: process-wide, thread-safe, never 0.
uint64_t next_tensor_id();

}  // namespace taper
