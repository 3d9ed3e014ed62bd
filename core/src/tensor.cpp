// tensor.cpp: Tensor creation, inspection, host transfer, conversion, views, and Var.
//
// Views share storage and are recorded as registry ops (reshape, permute, narrow, broadcast_as)
// so gradients flow through them; they need no kernel.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>

#include "taper/autograd.h"
#include "taper/op.h"
#include "taper/tensor.h"

namespace taper {

namespace detail {
std::vector<Tensor> record(OpId op, const std::vector<Tensor>& in, std::vector<Tensor> outs,
                           const OpAttrs& attrs);
}

uint64_t next_tensor_id() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

namespace {

/// shape.elem_count(), its overflow Error (more than 2^60 elements) naming `op`.
size_t counted(const Shape& shape, const char* op) {
  try {
    return shape.elem_count();
  } catch (const Error& e) {
    throw Error(std::string(op) + ": " + e.what());
  }
}

Tensor make_tensor(std::shared_ptr<Storage> st, Layout layout, DType dt) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(st);
  impl->layout = std::move(layout);
  impl->dtype = dt;
  impl->id = next_tensor_id();
  return Tensor(std::move(impl));
}

Tensor view_of(const Tensor& src, Layout layout, OpId op, const OpAttrs& attrs) {
  Tensor v = make_tensor(src.storage(), std::move(layout), src.dtype());
  return detail::record(op, {src}, {v}, attrs)[0];
}

}  // namespace

// ---- creation -----------------------------------------------------------------------------------

Tensor Tensor::empty(const Shape& shape, DType dt, Device dev) {
  auto st = std::make_shared<Storage>(dev, counted(shape, "empty") * dtype_size(dt));
  return make_tensor(std::move(st), Layout(shape), dt);
}

Tensor Tensor::full(const Shape& shape, double value, DType dt, Device dev) {
  OpAttrs a;
  a.shape = shape.dims();
  a.dtype = dt;
  a.device = dev;
  a.f0 = value;
  return dispatch1(OpId::fill, {}, a);
}
Tensor Tensor::zeros(const Shape& shape, DType dt, Device dev) { return full(shape, 0.0, dt, dev); }
Tensor Tensor::ones(const Shape& shape, DType dt, Device dev) { return full(shape, 1.0, dt, dev); }

Tensor Tensor::arange(double start, double end, double step, DType dt, Device dev) {
  TAPER_CHECK(step != 0.0 && std::isfinite(start) && std::isfinite(end) && std::isfinite(step),
              "arange: bad range start=", start, " end=", end, " step=", step);
  const double n = std::ceil((end - start) / step);
  TAPER_CHECK(!(n > 1.1529215046068470e18), "arange: [", start, ", ", end, ") in steps of ",
              step, " has ", n, " elements, more than 2^60");
  OpAttrs a;
  a.shape = {n > 0 ? static_cast<size_t>(n) : 0};
  a.dtype = dt;
  a.device = dev;
  a.f0 = start;
  a.f1 = step;
  return dispatch1(OpId::arange, {}, a);
}

Tensor Tensor::rand(const Shape& shape, DType dt, Device dev, uint64_t seed, double lo,
                    double hi) {
  TAPER_CHECK(is_float(dt), "rand: needs a float dtype, got ", dtype_name(dt));
  OpAttrs a;
  a.shape = shape.dims();
  a.dtype = dt;
  a.device = dev;
  a.seed = seed;
  a.f0 = lo;
  a.f1 = hi;
  return dispatch1(OpId::rand_uniform, {}, a);
}

Tensor Tensor::randn(const Shape& shape, DType dt, Device dev, uint64_t seed, double mean,
                     double std) {
  TAPER_CHECK(is_float(dt), "randn: needs a float dtype, got ", dtype_name(dt));
  OpAttrs a;
  a.shape = shape.dims();
  a.dtype = dt;
  a.device = dev;
  a.seed = seed;
  a.f0 = mean;
  a.f1 = std;
  return dispatch1(OpId::rand_normal, {}, a);
}

Tensor Tensor::from_host(const void* data, size_t count, DType dt, const Shape& shape,
                         Device dev) {
  TAPER_CHECK(count == counted(shape, "from_vector"), "from_vector: ", count,
              " values do not fill shape ", shape.to_string(), " (", shape.elem_count(),
              " elements)");
  Tensor t = empty(shape, dt, Device::cpu());
  if (count) std::memcpy(t.data_ptr(), data, count * dtype_size(dt));
  return dev.is_cpu() ? t : t.to_device(dev);
}

// ---- inspection ---------------------------------------------------------------------------------

size_t Tensor::dim(int64_t d) const { return shape()[normalize_dim(d, rank(), "dim")]; }

void* Tensor::data_ptr() const {
  return static_cast<char*>(impl().storage->data()) + impl().layout.offset * dtype_size(dtype());
}

// ---- host transfer ------------------------------------------------------------------------------

void Tensor::copy_to_host(void* dst, DType as) const {
  NoGradGuard ng;
  Tensor t = *this;
  if (!device().is_cpu()) t = t.to_device(Device::cpu());
  if (t.dtype() != as) t = t.to_dtype(as);
  t = t.contiguous();
  if (t.elem_count()) std::memcpy(dst, t.data_ptr(), t.elem_count() * dtype_size(as));
}

double Tensor::item() const {
  TAPER_CHECK(elem_count() == 1, "item: needs a single-element tensor, got shape ",
              shape().to_string());
  return to_vector<double>()[0];
}

void Tensor::copy_from(const Tensor& src) const {
  TAPER_CHECK(defined() && src.defined(), "copy_from: an undefined tensor");
  TAPER_CHECK(src.shape() == shape(), "copy_from: source ", src.shape().to_string(), " ",
              dtype_name(src.dtype()), " does not fit destination ", shape().to_string(), " ",
              dtype_name(dtype()));
  TAPER_CHECK(src.device() == device() || src.device().is_cpu(), "copy_from: source on ",
              src.device().to_string(), ", destination on ", device().to_string(),
              " (the source must be on the destination's device or the host)");
  TAPER_CHECK(is_contiguous(), "copy_from: the destination ", shape().to_string(), " ",
              dtype_name(dtype()), " is not contiguous");
  TAPER_CHECK(!tracks_grad(), "copy_from: the destination ", shape().to_string(), " ",
              dtype_name(dtype()), " tracks gradients; write into a detached view (Var::value())");
  NoGradGuard ng;
  Tensor s = src.detach().to_dtype(dtype()).contiguous();
  const size_t n = elem_count() * dtype_size(dtype());
  if (n == 0 || s.data_ptr() == data_ptr()) return;
  DeviceBackend& be = device_backend(device().kind());
  if (s.device() == device())
    be.copy_device(device(), data_ptr(), device(), s.data_ptr(), n);
  else
    be.copy_from_host(device(), data_ptr(), s.data_ptr(), n);
}

// ---- conversion ---------------------------------------------------------------------------------

Tensor Tensor::to_dtype(DType dt) const {
  if (dt == dtype()) return *this;
  OpAttrs a;
  a.dtype = dt;
  return dispatch1(OpId::to_dtype, {*this}, a);
}

// to_device: a registry op with no kernel (the backends copy); its backward moves the gradient
// back to the source device. Between two devices of one non-host kind the backend copies
// directly (peer copy); between two kinds it goes through the host.
Tensor Tensor::to_device(Device dev) const {
  if (dev == device()) return *this;
  Tensor src = detach().contiguous();
  Tensor out = empty(shape(), dtype(), dev);
  const size_t n = elem_count() * dtype_size(dtype());
  const Device from = src.device();
  if (n > 0) {
    if (from.is_cpu()) {
      device_backend(dev.kind()).copy_from_host(dev, out.data_ptr(), src.data_ptr(), n);
    } else if (dev.is_cpu()) {
      device_backend(from.kind()).copy_to_host(from, out.data_ptr(), src.data_ptr(), n);
    } else if (from.kind() == dev.kind()) {
      device_backend(dev.kind()).copy_device(dev, out.data_ptr(), from, src.data_ptr(), n);
    } else {
      const Tensor host = src.to_device(Device::cpu());
      device_backend(dev.kind()).copy_from_host(dev, out.data_ptr(), host.data_ptr(), n);
    }
  }
  OpAttrs a;
  a.device = dev;
  return detail::record(OpId::to_device, {*this}, {out}, a)[0];
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return dispatch1(OpId::copy, {*this});
}

Tensor Tensor::detach() const {
  return make_tensor(impl().storage, impl().layout, impl().dtype);
}

// ---- views --------------------------------------------------------------------------------------

Tensor Tensor::reshape(const Shape& ns) const {
  TAPER_CHECK(counted(ns, "reshape") == elem_count(), "reshape: cannot reshape ", shape().to_string(),
              " (", elem_count(), " elements) to ", ns.to_string(), " (", ns.elem_count(),
              " elements)");
  if (ns == shape()) return *this;
  auto st = layout().view_strides(ns);
  const Tensor src = st ? *this : contiguous();
  if (!st) st = ns.contiguous_strides();
  OpAttrs a;
  a.shape = ns.dims();
  return view_of(src, Layout(ns, *st, src.layout().offset), OpId::reshape, a);
}

Tensor Tensor::permute(const std::vector<size_t>& order) const {
  std::vector<bool> used(rank(), false);
  bool ok = order.size() == rank();
  for (size_t d : order) {
    if (!ok || d >= rank() || used[d]) {
      ok = false;
      break;
    }
    used[d] = true;
  }
  if (!ok) {
    std::string o;
    for (size_t d : order) o += std::to_string(d) + " ";
    throw Error(detail::str_cat("permute: (", o, ") is not a permutation of the dims of ",
                                shape().to_string()));
  }
  std::vector<size_t> dims(rank());
  std::vector<int64_t> st(rank());
  for (size_t i = 0; i < rank(); ++i) {
    dims[i] = shape()[order[i]];
    st[i] = strides()[order[i]];
  }
  OpAttrs a;
  a.ints.assign(order.begin(), order.end());
  return view_of(*this, Layout(Shape(dims), st, layout().offset), OpId::permute, a);
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  const size_t a = normalize_dim(d0, rank(), "transpose");
  const size_t b = normalize_dim(d1, rank(), "transpose");
  std::vector<size_t> order(rank());
  std::iota(order.begin(), order.end(), 0);
  std::swap(order[a], order[b]);
  return permute(order);
}

Tensor Tensor::narrow(int64_t dim, size_t start, size_t len) const {
  const size_t d = normalize_dim(dim, rank(), "narrow");
  TAPER_CHECK(start <= shape()[d] && len <= shape()[d] - start, "narrow: start ", start,
              " and length ", len, " are out of range for dim ", d, " of ", shape().to_string());
  std::vector<size_t> dims = shape().dims();
  dims[d] = len;
  Layout l(Shape(dims), strides(), layout().offset + (len ? start * strides()[d] : 0));
  OpAttrs a;
  a.i0 = static_cast<int64_t>(d);
  a.ints = {static_cast<int64_t>(start), static_cast<int64_t>(shape()[d])};
  return view_of(*this, std::move(l), OpId::narrow, a);
}

Tensor Tensor::broadcast_as(const Shape& target) const {
  const size_t r = target.rank();
  TAPER_CHECK(broadcasts_to(shape(), target), "broadcast_as: cannot broadcast ",
              shape().to_string(), " to ", target.to_string());
  std::vector<int64_t> st(r, 0);
  for (size_t i = 0; i < rank(); ++i) {
    const size_t j = r - rank() + i;
    st[j] = shape()[i] == target[j] ? strides()[i] : 0;
  }
  if (target == shape()) return *this;
  counted(target, "broadcast_as");
  OpAttrs a;
  a.shape = target.dims();
  return view_of(*this, Layout(target, st, layout().offset), OpId::broadcast_as, a);
}

Tensor Tensor::unsqueeze(int64_t dim) const {
  const size_t d = normalize_dim(dim, rank() + 1, "unsqueeze");
  std::vector<size_t> dims = shape().dims();
  dims.insert(dims.begin() + static_cast<ptrdiff_t>(d), 1);
  return reshape(Shape(dims));
}

Tensor Tensor::squeeze(int64_t dim) const {
  const size_t d = normalize_dim(dim, rank(), "squeeze");
  TAPER_CHECK(shape()[d] == 1, "squeeze: dim ", d, " of ", shape().to_string(), " is not 1");
  std::vector<size_t> dims = shape().dims();
  dims.erase(dims.begin() + static_cast<ptrdiff_t>(d));
  return reshape(Shape(dims));
}

// ---- Var ----------------------------------------------------------------------------------------

Var Var::from_tensor(const Tensor& t) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.storage();
  impl->layout = t.layout();
  impl->dtype = t.dtype();
  impl->is_var = true;
  impl->id = next_tensor_id();
  return Var(std::move(impl));
}

void Var::set(const Tensor& value) {
  TAPER_CHECK(value.shape() == shape() && value.dtype() == dtype() && value.device() == device(),
              "Var::set: value ", value.shape().to_string(), " ", dtype_name(value.dtype()), " ",
              value.device().to_string(), " does not match the variable's ", shape().to_string(),
              " ", dtype_name(dtype()), " ", device().to_string());
  TensorImpl& impl = *impl_ptr();
  impl.storage = value.storage();
  impl.layout = value.layout();
}

}  // namespace taper
