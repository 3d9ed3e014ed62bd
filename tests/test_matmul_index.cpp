// test_matmul_index.cpp: the CPU matmul (OpenBLAS) and index family (index_select, gather,
// scatter_add, cat, narrow_bwd) against the f64 references of tests/ref/reduce_ref.h: every float
// dtype for matmul (transposed views, broadcast batches, four layouts), every dtype for the index
// ops, and out-of-range indices, which throw taper::Error naming the op before anything is written.
#include <gtest/gtest.h>

#include <array>

#include <random>
#include <string>
#include <vector>

#include "taper/composed.h"
#include "taper/ops.h"
#include "tests/ref/reduce_ref.h"
#include "tests/test_util.h"

namespace taper::testing {
namespace {

TAPER_COVERS(Forward, OpId::matmul, OpId::linear, OpId::index_select, OpId::gather,
             OpId::scatter_add, OpId::cat, OpId::narrow_bwd);

}  // namespace

// ---- matmul -----------------------------------------------------------------------------------

/// The shapes of this file's matmul suite, run again on the GPU by test_cuda.cpp's.
const std::vector<MatCase>& mat_cases() {
  static const std::vector<MatCase> cases = {
      {"1x1x1", {1, 1}, {1, 1}},
      {"7x33x5", {7, 33}, {33, 5}},
      {"64x1000x3", {64, 1000}, {1000, 3}},
      {"batch_broadcast", {2, 1, 5, 7}, {3, 7, 4}},
      {"a_t", {33, 7}, {33, 5}, true, false},
      {"b_t", {7, 33}, {5, 33}, false, true},
      {"both_t_batched", {3, 9, 6}, {3, 4, 9}, true, true},
      {"b_shared_folds", {4, 5, 8}, {8, 3}},
      {"a_broadcast", {1, 5, 8}, {4, 8, 3}},
      {"row_vector", {2, 1, 40}, {2, 40, 1}},
      // matrix-vector products (GEMV), every transposition of the stored operands
      {"matvec", {300, 257}, {257, 1}},
      {"matvec_a_t", {257, 300}, {257, 1}, true, false},
      {"matvec_b_t", {300, 257}, {1, 257}, false, true},
      {"matvec_folds", {4, 50, 33}, {33, 1}},
      {"vecmat", {1, 257}, {257, 300}},
      {"vecmat_a_t", {257, 1}, {257, 300}, true, false},
      {"vecmat_b_t", {1, 257}, {300, 257}, false, true},
      {"vecmat_both_t", {257, 1}, {300, 257}, true, true},
      // empty: no products (zeros), no rows
      {"k0", {3, 0}, {0, 2}},
      {"k0_batched", {2, 4, 0}, {2, 0, 5}},
      {"m0", {0, 7}, {7, 3}},
      {"large", {257, 1031}, {1031, 129}},
      {"large_batched_t", {4, 256, 128}, {4, 96, 256}, true, true},
  };
  return cases;
}

namespace {

/// Batch dims, m, k, n of a x b (NumPy broadcast of the batch dims).
struct MatDims {
  std::vector<size_t> batch;
  size_t m, k, n;
};

MatDims mat_dims(const Tensor& a, const Tensor& b) {
  MatDims d;
  d.m = a.dim(-2);
  d.k = a.dim(-1);
  d.n = b.dim(-1);
  std::vector<size_t> ba(a.dims().begin(), a.dims().end() - 2);
  std::vector<size_t> bb(b.dims().begin(), b.dims().end() - 2);
  const size_t r = std::max(ba.size(), bb.size());
  ba.insert(ba.begin(), r - ba.size(), 1);
  bb.insert(bb.begin(), r - bb.size(), 1);
  for (size_t i = 0; i < r; ++i) d.batch.push_back(std::max(ba[i], bb[i]));
  return d;
}

using MatParam = std::tuple<DType, LayoutKind>;
class MatmulTest : public ::testing::TestWithParam<MatParam> {};

TEST_P(MatmulTest, MatchesF64Reference) {
  const auto [dt, layout] = GetParam();
  uint64_t seed = 500;
  for (const MatCase& c : mat_cases()) {
    SCOPED_TRACE(std::string(c.name) + " " + std::string(dtype_name(dt)) + " " +
                 layout_name(layout));
    Tensor a = with_layout(random_tensor(Shape(c.a), dt, ++seed), layout);
    Tensor b = with_layout(random_tensor(Shape(c.b), dt, ++seed), layout);
    if (c.ta) a = a.t();
    if (c.tb) b = b.t();
    const Tensor out = a.matmul(b);
    const MatDims d = mat_dims(a, b);
    std::vector<size_t> want_dims = d.batch;
    want_dims.push_back(d.m);
    want_dims.push_back(d.n);
    ASSERT_EQ(out.dims(), want_dims);
    ASSERT_EQ(out.dtype(), dt);
    ASSERT_TRUE(out.is_contiguous());
    std::vector<size_t> sa = d.batch, sb = d.batch;
    sa.insert(sa.end(), {d.m, d.k});
    sb.insert(sb.end(), {d.k, d.n});
    size_t batch = 1;
    for (size_t x : d.batch) batch *= x;
    std::vector<double> scale;
    const std::vector<double> want =
        ref::matmul(values(a.broadcast_as(Shape(sa))), values(b.broadcast_as(Shape(sb))), batch,
                    d.m, d.k, d.n, &scale);
    const std::vector<double> got = values(out);
    // |error| <= gamma_k |a||b| for the GEMM in f32 (f64); the half types add one rounding.
    const double ug = unit_roundoff(dt == DType::F64 ? DType::F64 : DType::F32);
    const double gamma = 2.0 * static_cast<double>(d.k) * ug;
    const double uo = is_half(dt) ? unit_roundoff(dt) : 0.0;
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_LE(std::abs(got[i] - want[i]), uo * std::abs(want[i]) + 2.0 * gamma * scale[i])
          << "element " << i << " got " << got[i] << " want " << want[i];
    // The half types are the f32 GEMM of the widened inputs, rounded once (same BLAS call when
    // both operands are plain dense matrices).
    if (is_half(dt) && layout == LayoutKind::Contiguous && !c.ta && !c.tb && c.a.size() == 2) {
      const Tensor r32 = a.to_dtype(DType::F32).matmul(b.to_dtype(DType::F32)).to_dtype(dt);
      EXPECT_EQ(got, values(r32));
    }
  }
}

std::string mat_param_name(const ::testing::TestParamInfo<MatParam>& info) {
  return std::string(dtype_name(std::get<0>(info.param))) + "_" +
         layout_name(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(FloatDTypesLayouts, MatmulTest,
                         ::testing::Combine(::testing::Values(DType::BF16, DType::F16, DType::F32,
                                                              DType::F64),
                                            ::testing::ValuesIn(kAllLayouts)),
                         mat_param_name);

// Matrix-vector products run on taper's pool (cpu/matmul.cpp's GEMV): the result must not
// depend on the thread count (the fine-tuning run is bit-identical whatever the threads).
TEST(Matmul, VectorProductsDoNotDependOnThreadCount) {
  ThreadsGuard guard;
  const Tensor a = random_tensor(Shape({3001, 517}), DType::F32, 900);
  const Tensor v = random_tensor(Shape({3001, 1}), DType::F32, 901);
  const Tensor u = random_tensor(Shape({517, 1}), DType::F32, 902);
  std::vector<std::vector<double>> got;
  for (size_t threads : {1, 2, 3, 8}) {
    set_num_threads(threads);
    const std::vector<double> col = values(a.matmul(u));     // rows dotted with u
    const std::vector<double> row = values(v.t().matmul(a));  // stored rows scaled and summed
    const std::vector<double> tcol = values(a.t().matmul(v));  // the same through a transpose
    std::vector<double> all = col;
    all.insert(all.end(), row.begin(), row.end());
    all.insert(all.end(), tcol.begin(), tcol.end());
    got.push_back(all);
  }
  for (size_t i = 1; i < got.size(); ++i) EXPECT_EQ(got[i], got[0]) << "thread count #" << i;
}

// Matrix products (cpu/matmul.cpp: a fixed grid of tiles, each one single-threaded BLAS call)
// are bit-identical for 1 to 8 threads, in f32 and f64, with either operand transposed, on one
// tile and on many (OpenBLAS's own threads split by the count: 859 of 8192 elements of the
// (64, 256) x (256, 128) f32 product differed between 3 and 4 threads).
TEST(Matmul, ProductsDoNotDependOnThreadCount) {
  ThreadsGuard guard;
  for (DType dt : {DType::F32, DType::F64})
    for (const auto& [m, k, n] : {std::array<size_t, 3>{64, 256, 128}, {300, 700, 1100}}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + std::to_string(m) + "x" +
                   std::to_string(k) + "x" + std::to_string(n));
      const Tensor a = random_tensor(Shape({m, k}), dt, 910);
      const Tensor b = random_tensor(Shape({k, n}), dt, 911);
      const Tensor at = random_tensor(Shape({k, m}), dt, 912).t();
      const Tensor bt = random_tensor(Shape({n, k}), dt, 913).t();
      std::vector<std::vector<double>> got;
      for (size_t threads = 1; threads <= 8; ++threads) {
        set_num_threads(threads);
        std::vector<double> all = values(a.matmul(b));
        for (const std::vector<double>& v : {values(at.matmul(b)), values(a.matmul(bt))})
          all.insert(all.end(), v.begin(), v.end());
        got.push_back(all);
      }
      for (size_t i = 1; i < got.size(); ++i)
        EXPECT_EQ(got[i], got[0]) << (i + 1) << " threads against 1";
    }
}

TEST(Matmul, EmptyInnerDimGivesZeros) {
  const Tensor a = Tensor::zeros(Shape({3, 0}), DType::F32);
  const Tensor b = Tensor::zeros(Shape({0, 2}), DType::F32);
  EXPECT_EQ(values(a.matmul(b)), std::vector<double>(6, 0.0));
}

// ---- linear: x w^T + b, the bias added before the one rounding -----------------------------------

// f32 and f64 give matmul-then-add's bits (the same GEMM, then the same add); bf16 and f16 give
// the f32 computation on the widened inputs rounded once, where matmul-then-add rounds twice.
// Leading dims fold into the rows; a strided x and an absent bias are served too.
TEST(Linear, MatchesTheProductPlusBiasRoundedOnce) {
  for (DType dt : {DType::BF16, DType::F16, DType::F32, DType::F64}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = random_tensor({2, 7, 5}, dt, 1), w = random_tensor({3, 5}, dt, 2);
    const Tensor b = random_tensor({3}, dt, 3);
    const DType c = stat_dtype(dt);
    const Tensor want = (x.to_dtype(c).matmul(w.to_dtype(c).t()) + b.to_dtype(c)).to_dtype(dt);
    const Tensor y = ops::linear(x, w, b);
    EXPECT_EQ(y.shape(), Shape({2, 7, 3}));
    EXPECT_EQ(values(y), values(want));
    if (!is_half(dt)) {
      EXPECT_EQ(values(y), values(x.matmul(w.t()) + b));
    }
    EXPECT_EQ(values(ops::linear(x, w, Tensor())), values(x.matmul(w.t())));
    const Tensor xt = random_tensor({5, 7}, dt, 4).t();  // (7, 5), columns dense
    EXPECT_EQ(values(ops::linear(xt, w, b)), values(ops::linear(xt.contiguous(), w, b)));
  }
  // The half types' one rounding is not the composed form's two: some element differs.
  const Tensor x = random_tensor({64, 32}, DType::BF16, 5), w = random_tensor({48, 32}, DType::BF16, 6);
  const Tensor b = random_tensor({48}, DType::BF16, 7, -50.0, 50.0);
  EXPECT_NE(values(ops::linear(x, w, b)), values(composed::linear(x, w, b)));
}

TEST(Linear, EmptyInnerDimGivesTheBias) {
  const Tensor x = Tensor::zeros(Shape({3, 0}), DType::F32), w = Tensor::zeros(Shape({2, 0}), DType::F32);
  const Tensor b = Tensor::from_vector(std::vector<float>{1.5f, -2.0f}, {2});
  EXPECT_EQ(values(ops::linear(x, w, b)), (std::vector<double>{1.5, -2.0, 1.5, -2.0, 1.5, -2.0}));
  EXPECT_EQ(values(ops::linear(x, w, Tensor())), std::vector<double>(6, 0.0));
}

TEST(Linear, BadInputIsAnErrorNamingTheOpShapesAndDtypes) {
  const Tensor x = random_tensor({4, 5}, DType::F32, 1), w = random_tensor({3, 5}, DType::F32, 2);
  std::string e = error_of([&] { ops::linear(x, random_tensor({3, 4}, DType::F32, 3), Tensor()); });
  EXPECT_TRUE(contains(e, "linear") && contains(e, "(4, 5)") && contains(e, "(3, 4)")) << e;
  e = error_of([&] { ops::linear(x, w, random_tensor({4}, DType::F32, 4)); });
  EXPECT_TRUE(contains(e, "linear") && contains(e, "bias") && contains(e, "(4)")) << e;
  e = error_of([&] { ops::linear(x, w.to_dtype(DType::F64), Tensor()); });
  EXPECT_TRUE(contains(e, "linear") && contains(e, "f64") && contains(e, "f32")) << e;
  e = error_of([&] { ops::linear(x, w, random_tensor({3}, DType::BF16, 5)); });
  EXPECT_TRUE(contains(e, "linear") && contains(e, "bf16")) << e;
  e = error_of([&] { ops::linear(x.to_dtype(DType::I64), w.to_dtype(DType::I64), Tensor()); });
  EXPECT_TRUE(contains(e, "linear") && contains(e, "i64")) << e;
}

// ---- index ops ----------------------------------------------------------------------------------

/// Values in [-100, 100) for floats (rounded to dt), [0, 100) for the integers.
Tensor data(const Shape& s, DType dt, uint64_t seed) {
  return random_tensor(s, dt, seed, -100.0, 100.0);
}

class IndexTest : public ::testing::TestWithParam<DType> {};

TEST_P(IndexTest, IndexSelect) {
  const DType dt = GetParam();
  uint64_t seed = 700;
  const std::vector<std::pair<std::vector<size_t>, size_t>> cases = {
      {{5, 7, 33}, 11}, {{1031, 7}, 1200}, {{1, 1}, 3}, {{7, 1}, 1}};
  for (const auto& [dims, len] : cases)
    for (size_t d = 0; d < dims.size(); ++d)
      for (DType idt : {DType::I64, DType::U32})
        for (LayoutKind lk : kAllLayouts) {
          SCOPED_TRACE(Shape(dims).to_string() + " dim " + std::to_string(d) + " " +
                       std::string(dtype_name(dt)) + " idx " + std::string(dtype_name(idt)) + " " +
                       layout_name(lk));
          const Tensor x = with_layout(data(Shape(dims), dt, ++seed), lk);
          const std::vector<int64_t> iv = random_indices(len, dims[d], ++seed);
          const Tensor out =
              x.index_select(index_tensor(iv, Shape({len}), idt), static_cast<int64_t>(d));
          std::vector<size_t> od = dims;
          od[d] = len;
          ASSERT_EQ(out.dims(), od);
          ASSERT_EQ(out.dtype(), dt);
          EXPECT_EQ(values(out), ref::index_select(values(x), dims, iv, d));
        }
  // A strided index vector (every other element of a longer one).
  const Tensor x = data(Shape({9, 4}), dt, 1);
  const std::vector<int64_t> wide = random_indices(10, 9, 2);
  const Tensor idx = Tensor::from_vector(wide, Shape({5, 2})).narrow(1, 0, 1).squeeze(1);
  ASSERT_FALSE(idx.is_contiguous());
  EXPECT_EQ(values(x.index_select(idx, 0)),
            ref::index_select(values(x), {9, 4}, {wide[0], wide[2], wide[4], wide[6], wide[8]}, 0));
}

TEST_P(IndexTest, Gather) {
  const DType dt = GetParam();
  uint64_t seed = 900;
  const std::vector<size_t> dims = {4, 9, 6};
  for (size_t d = 0; d < 3; ++d)
    for (size_t j : {size_t{1}, size_t{5}, size_t{13}})
      for (LayoutKind lk : kAllLayouts) {
        SCOPED_TRACE("dim " + std::to_string(d) + " J " + std::to_string(j) + " " +
                     std::string(dtype_name(dt)) + " " + layout_name(lk));
        const Tensor x = with_layout(data(Shape(dims), dt, ++seed), lk);
        std::vector<size_t> idims = dims;
        idims[d] = j;
        const std::vector<int64_t> iv = random_indices(ref::elem_count(idims), dims[d], ++seed);
        const DType idt = (seed & 1) ? DType::I64 : DType::U32;
        const Tensor idx = with_layout(index_tensor(iv, Shape(idims), idt), lk);
        const Tensor out = x.gather(idx, static_cast<int64_t>(d));
        ASSERT_EQ(out.dims(), idims);
        // The reference reads the index through values(), so a Broadcast layout's values count.
        std::vector<int64_t> ivv;
        for (double v : values(idx)) ivv.push_back(static_cast<int64_t>(v));
        EXPECT_EQ(values(out), ref::gather(values(x), dims, ivv, idims, d));
      }
  // A long dim (>= 1000).
  const Tensor x = data(Shape({3, 1100}), dt, 5);
  const std::vector<int64_t> iv = random_indices(3 * 1500, 1100, 6);
  const Tensor out = x.gather(index_tensor(iv, Shape({3, 1500}), DType::I64), 1);
  EXPECT_EQ(values(out), ref::gather(values(x), {3, 1100}, iv, {3, 1500}, 1));
}

TEST_P(IndexTest, ScatterAdd) {
  const DType dt = GetParam();
  uint64_t seed = 1100;
  const std::vector<size_t> dims = {4, 9, 6};
  for (size_t d = 0; d < 3; ++d)
    for (size_t j : {size_t{1}, size_t{5}, size_t{13}})
      for (LayoutKind lk : kAllLayouts) {
        SCOPED_TRACE("dim " + std::to_string(d) + " J " + std::to_string(j) + " " +
                     std::string(dtype_name(dt)) + " " + layout_name(lk));
        const Tensor x = with_layout(small_ints(Shape(dims), dt, ++seed), lk);
        std::vector<size_t> idims = dims;
        idims[d] = j;
        const std::vector<int64_t> iv = random_indices(ref::elem_count(idims), dims[d], ++seed);
        const DType idt = (seed & 1) ? DType::I64 : DType::U32;
        const Tensor idx = index_tensor(iv, Shape(idims), idt);
        const Tensor src = with_layout(small_ints(Shape(idims), dt, ++seed), lk);
        const Tensor out = x.scatter_add(idx, src, static_cast<int64_t>(d));
        ASSERT_EQ(out.dims(), dims);
        EXPECT_EQ(values(out), ref::scatter_add(values(x), dims, iv, idims, values(src), d));
      }
  // The input is not modified (the output is a copy).
  const Tensor x = small_ints(Shape({3, 4}), dt, 1);
  const std::vector<double> before = values(x);
  (void)x.scatter_add(index_tensor({0, 1, 2, 3, 3, 2, 1, 0, 1, 1, 1, 1}, Shape({3, 4}), DType::I64),
                      small_ints(Shape({3, 4}), dt, 2), 1);
  EXPECT_EQ(values(x), before);
}

TEST_P(IndexTest, Cat) {
  const DType dt = GetParam();
  uint64_t seed = 1300;
  for (size_t d = 0; d < 3; ++d)
    for (LayoutKind lk : kAllLayouts) {
      SCOPED_TRACE("dim " + std::to_string(d) + " " + std::string(dtype_name(dt)) + " " +
                   layout_name(lk));
      std::vector<std::vector<size_t>> dims = {{2, 3, 4}, {2, 3, 4}, {2, 3, 4}};
      dims[0][d] = 1;
      dims[1][d] = 7;
      dims[2][d] = 33;
      std::vector<Tensor> ts;
      std::vector<std::vector<double>> vs;
      for (size_t i = 0; i < 3; ++i) {
        // Mix layouts: the middle tensor stays contiguous (the memcpy path).
        ts.push_back(
            with_layout(data(Shape(dims[i]), dt, ++seed), i == 1 ? LayoutKind::Contiguous : lk));
        vs.push_back(values(ts.back()));
      }
      const Tensor out = Tensor::cat(ts, static_cast<int64_t>(d));
      std::vector<size_t> od = dims[0];
      od[d] = 1 + 7 + 33;
      ASSERT_EQ(out.dims(), od);
      EXPECT_EQ(values(out), ref::cat(vs, dims, d));
    }
  const Tensor a = data(Shape({1000, 3}), dt, 1), b = data(Shape({1200, 3}), dt, 2);
  EXPECT_EQ(values(Tensor::cat({a, b}, 0)),
            ref::cat({values(a), values(b)}, {{1000, 3}, {1200, 3}}, 0));
}

TEST_P(IndexTest, NarrowBwd) {
  const DType dt = GetParam();
  uint64_t seed = 1500;
  const std::vector<size_t> gdims = {3, 5, 7};
  for (size_t d = 0; d < 3; ++d)
    for (size_t start : {size_t{0}, size_t{2}})
      for (LayoutKind lk : kAllLayouts) {
        SCOPED_TRACE("dim " + std::to_string(d) + " start " + std::to_string(start) + " " +
                     std::string(dtype_name(dt)) + " " + layout_name(lk));
        const Tensor g = with_layout(data(Shape(gdims), dt, ++seed), lk);
        const size_t full = gdims[d] + start + 4;
        OpAttrs a;
        a.i0 = static_cast<int64_t>(d);
        a.ints = {static_cast<int64_t>(start), static_cast<int64_t>(full)};
        const Tensor out = dispatch1(OpId::narrow_bwd, {g}, a);
        std::vector<size_t> od = gdims;
        od[d] = full;
        ASSERT_EQ(out.dims(), od);
        EXPECT_EQ(values(out), ref::narrow_bwd(values(g), gdims, d, start, full));
      }
  OpAttrs bad;
  bad.i0 = 1;
  bad.ints = {3, 6};  // [3, 8) does not fit 6
  const std::string msg =
      error_of([&] { dispatch1(OpId::narrow_bwd, {data(Shape(gdims), dt, 1)}, bad); });
  EXPECT_TRUE(contains(msg, "narrow_bwd")) << msg;
}

TEST_P(IndexTest, OutOfRangeIndexThrowsErrorNamingTheOp) {
  const DType dt = GetParam();
  const Tensor x = data(Shape({5, 4}), dt, 1);
  const Tensor bad1 = index_tensor({0, 7, 1}, Shape({3}), DType::I64);
  const Tensor bad2 = index_tensor({0, 1, 2, 3, 4, 9, 0, 1}, Shape({2, 4}), DType::U32);
  const Tensor neg = index_tensor({0, -1, 1}, Shape({3}), DType::I64);
  // The front-end's check.
  std::string m = error_of([&] { x.index_select(bad1, 0); });
  EXPECT_TRUE(contains(m, "index_select") && contains(m, "7")) << m;
  m = error_of([&] { x.index_select(neg, 0); });
  EXPECT_TRUE(contains(m, "index_select") && contains(m, "-1")) << m;
  m = error_of([&] { x.gather(bad2, 0); });
  EXPECT_TRUE(contains(m, "gather") && contains(m, "9")) << m;
  m = error_of([&] { x.scatter_add(bad2, data(Shape({2, 4}), dt, 2), 0); });
  EXPECT_TRUE(contains(m, "scatter_add") && contains(m, "9")) << m;
  // The kernels' own check (straight to the dispatcher, past the front-end).
  OpAttrs a;
  a.i0 = 0;
  m = error_of([&] { dispatch1(OpId::index_select, {x, bad1}, a); });
  EXPECT_TRUE(contains(m, "index_select") && contains(m, "7") && contains(m, "size 5")) << m;
  m = error_of([&] { dispatch1(OpId::gather, {x, bad2}, a); });
  EXPECT_TRUE(contains(m, "gather") && contains(m, "9") && contains(m, "size 5")) << m;
  m = error_of([&] { dispatch1(OpId::scatter_add, {x, bad2, data(Shape({2, 4}), dt, 2)}, a); });
  EXPECT_TRUE(contains(m, "scatter_add") && contains(m, "9") && contains(m, "size 5")) << m;
}

std::string dtype_param_name(const ::testing::TestParamInfo<DType>& info) {
  return std::string(dtype_name(info.param));
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, IndexTest,
                         ::testing::Values(DType::U8, DType::U32, DType::I64, DType::BF16,
                                           DType::F16, DType::F32, DType::F64),
                         dtype_param_name);

}  // namespace
}  // namespace taper::testing
