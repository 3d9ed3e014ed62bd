// reduce_ref.h: scalar f64 references of the reduce, matmul and index families (cpu/reduce.cpp,
// cpu/matmul.cpp, cpu/index.cpp), on row-major std::vector<double> with explicit dims.
//
// What it is: the plain maths the kernels are tested against; header-only, one straightforward
// loop per op. Sums are compensated (Neumaier) so the reference is good to ~1 ulp of f64 even for
// 10^7 terms. max/min propagate NaN; argmax/argmin return the first index of the extreme, the
// first NaN when there is one (as PyTorch and the kernels).
// What it is not: fast, or a kernel: nothing here is registered or dispatched.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace taper::ref {

/// Product of dims (1 for none).
inline size_t elem_count(const std::vector<size_t>& dims) {
  size_t n = 1;
  for (size_t d : dims) n *= d;
  return n;
}

/// Row-major multi-index of flat index `i`.
inline std::vector<size_t> unravel(size_t i, const std::vector<size_t>& dims) {
  std::vector<size_t> idx(dims.size());
  for (size_t k = dims.size(); k-- > 0;) {
    idx[k] = i % dims[k];
    i /= dims[k];
  }
  return idx;
}

/// Row-major flat index of a multi-index.
inline size_t ravel(const std::vector<size_t>& idx, const std::vector<size_t>& dims) {
  size_t i = 0;
  for (size_t k = 0; k < dims.size(); ++k) i = i * dims[k] + idx[k];
  return i;
}

// ---- reduce ------------------------------------------------------------------------------------

enum class ReduceOp { Sum, Max, Min, ArgMax, ArgMin };

/// Output dims of a reduction of `dims` over the (sorted, unique) dims `rd`.
inline std::vector<size_t> reduce_dims(const std::vector<size_t>& dims,
                                       const std::vector<int64_t>& rd, bool keepdim) {
  std::vector<size_t> out;
  for (size_t i = 0; i < dims.size(); ++i) {
    bool red = false;
    for (int64_t d : rd) red |= static_cast<size_t>(d) == i;
    if (!red)
      out.push_back(dims[i]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

/// Reduction of x (row-major, `dims`) over `rd`; the result is in the kept dims' row-major order
/// (the same with or without keepdim). ArgMax/ArgMin take one dim and give the index along it.
/// Every reduced extent must be > 0 except for Sum (an empty sum is 0).
inline std::vector<double> reduce(const std::vector<double>& x, const std::vector<size_t>& dims,
                                  const std::vector<int64_t>& rd, ReduceOp op) {
  const std::vector<size_t> od = reduce_dims(dims, rd, true);
  const size_t on = elem_count(od);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> acc(on, 0.0), comp(on, 0.0), pos(on, 0.0);
  std::vector<bool> seen(on, false);
  for (size_t i = 0; i < x.size(); ++i) {
    std::vector<size_t> idx = unravel(i, dims);
    size_t along = 0;
    for (int64_t d : rd) {
      along = idx[static_cast<size_t>(d)];
      idx[static_cast<size_t>(d)] = 0;
    }
    const size_t o = ravel(idx, od);
    const double v = x[i];
    switch (op) {
      case ReduceOp::Sum: {  // Neumaier's compensated sum
        const double t = acc[o] + v;
        comp[o] += std::abs(acc[o]) >= std::abs(v) ? (acc[o] - t) + v : (v - t) + acc[o];
        acc[o] = t;
        break;
      }
      case ReduceOp::Max:
      case ReduceOp::Min: {
        const bool is_max = op == ReduceOp::Max;
        if (!seen[o] || std::isnan(v)) {
          if (!seen[o] || !std::isnan(acc[o])) acc[o] = v;
        } else if (!std::isnan(acc[o]) && (is_max ? v > acc[o] : v < acc[o])) {
          acc[o] = v;
        }
        break;
      }
      case ReduceOp::ArgMax:
      case ReduceOp::ArgMin: {
        const bool is_max = op == ReduceOp::ArgMax;
        const bool better = !seen[o] || (!std::isnan(acc[o]) &&
                                         (std::isnan(v) || (is_max ? v > acc[o] : v < acc[o])));
        if (better) {
          acc[o] = v;
          pos[o] = static_cast<double>(along);
        }
        break;
      }
    }
    seen[o] = true;
  }
  if (op == ReduceOp::Sum)
    for (size_t o = 0; o < on; ++o) acc[o] += comp[o];
  if (op == ReduceOp::ArgMax || op == ReduceOp::ArgMin) return pos;
  for (size_t o = 0; o < on; ++o)
    if (!seen[o] && op != ReduceOp::Sum) acc[o] = nan;
  return acc;
}

// ---- matmul ------------------------------------------------------------------------------------

/// c = a b for `batch` dense pairs a: (batch, m, k), b: (batch, k, n) -> c: (batch, m, n).
/// When `abs_c` is given it receives |a| |b| (the scale of the rounding error bound).
inline std::vector<double> matmul(const std::vector<double>& a, const std::vector<double>& b,
                                  size_t batch, size_t m, size_t k, size_t n,
                                  std::vector<double>* abs_c = nullptr) {
  std::vector<double> c(batch * m * n, 0.0);
  if (abs_c) abs_c->assign(batch * m * n, 0.0);
  for (size_t p = 0; p < batch; ++p)
    for (size_t i = 0; i < m; ++i)
      for (size_t j = 0; j < n; ++j) {
        double s = 0.0, sa = 0.0;
        for (size_t l = 0; l < k; ++l) {
          const double x = a[(p * m + i) * k + l], y = b[(p * k + l) * n + j];
          s += x * y;
          sa += std::abs(x * y);
        }
        c[(p * m + i) * n + j] = s;
        if (abs_c) (*abs_c)[(p * m + i) * n + j] = sa;
      }
  return c;
}

// ---- index -------------------------------------------------------------------------------------

/// x (dims) -> out with dims[dim] = idx.size(), out[.., l, ..] = x[.., idx[l], ..].
inline std::vector<double> index_select(const std::vector<double>& x,
                                        const std::vector<size_t>& dims,
                                        const std::vector<int64_t>& idx, size_t dim) {
  std::vector<size_t> od = dims;
  od[dim] = idx.size();
  std::vector<double> out(elem_count(od));
  for (size_t i = 0; i < out.size(); ++i) {
    std::vector<size_t> p = unravel(i, od);
    p[dim] = static_cast<size_t>(idx[p[dim]]);
    out[i] = x[ravel(p, dims)];
  }
  return out;
}

/// out (idims) with out[p] = x[p with p[dim] = idx[p]].
inline std::vector<double> gather(const std::vector<double>& x, const std::vector<size_t>& dims,
                                  const std::vector<int64_t>& idx, const std::vector<size_t>& idims,
                                  size_t dim) {
  std::vector<double> out(idx.size());
  for (size_t i = 0; i < idx.size(); ++i) {
    std::vector<size_t> p = unravel(i, idims);
    p[dim] = static_cast<size_t>(idx[i]);
    out[i] = x[ravel(p, dims)];
  }
  return out;
}

/// A copy of x (dims) with src[p] (idims) added at p with p[dim] = idx[p], in row-major order of p.
inline std::vector<double> scatter_add(const std::vector<double>& x,
                                       const std::vector<size_t>& dims,
                                       const std::vector<int64_t>& idx,
                                       const std::vector<size_t>& idims,
                                       const std::vector<double>& src, size_t dim) {
  std::vector<double> out = x;
  for (size_t i = 0; i < idx.size(); ++i) {
    std::vector<size_t> p = unravel(i, idims);
    p[dim] = static_cast<size_t>(idx[i]);
    out[ravel(p, dims)] += src[i];
  }
  return out;
}

/// Concatenation of xs (each with its dims, equal except along dim) along dim.
inline std::vector<double> cat(const std::vector<std::vector<double>>& xs,
                               const std::vector<std::vector<size_t>>& dims, size_t dim) {
  std::vector<size_t> od = dims[0];
  od[dim] = 0;
  for (const auto& d : dims) od[dim] += d[dim];
  std::vector<double> out(elem_count(od));
  size_t start = 0;
  for (size_t t = 0; t < xs.size(); ++t) {
    for (size_t i = 0; i < xs[t].size(); ++i) {
      std::vector<size_t> p = unravel(i, dims[t]);
      p[dim] += start;
      out[ravel(p, od)] = xs[t][i];
    }
    start += dims[t][dim];
  }
  return out;
}

/// Zeros of g's dims with dims[dim] = full, and g at [start, start + g_len) along dim.
inline std::vector<double> narrow_bwd(const std::vector<double>& g,
                                      const std::vector<size_t>& gdims, size_t dim, size_t start,
                                      size_t full) {
  std::vector<size_t> od = gdims;
  od[dim] = full;
  std::vector<double> out(elem_count(od), 0.0);
  for (size_t i = 0; i < g.size(); ++i) {
    std::vector<size_t> p = unravel(i, gdims);
    p[dim] += start;
    out[ravel(p, od)] = g[i];
  }
  return out;
}

}  // namespace taper::ref
