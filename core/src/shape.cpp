// shape.cpp: Shape and Layout arithmetic (element counts capped at 2^60, row-major strides,
// contiguity, reshape-as-view strides), dim normalisation and NumPy broadcasting (shape.h).
// What it is not: storage or tensors; nothing here allocates tensor memory.
#include <algorithm>
#include <sstream>

#include "taper/error.h"
#include "taper/shape.h"

namespace taper {

// At most 2^60 elements: every byte count (8 bytes an element at most) and every int64 stride
// or offset computed from a valid shape then fits without wrapping.
constexpr size_t kMaxElems = size_t{1} << 60;

size_t Shape::elem_count() const {
  for (size_t d : dims_)
    if (d == 0) return 0;
  size_t n = 1;
  for (size_t d : dims_)
    TAPER_CHECK(!__builtin_mul_overflow(n, d, &n) && n <= kMaxElems, "shape ", to_string(),
                " has more than 2^60 elements");
  return n;
}

std::vector<int64_t> Shape::contiguous_strides() const {
  std::vector<int64_t> st(dims_.size());
  int64_t acc = 1;
  for (size_t i = dims_.size(); i-- > 0;) {
    st[i] = acc;
    // The outermost dim's product is no stride. A shape with no elements passes the element
    // count check whatever its other dims, so their products are checked here.
    TAPER_CHECK(i == 0 || (dims_[i] <= static_cast<size_t>(INT64_MAX) &&
                           !__builtin_mul_overflow(acc, static_cast<int64_t>(dims_[i]), &acc)),
                "shape ", to_string(), ": its row-major strides overflow int64");
  }
  return st;
}

std::string Shape::to_string() const {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < dims_.size(); ++i) os << (i ? ", " : "") << dims_[i];
  os << ")";
  return os.str();
}

Layout::Layout(Shape s, size_t off) : shape(std::move(s)), offset(off) {
  strides = shape.contiguous_strides();
}

bool Layout::is_contiguous() const {
  int64_t expect = 1;
  for (size_t i = shape.rank(); i-- > 0;) {
    if (shape[i] == 1) continue;
    if (strides[i] != expect) return false;
    expect *= static_cast<int64_t>(shape[i]);
  }
  return true;
}

size_t Layout::max_index() const {
  int64_t m = static_cast<int64_t>(offset);
  for (size_t i = 0; i < shape.rank(); ++i)
    if (shape[i] > 0) m += (static_cast<int64_t>(shape[i]) - 1) * std::max<int64_t>(strides[i], 0);
  return static_cast<size_t>(m);
}

// The chunk-matching rule PyTorch uses for view(): old dims are grouped into chunks that are
// contiguous among themselves; each chunk must map onto whole new dims.
std::optional<std::vector<int64_t>> Layout::view_strides(const Shape& ns) const {
  std::vector<int64_t> out(ns.rank());
  if (elem_count() == 0 || shape.rank() == 0) return ns.contiguous_strides();
  int64_t view_d = static_cast<int64_t>(ns.rank()) - 1;
  int64_t chunk_base = strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t td = static_cast<int64_t>(shape.rank()) - 1; td >= 0; --td) {
    tensor_numel *= static_cast<int64_t>(shape[td]);
    if (td == 0 || (shape[td - 1] != 1 && strides[td - 1] != tensor_numel * chunk_base)) {
      while (view_d >= 0 && (view_numel < tensor_numel || ns[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base;
        view_numel *= static_cast<int64_t>(ns[view_d]);
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (td > 0) {
        chunk_base = strides[td - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

size_t normalize_dim(int64_t dim, size_t rank, const char* op) {
  const int64_t r = static_cast<int64_t>(rank);
  TAPER_CHECK(dim >= -r && dim < r, op, ": dim ", dim, " out of range for rank ", rank);
  return static_cast<size_t>(dim < 0 ? dim + r : dim);
}

bool broadcasts_to(const Shape& from, const Shape& to) {
  if (from.rank() > to.rank()) return false;
  const size_t lead = to.rank() - from.rank();
  for (size_t i = 0; i < from.rank(); ++i)
    if (from[i] != to[lead + i] && from[i] != 1) return false;
  return true;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t r = std::max(a.rank(), b.rank());
  std::vector<size_t> out(r);
  for (size_t i = 0; i < r; ++i) {
    const size_t da = i < r - a.rank() ? 1 : a[i - (r - a.rank())];
    const size_t db = i < r - b.rank() ? 1 : b[i - (r - b.rank())];
    TAPER_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", a.to_string(), " and ",
                b.to_string(), " cannot be broadcast together");
    out[i] = da == 1 ? db : da;
  }
  return Shape(out);
}

}  // namespace taper
