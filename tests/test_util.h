// test_util.h: shared helpers of the test suite: random inputs, layout variants of the same
// values, tolerances per dtype, closeness checks, and the f64 central-difference gradient check.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "taper/taper.h"
#include "tests/cpu_hooks.h"  // the SIMD-target test hooks

namespace taper::testing {

/// Restores taper's thread count when it goes out of scope, also when an ASSERT returns early.
struct ThreadsGuard {
  size_t saved = num_threads();
  ~ThreadsGuard() { set_num_threads(saved); }
};

/// Runs body(target) once per compiled and supported Highway target (the tests otherwise run on
/// the best one of this CPU), then restores dispatch, also when body fails an ASSERT.
template <class F> void for_each_target(F&& body) {
  struct Restore {
    ~Restore() { cpu::set_simd_target_for_test(0); }
  } restore;
  const std::vector<int64_t> targets = cpu::simd_targets_for_test();
  ASSERT_FALSE(targets.empty());
  for (int64_t t : targets) {
    SCOPED_TRACE(cpu::simd_target_name(t));
    cpu::set_simd_target_for_test(t);
    body(t);
  }
}

/// The message of the taper::Error that f() throws, or "<no error>".
template <class F> std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}
inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

/// Deterministic random CPU tensor, uniform in [lo, hi), rounded to `dt`.
Tensor random_tensor(const Shape& s, DType dt, uint64_t seed, double lo = -2.0, double hi = 2.0);
/// The same values as random_tensor on the CPU, placed on `dev`.
Tensor random_tensor(const Shape& s, DType dt, Device dev, uint64_t seed, double lo = -2.0,
                     double hi = 2.0);

/// The devices the device-parameterised suites run on: the CPU, and every CUDA device present
/// (none in a CPU-only build or on a machine without a GPU).
std::vector<Device> test_devices();

/// Ways to hold the same values with different strides.
enum class LayoutKind { Contiguous, Transposed, Narrowed, Broadcast };
inline const char* layout_name(LayoutKind k) {
  switch (k) {
    case LayoutKind::Contiguous: return "contiguous";
    case LayoutKind::Transposed: return "transposed";
    case LayoutKind::Narrowed: return "narrowed";
    case LayoutKind::Broadcast: return "broadcast";
  }
  return "?";
}
inline constexpr LayoutKind kAllLayouts[] = {LayoutKind::Contiguous, LayoutKind::Transposed,
                                             LayoutKind::Narrowed, LayoutKind::Broadcast};

/// A tensor with the same shape as `t` but a non-contiguous layout of kind `k`:
/// Transposed: a transposed view of a contiguous copy of t transposed (rank >= 2; rank 1 falls
/// back to Narrowed). Narrowed: a narrow of a wider tensor (last dim padded by 3).
/// Broadcast: t's first row broadcast along dim 0 (values differ from t: it is a broadcast of
/// t.narrow(0, 0, 1); t itself when dim 0 is empty). Values equal t's for every kind but
/// Broadcast.
Tensor with_layout(const Tensor& t, LayoutKind k);

/// All elements as double (row-major).
std::vector<double> values(const Tensor& t);

/// The unit roundoff of a float dtype: bf16 2^-8, f16 2^-11, f32 2^-24, f64 2^-53.
double unit_roundoff(DType dt);

/// The unit roundoff of the type a kernel computes `dt` in: f32's for bf16/f16/f32, f64's for f64.
double compute_u(DType dt);

/// The spacing of dtype dt's values in the binade of finite v (subnormal spacing below the
/// normals).
double ulp_at(DType dt, double v);

/// The smallest positive (subnormal) value of dt: one flip of a subnormal result.
double tiny_of(DType dt);

/// Random integers of dt: u8 over [0, 255], u32 over [0, 2^32), i64 over +-2^40 (so that sqr
/// wraps) with small values and the extremes mixed in.
Tensor random_ints(const Shape& s, DType dt, uint64_t seed);

/// n random indices in [0, limit), as i64 (the index suites' operands).
std::vector<int64_t> random_indices(size_t n, size_t limit, uint64_t seed);
/// An index tensor of shape s holding v, in idt (U32 or I64).
Tensor index_tensor(const std::vector<int64_t>& v, const Shape& s, DType idt);
/// Small integers in dt (exact in every dtype and in every sum the scatter tests make).
Tensor small_ints(const Shape& s, DType dt, uint64_t seed);

/// f64 values in +-[0.2, 2], random signs: away from the kinks of abs, relu and friends.
Tensor away_from_zero(const Shape& s, uint64_t seed);

/// s with every character but letters and digits made '_', as GoogleTest wants a case's name.
std::string gtest_name(std::string s);

/// Tensor's method of elementwise op `op` on x (attributes f0, f1 where it takes them), or on a
/// and b; any other op fails the test.
Tensor apply_unary(OpId op, const Tensor& x, double f0, double f1);
Tensor apply_binary(OpId op, const Tensor& a, const Tensor& b);

/// Passes when |got-ref| <= atol + rtol*|ref| elementwise (NaN matches NaN, inf matches inf of the
/// same sign); the message names the first failing index and the worst error.
::testing::AssertionResult all_close(const std::vector<double>& got,
                                     const std::vector<double>& ref, double rtol, double atol);

/// The rounding floor of the fused ops' gradients: |got - ref| <= k u |ref| + slack u max|ref|,
/// within the rounding of the reference to dt (u its unit roundoff), plus an absolute slack far
/// below one ulp of the largest value.
::testing::AssertionResult at_rounding_floor(const std::vector<double>& got,
                                             const std::vector<double>& ref, DType dt,
                                             double k = 1.01, double slack = 1e-2);

/// One case of the f64 central-difference gradient table (test_grad.cpp): f maps the inputs to a
/// tensor on their device (a tensor the case captures is moved there), so the CUDA suite runs the
/// same table again on the GPU.
struct GradCase {
  std::string name;
  OpId op;
  std::function<Tensor(const std::vector<Tensor>&)> f;
  std::vector<Tensor> inputs;  ///< f64, on the CPU
  double tol = 1e-6;
};
/// The table: every differentiable registry entry has a case (the coverage test checks).
const std::vector<GradCase>& grad_cases();

/// One matmul shape of test_matmul_index.cpp's table, which the CUDA suite runs again on the
/// GPU: a and b as stored, a transposed operand storing (.., k, m).
struct MatCase {
  const char* name;
  std::vector<size_t> a, b;
  bool ta = false, tb = false;
};
/// The table: square, skinny, batched and broadcast, transposed, matrix-vector, empty (k = 0, m
/// = 0) and large shapes.
const std::vector<MatCase>& mat_cases();

/// Central-difference gradient check in f64 (4-point stencil): `f` maps the inputs to a tensor;
/// the scalar checked is sum(f(inputs) * r) for a fixed random r. Every input that should get a
/// gradient is made a Var inside. Passes when analytic and numeric agree to `tol` relative.
::testing::AssertionResult grad_check(
    const std::function<Tensor(const std::vector<Tensor>&)>& f, const std::vector<Tensor>& inputs,
    double tol = 1e-6, double step = 1e-4);

}  // namespace taper::testing

namespace taper::testing {
/// Coverage bookkeeping: test files declare, at load time, which ops their forward and gradient
/// cases exercise; the coverage test fails for any registry entry with no case.
enum class CaseKind { Forward, Gradient };
bool note_cases(CaseKind kind, std::initializer_list<OpId> ops);
const std::vector<bool>& covered(CaseKind kind);
}  // namespace taper::testing

#define TAPER_TEST_CAT2(a, b) a##b
#define TAPER_TEST_CAT(a, b) TAPER_TEST_CAT2(a, b)
/// Declares that this file's tests cover the forward (kind Forward) or gradient of these ops.
#define TAPER_COVERS(kind, ...)                                                       \
  static const bool TAPER_TEST_CAT(taper_covers_, __LINE__) = ::taper::testing::note_cases( \
      ::taper::testing::CaseKind::kind, {__VA_ARGS__})
