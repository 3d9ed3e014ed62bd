// dtype.h: the element types taper stores, their traits table, and the two 16-bit float types.
//
// What it is: `DType`, one traits table (`dtype_info`), the C++ type of each dtype and
// `stat_dtype`. The half types `bf16`/`f16` and their conversions are in taper/portable.h.
// What it is not: SIMD conversion (see cpu/simd_half-inl.h, which rounds identically).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

#include "taper/portable.h"

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

/// The dtype statistics and accumulators are kept in for a tensor of `dt` (the norms' mean and
/// rstd, softmax's row statistics, the optimizers' moments): f64 for f64, f32 for the rest.
constexpr DType stat_dtype(DType dt) { return dt == DType::F64 ? DType::F64 : DType::F32; }

// The half types (bf16, f16) and their round-to-nearest-even conversions live in
// taper/portable.h, which CUDA device code compiles too.

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

// One rule, two spellings: stat_dtype is the run-time form, portable.h's compute_t<T> the
// compile-time form kernels (host and device) use. They must agree for every float type.
static_assert(dtype_of_v<compute_t<bf16>> == stat_dtype(DType::BF16) &&
                  dtype_of_v<compute_t<f16>> == stat_dtype(DType::F16) &&
                  dtype_of_v<compute_t<float>> == stat_dtype(DType::F32) &&
                  dtype_of_v<compute_t<double>> == stat_dtype(DType::F64),
              "compute_t and stat_dtype disagree");

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
