// dtype.h: the element types taper stores, their traits table, and the two 16-bit float types.
//
// What it is: `DType`, one traits table (`dtype_info`), and `bf16`/`f16` whose conversion from f32
// rounds to nearest-even (NaN stays NaN, overflow gives inf, subnormals exact).
// What it is not: SIMD conversion (see cpu/simd_half-inl.h, which rounds identically).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

namespace taper {

/// Element type of a tensor.
enum class DType : uint8_t { U8, U32, I64, BF16, F16, F32, F64 };

inline constexpr int kNumDTypes = 7;

/// One row of the traits table.
struct DTypeInfo {
  DType dtype;
  std::string_view name;  ///< "f32", as printed in errors
  size_t size;            ///< bytes per element
  bool is_float;
  bool is_half;  ///< bf16/f16: computed in f32, rounded once at the store
};

inline constexpr DTypeInfo kDTypeTable[kNumDTypes] = {
    {DType::U8, "u8", 1, false, false},     {DType::U32, "u32", 4, false, false},
    {DType::I64, "i64", 8, false, false},   {DType::BF16, "bf16", 2, true, true},
    {DType::F16, "f16", 2, true, true},     {DType::F32, "f32", 4, true, false},
    {DType::F64, "f64", 8, true, false},
};
static_assert(static_cast<int>(DType::F64) + 1 == kNumDTypes, "dtype table out of sync");

/// Traits of `dt`.
constexpr const DTypeInfo& dtype_info(DType dt) { return kDTypeTable[static_cast<int>(dt)]; }
/// Short name, e.g. "bf16".
constexpr std::string_view dtype_name(DType dt) { return dtype_info(dt).name; }
/// Bytes per element.
constexpr size_t dtype_size(DType dt) { return dtype_info(dt).size; }
constexpr bool is_float(DType dt) { return dtype_info(dt).is_float; }
constexpr bool is_half(DType dt) { return dtype_info(dt).is_half; }
/// A bit mask with one bit per dtype, used by the registry to say which dtypes a kernel serves.
constexpr uint32_t dtype_bit(DType dt) { return 1u << static_cast<int>(dt); }
inline constexpr uint32_t kFloatDTypes =
    dtype_bit(DType::BF16) | dtype_bit(DType::F16) | dtype_bit(DType::F32) | dtype_bit(DType::F64);
inline constexpr uint32_t kAllDTypes = (1u << kNumDTypes) - 1;

// ---- scalar half conversions ----------------------------------------------------------------

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// f32 -> bf16 bits, round to nearest-even; NaN becomes a quiet NaN with the same sign.
inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);  // ties go to the even bf16; overflow carries into inf
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_bits_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

/// f32 -> IEEE binary16 bits, round to nearest-even, subnormals exact, overflow to inf,
/// NaN to a quiet NaN with the same sign.
inline uint16_t f32_to_f16_bits(float f) {
  uint32_t u = f32_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((u >> 13) & 0x3ffu));
  if (u >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (u < 0x38800000u) {  // below the smallest normal f16 (2^-14): subnormal or zero
    if (u < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25 rounds to 0 (tie too)
    const uint32_t exp = u >> 23;                  // 102..112
    const uint32_t mant = (u & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exp;             // 14..24
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = ((u - 0x38000000u) >> 13);  // rebias exponent 127 -> 15
  const uint32_t rem = u & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // carry may reach the next binade
  return static_cast<uint16_t>(sign | h);
}

inline float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // zero or subnormal: mant * 2^-24, exact in f32
    const float v = static_cast<float>(mant) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  if (exp == 31) return f32_from_bits(sign | 0x7f800000u | (mant << 13));
  return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

/// f64 -> f32 rounded to odd: an inexact value takes the neighbour whose last mantissa bit is 1,
/// so a later rounding to a format with >= 2 fewer bits equals rounding the f64 value directly.
inline float f64_to_f32_round_odd(double d) {
  const float f = static_cast<float>(d);
  if (d != d || static_cast<double>(f) == d) return f;
  const double fmax = 3.4028234663852886e38;
  if (d > fmax || d < -fmax) {
    if (d - d != 0.0) return f;  // inf
    return d > 0 ? static_cast<float>(fmax) : -static_cast<float>(fmax);
  }
  uint32_t u = f32_bits(f);
  if ((f < 0 ? -static_cast<double>(f) : static_cast<double>(f)) > (d < 0 ? -d : d)) --u;
  return f32_from_bits(u | 1u);
}

/// bfloat16 storage type. Arithmetic is done by converting to float.
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) : bits(f32_to_bf16_bits(f)) {}
  /// Rounds the f64 value once (not through a rounded f32).
  explicit bf16(double d) : bits(f32_to_bf16_bits(f64_to_f32_round_odd(d))) {}
  static bf16 from_bits(uint16_t b) {
    bf16 r;
    r.bits = b;
    return r;
  }
  explicit operator float() const { return bf16_bits_to_f32(bits); }
  explicit operator double() const { return bf16_bits_to_f32(bits); }
};

/// IEEE binary16 storage type. Arithmetic is done by converting to float.
struct f16 {
  uint16_t bits = 0;
  f16() = default;
  explicit f16(float f) : bits(f32_to_f16_bits(f)) {}
  /// Rounds the f64 value once (not through a rounded f32).
  explicit f16(double d) : bits(f32_to_f16_bits(f64_to_f32_round_odd(d))) {}
  static f16 from_bits(uint16_t b) {
    f16 r;
    r.bits = b;
    return r;
  }
  explicit operator float() const { return f16_bits_to_f32(bits); }
  explicit operator double() const { return f16_bits_to_f32(bits); }
};

/// Maps a C++ element type to its DType.
template <class T> struct dtype_of;
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::U8; };
template <> struct dtype_of<uint32_t> { static constexpr DType value = DType::U32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::I64; };
template <> struct dtype_of<bf16> { static constexpr DType value = DType::BF16; };
template <> struct dtype_of<f16> { static constexpr DType value = DType::F16; };
template <> struct dtype_of<float> { static constexpr DType value = DType::F32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::F64; };
template <class T> inline constexpr DType dtype_of_v = dtype_of<T>::value;

/// Calls `f(T{})` with the C++ type of `dt` (a value of that type, for template deduction).
template <class F> decltype(auto) visit_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::U8: return f(uint8_t{});
    case DType::U32: return f(uint32_t{});
    case DType::I64: return f(int64_t{});
    case DType::BF16: return f(bf16{});
    case DType::F16: return f(f16{});
    case DType::F32: return f(float{});
    case DType::F64: break;
  }
  return f(double{});
}

/// Converts any element type to double / from double (integer targets truncate toward zero;
/// half targets round the f64 value once to nearest-even).
template <class T> inline double to_f64(T v) { return static_cast<double>(v); }
template <class T> inline T from_f64(double v) {
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
    return T(v);
  } else {
    return static_cast<T>(v);
  }
}

}  // namespace taper
