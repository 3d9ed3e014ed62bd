// unary_cases.h: the unary elementwise ops' test cases, shared by the CPU suite
// (test_elementwise.cpp, against the f64 reference) and the CUDA one (test_cuda.cpp, against the
// CPU kernels): each op's input range and attributes, and the bound of each comparison. The two
// files' headers say how their bounds are formed and why each k is what it is.
#pragma once

#include "taper/op.h"

namespace taper::testing {

/// What a bound scales with: Exact, none (bit for bit); Rel, |result|; Affine, |x f0| + |f1| +
/// |result| (cancellation); Gelu, |result| (1 + |2z|) (its sigmoid factor's condition number).
enum class Scale { Exact, Rel, Affine, Gelu };

struct UnarySpec {
  OpId op;
  double lo, hi;  ///< input range
  double f0, f1;  ///< attrs
  Scale scale;    ///< the CPU against the reference
  double k;       ///< that bound in units of the compute type's unit roundoff
  double k_dev;   ///< a device against the CPU, the same units (Gelu or else Rel); 0: bit for bit
};

inline constexpr UnarySpec kUnary[] = {
    {OpId::neg, -2, 2, 0, 0, Scale::Exact, 0, 0},
    {OpId::abs, -2, 2, 0, 0, Scale::Exact, 0, 0},
    {OpId::exp, -10, 10, 0, 0, Scale::Rel, 4, 8},
    {OpId::log, 0.01, 100, 0, 0, Scale::Rel, 4, 8},
    {OpId::sqrt, 0.01, 100, 0, 0, Scale::Exact, 0, 0},
    {OpId::rsqrt, 0.01, 100, 0, 0, Scale::Rel, 3, 4},
    {OpId::recip, -4, 4, 0, 0, Scale::Exact, 0, 0},
    {OpId::sqr, -3, 3, 0, 0, Scale::Exact, 0, 0},
    {OpId::tanh, -6, 6, 0, 0, Scale::Rel, 8, 12},
    {OpId::sigmoid, -20, 20, 0, 0, Scale::Rel, 8, 16},
    {OpId::relu, -2, 2, 0, 0, Scale::Exact, 0, 0},
    {OpId::gelu, -8, 8, 0, 0, Scale::Gelu, 6, 16},
    {OpId::gelu_erf, -9, 9, 0, 0, Scale::Rel, 10, 12},
    {OpId::silu, -20, 20, 0, 0, Scale::Rel, 8, 20},
    {OpId::sin, -10, 10, 0, 0, Scale::Rel, 6, 12},
    {OpId::cos, -10, 10, 0, 0, Scale::Rel, 6, 12},
    {OpId::powf, 0.1, 4, 2.5, 0, Scale::Rel, 4, 8},
    {OpId::affine, -2, 2, 1.7, -0.3, Scale::Affine, 2, 0},  // one fma on both devices
    {OpId::clamp, -2, 2, -0.5, 0.75, Scale::Exact, 0, 0},
};

/// The integer forms (exact: the CPU's wrap and saturation semantics).
struct IntUnarySpec {
  OpId op;
  double f0, f1;
};

inline constexpr IntUnarySpec kIntUnary[] = {
    {OpId::neg, 0, 0},         {OpId::abs, 0, 0},           {OpId::relu, 0, 0},
    {OpId::sqr, 0, 0},         {OpId::affine, 3, -7},       {OpId::affine, -1, 250},
    {OpId::affine, 0.5, 1.25}, {OpId::clamp, 10.5, 200.2}, {OpId::clamp, -5, 1e30},
};

}  // namespace taper::testing
