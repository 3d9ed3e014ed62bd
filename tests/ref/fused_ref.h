// fused_ref.h: scalar f64 references of the fused ops (softmax, log-softmax, rms_norm, layer_norm,
// group_norm), forward and backward, on std::vector<double>.
//
// What it is: the plain maths the tests check the Highway kernels (cpu/softmax.cpp, cpu/norm.cpp),
// the CUDA kernels (cuda/softmax.cu, cuda/norm.cu) and the composed forms
// (metal_fallback/composed.cpp) against; header-only, one straightforward loop per formula,
// accumulating in double (two-pass variance, never E[x^2] - E[x]^2).
// What it is not: fast, or a kernel: nothing here is registered or dispatched.
//
// Shape letters: R rows of D elements (softmax, rms_norm, layer_norm: x is (R, D) row-major);
// group norm x is (N, C, S) with S the product of the spatial dims and G groups of C/G channels.
// An empty w or b vector means "no affine" (w = 1, b = 0).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "taper/dtype.h"

namespace taper::ref {

/// Forward outputs of a norm: y and the per-row (per-group) statistics. rms_norm leaves mean
/// empty.
struct NormFwd {
  std::vector<double> y, mean, rstd;
};

/// Gradients of a norm with respect to x, w and b (dw/db empty when there is no affine).
struct NormBwd {
  std::vector<double> dx, dw, db;
};

/// A compensated (Kahan-Babuska-Neumaier) sum: error about one ulp of the result whatever the
/// number of terms, so the reference stays far more accurate than the kernels' f64 sums of
/// 10^5 terms (a plain double sum of 262144 positive terms is off by ~200 ulp).
struct Sum {
  double s = 0, c = 0;
  void add(double v) {
    const double t = s + v;
    c += std::abs(s) >= std::abs(v) ? (s - t) + v : (v - t) + s;
    s = t;
  }
  double value() const { return s + c; }
};

// ---- softmax / log-softmax --------------------------------------------------------------------

namespace detail {
/// The row's max, or NaN when the softmax of the row is NaN everywhere: a NaN in the row, an
/// all -inf row (-inf - -inf is NaN, as in PyTorch), or a +inf in the row (inf - inf).
inline double softmax_row_max(const double* x, size_t D) {
  double m = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < D; ++i) {
    if (std::isnan(x[i])) return std::numeric_limits<double>::quiet_NaN();
    m = std::max(m, x[i]);
  }
  return std::isfinite(m) ? m : std::numeric_limits<double>::quiet_NaN();
}
}  // namespace detail

/// y = exp(x - max) / sum exp(x - max) per row. x: (R, D)
inline std::vector<double> softmax_fwd(const std::vector<double>& x, size_t D) {
  std::vector<double> y(x.size());
  const size_t R = D ? x.size() / D : 0;
  for (size_t r = 0; r < R; ++r) {
    const double* xr = &x[r * D];
    double* yr = &y[r * D];
    const double m = detail::softmax_row_max(xr, D);
    Sum acc;
    for (size_t i = 0; i < D; ++i) acc.add(std::exp(xr[i] - m));
    const double s = acc.value();
    for (size_t i = 0; i < D; ++i) yr[i] = std::exp(xr[i] - m) / s;
  }
  return y;
}

/// y = x - max - log(sum exp(x - max)) per row. x: (R, D)
inline std::vector<double> log_softmax_fwd(const std::vector<double>& x, size_t D) {
  std::vector<double> y(x.size());
  const size_t R = D ? x.size() / D : 0;
  for (size_t r = 0; r < R; ++r) {
    const double* xr = &x[r * D];
    double* yr = &y[r * D];
    const double m = detail::softmax_row_max(xr, D);
    Sum acc;
    for (size_t i = 0; i < D; ++i) acc.add(std::exp(xr[i] - m));
    const double lse = std::log(acc.value());
    for (size_t i = 0; i < D; ++i) yr[i] = (xr[i] - m) - lse;
  }
  return y;
}

/// The log-sum-exp of each row, max + log(sum exp(x - max)): what the fused forwards save for
/// their backward. In the extended sense for the rows whose softmax is NaN: NaN for a row with a
/// NaN, -inf for an all -inf row (and a row of length 0), +inf for a row holding +inf. x: (R, D)
/// with R = `rows` (D may be 0).
inline std::vector<double> logsumexp(const std::vector<double>& x, size_t rows, size_t D) {
  std::vector<double> lse(rows);
  const double inf = std::numeric_limits<double>::infinity();
  for (size_t r = 0; r < rows; ++r) {
    const double* xr = D ? &x[r * D] : nullptr;
    bool nan = false;
    double m = -inf;
    for (size_t i = 0; i < D; ++i) {
      nan = nan || std::isnan(xr[i]);
      m = std::max(m, xr[i]);
    }
    if (nan) {
      lse[r] = std::numeric_limits<double>::quiet_NaN();
      continue;
    }
    if (!std::isfinite(m)) {
      lse[r] = m;
      continue;
    }
    Sum acc;
    for (size_t i = 0; i < D; ++i) acc.add(std::exp(xr[i] - m));
    lse[r] = m + std::log(acc.value());
  }
  return lse;
}

/// dx = y * (dy - sum(dy * y)) per row, y = softmax(x) evaluated here in f64 (the kernel
/// recomputes y from x and the saved lse; the reference needs neither). x, dy: (R, D)
inline std::vector<double> softmax_bwd(const std::vector<double>& x, const std::vector<double>& dy,
                                       size_t D) {
  const std::vector<double> y = softmax_fwd(x, D);
  std::vector<double> dx(y.size());
  const size_t R = D ? y.size() / D : 0;
  for (size_t r = 0; r < R; ++r) {
    Sum acc;
    for (size_t i = 0; i < D; ++i) acc.add(dy[r * D + i] * y[r * D + i]);
    const double dot = acc.value();
    for (size_t i = 0; i < D; ++i) dx[r * D + i] = y[r * D + i] * (dy[r * D + i] - dot);
  }
  return dx;
}

/// dx = dy - softmax(x) * sum(dy) per row, the softmax evaluated here in f64 as
/// exp(log_softmax(x)). x, dy: (R, D)
inline std::vector<double> log_softmax_bwd(const std::vector<double>& x,
                                           const std::vector<double>& dy, size_t D) {
  const std::vector<double> ly = log_softmax_fwd(x, D);
  std::vector<double> dx(ly.size());
  const size_t R = D ? ly.size() / D : 0;
  for (size_t r = 0; r < R; ++r) {
    Sum acc;
    for (size_t i = 0; i < D; ++i) acc.add(dy[r * D + i]);
    const double s = acc.value();
    for (size_t i = 0; i < D; ++i) dx[r * D + i] = dy[r * D + i] - std::exp(ly[r * D + i]) * s;
  }
  return dx;
}

// ---- rms_norm ---------------------------------------------------------------------------------

/// y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps) per row. x: (R, D), w: (D) or empty.
inline NormFwd rms_norm_fwd(const std::vector<double>& x, const std::vector<double>& w, size_t D,
                            double eps) {
  NormFwd o;
  const size_t R = D ? x.size() / D : 0;
  o.y.resize(x.size());
  o.rstd.resize(R);
  for (size_t r = 0; r < R; ++r) {
    Sum ss;
    for (size_t i = 0; i < D; ++i) ss.add(x[r * D + i] * x[r * D + i]);
    const double rstd = 1.0 / std::sqrt(ss.value() / static_cast<double>(D) + eps);
    o.rstd[r] = rstd;
    for (size_t i = 0; i < D; ++i)
      o.y[r * D + i] = x[r * D + i] * rstd * (w.empty() ? 1.0 : w[i]);
  }
  return o;
}

/// Gradients of rms_norm: with g = dy * w and rstd as in the forward,
/// dx = rstd * g - rstd^3 / D * x * sum(g * x); dw = sum over rows of dy * x * rstd.
inline NormBwd rms_norm_bwd(const std::vector<double>& x, const std::vector<double>& w,
                            const std::vector<double>& dy, size_t D, double eps) {
  NormBwd o;
  const size_t R = D ? x.size() / D : 0;
  o.dx.resize(x.size());
  std::vector<Sum> dw(w.empty() ? 0 : D);
  for (size_t r = 0; r < R; ++r) {
    const double* xr = &x[r * D];
    const double* gr = &dy[r * D];
    Sum ss, gx;
    for (size_t i = 0; i < D; ++i) ss.add(xr[i] * xr[i]);
    const double rstd = 1.0 / std::sqrt(ss.value() / static_cast<double>(D) + eps);
    for (size_t i = 0; i < D; ++i) gx.add(gr[i] * (w.empty() ? 1.0 : w[i]) * xr[i]);
    const double c = rstd * rstd * rstd * gx.value() / static_cast<double>(D);
    for (size_t i = 0; i < D; ++i)
      o.dx[r * D + i] = rstd * gr[i] * (w.empty() ? 1.0 : w[i]) - c * xr[i];
    for (size_t i = 0; i < dw.size(); ++i) dw[i].add(gr[i] * xr[i] * rstd);
  }
  for (const Sum& a : dw) o.dw.push_back(a.value());
  return o;
}

// ---- layer_norm and group_norm share one per-block formula ------------------------------------

namespace detail {
/// Two-pass mean and rstd of n values.
inline void block_stats(const double* x, size_t n, double eps, double& mean, double& rstd) {
  Sum s, m2;
  for (size_t i = 0; i < n; ++i) s.add(x[i]);
  mean = s.value() / static_cast<double>(n);
  for (size_t i = 0; i < n; ++i) m2.add((x[i] - mean) * (x[i] - mean));
  rstd = 1.0 / std::sqrt(m2.value() / static_cast<double>(n) + eps);
}
}  // namespace detail

/// y = (x - mean) * rstd * w + b over the last dim (biased variance). x: (R, D), w, b: (D) or
/// empty.
inline NormFwd layer_norm_fwd(const std::vector<double>& x, const std::vector<double>& w,
                              const std::vector<double>& b, size_t D, double eps) {
  NormFwd o;
  const size_t R = D ? x.size() / D : 0;
  o.y.resize(x.size());
  o.mean.resize(R);
  o.rstd.resize(R);
  for (size_t r = 0; r < R; ++r) {
    detail::block_stats(&x[r * D], D, eps, o.mean[r], o.rstd[r]);
    for (size_t i = 0; i < D; ++i)
      o.y[r * D + i] = (x[r * D + i] - o.mean[r]) * o.rstd[r] * (w.empty() ? 1.0 : w[i]) +
                       (b.empty() ? 0.0 : b[i]);
  }
  return o;
}

/// Gradients of layer_norm: xhat = (x - mean) * rstd, g = dy * w,
/// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)); dw = sum_rows dy * xhat; db = sum_rows dy.
inline NormBwd layer_norm_bwd(const std::vector<double>& x, const std::vector<double>& w,
                              const std::vector<double>& b, const std::vector<double>& dy,
                              size_t D, double eps) {
  NormBwd o;
  const size_t R = D ? x.size() / D : 0;
  o.dx.resize(x.size());
  std::vector<Sum> dw(w.empty() ? 0 : D), db(b.empty() ? 0 : D);
  std::vector<double> xhat(D), g(D);
  for (size_t r = 0; r < R; ++r) {
    double mean, rstd;
    detail::block_stats(&x[r * D], D, eps, mean, rstd);
    Sum sg, sgx;
    for (size_t i = 0; i < D; ++i) {
      xhat[i] = (x[r * D + i] - mean) * rstd;
      g[i] = dy[r * D + i] * (w.empty() ? 1.0 : w[i]);
      sg.add(g[i]);
      sgx.add(g[i] * xhat[i]);
    }
    const double mg = sg.value() / static_cast<double>(D);
    const double mgx = sgx.value() / static_cast<double>(D);
    for (size_t i = 0; i < D; ++i) {
      o.dx[r * D + i] = rstd * (g[i] - mg - xhat[i] * mgx);
      if (!w.empty()) dw[i].add(dy[r * D + i] * xhat[i]);
      if (!b.empty()) db[i].add(dy[r * D + i]);
    }
  }
  for (const Sum& a : dw) o.dw.push_back(a.value());
  for (const Sum& a : db) o.db.push_back(a.value());
  return o;
}

/// Group norm of x: (N, C, S): statistics per (n, group) over C/G channels x S positions, then
/// y = (x - mean) * rstd * w[c] + b[c]. mean, rstd: (N, G). w, b: (C) or empty.
inline NormFwd group_norm_fwd(const std::vector<double>& x, const std::vector<double>& w,
                              const std::vector<double>& b, size_t N, size_t C, size_t S,
                              size_t G, double eps) {
  NormFwd o;
  const size_t Cg = C / G, L = Cg * S;
  o.y.resize(x.size());
  o.mean.resize(N * G);
  o.rstd.resize(N * G);
  for (size_t k = 0; k < N * G; ++k) {
    const double* xb = &x[k * L];
    detail::block_stats(xb, L, eps, o.mean[k], o.rstd[k]);
    for (size_t i = 0; i < L; ++i) {
      const size_t c = (k % G) * Cg + i / S;
      o.y[k * L + i] =
          (xb[i] - o.mean[k]) * o.rstd[k] * (w.empty() ? 1.0 : w[c]) + (b.empty() ? 0.0 : b[c]);
    }
  }
  return o;
}

/// Gradients of group_norm: per (n, group) block, xhat = (x - mean) * rstd, g = dy * w[c],
/// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) (means over the block);
/// dw[c] = sum over n and S of dy * xhat; db[c] = sum over n and S of dy.
inline NormBwd group_norm_bwd(const std::vector<double>& x, const std::vector<double>& w,
                              const std::vector<double>& b, const std::vector<double>& dy,
                              size_t N, size_t C, size_t S, size_t G, double eps) {
  NormBwd o;
  const size_t Cg = C / G, L = Cg * S;
  o.dx.resize(x.size());
  std::vector<Sum> dw(w.empty() ? 0 : C), db(b.empty() ? 0 : C);
  std::vector<double> xhat(L), g(L);
  for (size_t k = 0; k < N * G; ++k) {
    double mean, rstd;
    detail::block_stats(&x[k * L], L, eps, mean, rstd);
    Sum sg, sgx;
    for (size_t i = 0; i < L; ++i) {
      const size_t c = (k % G) * Cg + i / S;
      xhat[i] = (x[k * L + i] - mean) * rstd;
      g[i] = dy[k * L + i] * (w.empty() ? 1.0 : w[c]);
      sg.add(g[i]);
      sgx.add(g[i] * xhat[i]);
    }
    const double mg = sg.value() / static_cast<double>(L);
    const double mgx = sgx.value() / static_cast<double>(L);
    for (size_t i = 0; i < L; ++i) {
      const size_t c = (k % G) * Cg + i / S;
      o.dx[k * L + i] = rstd * (g[i] - mg - xhat[i] * mgx);
      if (!w.empty()) dw[c].add(dy[k * L + i] * xhat[i]);
      if (!b.empty()) db[c].add(dy[k * L + i]);
    }
  }
  for (const Sum& a : dw) o.dw.push_back(a.value());
  for (const Sum& a : db) o.db.push_back(a.value());
  return o;
}

// ---- attention ------------------------------------------------------------------------------
// Shape letters: N = B * H heads; q (N, T, D), k and v (N, S, D), mask (N, T, S) (already
// broadcast) or empty, all row-major; out (N, T, D), lse (N, T).

struct AttentionFwd {
  std::vector<double> out, lse;
};

/// softmax(scale q k^T + mask) v per head, the row max subtracted first; a row with no finite
/// max (all -inf, or +inf) or a NaN score gives NaN out and lse. S = 0 gives out 0, lse -inf.
inline AttentionFwd attention_fwd(const std::vector<double>& q, const std::vector<double>& k,
                                  const std::vector<double>& v, const std::vector<double>& mask,
                                  size_t N, size_t T, size_t S, size_t D, double scale) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  AttentionFwd r;
  r.out.assign(N * T * D, 0.0);
  r.lse.assign(N * T, -std::numeric_limits<double>::infinity());
  std::vector<double> s(S);
  for (size_t n = 0; n < N; ++n)
    for (size_t t = 0; t < T; ++t) {
      if (S == 0) continue;
      double m = -std::numeric_limits<double>::infinity();
      bool bad = false;
      for (size_t j = 0; j < S; ++j) {
        double dot = 0;
        for (size_t d = 0; d < D; ++d) dot += q[(n * T + t) * D + d] * k[(n * S + j) * D + d];
        s[j] = scale * dot + (mask.empty() ? 0.0 : mask[(n * T + t) * S + j]);
        if (std::isnan(s[j])) bad = true;
        m = std::max(m, s[j]);
      }
      double* o = &r.out[(n * T + t) * D];
      if (bad || !std::isfinite(m)) {
        std::fill(o, o + D, nan);
        r.lse[n * T + t] = nan;
        continue;
      }
      double sum = 0;
      for (size_t j = 0; j < S; ++j) sum += std::exp(s[j] - m);
      for (size_t j = 0; j < S; ++j) {
        const double p = std::exp(s[j] - m) / sum;
        for (size_t d = 0; d < D; ++d) o[d] += p * v[(n * S + j) * D + d];
      }
      r.lse[n * T + t] = m + std::log(sum);
    }
  return r;
}

struct AttentionBwd {
  std::vector<double> dq, dk, dv;
};

/// The gradients of attention_fwd for the upstream gradient dout (N, T, D): with P the
/// probabilities, D_t = sum(dout_t * out_t), dS = P (dout v^T - D): dq = scale dS k,
/// dk = scale dS^T q, dv = P^T dout. `out` is the forward output the op kept (the kernels read
/// the stored, rounded one; empty: the exact one). A NaN forward row makes its dq row and the
/// head's dk, dv NaN.
inline AttentionBwd attention_bwd(const std::vector<double>& q, const std::vector<double>& k,
                                  const std::vector<double>& v, const std::vector<double>& mask,
                                  const std::vector<double>& out, const std::vector<double>& dout,
                                  size_t N, size_t T, size_t S, size_t D, double scale) {
  AttentionFwd f = attention_fwd(q, k, v, mask, N, T, S, D, scale);
  if (!out.empty()) f.out = out;
  AttentionBwd r;
  r.dq.assign(N * T * D, 0.0);
  r.dk.assign(N * S * D, 0.0);
  r.dv.assign(N * S * D, 0.0);
  for (size_t n = 0; n < N; ++n)
    for (size_t t = 0; t < T; ++t) {
      if (S == 0) continue;
      const double lse = f.lse[n * T + t];
      double rowdot = 0;
      for (size_t d = 0; d < D; ++d)
        rowdot += dout[(n * T + t) * D + d] * f.out[(n * T + t) * D + d];
      for (size_t j = 0; j < S; ++j) {
        double dot = 0, dp = 0;
        for (size_t d = 0; d < D; ++d) {
          dot += q[(n * T + t) * D + d] * k[(n * S + j) * D + d];
          dp += dout[(n * T + t) * D + d] * v[(n * S + j) * D + d];
        }
        const double s = scale * dot + (mask.empty() ? 0.0 : mask[(n * T + t) * S + j]);
        const double p = std::exp(s - lse);  // lse NaN: NaN
        const double ds = p * (dp - rowdot);
        for (size_t d = 0; d < D; ++d) {
          r.dq[(n * T + t) * D + d] += scale * ds * k[(n * S + j) * D + d];
          r.dk[(n * S + j) * D + d] += scale * ds * q[(n * T + t) * D + d];
          r.dv[(n * S + j) * D + d] += p * dout[(n * T + t) * D + d];
        }
      }
    }
  return r;
}

}  // namespace taper::ref
