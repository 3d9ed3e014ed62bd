// test_half.cpp: the bf16/f16 conversions, scalar (taper/portable.h, through taper/dtype.h) and
// SIMD (cpu/simd_half-inl.h's LoadAs/StoreFrom, run by copy_cast's test hooks of
// tests/cpu_hooks.h) on every compiled Highway target this CPU runs.
//
// What it checks: known bit patterns of edge values; the scalar conversions against the
// independent long-double reference of tests/ref/copy_cast_ref.h (round_to_format); the SIMD
// conversions bit-exact against the scalar ones, tails included, never writing past n; and the
// round trip of all 65536 bf16 and f16 patterns. What it is not: the to_dtype kernel over
// tensors (test_copy_cast.cpp).

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "taper/dtype.h"
#include "tests/cpu_hooks.h"
#include "tests/ref/copy_cast_ref.h"
#include "tests/test_util.h"

namespace taper {
namespace {

using testing::for_each_target;

using cpu::ref::bits_of;

float fb(uint32_t u) { return f32_from_bits(u); }

std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

/// Edge values of f32 for the half conversions.
std::vector<float> edge_floats() {
  std::vector<float> v = {
      0.0f, -0.0f, fb(0x00000001u), fb(0x807fffffu), FLT_MIN, -FLT_MIN,
      // f16 subnormals: smallest, largest, halfway cases (ties to even, both parities)
      std::ldexp(1.0f, -24), -std::ldexp(1.0f, -24), 1023 * std::ldexp(1.0f, -24),
      std::ldexp(1.0f, -25), std::nextafter(std::ldexp(1.0f, -25), 1.0f),
      std::nextafter(std::ldexp(1.0f, -25), 0.0f), 3 * std::ldexp(1.0f, -25),
      5 * std::ldexp(1.0f, -25), std::ldexp(1.0f, -14), std::nextafter(std::ldexp(1.0f, -14), 0.0f),
      2047 * std::ldexp(1.0f, -25),  // halfway between the largest subnormal and 2^-14
      // bf16 ties: 1 + 2^-8 (to 1, even), 1 + 3*2^-8 (to 1 + 2^-6, even), and neighbours
      1.0f + std::ldexp(1.0f, -8), 1.0f + 3 * std::ldexp(1.0f, -8),
      std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f),
      std::nextafter(1.0f + std::ldexp(1.0f, -8), 0.0f), -(1.0f + 3 * std::ldexp(1.0f, -8)),
      // f16 ties: 1 + 2^-11 (to 1), 1 + 3*2^-11 (up), and neighbours
      1.0f + std::ldexp(1.0f, -11), 1.0f + 3 * std::ldexp(1.0f, -11),
      std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f),
      std::nextafter(1.0f + std::ldexp(1.0f, -11), 0.0f),
      // f16 range end: 65504 max, 65519.99 -> 65504, 65520 -> inf
      65504.0f, 65519.99f, 65520.0f, -65520.0f, std::nextafter(65520.0f, 0.0f), 65536.0f,
      // bf16 range end: the largest bf16, its halfway point to 2^128 (-> inf), FLT_MAX
      fb(0x7f7f0000u), fb(0x7f7f8000u), fb(0x7f7f7fffu), FLT_MAX, -FLT_MAX,
      HUGE_VALF, -HUGE_VALF,
      // NaNs with payloads and both signs (signaling and quiet)
      fb(0x7f800001u), fb(0xff800001u), fb(0x7fc00000u), fb(0xffc12345u), fb(0x7fbfffffu),
      fb(0x7f802000u), fb(0xffffffffu),
      1.0f / 3.0f, -1.0f / 3.0f, 3.14159265f, 0.1f, 1e-5f, -1e-7f, 1.0f, -2.0f, 1000.5f};
  return v;
}

/// Edge floats, then random bit patterns of every exponent, then random values near ties.
std::vector<float> test_floats(size_t n_random, uint64_t seed) {
  std::vector<float> v = edge_floats();
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < n_random; ++i) {
    const uint32_t u = static_cast<uint32_t>(rng());
    switch (i % 4) {
      case 0: v.push_back(fb(u)); break;  // any pattern (NaN/inf/subnormal included)
      case 1: v.push_back(fb((u & 0x807fffffu) | ((100u + (u >> 24) % 60u) << 23))); break;
      case 2: v.push_back(fb((u & 0xffff0000u) | 0x8000u)); break;  // exact bf16 ties
      default: v.push_back(fb((u & 0xffffe000u) | 0x1000u)); break;  // f16 ties (normal range)
    }
  }
  return v;
}

// ---- scalar ---------------------------------------------------------------------------------

TEST(HalfScalar, KnownBitPatterns) {
  struct Case {
    float f;
    uint16_t bf, h;
  };
  const Case cases[] = {
      {0.0f, 0x0000, 0x0000},
      {-0.0f, 0x8000, 0x8000},
      {1.0f, 0x3f80, 0x3c00},
      {-2.0f, 0xc000, 0xc000},
      {1.0f / 3.0f, 0x3eab, 0x3555},
      {65504.0f, 0x4780, 0x7bff},
      {65519.99f, 0x4780, 0x7bff},
      {65520.0f, 0x4780, 0x7c00},
      {std::ldexp(1.0f, -24), 0x3380, 0x0001},
      {std::ldexp(1.0f, -25), 0x3300, 0x0000},                      // tie -> 0 (even)
      {3 * std::ldexp(1.0f, -25), 0x33c0, 0x0002},                  // tie 1|2 -> 2 (even)
      {1023 * std::ldexp(1.0f, -24), 0x3880, 0x03ff},
      {2047 * std::ldexp(1.0f, -25), 0x3880, 0x0400},               // tie -> smallest normal
      {1.0f + std::ldexp(1.0f, -8), 0x3f80, 0x3c04},                // bf16 tie -> even (down)
      {1.0f + 3 * std::ldexp(1.0f, -8), 0x3f82, 0x3c0c},            // bf16 tie -> even (up)
      {1.0f + std::ldexp(1.0f, -11), 0x3f80, 0x3c00},               // f16 tie -> even (down)
      {1.0f + 3 * std::ldexp(1.0f, -11), 0x3f80, 0x3c02},           // f16 tie -> even (up)
      {FLT_MAX, 0x7f80, 0x7c00},
      {-HUGE_VALF, 0xff80, 0xfc00},
      {fb(0x7f7f7fffu), 0x7f7f, 0x7c00},  // just below the bf16 overflow tie
      {fb(0x7f7f8000u), 0x7f80, 0x7c00},  // the tie itself: odd max -> inf
      {fb(0x00000001u), 0x0000, 0x0000},
      {fb(0x7f800001u), 0x7fc0, 0x7e00},  // signaling NaN -> quiet, sign kept
      {fb(0xffc12345u), 0xffc1, 0xfe09},
      {fb(0x7fbfffffu), 0x7fff, 0x7fff},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(hex(f32_bits(c.f)));
    EXPECT_EQ(f32_to_bf16_bits(c.f), c.bf);
    EXPECT_EQ(f32_to_f16_bits(c.f), c.h);
    EXPECT_EQ(cpu::ref::convert<bf16>(c.f).bits, c.bf);
    EXPECT_EQ(cpu::ref::convert<f16>(c.f).bits, c.h);
  }
}

TEST(HalfScalar, F32ToHalfMatchesIndependentReference) {
  for (float f : test_floats(200000, 1)) {
    ASSERT_EQ(f32_to_bf16_bits(f), cpu::ref::convert<bf16>(f).bits) << hex(f32_bits(f));
    ASSERT_EQ(f32_to_f16_bits(f), cpu::ref::convert<f16>(f).bits) << hex(f32_bits(f));
  }
}

TEST(HalfScalar, HalfToF32IsExact) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const auto h = static_cast<uint16_t>(b);
    // bf16: the f32 whose top half is b. f16: value = (-1)^s m 2^(e-25) rebuilt in long double.
    ASSERT_EQ(f32_bits(bf16_bits_to_f32(h)), b << 16);
    const uint32_t e = (b >> 10) & 31u, m = b & 1023u;
    const float got = f16_bits_to_f32(h);
    if (e == 31) {
      ASSERT_EQ(f32_bits(got), ((b & 0x8000u) << 16) | 0x7f800000u | (m << 13)) << hex(b);
      continue;
    }
    long double want = e == 0 ? std::ldexp(static_cast<long double>(m), -24)
                              : std::ldexp(static_cast<long double>(1024 + m), static_cast<int>(e) - 25);
    if (b & 0x8000u) want = -want;
    ASSERT_EQ(static_cast<long double>(got), want) << hex(b);
    ASSERT_EQ(std::signbit(got), (b & 0x8000u) != 0) << hex(b);
  }
}

TEST(HalfScalar, RoundTripEveryPattern) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const auto h = static_cast<uint16_t>(b);
    const bool bf_nan = (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0;
    const bool h_nan = (b & 0x7c00u) == 0x7c00u && (b & 0x3ffu) != 0;
    const uint16_t bf_back = f32_to_bf16_bits(bf16_bits_to_f32(h));
    const uint16_t h_back = f32_to_f16_bits(f16_bits_to_f32(h));
    if (bf_nan) {
      EXPECT_EQ(bf_back, h | 0x40u) << hex(b);  // quieted, sign and payload kept
    } else {
      EXPECT_EQ(bf_back, h) << hex(b);
    }
    if (h_nan) {
      EXPECT_EQ(h_back, h | 0x200u) << hex(b);
    } else {
      EXPECT_EQ(h_back, h) << hex(b);
    }
  }
}

TEST(HalfScalar, F64RoundsOnceNotThroughF32) {
  // 1 + 2^-8 + 2^-40: through f32 it lands on the bf16 tie 1 + 2^-8 and goes to even (1.0), but
  // the f64 value is above the tie: 1 + 2^-7.
  const double d = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
  EXPECT_EQ(bf16(static_cast<float>(d)).bits, 0x3f80);  // the double rounding we avoid
  EXPECT_EQ(f64_to_bf16_bits(d), 0x3f81);
  EXPECT_EQ(f64_to_bf16_bits(-d), 0xbf81);
  const double h = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  EXPECT_EQ(f16(static_cast<float>(h)).bits, 0x3c00);
  EXPECT_EQ(f64_to_f16_bits(h), 0x3c01);
  // Below the tie by a hair: down, not up.
  EXPECT_EQ(f64_to_bf16_bits(1.0 + std::ldexp(1.0, -8) - std::ldexp(1.0, -40)), 0x3f80);
  // An exact tie stays a tie: to even.
  EXPECT_EQ(f64_to_bf16_bits(1.0 + std::ldexp(1.0, -8)), 0x3f80);
  // Beyond FLT_MAX but finite: inf for both; below the f16 subnormal half-step: 0.
  EXPECT_EQ(f64_to_bf16_bits(1e39), 0x7f80);
  EXPECT_EQ(f64_to_f16_bits(-1e300), 0xfc00);
  EXPECT_EQ(f64_to_f16_bits(std::ldexp(1.0, -25)), 0x0000);
  EXPECT_EQ(f64_to_f16_bits(std::ldexp(1.0, -25) + std::ldexp(1.0, -60)), 0x0001);
  EXPECT_EQ(f64_to_bf16_bits(1e-300), 0x0000);
  EXPECT_EQ(f64_to_bf16_bits(-1e-300), 0x8000);

  std::mt19937_64 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const uint64_t r = rng();
    double v;
    if (i % 3 == 0) {
      std::memcpy(&v, &r, 8);  // any pattern
    } else {
      // near a bf16/f16 tie: a random f32 tie plus a tiny signed f64 offset (or none)
      const uint32_t exp = i % 2 ? 1u + static_cast<uint32_t>((r >> 32) % 253u)
                                 : 100u + static_cast<uint32_t>((r >> 32) % 50u);
      const uint32_t u = (static_cast<uint32_t>(r) & 0x807fffffu) | (exp << 23);
      const float tie = fb(i % 2 ? (u | 0x8000u) & ~0x7fffu : (u | 0x1000u) & ~0xfffu);
      const int shift = static_cast<int>((r >> 48) % 40) + 25;
      v = static_cast<double>(tie) * (1.0 + ((r >> 63) ? -1.0 : 1.0) * ((r >> 40) & 1 ? std::ldexp(1.0, -shift) : 0.0));
    }
    ASSERT_EQ(f64_to_bf16_bits(v), cpu::ref::convert<bf16>(v).bits) << std::hexfloat << v;
    ASSERT_EQ(f64_to_f16_bits(v), cpu::ref::convert<f16>(v).bits) << std::hexfloat << v;
  }
}

// ---- SIMD on every target -----------------------------------------------------------------


TEST(HalfSimd, F32ToHalfBitExactOnEveryTarget) {
  const std::vector<float> src = test_floats(1 << 18, 2);
  std::vector<uint16_t> want_bf(src.size()), want_h(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    want_bf[i] = f32_to_bf16_bits(src[i]);
    want_h[i] = f32_to_f16_bits(src[i]);
  }
  for_each_target([&](int64_t target) {
    for (DType to : {DType::BF16, DType::F16}) {
      const auto& want = to == DType::BF16 ? want_bf : want_h;
      std::vector<uint16_t> got(src.size(), 0xdead);
      ASSERT_EQ(cpu::convert_f32_to_half_for_test(src.data(), got.data(), src.size(), to), target);
      for (size_t i = 0; i < src.size(); ++i)
        ASSERT_EQ(got[i], want[i]) << dtype_name(to) << " of " << hex(f32_bits(src[i]));
    }
  });
}

TEST(HalfSimd, TailsTouchOnlyN) {
  const std::vector<float> src = test_floats(0, 0);
  for_each_target([&](int64_t) {
    for (DType to : {DType::BF16, DType::F16}) {
      for (size_t n = 1; n <= 40; ++n) {
        std::vector<uint16_t> got(n + 16, 0xdead);
        cpu::convert_f32_to_half_for_test(src.data() + 3, got.data(), n, to);
        for (size_t i = 0; i < n; ++i)
          ASSERT_EQ(got[i], to == DType::BF16 ? f32_to_bf16_bits(src[3 + i]) : f32_to_f16_bits(src[3 + i]))
              << "n=" << n << " i=" << i;
        for (size_t i = n; i < got.size(); ++i) ASSERT_EQ(got[i], 0xdead) << "wrote past n=" << n;
      }
      std::vector<uint16_t> h(5);
      for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint16_t>(0x3c00u + 77u * i);
      for (size_t n = 1; n <= h.size(); ++n) {
        std::vector<float> back(n + 8, -7.0f);
        cpu::convert_contiguous_for_test(h.data(), to, back.data(), DType::F32, n);
        for (size_t i = 0; i < n; ++i) {
          const float want = to == DType::BF16 ? bf16_bits_to_f32(h[i]) : f16_bits_to_f32(h[i]);
          ASSERT_EQ(f32_bits(back[i]), f32_bits(want));
        }
        for (size_t i = n; i < back.size(); ++i) ASSERT_EQ(back[i], -7.0f);
      }
    }
  });
}

/// Every half pattern through SIMD to f32 and f64 (exact) and back (round trip).
TEST(HalfSimd, EveryHalfPatternOnEveryTarget) {
  std::vector<uint16_t> all(65536);
  for (uint32_t b = 0; b < 65536; ++b) all[b] = static_cast<uint16_t>(b);
  for_each_target([&](int64_t target) {
    for (DType half : {DType::BF16, DType::F16}) {
      SCOPED_TRACE(dtype_name(half));
      std::vector<float> f(all.size());
      std::vector<double> d(all.size());
      ASSERT_EQ(cpu::convert_contiguous_for_test(all.data(), half, f.data(), DType::F32, all.size()), target);
      cpu::convert_contiguous_for_test(all.data(), half, d.data(), DType::F64, all.size());
      for (uint32_t b = 0; b < 65536; ++b) {
        const auto h = static_cast<uint16_t>(b);
        const float want = half == DType::BF16 ? bf16_bits_to_f32(h) : f16_bits_to_f32(h);
        ASSERT_EQ(f32_bits(f[b]), f32_bits(want)) << hex(b);
        if (!std::isnan(want)) {
          ASSERT_EQ(d[b], static_cast<double>(want)) << hex(b);
          ASSERT_EQ(std::signbit(d[b]), std::signbit(want)) << hex(b);
        } else {
          ASSERT_TRUE(std::isnan(d[b]));
        }
      }
      std::vector<uint16_t> back(all.size()), back64(all.size());
      cpu::convert_contiguous_for_test(f.data(), DType::F32, back.data(), half, all.size());
      cpu::convert_contiguous_for_test(d.data(), DType::F64, back64.data(), half, all.size());
      const uint16_t quiet = half == DType::BF16 ? 0x40 : 0x200;
      for (uint32_t b = 0; b < 65536; ++b) {
        const bool nan = half == DType::BF16 ? std::isnan(bf16_bits_to_f32(static_cast<uint16_t>(b)))
                                             : std::isnan(f16_bits_to_f32(static_cast<uint16_t>(b)));
        ASSERT_EQ(back[b], nan ? (b | quiet) : b) << hex(b);
        if (nan) {
          ASSERT_TRUE(half == DType::BF16 ? std::isnan(bf16_bits_to_f32(back64[b]))
                                          : std::isnan(f16_bits_to_f32(back64[b])));
        } else {
          ASSERT_EQ(back64[b], b) << hex(b);
        }
      }
    }
  });
}

/// Every pair of distinct float dtypes through SIMD against the independent reference.
TEST(HalfSimd, FloatPairsMatchReferenceOnEveryTarget) {
  // Sources: test floats as f32, their f64 values nudged off ties, and their bf16/f16 roundings.
  const std::vector<float> fl = test_floats(1 << 14, 3);
  const size_t n = fl.size();
  std::vector<double> db(n);
  std::vector<uint16_t> bfv(n), hv(n);
  std::mt19937_64 rng(5);
  for (size_t i = 0; i < n; ++i) {
    const int shift = static_cast<int>(rng() % 40) + 25;
    db[i] = static_cast<double>(fl[i]) *
            (1.0 + (i % 3 == 0 ? 0.0 : (i % 3 == 1 ? 1 : -1) * std::ldexp(1.0, -shift)));
    // Some far outside f32's range both ways: overflow to inf, f32 subnormals, underflow to 0.
    if (i % 7 == 0) db[i] = std::ldexp(db[i], static_cast<int>(rng() % 401) - 200);
    bfv[i] = f32_to_bf16_bits(fl[i]);
    hv[i] = f32_to_f16_bits(fl[i]);
  }
  auto src_of = [&](DType dt) -> const void* {
    switch (dt) {
      case DType::BF16: return bfv.data();
      case DType::F16: return hv.data();
      case DType::F32: return fl.data();
      default: return db.data();
    }
  };
  const DType floats[] = {DType::BF16, DType::F16, DType::F32, DType::F64};
  for_each_target([&](int64_t target) {
    for (DType from : floats) {
      for (DType to : floats) {
        if (from == to) continue;
        SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + std::string(dtype_name(to)));
        std::vector<uint64_t> got(n, 0);  // 8 bytes per slot: room for any dtype
        ASSERT_EQ(cpu::convert_contiguous_for_test(src_of(from), from, got.data(), to, n), target);
        visit_dtype(from, [&](auto s) {
          using S = decltype(s);
          visit_dtype(to, [&](auto t) {
            using D = decltype(t);
            if constexpr (!std::is_integral_v<S> && !std::is_integral_v<D>) {
              const S* src = static_cast<const S*>(src_of(from));
              const D* out = reinterpret_cast<const D*>(got.data());
              for (size_t i = 0; i < n; ++i) {
                const D want = cpu::ref::convert<D>(src[i]);
                ASSERT_EQ(bits_of(out[i]), bits_of(want)) << "source bits " << hex(bits_of(src[i]));
              }
            }
          });
        });
      }
    }
  });
}

}  // namespace
}  // namespace taper
