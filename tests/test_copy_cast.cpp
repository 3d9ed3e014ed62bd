// test_copy_cast.cpp: the copy_cast kernels through the public API: to_dtype for every pair of the
// 7 dtypes on contiguous, transposed, narrowed and broadcast inputs (bit-exact against
// tests/ref/copy_cast_ref.h), copy of strided views, fill, arange, and rand/randn (Philox
// known-answer vectors, independence from the thread count, seeds, range, moments).
//
// What it is not: the SIMD conversions on each Highway target one by one (test_half.cpp).

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "tests/ref/copy_cast_ref.h"
#include "tests/test_util.h"

TAPER_COVERS(Forward, taper::OpId::copy, taper::OpId::to_dtype, taper::OpId::fill,
             taper::OpId::arange, taper::OpId::rand_uniform, taper::OpId::rand_normal);

namespace taper {
namespace {

using cpu::ref::bits_of;

constexpr DType kAll[] = {DType::U8,  DType::U32, DType::I64, DType::BF16,
                          DType::F16, DType::F32, DType::F64};

std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

/// The elements of a view in row-major order, read through its data pointer and strides (no
/// kernel involved).
template <class T> std::vector<T> gather(const Tensor& t) {
  std::vector<T> out;
  out.reserve(t.elem_count());
  const T* base = t.data<T>();
  const size_t rank = t.rank();
  std::vector<size_t> idx(rank, 0);
  for (size_t n = 0; n < t.elem_count(); ++n) {
    int64_t off = 0;
    for (size_t k = 0; k < rank; ++k) off += static_cast<int64_t>(idx[k]) * t.strides()[k];
    out.push_back(base[off]);
    for (size_t k = rank; k-- > 0;) {
      if (++idx[k] < t.dims()[k]) break;
      idx[k] = 0;
    }
  }
  return out;
}

/// n random values of type T that exercise its conversions: ties of every narrower float type,
/// values beyond every integer and half range, NaN/inf/-0, integers with sticky low bits.
template <class T> std::vector<T> test_values(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t r = rng();
    if constexpr (std::is_integral_v<T>) {
      if constexpr (std::is_same_v<T, int64_t>) {
        // random magnitudes up to 2^63, so f64/f32/half roundings drop bits (sticky cases too)
        const int shift = static_cast<int>(r % 64);
        int64_t x = static_cast<int64_t>(rng() >> shift);
        if (r & (1ull << 20)) x = -x;
        if (i % 17 == 0) x = (int64_t{1} << 62) + (int64_t{1} << 54) + static_cast<int64_t>(r >> 60);
        if (i % 31 == 0) x = i % 2 ? std::numeric_limits<int64_t>::min() : std::numeric_limits<int64_t>::max();
        v[i] = x;
      } else {
        v[i] = static_cast<T>(i % 3 == 0 ? (r >> 40) % 300 : r);
      }
    } else {
      double d;
      switch (i % 8) {
        case 0: d = std::ldexp(static_cast<double>(r >> 11), -53) * 2000.0 - 1000.0; break;
        case 1: {  // wide exponents, both signs
          const int e = static_cast<int>((r >> 56) % 200) - 100;
          d = std::ldexp(1.0 + std::ldexp(static_cast<double>(r & 0xffffffffffull), -40), e);
          if (r & 1) d = -d;
          break;
        }
        case 2: d = static_cast<double>(static_cast<int>((r >> 32) % 700) - 350) + 0.5; break;
        case 3: {  // a bf16 or f16 tie (as f32), nudged or not
          const uint32_t u = (static_cast<uint32_t>(r) & 0x807fffffu) | ((110u + (r >> 40) % 40u) << 23);
          const float tie = f32_from_bits(r & (1ull << 50) ? ((u | 0x8000u) & ~0x7fffu)
                                                           : ((u | 0x1000u) & ~0xfffu));
          const double nudge = (r >> 51) % 3 == 0 ? 0.0 : std::ldexp((r >> 53) & 1 ? 1.0 : -1.0, -35);
          d = static_cast<double>(tie) * (1.0 + nudge);
          break;
        }
        case 4: {
          const double specials[] = {0.0, -0.0, HUGE_VAL, -HUGE_VAL, std::nan(""), -std::nan(""),
                                     65504.0, 65519.99, 65520.0, 255.0, 255.9, 256.0, -0.9,
                                     -1.0, 4294967295.5, 4294967296.0, 9.3e18, -9.3e18, 1e39};
          d = specials[(r >> 8) % (sizeof(specials) / sizeof(specials[0]))];
          break;
        }
        default: d = std::ldexp(static_cast<double>(r >> 11), -53) * 8.0 - 4.0; break;
      }
      v[i] = cpu::ref::convert<T>(d);
    }
  }
  return v;
}

enum class Layout { Contiguous, Transposed, Narrowed, Broadcast };
const char* layout_name(Layout l) {
  switch (l) {
    case Layout::Contiguous: return "contiguous";
    case Layout::Transposed: return "transposed";
    case Layout::Narrowed: return "narrowed";
    case Layout::Broadcast: return "broadcast";
  }
  return "?";
}

/// A (r, c) tensor of values from `vals` (enough of them), held with layout `l`; built with
/// from_vector and view ops only, so the source values are known without any kernel.
template <class T> Tensor make_view(const std::vector<T>& vals, size_t r, size_t c, Layout l) {
  switch (l) {
    case Layout::Contiguous:
      return Tensor::from_vector(std::vector<T>(vals.begin(), vals.begin() + r * c), {r, c});
    case Layout::Transposed:
      return Tensor::from_vector(std::vector<T>(vals.begin(), vals.begin() + r * c), {c, r})
          .transpose(0, 1);
    case Layout::Narrowed:
      return Tensor::from_vector(std::vector<T>(vals.begin(), vals.begin() + r * (c + 3)),
                                 {r, c + 3})
          .narrow(1, 1, c);
    case Layout::Broadcast:
      return Tensor::from_vector(std::vector<T>(vals.begin(), vals.begin() + c), {1, c})
          .broadcast_as({r, c});
  }
  return {};
}

struct Size2 {
  size_t r, c;
};
// 1, 7, 33, 1073 elements, and one large enough to be split across threads.
constexpr Size2 kSizes[] = {{1, 1}, {1, 7}, {3, 11}, {37, 29}, {260, 301}};

// ---- to_dtype ---------------------------------------------------------------------------------

class ToDtype : public ::testing::TestWithParam<std::tuple<DType, DType>> {};

TEST_P(ToDtype, EveryLayoutAndSizeMatchesReferenceBitExact) {
  const DType from = std::get<0>(GetParam()), to = std::get<1>(GetParam());
  visit_dtype(from, [&](auto s_tag) {
    using S = decltype(s_tag);
    visit_dtype(to, [&](auto d_tag) {
      using D = decltype(d_tag);
      const std::vector<S> vals = test_values<S>(260 * 304 + 8, 11 + static_cast<uint64_t>(from));
      for (const Size2 sz : kSizes) {
        for (Layout l : {Layout::Contiguous, Layout::Transposed, Layout::Narrowed, Layout::Broadcast}) {
          SCOPED_TRACE(std::string(layout_name(l)) + " " + std::to_string(sz.r) + "x" +
                       std::to_string(sz.c));
          const Tensor x = make_view(vals, sz.r, sz.c, l);
          if (sz.r > 1 && sz.c > 1 && l != Layout::Contiguous) {
            ASSERT_FALSE(x.is_contiguous());
          }
          // Through the dispatcher: Tensor::to_dtype returns x itself when the dtypes match.
          OpAttrs attrs;
          attrs.dtype = to;
          const Tensor y = dispatch1(OpId::to_dtype, {x}, attrs);
          ASSERT_EQ(y.dtype(), to);
          ASSERT_EQ(y.shape(), x.shape());
          ASSERT_TRUE(y.is_contiguous());
          const std::vector<S> src = gather<S>(x);
          const D* got = y.data<D>();
          for (size_t i = 0; i < src.size(); ++i) {
            const D want = cpu::ref::convert<D>(src[i]);
            ASSERT_EQ(bits_of(got[i]), bits_of(want))
                << "element " << i << ", source bits " << hex(bits_of(src[i]));
          }
        }
      }
    });
  });
}

std::string pair_name(const ::testing::TestParamInfo<std::tuple<DType, DType>>& info) {
  return std::string(dtype_name(std::get<0>(info.param))) + "_to_" +
         std::string(dtype_name(std::get<1>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(AllPairs, ToDtype,
                         ::testing::Combine(::testing::ValuesIn(kAll), ::testing::ValuesIn(kAll)),
                         pair_name);

TEST(ToDtypeContract, RoundsOnceFromF64AndI64) {
  // f64 above a bf16 tie by 2^-40: through f32 it would become the tie and go to even (1.0).
  const double d = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
  Tensor x = Tensor::from_vector(std::vector<double>{d, -d, 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40)}, {3});
  EXPECT_EQ(x.to_dtype(DType::BF16).data<bf16>()[0].bits, 0x3f81);
  EXPECT_EQ(x.to_dtype(DType::BF16).data<bf16>()[1].bits, 0xbf81);
  EXPECT_EQ(x.to_dtype(DType::F16).data<f16>()[2].bits, 0x3c01);
  // i64 2^62 + 2^54 + 1: f64 rounds it to the bf16 tie 2^62 + 2^54 (then even: 2^62); once: up.
  const int64_t big = (int64_t{1} << 62) + (int64_t{1} << 54) + 1;
  Tensor xi = Tensor::from_vector(std::vector<int64_t>{big, -big}, {2});
  const Tensor xb = xi.to_dtype(DType::BF16);  // keep it alive while b points into it
  const bf16* b = xb.data<bf16>();
  EXPECT_EQ(static_cast<double>(static_cast<float>(b[0])), std::ldexp(1.0, 62) + std::ldexp(1.0, 55));
  EXPECT_EQ(static_cast<double>(static_cast<float>(b[1])), -(std::ldexp(1.0, 62) + std::ldexp(1.0, 55)));
}

TEST(ToDtypeContract, FloatToIntTruncatesAndSaturates) {
  Tensor x = Tensor::from_vector(
      std::vector<double>{3.7, -3.7, -0.5, 255.9, 256.0, 1e30, -1e30, std::nan(""), HUGE_VAL, -HUGE_VAL},
      {10});
  EXPECT_EQ(x.to_dtype(DType::U8).to_vector<uint8_t>(),
            (std::vector<uint8_t>{3, 0, 0, 255, 255, 255, 0, 0, 255, 0}));
  EXPECT_EQ(x.to_dtype(DType::U32).to_vector<uint32_t>(),
            (std::vector<uint32_t>{3, 0, 0, 255, 256, 4294967295u, 0, 0, 4294967295u, 0}));
  const int64_t mx = std::numeric_limits<int64_t>::max(), mn = std::numeric_limits<int64_t>::min();
  EXPECT_EQ(x.to_dtype(DType::I64).to_vector<int64_t>(),
            (std::vector<int64_t>{3, -3, 0, 255, 256, mx, mn, 0, mx, mn}));
  Tensor xi = Tensor::from_vector(std::vector<int64_t>{-5, 300, int64_t{1} << 40}, {3});
  EXPECT_EQ(xi.to_dtype(DType::U8).to_vector<uint8_t>(), (std::vector<uint8_t>{0, 255, 255}));
  EXPECT_EQ(xi.to_dtype(DType::U32).to_vector<uint32_t>(), (std::vector<uint32_t>{0, 300, 4294967295u}));
}

// ---- copy -------------------------------------------------------------------------------------

TEST(Copy, StridedViewsOfEveryDtype) {
  for (DType dt : kAll) {
    SCOPED_TRACE(dtype_name(dt));
    visit_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      const std::vector<T> vals = test_values<T>(4 * 5 * 6 * 70, 3);
      const Tensor base = Tensor::from_vector(vals, {4 * 70, 5, 6});
      const Tensor views[] = {
          base.permute({2, 0, 1}),
          base.transpose(0, 2).narrow(1, 1, 3),
          base.narrow(0, 10, 200).narrow(2, 2, 3),
          base.narrow(1, 2, 1).broadcast_as({4 * 70, 5, 6}),
          base.narrow(2, 5, 1).squeeze(2),
          base.reshape({4 * 70 * 5 * 6}).narrow(0, 7, 5000),
          base.reshape({7, 40, 30}).transpose(1, 2),           // a batch of tiled transposes
          base.reshape({70, 120}).t().narrow(0, 3, 100),       // a transpose with partial tiles
      };
      for (const Tensor& v : views) {
        const Tensor c = v.contiguous();
        ASSERT_TRUE(c.is_contiguous());
        ASSERT_EQ(c.shape(), v.shape());
        const std::vector<T> want = gather<T>(v);
        const T* got = c.data<T>();
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_EQ(bits_of(got[i]), bits_of(want[i])) << "element " << i << " of " << v.shape().to_string();
        // The same views converted (to_dtype walks them the same way, converting as it goes).
        const DType other = dt == DType::F64 ? DType::F32 : DType::F64;
        const Tensor conv = v.to_dtype(other);
        visit_dtype(other, [&](auto o_tag) {
          using O = decltype(o_tag);
          const O* cg = conv.data<O>();
          for (size_t i = 0; i < want.size(); ++i)
            ASSERT_EQ(bits_of(cg[i]), bits_of(cpu::ref::convert<O>(want[i]))) << "element " << i;
        });
      }
    });
  }
}

// ---- fill and arange ----------------------------------------------------------------------------

TEST(Fill, RoundsOnceAndSaturates) {
  EXPECT_EQ(Tensor::full({3}, 0.1, DType::BF16).data<bf16>()[2].bits, cpu::ref::convert<bf16>(0.1).bits);
  EXPECT_EQ(Tensor::full({2, 2}, 0.1, DType::F64).to_vector<double>(), std::vector<double>(4, 0.1));
  EXPECT_EQ(Tensor::full({40000}, 300.0, DType::U8).to_vector<uint8_t>(), std::vector<uint8_t>(40000, 255));
  EXPECT_EQ(Tensor::full({2}, -7.9, DType::I64).to_vector<int64_t>(), (std::vector<int64_t>{-7, -7}));
  EXPECT_EQ(Tensor::zeros({5}, DType::F16).to_vector<float>(), std::vector<float>(5, 0.0f));
  EXPECT_EQ(Tensor::ones({70001}, DType::F32).to_vector<float>(), std::vector<float>(70001, 1.0f));
  EXPECT_EQ(Tensor::ones({0}, DType::F32).elem_count(), 0u);
}

TEST(Arange, ValuesForEveryDtype) {
  EXPECT_EQ(Tensor::arange(0, 5, 1, DType::I64).to_vector<int64_t>(),
            (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(Tensor::arange(1, 2, 0.25, DType::F32).to_vector<float>(),
            (std::vector<float>{1.0f, 1.25f, 1.5f, 1.75f}));
  EXPECT_EQ(Tensor::arange(3, 0, -1, DType::U8).to_vector<uint8_t>(), (std::vector<uint8_t>{3, 2, 1}));
  for (DType dt : kAll) {
    SCOPED_TRACE(dtype_name(dt));
    visit_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      const double start = -3.3, step = 0.1;
      const Tensor a = Tensor::arange(start, start + step * 49999.5, step, dt);
      ASSERT_EQ(a.elem_count(), 50000u);
      const T* got = a.data<T>();
      for (size_t i = 0; i < a.elem_count(); ++i)
        ASSERT_EQ(bits_of(got[i]), bits_of(cpu::ref::arange_value<T>(start, step, i))) << i;
    });
  }
  // f64 values are one fma from the exact start + i step.
  const Tensor a = Tensor::arange(0.1, 1000.0, 0.1, DType::F64);
  EXPECT_EQ(a.data<double>()[37], std::fma(37.0, 0.1, 0.1));
}

// ---- rand / randn ----------------------------------------------------------------------------

TEST(Philox, KnownAnswerVectors) {
  // Random123's kat_vectors for philox4x32 with 10 rounds.
  using A4 = std::array<uint32_t, 4>;
  EXPECT_EQ(cpu::ref::philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (A4{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(cpu::ref::philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                                    {0xffffffffu, 0xffffffffu}),
            (A4{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(cpu::ref::philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                                    {0xa4093822u, 0x299f31d0u}),
            (A4{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}


constexpr DType kFloats[] = {DType::BF16, DType::F16, DType::F32, DType::F64};

TEST(Rand, SameValuesWhateverTheThreadsAndMatchesReference) {
  testing::ThreadsGuard guard;
  const size_t n = 100003;  // odd, and several grains: a thread boundary may split a pair
  for (DType dt : kFloats) {
    SCOPED_TRACE(dtype_name(dt));
    visit_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_integral_v<T>) {
        for (bool normal : {false, true}) {
          SCOPED_TRACE(normal ? "randn" : "rand");
          auto make = [&](size_t threads, uint64_t seed) {
            set_num_threads(threads);
            return normal ? Tensor::randn({n}, dt, Device::cpu(), seed, 0.5, 2.0)
                          : Tensor::rand({n}, dt, Device::cpu(), seed, -1.0, 3.0);
          };
          const Tensor a1 = make(1, 42), a2 = make(2, 42), a3 = make(3, 42), b = make(2, 43);
          const T *p1 = a1.data<T>(), *p2 = a2.data<T>(), *p3 = a3.data<T>(), *pb = b.data<T>();
          size_t same_as_other_seed = 0;
          for (size_t i = 0; i < n; ++i) {
            const T want = normal ? cpu::ref::normal_value<T>(42, 0.5, 2.0, i)
                                  : cpu::ref::uniform_value<T>(42, -1.0, 3.0, i);
            ASSERT_EQ(bits_of(p1[i]), bits_of(want)) << i;
            ASSERT_EQ(bits_of(p2[i]), bits_of(want)) << i;
            ASSERT_EQ(bits_of(p3[i]), bits_of(want)) << i;
            if (bits_of(pb[i]) == bits_of(want)) ++same_as_other_seed;
            if (!normal) {
              const double v = static_cast<double>(cpu::ref::widen_exact(p1[i]));
              ASSERT_GE(v, -1.0);
              ASSERT_LT(v, 3.0);
            }
          }
          // Coincidences happen in 8-bit bf16, but not for most elements.
          EXPECT_LT(same_as_other_seed, n / 10);
        }
      }
    });
  }
}

TEST(Rand, NeverReachesHiAfterRounding) {
  // In bf16, u > 1 - 2^-9 rounds to 1.0: about 1/512 of the draws would hit hi without the guard.
  const Tensor x = Tensor::rand({200000}, DType::BF16, Device::cpu(), 5, 0.0, 1.0);
  const std::vector<float> v = x.to_vector<float>();
  size_t top = 0;
  for (float f : v) {
    ASSERT_LT(f, 1.0f);
    ASSERT_GE(f, 0.0f);
    if (f == 1.0f - std::ldexp(1.0f, -8)) ++top;
  }
  // About 3/512 of the draws: 2/512 rounded there, 1/512 stepped down from 1.0 (2 sigma: 70).
  EXPECT_GT(top, 1000u);
}

TEST(Rand, NormalMomentsOfAMillion) {
  for (DType dt : {DType::F32, DType::F64}) {
    SCOPED_TRACE(dtype_name(dt));
    const std::vector<double> v = Tensor::randn({1000000}, dt, Device::cpu(), 9).to_vector<double>();
    double mean = 0.0;
    for (double x : v) mean += x;
    mean /= static_cast<double>(v.size());
    double var = 0.0;
    for (double x : v) var += (x - mean) * (x - mean);
    const double sd = std::sqrt(var / static_cast<double>(v.size() - 1));
    EXPECT_NEAR(mean, 0.0, 0.01);
    EXPECT_NEAR(sd, 1.0, 0.01);
    // Uniform: mean 0.5, variance 1/12.
    const std::vector<double> u = Tensor::rand({1000000}, dt, Device::cpu(), 9).to_vector<double>();
    double um = 0.0;
    for (double x : u) um += x;
    um /= static_cast<double>(u.size());
    EXPECT_NEAR(um, 0.5, 0.01);
  }
}

}  // namespace
}  // namespace taper
