// test_reduce.cpp: the CPU reduce family (sum, max, min, argmax, argmin) against the f64 references
// of tests/ref/reduce_ref.h: every dim subset of rank-3 tensors, keepdim both ways, every float
// dtype plus i64/u32, sizes 1, 7, 33 and >= 1000, four layouts; the accuracy of a 10^7 element f32
// sum; ties, NaN and -inf rows; independence from the thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "tests/ref/reduce_ref.h"
#include "tests/test_util.h"

namespace taper::testing {
namespace {

TAPER_COVERS(Forward, OpId::sum, OpId::max, OpId::min, OpId::argmax, OpId::argmin);

const std::vector<std::vector<size_t>> kShapes = {{1, 1, 1},    {7, 33, 1},    {3, 7, 33},
                                                  {2, 1031, 3}, {33, 2, 1013}, {1, 1, 1200}};

/// Random input of `dt`: floats in [-2, 2); i64 in (-1000, 1000); u32 up to 4e9 (so that sums
/// wrap around 2^32).
Tensor make_input(const Shape& s, DType dt, uint64_t seed) {
  switch (dt) {
    case DType::I64:
      return random_tensor(s, DType::F64, seed, -1000.0, 1000.0).to_dtype(dt);
    case DType::U32:
      return random_tensor(s, DType::U32, seed, 0.0, 4.0e9);
    default:
      return random_tensor(s, dt, seed);
  }
}

/// Every non-empty subset of {0, 1, 2}, sorted.
std::vector<std::vector<int64_t>> dim_subsets() {
  std::vector<std::vector<int64_t>> out;
  for (int mask = 1; mask < 8; ++mask) {
    std::vector<int64_t> s;
    for (int64_t d = 0; d < 3; ++d)
      if (mask & (1 << d)) s.push_back(d);
    out.push_back(s);
  }
  return out;
}

std::string dims_str(const std::vector<int64_t>& v) {
  std::string s = "{";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "}";
}

/// The rounding of the compute type a sum of `dt` accumulates in.
double accum_roundoff(DType dt) {
  return dt == DType::F64 ? unit_roundoff(DType::F64) : unit_roundoff(DType::F32);
}

using Param = std::tuple<DType, LayoutKind>;

class ReduceTest : public ::testing::TestWithParam<Param> {};

TEST_P(ReduceTest, SumMaxMinMatchReferenceOverEveryDimSubset) {
  const auto [dt, layout] = GetParam();
  uint64_t seed = 100;
  for (const auto& dims : kShapes) {
    const Tensor base = make_input(Shape(dims), dt, ++seed);
    const Tensor x = with_layout(base, layout);
    const std::vector<double> xv = values(x);
    std::vector<double> xabs(xv.size());
    for (size_t i = 0; i < xv.size(); ++i) xabs[i] = std::abs(xv[i]);
    for (const auto& rd : dim_subsets()) {
      size_t n_red = 1;
      for (int64_t d : rd) n_red *= dims[static_cast<size_t>(d)];
      for (bool keep : {false, true}) {
        SCOPED_TRACE(Shape(dims).to_string() + " dims " + dims_str(rd) + (keep ? " keepdim" : "") +
                     " " + std::string(dtype_name(dt)) + " " + layout_name(layout));
        const std::vector<size_t> want_dims = ref::reduce_dims(dims, rd, keep);
        // sum: rounded once to dt from an f32 (f64) accumulation whose error is at most
        // ~n * u_acc * sum|x| in any order; a half-precision accumulator would miss this.
        {
          const Tensor s = x.sum(rd, keep);
          ASSERT_EQ(s.dims(), want_dims);
          ASSERT_EQ(s.dtype(), dt);
          const std::vector<double> got = values(s);
          const std::vector<double> want = ref::reduce(xv, dims, rd, ref::ReduceOp::Sum);
          if (is_float(dt)) {
            const std::vector<double> scale = ref::reduce(xabs, dims, rd, ref::ReduceOp::Sum);
            const double u = unit_roundoff(dt);
            const double ua = accum_roundoff(dt) * static_cast<double>(n_red + 4);
            for (size_t i = 0; i < got.size(); ++i)
              ASSERT_LE(std::abs(got[i] - want[i]), u * std::abs(want[i]) + ua * scale[i])
                  << "element " << i << " got " << got[i] << " want " << want[i];
          } else {
            std::vector<double> w = want;
            if (dt == DType::U32)
              for (double& v : w) v = std::fmod(v, 4294967296.0);  // wraps in u32
            EXPECT_EQ(got, w);
          }
        }
        if (n_red == 0) continue;
        for (auto [op, rop] :
             {std::pair{0, ref::ReduceOp::Max}, std::pair{1, ref::ReduceOp::Min}}) {
          const Tensor m = op == 0 ? x.max(rd, keep) : x.min(rd, keep);
          ASSERT_EQ(m.dims(), want_dims);
          EXPECT_EQ(values(m), ref::reduce(xv, dims, rd, rop)) << (op == 0 ? "max" : "min");
        }
      }
    }
  }
}

TEST_P(ReduceTest, ArgMaxArgMinFirstIndexWithTies) {
  const auto [dt, layout] = GetParam();
  uint64_t seed = 300;
  for (const auto& dims : kShapes) {
    // Few distinct values, so most rows have ties: the first index must win.
    Tensor base = is_float(dt) ? random_tensor(Shape(dims), DType::F64, ++seed, 0.0, 4.0)
                                     .to_dtype(DType::I64)
                                     .to_dtype(dt)
                               : random_tensor(Shape(dims), dt, ++seed, 0.0, 4.0);
    const Tensor x = with_layout(base, layout);
    const std::vector<double> xv = values(x);
    for (int64_t d = 0; d < 3; ++d) {
      for (bool keep : {false, true}) {
        SCOPED_TRACE(Shape(dims).to_string() + " dim " + std::to_string(d) +
                     (keep ? " keepdim " : " ") + std::string(dtype_name(dt)) + " " +
                     layout_name(layout));
        const Tensor amax = x.argmax(d, keep), amin = x.argmin(d, keep);
        EXPECT_EQ(amax.dtype(), DType::I64);
        EXPECT_EQ(amax.dims(), ref::reduce_dims(dims, {d}, keep));
        EXPECT_EQ(values(amax), ref::reduce(xv, dims, {d}, ref::ReduceOp::ArgMax));
        EXPECT_EQ(values(amin), ref::reduce(xv, dims, {d}, ref::ReduceOp::ArgMin));
      }
    }
  }
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  return std::string(dtype_name(std::get<0>(info.param))) + "_" +
         layout_name(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(AllDTypesLayouts, ReduceTest,
                         ::testing::Combine(::testing::Values(DType::BF16, DType::F16, DType::F32,
                                                              DType::F64, DType::I64, DType::U32),
                                            ::testing::ValuesIn(kAllLayouts)),
                         param_name);

// ---- accuracy
// ------------------------------------------------------------------------------------

/// Kahan-compensated f64 sum of an f32 tensor's values.
double kahan(const std::vector<float>& v) {
  double s = 0.0, c = 0.0;
  for (float f : v) {
    const double y = static_cast<double>(f) - c;
    const double t = s + y;
    c = (t - s) - y;
    s = t;
  }
  return s;
}

TEST(ReduceAccuracy, SumOfTenMillionF32IsWithin1e6Relative) {
  const size_t n = 10'000'000;
  const Tensor x = Tensor::rand(Shape({n}), DType::F32, Device::cpu(), 7);
  const double want = kahan(x.to_vector<float>());
  const double got = x.sum_all().item();
  EXPECT_LT(std::abs(got - want) / want, 1e-6) << "got " << got << " want " << want;
  // Blocked accumulation leaves about the final f32 rounding (2^-24); one f32 accumulator per
  // lane over the whole row (no blocks) measures ~4e-7 here.
  const double tight = 2.0 * unit_roundoff(DType::F32);
  EXPECT_LT(std::abs(got - want) / want, tight) << "got " << got << " want " << want;
  // The same values as rows of (2, n/2) and columns of (n/4, 4).
  const std::vector<float> xv = x.to_vector<float>();
  const std::vector<double> rows = values(x.reshape({2, n / 2}).sum({1}));
  const std::vector<double> cols = values(x.reshape({n / 4, 4}).sum({0}));
  for (size_t r = 0; r < 2; ++r) {
    const double w =
        kahan(std::vector<float>(xv.begin() + r * n / 2, xv.begin() + (r + 1) * n / 2));
    EXPECT_LT(std::abs(rows[r] - w) / w, tight) << "row " << r;
  }
  for (size_t c = 0; c < 4; ++c) {
    std::vector<float> col;
    for (size_t i = c; i < n; i += 4) col.push_back(xv[i]);
    const double w = kahan(col);
    EXPECT_LT(std::abs(cols[c] - w) / w, tight) << "column " << c;
  }
}

TEST(ReduceAccuracy, HalfSumsAccumulateInF32) {
  // 300 ones: a bf16 accumulator stalls at 256 (257 is not a bf16); f32 gives 300, a bf16.
  const Tensor x = Tensor::ones(Shape({300}), DType::BF16);
  EXPECT_EQ(x.sum_all().item(), 300.0);
  const Tensor y = Tensor::ones(Shape({300, 2}), DType::BF16);
  EXPECT_EQ(values(y.sum({0})), (std::vector<double>{300.0, 300.0}));
  // 3000 x f16(0.1): an f16 accumulator (ulp 0.25 above 256) would be far off.
  const Tensor h = Tensor::full(Shape({3000}), 0.1, DType::F16);
  const double want = 3000.0 * static_cast<double>(static_cast<float>(f16(0.1f)));
  EXPECT_NEAR(h.sum_all().item(), want, want * unit_roundoff(DType::F16));
}

TEST(ReduceAccuracy, ResultDoesNotDependOnThreadCount) {
  const Tensor x = Tensor::randn(Shape({2, 300'000}), DType::F32, Device::cpu(), 11);
  ThreadsGuard guard;
  set_num_threads(1);
  const std::vector<double> one = values(x.sum({1}));
  const std::vector<double> one_max = values(x.argmax(1));
  set_num_threads(4);
  const std::vector<double> four = values(x.sum({1}));
  const std::vector<double> four_max = values(x.argmax(1));
  EXPECT_EQ(one, four);
  EXPECT_EQ(one_max, four_max);
}

// ---- special values --------------------------------------------------------------------------

TEST(ReduceSpecial, NaNPropagatesAndIsTheArgExtreme) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dt : {DType::BF16, DType::F16, DType::F32, DType::F64}) {
    SCOPED_TRACE(dtype_name(dt));
    for (size_t n : {size_t{5}, size_t{33}, size_t{1000}, size_t{9000}}) {
      std::vector<double> v(n);
      for (size_t i = 0; i < n; ++i) v[i] = std::sin(static_cast<double>(i));
      v[n / 2] = nan;
      v[n - 1] = nan;
      const Tensor x = Tensor::from_vector(v, Shape({1, n})).to_dtype(dt);
      EXPECT_TRUE(std::isnan(x.max({1}).item()));
      EXPECT_TRUE(std::isnan(x.min({1}).item()));
      EXPECT_TRUE(std::isnan(x.sum({1}).item()));
      EXPECT_EQ(x.argmax(1).item(), static_cast<double>(n / 2));
      EXPECT_EQ(x.argmin(1).item(), static_cast<double>(n / 2));
      // Columns: (n, 3) with the NaNs in column 1 only.
      std::vector<double> c(n * 3);
      for (size_t i = 0; i < n; ++i) {
        c[i * 3] = v[i] == v[i] ? v[i] : 0.5;
        c[i * 3 + 1] = v[i];
        c[i * 3 + 2] = -c[i * 3];
      }
      const Tensor y = Tensor::from_vector(c, Shape({n, 3})).to_dtype(dt);
      const std::vector<double> mx = values(y.max({0}));
      EXPECT_FALSE(std::isnan(mx[0]));
      EXPECT_TRUE(std::isnan(mx[1]));
      EXPECT_FALSE(std::isnan(mx[2]));
      EXPECT_EQ(values(y.argmax(0))[1], static_cast<double>(n / 2));
      EXPECT_EQ(values(y.argmin(0))[1], static_cast<double>(n / 2));
    }
  }
}

TEST(ReduceSpecial, MaxMinOfInfinityRows) {
  const double inf = std::numeric_limits<double>::infinity();
  for (DType dt : {DType::BF16, DType::F16, DType::F32, DType::F64}) {
    SCOPED_TRACE(dtype_name(dt));
    for (size_t n : {size_t{1}, size_t{7}, size_t{33}, size_t{1500}}) {
      // Row 0 all -inf, row 1 all +inf, row 2 -inf with one finite value at the end.
      std::vector<double> v(3 * n, -inf);
      for (size_t i = 0; i < n; ++i) v[n + i] = inf;
      v[3 * n - 1] = -3.0;
      const Tensor x = Tensor::from_vector(v, Shape({3, n})).to_dtype(dt);
      EXPECT_EQ(values(x.max({1})), (std::vector<double>{-inf, inf, -3.0}));
      EXPECT_EQ(values(x.min({1})), (std::vector<double>{-inf, inf, n == 1 ? -3.0 : -inf}));
      EXPECT_EQ(values(x.argmax(1)), (std::vector<double>{0, 0, static_cast<double>(n - 1)}));
      EXPECT_EQ(values(x.argmin(1)), (std::vector<double>{0, 0, 0}));
      // The same as columns.
      const Tensor xt = x.t().contiguous();
      EXPECT_EQ(values(xt.max({0})), (std::vector<double>{-inf, inf, -3.0}));
      EXPECT_EQ(values(xt.argmax(0)), (std::vector<double>{0, 0, static_cast<double>(n - 1)}));
    }
  }
}

TEST(ReduceSpecial, IntegerSumsWrapInTheDtypeWidth) {
  const Tensor u =
      Tensor::from_vector(std::vector<uint32_t>{0x80000000u, 0x80000001u, 5u}, Shape({3}));
  EXPECT_EQ(u.sum({0}).to_vector<uint32_t>(), (std::vector<uint32_t>{6u}));
  const int64_t big = std::numeric_limits<int64_t>::max();
  const Tensor i = Tensor::from_vector(std::vector<int64_t>{big, 2, -5}, Shape({3}));
  // max + 2 wraps to min + 1; minus 5 wraps back to max - 3.
  EXPECT_EQ(i.sum({0}).to_vector<int64_t>(), (std::vector<int64_t>{big - 3}));
  EXPECT_EQ(i.max({0}).to_vector<int64_t>(), (std::vector<int64_t>{big}));
  EXPECT_EQ(i.min({0}).to_vector<int64_t>(), (std::vector<int64_t>{-5}));
}

TEST(ReduceSpecial, EmptyAndRankZero) {
  const Tensor e = Tensor::zeros(Shape({3, 0}), DType::F32);
  EXPECT_EQ(values(e.sum({1})), (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(e.sum({0}).dims(), (std::vector<size_t>{0}));
  EXPECT_THROW(e.max({1}), Error);
  const Tensor s = Tensor::full(Shape({}), 2.5, DType::F64);
  EXPECT_EQ(s.sum_all().item(), 2.5);
}

TEST(ReduceSpecial, LongRowsSplitAcrossThreadsMatchTheReference) {
  // Fewer rows than threads and long rows take the per-block path; check it against the
  // reference for every op, with the extreme in the last block.
  for (DType dt : {DType::BF16, DType::F32, DType::F64}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = random_tensor(Shape({1, 50'001}), dt, 5);
    std::vector<double> xv = values(x);
    xv[50'000] = 3.0;
    xv[20'000] = -3.0;
    xv[40'000] = 3.0;
    x = Tensor::from_vector(xv, Shape({1, 50'001})).to_dtype(dt);
    const std::vector<size_t> dims{1, 50'001};
    EXPECT_EQ(x.argmax(1).item(), 40'000.0);
    EXPECT_EQ(x.argmin(1).item(), 20'000.0);
    EXPECT_EQ(x.max({1}).item(), 3.0);
    EXPECT_EQ(x.min({1}).item(), -3.0);
    double scale = 0.0;
    for (double v : xv) scale += std::abs(v);
    const double want = ref::reduce(xv, dims, {1}, ref::ReduceOp::Sum)[0];
    EXPECT_NEAR(x.sum({1}).item(), want,
                unit_roundoff(dt) * std::abs(want) + 64 * accum_roundoff(dt) * scale);
  }
}

}  // namespace
}  // namespace taper::testing
