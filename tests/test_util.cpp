// test_util.cpp: implementation of the shared test helpers (test_util.h).
#include "tests/test_util.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <random>
#include <sstream>

namespace taper::testing {

Tensor random_tensor(const Shape& s, DType dt, uint64_t seed, double lo, double hi) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 12345);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(s.elem_count());
  for (double& x : v) x = u(rng);
  if (!is_float(dt))
    for (double& x : v) x = std::floor(std::abs(x));
  return Tensor::from_vector(v, s).to_dtype(dt);
}

Tensor random_tensor(const Shape& s, DType dt, Device dev, uint64_t seed, double lo, double hi) {
  return random_tensor(s, dt, seed, lo, hi).to_device(dev);
}

std::vector<Device> test_devices() {
  std::vector<Device> out{Device::cpu()};
  for (int i = 0; i < device_count(DeviceKind::Cuda); ++i) out.push_back(Device::cuda(i));
  return out;
}

Tensor with_layout(const Tensor& t, LayoutKind k) {
  NoGradGuard ng;
  switch (k) {
    case LayoutKind::Contiguous:
      return t.contiguous();
    case LayoutKind::Transposed:
      if (t.rank() >= 2) return t.transpose(-1, -2).contiguous().transpose(-1, -2);
      [[fallthrough]];
    case LayoutKind::Narrowed: {
      if (t.rank() == 0) return t;
      // t sits at offset 1 of a last dim padded with 7s on both sides.
      std::vector<size_t> pad1 = t.dims(), pad2 = t.dims();
      pad1.back() = 1;
      pad2.back() = 2;
      Tensor big = Tensor::cat({Tensor::full(Shape(pad1), 7.0, t.dtype(), t.device()), t.contiguous(),
                         Tensor::full(Shape(pad2), 7.0, t.dtype(), t.device())},
                        -1);
      return big.narrow(-1, 1, t.dims().back());
    }
    case LayoutKind::Broadcast: {
      if (t.rank() == 0 || t.dim(0) == 0) return t;  // no first row to broadcast
      return t.narrow(0, 0, 1).contiguous().broadcast_as(t.shape());
    }
  }
  return t;
}

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

double unit_roundoff(DType dt) {
  switch (dt) {
    case DType::BF16: return std::ldexp(1.0, -8);
    case DType::F16: return std::ldexp(1.0, -11);
    case DType::F32: return std::ldexp(1.0, -24);
    case DType::F64: return std::ldexp(1.0, -53);
    default: return 0.0;
  }
}

double compute_u(DType dt) { return unit_roundoff(dt == DType::F64 ? DType::F64 : DType::F32); }

double ulp_at(DType dt, double v) {
  int p = 53, emin = -1022;
  switch (dt) {
    case DType::BF16: p = 8, emin = -126; break;
    case DType::F16: p = 11, emin = -14; break;
    case DType::F32: p = 24, emin = -126; break;
    default: break;
  }
  const double a = std::abs(v);
  const int e = a > 0 && std::isfinite(a) ? std::max(std::ilogb(a), emin) : emin;
  return std::ldexp(1.0, e - p + 1);
}

double tiny_of(DType dt) {
  switch (dt) {
    case DType::BF16: return std::ldexp(1.0, -133);
    case DType::F16: return std::ldexp(1.0, -24);
    case DType::F32: return std::ldexp(1.0, -149);
    default: return std::numeric_limits<double>::denorm_min();
  }
}

std::vector<int64_t> random_indices(size_t n, size_t limit, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> u(0, static_cast<int64_t>(limit) - 1);
  std::vector<int64_t> v(n);
  for (int64_t& x : v) x = u(rng);
  return v;
}

Tensor index_tensor(const std::vector<int64_t>& v, const Shape& s, DType idt) {
  if (idt == DType::U32) return Tensor::from_vector(std::vector<uint32_t>(v.begin(), v.end()), s);
  return Tensor::from_vector(v, s);
}

Tensor small_ints(const Shape& s, DType dt, uint64_t seed) {
  if (!is_float(dt)) return random_tensor(s, dt, seed, 0.0, 8.0);
  return random_tensor(s, DType::F64, seed, -8.0, 8.0).to_dtype(DType::I64).to_dtype(dt);
}

::testing::AssertionResult at_rounding_floor(const std::vector<double>& got,
                                             const std::vector<double>& ref, DType dt, double k,
                                             double slack) {
  double mx = 0;
  for (double v : ref)
    if (std::isfinite(v)) mx = std::max(mx, std::abs(v));
  const double u = unit_roundoff(dt);
  return all_close(got, ref, k * u, slack * u * mx);
}

Tensor random_ints(const Shape& s, DType dt, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const size_t n = s.elem_count();
  switch (dt) {
    case DType::U8: {
      std::vector<uint8_t> v(n);
      for (auto& e : v) e = static_cast<uint8_t>(rng());
      return Tensor::from_vector(v, s);
    }
    case DType::U32: {
      std::vector<uint32_t> v(n);
      for (auto& e : v) e = static_cast<uint32_t>(rng());
      return Tensor::from_vector(v, s);
    }
    default: {
      std::vector<int64_t> v(n);
      for (size_t i = 0; i < n; ++i) {
        const int64_t r = static_cast<int64_t>(rng() >> 23) - (int64_t{1} << 40);
        v[i] = (i % 5 == 0) ? r % 100 : r;
      }
      if (n > 3) {
        v[1] = std::numeric_limits<int64_t>::min();
        v[2] = std::numeric_limits<int64_t>::max();
        v[3] = 0;
      }
      return Tensor::from_vector(v, s);
    }
  }
}

Tensor away_from_zero(const Shape& s, uint64_t seed) {
  const Tensor m = random_tensor(s, DType::F64, seed, 0.2, 2.0);
  const Tensor sign = random_tensor(s, DType::F64, seed + 1, -1.0, 1.0);
  NoGradGuard ng;
  return sign.gt(Tensor::zeros(Shape({1}), DType::F64)).where_cond(m, -m);
}

std::string gtest_name(std::string s) {
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

Tensor apply_unary(OpId op, const Tensor& x, double f0, double f1) {
  switch (op) {
    case OpId::neg: return -x;
    case OpId::abs: return x.abs();
    case OpId::exp: return x.exp();
    case OpId::log: return x.log();
    case OpId::sqrt: return x.sqrt();
    case OpId::rsqrt: return x.rsqrt();
    case OpId::recip: return x.recip();
    case OpId::sqr: return x.sqr();
    case OpId::tanh: return x.tanh();
    case OpId::sigmoid: return x.sigmoid();
    case OpId::relu: return x.relu();
    case OpId::gelu: return x.gelu();
    case OpId::gelu_erf: return x.gelu_erf();
    case OpId::silu: return x.silu();
    case OpId::sin: return x.sin();
    case OpId::cos: return x.cos();
    case OpId::powf: return x.powf(f0);
    case OpId::affine: return x.affine(f0, f1);
    case OpId::clamp: return x.clamp(f0, f1);
    default: ADD_FAILURE() << "not a unary op"; return x;
  }
}

Tensor apply_binary(OpId op, const Tensor& a, const Tensor& b) {
  switch (op) {
    case OpId::add: return a + b;
    case OpId::sub: return a - b;
    case OpId::mul: return a * b;
    case OpId::div: return a / b;
    case OpId::maximum: return a.maximum(b);
    case OpId::minimum: return a.minimum(b);
    case OpId::eq: return a.eq(b);
    case OpId::ne: return a.ne(b);
    case OpId::lt: return a.lt(b);
    case OpId::le: return a.le(b);
    case OpId::gt: return a.gt(b);
    case OpId::ge: return a.ge(b);
    default: ADD_FAILURE() << "not a binary op"; return a;
  }
}

::testing::AssertionResult all_close(const std::vector<double>& got,
                                     const std::vector<double>& ref, double rtol, double atol) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << ref.size();
  double worst = 0.0;
  size_t worst_i = 0, bad = 0, first_bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], r = ref[i];
    bool ok;
    if (std::isnan(r) || std::isnan(g))
      ok = std::isnan(r) && std::isnan(g);
    else if (std::isinf(r) || std::isinf(g))
      ok = g == r;
    else
      ok = std::abs(g - r) <= atol + rtol * std::abs(r);
    const double err = (std::isfinite(g) && std::isfinite(r))
                           ? std::abs(g - r) / (atol + rtol * std::abs(r) + 1e-300)
                           : (ok ? 0.0 : std::numeric_limits<double>::infinity());
    if (err > worst) {
      worst = err;
      worst_i = i;
    }
    if (!ok && bad++ == 0) first_bad = i;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " elements differ; first at " << first_bad << ": got "
         << got[first_bad] << " want " << ref[first_bad] << "; worst at " << worst_i << ": got "
         << got[worst_i] << " want " << ref[worst_i] << " (" << worst
         << "x the bound, rtol=" << rtol << " atol=" << atol << ")";
}

::testing::AssertionResult grad_check(
    const std::function<Tensor(const std::vector<Tensor>&)>& f, const std::vector<Tensor>& inputs,
    double tol, double step) {
  std::vector<Tensor> base;
  for (const Tensor& t : inputs) base.push_back(t.to_dtype(DType::F64).contiguous().detach());
  // Fixed random projection so every output element matters.
  Tensor probe;
  {
    NoGradGuard ng;
    Tensor y = f(base);
    probe = random_tensor(y.shape(), DType::F64, 4242, -1.0, 1.0);
  }
  auto scalar_of = [&](const std::vector<Tensor>& xs) {
    NoGradGuard ng;
    return (f(xs) * probe).sum_all().item();
  };
  std::vector<Tensor> vars;
  for (const Tensor& t : base)
    vars.push_back(is_float(t.dtype()) ? Tensor(Var::from_tensor(t)) : t);
  GradStore gs = (f(vars) * probe).sum_all().backward();
  for (size_t k = 0; k < base.size(); ++k) {
    if (!is_float(base[k].dtype()) || base[k].elem_count() == 0) continue;
    auto g = gs.get(vars[k]);
    if (!g) return ::testing::AssertionFailure() << "no gradient reached input " << k;
    if (g->shape() != base[k].shape())
      return ::testing::AssertionFailure() << "gradient of input " << k << " has shape "
                                           << g->shape().to_string();
    const std::vector<double> analytic = g->to_vector<double>();
    std::vector<double> x = base[k].to_vector<double>();
    for (size_t i = 0; i < x.size(); ++i) {
      const double h = step * std::max(1.0, std::abs(x[i]));
      auto at = [&](double delta) {
        std::vector<double> xv = x;
        xv[i] += delta;
        std::vector<Tensor> xs = base;
        xs[k] = Tensor::from_vector(xv, base[k].shape());
        return scalar_of(xs);
      };
      // 4-point stencil: error O(h^4).
      const double num = (-at(2 * h) + 8 * at(h) - 8 * at(-h) + at(-2 * h)) / (12 * h);
      const double err = std::abs(num - analytic[i]);
      if (err > tol * std::max(1.0, std::abs(num)))
        return ::testing::AssertionFailure()
               << "input " << k << " element " << i << ": analytic " << analytic[i]
               << " numeric " << num << " (diff " << err << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace taper::testing

namespace taper::testing {
namespace {
std::vector<bool>& table(CaseKind k) {
  static std::vector<bool> f(kNumOps, false), g(kNumOps, false);
  return k == CaseKind::Forward ? f : g;
}
}  // namespace
bool note_cases(CaseKind kind, std::initializer_list<OpId> ops) {
  for (OpId op : ops) table(kind)[static_cast<size_t>(op)] = true;
  return true;
}
const std::vector<bool>& covered(CaseKind kind) { return table(kind); }
}  // namespace taper::testing
