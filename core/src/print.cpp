// print.cpp: operator<< for Tensor: a header line (shape, dtype, device, strides when not
// contiguous) and the values, summarised with "..." past 6 items a dim when the tensor is large.
#include <cmath>
#include <iomanip>
#include <ostream>
#include <sstream>

#include "taper/autograd.h"
#include "taper/tensor.h"

namespace taper {
namespace {

constexpr size_t kSummariseAbove = 1000;
constexpr size_t kEdge = 3;

void print_rec(std::ostream& os, const std::vector<double>& v, const std::vector<size_t>& dims,
               size_t d, size_t base, bool summarise, bool is_int, int indent) {
  size_t stride = 1;
  for (size_t i = d + 1; i < dims.size(); ++i) stride *= dims[i];
  os << "[";
  const size_t n = dims[d];
  for (size_t i = 0; i < n; ++i) {
    if (summarise && n > 2 * kEdge && i == kEdge) {
      os << (d + 1 == dims.size() ? "..., " : "...,\n" + std::string(indent + 1, ' '));
      i = n - kEdge - 1;
      continue;
    }
    if (d + 1 == dims.size()) {
      const double x = v[base + i];
      if (is_int)
        os << static_cast<long long>(x);
      else
        os << std::setprecision(6) << x;
    } else {
      print_rec(os, v, dims, d + 1, base + i * stride, summarise, is_int, indent + 1);
    }
    if (i + 1 < n) os << (d + 1 == dims.size() ? ", " : ",\n" + std::string(indent + 1, ' '));
  }
  os << "]";
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "Tensor[undefined]";
  os << "Tensor[shape=" << t.shape().to_string() << ", dtype=" << dtype_name(t.dtype())
     << ", device=" << t.device().to_string();
  if (!t.is_contiguous()) {
    os << ", strides=(";
    for (size_t i = 0; i < t.rank(); ++i) os << (i ? ", " : "") << t.strides()[i];
    os << ")";
  }
  if (t.tracks_grad()) os << ", tracks_grad";
  os << "]\n";
  NoGradGuard ng;
  std::vector<double> v = t.to_vector<double>();
  if (t.rank() == 0) return os << v[0];
  if (t.elem_count() == 0) return os << "[]";
  print_rec(os, v, t.dims(), 0, 0, t.elem_count() > kSummariseAbove, !is_float(t.dtype()), 0);
  return os;
}

}  // namespace taper
