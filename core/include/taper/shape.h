// shape.h: `Shape` (dims) and `Layout` (shape, strides in elements, offset), as in candle.
//
// What it is: value types and the pure index arithmetic of views (transpose, permute, narrow,
// broadcast, reshape-as-view). What it is not: storage; nothing here allocates tensor memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

namespace taper {

/// The dims of a tensor, outermost first. A rank-0 shape holds one element.
class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<size_t> dims) : dims_(dims) {}
  Shape(std::vector<size_t> dims) : dims_(std::move(dims)) {}  // NOLINT: implicit by design

  size_t rank() const { return dims_.size(); }
  size_t operator[](size_t i) const { return dims_[i]; }
  size_t& operator[](size_t i) { return dims_[i]; }
  const std::vector<size_t>& dims() const { return dims_; }
  /// Product of the dims (1 for rank 0).
  size_t elem_count() const;
  /// Row-major strides, in elements.
  std::vector<int64_t> contiguous_strides() const;
  bool operator==(const Shape& o) const { return dims_ == o.dims_; }
  bool operator!=(const Shape& o) const { return dims_ != o.dims_; }
  /// "(2, 3, 4)"
  std::string to_string() const;

 private:
  std::vector<size_t> dims_;
};

/// Where a tensor's elements live inside its storage: element (i0, i1, ...) is at
/// `offset + sum(ik * strides[k])`, counted in elements. Strides may be 0 (broadcast).
struct Layout {
  Shape shape;
  std::vector<int64_t> strides;
  size_t offset = 0;

  Layout() = default;
  /// A contiguous row-major layout of `s` starting at `offset`.
  explicit Layout(Shape s, size_t offset = 0);
  Layout(Shape s, std::vector<int64_t> st, size_t off)
      : shape(std::move(s)), strides(std::move(st)), offset(off) {}

  size_t rank() const { return shape.rank(); }
  size_t elem_count() const { return shape.elem_count(); }
  /// True when the elements are row-major and dense (size-1 dims may have any stride).
  bool is_contiguous() const;
  /// The strides a reshape to `new_shape` can use without copying, if there are any.
  std::optional<std::vector<int64_t>> view_strides(const Shape& new_shape) const;
  /// Largest and smallest element index reached (for bounds checks); requires elem_count() > 0.
  size_t max_index() const;
};

/// Resolves a possibly negative dim against `rank`; throws `Error` naming `op` when out of range.
size_t normalize_dim(int64_t dim, size_t rank, const char* op);

/// NumPy broadcast of two shapes; throws `Error` naming `op` and both shapes on mismatch.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
/// Whether `from` broadcasts to `to` alone (Tensor::broadcast_as's rule): rank no larger, and
/// each of its dims, aligned from the right, equal to `to`'s or 1.
bool broadcasts_to(const Shape& from, const Shape& to);

}  // namespace taper
