// tensor_ops.cpp: the op methods of Tensor: argument checks with messages that name the op,
// shapes and dtypes, broadcasting, then dispatch. No maths here.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "taper/autograd.h"
#include "taper/op.h"
#include "taper/tensor.h"

namespace taper {
namespace {

Tensor unary(OpId op, const Tensor& x, OpAttrs a = {}) { return dispatch1(op, {x}, a); }

void check_same(const char* op, const Tensor& a, const Tensor& b) {
  TAPER_CHECK(a.dtype() == b.dtype(), op, ": dtype mismatch, ", dtype_name(a.dtype()), " ",
              a.shape().to_string(), " vs ", dtype_name(b.dtype()), " ", b.shape().to_string(),
              " (use to_dtype to convert)");
  TAPER_CHECK(a.device() == b.device(), op, ": device mismatch, ", a.device().to_string(),
              " vs ", b.device().to_string());
}

Tensor binary(OpId op, const Tensor& a, const Tensor& b) {
  const char* name = op_name(op).data();
  check_same(name, a, b);
  const Shape s = broadcast_shapes(a.shape(), b.shape(), name);
  return dispatch1(op, {a.broadcast_as(s), b.broadcast_as(s)});
}

// op(a, s) (scalar_first: op(s, a)) with s an op attribute: an undefined operand in its place,
// which the kernels read as attrs.f0 converted once to a's dtype.
Tensor binary_scalar(OpId op, const Tensor& a, double s, bool scalar_first = false) {
  OpAttrs at;
  at.f0 = s;
  return scalar_first ? dispatch1(op, {Tensor(), a}, at) : dispatch1(op, {a, Tensor()}, at);
}

std::vector<int64_t> norm_dims(const std::vector<int64_t>& dims, size_t rank, const char* op) {
  std::vector<int64_t> out;
  if (dims.empty()) {
    out.resize(rank);
    std::iota(out.begin(), out.end(), 0);
    return out;
  }
  for (int64_t d : dims) out.push_back(static_cast<int64_t>(normalize_dim(d, rank, op)));
  std::sort(out.begin(), out.end());
  TAPER_CHECK(std::adjacent_find(out.begin(), out.end()) == out.end(), op,
              ": a dim is repeated in the reduction dims");
  return out;
}

Tensor reduce(OpId op, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  const char* name = op_name(op).data();
  if (x.rank() == 0) {  // a scalar: dims may name only 0 or -1, as in PyTorch
    for (int64_t d : dims)
      TAPER_CHECK(d == 0 || d == -1, name, ": dim ", d, " out of range for a rank-0 tensor");
    return reduce(op, x.reshape(Shape({1})), {0}, false);
  }
  OpAttrs a;
  a.ints = norm_dims(dims, x.rank(), name);
  a.flag = keepdim;
  for (int64_t d : a.ints)
    TAPER_CHECK(x.shape()[d] > 0 || op == OpId::sum, name, ": cannot reduce the empty dim ", d,
                " of ", x.shape().to_string());
  return dispatch1(op, {x}, a);
}

void check_index_dtype(const char* op, const Tensor& idx) {
  TAPER_CHECK(idx.dtype() == DType::I64 || idx.dtype() == DType::U32, op,
              ": indices must be i64 or u32, got ", dtype_name(idx.dtype()), " ",
              idx.shape().to_string());
}

// On the CPU the indices are host memory: checked here, at once. Other devices check them in
// their kernels and report a bad one at the next synchronisation (cuda/index.cu): reading them
// here would copy them back and wait for the device on every call.
void check_index_range(const char* op, const Tensor& idx, size_t limit, size_t dim,
                       const Shape& of) {
  if (!idx.device().is_cpu()) return;
  for (int64_t v : idx.to_vector<int64_t>())
    TAPER_CHECK(v >= 0 && static_cast<size_t>(v) < limit, op, ": index ", v,
                " is out of range for dim ", dim, " of size ", limit, " (tensor ",
                of.to_string(), ")");
}

}  // namespace

Tensor Tensor::neg() const { return unary(OpId::neg, *this); }
Tensor Tensor::abs() const { return unary(OpId::abs, *this); }
Tensor Tensor::exp() const { return unary(OpId::exp, *this); }
Tensor Tensor::log() const { return unary(OpId::log, *this); }
Tensor Tensor::sqrt() const { return unary(OpId::sqrt, *this); }
Tensor Tensor::rsqrt() const { return unary(OpId::rsqrt, *this); }
Tensor Tensor::recip() const { return unary(OpId::recip, *this); }
Tensor Tensor::sqr() const { return unary(OpId::sqr, *this); }
Tensor Tensor::tanh() const { return unary(OpId::tanh, *this); }
Tensor Tensor::sigmoid() const { return unary(OpId::sigmoid, *this); }
Tensor Tensor::relu() const { return unary(OpId::relu, *this); }
Tensor Tensor::gelu() const { return unary(OpId::gelu, *this); }
Tensor Tensor::gelu_erf() const { return unary(OpId::gelu_erf, *this); }
Tensor Tensor::silu() const { return unary(OpId::silu, *this); }
Tensor Tensor::sin() const { return unary(OpId::sin, *this); }
Tensor Tensor::cos() const { return unary(OpId::cos, *this); }
Tensor Tensor::powf(double e) const {
  OpAttrs a;
  a.f0 = e;
  return unary(OpId::powf, *this, a);
}
Tensor Tensor::affine(double mul, double add) const {
  OpAttrs a;
  a.f0 = mul;
  a.f1 = add;
  return unary(OpId::affine, *this, a);
}
Tensor Tensor::clamp(double lo, double hi) const {
  TAPER_CHECK(!std::isnan(lo) && !std::isnan(hi), "clamp: a bound is NaN (lo ", lo, ", hi ", hi,
              ")");
  TAPER_CHECK(lo <= hi, "clamp: lo ", lo, " > hi ", hi);
  OpAttrs a;
  a.f0 = lo;
  a.f1 = hi;
  return unary(OpId::clamp, *this, a);
}

Tensor Tensor::add(const Tensor& o) const { return binary(OpId::add, *this, o); }
Tensor Tensor::sub(const Tensor& o) const { return binary(OpId::sub, *this, o); }
Tensor Tensor::mul(const Tensor& o) const { return binary(OpId::mul, *this, o); }
Tensor Tensor::div(const Tensor& o) const { return binary(OpId::div, *this, o); }
Tensor Tensor::maximum(const Tensor& o) const { return binary(OpId::maximum, *this, o); }
Tensor Tensor::minimum(const Tensor& o) const { return binary(OpId::minimum, *this, o); }
Tensor Tensor::eq(const Tensor& o) const { return binary(OpId::eq, *this, o); }
Tensor Tensor::ne(const Tensor& o) const { return binary(OpId::ne, *this, o); }
Tensor Tensor::lt(const Tensor& o) const { return binary(OpId::lt, *this, o); }
Tensor Tensor::le(const Tensor& o) const { return binary(OpId::le, *this, o); }
Tensor Tensor::gt(const Tensor& o) const { return binary(OpId::gt, *this, o); }
Tensor Tensor::ge(const Tensor& o) const { return binary(OpId::ge, *this, o); }

Tensor Tensor::where_cond(const Tensor& on_true, const Tensor& on_false) const {
  TAPER_CHECK(dtype() == DType::U8, "where_cond: the mask must be u8, got ", dtype_name(dtype()),
              " ", shape().to_string());
  check_same("where_cond", on_true, on_false);
  TAPER_CHECK(device() == on_true.device(), "where_cond: device mismatch, mask on ",
              device().to_string(), ", values on ", on_true.device().to_string());
  Shape s = broadcast_shapes(on_true.shape(), on_false.shape(), "where_cond");
  s = broadcast_shapes(shape(), s, "where_cond");
  return dispatch1(OpId::where_cond,
                   {broadcast_as(s), on_true.broadcast_as(s), on_false.broadcast_as(s)});
}

Tensor Tensor::maximum(double s) const { return binary_scalar(OpId::maximum, *this, s); }
Tensor Tensor::minimum(double s) const { return binary_scalar(OpId::minimum, *this, s); }
Tensor Tensor::eq(double s) const { return binary_scalar(OpId::eq, *this, s); }
Tensor Tensor::ne(double s) const { return binary_scalar(OpId::ne, *this, s); }
Tensor Tensor::lt(double s) const { return binary_scalar(OpId::lt, *this, s); }
Tensor Tensor::le(double s) const { return binary_scalar(OpId::le, *this, s); }
Tensor Tensor::gt(double s) const { return binary_scalar(OpId::gt, *this, s); }
Tensor Tensor::ge(double s) const { return binary_scalar(OpId::ge, *this, s); }

namespace {
Tensor where_scalar(const Tensor& mask, const Tensor& v, double s, bool scalar_true) {
  TAPER_CHECK(mask.dtype() == DType::U8, "where_cond: the mask must be u8, got ",
              dtype_name(mask.dtype()), " ", mask.shape().to_string());
  TAPER_CHECK(mask.device() == v.device(), "where_cond: device mismatch, mask on ",
              mask.device().to_string(), ", values on ", v.device().to_string());
  const Shape sh = broadcast_shapes(mask.shape(), v.shape(), "where_cond");
  OpAttrs a;
  a.f0 = s;
  const Tensor vb = v.broadcast_as(sh);
  return dispatch1(OpId::where_cond, {mask.broadcast_as(sh), scalar_true ? Tensor() : vb,
                                      scalar_true ? vb : Tensor()},
                   a);
}
}  // namespace
Tensor Tensor::where_cond(const Tensor& on_true, double on_false) const {
  return where_scalar(*this, on_true, on_false, false);
}
Tensor Tensor::where_cond(double on_true, const Tensor& on_false) const {
  return where_scalar(*this, on_false, on_true, true);
}

Tensor Tensor::mul_add(const Tensor& b, const Tensor& c) const {
  check_same("mul_add", *this, b);
  check_same("mul_add", b, c);
  TAPER_CHECK(is_float(dtype()), "mul_add: float dtypes only, got ", dtype_name(dtype()), " ",
              shape().to_string(), ", ", b.shape().to_string(), ", ", c.shape().to_string());
  Shape s = broadcast_shapes(shape(), b.shape(), "mul_add");
  s = broadcast_shapes(s, c.shape(), "mul_add");
  return dispatch1(OpId::mul_add, {broadcast_as(s), b.broadcast_as(s), c.broadcast_as(s)});
}

Tensor Tensor::sum(const std::vector<int64_t>& dims, bool keepdim) const {
  return reduce(OpId::sum, *this, dims, keepdim);
}
Tensor Tensor::max(const std::vector<int64_t>& dims, bool keepdim) const {
  return reduce(OpId::max, *this, dims, keepdim);
}
Tensor Tensor::min(const std::vector<int64_t>& dims, bool keepdim) const {
  return reduce(OpId::min, *this, dims, keepdim);
}
Tensor Tensor::mean(const std::vector<int64_t>& dims, bool keepdim) const {
  TAPER_CHECK(is_float(dtype()), "mean: needs a float dtype, got ", dtype_name(dtype()));
  const auto nd = norm_dims(dims, rank(), "mean");
  size_t n = 1;
  for (int64_t d : nd) n *= shape()[d];
  return sum(dims, keepdim).affine(1.0 / static_cast<double>(n), 0.0);
}
Tensor Tensor::argmax(int64_t dim, bool keepdim) const {
  return reduce(OpId::argmax, *this, {dim}, keepdim);
}
Tensor Tensor::argmin(int64_t dim, bool keepdim) const {
  return reduce(OpId::argmin, *this, {dim}, keepdim);
}
Tensor Tensor::sum_all() const { return sum({}, false); }
Tensor Tensor::mean_all() const { return mean({}, false); }

Tensor Tensor::matmul(const Tensor& o) const {
  check_same("matmul", *this, o);
  TAPER_CHECK(rank() >= 2 && o.rank() >= 2, "matmul: needs rank >= 2 operands, got ",
              shape().to_string(), " x ", o.shape().to_string());
  const size_t m = dim(-2), k = dim(-1), k2 = o.dim(-2), n = o.dim(-1);
  TAPER_CHECK(k == k2, "matmul: inner dims differ: ", shape().to_string(), " x ",
              o.shape().to_string());
  std::vector<size_t> ba(dims().begin(), dims().end() - 2);
  std::vector<size_t> bb(o.dims().begin(), o.dims().end() - 2);
  std::vector<size_t> batch = broadcast_shapes(Shape(ba), Shape(bb), "matmul").dims();
  std::vector<size_t> sa = batch, sb = batch;
  sa.push_back(m);
  sa.push_back(k);
  sb.push_back(k);
  sb.push_back(n);
  return dispatch1(OpId::matmul, {broadcast_as(Shape(sa)), o.broadcast_as(Shape(sb))});
}

Tensor Tensor::index_select(const Tensor& indices, int64_t dim) const {
  const size_t d = normalize_dim(dim, rank(), "index_select");
  check_index_dtype("index_select", indices);
  TAPER_CHECK(indices.rank() == 1, "index_select: indices must be 1-D, got ",
              indices.shape().to_string());
  check_index_range("index_select", indices, shape()[d], d, shape());
  OpAttrs a;
  a.i0 = static_cast<int64_t>(d);
  return dispatch1(OpId::index_select, {*this, indices}, a);
}

Tensor Tensor::gather(const Tensor& index, int64_t dim) const {
  const size_t d = normalize_dim(dim, rank(), "gather");
  check_index_dtype("gather", index);
  TAPER_CHECK(index.rank() == rank(), "gather: index ", index.shape().to_string(),
              " must have the rank of the input ", shape().to_string());
  for (size_t i = 0; i < rank(); ++i)
    TAPER_CHECK(i == d || index.shape()[i] == shape()[i], "gather: index ",
                index.shape().to_string(), " and input ", shape().to_string(),
                " differ outside dim ", d);
  check_index_range("gather", index, shape()[d], d, shape());
  OpAttrs a;
  a.i0 = static_cast<int64_t>(d);
  return dispatch1(OpId::gather, {*this, index}, a);
}

Tensor Tensor::scatter_add(const Tensor& index, const Tensor& src, int64_t dim) const {
  const size_t d = normalize_dim(dim, rank(), "scatter_add");
  check_index_dtype("scatter_add", index);
  check_same("scatter_add", *this, src);
  TAPER_CHECK(index.shape() == src.shape(), "scatter_add: index ", index.shape().to_string(),
              " and src ", src.shape().to_string(), " must have one shape");
  TAPER_CHECK(index.rank() == rank(), "scatter_add: index ", index.shape().to_string(),
              " must have the rank of the input ", shape().to_string());
  for (size_t i = 0; i < rank(); ++i)
    TAPER_CHECK(i == d || index.shape()[i] == shape()[i], "scatter_add: index ",
                index.shape().to_string(), " and input ", shape().to_string(),
                " differ outside dim ", d);
  check_index_range("scatter_add", index, shape()[d], d, shape());
  OpAttrs a;
  a.i0 = static_cast<int64_t>(d);
  return dispatch1(OpId::scatter_add, {*this, index, src}, a);
}

Tensor Tensor::cat(const std::vector<Tensor>& ts, int64_t dim) {
  TAPER_CHECK(!ts.empty(), "cat: no tensors given");
  const size_t d = normalize_dim(dim, ts[0].rank(), "cat");
  for (const Tensor& t : ts) {
    check_same("cat", ts[0], t);
    bool ok = t.rank() == ts[0].rank();
    for (size_t i = 0; ok && i < t.rank(); ++i)
      if (i != d && t.shape()[i] != ts[0].shape()[i]) ok = false;
    TAPER_CHECK(ok, "cat: shapes ", ts[0].shape().to_string(), " and ", t.shape().to_string(),
                " differ outside dim ", d);
  }
  if (ts.size() == 1) return ts[0];
  OpAttrs a;
  a.i0 = static_cast<int64_t>(d);
  return dispatch1(OpId::cat, ts, a);
}

Tensor Tensor::stack(const std::vector<Tensor>& ts, int64_t dim) {
  TAPER_CHECK(!ts.empty(), "stack: no tensors given");
  const size_t d = normalize_dim(dim, ts[0].rank() + 1, "stack");
  std::vector<Tensor> u;
  for (const Tensor& t : ts) {
    TAPER_CHECK(t.shape() == ts[0].shape(), "stack: shapes ", ts[0].shape().to_string(), " and ",
                t.shape().to_string(), " differ");
    u.push_back(t.unsqueeze(static_cast<int64_t>(d)));
  }
  return cat(u, static_cast<int64_t>(d));
}

Tensor operator+(const Tensor& a, const Tensor& b) { return a.add(b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return a.sub(b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return a.mul(b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return a.div(b); }
Tensor operator-(const Tensor& a) { return a.neg(); }
Tensor operator+(const Tensor& a, double s) { return a.affine(1.0, s); }
Tensor operator-(const Tensor& a, double s) { return a.affine(1.0, -s); }
Tensor operator*(const Tensor& a, double s) { return a.affine(s, 0.0); }
Tensor operator/(const Tensor& a, double s) { return binary_scalar(OpId::div, a, s); }
Tensor operator+(double s, const Tensor& a) { return a.affine(1.0, s); }
Tensor operator-(double s, const Tensor& a) { return a.affine(-1.0, s); }
Tensor operator*(double s, const Tensor& a) { return a.affine(s, 0.0); }
Tensor operator/(double s, const Tensor& a) { return binary_scalar(OpId::div, a, s, true); }

}  // namespace taper
