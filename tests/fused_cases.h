// fused_cases.h: the fused forward ops' test cases, shared by the CPU suites (test_fused.cpp)
// and the CUDA ones (test_cuda.cpp): the ops, their random inputs, the f64 reference with the
// scale of its rounding-floor bound, the bound itself, and the call through the public API or
// the composed form. test_fused.cpp's header states the bound.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "taper/composed.h"
#include "tests/ref/fused_ref.h"
#include "tests/test_util.h"

namespace taper::testing {

/// Multiple of the compute type's unit roundoff allowed for the computation's own error (sums of
/// up to ~10^5 terms in 4 x Lanes accumulators, exp at 1 ulp, a handful of roundings).
inline constexpr double kNoise = 64;
inline constexpr double kEps = 1e-5;  ///< every fused norm's eps here

enum class FOp { Softmax, LogSoftmax, RmsNorm, LayerNorm, GroupNorm };

inline const char* fop_name(FOp op) {
  switch (op) {
    case FOp::Softmax: return "softmax";
    case FOp::LogSoftmax: return "log_softmax";
    case FOp::RmsNorm: return "rms_norm";
    case FOp::LayerNorm: return "layer_norm";
    case FOp::GroupNorm: return "group_norm";
  }
  return "?";
}

inline bool is_norm(FOp op) {
  return op == FOp::RmsNorm || op == FOp::LayerNorm || op == FOp::GroupNorm;
}

/// The rounding-floor bound of test_fused.cpp's header. `ulps` scales the first term (1/2: one
/// correct rounding of the reference; 1: two independently rounded results compared with each
/// other).
inline ::testing::AssertionResult at_floor(const std::vector<double>& got,
                                           const std::vector<double>& ref,
                                           const std::vector<double>& scale, DType dt,
                                           double ulps = 0.5, double noise = kNoise) {
  if (got.size() != ref.size() || scale.size() != ref.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << ref.size()
                                         << " (scale " << scale.size() << ")";
  size_t bad = 0, first = 0, inexact = 0;
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], r = ref[i];
    bool ok;
    double ratio = 0;
    if (std::isnan(r) || std::isnan(g)) {
      ok = std::isnan(r) && std::isnan(g);
    } else if (std::isinf(r) || std::isinf(g)) {
      ok = g == r;
    } else {
      const double bound = ulps * ulp_at(dt, r) + noise * compute_u(dt) * scale[i];
      const double err = std::abs(g - r);
      ok = err <= bound;
      ratio = bound > 0 ? err / bound : (err > 0 ? 1e300 : 0);
      if (err > 0.5 * ulp_at(dt, r)) ++inexact;
    }
    if (!ok) ratio = std::max(ratio, 1e300);
    if (ratio > worst) worst = ratio, worst_i = i;
    if (!ok && bad++ == 0) first = i;
  }
  if (bad == 0) return ::testing::AssertionSuccess() << inexact << " beyond ulp/2";
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " outside the floor; first at " << first << ": got "
         << got[first] << " want " << ref[first] << " (scale " << scale[first] << "); worst at "
         << worst_i << ": got " << got[worst_i] << " want " << ref[worst_i];
}

// ---- inputs, the reference, and the call -----------------------------------------------------

struct Problem {
  FOp op;
  Tensor x, w, b;  // w, b: empty tensors where there is no affine (softmax: always)
  size_t groups = 1;
};

inline Tensor empty_of(DType dt) { return Tensor::zeros(Shape({0}), dt); }

/// Random inputs for `op` on `shape`, rounded to `dt`: softmax inputs randn * 3, norm inputs
/// randn + 0.5, weights in +-[0.5, 1.5], biases in [-1, 1].
inline Problem make_problem(FOp op, DType dt, const Shape& shape, uint64_t seed,
                            bool affine = true, size_t groups = 1, double offset = 0.5) {
  Problem p;
  p.op = op;
  p.groups = groups;
  p.x = is_norm(op) ? Tensor::randn(shape, dt, Device::cpu(), seed, offset, 1.0)
                     : Tensor::randn(shape, dt, Device::cpu(), seed, 0.0, 3.0);
  if (is_norm(op) && affine) {
    const size_t P = op == FOp::GroupNorm ? shape[1] : shape[shape.rank() - 1];
    std::vector<double> w = values(random_tensor(Shape({P}), DType::F64, seed + 1, 0.5, 1.5));
    for (size_t i = 0; i < P; i += 3) w[i] = -w[i];
    p.w = Tensor::from_vector(w, Shape({P})).to_dtype(dt);
    if (op != FOp::RmsNorm) p.b = random_tensor(Shape({P}), dt, seed + 2, -1.0, 1.0);
  }
  if (!p.w.defined()) p.w = empty_of(dt);
  if (!p.b.defined()) p.b = empty_of(dt);
  return p;
}

/// p with input x (any layout, any device) and its w and b moved to x's device.
inline Problem with_input(const Problem& p, const Tensor& x) {
  Problem q = p;
  q.x = x;
  q.w = p.w.to_device(x.device());
  q.b = p.b.to_device(x.device());
  return q;
}

/// The f64 reference and the per-element scale of the rounding-floor bound.
struct Expected {
  std::vector<double> y, scale, mean, rstd;
};

inline Expected reference(const Problem& p) {
  const std::vector<double> x = values(p.x);
  const size_t D = p.x.dims().back();
  Expected e;
  switch (p.op) {
    case FOp::Softmax:
    case FOp::LogSoftmax: {
      const bool log = p.op == FOp::LogSoftmax;
      e.y = log ? ref::log_softmax_fwd(x, D) : ref::softmax_fwd(x, D);
      e.scale.resize(x.size());
      for (size_t r = 0; r * D < x.size(); ++r) {
        double m = -std::numeric_limits<double>::infinity();
        for (size_t i = 0; i < D; ++i) m = std::max(m, x[r * D + i]);
        double s = 0;
        for (size_t i = 0; i < D; ++i) s += std::exp(x[r * D + i] - m);
        // x - max rounds in the compute type (exactly for bf16/f16 inputs, not for f32) and exp
        // turns that absolute error into a relative one: softmax's scale is |y| (1 + |x - max|).
        // log sum has an absolute error of the sum's relative error: hence the + 1.
        for (size_t i = 0; i < D; ++i) {
          const size_t j = r * D + i;
          e.scale[j] = log ? std::abs(x[j] - m) + std::abs(std::log(s)) + 1.0
                           : (e.y[j] == 0 ? 0.0 : std::abs(e.y[j]) * (1.0 + std::abs(x[j] - m)));
        }
      }
      return e;
    }
    default: break;
  }
  const std::vector<double> w = p.w.elem_count() ? values(p.w) : std::vector<double>();
  const std::vector<double> b = p.b.elem_count() ? values(p.b) : std::vector<double>();
  ref::NormFwd o;
  size_t S = 1, P = D;  // elements per affine parameter, parameters
  if (p.op == FOp::RmsNorm) o = ref::rms_norm_fwd(x, w, D, kEps);
  if (p.op == FOp::LayerNorm) o = ref::layer_norm_fwd(x, w, b, D, kEps);
  if (p.op == FOp::GroupNorm) {
    const size_t N = p.x.dim(0), C = p.x.dim(1);
    S = x.size() / (N * C);
    P = C;
    o = ref::group_norm_fwd(x, w, b, N, C, S, p.groups, kEps);
  }
  e.y = o.y;
  e.mean = o.mean;
  e.rstd = o.rstd;
  e.scale.resize(x.size());
  const size_t L = x.size() / std::max<size_t>(o.rstd.size(), 1);  // elements per statistic
  for (size_t i = 0; i < x.size(); ++i) {
    const size_t k = L ? i / L : 0, c = (i / S) % P;
    const double mean = o.mean.empty() ? 0.0 : o.mean[k];
    e.scale[i] =
        (std::abs(x[i]) + std::abs(mean)) * o.rstd[k] * (w.empty() ? 1.0 : std::abs(w[c])) +
        (b.empty() ? 0.0 : std::abs(b[c])) + std::abs(o.y[i]);
  }
  return e;
}

inline Tensor run_public(const Problem& p, bool composed) {
  switch (p.op) {
    case FOp::Softmax:
      return composed ? composed::softmax_last_dim(p.x) : ops::softmax_last_dim(p.x);
    case FOp::LogSoftmax:
      return composed ? composed::log_softmax_last_dim(p.x) : ops::log_softmax_last_dim(p.x);
    case FOp::RmsNorm:
      return composed ? composed::rms_norm(p.x, p.w, kEps) : ops::rms_norm(p.x, p.w, kEps);
    case FOp::LayerNorm:
      return composed ? composed::layer_norm(p.x, p.w, p.b, kEps)
                      : ops::layer_norm(p.x, p.w, p.b, kEps);
    case FOp::GroupNorm:
      return composed ? composed::group_norm(p.x, p.groups, p.w, p.b, kEps)
                      : ops::group_norm(p.x, p.groups, p.w, p.b, kEps);
  }
  return Tensor();
}

}  // namespace taper::testing
